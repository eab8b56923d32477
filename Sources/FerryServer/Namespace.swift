@_spi(Server) import Ferry
import FerryLog
import FerryWire
import Foundation
import Logging
import Synchronization

/// A change to a client's presence registrations (see ``Namespace``).
enum PresenceChange: Sendable {
    /// Run this operation (`{"op", "path", "data", "caller"}`) when the client's connection ends.
    case add(Value)
    /// Forget the operations at or below these keys.
    case cancel([String])
}

/// What happened to one write.
struct WriteOutcome: Sendable {
    var status: Int
    var body: Value = .null
    var error: String?
    var etag: String?
    var duplicate = false
    /// The commit a success is visible at (see ``Namespace``).
    var commit: Int64?

    static func rejected(_ status: Int, _ message: String) -> WriteOutcome {
        WriteOutcome(status: status, error: message)
    }
}

/// One write for the namespace's writer.
struct WriteJob: Sendable {
    enum Op: Sendable {
        case set(Value)
        /// Children relative to the job's location, each a key path, in a stable order.
        case update([(keys: [String], value: Value)])
        /// Replace the security rules.
        case rules(Rules, text: String)
        /// Already rejected before reaching the writer (bad input in a batch): only recorded.
        case rejected(WriteOutcome)
        /// A client's presence registrations change.
        case presence(client: String, PresenceChange)
        /// A disconnected client's registrations up to `through` (their `seq`) run, in order,
        /// as one write, and are done.
        case presenceRun(client: String, through: Int64)
    }
    var op: Op
    var keys: [String]
    var pushName: String?
    var ifMatch: String?
    var caller: Caller
    var identity: WriteIdentity?
    var acked: Int64 = 0
    /// Whether the answer shows the written data (a batch's answers show only statuses).
    var answersData = true
    var complete: @Sendable (WriteOutcome) -> Void
}

/// A change for the event streams: what a write did to the tree — the values before and
/// after at each location it wrote (not whole trees: keeping those would make every write copy
/// the objects on its path).
struct Change: Sendable {
    /// One written location, relative to the write's (empty for a set).
    struct Part: Sendable {
        var keys: [String]
        /// The value before (nil once the change is kept in the history: not known).
        var old: Value?
        var new: Value
    }
    var keys: [String]
    /// The written locations; a set has one, at `keys`.
    var parts: [Part]
    /// An update (its parts are a patch); false for a set.
    var isUpdate: Bool
    /// Its commit number.
    var commit: Int64

    /// About how many bytes its new values hold.
    var approximateBytes: Int { parts.reduce(64) { $0 + ValueTree.approximateBytes($1.new) } }

    /// The change as the history keeps it: without the values before (which would keep
    /// replaced trees alive).
    var forHistory: Change {
        var c = self
        for i in c.parts.indices { c.parts[i].old = nil }
        return c
    }
}

extension Change {
    /// The change of `parts` written at the root's level: a patch of the root, or — when one
    /// of them is the root itself (none is then inside another) — a set of it.
    init(rootParts parts: [Part], commit: Int64) {
        if let whole = parts.first(where: { $0.keys.isEmpty }) {
            self.init(keys: [], parts: [whole], isUpdate: false, commit: commit)
        } else {
            self.init(keys: [], parts: parts, isUpdate: true, commit: commit)
        }
    }
}

/// What one write changes in the namespace's store: the data locations it wrote (as keys below
/// `data`) and the other locations' values (`meta/…`).
struct StoreMerge {
    var data: [[String]] = []
    var meta: [String: Value] = [:]

    var isEmpty: Bool { data.isEmpty && meta.isEmpty }

    /// Notes a write at `keys`, with `tree` the writer's tree before it. A location below one
    /// that holds a leaf is stored from that leaf's location, since the write replaces the
    /// leaf: a value stored below a leaf would be dropped (a removal below a leaf changes
    /// nothing). The store's paths are one key deeper (`data/…`), so a write at the deepest
    /// level stores its parent.
    mutating func write(at keys: [String], before tree: Value) {
        var at = keys.count >= Path.maxDepth ? Array(keys.prefix(Path.maxDepth - 1)) : keys
        var node = tree
        for (n, k) in at.enumerated() {
            if case .object(let o) = node, o[".value"] == nil {
                node = o[k] ?? .null
            } else if case .null = node {
                break
            } else {
                at = Array(at[..<n])
                break
            }
        }
        data.append(at)
    }
}

/// The store writes of a run of writes as one merge, with each location's value at the end of
/// the run: what storing the writes one after another leaves.
///
/// Data locations are kept as paths (none inside another: a location below one already kept is
/// covered by it); their values are read from the writer's tree when the merge is stored.
struct FoldedMerge {
    /// Data paths (keys below `data`, joined by `/`) to their keys.
    private(set) var paths: [String: [String]] = [:]
    /// For each proper prefix of a kept path, how many kept paths lie below it.
    private var below: [String: Int] = [:]
    /// The other locations (`meta/…`), last value kept.
    private(set) var meta: [String: Value] = [:]
    /// About how many bytes the writes held.
    private(set) var bytes = 0
    /// How many writes were added.
    private(set) var writes = 0
    /// Past this many bytes, or this many writes, the merge is stored (while the writes after
    /// it are decided) and a new one begun: records stay well under the log's 64 MiB.
    static let maxBytes = 4 << 20
    static let maxWrites = 1_000

    var isEmpty: Bool { paths.isEmpty && meta.isEmpty }
    var isFull: Bool { bytes > FoldedMerge.maxBytes || writes >= FoldedMerge.maxWrites }

    /// Adds one write's store merge (see `Namespace.process`), whose data holds about `size`
    /// bytes.
    mutating func add(_ merge: StoreMerge, size: Int) {
        bytes += size
        writes += 1
        for keys in merge.data { add(keys: keys) }
        for (k, v) in merge.meta { meta[k] = v }
    }

    private mutating func add(keys: [String]) {
        let path = keys.joined(separator: "/")
        var prefix = ""
        if paths[""] != nil { return }
        for (n, k) in keys.dropLast().enumerated() {
            prefix += (n == 0 ? "" : "/") + k
            if paths[prefix] != nil { return }  // covered by a location above
        }
        if paths[path] != nil { return }
        if keys.isEmpty {
            paths = [:]
            below = [:]
        } else if below[path] != nil {
            for k in paths.keys where k.hasPrefix(path + "/") { remove(k) }
        }
        paths[path] = keys
        var p = ""
        if !keys.isEmpty { below["", default: 0] += 1 }
        for (n, k) in keys.dropLast().enumerated() {
            p += (n == 0 ? "" : "/") + k
            below[p, default: 0] += 1
        }
    }

