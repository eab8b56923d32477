import FerryLog
import FerryStore
import Foundation

/// Where a document store keeps its data (Firebase's cache settings).
public enum CacheSettings: Sendable {
    /// On disk, in the directory given to ``Firestore/open(at:settings:)``, with a size limit
    /// in bytes (``FirestoreSettings/defaultCacheSizeBytes`` by default, at least
    /// ``FirestoreSettings/minimumCacheSizeBytes``, or ``FirestoreSettings/cacheSizeUnlimited``).
    case persistent(sizeBytes: Int64)
    /// In memory: nothing is written to disk, everything is gone when the store closes. Every
    /// document the server sent stays cached while the store lives (Firebase's
    /// `MemoryLRUGCSettings` without a size limit).
    case memory
    /// In memory, with eager garbage collection (Firebase's `MemoryEagerGCSettings`): a
    /// document no listener, active target or pending write needs is dropped at once, so the
    /// cache holds only what is listened to or written.
    case memoryEager
}

/// A document store's settings (Firebase's `FirestoreSettings`).
public struct FirestoreSettings: Sendable {
    /// 100 MB, the SDK's default cache size.
    public static let defaultCacheSizeBytes: Int64 = 100 * 1024 * 1024
    /// 1 MB, the SDK's smallest cache size.
    public static let minimumCacheSizeBytes: Int64 = 1024 * 1024
    /// No size limit (Firebase's `FirestoreCacheSizeUnlimited`).
    public static let cacheSizeUnlimited: Int64 = -1

    public var cacheSettings: CacheSettings = .persistent(sizeBytes: defaultCacheSizeBytes)
    /// The queue listeners are called on (a private serial queue by default).
    public var dispatchQueue: DispatchQueue?
    /// `fsync` before a write returns (the default), or write without waiting for the disk.
    public var durability: Durability = .fsync

    public init() {}
}

/// Where a read is answered from (Firebase's `FirestoreSource`).
public enum FirestoreSource: Sendable {
    /// The server when it can be reached, else the local cache.
    case `default`
    /// The server only: fails with ``FirestoreErrorCode/Code/unavailable`` when it cannot be reached.
    case server
    /// The local cache only (with pending writes applied).
    case cache
}

/// What reads show for a `serverTimestamp()` the server has not set yet.
public enum ServerTimestampBehavior: Sendable {
    /// `NSNull`.
    case none
    /// The local time of the write.
    case estimate
    /// The field's value before the write (`NSNull` if it had none).
    case previous
}

/// A document store: Cloud Firestore's model (collections, documents, queries, listeners) on
/// Ferry's log (Firebase's `Firestore`).
///
/// Every write is one record in the log, durable when its `await` returns, and pending until a
/// server acknowledges it. Reads and listeners see pending writes at once (latency
/// compensation). Without a server connection, every snapshot is from the cache.
public final class Firestore: Sendable {
    let state: FerryMutex<DocumentEngine>
    /// Where the records become durable: the log, or memory.
    let medium: any StoreMedium
    /// The log, or nil in memory: for what only a log has (checkpoints, deleting segments).
    var log: WriteAheadLog? { medium.log }
    /// The store directory (nil in memory).
    public let path: String?
    public let settings: FirestoreSettings
    let queue: DispatchQueue
    let callbacks = FerryMutex<[Int: @Sendable (ListenerEvent) -> Void]>([:])
    let inSyncCallbacks = FerryMutex<[Int: @Sendable () -> Void]>([:])
    /// The upkeep (checkpoints, eviction), the same owner the tree database uses.
    let maintenance = Maintenance()
    /// The checkpoint file's size, counted against the cache limit.
    let checkpointBytes = FerryMutex(0)
    let inSyncNext = FerryMutex(1)
    /// Called when a server connection has something to do (see `attachRemote`).
    let remoteWake = FerryMutex<(@Sendable () -> Void)?>(nil)
    /// The connected server's direct reads and transactions.
    let remoteServer = FerryMutex<(any DocumentServer)?>(nil)

    private init(engine: sending DocumentEngine, medium: any StoreMedium, path: String?, settings: FirestoreSettings) {
        state = FerryMutex(engine)
        self.medium = medium
        self.path = path
        self.settings = settings
        queue = settings.dispatchQueue ?? DispatchQueue(label: "ferry.documents.listeners")
    }

