/// A node with its children ordered by a query's index (key order is used directly when the
/// index cannot differ from it).
struct IndexedNode: Sendable {
    let node: Node
    let index: QueryIndex
    /// Children in index order, when that differs from key order.
    private let order: [NamedNode]?

    init(_ node: Node, index: QueryIndex = .priority) {
        self.node = node
        self.index = index
        if index.needsOwnOrder(for: node) {
            order = index.sorted(node.childMap.entries)
        } else {
            order = nil
        }
    }

    private init(node: Node, index: QueryIndex, order: [NamedNode]?) {
        self.node = node
        self.index = index
        self.order = order
    }

    /// The children in index order.
    var ordered: [NamedNode] { order ?? node.childMap.entries }

    func updatingChild(_ key: String, _ child: Node) -> IndexedNode {
        let newNode = node.updatingImmediateChild(key, child)
        guard var order else {
            // Key order may stop sufficing (a child gained a priority, say).
            if index.needsOwnOrder(for: newNode) { return IndexedNode(newNode, index: index) }
            return IndexedNode(node: newNode, index: index, order: nil)
        }
        let old = node.getImmediateChild(key)
        if !old.isEmpty, let i = position(of: NamedNode(name: key, node: old), in: order), order[i].name == key {
            order.remove(at: i)
        } else if !old.isEmpty, let i = order.firstIndex(where: { $0.name == key }) {
            order.remove(at: i)
        }
        if !child.isEmpty {
            let item = NamedNode(name: key, node: child)
            order.insert(item, at: insertionPoint(of: item, in: order))
        }
        return IndexedNode(node: newNode, index: index, order: order)
    }

    func updatingPriority(_ priority: Node) -> IndexedNode {
        IndexedNode(node: node.updatingPriority(priority), index: index, order: order)
    }

    var firstChild: NamedNode? { ordered.first }
    var lastChild: NamedNode? { ordered.last }

    /// The key of the child before `(key, child)` in index order, or nil when it is first.
    func predecessor(of key: String, child: Node) -> String? {
        let items = ordered
        let item = NamedNode(name: key, node: child)
        let i = insertionPoint(of: item, in: items)
        var j = i - 1
        while j >= 0, items[j].name == key { j -= 1 }
        return j >= 0 ? items[j].name : nil
    }

    private func insertionPoint(of item: NamedNode, in items: [NamedNode]) -> Int {
        var lo = 0, hi = items.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if index.compare(items[mid], item) < 0 { lo = mid + 1 } else { hi = mid }
        }
        return lo
    }

    private func position(of item: NamedNode, in items: [NamedNode]) -> Int? {
        let i = insertionPoint(of: item, in: items)
        return i < items.count && index.compare(items[i], item) == 0 ? i : nil
    }
}
