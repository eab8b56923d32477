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
            }
        } catch {
            return "damaged \(k) record: \(error)"
        }
    }
}

/// Rebuilds the database's state by replaying records, with values decoded in memory.
@_spi(Tools) public final class StateReplayer {
    private let engine = Engine(log: nil, logger: .init(label: "ferry.tools"))

    /// An empty state, as before the first record.
    public init() {}

    /// Applies one record (in LSN order).
    public func apply(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) throws {
        let s = try RecordCodec.summarize(kind: kind, payload)
        let id = Int64(lsn)
        func value(_ r: Range<Int>) throws -> Node { try ValueCodec.decode(UnsafeRawBufferPointer(rebasing: payload[r])) }
        switch s.kind {
        case .localSet:
            engine.writeTree.addOverwrite(s.path, try value(s.values[0].range), writeID: id, visible: !s.hidden)
        case .localUpdate:
            engine.writeTree.addMerge(s.path, CompoundWrite(try s.values.map { ($0.path, try value($0.range)) }), writeID: id)
        case .serverPut:
            engine.server.set(node: try value(s.values[0].range), at: s.path)
        case .serverMerge:
            for v in s.values { engine.server.set(node: try value(v.range), at: s.path.child(v.path)) }
        case .serverRestate:
            for v in s.values {
                if v.range.isEmpty {
                    engine.server.restate(.stored(.emptyValue), empty: true, at: v.path)
                } else {
                    let node = try value(v.range)
                    engine.server.restate(.inline(node), empty: node.isEmpty, at: v.path)
                }
            }
        case .ack:
            if s.appliedToServerCache, let w = engine.writeTree.write(s.ackedWrite) {
                switch w.change {
                case .overwrite(let n): engine.server.set(node: n, at: w.path)
                case .merge(let m): m.forEachWrite { p, n in engine.server.set(node: n, at: w.path.child(p)) }
                }
            }
            _ = engine.writeTree.removeWrite(s.ackedWrite)
        }
    }

    /// What a reader sees at `path` (server data with pending writes), or nil when incomplete.
    public func visible(at path: String) -> Value? { engine.visibleNode(at: Path(path)).map { $0.value(export: true) } }
    /// The server data cached at `path`, or nil when not cached completely.
    public func serverCache(at path: String) -> Value? { engine.server.completeNode(at: Path(path)).map { $0.value(export: true) } }
    /// The pending local writes, oldest first.
    public var pendingWrites: [(id: Int64, path: String)] {
        let p = engine.writeTree.pending
        return (0..<p.count).map { (p.ids[$0], p.path(at: $0).description) }
    }
}
