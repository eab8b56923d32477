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

    /// The locations this write fully determines.
    var writtenPaths: [Path] {
        switch change {
        case .overwrite: return [path]
        case .merge(let m):
            var out: [Path] = []
            m.forEachWrite { p, _ in out.append(path.child(p)) }
            return out
        }
    }

    func covers(_ other: Path) -> Bool { writtenPaths.contains { $0.contains(other) } }
}

/// Where pending writes' records are read from (the database's log).
protocol StoredValues: ValueReader {
    /// The write with this id, values resolved as the local view shows them.
    func writeRecord(_ id: Int64) -> WriteRecord?
    /// Where each value of the write sits (its path from the root) and whether it is empty,
    /// for rebuilding the overlay.
    func writeValues(_ id: Int64) -> [(Path, ValueHandle, Bool)]
}

/// Children in a query's order from an index over the visible data (the database's
/// child-value indexes), so that a limited view finds the child after its window without a
/// pass over every child.
protocol IndexedChildSource: AnyObject {
    /// The child right after `post` (before it, with `reverse`) at `location` in `index`'s
    /// order, in the visible data: `.some(nil)` when there is none; nil when no index there can
    /// say (then the caller works it out from the data).
    func indexedChild(at location: Path, after post: NamedNode, index: QueryIndex, reverse: Bool) -> NamedNode??
    /// What `query` shows now — its window of the complete visible data — read from the index
    /// that orders it; nil when the index cannot say at once (not current, unusable, or the
    /// data there not complete).
    func window(of query: QuerySpec) -> Node?
    /// The stored server data for `query` (complete or partial), as a new view starts with.
    func serverCache(for query: QuerySpec) -> CacheNode
}

/// A child of a stored update: its path (relative to the update's), where its value is, and
/// the value's first byte (nil only for no bytes), which tells whether it is empty.
struct StoredChild {
    var path: Path
    var ref: ValueRef
    var firstByte: UInt8?

    /// An empty value is the empty tag alone.
    var empty: Bool { ref.length == 1 && firstByte == ValueCodec.Tag.empty.rawValue }
}

/// Every pending local write, and the result of layering the visible ones, so that views can
/// compute what the user sees: server data with local writes on top.
///
/// The layered writes live in an index from path to value (the overlay) rather than in a tree
/// of nodes: an entry below another is newer and overrides that part of it. Values are read
/// (from the log, for a persistent store) only where a view or a read needs them.
final class WriteTree {
    let overlay = LayeredIndex()
    /// Indexes over the visible data, when the database declares some.
    weak var indexedChildren: (any IndexedChildSource)?
    private(set) var pending = PendingList()
    private(set) var lastWriteID: Int64 = -1
    /// Ids of invisible (transaction) writes.
    private var hidden: Set<Int64> = []
    weak var stored: (any StoredValues)? {
        didSet { overlay.reader = stored }
    }

    var pendingCount: Int { pending.count }

    // MARK: Adding and removing writes

    /// Records a set. `ref` says where its (resolved) value is stored; nil keeps it inline.
    func addOverwrite(_ path: Path, _ node: Node, writeID: Int64, visible: Bool, ref: ValueRef? = nil, empty: Bool? = nil, firstByte: UInt8? = nil) {
        precondition(writeID > lastWriteID, "write ids must increase")
        let inline = ref == nil ? WriteRecord(writeID: writeID, path: path, change: .overwrite(node), visible: visible) : nil
        let key = PathKey.encode(path)  // (once for both)
        pending.append(writeID, key: key, isOverwrite: true, visible: visible, inline: inline)
        if visible {
            overlay.set(ref.map { .stored($0) } ?? .inline(node), empty: empty ?? node.isEmpty, at: path, key: key, firstByte: firstByte)
        } else {
            hidden.insert(writeID)
        }
        lastWriteID = writeID
    }

