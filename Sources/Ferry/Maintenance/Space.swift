@_spi(Testing) import FerryLog
import Logging
import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// How much disk the cache may use (``DatabaseOptions/cacheSizeBytes``): a number of bytes, or
/// no limit. As Firebase's setting, with its default (10 MB) and minimum (1 MB) — but here the
/// limit is kept, not advised: see ``Database/statistics``.
public struct CacheSize: Sendable, Hashable, CustomStringConvertible {
    /// The limit in bytes; nil for no limit.
    public let limit: Int?

    /// At most `bytes` bytes on disk (segments and checkpoint), at least ``minimumBytes``
    /// (checked when the database opens).
    public static func bytes(_ bytes: Int) -> CacheSize { CacheSize(limit: bytes) }
    /// No limit: server data is kept until compaction finds it superseded.
    public static let unlimited = CacheSize(limit: nil)
    /// The Realtime Database's default: 10 MB.
    public static let defaultBytes = 10 << 20
    /// The smallest limit accepted: 1 MB.
    public static let minimumBytes = 1 << 20
    /// The default limit, ``defaultBytes``.
    public static let `default` = CacheSize.bytes(defaultBytes)

    /// "N bytes", or "unlimited".
    public var description: String { limit.map { "\($0) bytes" } ?? "unlimited" }

    /// Throws when the limit is below the minimum.
    func validate() throws {
        if let limit, limit < Self.minimumBytes {
            throw DatabaseError(.invalidData, "a cache size of \(limit) bytes is below the minimum of \(Self.minimumBytes) bytes (1 MB); use at least that, or .unlimited")
        }
    }
}

/// When the database writes a checkpoint by itself (``DatabaseOptions/checkpointPolicy``): after
/// this many records, or this many bytes of records, since the last one — so that an app that
/// runs for hours does not replay hours of log after a crash.
public struct CheckpointPolicy: Sendable, Hashable {
    /// Records since the last checkpoint (nil: no limit by count).
    public var records: Int?
    /// Payload bytes of the records since the last checkpoint (nil: no limit by size).
    public var bytes: Int?

    /// A checkpoint after `records` records or `bytes` bytes since the last one, whichever
    /// comes first. The defaults: 100,000 records, 64 MiB.
    public init(records: Int? = 100_000, bytes: Int? = 64 << 20) {
        self.records = records
        self.bytes = bytes
    }
}

/// What the upkeep needs of a database's options, read once at its open.
struct UpkeepSettings: Sendable {
    /// The cache limit in bytes (``DatabaseOptions/cacheSizeBytes``), nil for none.
    var cacheLimit: Int?
    /// The segment size in use (``DatabaseOptions/effectiveSegmentSize``).
    var segmentSize: Int
    var checkpointPolicy: CheckpointPolicy?
    /// Compact once this many acknowledged segments gathered (nil: only when asked).
    var compactionSegments: Int?
    /// The checkpoint format written.
    var checkpointFormat: UInt16
    var logger: Logger
}

/// What a store holds and how it uses its space (``Database/statistics``; `ferry-dump stats`).
public struct StoreStatistics: Sendable, Equatable, Codable {
    /// Bytes of the log's segment files: their frames. (While the store is open, the newest
    /// file also holds zeros grown ahead of the writes — 1 MiB at most, or after a crash up to
    /// a segment, which a cache limit keeps to an eighth of it — cut off at a roll or a close.)
    public var segmentBytes: Int64 = 0
    /// Bytes of the checkpoint file.
    public var checkpointBytes: Int64 = 0
    /// Segments and checkpoint: what the cache size limit bounds.
    public var bytesOnDisk: Int64 { segmentBytes + checkpointBytes }
    /// The log's segment files.
    public var segments = 0
    /// The cache size limit in bytes (nil: unlimited).
    public var cacheLimit: Int?
    /// By how much the store is over its limit because what it must not drop — pending
    /// writes, and the data pinned or listened to — does not fit (0 when within it).
    public var overLimitBytes: Int64 = 0
    /// Local writes waiting for the server.
    public var pendingWrites = 0
    /// Bytes of their records.
    public var pendingWriteBytes: Int64 = 0
    /// Age of the oldest, in seconds (nil when none is pending).
    public var oldestPendingWriteAge: Double?
    /// Writes the server rejected, kept until the app clears them.
    public var rejectedWrites = 0
    /// Server-cache entries (paths whose server data is cached, each with all below it).
    public var cachedPaths = 0
    /// Paths pinned with `keepSynced(true)`.
    public var pins: [String] = []
    /// Paths under active listeners (kept by eviction, like pins).
    public var listenedPaths = 0
    /// The last compaction since the database was opened (nil: none yet).
    public var lastCompaction: MaintenanceRun?
    /// The last eviction since the database was opened (nil: none yet).
    public var lastEviction: MaintenanceRun?
    /// A memory-only database: the records it keeps in memory, and their bytes (0 for a
    /// stored one, whose records are in its files).
    public var memoryRecords = 0
    public var memoryRecordBytes: Int64 = 0

