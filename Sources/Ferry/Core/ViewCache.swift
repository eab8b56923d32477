/// A view's cached node, with whether it is complete and whether the query filtered it.
struct CacheNode: Sendable {
    var indexed: IndexedNode
    var isFullyInitialized: Bool
    var isFiltered: Bool

    var node: Node { indexed.node }

    func isComplete(forPath path: Path) -> Bool {
        guard let front = path.front else { return isFullyInitialized && !isFiltered }
        return isComplete(forChild: front)
    }

    func isComplete(forChild key: String) -> Bool {
        (isFullyInitialized && !isFiltered) || node.hasChild(key)
    }
}

/// What a view caches: the server's data (as far as known) and what the user sees (the event
/// cache: server data with local writes on top, filtered by the query).
struct ViewCache: Sendable {
    var eventCache: CacheNode
    var serverCache: CacheNode

    func updatingEventSnap(_ indexed: IndexedNode, complete: Bool, filtered: Bool) -> ViewCache {
        ViewCache(eventCache: CacheNode(indexed: indexed, isFullyInitialized: complete, isFiltered: filtered), serverCache: serverCache)
    }

    func updatingServerSnap(_ indexed: IndexedNode, complete: Bool, filtered: Bool) -> ViewCache {
        ViewCache(eventCache: eventCache, serverCache: CacheNode(indexed: indexed, isFullyInitialized: complete, isFiltered: filtered))
    }

    var completeEventSnap: Node? { eventCache.isFullyInitialized ? eventCache.node : nil }
    var completeServerSnap: Node? { serverCache.isFullyInitialized ? serverCache.node : nil }
}

/// Complete children from the write tree, the view's caches and any complete server data.
struct WriteTreeCompleteChildSource: CompleteChildSource {
    let writes: WriteTreeRef
    let viewCache: ViewCache
    let completeServerCache: Node?

    func completeChild(_ key: String) -> Node? {
        let event = viewCache.eventCache
        if event.isComplete(forChild: key) { return event.node.getImmediateChild(key) }
        let server: CacheNode
        if let completeServerCache {
            server = CacheNode(indexed: IndexedNode(completeServerCache, index: .key), isFullyInitialized: true, isFiltered: false)
        } else {
            server = viewCache.serverCache
        }
        return writes.calcCompleteChild(key, serverCache: server)
    }

    func child(after post: NamedNode, index: QueryIndex, reverse: Bool) -> NamedNode? {
        // Over complete, unfiltered server data the next child is the next in the visible data,
        // which an index over it finds in O(log n) (the pass below is O(n)). Over a filtered
        // cache (a window the server sent) it must come from the window: no index then.
        if completeServerCache != nil || (viewCache.serverCache.isFullyInitialized && !viewCache.serverCache.isFiltered),
           let found = writes.indexedChild(after: post, index: index, reverse: reverse) {
            return found
        }
        return writes.calcNextNode(after: post, completeServerData: completeServerCache ?? viewCache.completeServerSnap, reverse: reverse, index: index)
    }
}
