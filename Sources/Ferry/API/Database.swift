import Dispatch
@_spi(Testing) import FerryLog
import Logging
import Synchronization

/// How a ``Database`` stores and delivers.
public struct DatabaseOptions: Sendable {
    /// When a write's `await` returns: after `fdatasync` (``Durability/fsync``, the default),
    /// or at once with periodic or no syncing. See ``FerryLog/Durability``.
    public var durability: Durability = .fsync
    /// The log's segment size. Default 8 MiB.
    public var segmentSize: Int = 8 << 20
    /// What an open does with a damaged log. Default: refuse, naming file and offset.
    public var recovery: RecoveryMode = .strict
    /// Where listeners are called. Nil (the default): on the thread that raised the events,
    /// one at a time, in order. A serial queue (the main queue, say): there, in order.
    public var callbackQueue: DispatchQueue?
    /// Write a checkpoint when closing, so that the next open replays nothing. Default true.
    public var checkpointOnClose = true
    /// The checkpoint format written: the current one; tests write format 5, which every
    /// build must still read.
    var checkpointFormat = Checkpoint.version
    /// Compact by itself once this many segments hold only acknowledged writes (checked after
    /// each acknowledgement; see ``Database/compact()``). Nil: only when asked. Default 4.
    public var compactionSegments: Int? = 4
    /// How much disk the store may use — segments and checkpoint — before the oldest server
    /// data nothing listens to or pins is evicted (see ``Database/statistics``). Default 10 MB,
    /// the Realtime Database's; at least 1 MB; or ``CacheSize/unlimited``. With a limit,
    /// segments are at most an eighth of it. A memory-only store applies it to the server data
    /// it receives: past that much since its last eviction, it drops what is not kept (and the
    /// records that held it).
    public var cacheSizeBytes: CacheSize = .default
    /// When to write a checkpoint by itself (nil: only on close and when asked). Default:
    /// after 100,000 records or 64 MiB since the last one.
    public var checkpointPolicy: CheckpointPolicy? = CheckpointPolicy()
    /// Where the database logs recoveries and failures.
    public var logger = Logger(label: "ferry")
    /// Children kept ordered by a child's value, as the Realtime Database's `.indexOn` rule
    /// does on a server: a ranged-free limited query ordered by that child at that location —
    /// `queryOrdered(byChild:).queryLimited(toFirst:/toLast:)` — read from the cache with
    /// ``DatabaseQuery/getData()`` or ``DatabaseQuery/observeSingleEvent(of:)`` then reads only
    /// its window instead of every child. The index is derived from the data (kept in step
    /// with every change, built by a walk of the children when first needed, and kept in
    /// checkpoints so that an open does not walk them again). Writes below an indexed
    /// location cost a little more: the changed child's value is read to move its entry.
    public var indexes: [ChildIndex] = []
    /// Whether a listener (``DatabaseQuery/observe(_:includeMetadataChanges:with:)`` and the
    /// other `observe` forms) of a limited, unranged query ordered by a child or by priority
    /// (Firebase's default order: `queryLimited(toLast:)` alone) gets an index made for it,
    /// as if declared (by priority: children without one first, by key), when no declared
    /// index orders it and its location
    /// is big when the listener is added (512 children or more, or as many stored entries
    /// below it). The index is built outside the engine's lock before the listener's first
    /// event, built again outside the lock when a change at or above the location calls for
    /// it, kept while any such listener of that location and child remains, then dropped;
    /// it is never kept in a checkpoint. Without one, each write that moves a child out of
    /// the listener's window has the view look for the child after the window among all
    /// children, under the lock: seconds over a million children, while every other write
    /// waits. Default true.
    public var automaticIndexes = true
    /// The system calls the log makes; tests replace them to inject faults or cut the power.
    @_spi(Testing) public var system: SystemCalls = .live

    /// The defaults: `.fsync` durability, 8 MiB segments, strict recovery, a checkpoint on close.
    public init() {}

    /// The defaults, with `durability`.
    public init(durability: Durability) { self.durability = durability }
}