    /// Empty statistics.
    public init() {}

    enum CodingKeys: String, CodingKey {
        case segmentBytes, checkpointBytes, segments, cacheLimit, overLimitBytes, pendingWrites, pendingWriteBytes,
             oldestPendingWriteAge, rejectedWrites, cachedPaths, pins, listenedPaths, lastCompaction, lastEviction,
             memoryRecords, memoryRecordBytes
    }
}

/// The upkeep of a stored or memory-only database: the facts it is told, and the checkpoints,
/// compactions and evictions they make due, run under the one ``Maintenance`` owner. It works on
/// an ``EngineHost`` (the `Database`), so that this folder does not depend on the public types.
extension EngineHost {
    /// The size of the newest checkpoint file (looked up once, then kept up to date).
    func checkpointBytes(_ log: WriteAheadLog) -> Int64 {
        if let known = maintenance.accounting.withLock({ $0.checkpointBytes }) { return known }
        let names = (try? log.sideFiles(withPrefix: Checkpoint.prefix)) ?? []
        let bytes = names.filter { Checkpoint.lsn(of: $0) != nil }.reduce(Int64(0)) { $0 + fileSize(log.path + "/" + $1) }
        maintenance.accounting.withLock { $0.checkpointBytes = bytes }
        return bytes
    }

    /// Called once a checkpoint file is in place.
    func noteCheckpointWritten(_ log: WriteAheadLog, name: String) {
        let bytes = fileSize(log.path + "/" + name)
        maintenance.accounting.withLock { $0.checkpointBytes = bytes }
    }

    /// Segments and checkpoint.
    func bytesOnDisk(_ log: WriteAheadLog) -> Int64 {
        log.segmentBytes + checkpointBytes(log)
    }

    // MARK: Facts the upkeep is told

    /// A local write was made and waited for (`facts`: the engine's, read by the write in its
    /// own hold of the lock): see ``keepWithinLimit(memoryBytes:facts:)``.
    @inline(__always)
    func notedWrite(_ facts: SpaceFacts) async {
        await keepWithinLimit(facts: facts)
    }

    /// A local write was made by a form that returns at once: a checkpoint or an eviction that
    /// is due starts in the background, and the writer never waits.
    func notedWriteNow(_ facts: SpaceFacts) {
        checkpointIfDue(since: facts.sinceCheckpoint)
        guard let limit = upkeep.cacheLimit.map(Int64.init), let log,
              bytesOnDisk(log) > limit - 2 * Int64(upkeep.segmentSize), !evictionIsFutile(facts) else { return }
        scheduleEviction(log)
    }

    /// Server data arrived: `bytes` of it, for a memory-only store, whose limit applies to the
    /// server data it receives (a stored one passes 0: its files are what count).
    func notedServerData(bytes: Int) async {
        await keepWithinLimit(memoryBytes: bytes)
    }

    /// The server answered writes: the segments it has acknowledged may be compacted, and
    /// what the answers stored counts against the limit.
    func notedAnswers() async {
        compactIfDue()
        await keepWithinLimit()
    }

