import AsyncHTTPClient
@_spi(Server) import Ferry
import FerryWire
import Logging
import NIOCore
import NIOHTTP1

/// How a ``SyncClient`` talks to its server.
public struct SyncOptions: Sendable {
    /// Gives the token to send (`Authorization: Bearer …`), nil for none. Called with `true`
    /// when the server refused the last one (401): return a new token then. Without a
    /// provider, requests carry no token.
    public typealias TokenProvider = @Sendable (_ forceRefresh: Bool) async throws -> String?

    /// The token provider (nil: no token).
    public var tokenProvider: TokenProvider?
    /// Send many writes per request when the server advertises batches. With `false`, every
    /// write is one REST request (still carrying its idempotency key).
    public var usesBatches = true
    /// The most writes in one batch (the server's own limit applies too).
    public var maxBatchWrites = 5_000
    /// About the most bytes in one batch, counted as the writes are stored (close to their
    /// JSON; the server's own limit applies too, and a batch it refuses as too large is split).
    public var maxBatchBytes = 8 << 20
    /// How long a request (other than a stream) may take before it counts as failed.
    public var requestTimeout: Duration = .seconds(30)
    /// The first wait before retrying after a failure; it doubles up to ``maxRetryDelay``,
    /// with jitter.
    public var retryDelay: Duration = .milliseconds(50)
    /// The longest wait between retries.
    public var maxRetryDelay: Duration = .seconds(5)
    /// A stream that receives nothing for this long — not even the server's keep-alive (every
    /// 30 s from Firebase and `ferry-server`) — counts as a lost connection and is reopened.
    public var streamSilenceLimit: Duration = .seconds(90)
    /// Where sync logs (failures, rejections, reconnects).
    public var logger = Logger(label: "ferry.sync")
    /// For an `https` server: the certificate authorities (PEM text) whose certificates are
    /// trusted instead of the system's — a company's own CA, or a test's. nil: the system's.
    /// The server's certificate is always checked.
    public var trustedCertificatesPEM: String?

    /// The defaults: batches, no token, 30 s requests, retries from 50 ms to 5 s.
    public init() {}
}

