/// A persistent tree keyed by path components, holding an optional value at each location.
struct ImmutableTree<T> {
    var value: T?
    var children: [String: ImmutableTree<T>]

    init(_ value: T? = nil, children: [String: ImmutableTree<T>] = [:]) {
        self.value = value
        self.children = children
    }

    static var empty: ImmutableTree<T> { ImmutableTree() }

    var isEmpty: Bool { value == nil && children.isEmpty }

    /// Children's keys in a fixed order (plain string order, as Firebase's trees iterate).
    var sortedChildKeys: [String] { children.keys.sorted() }

    /// The shallowest value on `path` (at the root, a key of it, …) and where it is.
    func findRootMostValueAndPath(_ path: Path) -> (path: Path, value: T)? {
        if let value { return (.root, value) }
        guard let front = path.front, let child = children[front] else { return nil }
        guard let found = child.findRootMostValueAndPath(path.popFront) else { return nil }
        return (Path(keys: [front] + found.path.keys), found.value)
    }

    func subtree(at path: Path) -> ImmutableTree<T> {
        var tree = self
        for key in path.keys {
            guard let child = tree.children[key] else { return .empty }
            tree = child
        }
        return tree
    }

    func value(at path: Path) -> T? { subtree(at: path).value }

    func setting(_ value: T?, at path: Path) -> ImmutableTree<T> {
        guard let front = path.front else { return ImmutableTree(value, children: children) }
        var copy = self
        let child = (children[front] ?? .empty).setting(value, at: path.popFront)
        copy.children[front] = child.isEmpty ? nil : child
        return copy
    }

    func setting(tree: ImmutableTree<T>, at path: Path) -> ImmutableTree<T> {
        guard let front = path.front else { return tree }
        var copy = self
        let child = (children[front] ?? .empty).setting(tree: tree, at: path.popFront)
        copy.children[front] = child.isEmpty ? nil : child
        return copy
    }

    /// ``setting(_:at:)`` in place: a tree held once is changed without copying its levels
    /// (building a tree of k children by `setting` copied the children k times: O(k²)).
    mutating func set(_ value: T?, at path: Path) {
        guard let front = path.front else { return self.value = value }
        var child = children.removeValue(forKey: front) ?? .empty
        child.set(value, at: path.popFront)
        if !child.isEmpty { children[front] = child }
    }

    /// ``setting(tree:at:)`` in place.
    mutating func set(tree: ImmutableTree<T>, at path: Path) {
        guard let front = path.front else { return self = tree }
        var child = children.removeValue(forKey: front) ?? .empty
        child.set(tree: tree, at: path.popFront)
        if !child.isEmpty { children[front] = child }
    }

    /// Every value with its path, children (in key order) before their parent's value.
    func forEach(_ body: (Path, T) throws -> Void) rethrows {
        try forEach(at: .root, body)
    }

    private func forEach(at path: Path, _ body: (Path, T) throws -> Void) rethrows {
        for key in sortedChildKeys { try children[key]!.forEach(at: path.child(key), body) }
        if let value { try body(path, value) }
    }

    /// Calls `body` for each location on `path` that has a value (root first) until it returns false.
    func forEachOnPath(_ path: Path, _ body: (Path, T) -> Bool) {
        var tree = self
        var current = Path.root
        if let v = tree.value, !body(current, v) { return }
        for key in path.keys {
            guard let child = tree.children[key] else { return }
            tree = child
            current = current.child(key)
            if let v = tree.value, !body(current, v) { return }
        }
    }

    /// Post-order fold: `body` gets a location's value and its children's results.
    func fold<R>(_ body: (Path, T?, [String: R]) -> R) -> R { fold(at: .root, body) }

    private func fold<R>(at path: Path, _ body: (Path, T?, [String: R]) -> R) -> R {
        var results: [String: R] = [:]
        for key in sortedChildKeys { results[key] = children[key]!.fold(at: path.child(key), body) }
        return body(path, value, results)
    }
}

/// A set of writes layered over a node: a tree of complete nodes at paths. A write at a path
/// with a write above it updates that write's node; a write replaces any writes below it.
struct CompoundWrite: Sendable {
    var tree: ImmutableTree<Node>

    static let empty = CompoundWrite(tree: .empty)

    /// From a map of relative paths to nodes (an update's children).
    init(_ writes: [(Path, Node)]) {
        var w = CompoundWrite.empty
        for (p, n) in writes { w.addWrite(n, at: p) }
        self = w
    }

    init(tree: ImmutableTree<Node>) { self.tree = tree }

    var isEmpty: Bool { tree.isEmpty }
    var rootWrite: Node? { tree.value }

    func addingWrite(_ node: Node, at path: Path) -> CompoundWrite {
        var result = self
        result.addWrite(node, at: path)
        return result
    }

    /// ``addingWrite(_:at:)`` in place.
    mutating func addWrite(_ node: Node, at path: Path) {
        if path.isEmpty { return self = CompoundWrite(tree: ImmutableTree(node)) }
        if let (rootPath, value) = tree.findRootMostValueAndPath(path) {
            return tree.set(value.updatingChild(rootPath.relative(to: path), node), at: rootPath)
        }
        tree.set(tree: ImmutableTree(node), at: path)
    }

    func addingCompoundWrite(_ other: CompoundWrite, at path: Path) -> CompoundWrite {
        var result = self
        result.addCompoundWrite(other, at: path)
        return result
    }

