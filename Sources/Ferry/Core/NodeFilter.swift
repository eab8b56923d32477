/// Where a filter can find complete children it does not hold (to refill a limited window).
protocol CompleteChildSource {
    func completeChild(_ key: String) -> Node?
    func child(after post: NamedNode, index: QueryIndex, reverse: Bool) -> NamedNode?
}

struct NoCompleteChildSource: CompleteChildSource {
    func completeChild(_ key: String) -> Node? { nil }
    func child(after post: NamedNode, index: QueryIndex, reverse: Bool) -> NamedNode? { nil }
}

/// Applies changes to a view's cached node, keeping only what the query selects, and
/// reports the resulting child changes.
protocol NodeFilter: Sendable {
    var index: QueryIndex { get }
    var filtersNodes: Bool { get }
    var indexedFilter: IndexedFilter { get }
    func updateChild(_ snap: IndexedNode, key: String, newChild: Node, affectedPath: Path,
                     source: any CompleteChildSource, accumulator: ChildChangeAccumulator?) -> IndexedNode
    func updateFullNode(_ old: IndexedNode, _ new: IndexedNode, accumulator: ChildChangeAccumulator?) -> IndexedNode
    func updatePriority(_ priority: Node, _ snap: IndexedNode) -> IndexedNode
}

/// No filtering: every child, ordered by the index.
struct IndexedFilter: NodeFilter {
    let index: QueryIndex
    var filtersNodes: Bool { false }
    var indexedFilter: IndexedFilter { self }

    func updateChild(_ snap: IndexedNode, key: String, newChild: Node, affectedPath: Path,
                     source: any CompleteChildSource, accumulator: ChildChangeAccumulator?) -> IndexedNode {
        let node = snap.node
        let oldChild = node.getImmediateChild(key)
        if oldChild.getChild(affectedPath) == newChild.getChild(affectedPath) && oldChild.isEmpty == newChild.isEmpty {
            // Nothing changed (a child entering or leaving through a null at affectedPath is
            // told apart by the emptiness check).
            return snap
        }
        if let accumulator {
            if newChild.isEmpty {
                if node.hasChild(key) { accumulator.track(.removed(key, oldChild)) }
            } else if oldChild.isEmpty {
                accumulator.track(.added(key, newChild))
            } else {
                accumulator.track(.changed(key, newChild, old: oldChild))
            }
        }
        if node.isLeaf && newChild.isEmpty { return snap }
        return snap.updatingChild(key, newChild)
    }

    func updateFullNode(_ old: IndexedNode, _ new: IndexedNode, accumulator: ChildChangeAccumulator?) -> IndexedNode {
        if let accumulator {
            let olds = old.node.childMap.entries, news = new.node.childMap.entries
            // The same children (a listen completing over the data it had): nothing to compare.
            if olds.count == news.count, olds.withUnsafeBufferPointer({ $0.baseAddress }) == news.withUnsafeBufferPointer({ $0.baseAddress }) {
                return new
            }
            // Both lists are in key order: one walk along both (a search of one per child of the
            // other made a 100,000-child location's update O(n log n) in string comparisons).
            // Removals are told first, then additions and changes, each in key order.
            var removed: [NamedNode] = []
            var i = 0, j = 0
            var rest: [Change] = []
            while i < olds.count || j < news.count {
                let c = i == olds.count ? 1 : j == news.count ? -1 : KeyOrder.compare(olds[i].name, news[j].name)
                if c < 0 {
                    removed.append(olds[i])
                    i += 1
                } else if c > 0 {
                    rest.append(.added(news[j].name, news[j].node))
                    j += 1
                } else {
                    if olds[i].node != news[j].node { rest.append(.changed(news[j].name, news[j].node, old: olds[i].node)) }
                    i += 1
                    j += 1
                }
            }
            for r in removed { accumulator.track(.removed(r.name, r.node)) }
            for change in rest { accumulator.track(change) }
        }
        return new
    }

    func updatePriority(_ priority: Node, _ snap: IndexedNode) -> IndexedNode {
        snap.node.isEmpty ? snap : snap.updatingPriority(priority)
    }
}

/// Children within a start and end boundary.
struct RangedFilter: NodeFilter {
    let index: QueryIndex
    let indexedFilter: IndexedFilter
    let startPost: NamedNode
    let endPost: NamedNode
    let startInclusive: Bool
    let endInclusive: Bool

    init(params: QueryParams) {
        index = params.index
        indexedFilter = IndexedFilter(index: params.index)
        startPost = params.startPost
        endPost = params.endPost
        startInclusive = !params.startAfter
        endInclusive = !params.endBefore
    }

    var filtersNodes: Bool { true }

