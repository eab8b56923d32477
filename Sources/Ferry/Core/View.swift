/// One query's view at one location: its cached data, its registrations, and the events
/// each operation raises for them.
final class View {
    let query: QuerySpec
    let processor: ViewProcessor
    private(set) var viewCache: ViewCache
    private(set) var registrations: [EventRegistration] = []
    /// A limited view of an indexed location that holds its window only: each operation that
    /// reaches it reads the window again from the index (O(k log n) for k children of n),
    /// instead of keeping every child's server data to work the window out from. It holds no
    /// server data (``completeServerCache(for:)`` is nil), until the server sends the query's
    /// own data (tagged): from then on it is the server-filtered view Firebase makes.
    private(set) var storeBacked = false

    init(query: QuerySpec, initial: ViewCache) {
        self.query = query
        processor = ViewProcessor(filter: query.params.nodeFilter)
        viewCache = Self.caches(query, processor, initial, from: IndexedNode(.empty, index: query.index), accumulator: nil)
    }

    /// The caches a view of `query` keeps for `initial` (made by ``initial(_:writes:serverCache:)``):
    /// the server data indexed (filtering it waits for tagged data), the event data filtered
    /// from `old` on, its changes told to `accumulator`.
    private static func caches(_ query: QuerySpec, _ processor: ViewProcessor, _ initial: ViewCache, from old: IndexedNode,
                               accumulator: ChildChangeAccumulator?) -> ViewCache {
        let filter = processor.filter
        let server = filter.indexedFilter.updateFullNode(IndexedNode(.empty, index: query.index), IndexedNode(initial.serverCache.node, index: query.index), accumulator: nil)
        let event = filter.updateFullNode(old, IndexedNode(initial.eventCache.node, index: query.index), accumulator: accumulator)
        return ViewCache(
            eventCache: CacheNode(indexed: event, isFullyInitialized: initial.eventCache.isFullyInitialized, isFiltered: filter.filtersNodes),
            serverCache: CacheNode(indexed: server, isFullyInitialized: initial.serverCache.isFullyInitialized, isFiltered: filter.indexedFilter.filtersNodes))
    }

    /// What a new view of `query` starts from: `serverCache` and the writes over it (complete
    /// when either makes the data complete, else the complete children).
    static func initial(_ query: QuerySpec, writes: WriteTreeRef, serverCache: CacheNode) -> ViewCache {
        var eventCache = writes.calcCompleteEventCache(serverCache.isFullyInitialized ? serverCache.node : nil)
        var complete = true
        if eventCache == nil {
            eventCache = writes.calcCompleteEventChildren(serverCache.node)
            complete = false
        }
        return ViewCache(
            eventCache: CacheNode(indexed: IndexedNode(eventCache!, index: query.index), isFullyInitialized: complete, isFiltered: false),
            serverCache: serverCache)
    }

    /// A store-backed view (see ``storeBacked``) showing `window`, the query's window now.
    init(storeBacked query: QuerySpec, window: Node) {
        self.query = query
        processor = ViewProcessor(filter: query.params.nodeFilter)
        let indexed = IndexedNode(window, index: query.index)
        viewCache = ViewCache(eventCache: CacheNode(indexed: indexed, isFullyInitialized: true, isFiltered: true),
                              serverCache: CacheNode(indexed: IndexedNode(.empty, index: query.index), isFullyInitialized: false, isFiltered: true))
        storeBacked = true
    }

    var isEmpty: Bool { registrations.isEmpty }
    var serverCache: Node { viewCache.serverCache.node }
    var eventCache: CacheNode { viewCache.eventCache }

    /// The complete server data at `path` below this view, if the view has it.
    func completeServerCache(for path: Path) -> Node? {
        guard let cache = viewCache.completeServerSnap else { return nil }
        // A filtered view's cache is complete only for the children it holds.
        if query.loadsAllData || (!path.isEmpty && !cache.getImmediateChild(path.front!).isEmpty) {
            return cache.getChild(path)
        }
        return nil
    }

    func add(_ registration: EventRegistration) { registrations.append(registration) }

    /// Removes one registration (or all, when nil); returns those removed.
    @discardableResult
    func remove(_ registration: EventRegistration?) -> [EventRegistration] {
        guard let registration else {
            defer { registrations = [] }
            return registrations
        }
        let removed = registrations.filter { $0 === registration }
        registrations.removeAll { $0 === registration }
        return removed
    }

    func apply(_ operation: Operation, writes: WriteTreeRef, completeServerCache: Node?) -> (changes: [Change], events: [Event]) {
        if storeBacked, operation.source.tagged, operation.source.queryParams == query.params {
            // The server's data for this query: from here on the processor takes it, as for any
            // view (its first, a whole window, replaces the server data; anything else meets
            // the stored data first).
            if case .overwrite(_, let path, _) = operation, path.isEmpty {
                storeBacked = false
            } else {
                return finish(demote(writes))  // (the stored data holds this operation's data already)
            }
        }
        if storeBacked, let window = writes.tree.indexedChildren?.window(of: query) {
            return finish(rereadWindow(window))
        }
        if storeBacked { return finish(demote(writes)) }
        return finish(processor.apply(operation, to: viewCache, writes: writes, completeCache: completeServerCache))
    }

    private func finish(_ result: (ViewCache, [Change])) -> (changes: [Change], events: [Event]) {
        let (newCache, changes) = result
        precondition(newCache.serverCache.isFullyInitialized || !viewCache.serverCache.isFullyInitialized,
                     "a complete server cache never becomes incomplete")
        viewCache = newCache
        return (changes, EventGenerator.events(for: changes, eventCache: newCache.eventCache.indexed, registrations: registrations, query: query))
    }

