/// The changes the engine applies: each writes one record, updates the stored state, and
/// (live) updates the views, returning their events. Replay applies the same records without views.
extension Engine {
    /// Where the value at `range` of record `lsn`'s payload sits.
    func ref(_ lsn: Int64, _ range: Range<Int>) -> ValueRef {
        ValueRef(lsn: UInt64(lsn), offset: UInt32(range.lowerBound), length: UInt32(range.count))
    }

    // MARK: Local writes

    private func checkSize(_ nodes: [Node]) throws {
        try checkSize(bytes: nodes.reduce(0) { $0 + ValueCodec.sizeBound($1) })
    }

    /// The largest encoded write accepted (``Database/maxWriteSize``).
    static let maxWriteSize = 16 << 20

    /// Refuses a write of about `size` encoded bytes past ``maxWriteSize``.
    private func checkSize(bytes size: Int) throws {
        if size > Engine.maxWriteSize {
            throw DatabaseError(.invalidData, "the write is about \(size >> 20) MB; a single write may be at most 16 MB")
        }
    }

    /// A set. Returns its write id and the events it raised.
    func localSet(_ path: Path, _ node: Node, hidden: Bool = false) throws -> (Int64, [Event]) {
        try checkUsable()
        try checkSize([node])
        let time = serverTime
        let resolved = ServerValueResolver.containsDeferred(node)
            ? try ServerValueResolver.resolve(node, existing: visibleNode(at: path) ?? .empty, time: time, at: path) : nil
        let shown = resolved ?? node
        let (payload, range) = RecordCodec.localSet(path: path, value: node, resolved: resolved, time: time, hidden: hidden)
        let lsn = try append(.localSet, payload)
        return (lsn, syncTree.applyUserOverwrite(path, shown, writeID: lsn, visible: !hidden, ref: ref(lsn, range)))
    }

    /// A set of a value encoded as the user gave it. Its node is built only if a listener or a
    /// server value needs it.
    func localSet(_ path: Path, _ value: EncodedValue) throws -> (Int64, [Event]) {
        guard !value.hasServerValues else { return try localSet(path, try value.node()) }
        try checkUsable()
        try checkSize(bytes: value.bytes.count)
        let (payload, range) = RecordCodec.localSet(path: path, encoded: value.bytes, time: serverTime)
        let lsn = try append(.localSet, payload)
        let events = syncTree.applyUserOverwrite(path, writeID: lsn, ref: ref(lsn, range), empty: value.isEmpty, firstByte: value.bytes.first) {
            (try? value.node()) ?? .empty
        }
        return (lsn, events)
    }

    /// A multi-path update: `children` are paths relative to `path`, none inside another.
    func localUpdate(_ path: Path, _ children: [(Path, Node)]) throws -> (Int64, [Event]) {
        try checkUsable()
        try checkSize(children.map(\.1))
        let time = serverTime
        let resolved: [(Path, Node, Node?)] = try children.map { p, n in
            guard ServerValueResolver.containsDeferred(n) else { return (p, n, nil) }
            return (p, n, try ServerValueResolver.resolve(n, existing: visibleNode(at: path.child(p)) ?? .empty, time: time, at: path.child(p)))
        }
        let merge = CompoundWrite(resolved.map { ($0.0, $0.2 ?? $0.1) })
        let (payload, ranges) = RecordCodec.localUpdate(path: path, children: resolved, time: time)
        let lsn = try append(.localUpdate, payload)
        let stored = ranges.map { range in
            StoredChild(path: range.0, ref: ref(lsn, range.1), firstByte: payload[range.1.lowerBound])
        }
        return (lsn, syncTree.applyUserMerge(path, writeID: lsn, stored: stored) { merge })
    }

    /// A multi-path update of values encoded as the user gave them. Their nodes are built only
    /// if a listener or a server value needs them.
    func localUpdate(_ path: Path, _ children: [(Path, EncodedValue)]) throws -> (Int64, [Event]) {
        guard !children.contains(where: \.1.hasServerValues) else {
            return try localUpdate(path, children.map { ($0.0, try $0.1.node()) })
        }
        try checkUsable()
        try checkSize(bytes: children.reduce(0) { $0 + $1.1.bytes.count })
        let (payload, ranges) = RecordCodec.localUpdate(path: path, encoded: children, time: serverTime)
        let lsn = try append(.localUpdate, payload)
        let stored = zip(children, ranges).map { child, range in
            StoredChild(path: child.0, ref: ref(lsn, range), firstByte: child.1.bytes.first)
        }
        let events = syncTree.applyUserMerge(path, writeID: lsn, stored: stored) {
            CompoundWrite(children.map { ($0.0, (try? $0.1.node()) ?? .empty) })
        }
        return (lsn, events)
    }