    /// Records an update held in memory.
    func addMerge(_ path: Path, _ children: CompoundWrite, writeID: Int64) {
        precondition(writeID > lastWriteID, "write ids must increase")
        pending.append(writeID, path: path, isOverwrite: false, visible: true,
                       inline: WriteRecord(writeID: writeID, path: path, change: .merge(children), visible: true))
        children.forEachWrite { relative, node in
            overlay.set(.inline(node), empty: node.isEmpty, at: path.child(relative))
        }
        lastWriteID = writeID
    }

    /// Records an update whose values are all stored (see ``StoredChild``). The children
    /// are laid down in the order a ``CompoundWrite`` of them applies (key by key, each in
    /// String's order; that order can matter: a removal emptying a node with a priority drops
    /// the priority before a sibling is written), whatever order they come in (update records
    /// written by earlier builds list them by their keys' bytes, which differs for keys not in
    /// NFC form).
    func addMerge(_ path: Path, writeID: Int64, stored: [StoredChild]) {
        precondition(writeID > lastWriteID, "write ids must increase")
        pending.append(writeID, path: path, isOverwrite: false, visible: true, inline: nil)
        var stored = stored
        stored.sort { $0.path.keys.lexicographicallyPrecedes($1.path.keys) }  // (in order already: one pass)
        for c in stored {
            overlay.set(.stored(c.ref), empty: c.empty, at: path.child(c.path), firstByte: c.firstByte)
        }
        lastWriteID = writeID
    }

    func write(_ writeID: Int64) -> WriteRecord? {
        guard let i = pending.index(of: writeID) else { return nil }
        return record(at: i)
    }

    private func record(at i: Int) -> WriteRecord? {
        let id = pending.id(at: i)
        return pending.inlineRecord(id) ?? stored?.writeRecord(id)
    }

    /// Whether the write at index `i` fully determines `path`.
    private func covers(_ i: Int, _ path: Path) -> Bool {
        if pending.isOverwrite(at: i) { return pending.path(at: i).contains(path) }
        return record(at: i)?.covers(path) ?? false
    }

    /// Removes a write (acknowledged or rejected). Returns whether it may have been visible,
    /// so that views must be re-evaluated.
    func removeWrite(_ writeID: Int64) -> Bool {
        guard let index = pending.index(of: writeID) else { return false }
        let removedPath = pending.path(at: index)
        let removedRecord = pending.isOverwrite(at: index) ? nil : record(at: index)
        var wasVisible = pending.isVisible(at: index)
        pending.remove(at: index)
        hidden.remove(writeID)
        var overlaps = false
        var i = pending.count - 1
        let removedKey = PathKey.encode(removedPath)
        while wasVisible && i >= 0 {
            // Only writes on the removed one's line (at, above or below it) can matter; the
            // bytes tell those apart without building each path.
            if pending.isVisible(at: i), removedKey.withUnsafeBytes({ pending.isRelated(at: i, toKey: $0) }) {
                let path = pending.path(at: i)
                if i >= index && covers(i, removedPath) {
                    wasVisible = false  // a later write shadows it completely
                } else if removedPath.contains(path) {
                    overlaps = true  // writes below it: older ones it covered, or newer ones over part of it
                } else if i < index && path.contains(removedPath) && covers(i, removedPath) {
                    // An older write above it, which it was layered over (Firebase's write
                    // tree misses this one and loses or keeps the wrong data on a revert).
                    overlaps = true
                }
            }
            i -= 1
        }
        if overlay.hasFoldedWrites {  // (even for a write shadowed since: its entry may have moved)
            rebuildOverlay()
            return true
        }
        if !wasVisible { return false }
        if overlaps {
            rebuildOverlay()
        } else if let removedRecord {
            for p in removedRecord.writtenPaths { overlay.removeSubtree(p) }
        } else {
            overlay.removeSubtree(removedPath)
        }
        return true
    }