/// An embedded, offline-first database with the Realtime Database's data model: a JSON tree
/// of locations, listeners that fire at once on local writes, queries, transactions.
///
/// Every change is a record in a write-ahead log; the data is rebuilt on open by replaying it
/// (from the last checkpoint). A memory-only database (``inMemory(options:)``) behaves the
/// same while the process lives and writes nothing.
///
/// `Database` is `Sendable`: use it from any task. Writes are applied in one order (the log's);
/// listeners are called in that order.
public final class Database: Sendable {
    let engine: FerryMutex<Engine>
    let delivery: EventDelivery
    /// Where the records become durable: the log, or memory.
    let medium: any StoreMedium
    /// The log, or nil for a memory-only database: for what only a log has (checkpoints,
    /// compaction, eviction, reads outside the lock).
    var log: WriteAheadLog? { medium.log }
    let options: DatabaseOptions
    let pushIDs = FerryMutex(PushIDGenerator())
    /// Held while the sync state's side file is written.
    let syncStateWriter = FerryMutex(())
    /// The one owner of checkpoints, compaction and eviction (see ``Maintenance``).
    let maintenance = Maintenance()
    /// What the upkeep follows of ``options``.
    let upkeep: UpkeepSettings
    /// The store directory (nil for a memory-only database).
    public let path: String?
    /// What opening the log found (nil for a memory-only database).
    public let recovery: RecoveryReport?

    /// The largest encoded write accepted (as the Realtime Database's 16 MB per write).
    public static let maxWriteSize = Engine.maxWriteSize

    private init(engine: sending Engine, medium: any StoreMedium, path: String?, options: DatabaseOptions) {
        self.engine = FerryMutex(engine)
        self.medium = medium
        self.path = path
        self.options = options
        self.upkeep = UpkeepSettings(cacheLimit: options.cacheSizeBytes.limit, segmentSize: options.effectiveSegmentSize,
                                     checkpointPolicy: options.checkpointPolicy, compactionSegments: options.compactionSegments,
                                     checkpointFormat: options.checkpointFormat, logger: options.logger)
        self.recovery = medium.log?.recovery
        self.delivery = EventDelivery(queue: options.callbackQueue)
    }

    /// Opens (creating if absent) the database stored in the directory `path`, replaying its
    /// log from the last checkpoint.
    ///
    /// - Throws: ``DatabaseError`` — ``DatabaseError/Code/storage`` wrapping a
    ///   ``FerryLog/LogError`` (store in use, corruption naming file and offset, unsupported format).
    public static func open(at path: String, options: DatabaseOptions = DatabaseOptions()) throws -> Database {
        try options.cacheSizeBytes.validate()
        var logOptions = LogOptions(durability: options.durability, segmentSize: options.effectiveSegmentSize, recovery: options.recovery)
        logOptions.logger = options.logger
        logOptions.system = options.system
        let log: WriteAheadLog
        do {
            log = try WriteAheadLog.open(at: path, options: logOptions)
        } catch let e as LogError {
            throw DatabaseError(.storage, "cannot open the store at \(path): \(e)", underlying: e)
        }
        // A document store (FerryDocuments) whose records were all compacted away still says
        // what it is by its checkpoint.
        if (try? log.sideFiles(withPrefix: "documents.checkpoint"))?.isEmpty == false {
            log.release()
            throw DatabaseError(.storage, "the store at \(path) is a document store (FerryDocuments): open it with Firestore, not Database", store: path)
        }
        let engine = Engine(log: log, logger: options.logger)
        do {
            try engine.declareIndexes(options.indexes)
            let start = try engine.loadLatestCheckpoint()
            var replayed = engine
            do { try replayed.replay(log, from: LSN(start)) } catch let f as ReplayFailure {
                // Name the record, its segment and offset, and the store.
                let why = (f.underlying as? DatabaseError)?.message ?? "\(f.underlying)"
                throw DatabaseError(.storage, "record \(f.lsn) (kind \(f.kind)) cannot be replayed: \(why)",
                                    underlying: (f.underlying as? DatabaseError)?.underlying ?? (f.underlying as? LogError),
                                    lsn: f.lsn, file: f.file, offset: f.offset, store: path)
            }
            if let f = engine.failure { throw f }
            engine.refreshIndexesIfDue()
        } catch {
            // Release the store before throwing, so that a retry (or another process) can open it.
            log.release()
            throw error as? DatabaseError
                ?? DatabaseError(.storage, "replaying the log of \(path) failed: \(error)", underlying: error as? LogError, store: path)
        }
        return Database(engine: engine, medium: LogMedium(log), path: path, options: options)
    }

