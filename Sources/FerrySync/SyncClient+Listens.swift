import AsyncHTTPClient
@_spi(Server) import Ferry
import FerryLog
import FerryWire
import NIOCore
import NIOHTTP1
import Synchronization

/// Listens: one streaming `GET` (`Accept: text/event-stream`) per listen the database needs;
/// `put` and `patch` events become server records, the first `put` also completes the listen.
extension SyncClient {
    /// Starts the listens the database needs and stops the others.
    func reconcileListens() {
        guard online else { return }
        let wanted = database.activeListens()
        for (request, task) in listens where !wanted.contains(request) {
            task.cancel()
            listens[request] = nil
            streamCommits[request] = nil
            noteProgress()
        }
        for request in refusedListens.keys where !wanted.contains(request) { refusedListens[request] = nil }
        // Positions outlive their listens (a listener removed and added again, as when an app
        // closes its views before it quits, resumes while the data is still whole), up to a
        // bound: those of listens no longer wanted go first.
        if resumePoints.count + storedPositions.count > Self.maxPositions {
            for request in resumePoints.keys where !wanted.contains(request) {
                resumePoints[request] = nil
                storedPositions[request.path] = nil
            }
            let listened = Set(wanted.map(\.path))
            for path in storedPositions.keys where !listened.contains(path) { storedPositions[path] = nil }
        }
        for request in wanted where listens[request] == nil && refusedListens[request] == nil {
            listens[request] = Task { await self.runListen(request) }
        }
    }

    /// Holds one listen until cancelled, reconnecting with backoff. A reconnect's first `put`
    /// is the whole value: applied as a put, listeners see only what changed.
    private func runListen(_ request: ListenRequest) async {
        nextGeneration += 1
        let generation = nextGeneration
        var failures = 0
        while !Task.isCancelled {
            let outcome: StreamOutcome
            do {
                outcome = try await stream(request, generation)
            } catch {
                endStream(request, generation)
                await savePositions()
                await endLive(request, generation)
                if error is CancellationError || Task.isCancelled { return }
                if let e = error as? DatabaseError {
                    logger.error("the listen at \(request) stops: \(e)")
                    return
                }
                failures += 1
                if (error as? SyncError)?.code != .badAnswer { setConnected(false) }  // the connection was lost
                logger.info("the listen at \(request) was interrupted (\(error)); reconnecting")
                do { try await Self.backoff(failures, options) } catch { return }
                continue
            }
            endStream(request, generation)
            await savePositions()
            await endLive(request, generation)
            switch outcome {
            case .refused(let message):
                if Task.isCancelled { return }
                logger.warning("\(address) refused the listen at \(request): \(message); asked again after a new token or goOnline()")
                refusedListens[request] = message
                listens[request] = nil
                noteProgress()
                return
            case .ended:
                failures = 1  // the server closed the stream: reconnect soon
            case .tokenRevoked:
                failures += 1
                _ = await refreshToken(after: token)
            }
            do { try await Self.backoff(max(failures, 1), options) } catch { return }
        }
    }

    /// Applies the events gathered in `batch` as one merge, then notes their commit. A resumed
    /// listen that they (or the progress mark `reaching`, read after them) bring through the
    /// commit it resumes to is complete with them, in the same step.
    private func flush(_ batch: inout EventBatch, _ resuming: inout Int64?, _ listen: ListenRequest, _ generation: Int, _ epoch: String?,
                       reaching mark: String? = nil) async throws {
        guard !batch.isEmpty else { return }
        if Task.isCancelled { throw CancellationError() }  // (a listen ended: its data is not wanted)
        let taken = batch
        batch = EventBatch(base: listen.path)
        let completes = Self.reaches(taken.lastID, resuming) || Self.reaches(mark, resuming)
        try await database.applyServerMerge(at: listen.path, taken.children, tag: listen.tag, completingListenAt: completes ? listen.path : nil)
        for at in taken.paths {
            forgetPositions(overlapping: at, except: listen)
            noteTouch(at, snapshotRequestedAt: nil)
        }
        noteCommit(taken.lastID, listen, generation, epoch: epoch)
        if completes {
            liveListens[listen] = generation
            resuming = nil
        } else {
            resuming = try await caughtUp(taken.lastID, resuming, listen, generation)
        }
    }