    func withinStart(_ n: NamedNode) -> Bool {
        let c = index.compare(startPost, n)
        return startInclusive ? c <= 0 : c < 0
    }

    func withinEnd(_ n: NamedNode) -> Bool {
        let c = index.compare(n, endPost)
        return endInclusive ? c <= 0 : c < 0
    }

    func matches(_ key: String, _ node: Node) -> Bool {
        let n = NamedNode(name: key, node: node)
        return withinStart(n) && withinEnd(n)
    }

    func updateChild(_ snap: IndexedNode, key: String, newChild: Node, affectedPath: Path,
                     source: any CompleteChildSource, accumulator: ChildChangeAccumulator?) -> IndexedNode {
        let child = matches(key, newChild) ? newChild : .empty
        return indexedFilter.updateChild(snap, key: key, newChild: child, affectedPath: affectedPath, source: source, accumulator: accumulator)
    }

    func updateFullNode(_ old: IndexedNode, _ new: IndexedNode, accumulator: ChildChangeAccumulator?) -> IndexedNode {
        var filtered: IndexedNode
        if new.node.isLeaf {
            filtered = IndexedNode(.empty, index: index)
        } else {
            // Queries do not support priorities. The children in range are gathered and the node
            // built once: O(n), where dropping the others one at a time was O(n²).
            var kept: [(String, Node)] = []
            new.node.forEachChild { key, child in
                if matches(key, child) { kept.append((key, child)) }
            }
            filtered = IndexedNode(Node.empty.updatingImmediateChildren(kept), index: index)
        }
        return indexedFilter.updateFullNode(old, filtered, accumulator: accumulator)
    }

    func updatePriority(_ priority: Node, _ snap: IndexedNode) -> IndexedNode { snap }
}

/// At most `limit` children from one end of the range, refilled from outside the window when
/// a child leaves it.
struct LimitedFilter: NodeFilter {
    let ranged: RangedFilter
    let index: QueryIndex
    let limit: Int
    let reverse: Bool

    init(params: QueryParams) {
        ranged = RangedFilter(params: params)
        index = params.index
        limit = params.limit ?? Int.max
        reverse = !params.isViewFromLeft
    }

    var filtersNodes: Bool { true }
    var indexedFilter: IndexedFilter { ranged.indexedFilter }

    func updateChild(_ snap: IndexedNode, key: String, newChild: Node, affectedPath: Path,
                     source: any CompleteChildSource, accumulator: ChildChangeAccumulator?) -> IndexedNode {
        let child = ranged.matches(key, newChild) ? newChild : .empty
        if snap.node.getImmediateChild(key) == child { return snap }
        if snap.node.numChildren < limit {
            return ranged.indexedFilter.updateChild(snap, key: key, newChild: child, affectedPath: affectedPath, source: source, accumulator: accumulator)
        }
        return fullLimitUpdate(snap, key: key, newChild: child, source: source, accumulator: accumulator)
    }

    private func fullLimitUpdate(_ old: IndexedNode, key: String, newChild: Node, source: any CompleteChildSource,
                                 accumulator: ChildChangeAccumulator?) -> IndexedNode {
        precondition(old.node.numChildren == limit, "a full window holds exactly `limit` children")
        guard let boundary = reverse ? old.firstChild : old.lastChild else { return old }
        let inRange = ranged.matches(key, newChild)
        if old.node.hasChild(key) {
            let oldChild = old.node.getImmediateChild(key)
            var next = source.child(after: boundary, index: index, reverse: reverse)
            if let n = next, n.name == key || old.node.hasChild(n.name) {
                // A child updated in the write tree but not yet in this window: skip it.
                next = source.child(after: n, index: index, reverse: reverse)
            }
            let candidate = NamedNode(name: key, node: newChild)
            let remains = inRange && !newChild.isEmpty && (next.map { index.compare($0, candidate, reverse: reverse) >= 0 } ?? true)
            if remains {
                accumulator?.track(.changed(key, newChild, old: oldChild))
                return old.updatingChild(key, newChild)
            }
            accumulator?.track(.removed(key, oldChild))
            let without = old.updatingChild(key, .empty)
            if let n = next, ranged.matches(n.name, n.node) {
                accumulator?.track(.added(n.name, n.node))
                return without.updatingChild(n.name, n.node)
            }
            return without
        } else if newChild.isEmpty {
            return old  // a child outside the window was deleted
        } else if inRange {
            if index.compare(boundary, NamedNode(name: key, node: newChild), reverse: reverse) >= 0 {
                accumulator?.track(.removed(boundary.name, boundary.node))
                accumulator?.track(.added(key, newChild))
                return old.updatingChild(key, newChild).updatingChild(boundary.name, .empty)
            }
            return old
        }
        return old
    }

