/// What starts and stops server listens (the sync layer); a no-op without one.
protocol ListenProvider: AnyObject {
    func startListening(_ query: QuerySpec, tag: Int?)
    func stopListening(_ query: QuerySpec, tag: Int?)
}

/// Server data the database has stored, for views created later.
protocol ServerCacheSource: AnyObject {
    /// The stored server data for `query` (complete or partial).
    func serverCache(for query: QuerySpec) -> CacheNode
}

/// The heart of event generation: sync points (views) by location, the pending writes, and
/// the application of every local write, server update and acknowledgement to the views it
/// affects — descendants first, then the location, then ancestors — collecting the events.
final class SyncTree {
    private(set) var syncPoints = ImmutableTree<SyncPoint>.empty
    let writeTree: WriteTree

    init(writeTree: WriteTree = WriteTree()) { self.writeTree = writeTree }
    private var tagToQuery: [Int: QuerySpec] = [:]
    private var queryToTag: [QuerySpec: Int] = [:]
    private var nextTag = 1
    weak var listenProvider: (any ListenProvider)?
    weak var serverCacheSource: (any ServerCacheSource)?

    // MARK: Local writes

    func applyUserOverwrite(_ path: Path, _ node: Node, writeID: Int64, visible: Bool = true, ref: ValueRef? = nil) -> [Event] {
        writeTree.addOverwrite(path, node, writeID: writeID, visible: visible, ref: ref)
        guard visible else { return [] }
        return applyToSyncPoints(.overwrite(.user, path, node))
    }

    /// A visible set stored at `ref`; its node is made (by `node`) only if a view is at, above
    /// or below `path`.
    func applyUserOverwrite(_ path: Path, writeID: Int64, ref: ValueRef, empty: Bool, firstByte: UInt8?, node: () -> Node) -> [Event] {
        writeTree.addOverwrite(path, .empty, writeID: writeID, visible: true, ref: ref, empty: empty, firstByte: firstByte)
        guard hasSyncPoint(relatedTo: path) else { return [] }
        return applyToSyncPoints(.overwrite(.user, path, node()))
    }

    /// Whether a sync point is at, above or below `path` (an operation there can concern it).
    func hasSyncPoint(relatedTo path: Path) -> Bool {
        var tree = syncPoints
        for key in path.keys {
            if tree.value != nil { return true }
            guard let child = tree.children[key] else { return false }
            tree = child
        }
        return !tree.isEmpty
    }

    /// A visible update held in memory (a memory-only database's).
    func applyUserMerge(_ path: Path, _ children: CompoundWrite, writeID: Int64) -> [Event] {
        writeTree.addMerge(path, children, writeID: writeID)
        return applyToSyncPoints(.merge(.user, path, children))
    }

    /// A visible update whose values are stored (`stored`: each child). Its nodes are made (by
    /// `merge`) only if a view is at, above or below `path`.
    func applyUserMerge(_ path: Path, writeID: Int64, stored: [StoredChild], merge: () -> CompoundWrite) -> [Event] {
        writeTree.addMerge(path, writeID: writeID, stored: stored)
        guard hasSyncPoint(relatedTo: path) else { return [] }
        return applyToSyncPoints(.merge(.user, path, merge()))
    }

    /// A write acknowledged by the server (or rejected, with `revert`).
    func ackUserWrite(_ writeID: Int64, revert: Bool) -> [Event] {
        guard let write = writeTree.write(writeID) else { return [] }
        guard writeTree.removeWrite(writeID) else { return [] }
        var affected = ImmutableTree<Bool>.empty
        switch write.change {
        case .overwrite: affected = affected.setting(true, at: .root)
        case .merge(let m): m.forEachWrite { p, _ in affected = affected.setting(true, at: p) }
        }
        return applyToSyncPoints(.ackUserWrite(write.path, affected: affected, revert: revert))
    }

    /// The views' side of acknowledging a write at `path` that the write tree has already
    /// dropped: `affected` marks the locations (relative to `path`) it wrote.
    func applyAcknowledgement(at path: Path, affected: ImmutableTree<Bool>, revert: Bool) -> [Event] {
        applyToSyncPoints(.ackUserWrite(path, affected: affected, revert: revert))
    }

    func removeAllWrites() -> [Event] {
        let removed = writeTree.removeAllWrites()
        guard !removed.isEmpty else { return [] }
        return applyToSyncPoints(.ackUserWrite(.root, affected: ImmutableTree(true), revert: true))
    }

    // MARK: Server data

    func applyServerOverwrite(_ path: Path, _ node: Node) -> [Event] {
        applyToSyncPoints(.overwrite(.server, path, node))
    }

    func applyServerMerge(_ path: Path, _ children: CompoundWrite) -> [Event] {
        applyToSyncPoints(.merge(.server, path, children))
    }

    func applyListenComplete(_ path: Path) -> [Event] {
        applyToSyncPoints(.listenComplete(.server, path))
    }

