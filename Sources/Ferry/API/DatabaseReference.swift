import FerryLog

/// A location in a ``Database``: read it, write it, listen to it, query below it.
public struct DatabaseReference: Sendable, Hashable, CustomStringConvertible {
    /// The database this location belongs to.
    public let database: Database
    /// The location, from the root.
    public let path: Path

    init(database: Database, path: Path) {
        self.database = database
        self.path = path
    }

    /// The last key of the path; nil for the root.
    public var key: String? { path.back }
    /// The location above; nil for the root.
    public var parent: DatabaseReference? { path.parent.map { DatabaseReference(database: database, path: $0) } }
    /// The database's root location.
    public var root: DatabaseReference { database.root }
    /// This location as a query (all children, in the default order).
    public var query: DatabaseQuery { DatabaseQuery(database: database, path: path) }
    public var description: String { path.description }

    /// The location at a relative path (like `"posts/p1/title"`).
    /// - Throws: ``DatabaseError/Code/invalidPath`` naming the key and the rule, or the depth.
    public func child(_ relativePath: String) throws -> DatabaseReference {
        let p = path.child(try Path(validating: relativePath))
        try p.validate()
        return DatabaseReference(database: database, path: p)
    }

    func childUnchecked(_ relative: Path) -> DatabaseReference { DatabaseReference(database: database, path: path.child(relative)) }

    /// A new child with a Firebase-compatible push id: 20 characters, chronologically ordered,
    /// increasing within one millisecond.
    public func childByAutoId() -> DatabaseReference {
        DatabaseReference(database: database, path: path.child(database.nextPushID()))
    }

    // MARK: Writing

    /// Replaces the data here (null removes it). Local listeners fire at once; the call returns
    /// once the write is durable per ``DatabaseOptions/durability`` and its events have fired.
    ///
    /// - Returns: a receipt to await the server's acknowledgement with.
    /// - Throws: ``DatabaseError/Code/invalidData`` (a bad key, NaN, a misplaced `.priority`, a
    ///   value whose keys lie deeper than 32 levels below the root, counting this path's keys,
    ///   a write over 16 MB), ``DatabaseError/Code/storage``, ``DatabaseError/Code/closed``.
    @discardableResult
    public func setValue(_ value: Value) async throws -> WriteReceipt {
        let encoded = try EncodedValue(value, path: path)
        return try await write(.set(path, encoded))
    }

    /// Replaces the data here with the value that JSON text describes — as
    /// `setValue(try Value(json: text))` does, but encoded straight from the text into the
    /// stored form, without building a ``Value`` first (the fastest way to store JSON).
    /// - Throws: ``DatabaseError`` with code ``DatabaseError/Code/invalidData`` for text that is
    ///   not JSON (RFC 8259: numbers such as `01`, `1.`, `+1` or `.5` are refused, and so are
    ///   bytes that are not UTF-8, naming the byte) or data the database cannot hold (naming
    ///   where), as well as
    ///   ``setValue(_:)``'s errors.
    @discardableResult
    public func setValue(json text: String) async throws -> WriteReceipt {
        try await setValue(jsonBytes: Array(text.utf8))
    }

    /// Replaces the data here with the value that JSON text (UTF-8 bytes) describes; see
    /// ``setValue(json:)``.
    @discardableResult
    public func setValue(jsonBytes bytes: [UInt8]) async throws -> WriteReceipt {
        let encoded = try EncodedValue(jsonBytes: bytes, path: path)
        return try await write(.set(path, encoded))
    }

    /// Replaces the data here, with a priority (null, a number or a string).
    @discardableResult
    public func setValue(_ value: Value, andPriority priority: Value) async throws -> WriteReceipt {
        let node = try Node(value, path: path).updatingPriority(try Node.priorityNode(priority, at: path))
        return try await write(.setNode(path, node))
    }

    /// Replaces the data here with an `Encodable` value (encoded through JSON).
    /// - Throws: ``DatabaseError/Code/invalidData`` for a value that cannot be encoded or kept
    ///   exactly (an integer outside `Int64`'s range, such as `UInt64.max`), as well as
    ///   ``setValue(_:)``'s errors.
    @discardableResult
    public func setValue<T: Encodable>(_ encodable: T) async throws -> WriteReceipt {
        try await setValue(try ValueCoding.encode(encodable))
    }

    /// Sets the priority of the data here (ignored while there is no data, as in Firebase).
    @discardableResult
    public func setPriority(_ priority: Value) async throws -> WriteReceipt {
        let node = try Node.priorityNode(priority, at: path)
        return try await write(.setNode(path.child(".priority"), node))
    }

    /// Removes the data here (sets it to null).
    @discardableResult
    public func removeValue() async throws -> WriteReceipt { try await setValue(.null) }

    /// Writes several locations at once, all or nothing: keys are paths relative to this
    /// location (`"a/b/c"`), none inside another; null values remove.
    @discardableResult
    public func updateChildValues(_ values: [String: Value]) async throws -> WriteReceipt {
        let children = try updateChildren(values)
        guard !children.isEmpty else { return WriteReceipt(database: database, writeID: nil) }
        return try await write(.update(path, children))
    }

