import FerryLog

/// The server's answer that a write was refused (see ``Database/acknowledgeWrites(through:rejecting:)``).
@_spi(Server) public struct WriteRejection: Sendable, Equatable {
    /// The write's id (``WriteReceipt/writeID``).
    public var writeID: Int64
    /// The server's status code (as HTTP: 401 permission denied, 400 invalid data…).
    public var status: Int
    /// The server's message.
    public var message: String

    public init(writeID: Int64, status: Int, message: String) {
        self.writeID = writeID
        self.status = status
        self.message = message
    }
}

/// Acknowledgements: the sync cursor (in write order, one record per batch), rejections (one
/// record each, keeping the write), and the receipts that wait for either.
extension Engine {
    /// The server answered every pending write up to `through`, in write order: the ones in
    /// `rejections` are reverted and kept in the list of rejected writes (a record each, first);
    /// the rest are acknowledged by one cursor record. Returns the events and the LSN of the
    /// last record written (0 when none was).
    ///
    /// O(1) per acknowledged write in the number of pending writes: each is the oldest pending
    /// one when its turn comes (see ``WriteTree/removeOldest(_:writtenKeys:)``); its cost is
    /// its own locations and the views on them. Rejections cost O(pending writes) each.
    func acknowledge(through: Int64, rejections: [WriteRejection]) throws -> ([Event], Int64) {
        try checkUsable()
        var events: [Event] = []
        var lastLSN: Int64 = 0
        for r in rejections.sorted(by: { $0.writeID < $1.writeID }) {
            let (e, lsn) = try reject(r)
            events += e
            if lsn != 0 { lastLSN = lsn }
        }
        guard through > ledger.ackedThrough else { return (events, lastLSN) }
        // Decide first (nothing changes if the record cannot be written), then apply.
        var acked: [(id: Int64, applied: Bool)] = []
        var notApplied: [Int64] = []
        var i = 0
        let noViews = syncTree.syncPoints.isEmpty  // (then no path needs decoding)
        while i < writeTree.pending.count, writeTree.pending.id(at: i) <= through {
            let id = writeTree.pending.id(at: i)
            // Where a listen keeps the data up to date, the server's own update is the truth;
            // elsewhere the acknowledged value is the best knowledge of the server's data.
            let applied = writeTree.pending.isVisible(at: i)
                && (noViews || !syncTree.hasCompleteView(covering: writeTree.pending.path(at: i)))
            if !applied { notApplied.append(id) }
            acked.append((id, applied))
            i += 1
        }
        let lsn = try append(.ackCursor, RecordCodec.ackCursor(through: through, notApplied: notApplied))
        ledger.advanceCursor(through: through, recordLSN: lsn)
        for (id, applied) in acked {
            events += removeAcknowledged(id, applied: applied, live: true)
            ledger.settle(id, recordLSN: lsn, nil)
        }
        return (events, lsn)
    }

    /// Replays a cursor record: the same removals as ``acknowledge(through:rejections:)``,
    /// without views.
    func replayCursor(through: Int64, notApplied: [Int64]) {
        var skip = notApplied[...]
        while let id = writeTree.pending.firstID, id <= through {
            while let s = skip.first, s < id { skip.removeFirst() }
            let applied = skip.first != id
            _ = removeAcknowledged(id, applied: applied, live: false)
        }
        ledger.advanceCursor(through: through)
    }

    /// Removes the oldest pending write `id`, acknowledged: copies its values into the server
    /// cache if `applied`, takes it off the write tree and (live) raises the events of views on it.
    private func removeAcknowledged(_ id: Int64, applied: Bool, live: Bool) -> [Event] {
        let isOverwrite = writeTree.pending.isOverwrite(at: 0)
        // The record's path (the pending list's is not decoded again); none if the record
        // could not be read (the database failed: nothing to copy).
        let (base, values) = storedWrite(id) ?? (writeTree.pending.path(at: 0), [])
        // Each location's index key, made once (the write's own path's is in the pending list).
        let baseKey = writeTree.pending.withKey(at: 0) { Array($0) }
        let keys = values.map { $0.0.count == base.count ? baseKey : PathKey.encode($0.0) }
        if applied { for ((p, h, empty), key) in zip(values, keys) { server.set(h, empty: empty, at: p, key: key) } }
        let events = applied && live ? showAcknowledgedValues(values.map(\.0)) : []
        let mayShow = writeTree.removeOldest(id, writtenKeys: isOverwrite ? [baseKey] : keys)
        guard live, mayShow, syncTree.hasSyncPoint(relatedTo: base) else { return events }
        var affected = ImmutableTree<Bool>.empty
        for p in isOverwrite ? [base] : values.map(\.0) { affected = affected.setting(true, at: base.relative(to: p)) }
        return events + syncTree.applyAcknowledgement(at: base, affected: affected, revert: false)
    }