    /// Opens (creating if absent) the document store in the directory `path`, replaying its log.
    ///
    /// - Throws: ``FirestoreErrorCode`` — `unavailable` when another process holds the store,
    ///   `dataLoss` for a damaged or foreign store (naming the record), `invalidArgument` for bad settings.
    public static func open(at path: String, settings: FirestoreSettings = FirestoreSettings()) throws -> Firestore {
        if case .persistent(let size) = settings.cacheSettings, size != cacheSizeUnlimited, size < FirestoreSettings.minimumCacheSizeBytes {
            throw FirestoreErrorCode(.invalidArgument, "cacheSizeBytes must be at least \(FirestoreSettings.minimumCacheSizeBytes) (1 MB) or FirestoreSettings.cacheSizeUnlimited; it is \(size)")
        }
        switch settings.cacheSettings {
        case .memory, .memoryEager: return inMemory(settings: settings)
        case .persistent: break
        }
        let log: WriteAheadLog
        do {
            var options = LogOptions(durability: settings.durability)
            // With a size limit, segments are an eighth of it (64 KiB to 8 MiB), so that the
            // store stays within the limit and a segment.
            if case .persistent(let size) = settings.cacheSettings, size != cacheSizeUnlimited {
                options.segmentSize = Int(min(8 << 20, max(64 << 10, size / 8)))
            }
            log = try WriteAheadLog.open(at: path, options: options)
        } catch let e as LogError {
            throw FirestoreErrorCode(e.code == .storeInUse ? .unavailable : .dataLoss, "cannot open the document store at \(path): \(e)")
        }
        if (try? log.sideFiles(withPrefix: "checkpoint-"))?.isEmpty == false {
            log.release()
            throw FirestoreErrorCode(.dataLoss, "the store at \(path) is a Realtime Database store (it has the tree's checkpoints): open it with Ferry's Database, not Firestore")
        }
        var engine = DocumentEngine(records: RecordStore(log: log))
        engine.indexesStale = true
        var start = log.firstLSN
        var checkpointSize = 0
        do {
            if let bytes = try log.readSideFile(named: DocumentCheckpoint.fileName) {
                checkpointSize = bytes.count
                do {
                    let c = try DocumentCheckpoint.decode(bytes)
                    engine.install(c)
                    start = max(start, LSN(c.throughLSN))
                } catch let e as FirestoreErrorCode where log.firstLSN.rawValue <= 1 {
                    // Every record is still in the log: replay them all instead.
                    _ = e
                } catch let e as FirestoreErrorCode {
                    throw FirestoreErrorCode(.dataLoss, "cannot open the document store at \(path): \(e.message); the log's records before it were deleted, so it cannot be rebuilt (nothing was changed)")
                }
            }
            do { try engine.replay(log, from: start) } catch let f as ReplayFailure {
                let e = f.underlying as? FirestoreErrorCode ?? FirestoreErrorCode(.dataLoss, "\(f.underlying)")
                throw FirestoreErrorCode(e.code, "record \(f.lsn) of \(path) (\(f.place)) cannot be replayed: \(e.message)")
            }
        } catch {
            log.release()
            throw error as? FirestoreErrorCode ?? FirestoreErrorCode(.dataLoss, "replaying the document store at \(path) failed: \(error)")
        }
        engine.buildIndexes()
        let db = Firestore(engine: engine, medium: LogMedium(log), path: path, settings: settings)
        db.checkpointBytes.withLock { $0 = checkpointSize }
        return db
    }

    static let cacheSizeUnlimited = FirestoreSettings.cacheSizeUnlimited

    /// A document store in memory (nothing written to disk): `settings.cacheSettings` is
    /// ``CacheSettings/memoryEager`` for eager garbage collection, otherwise ``CacheSettings/memory``.
    public static func inMemory(settings: FirestoreSettings = FirestoreSettings()) -> Firestore {
        var s = settings
        var engine = DocumentEngine(records: RecordStore(log: nil))
        if case .memoryEager = settings.cacheSettings {
            engine.eagerGarbageCollection = true
        } else {
            s.cacheSettings = .memory
        }
        return Firestore(engine: engine, medium: MemoryMedium(), path: nil, settings: s)
    }

