/// A pending local write: a set (overwrite) or an update (merge) with its id.
struct WriteRecord: Sendable {
    enum Change: Sendable {
        case overwrite(Node)
        case merge(CompoundWrite)
    }
    var writeID: Int64
    var path: Path
    var change: Change
    /// False for a transaction's write that must not show locally yet.
    var visible: Bool

    var isOverwrite: Bool { if case .overwrite = change { true } else { false } }

    /// Whether this write fully determines the data at `path`.
    func covers(_ other: Path) -> Bool {
        switch change {
        case .overwrite: return path.contains(other)
        case .merge(let m):
            var found = false
            m.forEachWrite { p, _ in if path.child(p).contains(other) { found = true } }
            return found
        }
    }
}

/// Every pending local write, and the result of layering the visible ones, so that views can
/// compute what the user sees: server data with local writes on top.
struct WriteTree: Sendable {
    /// The visible writes, layered.
    private(set) var visibleWrites = CompoundWrite.empty
    /// Every pending write, oldest first.
    private(set) var allWrites: [WriteRecord] = []
    private(set) var lastWriteID: Int64 = -1

    mutating func addOverwrite(_ path: Path, _ node: Node, writeID: Int64, visible: Bool) {
        precondition(writeID > lastWriteID, "write ids must increase")
        allWrites.append(WriteRecord(writeID: writeID, path: path, change: .overwrite(node), visible: visible))
        if visible { visibleWrites = visibleWrites.addingWrite(node, at: path) }
        lastWriteID = writeID
    }

    mutating func addMerge(_ path: Path, _ children: CompoundWrite, writeID: Int64) {
        precondition(writeID > lastWriteID, "write ids must increase")
        allWrites.append(WriteRecord(writeID: writeID, path: path, change: .merge(children), visible: true))
        visibleWrites = visibleWrites.addingCompoundWrite(children, at: path)
        lastWriteID = writeID
    }

    func write(_ writeID: Int64) -> WriteRecord? { allWrites.first { $0.writeID == writeID } }

    /// Removes a write (acknowledged or rejected). Returns whether it may have been visible,
    /// so that views must be re-evaluated.
    mutating func removeWrite(_ writeID: Int64) -> Bool {
        guard let index = allWrites.firstIndex(where: { $0.writeID == writeID }) else { return false }
        let removed = allWrites.remove(at: index)
        var wasVisible = removed.visible
        var overlaps = false
        var i = allWrites.count - 1
        while wasVisible && i >= 0 {
            let current = allWrites[i]
            if current.visible {
                if i >= index && current.covers(removed.path) {
                    wasVisible = false  // a later write shadows it completely
                } else if removed.path.contains(current.path) {
                    overlaps = true
                }
            }
            i -= 1
        }
        if !wasVisible { return false }
        if overlaps {
            visibleWrites = Self.layer(allWrites, root: .root) { $0.visible }
        } else {
            switch removed.change {
            case .overwrite: visibleWrites = visibleWrites.removingWrite(at: removed.path)
            case .merge(let m):
                m.forEachWrite { p, _ in visibleWrites = visibleWrites.removingWrite(at: removed.path.child(p)) }
            }
        }
        return true
    }

    mutating func removeAllWrites() -> [WriteRecord] {
        defer {
            allWrites = []
            visibleWrites = .empty
        }
        return allWrites
    }

    /// The node a visible write fully determines at `path`, or nil.
    func shadowingWrite(_ path: Path) -> Node? { visibleWrites.completeNode(at: path) }

    /// The complete data at `path`: server data (when complete) with writes on top. Nil when
    /// neither is complete there.
    func calcCompleteEventCache(_ path: Path, completeServerCache: Node?, excluding: Set<Int64>? = nil,
                                includeHidden: Bool = false) -> Node? {
        if excluding == nil && !includeHidden {
            if let shadowing = visibleWrites.completeNode(at: path) { return shadowing }
            let subMerge = visibleWrites.childCompoundWrite(at: path)
            if subMerge.isEmpty { return completeServerCache }
            if completeServerCache == nil && !subMerge.hasCompleteWrite(at: .root) { return nil }
            return subMerge.apply(to: completeServerCache ?? .empty)
        }
        let merge = visibleWrites.childCompoundWrite(at: path)
        if !includeHidden && merge.isEmpty { return completeServerCache }
        if !includeHidden && completeServerCache == nil && !merge.hasCompleteWrite(at: .root) { return nil }
        let layered = Self.layer(allWrites, root: path) { record in
            (record.visible || includeHidden) && !(excluding?.contains(record.writeID) ?? false)
                && (record.path.contains(path) || path.contains(record.path))
        }
        return layered.apply(to: completeServerCache ?? .empty)
    }