    /// Acknowledged values just copied into the stored server data reach the views as server
    /// data too (while the write still shadows them: no events), so that a view answers what a
    /// read of the store answers — a query view, whose server data would otherwise keep the old
    /// values once the write is gone, dropped children the store still had. Not where a live
    /// listen at, above or below a path keeps it: the server's own data is the truth there.
    func showAcknowledgedValues(_ paths: [Path]) -> [Event] {
        var events: [Event] = []
        for p in paths where syncTree.hasSyncPoint(relatedTo: p) && !serverStatus.hasLiveListen(touching: p) {
            guard let node = server.completeNode(at: p) else { continue }
            events += syncTree.applyServerOverwrite(p, node)
        }
        return events
    }

    /// Reverts a pending write the server refused and keeps it, with the server's answer, in
    /// the list of rejected writes (a record holding a copy of the write's own record, so that
    /// the list outlives the compaction of the write's segment). Returns the events and the
    /// record's LSN (0 when the write is not pending).
    private func reject(_ r: WriteRejection) throws -> ([Event], Int64) {
        guard writeTree.pending.index(of: r.writeID) != nil else { return ([], 0) }
        let time = serverTime
        let payload = try withPayload(UInt64(r.writeID)) { kind, p in
            RecordCodec.rejection(writeID: r.writeID, status: r.status, message: r.message, time: time, kind: kind, payload: p)
        }
        let lsn = try append(.rejection, payload)
        ledger.noteRejected(r.writeID, recordLSN: UInt64(lsn))
        let events = syncTree.ackUserWrite(r.writeID, revert: true)
        ledger.settle(r.writeID, recordLSN: lsn, DatabaseError(.writeRejected,
            "the server refused write \(r.writeID) (\(r.status): \(r.message)); it was reverted locally and kept in the database's rejected writes"))
        return (events, lsn)
    }

    // MARK: Receipts

    /// Registers a receipt of `writeID` (see ``WriteLedger/wait(for:token:pending:_:)``);
    /// a stopped database answers with why.
    func registerAckWaiter(_ writeID: Int64, token: UInt64, _ c: UnsafeContinuation<Void, any Error>) -> WriteLedger<DatabaseError>.Wait {
        if let failure { return .failed(failure) }
        if closed { return .failed(DatabaseError(.closed, "the database is closed")) }
        return ledger.wait(for: writeID, token: token, pending: writeTree.pending.index(of: writeID) != nil, c)
    }

    // MARK: Rejected writes

    /// The rejected writes the app has not cleared, oldest first (read from their records).
    func rejectedWrites() throws -> [RejectedWrite] {
        return try ledger.rejected.sorted { $0.key < $1.key }.map { id, lsn in
            try withPayload(lsn) { kind, payload in
                let s = try RecordCodec.summarize(kind: kind, payload)
                guard s.kind == .rejection, let inner = s.embeddedKind else { throw ByteReader.damaged("record \(lsn) is not a rejection") }
                let values = try RecordCodec.unresolvedValues(kind: inner, UnsafeRawBufferPointer(rebasing: payload[s.embedded]))
                let value: Value
                if inner == .localSet {
                    value = values.first?.1.value(export: true) ?? .null
                } else {
                    value = .object(Dictionary(values.map { ($0.0.keys.joined(separator: "/"), $0.1.value(export: true)) }, uniquingKeysWith: { $1 }))
                }
                return RejectedWrite(writeID: id, path: s.path, kind: inner == .localSet ? .set : .update, value: value,
                                     status: s.status, message: s.message, rejectedAt: s.time)
            }
        }
    }

    /// Forgets rejected writes (`ids`, or all with nil). Returns the record's LSN (0 if none).
    func clearRejected(_ ids: [Int64]?) throws -> Int64 {
        try checkUsable()
        let known = Set(ledger.rejected.keys)
        let cleared = (ids.map { Set($0).intersection(known) } ?? known).sorted()
        guard !cleared.isEmpty else { return 0 }
        let lsn = try append(.clearRejected, RecordCodec.clearRejected(cleared))
        ledger.clearRejected(cleared)
        return lsn
    }
}

/// A local write the server refused: reverted locally and kept here, with the server's answer,
/// until the app clears it (``Database/clearRejectedWrites(_:)``). It survives restarts and
/// compaction.
public struct RejectedWrite: Sendable, Equatable {
    /// What kind of write it was.
    public enum Kind: Sendable, Equatable {
        /// `setValue` (or `removeValue`): ``RejectedWrite/value`` is the value.
        case set
        /// `updateChildValues`: ``RejectedWrite/value`` is an object of relative paths (`"a/b"`) to values.
        case update
    }

    /// The write's id (its ``WriteReceipt/writeID``).
    public let writeID: Int64
    /// Where it wrote.
    public let path: Path
    /// A set or an update.
    public let kind: Kind
    /// What it wrote, as the app wrote it (server values unresolved, priorities as `.priority`).
    public let value: Value
    /// The server's status code (401 for a rules denial, as HTTP).
    public let status: Int
    /// The server's message.
    public let message: String
    /// When the rejection was recorded (ms since 1970, the server's clock as far as known).
    public let rejectedAt: Int64

    init(writeID: Int64, path: Path, kind: Kind, value: Value, status: Int, message: String, rejectedAt: Int64) {
        self.writeID = writeID
        self.path = path
        self.kind = kind
        self.value = value
        self.status = status
        self.message = message
        self.rejectedAt = rejectedAt
    }
}
