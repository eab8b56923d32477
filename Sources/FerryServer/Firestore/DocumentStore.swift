import FerryDocuments
import FerryFirestoreWire
import FerryLog
import Foundation
import Logging
import Synchronization

/// A document as the server holds it. Times are microseconds since 1970.
struct StoredDocument: Sendable, Equatable {
    var fields: [String: FieldValueData]
    var createTime: Int64
    var updateTime: Int64
}

/// One document's change in a commit.
struct DocumentChangeRecord: Sendable {
    var key: ResourcePath
    var before: StoredDocument?
    var after: StoredDocument?
    var time: Int64
}

/// One Firestore database on the server (`projects/P/databases/D`): its documents in memory,
/// every commit in a Ferry log; an open reads the last checkpoint and replays the commits after
/// it (see ``StoreCheckpoint``).
///
/// **Commits** go through one writer, in the order they arrive, in groups: the writer applies a
/// group's commits to an overlay of the documents (each commit atomic: a failed precondition or
/// an aborted transaction leaves nothing of it), appends one record per commit and waits until
/// they are durable, then installs the overlay, tells the listens, and answers. Reads see only
/// installed (durable) documents, so nothing a client was shown is lost to kill -9.
///
/// **Commit times** are the commit's number: microseconds, strictly increasing, stored with the
/// data. A listen's resume token names one (see ``ResumeToken``); deletions are remembered
/// (`tombstones`, at most ``maxTombstones``) so a listen resumes with the changes since it.
final class DocumentStore: Sendable {
    /// Record kinds of a server document store, read back by ``ServerDocumentRecord``.
    typealias RecordKind = ServerDocumentRecord.Kind

    /// What a client store's batches were answered: the highest batch answered, and the
    /// answers of its last ``window`` batches. A batch sent again gets its own answer; one at or
    /// below the highest and older than the window (a client resends only what it has not
    /// heard, which is never that old) is answered as committed at the highest's time.
    struct ClientMarks: Sendable {
        static let window = 8_192
        var highest: Int64 = .min
        var highestTime: Int64 = 0
        var answers: [Int64: Result<Int64, FirestoreErrorCode>] = [:]

        func answer(_ batch: Int64) -> Result<Int64, FirestoreErrorCode>? {
            if let a = answers[batch] { return a }
            return batch <= highest ? .success(highestTime) : nil
        }

        mutating func record(_ batch: Int64, _ answer: Result<Int64, FirestoreErrorCode>, at time: Int64) {
            answers[batch] = answer
            if batch > highest {
                highest = batch
                highestTime = time
            }
            if answers.count > Self.window * 2 {
                for k in answers.keys.sorted().prefix(answers.count - Self.window) { answers[k] = nil }
            }
        }
    }

    let name: DatabaseName
    let log: WriteAheadLog
    /// Which store a resume token belongs to: a store made anew never resumes an old token.
    let epoch: UInt64
    let logger: Logger
    /// Deletions remembered for listens that resume; past this the oldest are forgotten and a
    /// listen resuming from before them starts over.
    static let maxTombstones = 100_000
    /// Open transactions at most; past this `BeginTransaction` answers `RESOURCE_EXHAUSTED`.
    static let maxTransactions = 10_000
    /// A transaction unused for this long is forgotten (Firestore's: 270 s idle).
    static let transactionIdleMicros: Int64 = 270_000_000

