import FerryLog
import Logging

/// An event with the metadata of its snapshot, ready to deliver.
struct DeliveredEvent: Sendable {
    var event: Event
    var metadata: SnapshotMetadata
}

/// Everything the database knows, guarded by the database's lock: the sync tree (views), the
/// pending writes, the server cache, the registrations, and the log they all come from.
///
/// Every change is a record: it is enqueued in the log (getting its LSN) and applied here
/// under the same lock, so the state is always the replay of the log in LSN order. Replay
/// (``replay(kind:lsn:payload:)``) applies each record to the same stores — write tree,
/// server cache, ledger, pins — without views.
///
/// Its state is sealed: each part is a `let` with its own invariants (``Registrations``,
/// ``WriteLedger``, ``ServerStatus``, the listen registry, the sync and write trees, the
/// server cache), and every other stored property is set by this file's functions only
/// (`private(set)`), which the extensions by role (applying, acknowledging, indexes, space,
/// checkpoints) call. Outside the engine, the database's functions read its state and call
/// these functions; they set none of its fields. (The parts' own state is theirs: a
/// child-value index's rebuild bookkeeping, say, is set by the engine's index functions.)
final class Engine: StoredValues, ServerCacheSource {
    /// The log, or nil for a memory-only engine (see ``records``).
    var log: WriteAheadLog? { records.log }
    /// Where the records live: the log, or memory.
    private(set) var records: RecordStore
    let logger: Logger
    let syncTree: SyncTree
    var writeTree: WriteTree { syncTree.writeTree }
    /// Complete server data by path: from server puts and merges, and acknowledged writes.
    let server = LayeredIndex()
    /// The active observers (listeners, sequences, single-event waits).
    let registrations = Registrations()
    /// Where server listens completed, and the server's clock offset.
    let serverStatus = ServerStatus()
    /// Open, closed or failed (the shared ``LifeCycle``, which FerryDocuments' stores keep too).
    private(set) var life = LifeCycle<DatabaseError>()
    /// The error that stopped the database: the first one (see ``stop(failing:)``).
    var failure: DatabaseError? { life.failure }
    /// Whether the database was closed (see ``markClosed()``).
    var closed: Bool { life.closed }
    /// The database closed or failed and its observers have not been ended yet: they are, as
    /// soon as the lock is released (``Database/withEngine(_:)``).
    var observersToEnd: Bool { life.observersToEnd }
    /// The sync cursor, the receipts waiting for answers, the rejected writes.
    let ledger = WriteLedger<DatabaseError>()
    /// The LSN the last checkpoint covers up to (records below it are in it).
    private(set) var checkpointLSN: UInt64 = 0
    /// How often a child-value index answered a limited query's window, or the child after it.
    private(set) var indexedChildLookups = 0
    /// Index rebuilds begun in the background for listeners (``Database/rebuildListenedIndexes()``; for tests).
    private(set) var backgroundIndexRebuilds = 0
    /// Paths pinned with `keepSynced(true)` (records of kind 11; see Engine+Space.swift).
    private(set) var pins: Set<Path> = []
    /// The listens the views need, for the sync layer (see Database+Sync.swift).
    let listens = ListenRegistry()
    /// The child-value indexes the options declare (see Engine+Indexes.swift).
    private(set) var childIndexes: [ChildValueIndex] = []
    /// Records and payload bytes appended since the last checkpoint (the checkpoint policy).
    var sinceCheckpoint: (records: Int, bytes: Int) { records.sinceCheckpoint }

    /// The engine's records live in `log`, or without one in memory: a memory-only database
    /// writes the same records as a stored one, and its values are read from them the same
    /// way; what no entry refers to any more is swept away (``pruneRecent()``).
    init(log: WriteAheadLog?, logger: Logger) {
        records = RecordStore(log: log)
        self.logger = logger
        syncTree = SyncTree(writeTree: WriteTree())
        server.reader = self
        writeTree.stored = self
        syncTree.serverCacheSource = self
        syncTree.listenProvider = listens
    }

    /// Keeps a record read elsewhere so that values can refer to it (a tool replaying a log
    /// into an engine without one: see ``StateReplayer``).
    func keep(lsn: UInt64, kind: UInt8, payload: [UInt8]) {
        records.keep(lsn: lsn, kind: kind, payload: payload)
    }

    // MARK: Life cycle

    /// Stops the database with `error`; the first failure is the one kept (later ones are only
    /// thrown). Every wait for a server's answer ends now, and every observer once the lock is
    /// released: the one place a failure takes effect.
    func stop(failing error: DatabaseError) {
        life.fail(error, ledger: ledger)
    }

    /// The database is closed: every wait for a server's answer ends now, and every observer
    /// once the lock is released.
    func markClosed() {
        life.close(ledger: ledger, reason: DatabaseError(.closed, "the database was closed before the server answered"))
    }