    // MARK: References

    /// The collection at `collectionPath` (`"cities"`, `"cities/SF/landmarks"`).
    public func collection(_ collectionPath: String) -> CollectionReference {
        CollectionReference(firestore: self, pathResult: Result {
            let p = try ResourcePath.parse(collectionPath, what: "collection path")
            guard !p.isDocument else { throw FirestoreErrorCode(.invalidArgument, "\"\(collectionPath)\" names a document (an even number of segments), not a collection") }
            return p
        })
    }

    /// The document at `documentPath` (`"cities/SF"`).
    public func document(_ documentPath: String) -> DocumentReference {
        DocumentReference(firestore: self, keyResult: Result {
            let p = try ResourcePath.parse(documentPath, what: "document path")
            guard p.isDocument else { throw FirestoreErrorCode(.invalidArgument, "\"\(documentPath)\" names a collection (an odd number of segments), not a document") }
            return p
        })
    }

    /// Every collection named `collectionID`, wherever it is (a collection-group query).
    public func collectionGroup(_ collectionID: String) -> Query {
        var core = QueryCore(path: ResourcePath([]))
        core.collectionGroup = collectionID
        let invalid: FirestoreErrorCode? = collectionID.contains("/")
            ? FirestoreErrorCode(.invalidArgument, "a collection group id must not contain '/' (\(collectionID))") : nil
        return Query(firestore: self, core: core, invalid: invalid)
    }

    /// A batch of writes applied together (one record).
    public func batch() -> WriteBatch { WriteBatch(firestore: self) }

    // MARK: Local indexes

    /// Replaces the configured local indexes by those of `json`, in Firestore's index
    /// definition format (`indexes` with `collectionGroup`, `queryScope` and `fields` of
    /// `fieldPath` + `order` or `arrayConfig`; `fieldOverrides`). Each index is built at once
    /// over the cached documents and kept current with every write; queries use the best one.
    /// Automatic indexes stay. A malformed definition is refused whole with `invalidArgument`.
    public func setIndexConfiguration(_ json: String) async throws {
        let configured = try IndexDefinition.parseConfiguration(json)
        try await changeIndexes { current in current.filter(\.automatic) + configured }
    }

    /// The local index manager of a persistent store (nil for a memory cache, as in the SDK).
    public var persistentCacheIndexManager: PersistentCacheIndexManager? {
        log == nil ? nil : PersistentCacheIndexManager(firestore: self)
    }

    func changeIndexes(_ change: @escaping ([IndexDefinition]) -> [IndexDefinition]) async throws {
        let lsn = try state.withLock { e -> UInt64 in
            guard !e.closed else { throw Self.closedError }
            let definitions = change(e.indexes.map(\.definition))
            let payload = DocumentRecords.encode(definitions)
            let lsn: UInt64
            do { lsn = try e.records.append(kind: DocumentRecordKind.indexConfiguration.rawValue, payload) } catch {
                throw FirestoreErrorCode(.unavailable, "the index configuration could not be logged: \(error)")
            }
            _ = try payload.withUnsafeBytes { try e.apply(kind: DocumentRecordKind.indexConfiguration.rawValue, lsn: Int64(lsn), payload: $0) }
            return lsn
        }
        try? await medium.awaitDurable(lsn)
    }

    /// The local indexes now (for statistics and tests).
    var indexDefinitions: [IndexDefinition] { state.withLock { $0.indexes.map(\.definition) } }

    // MARK: Transactions and network