    struct State: Sendable {
        /// Documents by collection path, then id.
        var collections: [ResourcePath: [String: StoredDocument]] = [:]
        var count = 0
        /// Deleted documents and when.
        var tombstones: [ResourcePath: Int64] = [:]
        /// Every deletion after this time is in `tombstones`.
        var horizon: Int64 = 0
        var lastCommit: Int64 = 0
        var queue: [PendingCommit] = []
        var writing = false
        var transactions: [Data: TransactionState] = [:]
        var listens = ListenRegistry()
        var failure: String?
        /// Each client store's answered batches (exactly-once marks).
        var marks: [String: ClientMarks] = [:]
        /// Bytes of record payloads appended since the last checkpoint's image was taken.
        var bytesSinceCheckpoint: Int64 = 0
        /// The size of the last checkpoint file written (or read).
        var lastCheckpointBytes = 0
        var checkpointRunning = false
        /// The last checkpoint started (a close waits for it).
        var checkpointTask: Task<Void, Never>?
        /// Closing: no commit is taken any more.
        var closing = false
        /// Waiting for the writer to finish what it has (a close).
        var idleWaiters: [CheckedContinuation<Void, Never>] = []

        func document(_ key: ResourcePath) -> StoredDocument? {
            collections[key.parent]?[key.last]
        }

        mutating func install(_ key: ResourcePath, _ doc: StoredDocument?, at time: Int64) {
            let parent = key.parent
            if let doc {
                if collections[parent, default: [:]].updateValue(doc, forKey: key.last) == nil { count += 1 }
                tombstones[key] = nil
            } else if collections[parent]?.removeValue(forKey: key.last) != nil {
                count -= 1
                if collections[parent]?.isEmpty == true { collections[parent] = nil }
                tombstones[key] = time
            }
        }

        /// Forgets the oldest deletions past the limit, moving the horizon past them.
        mutating func trimTombstones() {
            guard tombstones.count > DocumentStore.maxTombstones else { return }
            let sorted = tombstones.sorted { $0.value < $1.value }
            let drop = sorted.prefix(tombstones.count - DocumentStore.maxTombstones * 3 / 4)
            for (k, _) in drop { tombstones[k] = nil }
            horizon = max(horizon, drop.last?.value ?? horizon)
        }
    }

    /// A transaction's reads, checked when it commits.
    struct TransactionState: Sendable {
        var readOnly: Bool
        /// Each document read: its update time then (0: it did not exist).
        var reads: [ResourcePath: Int64] = [:]
        /// Queries run in it, with what they returned (name and update time).
        var queries: [(WireQuery, [ResourcePath: Int64])] = []
        var lastUsed: Int64
    }

    struct PendingCommit: Sendable {
        enum Operation: Sendable {
            case writes([ParsedWrite])
            case clear
        }
        var operation: Operation
        var transaction: Data?
        /// The client store and batch it is (Ferry's clients): committed once, however often sent.
        var origin: Origin?
        var respond: @Sendable (Result<CommitResult, FirestoreErrorCode>) -> Void
    }

    struct Origin: Sendable {
        var client: String
        var batch: Int64
    }

    struct CommitResult: Sendable {
        var commitTime: Int64
        var results: [(updateTime: Int64, transformResults: [FieldValueData])]
    }

    let state: Mutex<State>

    /// The records since the last checkpoint that make the next one due (and the last
    /// checkpoint's size, whichever is more); see ``StoreCheckpoint``.
    let checkpointBytes: Int
    static let defaultCheckpointBytes = 32 << 20

    /// The store's directory.
    let directory: String

    private init(name: DatabaseName, directory: String, log: WriteAheadLog, state: State, checkpointBytes: Int, logger: Logger) {
        self.name = name
        self.directory = directory
        self.log = log
        self.checkpointBytes = checkpointBytes
        self.epoch = log.storeID.high ^ log.storeID.low
        self.state = Mutex(state)
        self.logger = logger
    }