    private mutating func remove(_ path: String) {
        guard let keys = paths.removeValue(forKey: path) else { return }
        var p = ""
        var prefixes = keys.isEmpty ? [] : [""]
        for (n, k) in keys.dropLast().enumerated() {
            p += (n == 0 ? "" : "/") + k
            prefixes.append(p)
        }
        for q in prefixes {
            below[q, default: 1] -= 1
            if below[q] == 0 { below[q] = nil }
        }
    }

    /// The merge to store: each data path's value in `tree` (the writer's, after the writes).
    func entries(tree: Value) -> [String: Value] {
        var out = meta
        out.reserveCapacity(meta.count + paths.count)
        for (path, keys) in paths {
            out[path.isEmpty ? "data" : "data/" + path] = ValueTree.child(tree, keys[...])
        }
        return out
    }
}

/// The latest commits of a namespace, for streams that resume after one of them
/// (`Last-Event-ID`): bounded by count and about by bytes; the oldest go first.
struct CommitHistory {
    private var changes: [Change] = []
    private var bytes: [Int] = []
    private var start = 0
    private var totalBytes = 0
    /// Every commit after this one is held.
    private(set) var floor: Int64
    let maxChanges: Int
    let maxBytes: Int

    init(after commit: Int64, maxChanges: Int, maxBytes: Int) {
        floor = commit
        self.maxChanges = maxChanges
        self.maxBytes = maxBytes
    }

    var count: Int { changes.count - start }

    /// The last commit held (the floor when none is).
    var last: Int64 { count > 0 ? changes[changes.count - 1].commit : floor }

    /// The history that the store's records give, up to the store's `commit`: one change per
    /// stored run of writes (its locations' values at its end) at the run's last commit. The
    /// oldest run read only sets the floor (its run's first commits are not known); a stream
    /// resuming inside a later run gets that run whole — values it may hold already, which
    /// applied again change nothing. Nothing is held unless the records reach `commit`.
    init(_ records: [Database.RecordedServerData], through commit: Int64, maxChanges: Int, maxBytes: Int) {
        var built: CommitHistory?
        for record in records {
            switch record {
            case .put:
                built = nil  // (the store replaced whole: nothing before it can be replayed)
            case .merge(let path, let children):
                guard path == "/", let stored = children.first(where: { $0.path == "meta/commit" }), case .int(let c) = stored.value else { continue }
                var parts: [Change.Part] = []
                for (p, v) in children where p == "data" || p.hasPrefix("data/") {
                    parts.append(.init(keys: p.split(separator: "/").dropFirst().map(String.init), old: nil, new: ValueTree.normalized(v)))
                }
                if var h = built, c > h.last {
                    let change = Change(rootParts: parts, commit: c)
                    h.append(change, size: change.approximateBytes)
                    built = h
                } else {
                    built = CommitHistory(after: c, maxChanges: maxChanges, maxBytes: maxBytes)
                }
            }
        }
        self = built.flatMap { $0.last == commit ? $0 : nil } ?? CommitHistory(after: commit, maxChanges: maxChanges, maxBytes: maxBytes)
    }

    /// Keeps `change`, which holds about `size` bytes.
    mutating func append(_ change: Change, size: Int) {
        changes.append(change.forHistory)
        bytes.append(size)
        totalBytes += size
        while count > 0 && (count > maxChanges || totalBytes > maxBytes) {
            totalBytes -= bytes[start]
            floor = changes[start].commit
            start += 1
        }
        // Drop what went, now and then (not on every append: that would move the rest each time).
        if start > 1024 && start * 2 > changes.count {
            changes.removeFirst(start)
            bytes.removeFirst(start)
            start = 0
        }
    }

    /// The changes after commit `after` that concern the location `keys` (at, above or below
    /// it), oldest first, with about how many bytes of their values lie there — not counting
    /// what they wrote elsewhere, stopping past `maxBytes`; nil when some changes after `after`
    /// are no longer held.
    func changes(after: Int64, concerning keys: [String], maxBytes: Int) -> (changes: [Change], bytes: Int)? {
        guard after >= floor else { return nil }
        var lo = start, hi = changes.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if changes[mid].commit <= after { lo = mid + 1 } else { hi = mid }
        }
        var out: [Change] = []
        var total = 0
        for i in lo..<changes.count {
            let c = changes[i]
            if c.keys.starts(with: keys) {
                total += bytes[i]  // (all of it lies at or below the location)
            } else if keys.starts(with: c.keys) {
                // The location is inside the change: only the parts at, above or below it count.
                var inside = 0
                for p in c.parts {
                    let at = c.keys + p.keys
                    if at.starts(with: keys) {
                        inside += ValueTree.approximateBytes(p.new)
                    } else if keys.starts(with: at) {
                        inside += ValueTree.approximateBytes(ValueTree.child(p.new, keys.dropFirst(at.count)))
                    } else {
                        continue
                    }
                }
                total += inside
            } else {
                continue
            }
            out.append(c)
            if total > maxBytes { break }
        }
        return (out, total)
    }
}

/// One listening client: events go to its connection as they come (see ``StreamOutput``).
final class StreamSink: Sendable {
    let keys: [String]
    let query: WireQuery?
    let caller: Caller
    /// The user token the stream was opened with (nil for the owner and anonymous streams).
    let token: String?
    /// The client store the stream belongs to (`X-Ferry-Client`), when it said.
    let client: String?
    private let output: StreamOutput

    /// A query stream's last result sent (it is sent again only when it changes).
    let lastView = FerryMutex<Value?>(nil)

    init(keys: [String], query: WireQuery?, caller: Caller, token: String?, client: String? = nil, output: StreamOutput) {
        self.keys = keys
        self.query = query
        self.caller = caller
        self.token = token
        self.client = client
        self.output = output
    }

    /// Events held back while a group's events are collected (see ``hold()``).
    private let held = FerryMutex<[StreamEvent]?>(nil)

    func send(_ e: StreamEvent) {
        if let id = e.id { lastID.withLock { $0 = id } }
        let queued = held.withLock { h -> Bool in
            guard h != nil else { return false }
            h!.append(e)
            return true
        }
        if !queued { output.send([e]) }
    }

    /// Collects the events sent from now until ``release()``, to write them in one go (one
    /// task on the connection's loop and one flush, not one per event).
    func hold() { held.withLock { $0 = [] } }

    /// Sends the events held since ``hold()``.
    func release() {
        let events = held.withLock { h -> [StreamEvent] in
            defer { h = nil }
            return h ?? []
        }
        if !events.isEmpty { output.send(events) }
    }

    /// The last `id:` sent.
    private let lastID = FerryMutex<String?>(nil)