    /// Runs `body` as a transaction on the server: its reads see the server's documents, its
    /// writes are committed together only if nothing it read changed meanwhile; otherwise it
    /// runs again (at most 5 attempts, as Firebase's SDKs), then fails with `aborted`. Reads
    /// must come before writes. The writes reach the cache through the listeners, not as
    /// pending writes: offline, a transaction fails with `unavailable` (a WriteBatch is kept
    /// and sent later instead).
    public func runTransaction<T: Sendable>(_ body: @Sendable (Transaction) async throws -> T) async throws -> T {
        try checkOpen()
        guard let server = reachableServer else {
            throw FirestoreErrorCode(.unavailable, "transactions need the server, and this store is offline (no server connected, or the network disabled); a WriteBatch is kept and sent later")
        }
        var retrying: Data?
        var lastAbort = FirestoreErrorCode(.aborted, "the transaction was aborted")
        for _ in 1...Transaction.maxAttempts {
            let id = try await server.beginTransaction(retrying: retrying)
            let t = Transaction(firestore: self, server: server, id: id)
            let result: T
            do {
                result = try await body(t)
            } catch {
                await server.rollback(id)
                throw error
            }
            let writes: [Mutation]
            do { writes = try t.finish() } catch {
                await server.rollback(id)
                throw error
            }
            do {
                try await server.commit(writes, transaction: id)
                return result
            } catch let e as FirestoreErrorCode where e.code == .aborted {
                lastAbort = e
                retrying = id
            }
        }
        throw FirestoreErrorCode(.aborted, "the transaction failed \(Transaction.maxAttempts) times (\(lastAbort.message))")
    }

    /// The batches the server refused, oldest first, until ``clearRejectedWrites()``: each was
    /// reverted locally when refused (its waiters got the error); they survive restarts.
    public func rejectedWrites() throws -> [RejectedWrite] {
        try read { e in
            e.rejectedWrites.sorted { $0.key < $1.key }.map { RejectedWrite(batchID: $0.key, documentPaths: $0.value.documents.map(\.description), error: $0.value.error) }
        }
    }

    /// Forgets the rejected batches listed now (durably: one record).
    public func clearRejectedWrites() async throws {
        try checkOpen()
        let through = try read { $0.rejectedWrites.keys.max() }
        guard let through else { return }
        var w = PayloadWriter()
        w.i64(through)
        let lsn = try state.withLock { e -> UInt64 in
            guard !e.closed else { throw Self.closedError }
            let lsn: UInt64
            do { lsn = try e.records.append(kind: DocumentRecordKind.rejectionsCleared.rawValue, w.bytes) } catch {
                throw FirestoreErrorCode(.unavailable, "the clearing could not be logged: \(error)")
            }
            e.rejectedWrites = e.rejectedWrites.filter { $0.key > through }
            return lsn
        }
        do { try await medium.awaitDurable(lsn) } catch {
            throw FirestoreErrorCode(.dataLoss, "the clearing was not made durable: \(error)")
        }
    }

    /// Stops using the network: reads and listeners are served from the cache and writes are
    /// kept until ``enableNetwork()``.
    public func disableNetwork() async {
        syncStep { e in
            guard e.networkEnabled else { return [] }
            e.networkEnabled = false
            e.connectionStopped()
            return e.setOnline(.offline)
        }
        wakeRemote()
    }

    /// Uses the network again: the targets are listened to again, from their resume tokens.
    public func enableNetwork() async {
        syncStep { e in
            guard !e.networkEnabled else { return [] }
            e.networkEnabled = true
            guard e.remoteAttached else { return [] }
            let events = e.setOnline(.unknown)
            e.resendTargets()
            return events
        }
        wakeRemote()
    }

    /// Returns once every write made before the call has been acknowledged by the server (or
    /// rejected). Offline, it waits; cancel the task to stop waiting.
    public func waitForPendingWrites() async throws {
        let last = try state.withLock { e -> Int64? in
            guard !e.closed else { throw Self.closedError }
            return e.pending.last?.id
        }
        guard let last else { return }
        do {
            try await waitForAnswer(last)
        } catch let error as FirestoreErrorCode where error.code != .dataLoss && !state.withLock({ $0.closed }) {
            // The server refused a write: that is an answer too (the write is reverted and
            // listed in `rejectedWrites()`); as Firebase's, this wait just ends.
        }
    }

