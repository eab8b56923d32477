import Foundation
import FerryLog
import Synchronization

/// A query: a location with an order, a range and a limit. Built from a
/// ``DatabaseReference`` and observed or read like one; the rules are the Realtime Database's
/// (one order, one start, one end, one limit; `queryEqual` is a start and an end).
public struct DatabaseQuery: Sendable, Hashable, CustomStringConvertible {
    /// The database the query reads.
    public let database: Database
    /// The location queried.
    public let path: Path
    let params: QueryParams
    var orderSet = false

    init(database: Database, path: Path, params: QueryParams = .default) {
        self.database = database
        self.path = path
        self.params = params
    }

    var spec: QuerySpec { QuerySpec(path: path, params: params) }

    /// The location.
    public var ref: DatabaseReference { DatabaseReference(database: database, path: path) }

    public var description: String { "\(path) \(params)" }

    public static func == (a: DatabaseQuery, b: DatabaseQuery) -> Bool { a.database === b.database && a.spec == b.spec }
    public func hash(into h: inout Hasher) { h.combine(spec) }

    // MARK: Order

    private func ordered(_ index: QueryIndex) throws -> DatabaseQuery {
        if orderSet { throw DatabaseError(.invalidQuery, "a query can have only one order") }
        var q = self
        q.orderSet = true
        var p = params
        p.index = index
        q = DatabaseQuery(database: database, path: path, params: p)
        q.orderSet = true
        try q.checkBounds()
        return q
    }

    /// Children ordered by the value at `childPath` (then by key).
    public func queryOrdered(byChild childPath: String) throws -> DatabaseQuery {
        let p = try Path(validating: childPath)
        if p.isEmpty || ["$key", "$value", "$priority"].contains(childPath) || p.keys.contains(".priority") {
            throw DatabaseError(.invalidQuery, "\"\(childPath)\" cannot be ordered by; use queryOrderedByKey, ByValue or ByPriority")
        }
        return try ordered(.child(p))
    }

    /// Children ordered by key (integer keys first, numerically).
    public func queryOrderedByKey() throws -> DatabaseQuery { try ordered(.key) }
    /// Children ordered by value: null < false < true < numbers < strings < objects.
    public func queryOrderedByValue() throws -> DatabaseQuery { try ordered(.value) }
    /// Children ordered by priority (the default order, made explicit).
    public func queryOrderedByPriority() throws -> DatabaseQuery { try ordered(.priority) }

    // MARK: Range

    private func bound(_ value: Value, _ key: String?) throws -> (Node, String?) {
        if let key { try Path.validate(key: key) }
        switch params.index {
        case .key:
            guard case .string = value else { throw DatabaseError(.invalidQuery, "with queryOrderedByKey, range values must be strings (keys)") }
            guard key == nil else { throw DatabaseError(.invalidQuery, "with queryOrderedByKey, a range takes no child key") }
            return (try Node(value), nil)
        case .priority:
            return (try Node.priorityNode(value, at: path), key)
        default:
            if case .object = value { throw DatabaseError(.invalidQuery, "range values must be null, booleans, numbers or strings") }
            if case .array = value { throw DatabaseError(.invalidQuery, "range values must be null, booleans, numbers or strings") }
            return (try Node(value), key)
        }
    }

    private func withParams(_ change: (inout QueryParams) throws -> Void) throws -> DatabaseQuery {
        var p = params
        try change(&p)
        var q = DatabaseQuery(database: database, path: path, params: p)
        q.orderSet = orderSet
        try q.checkBounds()
        return q
    }

    private func checkBounds() throws {
        if params.index == .key {
            for (set, node) in [(params.startSet, params.startValue), (params.endSet, params.endValue)] where set {
                if case .string? = node.leafValue { continue }
                throw DatabaseError(.invalidQuery, "with queryOrderedByKey, range values must be strings (keys)")
            }
        }
    }

    /// Children from `value` (and, at that value, from `childKey`) on.
    public func queryStarting(atValue value: Value, childKey: String? = nil) throws -> DatabaseQuery {
        if params.startSet { throw DatabaseError(.invalidQuery, "a query can have only one start (queryStarting or queryEqual)") }
        let (node, key) = try bound(value, childKey)
        return try withParams { p in
            p.startSet = true
            p.startValue = node
            p.startName = key
        }
    }