    /// The children of an update, validated and encoded, in a fixed order.
    private func updateChildren(_ values: [String: Value]) throws -> [(Path, EncodedValue)] {
        var children: [(Path, EncodedValue)] = []
        children.reserveCapacity(values.count)
        for (key, value) in values {
            let p = try Path(validating: key)
            guard !p.isEmpty else { throw DatabaseError(.invalidPath, "an update key may not be empty") }
            let at = path.child(p)
            try at.validate()
            children.append((p, try EncodedValue(value, path: at)))
        }
        // Sorted key by key, each key by String's order (cheaper than the Realtime Database's
        // key order, which nothing here needs): a path sorts right before the paths inside it,
        // so a nested pair is a neighbouring pair.
        children.sort { a, b in a.0.keys.lexicographicallyPrecedes(b.0.keys) }
        for (a, b) in zip(children, children.dropFirst()) where a.0.contains(b.0) {
            throw DatabaseError(.invalidData, "the update writes both \(a.0) and \(b.0), which is inside it")
        }
        return children
    }

    private func write(_ w: LocalWrite) async throws -> WriteReceipt {
        WriteReceipt(database: database, writeID: try await database.write(w))
    }

    // MARK: Writing without waiting

    /// Replaces the data here, as ``setValue(_:)`` does, without waiting: the write is applied
    /// and ordered when this returns — local listeners have been called (or, with a
    /// ``DatabaseOptions/callbackQueue``, queued) and every later read sees it — but it may not
    /// be durable yet. Await ``WriteReceipt/durable()`` for that, and
    /// ``WriteReceipt/serverAcknowledgement()`` for the server. This is how Firebase apps
    /// usually write (`setValue` without a completion block), and the fastest way to write
    /// many values: writes made this way share syncs.
    ///
    /// - Throws: as ``setValue(_:)``, at once; nothing is written when it throws.
    @discardableResult
    public func setValueNow(_ value: Value) throws -> WriteReceipt {
        let encoded = try EncodedValue(value, path: path)
        return try writeNow(.set(path, encoded))
    }

    /// Replaces the data here with the value JSON text (UTF-8 bytes) describes, without
    /// waiting; see ``setValueNow(_:)`` and ``setValue(jsonBytes:)``.
    @discardableResult
    public func setValueNow(jsonBytes bytes: [UInt8]) throws -> WriteReceipt {
        let encoded = try EncodedValue(jsonBytes: bytes, path: path)
        return try writeNow(.set(path, encoded))
    }

    /// Removes the data here without waiting; see ``setValueNow(_:)``.
    @discardableResult
    public func removeValueNow() throws -> WriteReceipt { try setValueNow(.null) }

    /// Writes several locations at once, all or nothing, without waiting; see
    /// ``updateChildValues(_:)`` and ``setValueNow(_:)``.
    @discardableResult
    public func updateChildValuesNow(_ values: [String: Value]) throws -> WriteReceipt {
        let children = try updateChildren(values)
        guard !children.isEmpty else { return WriteReceipt(database: database, writeID: nil) }
        return try writeNow(.update(path, children))
    }

    @inline(__always)
    private func writeNow(_ w: LocalWrite) throws -> WriteReceipt {
        WriteReceipt(database: database, writeID: try database.writeNow(w))
    }

    // MARK: Querying and listening (as a query of everything here)

    /// This location as a query, then ``DatabaseQuery/queryOrdered(byChild:)``.
    public func queryOrdered(byChild childPath: String) throws -> DatabaseQuery { try query.queryOrdered(byChild: childPath) }
    /// This location as a query, then ``DatabaseQuery/queryOrderedByKey()``.
    public func queryOrderedByKey() throws -> DatabaseQuery { try query.queryOrderedByKey() }
    /// This location as a query, then ``DatabaseQuery/queryOrderedByValue()``.
    public func queryOrderedByValue() throws -> DatabaseQuery { try query.queryOrderedByValue() }
    /// This location as a query, then ``DatabaseQuery/queryOrderedByPriority()``.
    public func queryOrderedByPriority() throws -> DatabaseQuery { try query.queryOrderedByPriority() }
    /// This location as a query, then ``DatabaseQuery/queryStarting(atValue:childKey:)``.
    public func queryStarting(atValue value: Value, childKey: String? = nil) throws -> DatabaseQuery { try query.queryStarting(atValue: value, childKey: childKey) }
    /// This location as a query, then ``DatabaseQuery/queryStarting(afterValue:childKey:)``.
    public func queryStarting(afterValue value: Value, childKey: String? = nil) throws -> DatabaseQuery { try query.queryStarting(afterValue: value, childKey: childKey) }
    /// This location as a query, then ``DatabaseQuery/queryEnding(atValue:childKey:)``.
    public func queryEnding(atValue value: Value, childKey: String? = nil) throws -> DatabaseQuery { try query.queryEnding(atValue: value, childKey: childKey) }
    /// This location as a query, then ``DatabaseQuery/queryEnding(beforeValue:childKey:)``.
    public func queryEnding(beforeValue value: Value, childKey: String? = nil) throws -> DatabaseQuery { try query.queryEnding(beforeValue: value, childKey: childKey) }
    /// This location as a query, then ``DatabaseQuery/queryEqual(toValue:childKey:)``.
    public func queryEqual(toValue value: Value, childKey: String? = nil) throws -> DatabaseQuery { try query.queryEqual(toValue: value, childKey: childKey) }
    /// This location as a query, then ``DatabaseQuery/queryLimited(toFirst:)``.
    public func queryLimited(toFirst n: Int) throws -> DatabaseQuery { try query.queryLimited(toFirst: n) }
    /// This location as a query, then ``DatabaseQuery/queryLimited(toLast:)``.
    public func queryLimited(toLast n: Int) throws -> DatabaseQuery { try query.queryLimited(toLast: n) }