    // MARK: Server data

    /// The server's whole value at `path`. With a `tag`, it is meant for that query only.
    func serverPut(_ path: Path, _ node: Node, tag: Int? = nil) throws -> [Event] {
        try checkUsable()
        // Data for a query no longer listened to (its listen ended while the data was on the
        // way) is a window of the location, not the location: it must not be stored as that.
        if let tag, syncTree.query(forTag: tag) == nil { return [] }
        if let tag, let query = syncTree.query(forTag: tag), !query.loadsAllData, query.path == path {
            // A filtered query's data: its children are complete, the location is not.
            var children: [(Path, Node)] = []
            node.forEachChild { k, n in children.append((Path(keys: [k]), n)) }
            try storeServerMerge(path, children)
            return syncTree.applyTaggedOverwrite(path, node, tag: tag)
        }
        let (payload, range) = RecordCodec.serverPut(path: path, value: node)
        let lsn = try append(.serverPut, payload)
        server.set(.stored(ref(lsn, range)), empty: node.isEmpty, at: path)
        if let tag { return syncTree.applyTaggedOverwrite(path, node, tag: tag) }
        return syncTree.applyServerOverwrite(path, node)
    }

    /// The server's new values for some children (paths relative to `path`) of `path`.
    func serverMerge(_ path: Path, _ children: [(Path, Node)], tag: Int? = nil) throws -> [Event] {
        try checkUsable()
        if let tag, syncTree.query(forTag: tag) == nil { return [] }  // (as in serverPut)
        try storeServerMerge(path, children)
        let merge = CompoundWrite(children)
        if let tag { return syncTree.applyTaggedMerge(path, merge, tag: tag) }
        return syncTree.applyServerMerge(path, merge)
    }

    private func storeServerMerge(_ path: Path, _ children: [(Path, Node)]) throws {
        let (payload, ranges) = RecordCodec.serverMerge(path: path, children: children)
        let lsn = try append(.serverMerge, payload)
        for ((p, n), (_, r)) in zip(children, ranges) {
            server.set(.stored(ref(lsn, r)), empty: n.isEmpty, at: path.child(p))
        }
    }

    /// The server acknowledged a local write (or, with `revert`, rejected it), in any order:
    /// one record per write (kind 5), O(pending writes) per call. Acknowledgements in write
    /// order go through ``acknowledge(through:rejections:)`` instead (the sync cursor).
    /// Returns the events and the record's LSN (0 when nothing was written).
    func acknowledge(_ writeID: Int64, revert: Bool) throws -> ([Event], Int64) {
        try checkUsable()
        guard let write = writeTree.write(writeID) else { return ([], 0) }
        // Where a listen keeps the data up to date, the server's own update is the truth;
        // elsewhere the acknowledged value is the best knowledge of the server's data.
        let applied = !revert && write.visible && !syncTree.hasCompleteView(covering: write.path)
        let values = applied ? writeValues(write.writeID) : []
        let lsn = try append(.ack, RecordCodec.ack(writeID: writeID, revert: revert, applied: applied))
        for (p, h, empty) in values { server.set(h, empty: empty, at: p) }
        let events = showAcknowledgedValues(values.map(\.0)) + syncTree.ackUserWrite(writeID, revert: revert)
        ledger.settle(writeID, recordLSN: lsn,
               revert ? DatabaseError(.writeRejected, "the server rejected write \(writeID); it was reverted locally") : nil)
        return (events, lsn)
    }

    /// A server listen completed: its data is no longer just from the cache.
    func listenComplete(_ path: Path, tag: Int? = nil) -> [Event] {
        if let tag {
            guard let query = syncTree.query(forTag: tag) else { return [] }
            serverStatus.listenCompleted(at: path, query: query)
            return syncTree.applyTaggedListenComplete(path, tag: tag)
        }
        serverStatus.listenCompleted(at: path)
        return syncTree.applyListenComplete(path)
    }

    // MARK: Replay

    /// Applies one record from the log, without views (there are none while opening).
    func replay(kind: UInt8, lsn: Int64, payload: UnsafeRawBufferPointer) throws {
        try whileReplaying(lsn: UInt64(lsn), kind: kind, payload: payload) {
            try apply(replayed: try RecordCodec.summarize(kind: kind, payload), lsn: lsn, payload: payload)
        }
    }