    func applyTaggedOverwrite(_ path: Path, _ node: Node, tag: Int) -> [Event] {
        guard let query = tagToQuery[tag] else { return [] }  // the query is gone: ignore
        return applyTagged(.overwrite(.taggedServer(query.params), query.path.relative(to: path), node), at: query.path)
    }

    func applyTaggedMerge(_ path: Path, _ children: CompoundWrite, tag: Int) -> [Event] {
        guard let query = tagToQuery[tag] else { return [] }
        return applyTagged(.merge(.taggedServer(query.params), query.path.relative(to: path), children), at: query.path)
    }

    func applyTaggedListenComplete(_ path: Path, tag: Int) -> [Event] {
        guard let query = tagToQuery[tag] else { return [] }
        return applyTagged(.listenComplete(.taggedServer(query.params), query.path.relative(to: path)), at: query.path)
    }

    private func applyTagged(_ operation: Operation, at path: Path) -> [Event] {
        guard let syncPoint = syncPoints.value(at: path) else { return [] }
        return syncPoint.apply(operation, writes: WriteTreeRef(path: path, tree: writeTree), completeServerCache: nil)
    }

    func tag(for query: QuerySpec) -> Int? { queryToTag[query] }
    func query(forTag tag: Int) -> QuerySpec? { tagToQuery[tag] }

    // MARK: Registrations

    /// `prebuilt`: the query's view, built outside the lock from the data as it is (see
    /// ``canTakePrebuiltView(for:)``), used when no view for the query exists yet.
    func addEventRegistration(_ registration: EventRegistration, for query: QuerySpec, prebuilt: View? = nil) -> [Event] {
        var foundAncestorDefaultView = false
        syncPoints.forEachOnPath(query.path) { _, sp in
            foundAncestorDefaultView = foundAncestorDefaultView || sp.hasCompleteView
            return !foundAncestorDefaultView
        }
        let syncPoint: SyncPoint
        if let existing = syncPoints.value(at: query.path) {
            syncPoint = existing
        } else {
            syncPoint = SyncPoint()
            syncPoints = syncPoints.setting(syncPoint, at: query.path)
        }
        let viewExisted = syncPoint.view(for: query) != nil
        if !viewExisted && !query.loadsAllData {
            let tag = nextTag
            nextTag += 1
            queryToTag[query] = tag
            tagToQuery[tag] = query
        }
        let writes = WriteTreeRef(path: query.path, tree: writeTree)
        let events = prebuilt != nil && !viewExisted
            ? syncPoint.addRegistration(registration, view: prebuilt!)
            : syncPoint.addRegistration(registration, query: query, writes: writes, serverCache: serverCache(for: query))
        if !viewExisted && !foundAncestorDefaultView { setUpListener(query) }
        return events
    }

    /// Whether a view for `query` built from the stored data alone is the view this tree would
    /// make: no view at or above its location (whose caches it would take) and none for it yet.
    func canTakePrebuiltView(for query: QuerySpec) -> Bool {
        var any = false
        syncPoints.forEachOnPath(query.path) { _, sp in
            any = any || !sp.isEmpty
            return !any
        }
        return !any
    }

    /// Removes a registration (nil: every registration of the query). Returns nothing to raise;
    /// cancel events come with the sync layer.
    func removeEventRegistration(_ registration: EventRegistration?, for query: QuerySpec) {
        guard let syncPoint = syncPoints.value(at: query.path), query.isDefault || syncPoint.view(for: query) != nil else { return }
        let removed = syncPoint.removeRegistration(registration, query: query)
        if syncPoint.isEmpty { syncPoints = syncPoints.setting(nil, at: query.path) }
        let removingDefault = removed.contains { $0.loadsAllData }
        var covered = false
        syncPoints.forEachOnPath(query.path) { _, sp in
            covered = covered || sp.hasCompleteView
            return !covered
        }
        if removingDefault && !covered {
            // Listens below that this one shadowed need their own now.
            for view in collectDistinctViews(syncPoints.subtree(at: query.path)) {
                listenProvider?.startListening(queryForListening(view.query), tag: tag(for: view.query))
            }
        }
        if !covered && !removed.isEmpty {
            if removingDefault {
                listenProvider?.stopListening(queryForListening(query), tag: nil)
            } else {
                for q in removed { listenProvider?.stopListening(queryForListening(q), tag: queryToTag[q]) }
            }
        }
        for q in removed where !q.loadsAllData {
            if let tag = queryToTag.removeValue(forKey: q) { tagToQuery[tag] = nil }
        }
    }

    private func queryForListening(_ query: QuerySpec) -> QuerySpec {
        query.loadsAllData && !query.isDefault ? .defaultQuery(at: query.path) : query
    }