    /// Removes the oldest pending write (acknowledged in order): O(1) in the number of pending
    /// writes — O(log n) index look-ups per location the write wrote — instead of
    /// ``removeWrite(_:)``'s scan of every pending write. `writtenKeys` are the index keys
    /// (``PathKey/encode(_:)``) of the locations it wrote (its path for a set; each child's for
    /// an update). Returns what ``removeWrite(_:)``
    /// returns. Falls back to re-layering the remaining writes (O(n)) only where a newer write
    /// sits below one of those locations or a marker stands in for one of its leaves, while
    /// some write's entry may lie above its own path (``LayeredIndex/hasFoldedWrites``), and for
    /// writes given as nodes (the sync tree used on its own, as the conformance cases do), whose
    /// values are not named by write id in the overlay.
    func removeOldest(_ writeID: Int64, writtenKeys: [[UInt8]]) -> Bool {
        precondition(pending.firstID == writeID, "removeOldest takes the oldest pending write")
        if pending.inlineRecord(writeID) != nil { return removeWrite(writeID) }
        let visible = pending.isVisible(at: 0)
        pending.removeFirst()
        guard visible else {
            hidden.remove(writeID)
            return false
        }
        if overlay.hasFoldedWrites {
            rebuildOverlay()
            return true
        }
        var own: [[UInt8]] = []
        for key in writtenKeys {
            guard let entry = overlay.index.get(key) else { continue }  // a newer write above replaced it
            if entry.isInline || entry.isMarker {
                rebuildOverlay()
                return true
            }
            guard entry.ref.lsn == UInt64(writeID) else { continue }  // a newer write at the same place
            if overlay.index.hasKey(strictlyBelow: key) {
                rebuildOverlay()  // newer writes below it, which were layered over its value
                return true
            }
            own.append(key)
        }
        if own.isEmpty { return false }  // shadowed everywhere: nothing visible changes
        for key in own { overlay.removeEntry(key) }
        return true
    }

    /// Re-layers every visible pending write, oldest first.
    private func rebuildOverlay() {
        overlay.removeAll(eachKey: true)  // (child-value indexes move the children named, not rebuild)
        for i in 0..<pending.count where pending.isVisible(at: i) {
            let id = pending.id(at: i)
            if let record = pending.inlineRecord(id) {
                switch record.change {
                case .overwrite(let n): overlay.set(node: n, at: record.path)
                case .merge(let m): m.forEachWrite { p, n in overlay.set(node: n, at: record.path.child(p)) }
                }
            } else {
                for (p, handle, empty) in stored?.writeValues(id) ?? [] { overlay.set(handle, empty: empty, at: p) }
            }
        }
    }

    func removeAllWrites() -> [WriteRecord] {
        let all = (0..<pending.count).compactMap { record(at: $0) }
        pending.removeAll()
        overlay.removeAll(eachKey: true)
        hidden = []
        return all
    }

    /// The pending writes, oldest first (read from storage as needed).
    var allWrites: [WriteRecord] { (0..<pending.count).compactMap { record(at: $0) } }

    /// Restores pending writes and their overlay from a checkpoint (values stay stored).
    /// Empties the tree before a checkpoint is loaded into it.
    func beginRestore() {
        pending.removeAll()
        overlay.removeAll()
        hidden = []
        lastWriteID = -1
    }

    /// Takes the pending writes and overlay `other` restored (a loaded checkpoint's) as its own.
    func install(_ other: WriteTree) {
        pending = other.pending
        hidden = other.hidden
        lastWriteID = other.lastWriteID
        overlay.install(other.overlay)
    }

    func reservePending(_ count: Int, keyBytes: Int) { pending.reserveCapacity(adding: count, keyBytes: keyBytes) }