    /// The children at `path` known completely: from writes, or server children with writes on top.
    func calcCompleteEventChildren(_ path: Path, completeServerChildren: Node) -> Node {
        var result = Node.empty
        if let topLevel = visibleWrites.completeNode(at: path) {
            topLevel.forEachChild { k, n in result = result.updatingImmediateChild(k, n) }
            return result
        }
        let merge = visibleWrites.childCompoundWrite(at: path)
        completeServerChildren.forEachChild { k, n in
            result = result.updatingImmediateChild(k, merge.childCompoundWrite(at: Path(keys: [k])).apply(to: n))
        }
        for child in merge.completeChildren { result = result.updatingImmediateChild(child.name, child.node) }
        return result
    }

    /// After server data changed at `path`/`childPath`: what the event cache shows there, or nil
    /// when a write shadows it (no events).
    func calcEventCacheAfterServerOverwrite(_ path: Path, childPath: Path, existingEventSnap: Node?, existingServerSnap: Node?) -> Node? {
        let full = path.child(childPath)
        if visibleWrites.hasCompleteWrite(at: full) { return nil }
        let childMerge = visibleWrites.childCompoundWrite(at: full)
        let server = (existingServerSnap ?? .empty).getChild(childPath)
        return childMerge.isEmpty ? server : childMerge.apply(to: server)
    }

    /// The complete child `key` of `path` after writes, or nil.
    func calcCompleteChild(_ path: Path, key: String, serverCache: CacheNode) -> Node? {
        let childPath = path.child(key)
        if let shadowing = visibleWrites.completeNode(at: childPath) { return shadowing }
        guard serverCache.isComplete(forChild: key) else { return nil }
        return visibleWrites.childCompoundWrite(at: childPath).apply(to: serverCache.node.getImmediateChild(key))
    }

    /// The first child after `post` in index order, with writes applied — to refill a limited
    /// window when a child leaves it.
    func calcNextNode(_ path: Path, after post: NamedNode, completeServerData: Node?, reverse: Bool, index: QueryIndex) -> NamedNode? {
        let merge = visibleWrites.childCompoundWrite(at: path)
        let toIterate: Node
        if let shadowing = merge.completeNode(at: .root) {
            toIterate = shadowing
        } else if let completeServerData {
            toIterate = merge.apply(to: completeServerData)
        } else {
            return nil
        }
        var best: NamedNode?
        toIterate.forEachChild { k, n in
            let candidate = NamedNode(name: k, node: n)
            if index.compare(candidate, post, reverse: reverse) > 0,
               best.map({ index.compare(candidate, $0, reverse: reverse) < 0 }) ?? true {
                best = candidate
            }
        }
        return best
    }

    /// Layers the writes `filter` keeps into a compound write rooted at `root`.
    static func layer(_ writes: [WriteRecord], root: Path, filter: (WriteRecord) -> Bool) -> CompoundWrite {
        var result = CompoundWrite.empty
        for record in writes where filter(record) {
            switch record.change {
            case .overwrite(let node):
                if root.contains(record.path) {
                    result = result.addingWrite(node, at: root.relative(to: record.path))
                } else if record.path.contains(root) {
                    result = result.addingWrite(node.getChild(record.path.relative(to: root)), at: .root)
                }
            case .merge(let merge):
                if root.contains(record.path) {
                    result = result.addingCompoundWrite(merge, at: root.relative(to: record.path))
                } else if record.path.contains(root) {
                    let relative = record.path.relative(to: root)
                    if relative.isEmpty {
                        result = result.addingCompoundWrite(merge, at: .root)
                    } else if let child = merge.completeNode(at: relative) {
                        result = result.addingWrite(child, at: .root)
                    }
                }
            }
        }
        return result
    }
}

/// The write tree as seen from one location (a sync point's path).
struct WriteTreeRef {
    let path: Path
    let tree: WriteTree

    func child(_ key: String) -> WriteTreeRef { WriteTreeRef(path: path.child(key), tree: tree) }

    func calcCompleteEventCache(_ completeServerCache: Node?) -> Node? {
        tree.calcCompleteEventCache(path, completeServerCache: completeServerCache)
    }

    func calcCompleteEventChildren(_ completeServerChildren: Node) -> Node {
        tree.calcCompleteEventChildren(path, completeServerChildren: completeServerChildren)
    }

    func calcEventCacheAfterServerOverwrite(_ childPath: Path, existingEventSnap: Node?, existingServerSnap: Node?) -> Node? {
        tree.calcEventCacheAfterServerOverwrite(path, childPath: childPath, existingEventSnap: existingEventSnap, existingServerSnap: existingServerSnap)
    }

    func shadowingWrite(_ relative: Path) -> Node? { tree.shadowingWrite(path.child(relative)) }

    func calcNextNode(after post: NamedNode, completeServerData: Node?, reverse: Bool, index: QueryIndex) -> NamedNode? {
        tree.calcNextNode(path, after: post, completeServerData: completeServerData, reverse: reverse, index: index)
    }

    func calcCompleteChild(_ key: String, serverCache: CacheNode) -> Node? {
        tree.calcCompleteChild(path, key: key, serverCache: serverCache)
    }
}