    /// Whether an event's (or a mark's) `id` reaches `resuming`, the commit a resumed listen
    /// catches up to (false when it is not catching up).
    static func reaches(_ id: String?, _ resuming: Int64?) -> Bool {
        guard let through = resuming, let n = id.flatMap({ Int64($0) }) else { return false }
        return n >= through
    }

    /// The most events a resumed stream gathers before applying them, while it catches up.
    static let maxCatchUpBatch = 10_000

    /// A resumed stream applied everything through `id`: once that reaches the commit it
    /// resumes through, the listen is complete (live) again. Returns what is still awaited.
    private func caughtUp(_ id: String?, _ resuming: Int64?, _ listen: ListenRequest, _ generation: Int) async throws -> Int64? {
        guard Self.reaches(id, resuming), !Task.isCancelled else { return resuming }
        try await database.applyListenComplete(at: listen.path, tag: listen.tag)
        liveListens[listen] = generation
        return nil
    }

    /// The most stream positions kept (see ``reconcileListens()``).
    static let maxPositions = 1_000

    /// Where the next stream of `listen` may resume (nil: from a whole first put): the commit
    /// its last stream applied through, with a server that numbers its commits, for a listen
    /// without a query whose cached data is still whole, and which no other listen overlaps
    /// (two streams resuming from different commits would apply one's older changes over the
    /// other's newer ones).
    private func resumePoint(_ listen: ListenRequest) -> StreamPosition? {
        guard listen.parameters.isEmpty, let after = resumePoints[listen] ?? storedPositions[listen.path] else { return nil }
        let keys = listen.path.split(separator: "/")
        let overlapped = listens.keys.contains { other in
            guard other != listen else { return false }
            let o = other.path.split(separator: "/")
            return o.starts(with: keys) || keys.starts(with: o)
        }
        guard !overlapped, database.hasCompleteServerData(at: listen.path) else { return nil }
        return after
    }

    /// Server data at `path` was applied by other means than the stream of `except` (another
    /// listen, a read): a position of a listen there may now be older than the data it would
    /// resume over (replaying its changes would show values go back), so it is forgotten.
    func forgetPositions(overlapping path: String, except: ListenRequest?) {
        guard resumePoints.count + storedPositions.count > (except == nil ? 0 : 1) else { return }
        let keys = path.split(separator: "/")
        func overlaps(_ p: String) -> Bool {
            let o = p.split(separator: "/")
            return o.starts(with: keys) || keys.starts(with: o)
        }
        for request in resumePoints.keys where request != except && overlaps(request.path) { resumePoints[request] = nil }
        for p in storedPositions.keys where p != except?.path && overlaps(p) { storedPositions[p] = nil }
    }

    /// Until the positions loaded at start are cleared from the sync state, no stream starts:
    /// once a stream applies data, a position kept from before is older than the cache, and a
    /// crash before the next save must not leave it there to resume from.
    func clearStoredPositionsOnDisk() async {
        if let task = positionsCleared { return await task.value }
        let task = Task {
            let old = database.readSyncState()
            guard case .object(let o)? = old, case .object(let all)? = o["positions"], all[address.description] != nil else { return }
            do { try await database.writeSyncState(Self.positionsState(old, address, [:])) } catch {
                logger.warning("clearing the streams' kept positions failed (\(error))")
            }
        }
        positionsCleared = task
        await task.value
    }

    /// Keeps the streams' positions in the database's sync state (after the data they
    /// reflect is durable), so that listens resume after the app restarts. Written when a
    /// stream ends and on close, when they changed.
    func savePositions() async {
        var mine: [String: Value] = [:]
        for (path, p) in storedPositions { mine[path] = p.value }
        for (request, p) in resumePoints { mine[request.path] = p.value }
        let old = database.readSyncState()
        let state = Self.positionsState(old, address, mine)
        guard state != old else { return }
        do { try await database.writeSyncState(state) } catch {
            logger.warning("keeping the streams' positions failed (\(error)); they load whole on the next start")
        }
    }

    /// The listen's stream ended: the next one starts from its own first put.
    private func endStream(_ request: ListenRequest, _ generation: Int) {
        guard streamCommits[request]?.generation == generation else { return }
        streamCommits[request] = nil
    }