    /// Children after `value` (and, at that value, after `childKey`).
    public func queryStarting(afterValue value: Value, childKey: String? = nil) throws -> DatabaseQuery {
        if params.startSet { throw DatabaseError(.invalidQuery, "a query can have only one start (queryStarting or queryEqual)") }
        let (node, key) = try bound(value, childKey)
        return try withParams { p in
            p.startSet = true
            p.startValue = node
            p.startAfter = true
            p.startName = key ?? (p.index == .key ? nil : KeyOrder.maxName)
        }
    }

    /// Children up to `value` (and, at that value, up to `childKey`).
    public func queryEnding(atValue value: Value, childKey: String? = nil) throws -> DatabaseQuery {
        if params.endSet { throw DatabaseError(.invalidQuery, "a query can have only one end (queryEnding or queryEqual)") }
        let (node, key) = try bound(value, childKey)
        return try withParams { p in
            p.endSet = true
            p.endValue = node
            p.endName = key
        }
    }

    /// Children before `value` (and, at that value, before `childKey`).
    public func queryEnding(beforeValue value: Value, childKey: String? = nil) throws -> DatabaseQuery {
        if params.endSet { throw DatabaseError(.invalidQuery, "a query can have only one end (queryEnding or queryEqual)") }
        let (node, key) = try bound(value, childKey)
        return try withParams { p in
            p.endSet = true
            p.endValue = node
            p.endBefore = true
            p.endName = key ?? (p.index == .key ? nil : KeyOrder.minName)
        }
    }

    /// Children equal to `value` (and, given one, with key `childKey`).
    public func queryEqual(toValue value: Value, childKey: String? = nil) throws -> DatabaseQuery {
        if params.startSet || params.endSet { throw DatabaseError(.invalidQuery, "queryEqual cannot be combined with queryStarting or queryEnding") }
        let (node, key) = try bound(value, childKey)
        return try withParams { p in
            p.startSet = true
            p.startValue = node
            p.startName = key
            p.endSet = true
            p.endValue = node
            p.endName = key
        }
    }

    // MARK: Limit

    /// The first `n` children in the order.
    public func queryLimited(toFirst n: Int) throws -> DatabaseQuery { try limited(n, fromLeft: true) }
    /// The last `n` children in the order.
    public func queryLimited(toLast n: Int) throws -> DatabaseQuery { try limited(n, fromLeft: false) }

    private func limited(_ n: Int, fromLeft: Bool) throws -> DatabaseQuery {
        guard n > 0 else { throw DatabaseError(.invalidQuery, "a limit must be positive (got \(n))") }
        if params.limit != nil { throw DatabaseError(.invalidQuery, "a query can have only one limit") }
        return try withParams { p in
            p.limit = n
            p.viewFromLeft = fromLeft
        }
    }

    // MARK: Listening

    /// Calls `handler` for each event of `type` (once at once with the current data, then on
    /// every change — local writes fire it before the server sees them). For child events the
    /// second argument is the key of the previous sibling in the query's order.
    ///
    /// Handlers are called in order, one at a time: on ``DatabaseOptions/callbackQueue`` if
    /// set, else on the thread that raised the events. A `value` event fires only when the
    /// data is complete (cached from the server, or written locally in full).
    ///
    /// - Parameter includeMetadataChanges: also call `handler` (value events only) when only
    ///   the snapshot's ``SnapshotMetadata`` changed.
    @discardableResult
    public func observe(_ type: DataEventType, includeMetadataChanges: Bool = false,
                        andPreviousSiblingKeyWith handler: @escaping @Sendable (DataSnapshot, String?) -> Void) -> ObserverHandle {
        observe(types: [type], includeMetadataChanges: includeMetadataChanges) { event in
            handler(event.snapshot, event.previousSiblingKey)
        }
    }