    /// A store-backed view's caches after an operation: the window read again, and the changes
    /// from the old window to it (what the filter's full update finds).
    private func rereadWindow(_ window: Node) -> (ViewCache, [Change]) {
        let accumulator = ChildChangeAccumulator()
        let event = processor.filter.updateFullNode(viewCache.eventCache.indexed, IndexedNode(window, index: query.index), accumulator: accumulator)
        let new = viewCache.updatingEventSnap(event, complete: true, filtered: true)
        return (new, processor.maybeAddValue(old: viewCache, new: new, changes: accumulator.all))
    }

    /// A store-backed view whose index cannot answer (it needs a rebuild, cannot order a value,
    /// or the data is no longer complete) becomes a view like any other, once: its caches made
    /// from the stored data as a new view's are (O(n), under the lock), and the changes from its
    /// window to what they show.
    private func demote(_ writes: WriteTreeRef) -> (ViewCache, [Change]) {
        storeBacked = false
        guard let source = writes.tree.indexedChildren else { preconditionFailure("a store-backed view without its store") }
        let initial = Self.initial(query, writes: writes, serverCache: source.serverCache(for: query))
        let accumulator = ChildChangeAccumulator()
        let new = Self.caches(query, processor, initial, from: viewCache.eventCache.indexed, accumulator: accumulator)
        return (new, processor.maybeAddValue(old: viewCache, new: new, changes: accumulator.all))
    }

    /// The events a new registration gets at once: a child_added per child, and a value event
    /// when the data is complete.
    func initialEvents(for registration: EventRegistration) -> [Event] {
        let event = viewCache.eventCache
        // (Only a child_added listener gets one per child: a value listener of a million
        // children need not have a million changes made and dropped under the lock.)
        var changes = registration.responds(to: .childAdded) ? event.indexed.ordered.map { Change.added($0.name, $0.node) } : []
        if event.isFullyInitialized { changes.append(.value(event.node)) }
        return EventGenerator.events(for: changes, eventCache: event.indexed, registrations: [registration], query: query)
    }
}

/// The views at one location (usually one; a default view and some queries at most).
final class SyncPoint {
    private(set) var views: [(params: QueryParams, view: View)] = []

    var isEmpty: Bool { views.isEmpty }

    func view(for query: QuerySpec) -> View? { views.first { $0.params == query.params }?.view }

    /// A view that loads all data at this location, if there is one.
    var completeView: View? { views.first { $0.params.loadsAllData }?.view }
    var hasCompleteView: Bool { completeView != nil }
    /// Views of queries that filter.
    var queryViews: [View] { views.filter { !$0.params.loadsAllData }.map(\.view) }

    func apply(_ operation: Operation, writes: WriteTreeRef, completeServerCache: Node?) -> [Event] {
        if let params = operation.source.queryParams {
            guard let view = views.first(where: { $0.params == params })?.view else { return [] }
            var events = view.apply(operation, writes: writes, completeServerCache: completeServerCache).events
            // Another query's data is stored too: store-backed views here read it now.
            for (other, v) in views where other != params && v.storeBacked {
                events += v.apply(operation, writes: writes, completeServerCache: completeServerCache).events
            }
            return events
        }
        var events: [Event] = []
        for (_, view) in views { events += view.apply(operation, writes: writes, completeServerCache: completeServerCache).events }
        return events
    }

    /// The view for `query`, created from the writes and server cache when missing (not added).
    func makeView(_ query: QuerySpec, writes: WriteTreeRef, serverCache: CacheNode) -> View {
        if let existing = view(for: query) { return existing }
        return View(query: query, initial: View.initial(query, writes: writes, serverCache: serverCache))
    }

    func addRegistration(_ registration: EventRegistration, query: QuerySpec, writes: WriteTreeRef, serverCache: CacheNode) -> [Event] {
        let view: View
        if let existing = self.view(for: query) {
            view = existing
        } else {
            view = makeView(query, writes: writes, serverCache: serverCache)
            views.append((query.params, view))
        }
        view.add(registration)
        return view.initialEvents(for: registration)
    }

    /// Adds a registration with a view built elsewhere (outside the lock) for its query.
    func addRegistration(_ registration: EventRegistration, view: View) -> [Event] {
        precondition(self.view(for: view.query) == nil, "a prebuilt view only where none is")
        views.append((view.query.params, view))
        view.add(registration)
        return view.initialEvents(for: registration)
    }

    /// Removes a registration (from every view when the query is the default one, as removing
    /// an observer by handle does). Returns the queries whose views went away.
    func removeRegistration(_ registration: EventRegistration?, query: QuerySpec) -> [QuerySpec] {
        var removedQueries: [QuerySpec] = []
        let hadCompleteView = hasCompleteView
        for (params, view) in views where query.isDefault || params == query.params {
            view.remove(registration)
            if view.isEmpty {
                views.removeAll { $0.params == params }
                if !view.query.loadsAllData { removedQueries.append(view.query) }
            }
        }
        if hadCompleteView && !hasCompleteView { removedQueries.append(.defaultQuery(at: query.path)) }
        return removedQueries
    }

    func completeServerCache(at path: Path) -> Node? {
        for (_, view) in views { if let c = view.completeServerCache(for: path) { return c } }
        return nil
    }
}
