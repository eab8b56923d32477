/// What tools (`ferry-dump`) need to read a database's log: record descriptions, and a replay
/// that rebuilds the state at any LSN. Not for apps.
@_spi(Tools) public enum RecordDescription {
    /// A one-line description of a database record, or nil for a kind the database does not write.
    public static func describe(kind: UInt8, payload: UnsafeRawBufferPointer) -> String? {
        guard let k = RecordKind(rawValue: kind) else { return nil }
        do {
            let s = try RecordCodec.summarize(kind: kind, payload)
            func value(_ r: Range<Int>) -> String {
                (try? ValueCodec.decode(UnsafeRawBufferPointer(rebasing: payload[r])).value(export: true).json) ?? "<damaged value>"
            }
            switch k {
            case .localSet:
                let unresolved = try RecordCodec.unresolvedValues(kind: k, payload).first?.1.value(export: true).json ?? "?"
                let shown = value(s.values[0].range)
                return "set \(s.path) = \(unresolved)" + (shown != unresolved ? " (resolved locally: \(shown))" : "") + (s.hidden ? " [hidden]" : "")
            case .localUpdate:
                return "update \(s.path) " + s.values.map { "\($0.path.keys.joined(separator: "/")): \(value($0.range))" }.joined(separator: ", ")
            case .serverPut:
                return "server put \(s.path) = \(value(s.values[0].range))"
            case .serverMerge:
                return "server merge \(s.path) " + s.values.map { "\($0.path.keys.joined(separator: "/")): \(value($0.range))" }.joined(separator: ", ")
            case .serverRestate:
                return "server data carried forward " + s.values.map { $0.range.isEmpty ? "\($0.path): (marker)" : "\($0.path): \(value($0.range))" }.joined(separator: ", ")
            case .ack:
                return (s.revert ? "reject write \(s.ackedWrite)" : "ack write \(s.ackedWrite)") + (s.appliedToServerCache ? " (value kept as server data)" : "")
            case .ackCursor:
                return "sync cursor → \(s.ackedWrite): writes up to \(s.ackedWrite) acknowledged"
                    + (s.ids.isEmpty ? "" : " (values not kept as server data: \(s.ids.map(String.init).joined(separator: ", ")))")
            case .rejection:
                let what = (try? RecordCodec.unresolvedValues(kind: s.embeddedKind ?? .localSet, UnsafeRawBufferPointer(rebasing: payload[s.embedded])))
                    .map { vs in vs.map { ($0.0.isEmpty ? "" : "\($0.0.keys.joined(separator: "/")): ") + $0.1.value(export: true).json }.joined(separator: ", ") } ?? "?"
                return "write \(s.ackedWrite) rejected by the server (\(s.status): \(s.message)), reverted and kept: \(s.embeddedKind == .localUpdate ? "update" : "set") \(s.path) \(what)"
            case .clearRejected:
                return "rejected writes cleared: \(s.ids.map(String.init).joined(separator: ", "))"
            case .serverEvict:
                return "cache limit: server data in records below \(s.cutoff) evicted (not cached)"
            case .pin:
                return (s.pinned ? "keepSynced pin set at " : "keepSynced pin cleared at ") + s.path.description
            }
        } catch {
            return "damaged \(k) record: \(error)"
        }
    }
}

extension RecordDescription {
    /// The highest sync cursor among the records `forEach` gives (nil when there is none).
    public static func syncCursor(_ forEach: ((UInt8, UnsafeRawBufferPointer) throws -> Void) throws -> Void) throws -> Int64? {
        var cursor: Int64?
        try forEach { kind, payload in
            guard kind == RecordKind.ackCursor.rawValue else { return }
            let s = try RecordCodec.summarize(kind: kind, payload)
            cursor = max(cursor ?? 0, s.ackedWrite)
        }
        return cursor
    }
}

/// Rebuilds the database's state by replaying records — with the database's own replay, the
/// records kept in memory.
@_spi(Tools) public final class StateReplayer {
    private let engine = Engine(log: nil, logger: .init(label: "ferry.tools"))

    /// An empty state, as before the first record.
    public init() {}

    /// Applies one record (in LSN order).
    public func apply(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) throws {
        engine.keep(lsn: lsn, kind: kind, payload: Array(payload))
        try engine.replay(kind: kind, lsn: Int64(lsn), payload: payload)
        if let failure = engine.failure { throw failure }
    }

    /// What a reader sees at `path` (server data with pending writes), or nil when incomplete.
    public func visible(at path: String) -> Value? { engine.visibleNode(at: Path(path)).map { $0.value(export: true) } }
    /// The server data cached at `path`, or nil when not cached completely.
    public func serverCache(at path: String) -> Value? { engine.server.completeNode(at: Path(path)).map { $0.value(export: true) } }
    /// The pending local writes, oldest first.
    public var pendingWrites: [(id: Int64, path: String)] {
        let p = engine.writeTree.pending
        return (0..<p.count).map { (p.id(at: $0), p.path(at: $0).description) }
    }
    /// The sync cursor: every write up to this id has been answered by the server.
    public var acknowledgedThrough: Int64 { engine.ledger.ackedThrough }
    /// The rejected writes not cleared, oldest first.
    public func rejectedWrites() throws -> [RejectedWrite] { try engine.rejectedWrites() }
    /// The database's statistics for the state replayed (what ``Database/statistics`` reports
    /// of an open store), with the file sizes given.
    public func statistics(segments: Int, segmentBytes: Int64, checkpointBytes: Int64) -> StoreStatistics {
        var s = StoreStatistics()
        s.segments = segments
        s.segmentBytes = segmentBytes
        s.checkpointBytes = checkpointBytes
        engine.fillStatistics(&s)
        // (The replayer keeps the store's records in memory to read them; the store's are on disk.)
        s.memoryRecords = 0
        s.memoryRecordBytes = 0
        return s
    }
}

/// The Realtime Database tree's records, as tools read them (``RecordDescription``).
package struct TreeRecordModel: RecordModel {
    package init() {}
    package var name: String { "a Realtime Database store (Ferry's Database)" }
    package func owns(kind: UInt8) -> Bool { RecordKind(rawValue: kind) != nil }
    package func marks(sideFile name: String) -> Bool { Checkpoint.lsn(of: name) != nil }
    package func describe(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) -> String? {
        RecordDescription.describe(kind: kind, payload: payload)
    }
}
