@_spi(Testing) import FerryLog
import Synchronization

/// What ``Database/compact()`` did.
public struct CompactionReport: Sendable, Equatable {
    /// The segment files deleted, oldest first.
    public var deletedSegments: [String] = []
    /// Server-cache entries carried forward (restated in new records): those whose values lay in
    /// those segments, and every null that stands for a write folded elsewhere (see
    /// ``Database/restateServerEntries(below:_:keeping:)``).
    public var restatedEntries = 0
    /// Bytes of the log's segment files before the compaction and after it.
    public var segmentBytesBefore: Int64 = 0
    public var segmentBytesAfter: Int64 = 0

    public init() {}
}

extension EngineHost {
    /// Compacts once the upkeep's job under way (and those asked before) ended; a memory-only
    /// store has nothing to compact.
    func compactAfterOtherJobs() async throws -> CompactionReport {
        guard let log else { return CompactionReport() }
        return try await maintenance.run { try await compactNow(log) }
    }

    /// Starts a compaction in the background when enough acknowledged segments have gathered
    /// and none is scheduled. A compaction that deleted segments checks again when it ends:
    /// acknowledgements that arrived while it ran (and found it scheduled) are not left waiting
    /// for the next.
    func compactIfDue() {
        guard let log, let threshold = upkeep.compactionSegments else { return }
        guard let frontier = try? acknowledgedFrontier(log) else { return }
        let due = log.segments.prefix { $0.sealed && $0.nextLSN.rawValue <= frontier }.count >= threshold
        guard due else { return }
        maintenance.schedule(.compaction) { [self] in
            do {
                if try await !compactAfterOtherJobs().deletedSegments.isEmpty { return { [self] in compactIfDue() } }
            } catch let e as DatabaseError where e.code == .closed {
                // closed meanwhile: nothing to do
            } catch {
                upkeep.logger.warning("automatic compaction failed: \(error)")
            }
            return nil
        }
    }

    /// The LSN below which every local write is acknowledged (the oldest pending write's id, or
    /// the end of the log when none is pending).
    func acknowledgedFrontier(_ log: WriteAheadLog) throws -> UInt64 {
        try withEngine { e in
            try e.checkUsable()
            return e.writeTree.pending.firstID.map { UInt64($0) } ?? log.nextLSN.rawValue
        }
    }

    func compactNow(_ log: WriteAheadLog) async throws -> CompactionReport {
        let started = ContinuousClock.now
        var report = CompactionReport()
        report.segmentBytesBefore = log.segments.reduce(0) { $0 + $1.size }
        do {
            // The segment being written joins the compaction when it holds no pending write.
            if activeSegmentIsAcknowledged(log) { try await log.roll() }
            let frontier = try acknowledgedFrontier(log)
            let victims = log.segments.prefix { $0.sealed && $0.nextLSN.rawValue <= frontier }
            guard let cutoff = victims.last?.nextLSN.rawValue else {
                report.segmentBytesAfter = report.segmentBytesBefore
                return report
            }
            report.restatedEntries = try restateServerEntries(below: cutoff, log)
            CrashPoint.hit("compaction.afterRestate")
            try carrySyncStateForward(below: cutoff)
            try await log.sync()
            CrashPoint.hit("compaction.afterSync")
            try await writeCheckpoint(log)
            CrashPoint.hit("compaction.afterCheckpoint")
            report.deletedSegments = try await log.deleteSegments(before: LSN(cutoff))
            CrashPoint.hit("compaction.afterDelete")
        } catch {
            throw maintenanceFailure("compaction", error)
        }
        report.segmentBytesAfter = log.segments.reduce(0) { $0 + $1.size }
        if !report.deletedSegments.isEmpty {
            let run = MaintenanceRun(bytesFreed: report.segmentBytesBefore - report.segmentBytesAfter,
                                     duration: ContinuousClock.now - started, segmentsDeleted: report.deletedSegments.count,
                                     entriesKept: report.restatedEntries)
            maintenance.accounting.withLock { $0.lastCompaction = run }
        }
        upkeep.logger.debug("compacted \(report.deletedSegments.count) segment(s), restating \(report.restatedEntries) entries")
        return report
    }

    /// Whether the segment being written holds records and no write is pending (rolling it
    /// then lets the compaction take it too).
    private func activeSegmentIsAcknowledged(_ log: WriteAheadLog) -> Bool {
        guard let frontier = try? acknowledgedFrontier(log), let active = log.segments.last else { return false }
        return log.writtenLSN > active.firstLSN && frontier >= log.nextLSN.rawValue
    }