    /// Opens (creating) the store at `directory`: reads its checkpoint, if any, and replays
    /// the commits after it.
    static func open(at directory: String, name: DatabaseName, checkpointBytes: Int = defaultCheckpointBytes, logger: Logger) throws -> DocumentStore {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var options = LogOptions(durability: .fsync)  // a group of commits is one write and one fdatasync
        options.logger = logger
        let log = try WriteAheadLog.open(at: directory, options: options)
        var s = State()
        do {
            var start = log.firstLSN
            let whole = log.firstLSN.rawValue <= 1
            do {
                let through = try StoreCheckpoint.read(from: log, into: &s)
                // Segments are deleted only below a checkpoint: a log that starts later needs
                // one that reaches its start.
                guard whole || (through.map { $0 >= log.firstLSN.rawValue } ?? false) else {
                    throw FirestoreErrorCode(.dataLoss, through == nil
                        ? "\(StoreCheckpoint.fileName) is missing and the log starts at \(log.firstLSN.rawValue)"
                        : "\(StoreCheckpoint.fileName) ends at LSN \(through!), below the log's start (\(log.firstLSN.rawValue))")
                }
                if let through {
                    start = max(start, LSN(through))
                    s.lastCheckpointBytes = StoreCheckpoint.fileSize(in: directory)
                }
            } catch let e as FirestoreErrorCode where whole {
                // Every record is still in the log: replay them all instead (the damaged file
                // stays until the next checkpoint replaces it).
                logger.error("firestore \(name): \(e.message); replaying the whole log instead")
                s = State()
            } catch let e as FirestoreErrorCode {
                throw FirestoreErrorCode(.dataLoss, "cannot open the server document store at \(directory): \(e.message); the log's records before it were deleted, so it cannot be rebuilt (nothing was changed)")
            }
            try log.forEachRecord(from: start) { r in
                s.bytesSinceCheckpoint += Int64(r.payload.count)
                switch try ServerDocumentRecord.decode(kind: r.kind, r.payload) {
                case .commit(let time, let origin, let documents)?:
                    if let origin { s.marks[origin.client, default: ClientMarks()].record(origin.batch, .success(time), at: time) }
                    for (key, document) in documents {
                        s.install(key, document.map { StoredDocument(fields: $0.fields, createTime: $0.createTime, updateTime: time) }, at: time)
                    }
                    s.lastCommit = max(s.lastCommit, time)
                case .refusal(let client, let batch, let error)?:
                    s.marks[client, default: ClientMarks()].record(batch, .failure(error), at: s.lastCommit)
                case .clear(let time)?:
                    for (parent, docs) in s.collections { for id in docs.keys { s.install(parent.appending(id), nil, at: time) } }
                    s.lastCommit = max(s.lastCommit, time)
                case nil:
                    throw FirestoreErrorCode(.dataLoss, "record kind \(r.kind) at \(r.lsn) is not a server document record: is \(directory) another kind of store?")
                }
            }
            s.trimTombstones()
        } catch {
            log.release()
            throw error
        }
        return DocumentStore(name: name, directory: directory, log: log, state: s, checkpointBytes: checkpointBytes, logger: logger)
    }