    func waitForAnswer(_ batchID: Int64) async throws {
        let token = state.withLock { $0.ledger.newToken() }
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (c: UnsafeContinuation<Void, any Error>) in
                let wait = state.withLock { e -> WriteLedger<FirestoreErrorCode>.Wait in
                    if e.closed { return .failed(Self.closedError) }
                    let pending = e.pending.contains(batchID)
                    return e.ledger.wait(for: batchID, token: token, pending: pending, c)
                }
                switch wait {
                case .waiting: if Task.isCancelled { if let c = state.withLock({ $0.ledger.cancel(batchID, token: token) }) { c.resume(throwing: CancellationError()) } }
                case .answered(let error, let lsn):
                    // The answer counts once its record is durable.
                    guard lsn > 0, !medium.durableOnAppend else { if let error { c.resume(throwing: error) } else { c.resume() }; break }
                    Task {
                        do { try await medium.awaitDurable(UInt64(lsn)) } catch { c.resume(throwing: FirestoreErrorCode(.dataLoss, "the answer was not made durable: \(error)")); return }
                        if let error { c.resume(throwing: error) } else { c.resume() }
                    }
                case .failed(let error): c.resume(throwing: error)
                case .cancelled: c.resume(throwing: CancellationError())
                }
            }
        } onCancel: {
            if let c = state.withLock({ $0.ledger.cancel(batchID, token: token) }) { c.resume(throwing: CancellationError()) }
        }
    }

    /// Closes the store: listeners stop, waits end with `failedPrecondition`, and the log is
    /// closed (every write already returned is on disk).
    public func terminate() async throws {
        let wasOpen = state.withLock { e -> Bool in
            let closing = e.life.close(ledger: e.ledger, reason: Self.closedError)
            if e.life.takeObserversToEnd() { e.listeners = [:] }
            return closing
        }
        callbacks.withLock { $0 = [:] }
        guard wasOpen else { return }
        // A checkpoint on close (after any job under way), so that the next open replays nothing.
        try? await checkpoint(closing: true)
        do { try await medium.close() } catch { throw FirestoreErrorCode(.dataLoss, "closing the document store failed: \(error)") }
    }

    /// Deletes the store's files, pending writes included. Only on a terminated store
    /// (`failedPrecondition` otherwise).
    public func clearPersistence() async throws {
        guard state.withLock({ $0.closed }) else {
            throw FirestoreErrorCode(.failedPrecondition, "clearPersistence() needs a terminated store: call terminate() first")
        }
        guard let path else { return }
        do { try FileManager.default.removeItem(atPath: path) } catch {
            throw FirestoreErrorCode(.internal, "cannot delete \(path): \(error)")
        }
    }

    static let closedError = FirestoreErrorCode(.failedPrecondition, "the document store was terminated")

    func checkOpen() throws {
        if state.withLock({ $0.closed }) { throw Self.closedError }
    }

    // MARK: Writes

    /// Writes a batch: one record, applied to the local view and the listeners at once;
    /// returns once it is durable.
    func write(_ mutations: [Mutation]) async throws {
        guard let lsn = try writeNow(mutations) else { return }
        do { try await medium.awaitDurable(lsn) } catch {
            throw FirestoreErrorCode(.dataLoss, "the write was not made durable: \(error)")
        }
    }

    /// Makes every write made so far durable (for writes made with `setDataNow`).
    public func sync() async throws {
        try checkOpen()
        do { try await medium.sync() } catch { throw FirestoreErrorCode(.dataLoss, "the writes were not made durable: \(error)") }
    }

    /// Writes a batch without waiting for the disk; returns its record's LSN (nil: nothing).
    @discardableResult
    func writeNow(_ mutations: [Mutation]) throws -> UInt64? {
        guard !mutations.isEmpty else { return nil }
        let time = Timestamp().truncatedToMicroseconds
        var batch = MutationBatch(id: 0, localWriteTime: time, mutations: mutations)
        let payload = DocumentRecords.encode(batch)
        let (lsn, upkeep) = try state.withLock { e -> (UInt64, Maintenance.Job?) in
            guard !e.closed else { throw Self.closedError }
            try Self.checkSizes(mutations, e, time)
            let lsn: UInt64
            do { lsn = try e.records.append(kind: DocumentRecordKind.writeBatch.rawValue, payload) } catch {
                throw FirestoreErrorCode(.unavailable, "the write could not be logged: \(error)")
            }
            // The batch as written is what its record decodes to (the record tests hold this).
            batch.id = Int64(lsn)
            let changed = e.apply(batch)
            e.records.pruneWritten()
            // A memory store's state is the engine's: its records need not be kept.
            if e.records.sweepIsDue { e.records.sweep(keeping: []) }
            // Queued under the lock, so that listeners get snapshots in the order of the writes.
            deliver(e.emit(changed, targetChanges: [:]))
            return (lsn, upkeepDue(e))
        }
        startUpkeep(upkeep)
        wakeRemote()
        return lsn
    }

    /// Firestore's limit holds for the document a write leaves. A bound — the fields written,
    /// plus the document before when the write keeps or transforms it — settles most writes;
    /// only one near the limit (or a batch writing a document twice) is applied here to be
    /// measured exactly, so a write is not applied twice on its way in.
    static func checkSizes(_ mutations: [Mutation], _ e: DocumentEngine, _ time: Timestamp) throws {
        let max = UserData.maxDocumentBytes
        var after: [ResourcePath: LocalDocument?] = [:]
        let repeated = Set(mutations.map(\.key)).count != mutations.count
        for m in mutations where m.operation != .delete || repeated {
            let before = after[m.key] ?? e.document(m.key)
            if !repeated {
                var bound = UserData.documentSize(path: m.key, fields: m.fields) + m.transforms.reduce(0) { total, t in
                    let elements: Int = switch t.1 {
                    case .arrayUnion(let a), .arrayRemove(let a): a.reduce(0) { $0 + UserData.size($1) }
                    default: 8
                    }
                    return total + t.0.segments.reduce(0) { $0 + $1.utf8.count + 1 } + elements
                }
                if m.operation == .patch || !m.transforms.isEmpty, let f = before?.fields { bound += UserData.documentSize(path: m.key, fields: f) }
                if bound <= max { continue }
            }
            let doc = m.applied(to: before, writeTime: time)
            after[m.key] = .some(doc)
            if let fields = doc?.fields {
                let size = UserData.documentSize(path: m.key, fields: fields)
                if size > max {
                    throw FirestoreErrorCode(.invalidArgument, "document \(m.key) would be \(size) bytes after this write; Firestore's limit is \(max) (1 MiB)")
                }
            }
        }
    }

    // MARK: Reads and listeners

    func read<T: Sendable>(_ body: (inout DocumentEngine) throws -> T) throws -> T {
        try state.withLock { e in
            guard !e.closed else { throw Self.closedError }
            return try body(&e)
        }
    }

    func addListener(_ q: QueryCore, includeMetadataChanges: Bool, cacheOnly: Bool = false, _ callback: @escaping @Sendable (ListenerEvent) -> Void) -> ListenerRegistration {
        let registered = state.withLock { e -> Int? in
            guard !e.closed else { return nil }
            let (id, first) = e.listen(q, includeMetadataChanges: includeMetadataChanges, cacheOnly: cacheOnly)
            callbacks.withLock { $0[id] = callback }
            deliver(first)  // before any later write's events (queued under the lock)
            return id
        }
        wakeRemote()
        guard let id = registered else {
            queue.async { callback(.failure(Self.closedError)) }
            return ListenerRegistration(remove: {})
        }
        return ListenerRegistration { [weak self] in
            guard let self else { return }
            self.state.withLock { e in
                e.removeListener(id)
                self.callbacks.withLock { $0[id] = nil }
            }
            self.wakeRemote()
        }
    }

    /// Calls listeners on the delivery queue, in order; a listener removed before its turn
    /// is not called. Then the snapshots-in-sync listeners: every listener has seen the
    /// same consistent state.
    func deliver(_ events: [(Int, ListenerEvent)]) {
        guard !events.isEmpty else { return }
        queue.async { [self] in
            for (id, event) in events {
                guard let cb = callbacks.withLock({ $0[id] }) else { continue }
                cb(event)
            }
            for cb in inSyncCallbacks.withLock({ $0.sorted { $0.key < $1.key }.map(\.value) }) { cb() }
        }
    }

    /// Calls `listener` now and after every change that listeners of this store were told
    /// of, once they were all told (Firebase's `addSnapshotsInSyncListener`).
    @discardableResult
    public func addSnapshotsInSyncListener(_ listener: @escaping @Sendable () -> Void) -> ListenerRegistration {
        let id = inSyncNext.withLock { n -> Int in defer { n += 1 }; return n }
        inSyncCallbacks.withLock { $0[id] = listener }
        queue.async { [self] in if inSyncCallbacks.withLock({ $0[id] }) != nil { listener() } }
        return ListenerRegistration { [weak self] in self?.inSyncCallbacks.withLock { $0[id] = nil } }
    }
}