    /// Restates, at the head of the log, every server-cache entry whose value lies below
    /// `cutoff`, every folded null above it (``LayeredEntry/isFoldedNull``, as a null), and
    /// every marker; returns how many entries it restated.
    ///
    /// Values are read outside the lock, a chunk at a time in log order; each chunk is then
    /// restated under the lock, entry by entry only if the entry is still the one read (a
    /// newer write may have replaced it meanwhile). Markers are restated last, under the lock,
    /// as they are then. With `keeping`, only the entries at the paths it accepts are restated
    /// (eviction's rule); markers always are.
    func restateServerEntries(below cutoff: UInt64, _ log: WriteAheadLog, keeping: ((Path) -> Bool)? = nil) throws -> Int {
        let snapshot = withEngine { $0.server.index }
        var candidates: [(key: [UInt8], entry: LayeredEntry)] = []
        snapshot.forEach(withPrefix: []) { k, e in
            guard !e.isInline && !e.isMarker else { return }
            // Folded nulls above the cutoff too: replaying the kept records before the
            // restatements may not give them (a removal moved up to the node it emptied, a
            // priority left out — see LayeredIndex.set), so they are stated as they are.
            if e.ref.lsn < cutoff ? (keeping?(PathKey.decode(k)) ?? true) : e.isFoldedNull {
                candidates.append((Array(k), e))
            }
        }
        candidates.sort { ($0.entry.ref.lsn, $0.entry.ref.offset) < ($1.entry.ref.lsn, $1.entry.ref.offset) }
        var restated = 0
        var start = 0
        let chunkBytes = 8 << 20
        while start < candidates.count {
            // Read a chunk's values.
            var arena: [UInt8] = []
            var ranges: [Range<Int>] = []
            var end = start
            while end < candidates.count && arena.count < chunkBytes {
                let ref = candidates[end].entry.ref
                if candidates[end].entry.isEmpty {  // (a null: a folded one has no bytes)
                    arena.append(ValueCodec.Tag.empty.rawValue)
                    ranges.append(arena.count - 1..<arena.count)
                    end += 1
                    continue
                }
                try log.withRecord(at: LSN(ref.lsn)) { r in
                    let s = Int(ref.offset), e = s + Int(ref.length)
                    guard e <= r.payload.count else { throw ByteReader.damaged("a value reference past the end of record \(ref.lsn)") }
                    let a = arena.count
                    arena.append(contentsOf: UnsafeRawBufferPointer(rebasing: r.payload[s..<e]))
                    ranges.append(a..<arena.count)
                }
                end += 1
            }
            let last = end == candidates.count
            restated += try withEngine { e -> Int in
                try e.checkUsable()
                var restater = Restater()
                try arena.withUnsafeBytes { values in
                    for i in start..<end where e.server.index.get(candidates[i].key) == candidates[i].entry {
                        let path = PathKey.decode(candidates[i].key)
                        try restater.add(path, UnsafeRawBufferPointer(rebasing: values[ranges[i - start]]), e)
                    }
                }
                if last && e.server.markerCount > 0 {
                    var markers: [Path] = []
                    e.server.forEach { k, entry in if entry.isMarker { markers.append(PathKey.decode(k)) } }
                    for p in markers { try restater.add(p, nil, e) }
                }
                try restater.flush(e)
                return restater.count
            }
            start = end
        }
        return restated
    }
}

extension EngineHost {
    /// The error a failed checkpoint or compaction throws. When the step that failed stopped
    /// the log (``FerryLog/LogError/Code/failed``), it becomes the database's failure too, so
    /// that every later write throws it — even when no one awaited the maintenance (an
    /// automatic compaction only logs its error).
    func maintenanceFailure(_ what: String, _ error: any Error) -> DatabaseError {
        if let e = error as? DatabaseError { return e }
        let e = DatabaseError(.storage, "\(what) failed: \(error)", underlying: error as? LogError)
        if (error as? LogError)?.code == .failed {
            withEngine { $0.stop(failing: e) }  // (observers end now: no operation of the app may come to notice it)
        }
        return e
    }

    /// Restates the sync cursor at the head of the log, and copies there the records of rejected
    /// writes kept for the app that lie below `cutoff` (the same payload: replaying the copy
    /// points the list at it), and the `keepSynced` pins.
    func carrySyncStateForward(below cutoff: UInt64) throws {
        try withEngine { e in
            // The cursor too: its records may all lie in the segments about to go.
            if e.ledger.ackedThrough > 0 {
                _ = try e.append(.ackCursor, RecordCodec.ackCursor(through: e.ledger.ackedThrough, notApplied: []))
            }
            try e.restatePins()
            for (_, lsn) in e.ledger.rejected.sorted(by: { $0.key < $1.key }) where lsn < cutoff {
                let (kind, payload) = try e.withPayload(lsn) { k, p in (k, Array(p)) }
                let copy = try e.append(.rejection, payload)
                try payload.withUnsafeBytes { try e.replay(kind: kind, lsn: copy, payload: $0) }
            }
        }
    }
}

/// Builds ``RecordKind/serverRestate`` records under the engine's lock; each is applied, once
/// appended, by replaying it (so the entries then refer to the new record).
struct Restater {
    var w = ByteWriter()
    var count = 0
    static let recordTarget = 256 << 10

    mutating func add(_ path: Path, _ value: UnsafeRawBufferPointer?, _ e: Engine) throws {
        RecordCodec.appendRestated(path: path, value: value, to: &w)
        count += 1
        if w.count >= Self.recordTarget { try flush(e) }
    }

    mutating func flush(_ e: Engine) throws {
        guard w.count > 0 else { return }
        let lsn = try e.append(.serverRestate, w.bytes)
        try w.bytes.withUnsafeBytes { try e.replay(kind: RecordKind.serverRestate.rawValue, lsn: lsn, payload: $0) }
        w = ByteWriter()
    }
}