    /// ``addingCompoundWrite(_:at:)`` in place.
    mutating func addCompoundWrite(_ other: CompoundWrite, at path: Path) {
        other.tree.forEach { p, n in addWrite(n, at: path.child(p)) }
    }

    /// Removes the write at `path` and any below it (not one above it).
    func removingWrite(at path: Path) -> CompoundWrite {
        if path.isEmpty { return .empty }
        return CompoundWrite(tree: tree.setting(tree: .empty, at: path))
    }

    func hasCompleteWrite(at path: Path) -> Bool { completeNode(at: path) != nil }

    /// The node a write fully determines at `path` (from a write there or above), or nil.
    func completeNode(at path: Path) -> Node? {
        guard let (rootPath, value) = tree.findRootMostValueAndPath(path) else { return nil }
        return value.getChild(rootPath.relative(to: path))
    }

    /// Children fully written at this level.
    var completeChildren: [NamedNode] {
        if let v = tree.value {
            return v.childMap.entries
        }
        return tree.sortedChildKeys.compactMap { k in tree.children[k]!.value.map { NamedNode(name: k, node: $0) } }
    }

    var childCompoundWrites: [(String, CompoundWrite)] {
        tree.sortedChildKeys.map { ($0, CompoundWrite(tree: tree.children[$0]!)) }
    }

    func childCompoundWrite(at path: Path) -> CompoundWrite {
        if path.isEmpty { return self }
        if let shadowing = completeNode(at: path) { return CompoundWrite(tree: ImmutableTree(shadowing)) }
        return CompoundWrite(tree: tree.subtree(at: path))
    }

    func forEachWrite(_ body: (Path, Node) throws -> Void) rethrows { try tree.forEach(body) }

    func apply(to node: Node) -> Node { Self.apply(tree, to: node) }

    /// `write` laid over `node`, a level at a time: each child's new node is worked out from
    /// the child as it was, and the level's children are then replaced in one pass (as
    /// ``Node/updatingImmediateChildren(_:)`` does, which gives what one change at a time in
    /// key order gives — a write per child used to copy the level's children each time:
    /// O(n²) for n written children).
    private static func apply(_ write: ImmutableTree<Node>, to node: Node) -> Node {
        if let v = write.value { return v }
        var priorityWrite: Node?
        var changes: [(String, Node)] = []
        changes.reserveCapacity(write.children.count)
        for key in write.sortedChildKeys {
            let child = write.children[key]!
            if key == ".priority" {
                priorityWrite = child.value  // applied last, and only to a non-empty node
            } else {
                changes.append((key, apply(child, to: node.getImmediateChild(key))))
            }
        }
        var result = changes.isEmpty ? node : node.updatingImmediateChildren(changes)
        if let p = priorityWrite, !result.isEmpty { result = result.updatingPriority(p) }
        return result
    }
}

/// Where an operation came from.
struct OperationSource: Sendable {
    var fromUser: Bool
    var fromServer: Bool
    /// For a tagged server operation: the query it is meant for.
    var queryParams: QueryParams?
    var tagged: Bool

    static let user = OperationSource(fromUser: true, fromServer: false, queryParams: nil, tagged: false)
    static let server = OperationSource(fromUser: false, fromServer: true, queryParams: nil, tagged: false)
    static func taggedServer(_ params: QueryParams) -> OperationSource {
        OperationSource(fromUser: false, fromServer: true, queryParams: params, tagged: true)
    }
}

/// A change to apply to the views.
enum Operation: Sendable {
    case overwrite(OperationSource, Path, Node)
    case merge(OperationSource, Path, CompoundWrite)
    /// A local write acknowledged (or, with `revert`, rejected) at a path; `affected` marks the
    /// written locations relative to it.
    case ackUserWrite(Path, affected: ImmutableTree<Bool>, revert: Bool)
    case listenComplete(OperationSource, Path)

    var path: Path {
        switch self {
        case .overwrite(_, let p, _), .merge(_, let p, _), .ackUserWrite(let p, _, _), .listenComplete(_, let p): p
        }
    }

    var source: OperationSource {
        switch self {
        case .overwrite(let s, _, _), .merge(let s, _, _), .listenComplete(let s, _): s
        case .ackUserWrite: .user
        }
    }

    /// The operation as it applies to the child `key` (nil if it does not touch it).
    func forChild(_ key: String) -> Operation? {
        switch self {
        case .overwrite(let s, let p, let n):
            if p.isEmpty { return .overwrite(s, .root, n.getImmediateChild(key)) }
            return .overwrite(s, p.popFront, n)
        case .merge(let s, let p, let children):
            if p.isEmpty {
                let childTree = children.tree.subtree(at: Path(keys: [key]))
                if childTree.isEmpty { return nil }
                if let v = childTree.value { return .overwrite(s, .root, v) }
                return .merge(s, .root, CompoundWrite(tree: childTree))
            }
            return .merge(s, p.popFront, children)
        case .ackUserWrite(let p, let affected, let revert):
            if !p.isEmpty { return .ackUserWrite(p.popFront, affected: affected, revert: revert) }
            if affected.value != nil { return self }  // every child is affected
            return .ackUserWrite(.root, affected: affected.subtree(at: Path(keys: [key])), revert: revert)
        case .listenComplete(let s, let p):
            return .listenComplete(s, p.isEmpty ? .root : p.popFront)
        }
    }
}

extension ImmutableTree: Sendable where T: Sendable {}