    /// Puts back a pending write as a checkpoint kept it (its overlay entries are restored
    /// separately); ids must rise. False when `key` is not a path's key.
    func restorePending(_ id: Int64, flags: UInt8, key: UnsafeRawBufferPointer) -> Bool {
        guard id > lastWriteID, PathKey.depth(key) != nil else { return false }
        pending.append(id, flags: flags, key: key)
        if flags & PendingList.visibleFlag == 0 { hidden.insert(id) }
        lastWriteID = id
        return true
    }

    /// Puts back a batch of pending writes as a checkpoint kept them (format 6): their ids
    /// (rising, after every id here), flags, and path keys end to end (`keyEnds` the end of
    /// each). False, and nothing changed, when an id does not rise, a flag is unknown, a key is
    /// not a path's, or the keys would not fit the list.
    func restorePending(ids: [Int64], flags: UnsafeRawBufferPointer, keys: UnsafeRawBufferPointer, keyEnds: [UInt32]) -> Bool {
        precondition(ids.count == flags.count && ids.count == keyEnds.count)
        // (Offsets into the list's path bytes are 32-bit.)
        guard pending.keyBytes + keys.count <= Int(UInt32.max) else { return false }
        var last = lastWriteID, start = 0
        for i in ids.indices {
            let end = Int(keyEnds[i])
            guard ids[i] > last, flags[i] <= PendingList.overwriteFlag | PendingList.visibleFlag, start <= end, end <= keys.count,
                  PathKey.depth(UnsafeRawBufferPointer(rebasing: keys[start..<end])) != nil else { return false }
            last = ids[i]
            start = end
        }
        pending.append(ids: ids, flags: flags, keys: UnsafeRawBufferPointer(rebasing: keys[0..<start]), keyEnds: keyEnds)
        for i in ids.indices where flags[i] & PendingList.visibleFlag == 0 { hidden.insert(ids[i]) }
        lastWriteID = last
        return true
    }

    // MARK: The layered visible writes

    /// The node visible writes fully determine at `path`, or nil.
    func completeNode(at path: Path) -> Node? { overlay.completeNode(at: path) }

    func hasCompleteWrite(at path: Path) -> Bool { overlay.isComplete(at: path) }

    /// The visible writes at and below `path`, as a compound write rooted there.
    func childCompoundWrite(at path: Path) -> CompoundWrite { Self.childCompoundWrite(overlay, at: path) }

    static func childCompoundWrite(_ overlay: LayeredIndex, at path: Path) -> CompoundWrite {
        if let node = overlay.completeNode(at: path) { return CompoundWrite(tree: ImmutableTree(node)) }
        // Each topmost entry below `path` as one write: the node it and the entries below it
        // give (the later writes folded into it, as Firebase's write tree folds them).
        var result = CompoundWrite.empty
        var top: Path?
        for (relative, e) in overlay.entries(below: path) {
            if let top, top.contains(relative) { continue }
            top = relative
            result.addWrite(overlay.completeNode(at: path.child(relative)) ?? overlay.value(e), at: relative)
        }
        return result
    }

    /// Whether any visible write is at, above or below `path` (the data there has pending writes).
    func hasVisibleWrite(touching path: Path) -> Bool { overlay.touches(path) }

    // MARK: Computing what views see

    /// The node a visible write fully determines at `path`, or nil.
    func shadowingWrite(_ path: Path) -> Node? { completeNode(at: path) }

    /// The complete data at `path`: server data (when complete) with writes on top. Nil when
    /// neither is complete there.
    func calcCompleteEventCache(_ path: Path, completeServerCache: Node?, excluding: Set<Int64>? = nil,
                                includeHidden: Bool = false) -> Node? {
        if excluding == nil && (!includeHidden || hidden.isEmpty) {
            return Self.visibleNode(at: path, overlay: overlay) { completeServerCache }
        }
        let merge = childCompoundWrite(at: path)
        if !includeHidden && merge.isEmpty { return completeServerCache }
        if !includeHidden && completeServerCache == nil && !merge.hasCompleteWrite(at: .root) { return nil }
        let related = (0..<pending.count).filter { i in
            let p = pending.path(at: i)
            return (pending.isVisible(at: i) || includeHidden) && !(excluding?.contains(pending.id(at: i)) ?? false)
                && (p.contains(path) || path.contains(p))
        }
        let layered = Self.layer(related.compactMap { record(at: $0) }, root: path) { _ in true }
        return layered.apply(to: completeServerCache ?? .empty)
    }