    /// Calls `handler` for each event of `type` (see ``observe(_:includeMetadataChanges:andPreviousSiblingKeyWith:)``).
    @discardableResult
    public func observe(_ type: DataEventType, includeMetadataChanges: Bool = false,
                        with handler: @escaping @Sendable (DataSnapshot) -> Void) -> ObserverHandle {
        observe(types: [type], includeMetadataChanges: includeMetadataChanges) { handler($0.snapshot) }
    }

    func observe(types: Set<DataEventType>, includeMetadataChanges: Bool,
                 onEnd: (@Sendable (DatabaseError?) -> Void)? = nil,
                 _ handler: @escaping @Sendable (DataEvent) -> Void) -> ObserverHandle {
        let db = database
        let query = spec
        let id = database.engine.withLock { e -> UInt64 in
            defer { e.nextRegistrationID += 1 }
            return e.nextRegistrationID
        }
        let registration = EventRegistration(id: id, types: types, includeMetadataChanges: includeMetadataChanges) { event, metadata in
            handler(DataEvent(event, metadata: metadata, database: db))
        }
        // A limited view over an indexed location finds the child after its window from the
        // index: built first, outside the lock, if it must be (a failure to read stops the
        // database, which then refuses the registration below). A big location no declared
        // index orders gets one made for its listeners (DatabaseOptions.automaticIndexes).
        let automatic = !database.options.automaticIndexes ? nil : database.engine.withLock { e in
            e.stopReason == nil ? e.addAutomaticIndex(for: query) : nil
        }
        try? buildIndexIfNeeded()
        // A big location's view is built outside the lock (from frozen data), so that writes
        // from other tasks do not wait for it; it is installed if nothing changed meanwhile.
        let prepared = database.engine.withLock { e -> (FrozenData, LocationWatch)? in
            guard e.stopReason == nil, e.syncTree.canTakePrebuiltView(for: query), e.isBig(query.path),
                  e.currentIndex(for: query) == nil,  // (else the view is its window alone)
                  let frozen = e.freeze(onFailure: { _ in }) else { return nil }
            return (frozen, e.watch(query.path))
        }
        let prebuilt = prepared.flatMap { View.prebuilt(query, from: $0.0) }
        var refused: DatabaseError?
        database.raise { e in
            defer { if let automatic { e.listenerArrived(automatic) } }  // (registered, or refused)
            if let reason = e.stopReason {
                refused = reason
                return []
            }
            if let watch = prepared?.1 { e.unwatch(watch) }
            e.registrations[id] = RegistrationState(registration: registration, query: query, lastMetadata: nil, onEnd: onEnd)
            var view = prebuilt != nil && prepared?.1.changed == false && e.syncTree.canTakePrebuiltView(for: query) ? prebuilt : nil
            if view == nil, e.syncTree.canTakePrebuiltView(for: query), let window = e.window(of: query) {
                view = View(storeBacked: query, window: window)
            }
            return e.syncTree.addEventRegistration(registration, for: query, prebuilt: view)
        }
        if let refused { onEnd?(refused) }  // closed or failed already: end at once
        return ObserverHandle(id: id)
    }

    /// Removes one observer.
    /// Removes one observer. A sequence (``events(_:includeMetadataChanges:)``) or a
    /// single-event wait built on it ends.
    public func removeObserver(withHandle handle: ObserverHandle) {
        let end = database.engine.withLock { e -> (@Sendable (DatabaseError?) -> Void)? in
            guard let state = e.registrations.removeValue(forKey: handle.id) else { return nil }
            e.syncTree.removeEventRegistration(state.registration, for: state.query)
            e.dropUnusedAutomaticIndexes()
            return state.onEnd
        }
        end?(nil)  // outside the lock: a stream's end removes its observer again (a no-op now)
    }

    /// Removes every observer of this query (of a location: of every query at it). Sequences
    /// and single-event waits built on them end.
    public func removeAllObservers() {
        let query = spec
        let ends = database.engine.withLock { e -> [@Sendable (DatabaseError?) -> Void] in
            let removed = e.registrations.filter { query.isDefault ? $0.value.query.path == query.path : $0.value.query == query }
            for (id, _) in removed { e.registrations[id] = nil }
            e.syncTree.removeEventRegistration(nil, for: query)
            e.dropUnusedAutomaticIndexes()
            return removed.values.compactMap(\.onEnd)
        }
        for end in ends { end(nil) }
    }