    func checkUsable() throws {
        if let failure { throw failure }
        if closed { throw DatabaseError(.closed, "the database is closed") }
    }

    // MARK: Checkpoints, pins, indexes

    /// A checkpoint covering the records below `lsn` is in place (written, or loaded at the
    /// open): the count since the last checkpoint starts again.
    func noteCheckpoint(at lsn: UInt64) {
        checkpointLSN = lsn
        records.sinceCheckpoint = (0, 0)
    }

    /// Takes a loaded checkpoint's state as the engine's: the server cache, the pending
    /// writes and their overlay, the pins, the ledger's cursor and rejections, and the sort keys
    /// of the declared child-value indexes (see `CheckpointState`).
    func install(server restoredServer: LayeredIndex, writeTree restoredWrites: WriteTree, pins restoredPins: Set<Path>,
                 ackedThrough: Int64, rejected: [Int64: UInt64], childIndexes restoredIndexes: [ChildValueIndex]) {
        server.install(restoredServer)
        writeTree.install(restoredWrites)
        pins = restoredPins
        ledger.restore(ackedThrough: ackedThrough, rejected: rejected)
        for restored in restoredIndexes {
            guard let index = childIndexes.first(where: { $0.location == restored.location && $0.child == restored.child && !$0.automatic })
            else { continue }
            index.installRestored(restored)
        }
    }

    /// Sets or clears the `keepSynced` pin at `path` (its record is written or replayed).
    func setPinned(_ path: Path, _ pinned: Bool) {
        if pinned { pins.insert(path) } else { pins.remove(path) }
    }

    /// Starts keeping `index` current: it observes the server cache and the pending writes'
    /// overlay from now on.
    func attach(_ index: ChildValueIndex) {
        index.source = self
        server.observers.append(index)
        writeTree.overlay.observers.append(index)
        childIndexes.append(index)
        writeTree.indexedChildren = self
    }

    /// Stops keeping these indexes (automatic ones no listener uses any more).
    func detach(_ unused: [ChildValueIndex]) {
        childIndexes.removeAll { index in unused.contains { $0 === index } }
        server.observers.removeAll { o in unused.contains { $0 === o } }
        writeTree.overlay.observers.removeAll { o in unused.contains { $0 === o } }
        if childIndexes.isEmpty { writeTree.indexedChildren = nil }
    }

    /// A child-value index answered a limited query's window or the child after one.
    func countIndexedLookup() { indexedChildLookups += 1 }

    /// Index rebuilds begun in the background for listeners.
    func countBackgroundRebuilds(_ n: Int) { backgroundIndexRebuilds += n }

    // MARK: Records

    /// Puts a record in the log (or, without one, in memory); returns its LSN / write id.
    func append(_ kind: RecordKind, _ payload: [UInt8]) throws -> Int64 {
        // (The sync layer reads the writes under this lock, so after this one is in the tree.)
        if kind == .localSet || kind == .localUpdate { listens.signal?.yield(.writes) }
        do {
            return Int64(try records.append(kind: kind.rawValue, payload))
        } catch {
            throw storageError(error)
        }
    }

    func storageError(_ error: any Error) -> DatabaseError {
        if let e = error as? DatabaseError { return e }
        let e = DatabaseError(.storage, "the log failed: \(error)", underlying: error as? LogError)
        if (error as? LogError)?.code == .failed { stop(failing: e) }
        return e
    }

    /// Forgets the payloads the log has written (see ``RecordStore/pruneWritten(now:)``) at
    /// once, whatever was appended since the last look (for tests); returns how many copies
    /// are then kept.
    func pruneRecentNow() -> Int {
        records.pruneWritten(now: true)
        return records.kept.count
    }

    /// After each operation: with a log, forgets the payloads it has written (now and then);
    /// in memory, once the records kept have doubled since the last sweep, forgets those
    /// nothing refers to any more (see ``liveRecords()``) — what a stored database's
    /// compaction and eviction do for its segments. (Snapshots read outside the lock hold their
    /// own copy of the records: ``freeze(onFailure:)``.)
    func pruneRecent() {
        if records.sweepIsDue { return sweepMemory() }
        records.pruneWritten()
    }

    /// In memory: forgets the records nothing refers to any more, now (after a memory-only
    /// store's eviction).
    func sweepMemory() {
        guard log == nil else { return }
        records.sweep(keeping: liveRecords())
    }

    /// The LSNs of the records a memory-only store must keep: those an entry of the server
    /// cache or of the pending writes' overlay names a value in, the pending writes' own, and
    /// those of the rejected writes the app has not cleared.
    func liveRecords() -> Set<UInt64> {
        var live = Set<UInt64>()
        live.reserveCapacity(writeTree.pending.count + server.count / 4)
        let note: (UnsafeRawBufferPointer, LayeredEntry) -> Void = { _, e in
            if !e.isInline && !e.isMarker { live.insert(e.ref.lsn) }
        }
        server.forEach(note)
        writeTree.overlay.forEach(note)
        for id in writeTree.pending.ids { live.insert(UInt64(id)) }
        for lsn in ledger.rejected.values { live.insert(lsn) }
        return live
    }