    private func apply(replayed s: RecordSummary, lsn: Int64, payload: UnsafeRawBufferPointer) throws {
        switch s.kind {
        case .localSet:
            let range = s.values[0].range
            writeTree.addOverwrite(s.path, .empty, writeID: lsn, visible: !s.hidden, ref: ref(lsn, range),
                                   empty: Engine.isEmptyValue(payload, range), firstByte: Engine.firstByte(payload, range))
        case .localUpdate:
            writeTree.addMerge(s.path, writeID: lsn, stored: s.values.map {
                StoredChild(path: $0.path, ref: ref(lsn, $0.range), firstByte: Engine.firstByte(payload, $0.range))
            })
        case .serverPut:
            let range = s.values[0].range
            server.set(.stored(ref(lsn, range)), empty: Engine.isEmptyValue(payload, range), at: s.path, firstByte: Engine.firstByte(payload, range))
        case .serverMerge:
            for v in s.values {
                server.set(.stored(ref(lsn, v.range)), empty: Engine.isEmptyValue(payload, v.range), at: s.path.child(v.path),
                           firstByte: Engine.firstByte(payload, v.range))
            }
        case .serverRestate:
            for v in s.values {
                if v.range.isEmpty {
                    server.restate(.stored(.emptyValue), empty: true, at: v.path)
                } else {
                    server.restate(.stored(ref(lsn, v.range)), empty: Engine.isEmptyValue(payload, v.range), at: v.path)
                }
            }
        case .ack:
            if s.appliedToServerCache, writeTree.pending.index(of: s.ackedWrite) != nil {
                for (p, h, empty) in writeValues(s.ackedWrite) { server.set(h, empty: empty, at: p) }
            }
            _ = writeTree.removeWrite(s.ackedWrite)
            if s.revert { ledger.noteRejection(s.ackedWrite, DatabaseError(.writeRejected, "the server rejected write \(s.ackedWrite); it was reverted locally"), bounded: false) }
        case .ackCursor:
            replayCursor(through: s.ackedWrite, notApplied: s.ids)
        case .rejection:
            if writeTree.pending.index(of: s.ackedWrite) != nil { _ = writeTree.removeWrite(s.ackedWrite) }
            ledger.noteRejected(s.ackedWrite, recordLSN: UInt64(lsn))
        case .clearRejected:
            ledger.clearRejected(s.ids)
        case .serverEvict:
            dropServerEntries(below: s.cutoff)
        case .pin:
            setPinned(s.path, s.pinned)
        }
    }
}

extension Engine {
    // MARK: An eviction's effect (its record, live and in replay)

    /// Drops every stored server-cache entry whose value lies in a record below `cutoff`
    /// (an eviction's effect; entries restated above the cutoff stay), and the markers above a
    /// dropped entry (a marker says "empty, with the entries below on top": without one of
    /// those it would read as a value the server does not have). Returns how many entries were
    /// dropped: that data is now "not cached".
    @discardableResult
    func dropServerEntries(below cutoff: UInt64) -> Int {
        var keys: [[UInt8]] = []
        let tracking = server.markerCount > 0
        let n = server.removeEntries { k, e in
            let drop = !e.isInline && !e.isMarker && e.ref.lsn < cutoff
            if drop && tracking { keys.append(Array(k)) }
            return drop
        }
        return n + dropMarkers(above: keys)
    }

    /// Drops the markers above any of the entries whose keys are given; returns how many.
    func dropMarkers(above keys: [[UInt8]]) -> Int {
        guard server.markerCount > 0, !keys.isEmpty else { return 0 }
        var doomed = Set<[UInt8]>()
        for key in keys {
            if let e = server.index.get([UInt8]()), e.isMarker { doomed.insert([]) }
            for i in key.indices.dropLast() where key[i] == 0 {
                let prefix = Array(key[...i])
                if let e = server.index.get(prefix), e.isMarker { doomed.insert(prefix) }
            }
        }
        for p in doomed { server.removeEntryOnly(p) }
        return doomed.count
    }
}

extension Engine: DataModel {
    /// ``replay(kind:lsn:payload:)`` with the log's unsigned LSN (the shared layer's replay).
    func replay(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) throws {
        try replay(kind: kind, lsn: Int64(lsn), payload: payload)
    }
}