    /// Closes the store: takes no more commits (they are answered `UNAVAILABLE`), waits for
    /// the writer to finish those it has and for a checkpoint under way, then writes a
    /// checkpoint when what was committed since the last one weighs an eighth of it or more
    /// (so that the next open replays little, and a close after a few commits does not
    /// rewrite the whole state), unless the store failed.
    func close() async {
        await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
            let idle = state.withLock { s -> Bool in
                s.closing = true
                if s.writing { s.idleWaiters.append(c) }
                return !s.writing
            }
            if idle { c.resume() }
        }
        // The writer is done, so no checkpoint starts after this one.
        await state.withLock { $0.checkpointTask }?.value
        let image: (StoreCheckpoint, Int64)? = state.withLock { s in
            guard s.failure == nil, s.bytesSinceCheckpoint > 0, s.bytesSinceCheckpoint * 8 >= Int64(s.lastCheckpointBytes) else { return nil }
            defer { s.bytesSinceCheckpoint = 0 }
            return (StoreCheckpoint(s, throughLSN: log.nextLSN.rawValue), s.bytesSinceCheckpoint)
        }
        if let image { await writeCheckpoint(image.0, covering: image.1) }
        try? await log.close()
    }

    /// Now, as a commit time: strictly after the last one.
    static func nextTime(after last: Int64) -> Int64 {
        max(Int64(Date().timeIntervalSince1970 * 1_000_000), last + 1)
    }

    // MARK: Reads

    /// The documents `keys` name, as installed, and the time they are read at.
    func documents(_ keys: [ResourcePath], transaction: Data?) throws -> (docs: [StoredDocument?], readTime: Int64) {
        try state.withLock { s in
            try Self.checkOpen(s)
            let docs = keys.map { s.document($0) }
            if let transaction {
                try Self.useTransaction(&s, transaction) { t in
                    // The first read counts: a document read again after it changed aborts the commit.
                    for (k, d) in zip(keys, docs) where t.reads[k] == nil { t.reads[k] = d?.updateTime ?? 0 }
                }
            }
            return (docs, s.lastCommit)
        }
    }

    /// The query's results (offset and limit applied), and the time they are read at.
    func run(_ q: WireQuery, transaction: Data?) throws -> (docs: [(ResourcePath, StoredDocument)], readTime: Int64) {
        try state.withLock { s in
            try Self.checkOpen(s)
            let out = Self.run(q, in: s, overlay: [:])
            if let transaction {
                try Self.useTransaction(&s, transaction) { t in
                    t.queries.append((q, Dictionary(out.map { ($0.0, $0.1.updateTime) }, uniquingKeysWith: { a, _ in a })))
                }
            }
            return (out, s.lastCommit)
        }
    }

    /// Every document of `q` (filters and cursors applied), in its order, over the installed
    /// documents with `overlay` in place of theirs (nil: deleted); then offset and limit.
    static func run(_ q: WireQuery, in s: State, overlay: [ResourcePath: StoredDocument?]) -> [(ResourcePath, StoredDocument)] {
        let core = q.core
        let orders = core.orders
        var matching: [LocalDocument] = []
        var stored: [ResourcePath: StoredDocument] = [:]
        func consider(_ key: ResourcePath, _ doc: StoredDocument) {
            let local = LocalDocument.stored(key, doc.fields)
            if core.matches(local, orders: orders) {
                matching.append(local)
                stored[key] = doc
            }
        }
        func scan(_ parent: ResourcePath, _ docs: [String: StoredDocument]) {
            for (id, doc) in docs {
                let key = parent.appending(id)
                if overlay[key] != nil { continue }
                consider(key, doc)
            }
        }
        if let group = core.collectionGroup {
            for (parent, docs) in s.collections where parent.last == group && core.path.isPrefix(of: parent) { scan(parent, docs) }
        } else if let docs = s.collections[core.path] {
            scan(core.path, docs)
        }
        for (key, doc) in overlay where core.holds(key) {
            if let doc { consider(key, doc) }
        }
        matching.sort { QueryCore.compare($0, $1, orders) < 0 }
        var window = matching[...].dropFirst(q.offset)
        if let limit = core.limit { window = window.prefix(limit) }
        return window.map { ($0.key, stored[$0.key]!) }
    }

    /// The ids of the collections directly below `parent` that hold documents (at any depth).
    func collectionIDs(below parent: ResourcePath) throws -> [String] {
        try state.withLock { s in
            try Self.checkOpen(s)
            var ids = Set<String>()
            let depth = parent.segments.count
            for c in s.collections.keys where c.segments.count > depth && parent.isPrefix(of: c) { ids.insert(c.segments[depth]) }
            return ids.sorted { FieldValueData.compareSegments([$0], [$1]) < 0 }
        }
    }

    /// The documents of a collection in name order, with (when `showMissing`) the names that
    /// hold subcollections but no document (nil).
    func list(_ collection: ResourcePath, showMissing: Bool) throws -> (docs: [(ResourcePath, StoredDocument?)], readTime: Int64) {
        try state.withLock { s in
            try Self.checkOpen(s)
            var out: [ResourcePath: StoredDocument?] = [:]
            for (id, d) in s.collections[collection] ?? [:] { out[collection.appending(id)] = d }
            if showMissing {
                let depth = collection.segments.count + 1
                for c in s.collections.keys where c.segments.count > depth && collection.isPrefix(of: c) {
                    let key = ResourcePath(Array(c.segments.prefix(depth)))
                    if out[key] == nil { out[key] = .some(nil) }
                }
            }
            return (out.sorted { $0.key < $1.key }.map { ($0.key, $0.value) }, s.lastCommit)
        }
    }

    // MARK: Transactions

    func beginTransaction(readOnly: Bool) throws -> Data {
        try state.withLock { s in
            try Self.checkOpen(s)
            let now = Int64(Date().timeIntervalSince1970 * 1_000_000)
            if s.transactions.count >= Self.maxTransactions {
                s.transactions = s.transactions.filter { now - $0.value.lastUsed < Self.transactionIdleMicros }
                if s.transactions.count >= Self.maxTransactions {
                    throw FirestoreErrorCode(.resourceExhausted, "too many open transactions (\(Self.maxTransactions)); commit or roll some back")
                }
            }
            var id = Data(count: 16)
            for i in 0..<16 { id[i] = UInt8.random(in: 0...255) }
            s.transactions[id] = TransactionState(readOnly: readOnly, lastUsed: now)
            return id
        }
    }

    /// Forgets a transaction. One already ended (committed, aborted, expired) is no error: a
    /// client rolls back after a commit that failed.
    func rollback(_ id: Data) throws {
        try state.withLock { s in
            try Self.checkOpen(s)
            s.transactions[id] = nil
        }
    }

    private static func useTransaction(_ s: inout State, _ id: Data, _ body: (inout TransactionState) -> Void) throws {
        guard var t = s.transactions[id] else {
            throw FirestoreErrorCode(.invalidArgument, "the transaction has expired or is not one of this database's")
        }
        t.lastUsed = Int64(Date().timeIntervalSince1970 * 1_000_000)
        body(&t)
        s.transactions[id] = t
    }

    private static func checkOpen(_ s: State) throws {
        if let failure = s.failure { throw FirestoreErrorCode(.unavailable, "this database's store failed (\(failure)); the server refuses it until restarted") }
    }

    // MARK: Commits

    /// Applies `writes` atomically (in a transaction when given) once they are durable.
    func commit(_ writes: [ParsedWrite], transaction: Data?) async throws -> CommitResult {
        try await enqueue(.writes(writes), transaction: transaction)
    }

    /// Every document removed (the emulator's clear-data request), as one durable commit.
    func clear() async throws {
        _ = try await enqueue(.clear, transaction: nil)
    }

    private func enqueue(_ op: PendingCommit.Operation, transaction: Data?) async throws -> CommitResult {
        try await withCheckedThrowingContinuation { (c: CheckedContinuation<CommitResult, any Error>) in
            submit([PendingCommit(operation: op, transaction: transaction, origin: nil, respond: { c.resume(with: $0.mapError { $0 }) })])
        }
    }

    /// Several clients' batches, each committed atomically and once (a batch its client's
    /// mark already covers is answered as committed again), in order, in one group.
    func commitBatches(client: String, _ batches: [(id: Int64, writes: Result<[ParsedWrite], FirestoreErrorCode>)]) async -> [Result<CommitResult, FirestoreErrorCode>] {
        let results = Mutex<[Result<CommitResult, FirestoreErrorCode>?]>(Array(repeating: nil, count: batches.count))
        await withCheckedContinuation { (done: CheckedContinuation<Void, Never>) in
            let left = Atomic<Int>(batches.count)
            let finish: @Sendable (Int, Result<CommitResult, FirestoreErrorCode>) -> Void = { i, r in
                results.withLock { $0[i] = r }
                if left.subtract(1, ordering: .acquiringAndReleasing).newValue == 0 { done.resume() }
            }
            if batches.isEmpty { return done.resume() }
            var pending: [PendingCommit] = []
            for (i, b) in batches.enumerated() {
                switch b.writes {
                case .failure(let e): finish(i, .failure(e))
                case .success(let writes):
                    pending.append(PendingCommit(operation: .writes(writes), transaction: nil, origin: Origin(client: client, batch: b.id), respond: { finish(i, $0) }))
                }
            }
            submit(pending)
        }
        return results.withLock { $0.map { $0! } }
    }

    private func submit(_ commits: [PendingCommit]) {
        guard !commits.isEmpty else { return }
        let start: Bool = state.withLock { s in
            if let failure = s.failure {
                for c in commits { c.respond(.failure(FirestoreErrorCode(.unavailable, "this database's store failed (\(failure))"))) }
                return false
            }
            if s.closing {
                for c in commits { c.respond(.failure(FirestoreErrorCode(.unavailable, "the server is shutting down"))) }
                return false
            }
            s.queue += commits
            if s.writing { return false }
            s.writing = true
            return true
        }
        if start { Task { await self.drain() } }
    }

    private func drain() async {
        while true {
            let group: [PendingCommit]? = state.withLock { s in
                if s.queue.isEmpty {
                    s.writing = false
                    for c in s.idleWaiters { c.resume() }
                    s.idleWaiters = []
                    return nil
                }
                defer { s.queue.removeAll() }
                return s.queue
            }
            guard let group else { return }
            await write(group)
            checkpointIfDue()
        }
    }

    /// One group: computed over the installed documents, stored, installed, published, answered.
    private func write(_ group: [PendingCommit]) async {
        var overlay: [ResourcePath: StoredDocument?] = [:]
        var outcomes: [Result<CommitResult, FirestoreErrorCode>] = []
        var changes: [DocumentChangeRecord] = []
        var batch = LogBatch()
        var payloadBytes = 0
        var last = state.withLock { $0.lastCommit }
        var marks: [String: ClientMarks] = [:]
        state.withLock { s in
            for p in group {
                if let o = p.origin, let answer = (marks[o.client] ?? s.marks[o.client])?.answer(o.batch) {
                    // Answered before (the answer was lost): answered again the same, applied once.
                    outcomes.append(answer.map { CommitResult(commitTime: $0, results: []) })
                    continue
                }
                let time = Self.nextTime(after: last)
                // This commit's documents, over the group's overlay (merged in only if it succeeds:
                // a copy of the overlay per commit made a group's cost quadratic).
                var local: [ResourcePath: StoredDocument?] = [:]
                do {
                    var results: [(updateTime: Int64, transformResults: [FieldValueData])] = []
                    var written: [ResourcePath] = []
                    var rec = PayloadWriter()
                    switch p.operation {
                    case .writes(let writes):
                        if let id = p.transaction { try Self.checkTransaction(id, in: s, overlay: overlay) }
                        for w in writes {
                            let before = local[w.key] ?? overlay[w.key] ?? s.document(w.key)
                            let (after, transformResults) = try w.apply(to: before, at: time)
                            local[w.key] = .some(after)
                            if !written.contains(w.key) { written.append(w.key) }
                            results.append((time, transformResults))
                        }
                        if let o = p.origin {
                            rec.u8(2)
                            rec.i64(time)
                            rec.string(o.client)
                            rec.i64(o.batch)
                        } else {
                            rec.u8(1)
                            rec.i64(time)
                        }
                        rec.u32(UInt32(written.count))
                        for k in written {
                            rec.path(k)
                            if let d = local[k]! {
                                rec.u8(1)
                                rec.i64(d.createTime)
                                rec.fields(d.fields)
                            } else {
                                rec.u8(0)
                            }
                        }
                        batch.append(kind: RecordKind.commit.rawValue, payload: rec.bytes)
                        payloadBytes += rec.bytes.count
                    case .clear:
                        for (parent, docs) in s.collections { for id in docs.keys { local[parent.appending(id)] = .some(nil) } }
                        for (k, d) in overlay where d != nil { local[k] = .some(nil) }
                        written = local.keys.filter { (overlay[$0] ?? s.document($0)) != nil }
                        rec.i64(time)
                        batch.append(kind: RecordKind.clear.rawValue, payload: rec.bytes)
                        payloadBytes += rec.bytes.count
                    }
                    for k in written { changes.append(DocumentChangeRecord(key: k, before: overlay[k] ?? s.document(k), after: local[k]!, time: time)) }
                    overlay.merge(local) { $1 }
                    last = time
                    if let o = p.origin { marks[o.client, default: s.marks[o.client] ?? ClientMarks()].record(o.batch, .success(time), at: time) }
                    outcomes.append(.success(CommitResult(commitTime: time, results: results)))
                } catch {
                    let e = error as? FirestoreErrorCode ?? FirestoreErrorCode(.internal, "\(error)")
                    outcomes.append(.failure(e))
                    if let o = p.origin {
                        // Refused: recorded, so that the batch sent again is refused again.
                        var rec = PayloadWriter()
                        rec.string(o.client)
                        rec.i64(o.batch)
                        rec.u32(UInt32(e.code.rawValue))
                        rec.string(e.message)
                        batch.append(kind: RecordKind.refusal.rawValue, payload: rec.bytes)
                        payloadBytes += rec.bytes.count
                        marks[o.client, default: s.marks[o.client] ?? ClientMarks()].record(o.batch, .failure(e), at: last)
                    }
                }
                if let id = p.transaction { s.transactions[id] = nil }
                if case .clear = p.operation { s.transactions = [:] }
            }
        }
        if !batch.isEmpty {
            do {
                let range = try log.enqueue(batch)
                try await log.awaitDurability(of: range)
            } catch {
                let message = "\(error)"
                logger.error("firestore \(name): the store failed (\(message)); refusing it from now on")
                let queued: [PendingCommit] = state.withLock { s in
                    s.failure = message
                    defer { s.queue.removeAll() }
                    return s.queue
                }
                for p in group + queued { p.respond(.failure(FirestoreErrorCode(.unavailable, "the store failed: \(message)"))) }
                return
            }
            state.withLock { s in
                s.bytesSinceCheckpoint += Int64(payloadBytes)
                for c in changes { s.install(c.key, c.after, at: c.time) }
                s.marks.merge(marks) { $1 }
                s.lastCommit = last
                s.trimTombstones()
                Self.publish(changes, at: last, &s, database: name, epoch: epoch)
            }
        }
        for (p, o) in zip(group, outcomes) {
            switch o {
            case .success(let r): p.respond(.success(r))
            case .failure(let e): p.respond(.failure(e))
            }
        }
    }

    /// Refuses (`ABORTED`) a transaction whose reads changed since, or (`INVALID_ARGUMENT`)
    /// one the store does not know.
    private static func checkTransaction(_ id: Data, in s: State, overlay: [ResourcePath: StoredDocument?]) throws {
        guard let t = s.transactions[id] else {
            throw FirestoreErrorCode(.invalidArgument, "the transaction has expired or is not one of this database's")
        }
        func current(_ k: ResourcePath) -> Int64 { (overlay[k] ?? s.document(k))?.updateTime ?? 0 }
        for (k, v) in t.reads where current(k) != v {
            throw FirestoreErrorCode(.aborted, "the transaction read \(k), which changed before it committed; run it again")
        }
        for (q, seen) in t.queries {
            let now = run(q, in: s, overlay: overlay)
            if now.count != seen.count || now.contains(where: { seen[$0.0] != $0.1.updateTime }) {
                throw FirestoreErrorCode(.aborted, "a query the transaction ran has other results now; run it again")
            }
        }
    }
}
