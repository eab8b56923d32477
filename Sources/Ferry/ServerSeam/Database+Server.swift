import FerryLog

/// Server data and acknowledgements enter the database here — as records in the log, like
/// everything else. `FerrySync`'s client calls these with what the server sends; tests and
/// tools may too.
@_spi(Server) extension Database {
    /// The server says: this is the whole value at `path`. With a `tag`, it is meant for that
    /// query only (a filtered query's data).
    /// - Throws: ``DatabaseError`` (``DatabaseError/Code/invalidPath``,
    ///   ``DatabaseError/Code/invalidData``) for data the data model does not allow — a key
    ///   deeper than 32 levels below the root among them — before anything is recorded.
    ///
    /// With `completingListenAt`, the listen there (with the same tag) is complete with this
    /// data (as ``applyListenComplete(at:tag:)``), in the same step: the first events of its
    /// listeners already say `fromCache == false`.
    public func applyServerPut(at path: String, _ value: Value, tag: Int? = nil, completingListenAt listenPath: String? = nil) async throws {
        let p = try Path(validating: path)
        let node = try Node(value, path: p)
        let complete = try listenPath.map { try Path(validating: $0) }
        _ = try await perform { e in
            var events = try e.serverPut(p, node, tag: tag)
            if let complete { events += e.listenComplete(complete, tag: tag) }
            return (nil, events)
        }
        await notedServerData(bytes: log == nil ? ValueCodec.sizeBound(node) : 0)
    }

    /// Throws the error ``applyServerPut(at:_:tag:completingListenAt:)`` would throw for `value` at `path`
    /// (depth, keys, numbers), without writing anything: for a server that must refuse a write
    /// before it changes its own state.
    public static func checkServerValue(_ value: Value, at path: String) throws {
        _ = try Node(value, path: try Path(validating: path))
    }

    /// The server says: these children (paths relative to `path`) now have these values; with
    /// `listenPath`, the listen there is complete with them (one pass over its view, where
    /// applying and completing apart would take two).
    /// - Throws: as ``applyServerPut(at:_:tag:completingListenAt:)``; each child's depth counts from the root.
    public func applyServerMerge(at path: String, _ children: [String: Value], tag: Int? = nil, completingListenAt listenPath: String? = nil) async throws {
        let p = try Path(validating: path)
        let list = try children.keys.sorted().map { k -> (Path, Node) in
            let rel = try Path(validating: k)
            try p.child(rel).validate()
            return (rel, try Node(children[k]!, path: p.child(rel)))
        }
        let complete = try listenPath.map { try Path(validating: $0) }
        _ = try await perform { e in
            var events = try e.serverMerge(p, list, tag: tag)
            if let complete { events += e.listenComplete(complete, tag: tag) }
            return (nil, events)
        }
        await notedServerData(bytes: log == nil ? list.reduce(0) { $0 + ValueCodec.sizeBound($1.1) } : 0)
    }

    /// One server record still in the log: a merge (its location and children, in the export
    /// form, paths relative to it) or a put, which replaced the location whole.
    public enum RecordedServerData: Sendable {
        case merge(path: String, children: [(path: String, value: Value)])
        case put(path: String)
    }