    /// A listen's stream applied everything through `id` (a commit number).
    private func noteCommit(_ id: String?, _ request: ListenRequest, _ generation: Int, epoch: String? = nil) {
        guard let id, let commit = Int64(id) else { return }
        // The data is in the cache: a later stream may resume from here even when this listen
        // ended meanwhile (its listener removed as the data came, say).
        if request.parameters.isEmpty { resumePoints[request] = StreamPosition(commit: commit, epoch: epoch) }
        guard !Task.isCancelled, listens[request] != nil else { return }
        streamCommits[request] = (generation, commit)
        noteProgress()
    }

    /// Wakes the answers waiting for streams.
    func noteProgress() {
        let waiters = progressWaiters
        progressWaiters = []
        for w in waiters { w.resume() }
    }

    /// The listen's stream ended: if it was live, its snapshots say `fromCache` again.
    private func endLive(_ request: ListenRequest, _ generation: Int) async {
        guard liveListens[request] == generation else { return }  // (not a newer task's)
        liveListens[request] = nil
        try? await database.applyListenEnded(at: request.path, tag: request.tag)
    }

    enum StreamOutcome { case ended, refused(String), tokenRevoked }

    /// One streaming request: applies its events until it ends.
    private func stream(_ listen: ListenRequest, _ generation: Int) async throws -> StreamOutcome {
        await clearStoredPositionsOnDisk()
        let t = try await currentToken()
        var headers = [("Accept", "text/event-stream"), (WireHeader.client, database.storeIdentifier)]
        let resumeAfter = resumePoint(listen)
        if let resumeAfter {
            headers.append(("Last-Event-ID", String(resumeAfter.commit)))
            if let e = resumeAfter.epoch { headers.append((WireHeader.epoch, e)) }
        }
        let request = transport.request(.GET, listen.path, parameters: listen.parameters, headers: headers, token: t)
        let requestedAt = ContinuousClock.now
        let response: HTTPClientResponse
        do {
            response = try await transport.client(for: .GET).execute(request, deadline: .distantFuture)
        } catch {
            if Task.isCancelled { throw CancellationError() }
            setConnected(false)
            throw SyncError(.unavailable, "listen at \(listen): \(error)")
        }
        guard response.status == .ok else {
            let body = try await response.body.collect(upTo: 1 << 20)
            let answer = Answer(status: Int(response.status.code), headers: response.headers, body: Array(buffer: body), clockOffset: nil)
            noteAnswer(answer)
            if answer.isTokenProblem { return .tokenRevoked }
            if answer.status >= 500 { throw SyncError(.unavailable, answer.errorMessage, status: answer.status) }
            return .refused("\(answer.status) \(answer.errorMessage)")
        }
        setConnected(true)
        // Resumed: no first put comes; the listen is complete once the stream reaches this.
        let resumedThrough: Int64? = resumeAfter == nil ? nil : response.headers.first(name: WireHeader.resumedThrough).flatMap { Int64($0) }
        if let resumeAfter, let resumedThrough {
            logger.debug("the listen at \(listen) resumes after commit \(resumeAfter.commit) through \(resumedThrough)")
        }
        let epoch = response.headers.first(name: WireHeader.epoch)
        let silence = Silence()
        let limit = options.streamSilenceLimit
        return try await withThrowingTaskGroup(of: StreamOutcome.self) { group in
            group.addTask { try await self.consume(response.body, listen, generation, silence, requestedAt: requestedAt, resumedThrough: resumedThrough, epoch: epoch) }
            // A server that stops sending (not even its keep-alives) is a lost connection.
            group.addTask {
                while true {
                    try await Task.sleep(for: limit / 4)
                    if silence.exceeded(limit) { throw SyncError(.unavailable, "listen at \(listen): no event or keep-alive for \(limit)") }
                }
            }
            defer { group.cancelAll() }
            return try await group.next()!
        }
    }