    // MARK: Keeping within the limit

    /// Starts an eviction in the background when the store is within two segments of its limit
    /// (so that it rarely reaches it), and waits for one when it is over the limit (so that
    /// when the write's `await` returns, the store is within the limit plus one segment — the
    /// segment being written, and what a background eviction restates before it deletes —
    /// unless what it must keep is larger); starts a checkpoint when the policy says one is due.
    /// `memoryBytes`: for a memory-only store, the size of the server data received.
    /// `facts`: the engine's, read by a write in its own hold of the lock (else read here).
    private func keepWithinLimit(memoryBytes: Int = 0, facts: SpaceFacts? = nil) async {
        defer { checkpointIfDue(since: facts?.sinceCheckpoint) }
        guard let limit = upkeep.cacheLimit.map(Int64.init) else { return }
        guard let log else {
            // (A memory-only store is made without a check: a limit below the minimum is raised.)
            evictFromMemoryIfDue(limit: max(limit, Int64(CacheSize.minimumBytes)), received: memoryBytes)
            return
        }
        let bytes = bytesOnDisk(log)
        let segment = Int64(upkeep.segmentSize)
        guard bytes > limit - 2 * segment, !evictionIsFutile(facts) else { return }
        if bytes > limit {
            do {
                _ = try await maintenance.run { try await evictNow(log) }
            } catch {
                logEvictionFailure(error)
            }
        } else {
            scheduleEviction(log)
        }
    }

    /// Whether the last eviction found nothing to drop and the oldest pending write is still
    /// the same (measured: trying again on every write over the limit cost a bulk load of
    /// pending writes 15–37% of its speed).
    private func evictionIsFutile(_ facts: SpaceFacts?) -> Bool {
        guard let futile = maintenance.accounting.withLock({ $0.futileFrontier }) else { return false }
        return (facts.map(\.firstPending) ?? withEngine { $0.writeTree.pending.firstID }) == futile
    }

    private func logEvictionFailure(_ error: any Error) {
        if let e = error as? DatabaseError, e.code == .closed { return }
        upkeep.logger.warning("eviction failed: \(error)")
    }

    private func scheduleEviction(_ log: WriteAheadLog) {
        maintenance.schedule(.eviction) { [self] in
            do {
                _ = try await maintenance.run { try await evictNow(log) }
            } catch {
                logEvictionFailure(error)
            }
            return nil
        }
    }

    private func evictFromMemoryIfDue(limit: Int64, received: Int) {
        let due = maintenance.accounting.withLock { s -> Bool in
            s.memoryBytes += received
            guard s.memoryBytes > limit else { return false }
            s.memoryBytes = 0
            return true
        }
        guard due else { return }
        let started = ContinuousClock.now
        let (dropped, freed, rebuild) = withEngine { e in
            let before = e.memoryRecords.bytes
            let dropped = e.dropUnkeptEntries()
            if dropped > 0 { e.sweepMemory() }
            return (dropped, before - e.memoryRecords.bytes, e.takeIndexRebuildsDue())
        }
        if rebuild { scheduleIndexRebuilds() }
        maintenance.accounting.withLock {
            $0.lastEviction = MaintenanceRun(bytesFreed: Int64(freed), duration: ContinuousClock.now - started, segmentsDeleted: 0,
                                             entriesKept: 0, entriesEvicted: dropped)
        }
    }