    /// The server data recorded in the log, oldest first, going back as far as the newest
    /// `maxRecords` records of it and about `maxBytes` of their bytes reach: for a server whose
    /// store is a Ferry database, what it changed recently, read from its own log. Only the
    /// last `2 × maxRecords` records of the log are looked at, however long it is. Empty for a
    /// memory-only database.
    /// - Throws: ``DatabaseError/Code/storage`` when the log cannot be read.
    public func recentServerData(maxRecords: Int, maxBytes: Int) throws -> [RecordedServerData] {
        guard let log, maxRecords > 0 else { return [] }
        do {
            // First the records' sizes (no value decoded), then the newest of them decoded.
            var sizes: [(lsn: LSN, bytes: Int)] = []
            let back = UInt64(min(maxRecords, Int.max / 2) * 2)
            let from = log.nextLSN.rawValue > back ? max(log.firstLSN, LSN(log.nextLSN.rawValue - back)) : log.firstLSN
            try log.forEachRecord(from: from) { r in
                if r.kind == RecordKind.serverMerge.rawValue || r.kind == RecordKind.serverPut.rawValue { sizes.append((r.lsn, r.payload.count)) }
            }
            var first = sizes.count
            var bytes = 0
            while first > 0 && sizes.count - first < maxRecords && bytes + sizes[first - 1].bytes <= maxBytes {
                first -= 1
                bytes += sizes[first].bytes
            }
            guard first < sizes.count else { return [] }
            var out: [RecordedServerData] = []
            try log.forEachRecord(from: sizes[first].lsn) { r in
                let s = try RecordCodec.summarize(kind: r.kind, r.payload)
                switch s.kind {
                case .serverMerge:
                    let children = try s.values.map { v in
                        (v.path.keys.joined(separator: "/"),
                         try ValueCodec.decode(UnsafeRawBufferPointer(rebasing: r.payload[v.range])).value(export: true))
                    }
                    out.append(.merge(path: s.path.description, children: children))
                case .serverPut:
                    out.append(.put(path: s.path.description))
                default:
                    break
                }
            }
            return out
        } catch let e as LogError {
            throw DatabaseError(.storage, "reading the log of \(path ?? "the store") failed: \(e)", underlying: e)
        }
    }

    /// The server acknowledged (or rejected) one local write, in any order: a record per call,
    /// O(pending writes). A server answers in write order; use
    /// ``acknowledgeWrites(through:rejecting:)`` for that.
    public func acknowledgeWrite(_ writeID: Int64, rejected: Bool = false) async throws {
        try await answer { e in try e.acknowledge(writeID, revert: rejected) }
    }

    /// The server answered every pending write up to `writeID`, in write order: those in
    /// `rejections` it refused (each is reverted — listeners see it — and kept in
    /// ``Database/rejectedWrites()``; their receipts throw), the rest it acknowledged. This moves
    /// the sync cursor: one record for the batch's acknowledgements, O(1) per acknowledged write
    /// in the number of pending writes, after one record per rejection (a rejection costs
    /// O(pending writes)).
    ///
    /// The records are not one atomic batch: a crash between them can keep some rejections and
    /// not the cursor. Nothing is lost then — the writes above the cursor stay pending, and the
    /// server's answers to them, asked again, are the same.
    ///
    /// Returns once the records are durable; only then do the writes' receipts
    /// (``WriteReceipt/serverAcknowledgement()``) return.
    public func acknowledgeWrites(through writeID: Int64, rejecting rejections: [WriteRejection] = []) async throws {
        try await answer { e in try e.acknowledge(through: writeID, rejections: rejections) }
    }

    /// The sync cursor: every write up to this id has been answered by the server.
    public var acknowledgedThrough: Int64 { withEngine { $0.ledger.ackedThrough } }

    /// Records an answer of the server and delivers its events; once its records are durable,
    /// resumes the receipts it settled (with the error instead, if they cannot be made durable).
    private func answer(_ body: (Engine) throws -> ([Event], Int64)) async throws {
        var settled: [(waiter: AckWaiter, outcome: DatabaseError?)] = []
        do {
            _ = try await perform { e in
                defer {
                    settled = e.ledger.takeSettled()
                }
                let (events, lsn) = try body(e)
                return (lsn == 0 ? nil : lsn, events)
            }
        } catch {
            for s in settled { s.waiter.continuation.resume(throwing: error) }
            throw error
        }
        for s in settled {
            if let error = s.outcome { s.waiter.continuation.resume(throwing: error) } else { s.waiter.continuation.resume() }
        }
        await notedAnswers()
    }

