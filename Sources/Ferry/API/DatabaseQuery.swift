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
        database.addObserver(self, types: types, includeMetadataChanges: includeMetadataChanges, onEnd: onEnd, handler)
    }

    /// Removes one observer.
    /// Removes one observer. A sequence (``events(_:includeMetadataChanges:)``) or a
    /// single-event wait built on it ends.
    public func removeObserver(withHandle handle: ObserverHandle) {
        database.removeObserver(handle.id)
    }

    /// Removes every observer of this query (of a location: of every query at it). Sequences
    /// and single-event waits built on them end.
    public func removeAllObservers() {
        database.removeAllObservers(of: spec)
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
        try await database.setPin(p, keepSynced)
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

    /// The complete data for this query from an active view or the stored cache, or nil (see
    /// ``Database/cachedSnapshot(of:buildingIndex:readsOutsideTheLock:)``).
    func cachedSnapshot() throws -> DataSnapshot? { try database.cachedSnapshot(of: self) }
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