/// A listener's handle (Firebase's `ListenerRegistration`): ``remove()`` stops it.
public final class ListenerRegistration: Sendable {
    private let onRemove: @Sendable () -> Void
    init(remove: @escaping @Sendable () -> Void) { onRemove = remove }
    /// Stops the listener: it is not called again once this returns (a call under way on the
    /// delivery queue may finish).
    public func remove() { onRemove() }
}

/// A batch the server refused (``Firestore/rejectedWrites()``).
public struct RejectedWrite: Sendable {
    /// The batch's id (its record's LSN: later batches have greater ids).
    public let batchID: Int64
    /// The documents it wrote (`cities/SF`).
    public let documentPaths: [String]
    /// Why the server refused it.
    public let error: FirestoreErrorCode
}

/// A refused batch as the engine keeps it.
struct RejectedWriteData: Sendable {
    var documents: [ResourcePath]
    var error: FirestoreErrorCode
}

/// A transaction's reads and writes (see ``Firestore/runTransaction(_:)``): reads go to the
/// server, writes are kept and committed with the transaction.
public final class Transaction: Sendable {
    static let maxAttempts = 5
    let firestore: Firestore
    let server: any DocumentServer
    let id: Data
    private let writes: CollectedWrites

    init(firestore: Firestore, server: any DocumentServer, id: Data) {
        self.firestore = firestore
        self.server = server
        self.id = id
        writes = CollectedWrites(firestore: firestore)
    }