    /// Applies a stream's events until it ends.
    private func consume(_ body: HTTPClientResponse.Body, _ listen: ListenRequest, _ generation: Int, _ silence: Silence,
                         requestedAt: ContinuousClock.Instant, resumedThrough: Int64?, epoch: String?) async throws -> StreamOutcome {
        var parser = StreamEventParser()
        // A resumed stream's events apply to the data cached (as a live stream's); it is
        // complete again once they reach the commit the server named.
        var complete = resumedThrough != nil
        var resuming = resumedThrough
        // The events of one read go to the database together where they can: puts and
        // patches below the listen's location, none inside another, as one merge (applied one
        // by one, each costs a pass over the location's children: 100 changes of a 100,000-
        // child location took seconds).
        var batch = EventBatch(base: listen.path)
        do {
            for try await buffer in body {
                silence.reset()
                if Task.isCancelled { throw CancellationError() }
                for event in try parser.feed(buffer.readableBytesView) {
                    if event.isProgress {
                        try await flush(&batch, &resuming, listen, generation, epoch, reaching: event.id)
                        if complete { noteCommit(event.id, listen, generation, epoch: epoch) }
                        resuming = try await caughtUp(event.id, resuming, listen, generation)
                        continue
                    }
                    switch event.name {
                    case "put", "patch":
                        guard case .object(let o) = event.data, case .string(let rel)? = o["path"] else {
                            throw SyncError(.badAnswer, "a \(event.name) event without a path: \(event.data.json.prefix(200))")
                        }
                        let data = o["data"] ?? .null
                        if event.name == "patch", case .object = data {} else if event.name == "patch" {
                            throw SyncError(.badAnswer, "a patch whose data is not an object")
                        }
                        if complete, batch.add(event.name, rel, data, id: event.id) { continue }
                        try await flush(&batch, &resuming, listen, generation, epoch)
                        if complete, batch.add(event.name, rel, data, id: event.id) { continue }
                        // Alone: the first put (the whole value: the listen is complete with it),
                        // or a put at the listen's own location.
                        let at = Self.join(listen.path, rel)
                        if Task.isCancelled { throw CancellationError() }
                        let first = event.name == "put" && !complete
                        if event.name == "put" {
                            // (Complete with it: a first put, or a resumed stream's last change.)
                            let catchesUp = Self.reaches(event.id, resuming)
                            try await database.applyServerPut(at: at, data, tag: listen.tag, completingListenAt: !complete || catchesUp ? listen.path : nil)
                            if !complete || catchesUp { liveListens[listen] = generation }
                            if catchesUp { resuming = nil }
                            complete = true
                        } else if case .object(let children) = data {
                            try await database.applyServerMerge(at: at, children, tag: listen.tag)
                        }
                        forgetPositions(overlapping: at, except: listen)
                        noteTouch(at, snapshotRequestedAt: first ? requestedAt : nil)
                        noteCommit(event.id, listen, generation, epoch: epoch)
                        resuming = try await caughtUp(event.id, resuming, listen, generation)
                    case "keep-alive":
                        try await flush(&batch, &resuming, listen, generation, epoch)
                    case "cancel":
                        try await flush(&batch, &resuming, listen, generation, epoch)
                        return .refused(event.data.json)
                    case "auth_revoked":
                        try await flush(&batch, &resuming, listen, generation, epoch)
                        return .tokenRevoked
                    default:
                        logger.debug("ignoring a \(event.name) event on \(listen)")
                    }
                }
                // A live stream's events apply as they come. A resumed stream's catching up
                // applies at once when caught up (its pieces come in small reads at first, and
                // each apply is a pass over the location).
                if resuming == nil || batch.count >= Self.maxCatchUpBatch || Self.reaches(batch.lastID, resuming) {
                    try await flush(&batch, &resuming, listen, generation, epoch)
                }
            }
        } catch let e as DatabaseError {
            // Server data the data model refuses is the server's fault: reconnect later.
            if e.code == .invalidData || e.code == .invalidPath {
                throw SyncError(.badAnswer, "the server sent data the database refuses: \(e.message)")
            }
            throw e
        } catch let e as WireError {
            throw SyncError(.badAnswer, e.description)
        }
        if Task.isCancelled { throw CancellationError() }
        return .ended
    }

    /// Notes that server data at `path` was applied (by a stream's first put: its request's
    /// time, see ``recentTouches``).
    private func noteTouch(_ path: String, snapshotRequestedAt: ContinuousClock.Instant?) {
        eventSerial += 1
        recentTouches.append((eventSerial, path, snapshotRequestedAt))
        if recentTouches.count > 4096 { recentTouches.removeFirst(2048) }
    }