    /// Pins (`true`) or unpins the data here: while pinned, the cache size limit never evicts
    /// it (as data under an active listener). Unlike Firebase, which keeps pins in memory, the
    /// pin is a record in the log: it holds across restarts until cleared. A query pins its
    /// location's data. Durable when it returns (per ``DatabaseOptions/durability``); pinning
    /// twice is one pin.
    ///
    /// - Throws: ``DatabaseError/Code/closed`` or ``DatabaseError/Code/storage``.
    public func keepSynced(_ keepSynced: Bool) async throws {
        let p = path
        _ = try await database.perform { e in (try e.setPin(p, keepSynced), []) }
    }

    /// The events of `type` as an `AsyncSequence`. The observer is removed when the iterating
    /// task is cancelled or stops iterating (the sequence then ends); the sequence ends when the
    /// observer is removed otherwise (``removeAllObservers()``), and ends by throwing when the
    /// database closes (``DatabaseError/Code/closed``) or fails (its error).
    ///
    /// It does not end by itself otherwise: offline, a location that is not complete in the
    /// cache yields no `value` event until data arrives — iterate it in a task you can cancel.
    public func events(_ type: DataEventType = .value, includeMetadataChanges: Bool = false) -> AsyncThrowingStream<DataEvent, any Error> {
        AsyncThrowingStream { continuation in
            let handle = observe(types: [type], includeMetadataChanges: includeMetadataChanges,
                                 onEnd: { continuation.finish(throwing: $0) }) { continuation.yield($0) }
            let q = self
            continuation.onTermination = { _ in q.removeObserver(withHandle: handle) }
        }
    }

    /// The values as an `AsyncSequence` of snapshots (value events); it ends as ``events(_:includeMetadataChanges:)`` does.
    public func values(includeMetadataChanges: Bool = false) -> AsyncThrowingMapSequence<AsyncThrowingStream<DataEvent, any Error>, DataSnapshot> {
        events(.value, includeMetadataChanges: includeMetadataChanges).map(\.snapshot)
    }

    // MARK: Reading once

    /// The data now: from the server when online, else from the cache.
    ///
    /// - Throws: ``DatabaseError/Code/notCached`` when the data is neither available from a
    ///   server nor complete in the local cache; ``DatabaseError/Code/storage`` naming the record,
    ///   segment and offset when stored data cannot be read; ``DatabaseError/Code/closed``.
    public func getData() async throws -> DataSnapshot {
        if let snapshot = try cachedSnapshot() { return snapshot }
        throw DatabaseError(.notCached,
            "the data at \(path)\(params.isDefault ? "" : " (\(params))") is neither available from a server (there is no connection) nor complete in the local cache")
    }

    /// The first event of `type`: for `value`, from the cache at once when the data is complete
    /// there, else when it arrives.
    ///
    /// - Throws: ``DatabaseError/Code/closed`` when the database closes first (or is closed) or
    ///   the observers here are removed (``removeAllObservers()``), the database's error when it
    ///   fails, `CancellationError` when the task is cancelled.
    public func observeSingleEvent(of type: DataEventType = .value) async throws -> DataSnapshot {
        if type == .value, let cached = try cachedSnapshot() { return cached }
        for try await event in events(type) { return event.snapshot }
        try Task.checkCancellation()
        throw DatabaseError(.closed, "the observer was removed before an event of type \(type) at \(path)")
    }

