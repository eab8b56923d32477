/// A namespace's streams by id, and by location: a write finds the streams it concerns — at,
/// above or below its location — without visiting every stream of the namespace.
struct StreamIndex: Sequence {
    private var byID: [Int: StreamSink] = [:]
    private var root = Node()
    /// The streams of each client that said which it is.
    private var byClient: [String: Set<Int>] = [:]

    private struct Node {
        var here: Set<Int> = []
        var children: [String: Node] = [:]
        var isEmpty: Bool { here.isEmpty && children.isEmpty }
    }

    subscript(id: Int) -> StreamSink? {
        get { byID[id] }
        set {
            if let old = byID[id] {
                Self.remove(id, old.keys[...], from: &root)
                if let c = old.client {
                    byClient[c]?.remove(id)
                    if byClient[c]?.isEmpty == true { byClient[c] = nil }
                }
            }
            byID[id] = newValue
            if let sink = newValue {
                Self.insert(id, sink.keys[...], into: &root)
                if let c = sink.client { byClient[c, default: []].insert(id) }
            }
        }
    }

    @discardableResult
    mutating func removeValue(forKey id: Int) -> StreamSink? {
        let old = byID[id]
        self[id] = nil
        return old
    }

    mutating func removeAll() { self = StreamIndex() }

    func makeIterator() -> Dictionary<Int, StreamSink>.Iterator { byID.makeIterator() }

    /// The streams of `client`.
    func of(client: String) -> [StreamSink] {
        (byClient[client] ?? []).compactMap { byID[$0] }
    }

    /// The streams at, above or below `keys`.
    func related(to keys: [String]) -> [StreamSink] {
        var ids: [Int] = []
        var node = root
        ids += node.here  // the root's streams are above everything
        var found = true
        for k in keys {
            guard let child = node.children[k] else { found = false; break }
            node = child
            ids += node.here
        }
        if found {
            // Below `keys` (its own streams were counted on the way down).
            for (_, child) in node.children { Self.collect(child, into: &ids) }
        }
        return ids.compactMap { byID[$0] }
    }

    private static func collect(_ node: Node, into ids: inout [Int]) {
        ids += node.here
        for (_, child) in node.children { collect(child, into: &ids) }
    }

    private static func insert(_ id: Int, _ keys: ArraySlice<String>, into node: inout Node) {
        guard let first = keys.first else {
            node.here.insert(id)
            return
        }
        insert(id, keys.dropFirst(), into: &node.children[first, default: Node()])
    }

    private static func remove(_ id: Int, _ keys: ArraySlice<String>, from node: inout Node) {
        guard let first = keys.first else {
            node.here.remove(id)
            return
        }
        guard node.children[first] != nil else { return }
        remove(id, keys.dropFirst(), from: &node.children[first]!)
        if node.children[first]!.isEmpty { node.children[first] = nil }
    }
}