    /// Records kept in memory (without a log), and their payload bytes (for tests).
    var memoryRecords: (count: Int, bytes: Int) { records.memoryRecords }

    /// The record being replayed (its payload is valid during the replay of it only).
    private(set) var replaying: (lsn: UInt64, kind: UInt8, payload: UnsafeRawBufferPointer)?

    /// Runs `body` (the replay of one record) with the record's payload readable by its LSN.
    func whileReplaying<R>(lsn: UInt64, kind: UInt8, payload: UnsafeRawBufferPointer, _ body: () throws -> R) rethrows -> R {
        replaying = (lsn, kind, payload)
        defer { replaying = nil }
        return try body()
    }

    func withPayload<R>(_ lsn: UInt64, _ body: (UInt8, UnsafeRawBufferPointer) throws -> R) throws -> R {
        if let r = replaying, r.lsn == lsn { return try body(r.kind, r.payload) }
        // The records kept first, without a generic call into FerryStore (not specialized here).
        if let r = records.kept.find(lsn) { return try r.payload.withUnsafeBytes { try body(r.kind, $0) } }
        return try records.withLogRecord(lsn, body)
    }

    // MARK: StoredValues

    /// Calls `body` with the encoded value `ref` names (valid during the call only).
    func withValue<R>(_ ref: ValueRef, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R {
        try withPayload(ref.lsn) { _, payload in
            let start = Int(ref.offset), end = start + Int(ref.length)
            guard end <= payload.count else { throw ByteReader.damaged("a value reference past the record's end") }
            return try body(UnsafeRawBufferPointer(rebasing: payload[start..<end]))
        }
    }

    func readFailed(_ error: any Error, lsn: UInt64) { fail(error, reading: lsn) }

    func writeRecord(_ id: Int64) -> WriteRecord? {
        do {
            return try withPayload(UInt64(id)) { kind, payload in
                let s = try RecordCodec.summarize(kind: kind, payload)
                func value(_ r: Range<Int>) throws -> Node { try ValueCodec.decode(UnsafeRawBufferPointer(rebasing: payload[r])) }
                switch s.kind {
                case .localSet:
                    return WriteRecord(writeID: id, path: s.path, change: .overwrite(try value(s.values[0].range)), visible: !s.hidden)
                case .localUpdate:
                    return WriteRecord(writeID: id, path: s.path, change: .merge(CompoundWrite(try s.values.map { ($0.path, try value($0.range)) })), visible: true)
                default:
                    throw ByteReader.damaged("write \(id) is a \(s.kind) record")
                }
            }
        } catch {
            fail(error, reading: UInt64(id))
            return nil
        }
    }

    func writeValues(_ id: Int64) -> [(Path, ValueHandle, Bool)] { storedWrite(id)?.values ?? [] }

    /// The path of write `id` and where each of its values sits (paths from the root), read
    /// from its record; nil (the database failed) when it cannot be read.
    func storedWrite(_ id: Int64) -> (path: Path, values: [(Path, ValueHandle, Bool)])? {
        do {
            return try withPayload(UInt64(id)) { kind, payload in
                let s = try RecordCodec.summarize(kind: kind, payload)
                return (s.path, s.values.map {
                    (s.path.child($0.path),
                     .stored(ref(id, $0.range)),
                     Engine.isEmptyValue(payload, $0.range))
                })
            }
        } catch {
            fail(error, reading: UInt64(id))
            return nil
        }
    }

    /// Whether the encoded value at `range` is null (the empty tag alone), without decoding it.
    static func isEmptyValue(_ payload: UnsafeRawBufferPointer, _ range: Range<Int>) -> Bool {
        range.count == 1 && payload[range.lowerBound] == ValueCodec.Tag.empty.rawValue
    }

    /// The first byte of the value at `range` of a record's payload (nil for none).
    static func firstByte(_ payload: UnsafeRawBufferPointer, _ range: Range<Int>) -> UInt8? {
        range.isEmpty ? nil : payload[range.lowerBound]
    }

    /// A record a value is read from could not be read or decoded: the database stops (what it
    /// would show is not the data), and the error names the record, its segment and offset.
    private func fail(_ error: any Error, reading lsn: UInt64) {
        let place = log?.location(of: LSN(lsn))
        let e = DatabaseError(.storage, "reading record \(lsn) failed: \(error)", underlying: error,
                              lsn: lsn, file: place?.file, offset: place?.frameOffset, store: log?.path)
        logger.error("\(e)")
        stop(failing: e)
    }

    /// Why the database no longer answers (failed or closed), if it does not.
    var stopReason: DatabaseError? {
        if let failure { return failure }
        return closed ? DatabaseError(.closed, "the database is closed", store: log?.path) : nil
    }

    /// When the database has stopped: takes the end handlers of the active registrations (each
    /// is given once), to be called outside the lock.
    func takeEndedRegistrations() -> (DatabaseError, [@Sendable (DatabaseError?) -> Void])? {
        guard let reason = stopReason else { return nil }
        _ = life.takeObserversToEnd()
        let ends = registrations.takeEnds()
        return ends.isEmpty ? nil : (reason, ends)
    }

    // MARK: ServerCacheSource

    func serverCache(for query: QuerySpec) -> CacheNode {
        if let node = server.completeNode(at: query.path) {
            return CacheNode(indexed: IndexedNode(node, index: query.index), isFullyInitialized: true, isFiltered: false)
        }
        return CacheNode(indexed: IndexedNode(server.completeChildren(of: query.path), index: query.index), isFullyInitialized: false, isFiltered: false)
    }

    // MARK: Reading

    /// What a local reader sees at `path` — server data with the visible local writes on top —
    /// or nil when that is not complete.
    func visibleNode(at path: Path) -> Node? {
        writeTree.calcCompleteEventCache(path, completeServerCache: server.completeNode(at: path))
    }

    /// Whether the data at `path` is big enough to be read lazily (see ``LazyLocation``).
    func isBig(_ path: Path) -> Bool {
        LazyLocation.isBig(PathKey.encode(path), overlay: writeTree.overlay, server: server)
    }

    /// The data as it is now, for reading outside the lock (see ``FrozenData``); nil when the
    /// log cannot give a read snapshot (its files cannot be opened: then read under the lock).
    func freeze(onFailure: @escaping @Sendable (DatabaseError) -> Void) -> FrozenData? {
        let kept = records.kept
        var files: LogReadSnapshot?
        if let log {
            do {
                files = try log.readSnapshot(inspect: RecordCodec.inspector)
            } catch {
                logger.debug("reading under the lock: \(error)")
                return nil
            }
        }
        let reader = FrozenReader(recent: kept, log: files, store: log?.path, onFailure: onFailure)
        return FrozenData(overlay: writeTree.overlay, server: server, reader: reader)
    }

    /// The data as it is now, for one read that ends at once outside the lock: values come
    /// from the live log (no read snapshot is opened), and the caller reads again under the
    /// lock if the reader turns out ``FrozenReader/stale``.
    func freezeForOneRead(onFailure: @escaping @Sendable (DatabaseError) -> Void) -> FrozenData {
        let reader = FrozenReader(recent: records.kept, log: nil, live: log, store: log?.path, onFailure: onFailure)
        return FrozenData(overlay: writeTree.overlay, server: server, reader: reader)
    }

    /// A snapshot's read of a stored value failed: the database stops, as when its own does.
    func failReading(_ e: DatabaseError) {
        logger.error("\(e)")
        stop(failing: e)
    }

    /// The server's clock as far as known: the local clock plus the last known offset.
    var serverTime: Int64 { wallClockMillis() + serverStatus.timeOffset }

    func metadata(for query: QuerySpec) -> SnapshotMetadata {
        SnapshotMetadata(fromCache: !serverStatus.isLive(query), hasPendingWrites: writeTree.hasVisibleWrite(touching: query.path))
    }

    /// Adds metadata to the events of one operation, and value events for listeners that asked
    /// for metadata changes whose metadata changed without their data changing.
    func finish(_ events: [Event]) -> [DeliveredEvent] {
        var out: [DeliveredEvent] = []
        out.reserveCapacity(events.count)
        var told = Set<UInt64>()
        var cache: [QuerySpec: SnapshotMetadata] = [:]
        func md(_ q: QuerySpec) -> SnapshotMetadata {
            if let m = cache[q] { return m }
            let m = metadata(for: q)
            cache[q] = m
            return m
        }
        for e in events {
            let m = md(e.query)
            out.append(DeliveredEvent(event: e, metadata: m))
            if e.type == .value {
                registrations.told(e.registration.id, m)
                told.insert(e.registration.id)
            }
        }
        for state in registrations.all where state.registration.includeMetadataChanges && !told.contains(state.registration.id) {
            let m = md(state.query)
            guard let last = state.lastMetadata, last != m, let view = syncTree.view(for: state.query),
                  view.eventCache.isFullyInitialized else { continue }
            let event = Event(registration: state.registration, query: state.query, change: .value(view.eventCache.node),
                              eventCache: view.eventCache.indexed)
            out.append(DeliveredEvent(event: event, metadata: m))
            registrations.told(state.registration.id, m)
        }
        return out
    }
}

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