    /// Evicts now if the store is within two segments of its limit or over it (the caller holds
    /// the maintenance lock): the
    /// oldest segments holding no pending write go, until the store is expected to be within
    /// the limit less three segments. Server data in them under a listener or a pin is restated
    /// at the head of the log first (as compaction does); the rest is dropped from the cache
    /// by a ``RecordKind/serverEvict`` record. Then the records are made durable, a checkpoint
    /// is written, and only then are the segments deleted — a crash at any step opens to the
    /// view before the eviction or the one after it.
    ///
    /// Returns what it did, or nil when there was nothing to do (within the limit, or nothing
    /// evictable: then ``StoreStatistics/overLimitBytes`` says by how much the store is over).
    @discardableResult
    func evictNow(_ log: WriteAheadLog) async throws -> MaintenanceRun? {
        guard let limit = upkeep.cacheLimit.map(Int64.init) else { return nil }
        let started = ContinuousClock.now
        let before = bytesOnDisk(log)
        guard before > limit - 2 * Int64(upkeep.segmentSize) else { return nil }
        do {
            let frontier = try acknowledgedFrontier(log)
            let candidates = log.segments.prefix { $0.sealed && $0.nextLSN.rawValue <= frontier }
            let target = limit - 3 * Int64(upkeep.segmentSize)
            var projected = before
            var cutoff: UInt64?
            var victims = 0
            for segment in candidates where projected > target {
                projected -= segment.size
                cutoff = segment.nextLSN.rawValue
                victims += 1
            }
            guard let cutoff else {
                let oldest = withEngine { $0.writeTree.pending.firstID }
                maintenance.accounting.withLock { $0.futileFrontier = oldest }
                return nil
            }
            maintenance.accounting.withLock { $0.futileFrontier = nil }
            CrashPoint.hit("eviction.start")
            let kept = withEngine { $0.keptPaths }
            var restated = try restateServerEntries(below: cutoff, log, keeping: { Engine.isKept($0, by: kept) })
            CrashPoint.hit("eviction.afterRestate")
            try carrySyncStateForward(below: cutoff)
            // What to drop is looked for outside the lock, in a snapshot (copied on write).
            let snapshot = withEngine { $0.server.index }
            var found: [(key: [UInt8], entry: LayeredEntry)] = []
            snapshot.forEach(withPrefix: []) { k, e in
                if !e.isInline && !e.isMarker && e.ref.lsn < cutoff { found.append((Array(k), e)) }
            }
            try withEngine { e in
                try e.checkUsable()
                // Listeners or pins added since the values were read: restate theirs here.
                let nowKept = e.keptPaths
                if Set(nowKept) != Set(kept) {
                    var late: [(Path, [UInt8])] = []
                    e.server.forEach { k, entry in
                        guard !entry.isInline && !entry.isMarker && entry.ref.lsn < cutoff else { return }
                        let p = PathKey.decode(k)
                        guard Engine.isKept(p, by: nowKept) else { return }
                        if entry.isEmpty {
                            late.append((p, [ValueCodec.Tag.empty.rawValue]))  // (a folded null has no bytes)
                        } else if let bytes = try? e.withValue(entry.ref, { Array($0) }) {
                            late.append((p, bytes))
                        }
                    }
                    var restater = Restater()
                    for (p, bytes) in late { try bytes.withUnsafeBytes { try restater.add(p, $0, e) } }
                    try restater.flush(e)
                    restated += restater.count
                }
                var parts = Restater()
                try e.restateKeptParts(below: cutoff, &parts)
                restated += parts.count
                _ = try e.append(.serverEvict, RecordCodec.serverEvict(cutoff: cutoff))
            }
            // The record's effect, in slices so that writers wait at most a slice (~2 ms).
            var droppedKeys: [[UInt8]] = []
            var start = 0
            while start < found.count {
                let end = min(start + 2048, found.count)
                withEngine { $0.dropServerEntries(found[start..<end], into: &droppedKeys) }
                start = end
            }
            let (markers, rebuild) = withEngine { e in (e.dropMarkers(above: droppedKeys), e.takeIndexRebuildsDue()) }
            if rebuild { scheduleIndexRebuilds() }
            let dropped = droppedKeys.count + markers
            try await log.sync()
            CrashPoint.hit("eviction.afterEvictRecord")
            try await writeCheckpoint(log)
            CrashPoint.hit("eviction.afterCheckpoint")
            let deleted = try await log.deleteSegments(before: LSN(cutoff))
            CrashPoint.hit("eviction.afterDelete")
            let after = bytesOnDisk(log)
            let run = MaintenanceRun(bytesFreed: before - after, duration: ContinuousClock.now - started,
                                     segmentsDeleted: deleted.count, entriesKept: restated, entriesEvicted: dropped)
            maintenance.accounting.withLock { $0.lastEviction = run }
            upkeep.logger.debug("evicted \(deleted.count) segment(s): \(dropped) entries dropped, \(restated) kept")
            return run
        } catch {
            throw maintenanceFailure("eviction", error)
        }
    }