    private func setUpListener(_ query: QuerySpec) {
        let tag = queryToTag[query]
        listenProvider?.startListening(queryForListening(query), tag: tag)
        guard tag == nil else { return }
        // A default listen shadows the listens at and below it.
        let toStop = syncPoints.subtree(at: query.path).fold { (relative: Path, sp: SyncPoint?, children: [String: [QuerySpec]]) -> [QuerySpec] in
            if !relative.isEmpty, let sp, let complete = sp.completeView { return [complete.query] }
            var queries = sp?.queryViews.map(\.query) ?? []
            for key in children.keys.sorted() { queries += children[key]! }
            return queries
        }
        for q in toStop { listenProvider?.stopListening(queryForListening(q), tag: queryToTag[q]) }
    }

    private func collectDistinctViews(_ subtree: ImmutableTree<SyncPoint>) -> [View] {
        subtree.fold { (_: Path, sp: SyncPoint?, children: [String: [View]]) -> [View] in
            if let sp, let complete = sp.completeView { return [complete] }
            var views = sp?.queryViews ?? []
            for key in children.keys.sorted() { views += children[key]! }
            return views
        }
    }

    /// The server data a new view for `query` starts with: from a view at or above it, else
    /// from storage, else whatever complete children views below it have.
    private func serverCache(for query: QuerySpec) -> CacheNode {
        var found: Node?
        syncPoints.forEachOnPath(query.path) { spPath, sp in
            found = sp.completeServerCache(at: spPath.relative(to: query.path))
            return found == nil
        }
        if let found {
            return CacheNode(indexed: IndexedNode(found, index: query.index), isFullyInitialized: true, isFiltered: false)
        }
        let stored = serverCacheSource?.serverCache(for: query)
        if let stored, stored.isFullyInitialized { return stored }
        var node = Node.empty
        for key in syncPoints.subtree(at: query.path).sortedChildKeys {
            if let child = syncPoints.subtree(at: query.path).children[key]?.value, let complete = child.completeServerCache(at: .root) {
                node = node.updatingImmediateChild(key, complete)
            }
        }
        stored?.node.forEachChild { k, n in
            if !node.hasChild(k) { node = node.updatingImmediateChild(k, n) }
        }
        return CacheNode(indexed: IndexedNode(node, index: query.index), isFullyInitialized: false, isFiltered: false)
    }

    /// The complete data at `path` including hidden writes, except `excluding` (for transactions).
    func calcCompleteEventCache(_ path: Path, excluding: Set<Int64>? = nil) -> Node? {
        var serverCache: Node?
        syncPoints.forEachOnPath(path) { spPath, sp in
            serverCache = sp.completeServerCache(at: spPath.relative(to: path))
            return serverCache == nil
        }
        return writeTree.calcCompleteEventCache(path, completeServerCache: serverCache, excluding: excluding, includeHidden: true)
    }

    /// Whether a view that loads all data exists at or above `path` (the server keeps its data
    /// up to date there).
    func hasCompleteView(covering path: Path) -> Bool {
        var found = false
        syncPoints.forEachOnPath(path) { _, sp in
            found = found || sp.hasCompleteView
            return !found
        }
        return found
    }

    /// The view for a query, if one exists.
    func view(for query: QuerySpec) -> View? { syncPoints.value(at: query.path)?.view(for: query) }

    // MARK: Applying operations

    private func applyToSyncPoints(_ operation: Operation) -> [Event] {
        apply(operation, tree: syncPoints, serverCache: nil, writes: WriteTreeRef(path: .root, tree: writeTree))
    }

    private func apply(_ operation: Operation, tree: ImmutableTree<SyncPoint>, serverCache: Node?, writes: WriteTreeRef) -> [Event] {
        if operation.path.isEmpty { return applyToDescendants(operation, tree: tree, serverCache: serverCache, writes: writes) }
        let syncPoint = tree.value
        var cache = serverCache
        if cache == nil, let syncPoint { cache = syncPoint.completeServerCache(at: .root) }
        var events: [Event] = []
        let key = operation.path.front!
        if let childTree = tree.children[key], let childOperation = operation.forChild(key) {
            events += apply(childOperation, tree: childTree, serverCache: cache?.getImmediateChild(key), writes: writes.child(key))
        }
        if let syncPoint { events += syncPoint.apply(operation, writes: writes, completeServerCache: cache) }
        return events
    }

    private func applyToDescendants(_ operation: Operation, tree: ImmutableTree<SyncPoint>, serverCache: Node?, writes: WriteTreeRef) -> [Event] {
        let syncPoint = tree.value
        var cache = serverCache
        if cache == nil, let syncPoint { cache = syncPoint.completeServerCache(at: .root) }
        var events: [Event] = []
        for key in tree.sortedChildKeys {
            guard let childOperation = operation.forChild(key) else { continue }
            events += applyToDescendants(childOperation, tree: tree.children[key]!, serverCache: cache?.getImmediateChild(key), writes: writes.child(key))
        }
        if let syncPoint { events += syncPoint.apply(operation, writes: writes, completeServerCache: cache) }
        return events
    }
}