    /// The server answered writes at `paths`, sent when the event serial was `sentSerial`:
    /// where an open listen keeps a location the answer concerns, the stream's event for the
    /// write (on another connection) must be applied first — otherwise the acknowledgement
    /// drops the pending write before the server's data shows it, and listeners would see the
    /// old value as confirmed. Waits (up to `limit`) for an event touching each such path.
    /// A stream's first put counts only when its request went out after the answer came
    /// (`answeredAt`): one asked for earlier may show the data from before the write — taking
    /// it for the write's event made a listener see its own acknowledged write go back.
    func awaitStreamEvents(for paths: [String], sentAfter sentSerial: Int, answeredAt: ContinuousClock.Instant,
                           limit: Duration = .seconds(2)) async {
        func prefixes(_ p: String) -> [String] {
            var out = ["/"], cur = ""
            for k in p.split(separator: "/") {
                cur += "/" + k
                out.append(cur)
            }
            return out
        }
        func listened(_ p: String) -> Bool { Self.covers(liveListens.keys, p) }
        guard !liveListens.isEmpty else { return }
        var waiting = Set(paths.filter(listened).map { prefixes($0).last! })
        guard !waiting.isEmpty else { return }
        let deadline = ContinuousClock.now + limit
        var seen = sentSerial
        var touched = Set<String>(), touchedOrAbove = Set<String>()
        while true {
            // Touches since the last look: a touch at or below a path, or above it, answers it.
            for t in recentTouches.reversed() {
                if t.serial <= seen { break }
                if let requested = t.snapshotRequestedAt, requested <= answeredAt { continue }
                let ps = prefixes(t.path)
                touched.insert(ps.last!)
                touchedOrAbove.formUnion(ps)
            }
            seen = eventSerial
            waiting = waiting.filter { p in listened(p) && !touchedOrAbove.contains(p) && !prefixes(p).contains(where: touched.contains) }
            if waiting.isEmpty || ContinuousClock.now >= deadline || Task.isCancelled { return }
            try? await Task.sleep(for: .milliseconds(2))
        }
    }

    /// The server answered writes at `paths` as visible at commit `commit` (a server that
    /// numbers its commits): waits until every listen at, above or below one of them has
    /// applied its stream's events through that commit — a stream whose first put came from
    /// before the write, the write's own event, another client's write in between: each is
    /// in the stream's order, and only past `commit` does the stream show the write (or
    /// later). Listens that end, or are refused, are not waited for. `limit` (by default the
    /// stream silence limit, past which a stream counts as lost anyway) only keeps an answer
    /// from waiting for ever on a stream that cannot connect; a shorter wait would give up on
    /// streams merely slow on a loaded machine, and their listeners would see a value go back.
    ///
    /// - Throws: `CancellationError` when the client went offline first (its listens ended
    ///   with the commit not reached): the answer is not recorded — acknowledged then, the
    ///   write would leave its listeners on older data for as long as the client stays
    ///   offline. The write stays pending and is sent again; the server answers it as a
    ///   duplicate, at a later commit.
    func awaitCommit(_ commit: Int64, at paths: [String], limit: Duration? = nil) async throws {
        let limit = limit ?? options.streamSilenceLimit
        func related(_ a: String, _ b: String) -> Bool {
            let x = a.split(separator: "/"), y = b.split(separator: "/")
            return x.starts(with: y) || y.starts(with: x)
        }
        let deadline = ContinuousClock.now + limit
        var timer: Task<Void, Never>?
        defer { timer?.cancel() }
        while !Task.isCancelled {
            if !online { throw CancellationError() }
            let behind = listens.keys.filter { l in
                (streamCommits[l]?.commit ?? -1) < commit && paths.contains { related(l.path, $0) }
            }
            if behind.isEmpty { return }
            if ContinuousClock.now >= deadline {
                logger.warning("the streams at \(behind.map(\.description)) did not reach commit \(commit) in \(limit); acknowledging without them")
                return
            }
            if timer == nil {
                timer = Task { [weak self] in
                    try? await Task.sleep(until: deadline)
                    await self?.noteProgress()
                }
            }
            await withCheckedContinuation { progressWaiters.append($0) }
        }
    }

    /// `/a` + `/b/c` → `/a/b/c`.
    static func join(_ base: String, _ rel: String) -> String {
        let r = rel.split(separator: "/")
        if r.isEmpty { return base }
        let b = base.split(separator: "/")
        return "/" + (b + r).joined(separator: "/")
    }
}