    // MARK: Checkpoints by policy

    /// Starts a checkpoint in the background when the policy says one is due.
    /// `since`: the engine's count since the last checkpoint, when the caller read it under
    /// the lock already.
    func checkpointIfDue(since known: (records: Int, bytes: Int)? = nil) {
        guard log != nil, let policy = upkeep.checkpointPolicy else { return }
        func due(_ since: (records: Int, bytes: Int)) -> Bool {
            (policy.records.map { since.records >= $0 } ?? false) || (policy.bytes.map { since.bytes >= $0 } ?? false)
        }
        guard due(known ?? withEngine { $0.sinceCheckpoint }) else { return }
        // (A count read by a write before it waited may predate a checkpoint that just ended:
        // read it again before starting another.)
        if known != nil, !due(withEngine { $0.sinceCheckpoint }) { return }
        maintenance.schedule(.checkpoint) { [self] in
            do {
                try await checkpointAfterOtherJobs()
            } catch let e as DatabaseError where e.code == .closed {
            } catch {
                upkeep.logger.warning("checkpoint by policy failed: \(error)")
            }
            return nil
        }
    }
}

/// What the space checks after a write need from the engine, read by the write in its own
/// hold of the engine's lock (taking the lock twice more for them, per write, was ~6% of a
/// bulk load of pending writes over the cache limit).
struct SpaceFacts {
    var sinceCheckpoint: (records: Int, bytes: Int)
    var firstPending: Int64?

    init(_ e: Engine) {
        sinceCheckpoint = e.sinceCheckpoint
        firstPending = e.writeTree.pending.firstID
    }
}

extension Engine {
    /// The engine's part of ``Database/statistics``.
    func fillStatistics(_ s: inout StoreStatistics) {
        let pending = writeTree.pending
        s.pendingWrites = pending.count
        var bytes: Int64 = 0
        var oldest: Int64?
        for i in 0..<pending.count {
            let id = pending.id(at: i)
            _ = try? withPayload(UInt64(id)) { kind, payload in
                bytes += Int64(payload.count)
                if oldest == nil, let summary = try? RecordCodec.summarize(kind: kind, payload) { oldest = summary.time }
            }
        }
        s.pendingWriteBytes = bytes
        if let oldest, pending.count > 0 { s.oldestPendingWriteAge = max(0, Double(wallClockMillis() - oldest) / 1000) }
        s.rejectedWrites = ledger.rejected.count
        s.cachedPaths = server.count
        s.pins = pins.map(\.description).sorted()
        s.listenedPaths = 0
        syncTree.syncPoints.forEach { _, _ in s.listenedPaths += 1 }
        let memory = memoryRecords
        s.memoryRecords = memory.count
        s.memoryRecordBytes = Int64(memory.bytes)
    }
}

func fileSize(_ path: String) -> Int64 {
    var st = stat()
    return stat(path, &st) == 0 ? Int64(st.st_size) : 0
}

func listDirectory(_ path: String) throws -> [String] {
    guard let dir = opendir(path) else {
        if errno == ENOENT { return [] }
        throw DatabaseError(.storage, "cannot list \(path): errno \(errno)")
    }
    defer { closedir(dir) }
    var names: [String] = []
    while let entry = readdir(dir) {
        let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
            String(decoding: raw.prefix { $0 != 0 }, as: UTF8.self)
        }
        if name != "." && name != ".." { names.append(name) }
    }
    return names
}

func removeTree(_ path: String) {
    for name in (try? listDirectory(path)) ?? [] {
        let full = path + "/" + name
        if unlink(full) != 0 { removeTree(full) }
    }
    rmdir(path)
}