    /// A database that keeps everything in memory and writes nothing to disk (for data that
    /// must not be stored). It behaves like a stored one while the process lives: it writes
    /// the same records, into memory, and reads its values from them. Records nothing refers
    /// to any more (overwritten server data, answered writes) are forgotten once the records
    /// kept have doubled since the last time (and hold 1 MiB), and after an eviction; a record
    /// stays whole while any of its values is still read.
    public static func inMemory(options: DatabaseOptions = DatabaseOptions()) -> Database {
        let engine = Engine(log: nil, logger: options.logger)
        do {
            try engine.declareIndexes(options.indexes)
        } catch {
            options.logger.error("memory-only database: \(error); the indexes from there on are not kept")
        }
        return Database(engine: engine, medium: MemoryMedium(), path: nil, options: options)
    }

    /// The root location.
    public var root: DatabaseReference { DatabaseReference(database: self, path: .root) }

    /// The location at `path` (like `"users/ada"`).
    /// - Throws: ``DatabaseError/Code/invalidPath`` naming the key and the rule it breaks.
    public func reference(_ path: String) throws -> DatabaseReference {
        DatabaseReference(database: self, path: try Path(validating: path))
    }

    /// How many local writes are waiting for the server's acknowledgement (they are kept,
    /// across restarts, until it comes).
    public var pendingWriteCount: Int { withEngine { $0.writeTree.pendingCount } }

    /// Writes a checkpoint (if stored), waits for every write to be durable, and closes the log.
    /// Later calls throw ``DatabaseError/Code/closed``.
    public func close() async throws {
        if let log {
            // After any compaction under way; a closed database starts no other.
            await maintenance.run {
                if options.checkpointOnClose && withEngine({ $0.stopReason == nil }) {
                    do {
                        try await writeCheckpoint(log)
                    } catch {
                        // The data is safe in the log; the next open replays more of it.
                        options.logger.warning("closing \(log.path): no checkpoint written (\(error)); the next open replays the log")
                    }
                }
                withEngine { $0.markClosed() }
            }
        }
        withEngine { $0.markClosed() }  // (a memory-only database)
        withEngine { $0.listens.signal }?.finish()
        do { try await medium.close() } catch {
            throw DatabaseError(.storage, "closing the log failed: \(error)", underlying: error as? LogError, store: path)
        }
    }

    /// Writes a compact image of the stored state (the server cache and the pending writes, as
    /// references into the log), so that the next open replays only what came after it.
    public func checkpoint() async throws {
        try await checkpointAfterOtherJobs()
    }

    /// Waits until every write made before the call is durable (`fdatasync`), whatever the
    /// durability mode — the commit point of a batch of `.none` writes. (A memory-only
    /// database's writes are as durable as it gets at once.)
    ///
    /// - Throws: ``DatabaseError/Code/closed`` after ``close()``, or the failure that stopped
    ///   the database (a memory-only one too); ``DatabaseError/Code/storage`` if the log fails.
    public func sync() async throws {
        try withEngine { try $0.checkUsable() }
        do { try await medium.sync() } catch { throw storageError(error) }
    }
}

/// The database runs its engine for the upkeep (``Maintenance``'s jobs) and the tools.
extension Database: EngineHost {}

extension Database: Hashable {
    public static func == (a: Database, b: Database) -> Bool { a === b }
    public func hash(into h: inout Hasher) { h.combine(ObjectIdentifier(self)) }
}