    /// The server has sent everything for the listen at `path` (or the tagged query): its
    /// snapshots stop being `fromCache`.
    public func applyListenComplete(at path: String, tag: Int? = nil) async throws {
        let p = try Path(validating: path)
        _ = try await perform { e in (nil, e.listenComplete(p, tag: tag)) }
    }

    /// The sync layer's own small state, kept in a side file beside the log
    /// (`sync-state.json`; a memory-only database keeps it in memory): nil when there is none
    /// or it cannot be read or parsed.
    public func readSyncState() -> Value? {
        guard let bytes = try? medium.readSideFile(named: Self.syncStateFile) else { return nil }
        return try? Value(jsonBytes: bytes)
    }

    /// Replaces the sync layer's state, after making every record so far durable: what the
    /// state says about the data (the commit a stream had applied through, say) is never
    /// ahead of the data a crash leaves. Atomic: after a crash it is the old state or this one.
    ///
    /// - Throws: ``DatabaseError`` (`storage`) when the log or the file cannot be written.
    public func writeSyncState(_ state: Value) async throws {
        try await sync()
        // One at a time: two writers of one side file would race on its temporary file.
        do { try syncStateWriter.withLock { _ in try medium.writeSideFile(named: Self.syncStateFile, contents: Array(state.json.utf8)) } } catch {
            throw storageError(error)
        }
    }

    static let syncStateFile = "sync-state.json"

    /// Whether the server data cached at `path` is whole (what a complete listen there left,
    /// and nothing of it evicted since): a stream there may resume from where it stopped.
    public func hasCompleteServerData(at path: String) -> Bool {
        guard let p = try? Path(validating: path) else { return false }
        return withEngine { $0.server.isComplete(at: p) }
    }

    /// The server listen at `path` (or the tagged query) was lost (the connection dropped,
    /// the client went offline): its data stays, but snapshots say `fromCache` again until a
    /// listen completes there anew. Listeners that asked for metadata changes are told.
    public func applyListenEnded(at path: String, tag: Int? = nil) async throws {
        let p = try Path(validating: path)
        _ = try await perform { e in
            if let tag {
                if let query = e.syncTree.query(forTag: tag) { e.serverStatus.listenEnded(at: p, query: query) }
            } else {
                e.serverStatus.listenEnded(at: p)
            }
            return (nil, [])
        }
    }

    /// The tag the database gave a filtered query's listen (nil for a query that loads all data).
    public func tag(for query: DatabaseQuery) -> Int? {
        withEngine { $0.syncTree.tag(for: query.spec) }
    }

    /// Milliseconds to add to the local clock to get the server's (Firebase's
    /// `.info/serverTimeOffset`), as the sync layer last measured it; 0 before.
    public var serverTimeOffset: Int64 { withEngine { $0.serverStatus.timeOffset } }

    /// Milliseconds to add to the local clock to get the server's.
    public func setServerTimeOffset(_ offset: Int64) {
        withEngine { $0.serverStatus.setTimeOffset(offset) }
    }

    /// The ids of the local writes the server has not yet acknowledged, oldest first.
    public var pendingWriteIDs: [Int64] {
        withEngine { Array($0.writeTree.pending.ids) }
    }
}

extension Database {
    /// The local writes the server refused, oldest first, until cleared: each was reverted
    /// locally (listeners saw it) and is kept here with the server's answer, across restarts
    /// and compactions (Firebase drops them silently).
    ///
    /// - Throws: ``DatabaseError/Code/storage`` if a rejected write's record cannot be read.
    public func rejectedWrites() throws -> [RejectedWrite] {
        try withEngine { try $0.rejectedWrites() }
    }

    /// Forgets rejected writes: those with the given ids, or all of them (nil). Durable when it
    /// returns.
    public func clearRejectedWrites(_ writeIDs: [Int64]? = nil) async throws {
        _ = try await perform { e in
            let lsn = try e.clearRejected(writeIDs)
            return (lsn == 0 ? nil : lsn, [])
        }
    }
}