/// Stream events gathered to be applied as one merge at the listen's location: each a put or
/// a patch strictly below it, no location inside another (a later value at the same location
/// replaces the earlier, as applying them in turn would).
struct EventBatch {
    let base: String
    /// Paths relative to the listen's location (`a/b`) to their values.
    private(set) var children: [String: Value] = [:]
    /// The proper prefixes of the children's paths.
    private var prefixes: Set<String> = []
    /// The absolute locations written.
    private(set) var paths: [String] = []
    private(set) var lastID: String?

    init(base: String) { self.base = base }

    var isEmpty: Bool { children.isEmpty }
    var count: Int { children.count }

    /// Adds an event; false when it cannot join (at the listen's location, or a location
    /// inside or above one already here).
    mutating func add(_ name: String, _ rel: String, _ data: Value, id: String?) -> Bool {
        let relKeys = rel.split(separator: "/")
        var entries: [(String, Value)] = []
        if name == "put" {
            guard !relKeys.isEmpty else { return false }
            entries = [(relKeys.joined(separator: "/"), data)]
        } else {
            guard case .object(let o) = data else { return false }
            for (k, v) in o {
                let keys = relKeys + k.split(separator: "/")
                guard !keys.isEmpty else { return false }
                entries.append((keys.joined(separator: "/"), v))
            }
        }
        // None may lie inside or above another (one of this event's, or one already here).
        var mine = Set<String>(), minePrefixes = Set<String>()
        for (path, _) in entries {
            if prefixes.contains(path) || minePrefixes.contains(path) { return false }
            var p = ""
            for k in path.split(separator: "/").dropLast() {
                p += (p.isEmpty ? "" : "/") + k
                if children[p] != nil || mine.contains(p) { return false }
                minePrefixes.insert(p)
            }
            mine.insert(path)
        }
        for (path, value) in entries {
            children[path] = value
            paths.append(SyncClient.join(base, "/" + path))
        }
        prefixes.formUnion(minePrefixes)
        if let id { lastID = id }
        return true
    }
}

/// Where a stream without a query was: the last commit it applied, and the epoch of the
/// namespace's commits (``WireHeader/epoch``).
struct StreamPosition: Sendable, Equatable {
    var commit: Int64
    var epoch: String?

    var value: Value {
        var o: [String: Value] = ["commit": .int(commit)]
        if let epoch { o["epoch"] = .string(epoch) }
        return .object(o)
    }

    init(commit: Int64, epoch: String?) {
        self.commit = commit
        self.epoch = epoch
    }

    init?(_ value: Value) {
        guard case .object(let o) = value, case .int(let c)? = o["commit"], c >= 0 else { return nil }
        commit = c
        if case .string(let e)? = o["epoch"] { epoch = e }
    }
}

extension SyncClient {
    /// The positions the sync state keeps for the server at `address` (`{"positions":
    /// {ADDRESS: {PATH: {"commit": N, "epoch": E}}}}`).
    static func loadPositions(_ state: Value?, _ address: ServerAddress) -> [String: StreamPosition] {
        guard case .object(let o)? = state, case .object(let all)? = o["positions"], case .object(let mine)? = all[address.description] else { return [:] }
        var out: [String: StreamPosition] = [:]
        for (path, v) in mine { if let p = StreamPosition(v) { out[path] = p } }
        return out
    }

    /// `state` with the positions for `address` replaced by `mine` (others' kept).
    static func positionsState(_ state: Value?, _ address: ServerAddress, _ mine: [String: Value]) -> Value {
        var o: [String: Value] = [:]
        if case .object(let existing)? = state { o = existing }
        var all: [String: Value] = [:]
        if case .object(let a)? = o["positions"] { all = a }
        all[address.description] = mine.isEmpty ? nil : .object(mine)
        o["positions"] = all.isEmpty ? nil : .object(all)
        return .object(o)
    }
}

/// When a stream last received bytes.
final class Silence: Sendable {
    private let last = FerryMutex(ContinuousClock.now)
    func reset() { last.withLock { $0 = .now } }
    func exceeded(_ limit: Duration) -> Bool { last.withLock { ContinuousClock.now - $0 > limit } }
}
