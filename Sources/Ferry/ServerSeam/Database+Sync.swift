import FerryLog

/// A local write as the server must receive it: unresolved server values (`{".sv": …}`),
/// priorities as `.priority`.
@_spi(Server) public struct OutgoingWrite: Sendable, Equatable {
    /// What a write does.
    public enum Operation: Sendable, Equatable {
        /// Replace the value at the path (null removes it).
        case set
        /// A multi-path update: `data` is an object of paths relative to `path`.
        case update
    }
    /// The write's id (its LSN): ids increase in write order and are never reused by a store.
    public var id: Int64
    /// What it does.
    public var operation: Operation
    /// Where, as `/a/b` (`/` for the root).
    public var path: String
    /// The value (set) or the children (update).
    public var data: Value
}

/// A listen the sync layer should hold on the server: a location and, for a filtered query,
/// its REST parameters and the tag its data must carry.
@_spi(Server) public struct ListenRequest: Sendable, Hashable, CustomStringConvertible {
    /// The location, as `/a/b`.
    public var path: String
    /// The tag to pass with the listen's data (nil: data for every view at the location).
    public var tag: Int?
    /// The REST query parameters (`orderBy`, `startAt`, … JSON-encoded); empty for all data.
    public var parameters: [String: String]

    /// `path?name=value&…`.
    public var description: String {
        parameters.isEmpty ? path : path + "?" + parameters.keys.sorted().map { "\($0)=\(parameters[$0]!)" }.joined(separator: "&")
    }
}

extension QueryParams {
    /// The REST parameters of these constraints; nil when REST cannot express them (a start or
    /// end at a child key, `startAfter`/`endBefore`): such a query listens to all the data.
    var restParameters: [String: String]? {
        if loadsAllData && index == .priority { return [:] }
        if startName != nil || endName != nil || startAfter || endBefore { return nil }
        var p: [String: String] = [:]
        switch index {
        case .priority: p["orderBy"] = "\"$priority\""
        case .key: p["orderBy"] = "\"$key\""
        case .value: p["orderBy"] = "\"$value\""
        case .child(let path): p["orderBy"] = Value.string(path.keys.joined(separator: "/")).json
        }
        if startSet { p["startAt"] = startValue.value(export: true).json }
        if endSet { p["endAt"] = endValue.value(export: true).json }
        if let limit { p[isViewFromLeft ? "limitToFirst" : "limitToLast"] = String(limit) }
        return p
    }
}

/// The seam of the sync layer (`FerrySync`): which writes to send, which listens to hold, and
/// a signal when either changes. Server data and answers go back in through
/// `Database+Server.swift`.
@_spi(Server) extension Database {
    /// The store's id (32 lowercase hex digits): with a write's id, a write's identity for the
    /// server's de-duplication. A memory-only database gets a random one per instance.
    public var storeIdentifier: String { medium.storeID.description }

    /// A stream of ``SyncSignal``s for the one sync layer attached (a second call ends the
    /// first's stream: one sync client per database). Nothing is dropped: every change yields. It yields `.writes` after each local write and `.listens` when the
    /// listens change; read ``outgoingWrites(after:limit:maxBytes:)`` and ``activeListens()``
    /// then. Ends when the database closes.
    public func syncSignals() -> AsyncStream<SyncSignal> {
        let (stream, continuation) = AsyncStream.makeStream(of: SyncSignal.self, bufferingPolicy: .unbounded)
        let old = withEngine { e -> AsyncStream<SyncSignal>.Continuation? in
            e.listens.attach(e.closed ? nil : continuation)
        }
        old?.finish()
        if withEngine({ $0.closed }) { continuation.finish() }
        return stream
    }

    /// Pending writes with ids above `after`, oldest first: at most `limit`, and (beyond the
    /// first, which may be bigger alone) at most about `maxBytes` (as stored, close to JSON) — only durable ones (call ``sync()`` first to
    /// make every write so far durable).
    ///
    /// - Throws: ``DatabaseError/Code/storage`` when a write's record cannot be read.
    public func outgoingWrites(after: Int64, limit: Int, maxBytes: Int = .max) throws -> [OutgoingWrite] {
        try withEngine { e in
            try e.checkUsable()
            return try e.outgoingWrites(after: after, limit: limit, maxBytes: maxBytes)
        }
    }