    /// Says that the stream is current through commit `commit`, unless its last event did.
    func progress(_ commit: Int64) {
        let id = String(commit)
        if lastID.withLock({ $0 }) != id { send(.progress(id)) }
    }

    /// Headers for the stream's answer (before its first event).
    func announce(_ headers: [(String, String)]) { output.addHeaders(headers) }

    /// Ends the stream; the connection closes once what was sent before is written.
    func close() {
        release()
        output.end()
    }

    /// The stream's view of `tree`: the value at its location, or its query's result.
    func view(_ tree: Value) -> Value {
        let node = ValueTree.child(tree, keys[...])
        if let query { return ValueTree.exported(query.apply(to: node)) }
        return ValueTree.exported(node)
    }
}

/// One namespace: its storage (see ``NamespaceStorage``: a Ferry store, or PostgreSQL shared
/// with other processes), the committed tree reads see, and one writer that applies writes in
/// arrival order and makes them durable in groups: every write queued while the previous group
/// was being stored shares the next group.
///
/// Every write that changes the data is a *commit*, numbered 1, 2, 3… in the order applied;
/// the number is stored with the write's data (one record, or one transaction), so it survives
/// restarts and never goes back. A write's answer names its commit; every stream event carries
/// the commit its stream reflects once the event is applied (SSE `id:`), and after each group
/// the streams of each client whose writes it answered (`X-Ferry-Client`) learn the group's
/// last number (a progress mark where no event said it). A client that waits until its streams
/// reach an answer's number never shows the data from before the write again.
///
/// With a shared storage, the commits of other processes reach this one's tree, history and
/// streams in commit order: before each group (under the storage's lock, so every write is
/// decided against all commits before it), when the storage says there are new ones, and before
/// each read and new stream.
final class Namespace: Sendable {
    let name: String
    let storage: any NamespaceStorage
    /// Names this namespace's data and commits (its creation time): a commit number from
    /// before its store was made anew is not one of its own.
    let epoch: String
    /// How long a disconnected client's registrations wait for it (see ``runPresence(_:)``).
    let presenceTimeout: Duration
    /// The file that marks the namespace as keeping registrations (``markPresence(_:)``); nil
    /// when the storage is shared (another process's clients' registrations are theirs).
    let presenceMarker: String?
    /// The most bytes of missed changes a stream resumes with (the whole value past it).
    let maxResumeBytes: Int
    /// How long a shared storage may take to begin a group or answer a catch-up (see
    /// ``withinStorageWait(_:)``).
    let storageWait: Duration
    let logger: Logger
    private let wake: AsyncStream<Void>.Continuation
    private let wakes: AsyncStream<Void>
    private let pushIDs = FerryMutex(PushIDGenerator())

    struct State {
        /// What reads and new streams see: only durable writes.
        var committed: Value
        /// The number of the last commit in `committed`.
        var commit: Int64
        /// The number of the last commit in `working`.
        var workingCommit: Int64
        /// The writer's tree: committed plus the writes of the group being synced.
        var working: Value
        var clients: [String: Value]
        var rules: Rules
        var queue: [WriteJob] = []
        var streams = StreamIndex()
        var nextStream = 0
        /// The latest commits, for streams that resume.
        var history: CommitHistory
        var failure: String?
        var closing = false
        var writerIdle = true
        /// Each client's presence registrations, in order (`meta/presence/STORE`).
        var presence: [String: [Value]] = [:]
        /// Each client's open presence streams.
        var presenceStreams: [String: Int] = [:]
        /// Clients whose registrations are being run.
        var presenceRunning: Set<String> = []
        /// The last registration's number.
        var presenceSeq: Int64 = 0
        /// Reads waiting for the writer to bring in other processes' commits (shared storage).
        var catchUpWaiters: [CheckedContinuation<Bool, Never>] = []
        /// The storage said other processes committed.
        var catchUpWanted = false
    }
    let state: FerryMutex<State>
    /// The rules of a namespace that has not set its own.
    private let defaultRules: Rules

    /// Opens (creating) the namespace's Ferry store under `directory`.
    convenience init(name: String, directory: String, logger: Logger, historyLimits: (changes: Int, bytes: Int) = (100_000, 64 << 20),
                     presenceTimeout: Duration = .seconds(60), maxResumeBytes: Int = 8 << 20, defaultRules: Rules = Rules(root: nil)) async throws {
        try await self.init(name: name, storage: FerryStoreStorage(directory: directory), presenceMarker: directory + ".presence", logger: logger,
                            historyLimits: historyLimits, presenceTimeout: presenceTimeout, maxResumeBytes: maxResumeBytes, defaultRules: defaultRules)
    }