    /// Reads the document on the server, in the transaction. Every read comes before every
    /// write (`invalidArgument` otherwise).
    public func getDocument(_ document: DocumentReference) async throws -> DocumentSnapshot {
        let key = try writes.key(of: document)
        if !writes.isEmpty {
            throw FirestoreErrorCode(.invalidArgument, "a transaction's reads must come before its writes")
        }
        let found = try await server.documents([key], transaction: id).first
        let doc = found.map { LocalDocument.stored($0.key, $0.fields, createTime: $0.fields == nil ? nil : Timestamp(micros: $0.createTime), updateTime: $0.fields == nil ? nil : Timestamp(micros: $0.version)) }
        return DocumentSnapshot(firestore: firestore, key: key, doc: doc, fromCache: false)
    }

    @discardableResult public func setData(_ data: [String: Any], forDocument document: DocumentReference) -> Transaction {
        writes.set(data, document, merge: false)
        return self
    }
    @discardableResult public func setData(_ data: [String: Any], forDocument document: DocumentReference, merge: Bool) -> Transaction {
        writes.set(data, document, merge: merge)
        return self
    }
    @discardableResult public func setData(_ data: [String: Any], forDocument document: DocumentReference, mergeFields: [Any]) -> Transaction {
        writes.set(data, document, mergeFields: mergeFields)
        return self
    }
    @discardableResult public func updateData(_ fields: [AnyHashable: Any], forDocument document: DocumentReference) -> Transaction {
        writes.update(fields, document)
        return self
    }
    @discardableResult public func deleteDocument(_ document: DocumentReference) -> Transaction {
        writes.delete(document)
        return self
    }

    /// The writes to commit (the first invalid one's error, if any).
    func finish() throws -> [Mutation] { try writes.take() }
}

/// Automatic local indexes (Firebase's `PersistentCacheIndexManager`). Unlike the SDK's, an
/// index is complete as soon as it is made: it is built at once over the cached documents.
public final class PersistentCacheIndexManager: Sendable {
    let firestore: Firestore
    init(firestore: Firestore) { self.firestore = firestore }

    /// From now on (until the store closes), a query that read at least 100 documents and
    /// more than 3.4 times what it returned creates an index for itself.
    public func enableIndexAutoCreation() { firestore.state.withLock { $0.autoIndexCreation = true } }
    /// Stops creating indexes (those made stay).
    public func disableIndexAutoCreation() { firestore.state.withLock { $0.autoIndexCreation = false } }
    /// Deletes every local index, configured and automatic.
    public func deleteAllIndexes() async throws { try await firestore.changeIndexes { _ in [] } }
}