    /// See ``DatabaseQuery/observe(_:includeMetadataChanges:with:)``.
    @discardableResult
    public func observe(_ type: DataEventType, includeMetadataChanges: Bool = false, with handler: @escaping @Sendable (DataSnapshot) -> Void) -> ObserverHandle {
        query.observe(type, includeMetadataChanges: includeMetadataChanges, with: handler)
    }

    /// See ``DatabaseQuery/observe(_:includeMetadataChanges:andPreviousSiblingKeyWith:)``.
    @discardableResult
    public func observe(_ type: DataEventType, includeMetadataChanges: Bool = false,
                        andPreviousSiblingKeyWith handler: @escaping @Sendable (DataSnapshot, String?) -> Void) -> ObserverHandle {
        query.observe(type, includeMetadataChanges: includeMetadataChanges, andPreviousSiblingKeyWith: handler)
    }

    /// Same as ``DatabaseQuery/removeObserver(withHandle:)`` on this location's ``query``.
    public func removeObserver(withHandle handle: ObserverHandle) { query.removeObserver(withHandle: handle) }
    /// Same as ``DatabaseQuery/keepSynced(_:)`` on this location's ``query``.
    public func keepSynced(_ keepSynced: Bool) async throws { try await query.keepSynced(keepSynced) }

    /// Same as ``DatabaseQuery/removeAllObservers()`` on this location's ``query``.
    public func removeAllObservers() { query.removeAllObservers() }
    /// Same as ``DatabaseQuery/events(_:includeMetadataChanges:)`` on this location's ``query``.
    public func events(_ type: DataEventType = .value, includeMetadataChanges: Bool = false) -> AsyncThrowingStream<DataEvent, any Error> {
        query.events(type, includeMetadataChanges: includeMetadataChanges)
    }
    /// Same as ``DatabaseQuery/values(includeMetadataChanges:)`` on this location's ``query``.
    public func values(includeMetadataChanges: Bool = false) -> AsyncThrowingMapSequence<AsyncThrowingStream<DataEvent, any Error>, DataSnapshot> {
        query.values(includeMetadataChanges: includeMetadataChanges)
    }
    /// Same as ``DatabaseQuery/getData()`` on this location's ``query``.
    public func getData() async throws -> DataSnapshot { try await query.getData() }
    /// Same as ``DatabaseQuery/observeSingleEvent(of:)`` on this location's ``query``.
    public func observeSingleEvent(of type: DataEventType = .value) async throws -> DataSnapshot { try await query.observeSingleEvent(of: type) }

    public static func == (a: DatabaseReference, b: DatabaseReference) -> Bool { a.database === b.database && a.path == b.path }
    public func hash(into h: inout Hasher) { h.combine(path) }
}

/// What a write returns: its id, and ways to wait for its durability and for the server's verdict.
public struct WriteReceipt: Sendable {
    let database: Database
    /// The write's id: the LSN of its record (nil for an empty update, which writes nothing).
    public let writeID: Int64?

    /// Returns once the write is durable per ``DatabaseOptions/durability`` (with `.fsync`: on
    /// stable storage; with the other modes: at once). The awaiting write forms
    /// (``DatabaseReference/setValue(_:)``…) return only then; the `…Now` forms return before,
    /// and this is how to wait for it.
    ///
    /// - Throws: ``DatabaseError/Code/storage`` if the log failed before the write was durable
    ///   (it may then be lost).
    public func durable() async throws {
        guard let id = writeID else { return }
        do {
            try await database.medium.awaitDurable(UInt64(id))
        } catch {
            throw database.storageError(error)
        }
    }

    /// Returns when the server has acknowledged the write, once that acknowledgement is durable.
    ///
    /// Every wait ends: on the server's answer, on ``Database/close()`` (throwing
    /// ``DatabaseError/Code/closed``), when the database fails (its error), and when the
    /// awaiting task is cancelled (`CancellationError`).
    ///
    /// - Throws: ``DatabaseError/Code/writeRejected`` if the server refused the write (it was
    ///   then reverted locally, listeners saw the revert, and it is kept in
    ///   ``Database/rejectedWrites()``).
    public func serverAcknowledgement() async throws {
        guard let id = writeID else { return }
        try await database.awaitAcknowledgement(of: id)
    }
}
