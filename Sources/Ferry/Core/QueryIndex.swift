/// How a query orders children.
enum QueryIndex: Hashable, Sendable {
    /// By priority, then key (the default).
    case priority
    case key
    case value
    /// By the value at a child path, then key.
    case child(Path)

    /// Orders two named nodes; ties in the indexed value are broken by key.
    func compare(_ a: NamedNode, _ b: NamedNode) -> Int {
        let c: Int
        switch self {
        case .key: return KeyOrder.compare(a.name, b.name)
        case .priority: c = Node.compare(a.node.priority, b.node.priority)
        case .value: c = Node.compare(a.node, b.node)
        case .child(let path): c = Node.compare(a.node.getChild(path), b.node.getChild(path))
        }
        return c != 0 ? c : KeyOrder.compare(a.name, b.name)
    }

    /// What a child is ordered by (not for ``key``, which orders by name alone).
    func indexedValue(_ node: Node) -> Node {
        switch self {
        case .key: .empty
        case .priority: node.priority
        case .value: node
        case .child(let path): node.getChild(path)
        }
    }

    /// `entries` (in key order, as a node holds them) in this index's order: each child's
    /// indexed value is taken once, then sorted — O(n log n) comparisons of values, not of
    /// children looked up again at every comparison. Ties keep key order.
    func sorted(_ entries: [NamedNode]) -> [NamedNode] {
        if self == .key { return entries }
        let values = entries.map { indexedValue($0.node) }
        var order = Array(entries.indices)
        order.sort { i, j in
            let c = Node.compare(values[i], values[j])
            return c != 0 ? c < 0 : i < j
        }
        return order.map { entries[$0] }
    }

    func compare(_ a: NamedNode, _ b: NamedNode, reverse: Bool) -> Int {
        reverse ? compare(b, a) : compare(a, b)
    }

    /// Whether a child's position can differ between the two nodes.
    func indexedValueChanged(_ old: Node, _ new: Node) -> Bool {
        switch self {
        case .key: false
        case .priority: old.priority != new.priority
        case .value: old != new
        case .child(let path): old.getChild(path) != new.getChild(path)
        }
    }

    /// Whether ordering by this index can differ from key order for some child of `node`.
    func needsOwnOrder(for node: Node) -> Bool {
        switch self {
        case .key: return false
        case .priority:
            if let c = node.childParts?.children { return c.entries.contains { !$0.node.priority.isEmpty } }
            return false
        case .value, .child: return node.numChildren > 1
        }
    }

    var minPost: NamedNode { NamedNode(name: KeyOrder.minName, node: .empty) }

    var maxPost: NamedNode {
        switch self {
        case .priority: NamedNode(name: KeyOrder.maxName, node: .leaf(.post, priority: .max))
        case .key: NamedNode(name: KeyOrder.maxName, node: .empty)
        case .value: NamedNode(name: KeyOrder.maxName, node: .max)
        case .child(let path): NamedNode(name: KeyOrder.maxName, node: Node.empty.updatingChild(path, .max))
        }
    }

    /// A boundary node placed where `value` (with key `name`) sorts in this index.
    func makePost(_ value: Node, name: String) -> NamedNode {
        switch self {
        case .priority: NamedNode(name: name, node: .leaf(.post, priority: value))
        case .key:
            if case .string(let s)? = value.leafValue { NamedNode(name: s, node: .empty) } else { NamedNode(name: name, node: .empty) }
        case .value: NamedNode(name: name, node: value)
        case .child(let path): NamedNode(name: name, node: Node.empty.updatingChild(path, value))
        }
    }
}