    /// What a reader sees at `path` with the visible writes of `overlay` over the server data
    /// `server` gives (nil when that is not complete there), or nil when that is not complete.
    /// Also run on frozen copies of the indexes, for snapshots read outside the lock.
    static func visibleNode(at path: Path, overlay: LayeredIndex, server: () -> Node?) -> Node? {
        if let shadowing = overlay.completeNode(at: path) { return shadowing }
        let below = overlay.entries(below: path)
        if below.isEmpty { return server() }
        // No write at `path`: without complete server data there, nothing is complete.
        guard let serverNode = server() else { return nil }
        return overlay.layered(below, onto: serverNode)
    }

    /// The children at `path` known completely: from writes, or server children with writes on top.
    func calcCompleteEventChildren(_ path: Path, completeServerChildren: Node) -> Node {
        var result = Node.empty
        if let topLevel = completeNode(at: path) {
            topLevel.forEachChild { k, n in result = result.updatingImmediateChild(k, n) }
            return result
        }
        let merge = childCompoundWrite(at: path)
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
        if hasCompleteWrite(at: full) { return nil }
        let childMerge = childCompoundWrite(at: full)
        let server = (existingServerSnap ?? .empty).getChild(childPath)
        return childMerge.isEmpty ? server : childMerge.apply(to: server)
    }

    /// The complete child `key` of `path` after writes, or nil.
    func calcCompleteChild(_ path: Path, key: String, serverCache: CacheNode) -> Node? {
        let childPath = path.child(key)
        if let shadowing = completeNode(at: childPath) { return shadowing }
        guard serverCache.isComplete(forChild: key) else { return nil }
        return childCompoundWrite(at: childPath).apply(to: serverCache.node.getImmediateChild(key))
    }

    /// The first child after `post` in index order, with writes applied — to refill a limited
    /// window when a child leaves it.
    func calcNextNode(_ path: Path, after post: NamedNode, completeServerData: Node?, reverse: Bool, index: QueryIndex) -> NamedNode? {
        let merge = childCompoundWrite(at: path)
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
                    result.addWrite(node, at: root.relative(to: record.path))
                } else if record.path.contains(root) {
                    result.addWrite(node.getChild(record.path.relative(to: root)), at: .root)
                }
            case .merge(let merge):
                if root.contains(record.path) {
                    result.addCompoundWrite(merge, at: root.relative(to: record.path))
                } else if record.path.contains(root) {
                    let relative = record.path.relative(to: root)
                    if relative.isEmpty {
                        result.addCompoundWrite(merge, at: .root)
                    } else if let child = merge.completeNode(at: relative) {
                        result.addWrite(child, at: .root)
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

    /// ``IndexedChildSource/indexedChild(at:after:index:reverse:)`` here.
    func indexedChild(after post: NamedNode, index: QueryIndex, reverse: Bool) -> NamedNode?? {
        tree.indexedChildren?.indexedChild(at: path, after: post, index: index, reverse: reverse)
    }

    func calcNextNode(after post: NamedNode, completeServerData: Node?, reverse: Bool, index: QueryIndex) -> NamedNode? {
        tree.calcNextNode(path, after: post, completeServerData: completeServerData, reverse: reverse, index: index)
    }

    func calcCompleteChild(_ key: String, serverCache: CacheNode) -> Node? {
        tree.calcCompleteChild(path, key: key, serverCache: serverCache)
    }
}