    /// The window of `new`: its first `limit` children in range, from the query's end.
    ///
    /// O(n log k) for n children and a limit of k: the window is selected in one pass with a
    /// bounded heap, then built once (removing the n − k others one at a time was quadratic).
    func updateFullNode(_ old: IndexedNode, _ new: IndexedNode, accumulator: ChildChangeAccumulator?) -> IndexedNode {
        var filtered = IndexedNode(.empty, index: index)
        if !(new.node.isLeaf || new.node.isEmpty) {
            let window = selectWindow(of: new.node)
            filtered = IndexedNode(Node.empty.updatingImmediateChildren(window.map { ($0.name, $0.node) }), index: index)
        }
        return ranged.indexedFilter.updateFullNode(old, filtered, accumulator: accumulator)
    }

    /// The first `limit` in-range children of `node` in the query's direction, in that order.
    func selectWindow(of node: Node) -> [NamedNode] { selectWindow { node.forEachChild($0) } }

    /// The first `limit` in-range children among those `children` gives, in the query's
    /// direction (any order in, each child once).
    func selectWindow(_ children: ((String, Node) -> Void) -> Void) -> [NamedNode] {
        var window = Window<Node>(self)
        children { key, child in window.offer(key, index.indexedValue(child), child) }
        return window.chosen.map { NamedNode(name: $0.name, node: $0.payload) }
    }

    /// ``selectWindow(_:)`` for children given with the value they are ordered by
    /// (``QueryIndex/indexedValue(_:)``: a query by a child's value gives that value, decoded
    /// alone): no node is built or searched per child. Returns the window's keys in order.
    func selectWindow(byIndexedValue children: ((String, Node) -> Void) -> Void) -> [String] {
        var window = Window<Void>(self)
        children { key, value in window.offer(key, value, ()) }
        return window.chosen.map(\.name)
    }

    /// A window being chosen: each child's indexed value taken once and compared as it is (the
    /// range's ends taken once too), as ``QueryIndex/compare(_:_:)`` orders the children —
    /// looking up a child's value at each comparison, six per child (the range's two ends and
    /// the window), was ~35% of choosing the top 10 of a million posts by a child.
    private struct Window<Payload> {
        typealias Item = (name: String, value: Node, payload: Payload)
        let limit: Int
        let reverse: Bool
        let start: (name: String, value: Node), end: (name: String, value: Node)
        let startInclusive: Bool, endInclusive: Bool
        /// A max-heap by direction order: its top is the last child still in the window.
        var heap: [Item] = []

        init(_ filter: LimitedFilter) {
            limit = filter.limit
            reverse = filter.reverse
            start = (filter.ranged.startPost.name, filter.index.indexedValue(filter.ranged.startPost.node))
            end = (filter.ranged.endPost.name, filter.index.indexedValue(filter.ranged.endPost.node))
            startInclusive = filter.ranged.startInclusive
            endInclusive = filter.ranged.endInclusive
            heap.reserveCapacity(min(limit, 1 << 16))
        }

        static func compare(_ a: (name: String, value: Node), _ b: (name: String, value: Node)) -> Int {
            let c = Node.compare(a.value, b.value)
            return c != 0 ? c : KeyOrder.compare(a.name, b.name)
        }

        func after(_ a: Item, _ b: Item) -> Bool {
            (reverse ? Self.compare((b.name, b.value), (a.name, a.value)) : Self.compare((a.name, a.value), (b.name, b.value))) > 0
        }

        mutating func offer(_ name: String, _ value: Node, _ payload: Payload) {
            let s = Self.compare(start, (name, value)), e = Self.compare((name, value), end)
            guard startInclusive ? s <= 0 : s < 0, endInclusive ? e <= 0 : e < 0 else { return }
            let item = (name: name, value: value, payload: payload)
            if heap.count < limit {
                heap.append(item)
                var i = heap.count - 1
                while i > 0, after(heap[i], heap[(i - 1) / 2]) {
                    heap.swapAt(i, (i - 1) / 2)
                    i = (i - 1) / 2
                }
            } else if after(heap[0], item) {
                heap[0] = item
                var i = 0
                while true {
                    let l = 2 * i + 1, r = l + 1
                    var top = i
                    if l < heap.count && after(heap[l], heap[top]) { top = l }
                    if r < heap.count && after(heap[r], heap[top]) { top = r }
                    if top == i { break }
                    heap.swapAt(i, top)
                    i = top
                }
            }
        }

        /// The window, in the query's direction.
        var chosen: [Item] { heap.sorted { after($1, $0) } }
    }

    func updatePriority(_ priority: Node, _ snap: IndexedNode) -> IndexedNode { snap }
}