    /// The complete data for this query from an active view or the stored cache, or nil.
    ///
    /// A big location with no view is not read under the lock: the lock is held only to
    /// freeze the indexes (``FrozenData``), and the snapshot reads its children from them, and
    /// from the log's files, as it is used. A limited query a child-value index orders
    /// (``DatabaseOptions/indexes``) reads its window alone: its keys from the index, their
    /// data, under the lock (the index is first built outside it when it must be).
    func cachedSnapshot(buildingIndex: Bool = true, readsOutsideTheLock: Bool = true) throws -> DataSnapshot? {
        enum Found {
            case node(Node)
            case frozen(FrozenData)
            case small(FrozenData)
        }
        let query = spec
        let database = database
        if buildingIndex { try buildIndexIfNeeded() }
        let onFailure = Self.onReadFailure(database)
        let result = try database.engine.withLock { e -> (Found, SnapshotMetadata)? in
            try e.checkUsable()
            if let view = e.syncTree.view(for: query), view.eventCache.isFullyInitialized {
                return (.node(view.eventCache.node), e.metadata(for: query))
            }
            if let window = e.window(of: query) {  // (a current index orders the query: its window alone)
                return (.node(window), e.metadata(for: query))
            }
            if e.isBig(query.path), let frozen = e.freeze(onFailure: onFailure) {
                return (.frozen(frozen), e.metadata(for: query))
            }
            if readsOutsideTheLock && e.log != nil {
                // Small data is read outside the lock too (stored values decoded there).
                return (.small(e.freezeForOneRead(onFailure: onFailure)), e.metadata(for: query))
            }
            guard let node = e.visibleNode(at: query.path) else { return nil }
            if query.loadsAllData { return (.node(node), e.metadata(for: query)) }
            return (.node(query.params.filtered(node)), e.metadata(for: query))
        }
        // A stored value that could not be read shows as missing: that is an error, not data.
        if let failure = database.engine.withLock({ $0.failure }) {
            database.endObserversIfStopped()
            throw failure
        }
        guard let (found, metadata) = result else { return nil }
        // A value read outside the lock could not be read: the database stops now (as when a
        // read under the lock fails), before this call throws.
        func failed(_ e: DatabaseError) -> DatabaseError {
            database.engine.withLock { $0.failReading(e) }
            database.endObserversIfStopped()
            return e
        }
        switch found {
        case .node(let node):
            return DataSnapshot(ref: ref, node: node, index: params.index, metadata: metadata)
        case .small(let frozen):
            let node = frozen.visibleNode(at: query.path)
            if frozen.reader.stale { return try cachedSnapshot(buildingIndex: buildingIndex, readsOutsideTheLock: false) }
            if let failure = frozen.reader.error { throw failed(failure) }
            guard let node else { return nil }
            return DataSnapshot(ref: ref, node: query.loadsAllData ? node : query.params.filtered(node), index: params.index, metadata: metadata)
        case .frozen(let frozen):
            guard let location = LazyLocation.make(frozen, at: query.path) else { return nil }
            if query.loadsAllData {
                if let failure = frozen.reader.error { throw failed(failure) }
                return DataSnapshot(ref: ref, content: .lazy(location), index: params.index, metadata: metadata)
            }
            let filtered = location.filtered(by: query.params)
            if let failure = frozen.reader.error { throw failed(failure) }
            return DataSnapshot(ref: ref, node: filtered, index: params.index, metadata: metadata)
        }
    }
}

extension DatabaseQuery {
    /// A read failure found outside the lock, told asynchronously (a frozen read may run under
    /// the lock, finishing an index rebuild).
    static func onReadFailure(_ database: Database) -> @Sendable (DatabaseError) -> Void {
        { e in DispatchQueue.global().async { database.engine.withLock { $0.failReading(e) } } }
    }

    /// Builds the child-value index that orders this query (``DatabaseOptions/indexes``) when
    /// it must be built, outside the lock from frozen data; it is installed unless the data
    /// changed at or above its location meanwhile (then the query reads without it).
    func buildIndexIfNeeded() throws {
        let query = spec
        let onFailure = Self.onReadFailure(database)
        let job = database.engine.withLock { e -> (ChildValueIndex, UInt64, FrozenData)? in
            guard e.stopReason == nil, let index = e.childIndex(for: query), e.isComplete(query.path) else { return nil }
            index.refresh()
            guard index.needsRebuild, !index.isRebuilding, let frozen = e.freeze(onFailure: onFailure) else { return nil }
            return (index, index.beginRebuild(), frozen)
        }
        guard let (index, token, frozen) = job else { return }
        try database.build(index, token: token, from: frozen)
    }
}