    /// The listens the views and `keepSynced` pins need now.
    public func activeListens() -> Set<ListenRequest> {
        withEngine { e in
            var out = Set<ListenRequest>()
            for (query, tag) in e.listens.active {
                if let parameters = query.params.restParameters {
                    out.insert(ListenRequest(path: query.path.description, tag: parameters.isEmpty ? nil : tag, parameters: parameters))
                } else {
                    out.insert(ListenRequest(path: query.path.description, tag: nil, parameters: [:]))
                }
            }
            for pin in e.pins {
                out.insert(ListenRequest(path: pin.description, tag: nil, parameters: [:]))
            }
            return out
        }
    }
}

extension Engine {
    func outgoingWrites(after: Int64, limit: Int, maxBytes: Int) throws -> [OutgoingWrite] {
        var out: [OutgoingWrite] = []
        var bytes = 0
        let pending = writeTree.pending
        var i = pending.firstIndex(notBelow: after + 1)
        // Only durable writes leave the device: one the server applied must never come back
        // after a crash under another write's id (ids are LSNs).
        let durable = log.map { Int64($0.durableLSN.rawValue) } ?? .max
        while i < pending.count, out.count < limit {
            let id = pending.id(at: i)
            guard id < durable else { break }
            let (write, size) = try outgoingWrite(id)
            if !out.isEmpty && bytes + size > maxBytes { break }  // (the first goes alone, whatever its size)
            bytes += size
            out.append(write)
            i += 1
        }
        return out
    }

    /// One pending write with its values as the user wrote them (server values unresolved),
    /// and about how many bytes it is (as stored: close to its JSON, without writing that).
    private func outgoingWrite(_ id: Int64) throws -> (OutgoingWrite, size: Int) {
        do {
            return try withPayload(UInt64(id)) { rawKind, payload in
                guard let kind = RecordKind(rawValue: rawKind), kind == .localSet || kind == .localUpdate else {
                    throw ByteReader.damaged("write \(id) is a record of kind \(rawKind)")
                }
                let path = try RecordCodec.summarize(kind: rawKind, payload).path
                let values = try RecordCodec.unresolvedValues(kind: kind, payload)
                return (OutgoingWrite(id: id, path: path, isSet: kind == .localSet, values: values), payload.count)
            }
        } catch {
            let place = log?.location(of: LSN(UInt64(id)))
            throw DatabaseError(.storage, "reading pending write \(id) failed: \(error)", underlying: error,
                                lsn: UInt64(id), file: place?.file, offset: place?.frameOffset, store: log?.path)
        }
    }
}

extension OutgoingWrite {
    /// A set of the one value (at the root of `path`), or an update of the values at their
    /// paths relative to `path`.
    init(id: Int64, path: Path, isSet: Bool, values: [(Path, Node)]) {
        if isSet {
            self.init(id: id, operation: .set, path: path.description, data: values.first?.1.value(export: true) ?? .null)
        } else {
            var o: [String: Value] = [:]
            for (p, n) in values { o[p.keys.joined(separator: "/")] = n.value(export: true) }
            self.init(id: id, operation: .update, path: path.description, data: .object(o))
        }
    }
}

@_spi(Server) extension DatabaseQuery {
    /// What to ask a server for this query's data: its location and REST parameters (nil when
    /// REST cannot express the constraints: then ask for the whole location).
    public var restRequest: (path: String, parameters: [String: String]?) {
        (path.description, params.restParameters)
    }

    /// A snapshot of this query over `value`, the server's answer for the location (all of
    /// it, or already filtered by the server): ordered and filtered as the query's views are.
    ///
    /// - Throws: ``DatabaseError/Code/invalidData`` for a value the data model refuses.
    public func snapshot(serverValue value: Value) throws -> DataSnapshot {
        let node = try Node(value, path: path)
        let filtered = params.loadsAllData ? node : params.filtered(node)
        return DataSnapshot(ref: ref, node: filtered, index: params.index, metadata: SnapshotMetadata(fromCache: false, hasPendingWrites: false))
    }
}

@_spi(Server) extension MutableData {
    /// The data of a server's value (`.priority` and `.value` as the REST API writes them).
    ///
    /// - Throws: ``DatabaseError/Code/invalidData`` for a value the data model refuses.
    public init(serverValue: Value) throws {
        self.init(node: try Node(serverValue))
    }

    /// The value to write for this data, priorities as the REST API writes them.
    ///
    /// - Throws: ``DatabaseError/Code/invalidData`` for a value or priority the data model refuses.
    public func exportValue(at path: String) throws -> Value {
        let p = try Path(validating: path)
        return try Node(value, path: p).updatingPriority(try Node.priorityNode(priority, at: p)).value(export: true)
    }
}

@_spi(Server) extension TransactionResult {
    /// A result decided by a server transaction.
    public init(serverCommitted committed: Bool, snapshot: DataSnapshot) {
        self.init(committed: committed, snapshot: snapshot)
    }
}