/// Connects a ``Ferry/Database`` to a Realtime-Database-compatible server: sends its pending
/// writes in write order (each exactly once with `ferry-server`), holds a streaming listen for
/// each of its listeners, queries and `keepSynced` pins, and puts what the server sends into
/// the database as server data (so the cache is rebuilt by replay like everything else).
///
/// ```swift
/// let sync = try SyncClient(database: db, url: "http://127.0.0.1:9000?ns=demo")
/// await sync.goOnline()
/// ```
///
/// Offline (before ``goOnline()``, after ``goOffline()``, or while the server cannot be
/// reached) the database works as without sync: writes queue in its log.
public actor SyncClient {
    /// The database this client syncs.
    public nonisolated let database: Database
    /// The server.
    public nonisolated let address: ServerAddress
    let options: SyncOptions
    let transport: Transport
    let logger: Logger

    /// What the server offers (`GET /.ferry/info.json`); nil until asked.
    struct Capabilities: Sendable {
        var batch: Bool
        var maxWrites: Int
        var maxBytes: Int
        /// The server numbers its commits (answers and stream events say them).
        var commits = false
        /// The server runs `onDisconnect` writes (``OnDisconnect``).
        var presence = false
        static let plain = Capabilities(batch: false, maxWrites: 1, maxBytes: .max)
    }
    var capabilities: Capabilities?

    var online = false
    var closed = false
    var connected = false
    var connectionObservers: [Int: AsyncStream<Bool>.Continuation] = [:]
    var nextObserver = 0
    var token: String?
    var tokenKnown = false

    var writer: Task<Void, Never>?
    /// The writer goOffline() cancelled, until it has stopped.
    var stoppingWriter: Task<Void, Never>?
    /// Listens the server refused (rules), with its message: not retried until the token
    /// changes or the client goes online again.
    var refusedListens: [ListenRequest: String] = [:]
    /// Every server event applied by a listen, numbered, with the location it touched (the
    /// latest few thousand): for ordering answers after the events they caused. A stream's
    /// first put carries when its request was sent: it is the data as the server found it on
    /// taking the listen, which shows only the writes answered before then.
    var eventSerial = 0
    var recentTouches: [(serial: Int, path: String, snapshotRequestedAt: ContinuousClock.Instant?)] = []
    /// Listens whose stream is open and complete (their views follow the server).
    var liveListens: [ListenRequest: Int] = [:]
    /// With a server that numbers its commits: the commit each listen's stream has applied
    /// through (its task's generation, the number).
    var streamCommits: [ListenRequest: (generation: Int, commit: Int64)] = [:]
    /// The commit each listen without a query has applied through: its next stream resumes
    /// from there (`Last-Event-ID`) instead of loading the whole location again, while the
    /// data cached there is whole.
    var resumePoints: [ListenRequest: StreamPosition] = [:]
    /// Positions kept in the database's sync state by an earlier `SyncClient` of this server
    /// (by location), for listens not yet resumed.
    var storedPositions: [String: StreamPosition] = [:]
    /// Clears the positions kept on disk before the first stream (see
    /// ``clearStoredPositionsOnDisk()``).
    var positionsCleared: Task<Void, Never>?
    /// Answers waiting for streams to reach their commit, woken when one moves.
    var progressWaiters: [CheckedContinuation<Void, Never>] = []
    /// Numbers the listen tasks (a listen's live mark belongs to the task that set it).
    var nextGeneration = 0
    /// The previous answer, being recorded while the next request is built and sent (one
    /// request in flight at a time, answers recorded in order): the writes it answered, the
    /// cursor durable before it (what `X-Ferry-Acked` may say meanwhile), the task recording it.
    var recording: (through: Int64, cursorBefore: Int64, task: Task<Void, any Error>)?
    /// Writes up to this id go alone (the server refused a batch holding them as a whole).
    var alonePast: Int64 = -1
    /// Lowered when the server refuses a batch as too large (413).
    var batchWriteLimit = Int.max
    var writerWake: AsyncStream<Void>.Continuation?
    var listens: [ListenRequest: Task<Void, Never>] = [:]
    /// The presence stream (see ``OnDisconnect``), once a registration asked for it.
    var presenceTask: Task<Void, Never>?
    var presenceOpen = false
    var signalTask: Task<Void, Never>?

    /// Connects `database` to the server at `url` (`http://127.0.0.1:9000?ns=NAME`, or
    /// `https://NAME.firebaseio.com`). The client starts offline: call ``goOnline()``.
    ///
    /// - Throws: ``SyncError``: `invalidURL`, or `invalidCertificates` when
    ///   ``SyncOptions/trustedCertificatesPEM`` holds no certificate.
    public init(database: Database, url: String, options: SyncOptions = SyncOptions()) throws {
        self.database = database
        self.address = try ServerAddress(url)
        self.options = options
        self.logger = options.logger
        let c = options.requestTimeout.components
        let nanos = c.seconds * 1_000_000_000 + c.attoseconds / 1_000_000_000
        self.transport = try Transport(address: address, timeout: .nanoseconds(nanos), trusting: options.trustedCertificatesPEM)
        self.storedPositions = Self.loadPositions(database.readSyncState(), address)
    }

    // MARK: Online and offline

    /// Starts syncing: sends pending writes, holds the listens. Does nothing when online.
    public func goOnline() {
        guard !online, !closed else { return }
        online = true
        if signalTask == nil {
            let signals = database.syncSignals()
            signalTask = Task { [weak self] in
                for await signal in signals {
                    guard let self else { return }
                    await self.handle(signal)
                }
            }
        }
        let (wakeups, wake) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
        writerWake = wake
        // One writer at a time: a writer stopped by goOffline() may still be recording an
        // answer; the new one starts from the cursor once it has.
        let previous = stoppingWriter
        writer = Task {
            await previous?.value
            await self.runWriter(wakeups)
        }
        stoppingWriter = nil
        refusedListens = [:]
        tokenKnown = false  // (ask the provider again: the user may have signed in meanwhile)
        reconcileListens()
    }

    /// Stops syncing: ends the listens and the sending. Writes keep queueing in the database;
    /// a write already sent may still be applied by the server (and is answered as a duplicate
    /// when sent again).
    public func goOffline() {
        _ = stopTasks()
    }

    /// Cancels the writer and the listens; returns them (to wait for).
    private func stopTasks() -> [Task<Void, Never>] {
        guard online else { return [] }
        online = false
        let stopped = [writer, presenceTask].compactMap { $0 } + Array(listens.values)
        for task in stopped { task.cancel() }
        presenceTask = nil
        presenceOpen = false
        stoppingWriter = writer
        writer = nil
        writerWake?.finish()
        writerWake = nil
        listens = [:]
        streamCommits = [:]
        noteProgress()
        setConnected(false)
        return stopped
    }

    /// Goes offline for good, once what was under way has stopped (an answer being recorded
    /// is recorded first). The database stays open: close it afterwards.
    public func close() async {
        closed = true
        for task in stopTasks() { await task.value }
        await savePositions()
        // After an earlier `goOffline()` (which waits for nothing), the writer it stopped may
        // still be recording an answer: without this, a database closed next lost it, and the
        // write went out again on the next launch (an increment counted twice by a server
        // without de-duplication).
        await stoppingWriter?.value
        signalTask?.cancel()
        signalTask = nil
        for (_, c) in connectionObservers { c.finish() }
        connectionObservers = [:]
    }

    /// Whether the client is online and its last exchange with the server succeeded (Firebase's
    /// `.info/connected`).
    public var isConnected: Bool { connected }

    /// Whether the client is trying to sync (``goOnline()`` was called and not undone).
    public var isOnline: Bool { online }

    /// The connection state now, then each change (Firebase's `.info/connected`). Ends when
    /// the client closes or the iterating task stops.
    public func connectionStates() -> AsyncStream<Bool> {
        let (stream, continuation) = AsyncStream.makeStream(of: Bool.self)
        let id = nextObserver
        nextObserver += 1
        connectionObservers[id] = continuation
        continuation.yield(connected)
        continuation.onTermination = { _ in Task { await self.removeObserver(id) } }
        if closed { continuation.finish() }
        return stream
    }

    private func removeObserver(_ id: Int) { connectionObservers[id] = nil }

    func setConnected(_ value: Bool) {
        guard value != connected else { return }
        guard !value || online else { return }
        connected = value
        logger.info("\(address): \(value ? "connected" : "disconnected")")
        for (_, c) in connectionObservers { c.yield(value) }
    }

    private func handle(_ signal: SyncSignal) {
        switch signal {
        case .writes: writerWake?.yield()
        case .listens: reconcileListens()
        }
    }

    /// The listens the server refused (its rules do not let this client read there), by
    /// location, with the server's message. Their listeners get no server data (their
    /// snapshots stay `fromCache`); they are asked again after a new token or ``goOnline()``.
    public var refusedListenLocations: [String: String] {
        Dictionary(refusedListens.map { ($0.key.description, $0.value) }, uniquingKeysWith: { a, _ in a })
    }

    // MARK: Tokens and time

    /// The token to send.
    ///
    /// - Throws: ``SyncError`` (`unauthenticated`) when the provider fails: sending waits (a
    ///   request without the token would be refused as an unauthenticated user's).
    func currentToken() async throws -> String? {
        guard let provider = options.tokenProvider else { return nil }
        if !tokenKnown {
            do {
                token = try await provider(false)
                tokenKnown = true
            } catch {
                logger.warning("the token provider failed: \(error)")
                throw SyncError(.unauthenticated, "the token provider failed: \(error)")
            }
        }
        return token
    }

    /// The server refused `rejected`: asks the provider for a new token. Returns whether it gave
    /// a different one (otherwise the caller waits before asking again).
    func refreshToken(after rejected: String?) async -> Bool {
        guard let provider = options.tokenProvider else { return false }
        do {
            let new = try await provider(true)
            token = new
            tokenKnown = true
            if new != rejected && !refusedListens.isEmpty {
                refusedListens = [:]  // (the rules may let the new one read)
                reconcileListens()
            }
            return new != rejected
        } catch {
            logger.warning("the token provider failed: \(error)")
            return false
        }
    }

    /// Notes an answer: the connection works, and the server's clock.
    func noteAnswer(_ answer: Answer) {
        setConnected(true)
        if let offset = answer.clockOffset { database.setServerTimeOffset(offset) }
    }

    /// Sends one request with the current token and reads its answer.
    func send(_ method: HTTPMethod, _ path: String, parameters: [String: String] = [:],
              headers: [(String, String)] = [], body: [UInt8]? = nil) async throws -> Answer {
        let t = try await currentToken()
        do {
            let answer = try await transport.send(transport.request(method, path, parameters: parameters, headers: headers, body: body, token: t))
            noteAnswer(answer)
            if answer.isTokenProblem { throw SyncError(.unauthenticated, answer.errorMessage, status: 401) }
            // A timeout or "too many requests" is not a refusal: send again later. Nor is a
            // redirect of a write (not followed: see `Transport.makeClient`), said as such.
            if (300..<400).contains(answer.status) {
                let to = answer.headers.first(name: "Location") ?? "nowhere said"
                logger.warning("\(address) redirected \(method) \(path) (\(answer.status)) to \(to); writes do not follow redirects: sending again later")
                throw SyncError(.unavailable, "\(method) \(path): redirected (\(answer.status)) to \(to)", status: answer.status)
            }
            if answer.status >= 500 || answer.status == 408 || answer.status == 429 {
                throw SyncError(.unavailable, "\(method) \(path): \(answer.errorMessage)", status: answer.status)
            }
            return answer
        } catch let e as SyncError where e.code == .unavailable {
            if e.status == nil { setConnected(false) }
            throw e
        }
    }

    /// Waits before retry number `failures` (≥ 1): exponential with full jitter.
    static func backoff(_ failures: Int, _ options: SyncOptions) async throws {
        let base = options.retryDelay * (1 << min(failures - 1, 16))
        let cap = min(base, options.maxRetryDelay)
        let ms = max(1, Int(cap.components.seconds * 1000 + cap.components.attoseconds / 1_000_000_000_000_000))
        try await Task.sleep(for: .milliseconds(Int.random(in: ms / 2...ms)))
    }

    /// What the server offers, asked once per client.
    func serverCapabilities() async throws -> Capabilities {
        if let capabilities { return capabilities }
        let c: Capabilities
        do {
            let answer = try await send(.GET, "/.ferry/info")
            if answer.status == 200, case .object(let o)? = answer.value, o["server"] == "ferry-server" {
                func int(_ k: String, _ d: Int) -> Int { if case .int(let n)? = o[k] { Int(n) } else { d } }
                c = Capabilities(batch: o["batch"] == true && options.usesBatches,
                                 maxWrites: int("maxBatchWrites", 1), maxBytes: int("maxBatchBytes", 1 << 20),
                                 commits: o["commits"] == true, presence: o["presence"] == true)
            } else {
                logger.info("\(address) offers no extensions: one request per write, without de-duplication")
                c = .plain
            }
        }
        capabilities = c
        return c
    }
}