    /// Opens (creating) the namespace in `storage`; `historyLimits` bound the commits kept for
    /// streams that resume.
    init(name: String, storage: any NamespaceStorage, presenceMarker: String?, logger: Logger,
         historyLimits: (changes: Int, bytes: Int) = (100_000, 64 << 20),
         presenceTimeout: Duration = .seconds(60), maxResumeBytes: Int = 8 << 20, defaultRules: Rules = Rules(root: nil),
         storageWait: Duration = .seconds(10)) async throws {
        self.name = name
        self.storage = storage
        self.storageWait = storageWait
        self.logger = logger
        self.presenceTimeout = presenceTimeout
        self.presenceMarker = presenceMarker
        self.maxResumeBytes = maxResumeBytes
        self.defaultRules = defaultRules
        let stored = try await storage.open(historyLimits: historyLimits, logger: logger)
        epoch = stored.epoch
        var initial = State(committed: stored.data, commit: stored.commit, workingCommit: stored.commit, working: stored.data,
                            clients: stored.clients, rules: Namespace.rules(stored.rulesText, defaultRules, logger), history: stored.history)
        initial.presence = stored.presence
        initial.presenceSeq = stored.presence.values.joined().map(Namespace.presenceSeq).max() ?? 0
        state = FerryMutex(initial)
        (wakes, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        Task { [self] in await runWriter() }
        if storage.isShared {
            storage.watch { [weak self] in self?.othersCommitted() }
            othersCommitted()  // (what was committed between the open's read and the watch)
        }
        // Registrations of clients connected before a restart: they run unless the client
        // connects again within the timeout. (In a shared storage, they are another process's
        // clients' until its lease says otherwise.)
        if !stored.presence.isEmpty && !storage.isShared {
            Task { [self] in
                try? await Task.sleep(for: presenceTimeout)
                for client in stored.presence.keys { runPresence(client) }
            }
        }
    }

    /// The rules of a stored text (`defaults` when none).
    private static func rules(_ text: String?, _ defaults: Rules, _ logger: Logger) -> Rules {
        guard let text else { return defaults }
        do {
            return try Rules(body: try Value(json: text))
        } catch {
            // Rules once accepted that no longer parse: nothing is granted until the owner sets them again.
            logger.error("the namespace's stored rules do not parse (\(error)); only the administrator may read or write until they are set again")
            return Rules(root: Rules.Node(read: nil, write: nil, validate: nil, children: [:], wildcard: nil))
        }
    }

    /// A new push id (Firebase's: time-ordered, 20 characters).
    func nextPushID() -> String {
        pushIDs.withLock { $0.next(now: Namespace.now()) }
    }

    // MARK: Writes

    /// Queues writes (in this order, contiguously); each job's `complete` runs once it is durable
    /// (or rejected, or failed).
    func submit(_ jobs: [WriteJob]) {
        let refused: String? = state.withLock { s in
            if let f = s.failure { return f }
            if s.closing { return "the server is shutting down" }
            s.queue.append(contentsOf: jobs)
            return nil
        }
        if let refused {
            for j in jobs { j.complete(.rejected(503, refused)) }
            return
        }
        wake.yield()
    }

    private func runWriter() async {
        for await _ in wakes {
            while true {
                let (jobs, waiters, wanted) = state.withLock { s in
                    defer {
                        s.queue = []
                        s.catchUpWaiters = []
                        s.catchUpWanted = false
                    }
                    s.writerIdle = s.queue.isEmpty && s.catchUpWaiters.isEmpty && !s.catchUpWanted
                    return (s.queue, s.catchUpWaiters, s.catchUpWanted)
                }
                if jobs.isEmpty && waiters.isEmpty && !wanted { break }
                // (A group brings in other processes' commits first, as a catch-up does.)
                let current = await withinStorageWait { began in jobs.isEmpty ? await self.catchUp() : await self.runGroup(jobs, began: began) }
                for w in waiters { w.resume(returning: current) }
            }
        }
    }

    /// Runs a group or a catch-up; with a shared storage, cancels it when the storage has not
    /// begun it (`began`) within ``storageWait``, or not finished it within six times that: a
    /// database that does not answer, or a connection pool that cannot grow, then costs the
    /// group's writes a 503, which clients retry, instead of a wait without end.
    private func withinStorageWait(_ work: @escaping @Sendable (_ began: @escaping @Sendable () -> Void) async -> Bool) async -> Bool {
        guard storage.isShared else { return await work {} }
        let started = StartFlag()
        let wait = storageWait
        return await withTaskGroup(of: Bool?.self) { group in
            group.addTask { await work { started.set() } }
            group.addTask {
                try? await Task.sleep(for: wait)
                return nil
            }
            var waited = 1
            while let result = await group.next() {
                if let result {
                    group.cancelAll()
                    return result
                }
                // Not begun within the wait, or begun and not done within six: the work is
                // cancelled (its connection closed), and its writes get 503s.
                if !started.isSet || waited >= 6 {
                    logger.warning("namespace \(name): the storage did not \(started.isSet ? "finish" : "begin") within \(wait * waited); giving up on this group")
                    group.cancelAll()
                } else {
                    waited += 1
                    group.addTask {
                        try? await Task.sleep(for: wait)
                        return nil
                    }
                }
            }
            return false
        }
    }

    private final class StartFlag: Sendable {
        private let flag = FerryMutex(false)
        func set() { flag.withLock { $0 = true } }
        var isSet: Bool { flag.withLock { $0 } }
    }

    /// Applies a group of writes in order, stores them as a few runs (see ``GroupWriter``),
    /// durable together, then commits them: reads see them, streams get their events, callers
    /// get their answers. False when the group could not begin in a shared storage (what other
    /// processes committed is then not known).
    private func runGroup(_ jobs: [WriteJob], began storageBegan: () -> Void) async -> Bool {
        var outcomes: [WriteOutcome] = []  // (the jobs', in order: a job is not copied per step)
        outcomes.reserveCapacity(jobs.count)
        var changes: [Change] = []
        var sizes: [Int] = []  // (each change's approximate bytes)
        var rulesChanged = false
        /// What the writes change besides the trees, as it was before them (nil until the
        /// storage began the group): put back if the group is not stored.
        var before: (clients: [String: Value], rules: Rules, presence: [String: [Value]], seq: Int64)?
        do {
            try await storage.group { missed, writer in
                if let missed { apply(missed) }
                storageBegan()
                before = state.withLock { s in (s.clients, s.rules, s.presence, s.presenceSeq) }
                // The group's writes go to the storage as a few runs (one record per write cost
                // more than the writes' own work), each stored while the writes after it are decided.
                var folded = FoldedMerge()
                var stored = 0  // (changes already handed to the writer)
                func store() async throws {
                    guard !folded.isEmpty else { return }
                    let entries = state.withLock { s in folded.entries(tree: s.working) }
                    folded = FoldedMerge()
                    try await writer.store(entries, commits: changes[stored...])
                    stored = changes.count
                }
                for i in jobs.indices {
                    let (outcome, merge, change) = state.withLock { s in process(jobs[i], &s) }
                    if case .rules = jobs[i].op, outcome.status == 200 { rulesChanged = true }
                    // (Measured once, for the record's size and the history's.)
                    let size = change?.approximateBytes ?? 0
                    if let change {
                        changes.append(change)
                        sizes.append(size)
                    }
                    if let merge {
                        folded.add(merge, size: size)
                        if folded.isFull { try await store() }
                    }
                    outcomes.append(outcome)
                }
                try await store()
            }
        } catch {
            storageFailed(error, jobs: jobs, before: before)
            return before != nil
        }
        state.withLock { s in
            let last = s.workingCommit
            s.commit = last
            // The same changes, in place, on the committed tree (assigning the working tree
            // would share its objects, and the next group's first write would copy them all).
            for (change, size) in zip(changes, sizes) {
                for part in change.parts { ValueTree.set(&s.committed, (change.keys + part.keys)[...], to: part.new) }
                s.history.append(change, size: size)
            }
            Namespace.publish(changes, last: last, rulesChanged: rulesChanged, &s)
            // A duplicate is visible at the commit that applied it, or since: at the last. The
            // streams of the clients answered learn that they are current through it.
            var answered = Set<String>()
            for i in outcomes.indices where outcomes[i].status == 200 {
                if outcomes[i].commit == nil { outcomes[i].commit = last }
                if let client = jobs[i].identity?.store { answered.insert(client) }
            }
            for client in answered {
                for sink in s.streams.of(client: client) { sink.progress(last) }
            }
        }
        for i in outcomes.indices { jobs[i].complete(outcomes[i]) }
        return true
    }

    /// A group the storage did not take. A Ferry store that fails is not trusted again: the
    /// namespace refuses writes from then on. A shared storage is asked again by the next group
    /// (a database restarting, a connection lost): the writer's tree and the rest go back to
    /// what is committed, and the group's writes are answered 503, which clients retry — each
    /// at most once, by its client's mark, should the storage have taken it after all.
    private func storageFailed(_ error: any Error, jobs: [WriteJob],
                               before: (clients: [String: Value], rules: Rules, presence: [String: [Value]], seq: Int64)?) {
        guard storage.isShared else {
            logger.error("namespace \(name): the store failed (\(error)); refusing writes from now on")
            state.withLock { s in
                s.failure = "the store failed: \(error)"
                for (_, sink) in s.streams { sink.close() }
                s.streams.removeAll()
            }
            for j in jobs { j.complete(.rejected(503, "the store failed; the write may not have been applied")) }
            return
        }
        logger.warning("namespace \(name): the storage did not take \(jobs.count) writes (\(error)); they are answered 503")
        state.withLock { s in
            if before != nil {
                // (Once begun, a write may be in the working tree, answered or not. This shares
                // the committed tree's objects: the next write copies those on its path, a cost
                // only after a failure.)
                s.working = s.committed
                s.workingCommit = s.commit
            }
            if let before {
                s.clients = before.clients
                s.rules = before.rules
                s.presence = before.presence
                s.presenceSeq = before.seq
            }
        }
        for j in jobs { j.complete(.rejected(503, "the storage is unavailable; try again")) }
    }

    /// Brings in what other processes committed since this one last read the storage: true when
    /// the storage answered.
    private func catchUp() async -> Bool {
        do {
            if let missed = try await storage.catchUp() { apply(missed) }
            return true
        } catch {
            logger.warning("namespace \(name): reading other processes' commits failed: \(error)")
            return false
        }
    }

    /// Applies other processes' commits (between groups: the working tree is the committed one)
    /// to both trees, the history and the streams, and their other locations to the marks,
    /// rules and registrations.
    private func apply(_ missed: MissedCommits) {
        state.withLock { s in
            var applied: [Change] = []
            for var change in missed.changes where change.commit > s.commit {
                for i in change.parts.indices {
                    let at = change.keys + change.parts[i].keys
                    change.parts[i].old = ValueTree.child(s.committed, at[...])
                    ValueTree.set(&s.committed, at[...], to: change.parts[i].new)
                    ValueTree.set(&s.working, at[...], to: change.parts[i].new)
                }
                s.history.append(change, size: change.approximateBytes)
                s.commit = change.commit
                applied.append(change)
            }
            s.commit = max(s.commit, missed.commit)
            s.workingCommit = s.commit
            var rulesChanged = false
            for (path, value) in missed.meta {
                let keys = path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
                switch (keys.count, keys.dropFirst().first) {
                case (3, "clients"): s.clients[keys[2]] = value == .null ? nil : value
                case (3, "presence"): s.presence[keys[2]] = StoredNamespace.presenceList(value)
                case (2, "rules"):
                    if case .string(let text) = value { s.rules = Namespace.rules(text, defaultRules, logger) } else { s.rules = defaultRules }
                    rulesChanged = true
                default: break
                }
            }
            s.presenceSeq = max(s.presenceSeq, s.presence.values.joined().map(Namespace.presenceSeq).max() ?? 0)
            Namespace.publish(applied, last: s.commit, rulesChanged: rulesChanged, &s)
        }
    }

    /// Sends committed changes' events to the streams they concern, then ends the streams the
    /// rules no longer let read.
    private static func publish(_ changes: [Change], last: Int64, rulesChanged: Bool, _ s: inout State) {
        // Only the streams at, above or below a written location.
        var touched: [ObjectIdentifier: StreamSink] = [:]
        for change in changes {
            for sink in s.streams.related(to: change.keys) {
                if touched.updateValue(sink, forKey: ObjectIdentifier(sink)) == nil { sink.hold() }
                Namespace.events(for: change, to: sink)
            }
        }
        Namespace.queryEvents(touched.values, changes: changes, tree: s.committed, commit: last)
        for (_, sink) in touched { sink.release() }
        // Streams the rules no longer let read: after new rules, or after a change to data
        // (or the time) their .read rules look at.
        if rulesChanged || (s.rules.readsDependOnData && !changes.isEmpty) {
            for (id, sink) in s.streams where !Namespace.mayRead(sink.caller, sink.keys, s) {
                sink.send(.cancel)
                sink.close()
                s.streams[id] = nil
            }
        }
    }

    /// Waits until this process holds every commit the storage held when asked (at once when no
    /// other process shares it): false when the storage did not answer.
    func current() async -> Bool {
        guard storage.isShared else { return true }
        return await withCheckedContinuation { (c: CheckedContinuation<Bool, Never>) in
            let refused = state.withLock { s -> Bool in
                if s.closing { return true }
                s.catchUpWaiters.append(c)
                return false
            }
            if refused { c.resume(returning: false) } else { wake.yield() }
        }
    }

    /// The storage says other processes committed: the writer brings their commits in.
    func othersCommitted() {
        state.withLock { $0.catchUpWanted = true }
        wake.yield()
    }

    /// Whether the rules let `caller` read at `keys` (the committed data is `data`).
    static func mayRead(_ caller: Caller, _ keys: [String], _ s: State) -> Bool {
        if case .owner = caller { return true }
        return s.rules.mayRead(keys, auth: caller.auth, data: s.committed, now: now())
    }

    /// Whether the rules let `caller` make `writes` (server values resolved) to the working tree.
    static func mayWrite(_ caller: Caller, _ writes: [(keys: [String], value: Value)], _ s: State) -> Bool {
        if case .owner = caller { return true }
        return s.rules.mayWrite(writes, auth: caller.auth, data: s.working, now: now())
    }

    /// The time in milliseconds since 1970 (`now` in rules, server timestamps).
    static func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    /// Decides one write against the working tree: its outcome, the record to store (data and
    /// the client's mark together, so they are atomic), and its change for the streams.
    private func process(_ job: WriteJob, _ s: inout State) -> (WriteOutcome, StoreMerge?, Change?) {
        // At most once: a write at or below the client's mark was processed already.
        if let identity = job.identity, case .object(let meta)? = s.clients[identity.store],
           let applied = meta["applied"]?.number, Double(identity.id) <= applied {
            var outcome = WriteOutcome(status: 200, duplicate: true)
            if case .object(let outcomes)? = meta["outcomes"], case .object(let recorded)? = outcomes[String(identity.id)] {
                outcome.status = Int(recorded["status"]?.number ?? 200)
                if case .string(let e)? = recorded["error"] { outcome.error = e }
                if case .string(let n)? = recorded["name"] { outcome.body = ["name": .string(n)] }
            }
            // The data as it is now answers a duplicate only for a caller who may read it: a
            // write id is the client's own choice, not proof that the caller wrote it.
            if outcome.status == 200, job.pushName == nil, job.answersData, Namespace.mayRead(job.caller, job.keys, s) {
                switch job.op {
                case .set: outcome.body = ValueTree.exported(ValueTree.child(s.working, job.keys[...]))
                case .update(let children): outcome.body = .object(Dictionary(children.map { ($0.keys.joined(separator: "/"), ValueTree.exported($0.value)) }, uniquingKeysWith: { $1 }))
                default: break
                }
            } else if outcome.status == 200, let name = job.pushName, outcome.body == .null {
                outcome.body = ["name": .string(name)]
            }
            return (outcome, nil, nil)
        }

        var outcome: WriteOutcome
        var merge = StoreMerge()
        var change: Change?
        // What the store would refuse (the data one key deeper than the client sees: a value
        // 32 levels deep) is refused before it changes anything: a refusal by the store itself
        // would stop the namespace. A resolved value passed the data model's checks at `keys`
        // already, so only its depth can differ: the whole check runs near the limit only.
        func refusal(_ keys: [String], _ resolved: Value) -> String? {
            guard keys.count + 2 + ValueTree.depth(resolved) > Path.maxDepth else { return nil }
            do { try Database.checkServerValue(ValueTree.normalized(resolved), at: (["data"] + keys).joined(separator: "/")); return nil } catch { return errorMessage(error) ?? "\(error)" }
        }
        decide: do {
            switch job.op {
            case .rejected(let o):
                outcome = o
            case .presence(let client, let change):
                var list = s.presence[client] ?? []
                switch change {
                case .add(var op):
                    guard let keys = Namespace.presenceKeys(op), Namespace.mayWrite(job.caller, Namespace.presenceWrites(op, keys, s), s) else {
                        outcome = .rejected(401, "Permission denied")
                        break decide
                    }
                    s.presenceSeq += 1
                    if case .object(var o) = op { o["seq"] = .int(s.presenceSeq); op = .object(o) }
                    list.append(op)
                case .cancel(let keys):
                    list.removeAll { Namespace.presenceKeys($0)?.starts(with: keys) ?? true }
                }
                s.presence[client] = list.isEmpty ? nil : list
                merge.meta["meta/presence/\(client)"] = Namespace.storedPresence(list)
                // (In a shared storage: this process serves the client; when it dies, another runs them.)
                if let owner = storage.processID { merge.meta["meta/owners/\(client)"] = list.isEmpty ? .null : .string(owner) }
                outcome = WriteOutcome(status: 200, body: ["status": "ok"])
            case .presenceRun(let client, let through):
                let list = s.presence[client] ?? []
                let run = list.filter { Namespace.presenceSeq($0) <= through }
                let rest = list.filter { Namespace.presenceSeq($0) > through }
                s.presence[client] = rest.isEmpty ? nil : rest
                merge.meta["meta/presence/\(client)"] = Namespace.storedPresence(rest)
                if storage.processID != nil && rest.isEmpty { merge.meta["meta/owners/\(client)"] = .null }
                outcome = WriteOutcome(status: 200)
                change = Namespace.applyPresence(run, client: client, &s, &merge, logger: logger)
            case .rules(let rules, let text):
                guard case .owner = job.caller else { outcome = .rejected(401, "Permission denied"); break decide }
                s.rules = rules
                merge.meta["meta/rules"] = .string(text)
                outcome = WriteOutcome(status: 200, body: (try? Value(json: text)) ?? .null)
            case .set(let data):
                let current = ValueTree.child(s.working, job.keys[...])
                let resolved: Value
                do { resolved = try ValueTree.resolvingServerValues(data, at: job.keys, in: s.working, now: Namespace.now()) } catch {
                    outcome = .rejected(400, errorMessage(error) ?? "\(error)")
                    break decide
                }
                guard Namespace.mayWrite(job.caller, [(job.keys, resolved)], s) else { outcome = .rejected(401, "Permission denied"); break decide }
                if let expected = job.ifMatch, expected != ETag.of(current) {
                    outcome = WriteOutcome(status: 412, body: ValueTree.exported(current), error: "ETag mismatch", etag: ETag.of(current))
                    break decide
                }
                if let bad = refusal(job.keys, resolved) {
                    outcome = .rejected(400, bad)
                    break decide
                }
                merge.write(at: job.keys, before: s.working)
                ValueTree.set(&s.working, job.keys[...], to: resolved)
                let written = ValueTree.child(s.working, job.keys[...])
                outcome = WriteOutcome(status: 200, body: job.pushName.map { ["name": .string($0)] } ?? (job.answersData ? ValueTree.exported(written) : .null))
                if job.ifMatch != nil { outcome.etag = ETag.of(written) }
                let commit = Namespace.nextCommit(&s, &merge)
                outcome.commit = commit
                change = Change(keys: job.keys, parts: [.init(keys: [], old: current, new: written)], isUpdate: false, commit: commit)
            case .update(let children):
                let now = Namespace.now()
                var resolvedChildren: [(keys: [String], value: Value)] = []
                var shown: [String: Value] = [:]
                for c in children {
                    let abs = job.keys + c.keys
                    let resolved: Value
                    do { resolved = try ValueTree.resolvingServerValues(c.value, at: abs, in: s.working, now: now) } catch {
                        outcome = .rejected(400, errorMessage(error) ?? "\(error)")
                        break decide
                    }
                    if let bad = refusal(abs, resolved) {
                        outcome = .rejected(400, bad)
                        break decide
                    }
                    resolvedChildren.append((c.keys, resolved))
                    if job.answersData { shown[c.keys.joined(separator: "/")] = ValueTree.exported(resolved) }
                }
                // The rules judge the update whole: each location's .write, and .validate on the data as all of it leaves it.
                guard Namespace.mayWrite(job.caller, resolvedChildren.map { (job.keys + $0.keys, $0.value) }, s) else {
                    outcome = .rejected(401, "Permission denied")
                    break decide
                }
                // Decided: now change the tree (in place), each child in turn (none is inside another).
                var parts: [Change.Part] = []
                for c in resolvedChildren {
                    let abs = job.keys + c.keys
                    let before = ValueTree.child(s.working, abs[...])
                    merge.write(at: abs, before: s.working)
                    ValueTree.set(&s.working, abs[...], to: c.value)
                    parts.append(.init(keys: c.keys, old: before, new: ValueTree.child(s.working, abs[...])))
                }
                outcome = WriteOutcome(status: 200, body: .object(shown))
                let commit = Namespace.nextCommit(&s, &merge)
                outcome.commit = commit
                change = Change(keys: job.keys, parts: parts, isUpdate: true, commit: commit)
            }
        }


        if let identity = job.identity {
            var meta: [String: Value] = [:]
            if case .object(let m)? = s.clients[identity.store] { meta = m }
            var outcomes: [String: Value] = [:]
            if case .object(let o)? = meta["outcomes"] {
                // Forget what the client has recorded durably.
                for (k, v) in o where (Int64(k) ?? 0) > job.acked { outcomes[k] = v }
            }
            if outcome.status != 200 {
                var r: [String: Value] = ["status": .int(Int64(outcome.status))]
                if let e = outcome.error { r["error"] = .string(e) }
                outcomes[String(identity.id)] = .object(r)
            } else if let name = job.pushName {
                outcomes[String(identity.id)] = ["status": 200, "name": .string(name)]
            }
            meta["applied"] = .int(identity.id)
            meta["outcomes"] = outcomes.isEmpty ? nil : .object(outcomes)
            s.clients[identity.store] = .object(meta)
            merge.meta["meta/clients/\(identity.store)"] = .object(meta)
        }
        return (outcome, merge.isEmpty ? nil : merge, change)
    }

    /// Numbers a commit: the next number, stored in the commit's record.
    private static func nextCommit(_ s: inout State, _ merge: inout StoreMerge) -> Int64 {
        s.workingCommit += 1
        merge.meta["meta/commit"] = .int(s.workingCommit)
        return s.workingCommit
    }

    /// The events a change raises on one stream (without a query: query streams get their
    /// whole new result once per group, see ``queryEvents(_:changes:tree:)``): O(size of the
    /// written data), or of the stream's view where it is at or below a written location.
    static func events(for change: Change, to sink: StreamSink) {
        guard sink.query == nil else { return }
        let id = String(change.commit)
        let w = change.keys, l = sink.keys
        guard w.starts(with: l) || l.starts(with: w) else { return }
        if w.starts(with: l) && (change.isUpdate || w.count > l.count) {
            // The stream is above the write (or at an update's location): the written data.
            let rel = "/" + w.dropFirst(l.count).joined(separator: "/")
            if change.isUpdate {
                var data: [String: Value] = [:]
                for p in change.parts { data[p.keys.joined(separator: "/")] = ValueTree.exported(p.new) }
                sink.send(.patch(rel, data, id: id))
            } else {
                sink.send(.put(rel, ValueTree.exported(change.parts[0].new), id: id))
            }
            return
        }
        // The stream is at or below a written location: its value there before and after —
        // one event per commit (a client counts the commit applied once it has one event of
        // it), so the parts below the stream go as one patch.
        var below: [String: Value] = [:]
        for p in change.parts {
            let abs = w + p.keys
            if l.starts(with: abs) {
                let rel = l.dropFirst(abs.count)
                let after = ValueTree.child(p.new, rel)
                if p.old.map({ ValueTree.child($0, rel) }) != after { sink.send(.put("/", ValueTree.exported(after), id: id)) }
                return  // (parts do not overlap: no other one is below the stream)
            } else if abs.starts(with: l) {
                below[abs.dropFirst(l.count).joined(separator: "/")] = ValueTree.exported(p.new)
            }
        }
        if below.count == 1, let (rel, value) = below.first {
            sink.send(.put("/" + rel, value, id: id))
        } else if !below.isEmpty {
            sink.send(.patch("/", below, id: id))
        }
    }

    /// Query streams related to a group's changes get the query's whole new result, when it
    /// differs from the last one they were sent.
    static func queryEvents(_ sinks: some Sequence<StreamSink>, changes: [Change], tree: Value, commit: Int64) {
        for sink in sinks where sink.query != nil {
            let l = sink.keys
            guard changes.contains(where: { $0.keys.starts(with: l) || l.starts(with: $0.keys) }) else { continue }
            let view = sink.view(tree)
            let changed = sink.lastView.withLock { last -> Bool in
                defer { last = view }
                return last != view
            }
            if changed { sink.send(.put("/", view, id: String(commit))) }
        }
    }

    // MARK: Presence

    /// A client's registrations as stored: their JSON text (data with server values in it is
    /// not data the store holds as such), or null for none.
    static func storedPresence(_ list: [Value]) -> Value {
        list.isEmpty ? .null : .string(Value.array(list).json)
    }

    /// The keys of a registration's location.
    static func presenceKeys(_ op: Value) -> [String]? {
        guard case .object(let o) = op, case .string(let path)? = o["path"], let p = try? Path(validating: path) else { return nil }
        return p.keys
    }

    /// The writes a registration at `keys` would make now (its server values resolved against
    /// the working tree), for the rules to judge when it is registered.
    static func presenceWrites(_ op: Value, _ keys: [String], _ s: State) -> [(keys: [String], value: Value)] {
        presenceChildren(op, keys).map { c in (c.keys, (try? ValueTree.resolvingServerValues(c.value, at: c.keys, in: s.working, now: now())) ?? c.value) }
    }

    /// The locations a registration at `keys` writes and their data (server values unresolved):
    /// an update's children, in key order, or the location itself.
    static func presenceChildren(_ op: Value, _ keys: [String]) -> [(keys: [String], value: Value)] {
        guard case .object(let o) = op else { return [] }
        let data = o["data"] ?? .null
        guard o["op"] == "update", case .object(let d) = data else { return [(keys, data)] }
        return d.keys.sorted().compactMap { k in (try? Path(validating: k)).map { (keys + $0.keys, d[k]!) } }
    }

    /// A client's presence stream opened: it is connected (its registrations wait).
    func presenceConnected(_ client: String) {
        state.withLock { $0.presenceStreams[client, default: 0] += 1 }
    }

    /// Marks (or unmarks) the namespace as keeping registrations (`ns/NAME.presence`), so that a
    /// restarted server opens it at once (see `FerryServer.start()`).
    func markPresence(_ on: Bool) {
        guard let presenceMarker else { return }
        if on {
            if !FileManager.default.fileExists(atPath: presenceMarker) { _ = FileManager.default.createFile(atPath: presenceMarker, contents: nil) }
        } else {
            try? FileManager.default.removeItem(atPath: presenceMarker)
        }
    }

    /// A registration came: if its client has no presence stream (it was lost meanwhile), the
    /// registrations run unless one opens within the timeout.
    func presenceRegistered(_ client: String) {
        guard state.withLock({ $0.presenceStreams[client] == nil }) else { return }
        Task { [self] in
            try? await Task.sleep(for: presenceTimeout)
            runPresence(client)
        }
    }

    /// A client's presence stream ended: when it was its last, its registrations run.
    func presenceDisconnected(_ client: String) {
        state.withLock { s in
            s.presenceStreams[client, default: 1] -= 1
            if s.presenceStreams[client] == 0 { s.presenceStreams[client] = nil }
        }
        runPresence(client)
    }

    /// Runs a disconnected client's registrations (those made so far), in the writer's order:
    /// a cancel or a registration queued before the run counts, one queued after it does not.
    /// Nothing when the client is connected or a run is already queued; once it is done, the
    /// registrations made meanwhile run too if the client is still away.
    func runPresence(_ client: String) {
        let through: Int64? = state.withLock { s in
            guard s.presenceStreams[client] == nil, !(s.presence[client] ?? []).isEmpty,
                  !s.presenceRunning.contains(client), s.failure == nil, !s.closing else { return nil }
            s.presenceRunning.insert(client)
            return s.presenceSeq
        }
        guard let through else { return }
        logger.info("namespace \(name): client \(client) disconnected; running its onDisconnect writes")
        submit([WriteJob(op: .presenceRun(client: client, through: through), keys: [], caller: .owner, complete: { [self] outcome in
            if outcome.status != 200 { logger.warning("namespace \(name): onDisconnect of \(client): \(outcome.status) \(outcome.error ?? "")") }
            let none = state.withLock { s in
                s.presenceRunning.remove(client)
                return s.presence.isEmpty
            }
            if none { markPresence(false) }
            runPresence(client)
        })])
    }

    /// A registration's number (0 for one without).
    static func presenceSeq(_ op: Value) -> Int64 {
        if case .object(let o) = op, case .int(let n)? = o["seq"] { return n }
        return 0
    }

    /// Applies registrations in order, each as the write it names under the rules as its
    /// caller now (one the rules or the data model refuse is skipped, and logged), with its
    /// server values resolved against the data as it is then; the change is one update at the
    /// root of the written locations (none inside another) with their values after all.
    static func applyPresence(_ ops: [Value], client: String, _ s: inout State, _ merge: inout StoreMerge, logger: Logger) -> Change? {
        let now = Namespace.now()
        var written: [[String]] = []
        for op in ops {
            guard case .object(let o) = op, let keys = presenceKeys(op), let c = o["caller"], let caller = Caller(stored: c) else { continue }
            let children = presenceChildren(op, keys)
            var resolved: [(keys: [String], value: Value)] = []
            for c in children {
                guard let v = try? ValueTree.resolvingServerValues(c.value, at: c.keys, in: s.working, now: now),
                      (try? Database.checkServerValue(ValueTree.normalized(v), at: (["data"] + c.keys).joined(separator: "/"))) != nil else {
                    logger.warning("onDisconnect of \(client) at /\(c.keys.joined(separator: "/")): the data is refused; skipped")
                    resolved = []
                    break
                }
                resolved.append((c.keys, v))
            }
            guard !resolved.isEmpty, mayWrite(caller, resolved, s) else {
                if !resolved.isEmpty { logger.warning("onDisconnect of \(client) at /\(keys.joined(separator: "/")): the rules refuse it now; skipped") }
                continue
            }
            for c in resolved {
                merge.write(at: c.keys, before: s.working)
                ValueTree.set(&s.working, c.keys[...], to: c.value)
                if written.contains(where: { c.keys.starts(with: $0) }) { continue }
                written.removeAll { $0.starts(with: c.keys) }
                written.append(c.keys)
            }
        }
        guard !written.isEmpty else { return nil }
        var parts: [Change.Part] = []
        for keys in written {
            parts.append(.init(keys: keys, old: nil, new: ValueTree.child(s.working, keys[...])))
        }
        let commit = nextCommit(&s, &merge)
        return Change(rootParts: parts, commit: commit)
    }

    // MARK: Reads and streams

    func read<T>(_ body: (State) -> T) -> T { state.withLock { body($0) } }

    /// Registers a stream; its first events are queued under the same lock, so no committed
    /// write falls between them and the events that follow: the whole view, or — resuming
    /// after commit `resumeAfter`, for a stream without a query, while the history holds every
    /// commit since, and `epoch` (when given) is the namespace's — the changes since that concern it, then (for a stream that said its
    /// client) a progress mark at the last commit, with the header
    /// ``WireHeader/resumedThrough`` naming it.
    func addStream(_ sink: StreamSink, resumeAfter: Int64? = nil, epoch asked: String? = nil) -> Int? {
        state.withLock { s in
            if s.failure != nil || s.closing { return nil }
            let id = s.nextStream
            s.nextStream += 1
            s.streams[id] = sink
            sink.announce([(WireHeader.epoch, epoch)])
            // (Not when what was missed weighs more than a stream may hold unsent: the whole
            // value then, as for a new stream.)
            if let after = resumeAfter, sink.query == nil, asked == nil || asked == epoch, after <= s.commit,
               let (missed, bytes) = s.history.changes(after: after, concerning: sink.keys, maxBytes: maxResumeBytes), bytes <= maxResumeBytes {
                sink.announce([(WireHeader.resumedThrough, String(s.commit))])
                sink.hold()  // (written together: a client reading them at once applies them at once)
                for change in missed { Namespace.events(for: change, to: sink) }
                // (A mark for Ferry's clients only: an `id:` alone is not every client's idea of an event.)
                if sink.client != nil { sink.progress(s.commit) }
                sink.release()
                return id
            }
            let view = sink.view(s.committed)
            if sink.query != nil { sink.lastView.withLock { $0 = view } }
            sink.send(.put("/", view, id: String(s.commit)))
            return id
        }
    }

    /// Ends, with `auth_revoked`, every stream opened with a token that `revoked` says is no
    /// longer accepted.
    func revokeStreams(_ revoked: (String) -> Bool) {
        state.withLock { s in
            for (id, sink) in s.streams {
                guard let t = sink.token, revoked(t) else { continue }
                sink.send(.authRevoked)
                sink.close()
                s.streams[id] = nil
            }
        }
    }

    /// Ends one stream with `auth_revoked` (its token expired), if it is still open.
    func revokeStream(_ id: Int) {
        state.withLock { s in
            guard let sink = s.streams.removeValue(forKey: id) else { return }
            sink.send(.authRevoked)
            sink.close()
        }
    }

    func removeStream(_ id: Int) {
        _ = state.withLock { $0.streams.removeValue(forKey: id) }
    }

    /// Refuses new writes, waits for the queued ones, ends the streams and closes the store.
    func close() async {
        state.withLock { s in
            s.closing = true
            for (_, sink) in s.streams { sink.close() }
            s.streams.removeAll()
        }
        while !state.withLock({ $0.queue.isEmpty && $0.writerIdle }) {
            try? await Task.sleep(for: .milliseconds(5))
        }
        wake.finish()
        await storage.close()
    }
}