extension Database {
    /// Builds `index` (its rebuild begun under the lock, `token` its token) from `frozen`,
    /// outside the lock, and installs it unless a reset meanwhile (a change at or above its
    /// location) made it stale or the database stopped. A stale build is thrown away, and the
    /// index is built again if a listener uses it.
    func build(_ index: ChildValueIndex, token: UInt64, from frozen: FrozenData) throws {
        let built = ChildValueIndex.build(frozen, location: index.location, child: index.child)
        if let failure = frozen.reader.error {
            engine.withLock { e in
                index.cancelRebuild(token)
                e.failReading(failure)
            }
            endObserversIfStopped()
            throw failure
        }
        let again = engine.withLock { e -> Bool in
            guard e.stopReason == nil, let built else {
                index.cancelRebuild(token)
                return false
            }
            if index.finishRebuild(built.0, usable: built.usable, frozen: frozen, token: token) { return false }
            return e.takeIndexRebuildsDue()  // (stale: the reset's rebuild waited for this one)
        }
        if again { scheduleIndexRebuilds() }
    }

    /// Builds again, outside the lock, the indexes listeners use that an operation left
    /// needing it (``Engine/takeIndexRebuildsDue()``): else each of their window changes
    /// would look for the next child among all children, under the lock.
    func rebuildListenedIndexes() {
        let onFailure = DatabaseQuery.onReadFailure(self)
        let job = engine.withLock { e -> ([(ChildValueIndex, UInt64)], FrozenData)? in
            let due = e.childIndexes.filter(\.rebuildScheduled)
            for index in due { index.rebuildScheduled = false }
            guard e.stopReason == nil else { return nil }
            let ready = due.filter { $0.needsRebuild && !$0.isRebuilding && e.isComplete($0.location) }
            guard !ready.isEmpty else { return nil }
            guard let frozen = e.freeze(onFailure: onFailure) else {
                // (No read snapshot now, e.g. no file descriptors: not asked again until the
                // listeners change or a query builds it.)
                for index in ready { index.idleAt = e.registrationsVersion }
                return nil
            }
            e.backgroundIndexRebuilds += ready.count
            return (ready.map { ($0, $0.beginRebuild()) }, frozen)
        }
        guard let (indexes, frozen) = job else { return }
        for (i, (index, token)) in indexes.enumerated() {
            do { try build(index, token: token, from: frozen) } catch {
                engine.withLock { _ in for (later, token) in indexes[(i + 1)...] { later.cancelRebuild(token) } }
                return
            }
        }
    }

    /// Schedules ``rebuildListenedIndexes()`` on a thread outside Swift's cooperative pool (it
    /// reads the log).
    func scheduleIndexRebuilds() {
        DispatchQueue.global().async { [weak self] in self?.rebuildListenedIndexes() }
    }
}

/// Fires once, however often it is asked; runs the action given to `onFired` after it has.
final class OneShot: Sendable {
    private let state = FerryMutex<(fired: Bool, action: (@Sendable () -> Void)?)>((false, nil))

    /// True the first time.
    func fire() -> Bool {
        let (first, action) = state.withLock { s -> (Bool, (@Sendable () -> Void)?) in
            if s.fired { return (false, nil) }
            s.fired = true
            return (true, s.action)
        }
        if let action { DispatchQueue.global().async(execute: action) }
        return first
    }

    func onFired(_ a: @escaping @Sendable () -> Void) {
        let now = state.withLock { s -> Bool in
            if s.fired { return true }
            s.action = a
            return false
        }
        if now { DispatchQueue.global().async(execute: a) }
    }
}

extension DataEvent {
    init(_ event: Event, metadata: SnapshotMetadata, database: Database) {
        let ref = DatabaseReference(database: database, path: event.path)
        if event.type == .value {
            snapshot = DataSnapshot(ref: ref, node: event.eventCache.node, index: event.query.index, metadata: metadata)
        } else {
            snapshot = DataSnapshot(ref: ref, node: event.change.node, metadata: metadata)
        }
        type = event.type
        previousSiblingKey = event.change.prevName
    }
}
