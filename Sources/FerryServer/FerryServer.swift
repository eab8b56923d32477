#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
@_spi(Server) import Ferry
import FerryLog
import FerryWire
import Foundation
import Logging
import NIOCore
import NIOHTTP1
import NIOPosix
import NIOSSL
import Synchronization

/// How a ``FerryServer`` runs.
public struct ServerConfiguration: Sendable {
    /// The address to listen on: loopback unless told otherwise.
    public var host = "127.0.0.1"
    /// The port; 0 picks a free one (see ``FerryServer/start()``).
    public var port = 0
    /// The directory holding one store per namespace, under `ns/NAME`.
    public var dataDirectory: String
    /// Development tokens accepted as users: `UID:SECRET` is the user `UID`; a token without a
    /// colon is its own uid. For tests and development; real apps use signed tokens
    /// (``tokenVerification``).
    public var tokens: Set<String> = []
    /// Emulator mode: `Bearer owner` is the administrator, as in Firebase's emulators. nil:
    /// on when ``host`` is a loopback address, off otherwise.
    public var emulatorMode: Bool?
    /// A credential that makes its bearer the administrator (compared in constant time).
    public var adminToken: String?
    /// A claim that makes the bearer of a verified token carrying it as `true` the administrator.
    public var adminClaim: String?
    /// How signed ID tokens are verified (nil: none are accepted).
    public var tokenVerification: TokenVerification?
    /// The rules (`{"rules": {...}}`, JSON text) of every namespace that has not set its own
    /// (`PUT /.settings/rules.json`). nil: such namespaces are open.
    public var defaultRules: String?
    /// Lets the server listen beyond loopback without verified tokens and rules (or in emulator
    /// mode): anyone who reaches the port may then read and write.
    public var allowInsecurePublic = false
    /// TLS for the REST API, its streams and the Firestore API: PEM files of the certificate
    /// chain (leaf first) and its private key. nil: plaintext.
    public var tls: TLSFiles?
    /// The largest request body accepted (Firebase's REST limit: 16 MB).
    public var maxBody = 16 * 1024 * 1024
    /// The most writes one batch may hold.
    public var maxBatchWrites = 5_000
    /// A client that sends nothing for this long while a request is unfinished is disconnected.
    public var requestTimeoutSeconds = 30
    /// How long a connection may wait for its next request once it has been answered (HTTP
    /// keep-alive). Longer than clients keep idle connections (`FerrySync`'s pool: 30 s), so a
    /// client closes first and never sends a request on a connection the server is closing.
    public var idleTimeoutSeconds = 120
    /// Silence on a stream after which a `keep-alive` event is sent.
    public var keepAliveSeconds = 30
    /// The most connections open at once (idle, busy or streaming); a connection beyond it is
    /// answered `503` and closed on arrival. Each open connection needs a file descriptor.
    public var maxConnections = 16_384
    /// The most bytes a stream (an event stream, or a Firestore Listen: about its documents'
    /// bytes) may have waiting to be sent to a client that does not read them; past it the
    /// stream is closed (and logged; a Listen ends with `RESOURCE_EXHAUSTED`), so a slow client
    /// cannot grow the server's memory.
    public var maxStreamBufferBytes = 16 * 1024 * 1024
    /// The most recent commits each namespace keeps for streams that resume after one of them
    /// (`Last-Event-ID`); a stream resuming from an older one gets the whole value.
    public var historyCommits = 100_000
    /// About the most bytes of data those commits may hold (the oldest go first).
    public var historyBytes = 64 * 1024 * 1024
    /// How long a client's registered `onDisconnect` writes wait for it: after a restart, for
    /// a client connected before it to connect again; and on a presence stream, for data sent
    /// to stay unacknowledged by a client gone silent (`TCP_USER_TIMEOUT`, Linux). A presence
    /// stream that closes runs them at once.
    public var presenceTimeoutSeconds = 60
    /// The port of Cloud Firestore's gRPC API (`google.firestore.v1.Firestore`, plaintext
    /// HTTP/2) on `host`; nil serves none, 0 picks a free one (see ``FerryServer/startFirestore()``).
    /// Its databases are kept under `firestore/PROJECT/DATABASE`.
    public var firestorePort: Int?
    /// The most writes one Firestore commit may hold.
    public var maxCommitWrites = 10_000
    /// A Firestore database writes a checkpoint (and deletes the log segments below it) once
    /// the commits since the last one weigh this many bytes and the last checkpoint; and on
    /// close, when they weigh an eighth of the last checkpoint or more.
    public var firestoreCheckpointBytes = 32 << 20
    /// Where the Realtime Database namespaces are kept: nil, each in a Ferry store under
    /// `dataDirectory/ns/NAME` (the default); or a PostgreSQL database that several servers
    /// share (started: see ``PostgresBackend/start()``).
    public var postgres: PostgresBackend?
    /// How long, with PostgreSQL, a group of writes may wait for a connection and its
    /// namespace's lock (or a read for what other processes committed) before it is answered
    /// 503: a database that does not answer, or a pool that cannot grow, is an error clients
    /// retry, not a wait without end.
    public var storageWaitSeconds = 10
    /// The event loop threads serving connections (0: one per core).
    public var eventLoopThreads = 0
    /// Where the server logs; it never bootstraps logging itself.
    public var logger = Logger(label: "ferry-server")

    /// A configuration serving the stores under `dataDirectory`.
    public init(dataDirectory: String) { self.dataDirectory = dataDirectory }
}

/// Where a server's TLS certificate chain and private key are (PEM files).
public struct TLSFiles: Sendable {
    /// The certificate chain, the server's own certificate first.
    public var certificateChain: String
    /// The private key of the first certificate.
    public var privateKey: String

    public init(certificateChain: String, privateKey: String) {
        self.certificateChain = certificateChain
        self.privateKey = privateKey
    }
}

/// An error starting the server: what failed, where (the address), and the system's errno.
public struct ServerError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is. New codes may be added.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        let name: String
        /// The host is not an IPv4 address.
        public static let invalidAddress = Code(name: "invalid address")
        /// A socket could not be made, bound or listened on (port in use, no permission…).
        public static let cannotListen = Code(name: "cannot listen")
        /// The security settings are invalid (a key set, the rules), or too weak for the address.
        public static let insecure = Code(name: "insecure")
        /// The code's name.
        public var description: String { name }
    }
    /// What kind of failure this is.
    public var code: Code
    /// What failed, for a person.
    public var message: String
    /// The address it happened on (`host:port`).
    public var address: String
    /// The errno (the cause), if a system call failed.
    public var errno: Int32?
    /// A person-readable description.
    public var description: String { "\(message) at \(address)" + (errno.map { " (errno \($0): \(String(cString: strerror($0))))" } ?? "") }
}

/// The Realtime Database REST + streaming server over Ferry stores: plain REST as firebase-admin
/// speaks it, plus Ferry's idempotent writes and batches (see `FerryWire/PROTOCOL.md`).
///
/// Connections are served by SwiftNIO event loops (a few threads, however many connections);
/// each request is answered by a Swift concurrency task, so a request waiting for its write to
/// be durable holds no thread; a stream is written to as its events come. Each namespace has one
/// writer task that makes writes durable in groups before they are answered.
public final class FerryServer: Sendable {
    /// The configuration it runs with.
    public let configuration: ServerConfiguration
    private let group: MultiThreadedEventLoopGroup
    private let listener = FerryMutex<(any Channel)?>(nil)
    private let namespaces = FerryMutex<[String: Task<Namespace, any Error>]>([:])
    private struct Connections {
        var open: [ObjectIdentifier: any Channel] = [:]
        /// Requests being answered (streams are not counted once they stream).
        var inFlight = 0
        var stopping = false
    }
    private let connections = FerryMutex(Connections())
    /// Whom each request speaks for.
    let authenticator: Authenticator
    /// The rules of namespaces without their own.
    let defaultRules: Rules
    /// What is wrong with the configuration's security settings (``start()`` throws it).
    let securityProblem: String?
    /// The TLS context every connection starts with (nil: plaintext).
    private let tlsContext: NIOSSLContext?
    private var logger: Logger { configuration.logger }
    /// Cloud Firestore's databases, and the gRPC server serving them once started.
    let firestore: FirestoreDatabases
    let firestoreServer = FerryMutex<FirestoreEndpoint?>(nil)

    /// A server for `configuration`; call ``start()``.
    public init(configuration: ServerConfiguration) {
        self.configuration = configuration
        var problem: String?
        var verifier: TokenVerifier?
        if let v = configuration.tokenVerification {
            do { verifier = try TokenVerifier(v) } catch { problem = "token verification: \(error)" }
        }
        var rules = Rules(root: nil)
        if let text = configuration.defaultRules {
            do { rules = try Rules(body: try Value(json: text)) } catch let e as Rules.RulesError {
                problem = "the rules: \(e.message)"
            } catch {
                problem = "the rules are not JSON: \(errorMessage(error) ?? "\(error)")"
            }
        }
        let loopback = FerryServer.isLoopback(configuration.host)
        let emulator = configuration.emulatorMode ?? loopback
        if !loopback && !configuration.allowInsecurePublic {
            if emulator {
                problem = "emulator mode (Bearer owner is the administrator) is for loopback only; to serve \(configuration.host) in it anyway, allow an insecure public server in so many words"
            } else if configuration.tokenVerification == nil || configuration.defaultRules == nil {
                problem = "serving \(configuration.host) needs verified tokens and rules; to serve it without them, allow an insecure public server in so many words"
            } else if !configuration.tokens.isEmpty {
                problem = "development tokens (--token) are for loopback; to accept them on \(configuration.host), allow an insecure public server in so many words"
            }
        }
        var context: NIOSSLContext?
        if let tls = configuration.tls {
            do {
                let chain = try NIOSSLCertificate.fromPEMFile(tls.certificateChain).map { NIOSSLCertificateSource.certificate($0) }
                let key = try NIOSSLPrivateKey(file: tls.privateKey, format: .pem)
                context = try NIOSSLContext(configuration: .makeServerConfiguration(certificateChain: chain, privateKey: .privateKey(key)))
            } catch {
                problem = "TLS: cannot use \(tls.certificateChain) and \(tls.privateKey): \(error)"
            }
        }
        tlsContext = context
        securityProblem = problem
        defaultRules = rules
        authenticator = Authenticator(emulator: emulator, adminToken: configuration.adminToken, adminClaim: configuration.adminClaim,
                                      verifier: verifier, tokens: configuration.tokens)
        firestore = FirestoreDatabases(directory: configuration.dataDirectory + "/firestore",
                                       checkpointBytes: configuration.firestoreCheckpointBytes, logger: configuration.logger)
        group = MultiThreadedEventLoopGroup(numberOfThreads: configuration.eventLoopThreads > 0 ? configuration.eventLoopThreads : System.coreCount)
    }

    /// Binds and starts accepting; returns the port (the bound one when the configuration says 0).
    ///
    /// - Throws: ``ServerError``: `invalidAddress`, or `cannotListen` with the errno.
    public func start() throws -> Int {
        let address = "\(configuration.host):\(configuration.port)"
        var probe = in_addr()
        guard inet_pton(AF_INET, configuration.host, &probe) == 1 else {
            throw ServerError(code: .invalidAddress, message: "\(configuration.host) is not an IPv4 address", address: address)
        }
        if let securityProblem { throw ServerError(code: .insecure, message: securityProblem, address: address) }
        let bootstrap = ServerBootstrap(group: group)
            .serverChannelOption(.backlog, value: 4096)
            .serverChannelOption(.socketOption(.so_reuseaddr), value: 1)
            .childChannelOption(.socketOption(.tcp_nodelay), value: 1)
            .childChannelInitializer { [self] channel in accept(channel) }
        let channel: any Channel
        do {
            channel = try bootstrap.bind(host: configuration.host, port: configuration.port).wait()
        } catch {
            throw ServerError(code: .cannotListen, message: "cannot listen", address: address, errno: (error as? IOError)?.errnoCode)
        }
        listener.withLock { $0 = channel }
        openNamespacesWithPresence()
        return channel.localAddress?.port ?? configuration.port
    }

    /// The token of an `Authorization: Bearer TOKEN` header; nil for another scheme.
    static func bearerToken(_ header: String) -> String? {
        header.hasPrefix("Bearer ") ? String(header.dropFirst(7)).trimmingCharacters(in: .whitespaces) : nil
    }

    /// Whether `host` is an IPv4 loopback address (127.0.0.0/8).
    static func isLoopback(_ host: String) -> Bool {
        var a = in_addr()
        guard inet_pton(AF_INET, host, &a) == 1 else { return false }
        return UInt32(bigEndian: a.s_addr) >> 24 == 127
    }

    /// Whether `Bearer owner` is the administrator (see ``ServerConfiguration/emulatorMode``).
    public var isEmulator: Bool { authenticator.emulator }

    /// 1–63 ASCII letters, digits, `-` or `_`.
    static func isNamespaceName(_ name: String) -> Bool {
        (1...63).contains(name.utf8.count) && name.utf8.allSatisfy { $0 == 0x2D || $0 == 0x5F || (0x30...0x39).contains($0) || (0x61...0x7A).contains($0) || (0x41...0x5A).contains($0) }
    }

    /// Opens the namespaces that keep `onDisconnect` registrations (marked by `ns/NAME.presence`),
    /// so that those of clients that do not come back run after the presence timeout even if
    /// nobody asks for the namespace. In a shared PostgreSQL database: those of the clients of
    /// processes whose lease expired (see ``PostgresBackend``).
    private func openNamespacesWithPresence() {
        if let backend = configuration.postgres {
            // In a shared database: the registrations of clients of processes that died.
            backend.onOrphans { [self] name, clients in
                Task {
                    do {
                        let ns = try await namespace(name)
                        for client in clients { ns.runPresence(client) }
                    } catch {
                        logger.error("cannot open namespace \(name) for the onDisconnect writes of a process gone: \(error)")
                    }
                }
            }
            return
        }
        let dir = configuration.dataDirectory + "/ns"
        let names = ((try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []).filter { $0.hasSuffix(".presence") }.map { String($0.dropLast(9)) }
        for name in names where Self.isNamespaceName(name) {
            Task { [self] in
                do { _ = try await namespace(name) } catch { logger.error("cannot open namespace \(name) for its onDisconnect writes: \(error)") }
            }
        }
    }

    /// A new connection: served, or answered `503` and closed when the limit is reached.
    private func accept(_ channel: any Channel) -> EventLoopFuture<Void> {
        let id = ObjectIdentifier(channel)
        let open = connections.withLock { s -> Int? in
            if s.stopping || s.open.count >= configuration.maxConnections { return nil }
            s.open[id] = channel
            return s.open.count
        }
        guard open != nil else {
            let stopping = connections.withLock { $0.stopping }
            let message = stopping ? "the server is shutting down" : "the server holds \(configuration.maxConnections) connections, its limit (--max-connections)"
            logger.warning("refusing a connection: \(message)")
            let body = "{\"error\":\(HTTPResponse.jsonString(message))}"
            let text = "HTTP/1.1 503 Service Unavailable\r\nContent-Type: application/json; charset=utf-8\r\nX-Ferry-Server-Time: \(now())\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n\r\n\(body)"
            return channel.eventLoop.makeCompletedFuture { [tlsContext] in
                if let tlsContext { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tlsContext)) }
                try channel.pipeline.syncOperations.addHandler(RefusalHandler(answer: text))
            }
        }
        channel.closeFuture.whenComplete { [self] _ in
            _ = connections.withLock { $0.open.removeValue(forKey: id) }
        }
        return channel.eventLoop.makeCompletedFuture { [tlsContext] in
            if let tlsContext { try channel.pipeline.syncOperations.addHandler(NIOSSLServerHandler(context: tlsContext)) }
            let lastRead = LastReadKeeper()
            try channel.pipeline.syncOperations.addHandler(lastRead)
            try channel.pipeline.syncOperations.configureHTTPServerPipeline(withPipeliningAssistance: false, withErrorHandling: false)
            try channel.pipeline.syncOperations.addHandler(HTTPServerHandler(server: self, lastRead: lastRead))
        }
    }

    /// Counts a request as in flight; false once the server is stopping.
    func admitRequest() -> Bool {
        connections.withLock { s in
            if s.stopping { return false }
            s.inFlight += 1
            return true
        }
    }

    func finishRequest() {
        connections.withLock { $0.inFlight -= 1 }
    }

    /// Stops accepting, lets the requests in flight finish, closes idle connections and streams,
    /// waits for every queued write to be durable, and closes the stores.
    public func shutdown() async {
        connections.withLock { $0.stopping = true }
        if let l = listener.withLock({ l in defer { l = nil }; return l }) {
            try? await l.close()
        }
        // Requests in flight finish (a stream is not in flight: it is ended below).
        while connections.withLock({ $0.inFlight > 0 }) {
            try? await Task.sleep(for: .milliseconds(5))
        }
        await stopFirestore()
        for (_, task) in namespaces.withLock({ $0 }) {
            if let ns = try? await task.value { await ns.close() }
        }
        // Streams ended above close themselves once their last chunk is written; the rest now.
        for (_, c) in connections.withLock({ $0.open }) { try? await c.close() }
        try? await group.shutdownGracefully()
        logger.info("stopped")
    }

    func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    // MARK: Routing

    private static let plainParameters: Set<String> = ["ns", "auth", "shallow", "print", "format", "auth_variable_override", "timeout", "writeSizeLimit", "download"]

    /// Answers one request; nil when it became a stream (its events go to `output`).
    func respond(to r: HTTPRequest, stream output: StreamOutput) async -> HTTPResponse? {
        // The Firestore emulator's clear-data request: in emulator mode with no token, as the
        // emulator asks none; otherwise the administrator's.
        if r.keys.first == "emulator", r.keys.last?.hasSuffix(".json") != true {
            let k = r.keys
            guard r.method == "DELETE", k.count == 7, k[1] == "v1", k[2] == "projects", k[4] == "databases", k[6] == "documents" else {
                return .error(404, "not found (the emulator API here is DELETE /emulator/v1/projects/P/databases/D/documents)")
            }
            if !authenticator.emulator {
                guard case .success(.owner) = await authenticator.caller(token: r.headers["authorization"].flatMap(Self.bearerToken)) else {
                    return .error(401, "Permission denied")
                }
            }
            return await clearFirestore(project: k[3], database: k[5])
        }
        for name in r.query.keys where !Self.plainParameters.contains(name) && !WireQuery.parameterNames.contains(name) {
            return .error(400, "Unknown parameter: \(name)")
        }
        // The namespace: ?ns=NAME, else the first label of NAME.firebaseio.com.
        var nsName = r.query["ns"]
        if nsName == nil, let host = r.headers["host"]?.split(separator: ":").first, host.contains("."), host.contains(where: \.isLetter) {
            nsName = String(host.split(separator: ".")[0])
        }
        guard let nsName else { return .error(400, "no namespace: add ?ns=NAME") }
        guard Self.isNamespaceName(nsName) else {
            return .error(400, "invalid namespace: \(nsName.prefix(80))")
        }
        // Who is asking.
        var token = r.query["auth"]
        if let h = r.headers["authorization"] {
            guard let t = Self.bearerToken(h) else { return .error(401, "Auth token is expired") }
            token = t
        }
        // The administrator may act as a user (firebase-admin's databaseAuthVariableOverride): rules apply.
        let caller: Caller
        switch await authenticator.caller(token: token, override: r.query["auth_variable_override"]) {
        case .success(let c): caller = c
        case .failure(let e):
            logger.info("refusing a token: \(e)")
            return .error(401, "Auth token is expired")
        }
        // The location.
        var keys = r.keys
        guard let last = keys.last, last.hasSuffix(".json") else { return .error(400, "the path must end with .json") }
        keys[keys.count - 1] = String(last.dropLast(5))
        if keys.last == "" { keys.removeLast() }
        if let print = r.query["print"], print != "silent" && print != "pretty" { return .error(400, "print must be silent or pretty") }

        let ns: Namespace
        do { ns = try await namespace(nsName) } catch {
            logger.error("cannot open namespace \(nsName): \(error)")
            return .error(503, "the namespace's store cannot be opened")
        }
        if keys.first == ".settings" || keys.first == ".ferry" {
            return await special(r, keys, caller, ns, output)
        }
        do {
            if keys.count > Path.maxDepth { return .error(400, "the path is \(keys.count) keys deep; the limit is \(Path.maxDepth)") }
            for k in keys { try Path.validate(key: k) }
        } catch {
            return .error(400, errorMessage(error) ?? "invalid path")
        }
        switch r.method {
        case "GET":
            // (With a shared storage: after every commit other processes made before the read.)
            guard await ns.current() else { return .error(503, "the storage is unavailable; try again") }
            if r.headers["accept"]?.contains("text/event-stream") == true { return stream(r, keys, caller, token: token, ns, output) }
            return get(r, keys, caller, ns)
        case "PUT", "POST", "PATCH", "DELETE":
            return await write(r, keys, caller, ns)
        default:
            return .error(405, "Unsupported method: \(r.method.prefix(20))")
        }
    }

    /// The namespace's store, opened by the first request that needs it (a failed open is tried again by the next).
    private func namespace(_ name: String) async throws -> Namespace {
        let task = namespaces.withLock { all in
            if let t = all[name] { return t }
            var log = logger
            log[metadataKey: "ns"] = "\(name)"
            let directory = configuration.dataDirectory + "/ns/" + name
            let limits = (changes: configuration.historyCommits, bytes: configuration.historyBytes)
            let presence = Duration.seconds(configuration.presenceTimeoutSeconds)
            let maxResume = max(1, configuration.maxStreamBufferBytes / 2)
            let t = Task { [log, defaultRules] in
                guard let backend = configuration.postgres else {
                    return try await Namespace(name: name, directory: directory, logger: log, historyLimits: limits, presenceTimeout: presence,
                                               maxResumeBytes: maxResume, defaultRules: defaultRules)
                }
                let storage = PostgresStorage(name: name, backend: backend, keptCommits: limits.changes)
                return try await Namespace(name: name, storage: storage, presenceMarker: nil, logger: log, historyLimits: limits,
                                           presenceTimeout: presence, maxResumeBytes: maxResume, defaultRules: defaultRules,
                                           storageWait: .seconds(configuration.storageWaitSeconds))
            }
            all[name] = t
            return t
        }
        do { return try await task.value } catch {
            namespaces.withLock { all in if all[name] == task { all[name] = nil } }
            throw error
        }
    }

    // MARK: Reads

    private func get(_ r: HTTPRequest, _ keys: [String], _ caller: Caller, _ ns: Namespace) -> HTTPResponse {
        let query: WireQuery?
        do { query = try WireQuery(parameters: r.query) } catch {
            return .error(400, errorMessage(error) ?? "invalid query")
        }
        var shallow = false
        if let s = r.query["shallow"] {
            guard s == "true" || s == "false" else { return .error(400, "shallow must be true or false") }
            shallow = s == "true"
            if shallow && query != nil { return .error(400, "shallow cannot be combined with a query") }
        }
        let (allowed, node) = ns.read { s in (Namespace.mayRead(caller, keys, s), ValueTree.child(s.committed, keys[...])) }
        guard allowed else { return .error(401, "Permission denied") }
        let value = query.map { ValueTree.exported($0.apply(to: node)) } ?? (shallow ? ValueTree.shallow(node) : ValueTree.exported(node))
        var headers: [(String, String)] = []
        if r.headers[WireHeader.firebaseETag] == "true" || r.headers["if-none-match"] != nil {
            let etag = ETag.of(node)
            headers.append(("ETag", etag))
            if r.headers["if-none-match"] == etag { return HTTPResponse(status: 304, headers: headers) }
        }
        return .json(200, value.json, headers: headers)
    }

    private func stream(_ r: HTTPRequest, _ keys: [String], _ caller: Caller, token: String?, _ ns: Namespace, _ output: StreamOutput) -> HTTPResponse? {
        let query: WireQuery?
        do { query = try WireQuery(parameters: r.query) } catch {
            return .error(400, errorMessage(error) ?? "invalid query")
        }
        guard ns.read({ Namespace.mayRead(caller, keys, $0) }) else { return .error(401, "Permission denied") }
        var client: String?
        if let c = r.headers[WireHeader.client] {
            guard WriteIdentity.isStoreID(c) else { return .error(400, "X-Ferry-Client must be a store id (32 lowercase hex digits)") }
            client = c
        }
        // A development token is kept to revoke the stream when the owner withdraws it; a signed
        // one revokes it when it expires (the client reconnects with a fresh one).
        var expires: Double?
        if case .user(.object(let auth)) = caller, case .object(let claims)? = auth["token"] { expires = claims["exp"]?.number }
        let development = token.map { t in authenticator.tokens.withLock { $0.contains(t) } } ?? false
        let sink = StreamSink(keys: keys, query: query, caller: caller, token: development ? token : nil, client: client, output: output)
        // A stream reconnecting after commit N (`Last-Event-ID`, as an `EventSource` sends it)
        // gets what changed since, when the namespace still holds it.
        let resumeAfter = r.headers[WireHeader.lastEventID].flatMap { Int64($0.trimmingCharacters(in: .whitespaces)) }.flatMap { $0 >= 0 ? $0 : nil }
        guard let id = ns.addStream(sink, resumeAfter: resumeAfter, epoch: r.headers[WireHeader.epoch]) else { return .error(503, "the namespace is closing") }
        output.onClose { ns.removeStream(id) }
        if let expires {
            let wait = min(max(0, expires - Date().timeIntervalSince1970), 366 * 86_400)
            let expiry = Task {
                try await Task.sleep(for: .milliseconds(Int64(wait * 1000)))
                ns.revokeStream(id)
            }
            output.onClose { expiry.cancel() }
        }
        return nil
    }

    // MARK: Writes

    /// Parses a body as JSON; a message for the client when it is not.
    private func parse(_ body: [UInt8]) -> Result<Value, HTTPResponseError> {
        do { return .success(try Value(jsonBytes: body)) } catch {
            return .failure(HTTPResponseError(.error(400, "Invalid data; couldn't parse JSON object, array, or value.")))
        }
    }

    struct HTTPResponseError: Error { var response: HTTPResponse; init(_ r: HTTPResponse) { response = r } }

    /// Checks a value to be written at `keys`: its keys, and the depth limit from the namespace root.
    private func check(_ value: Value, at keys: [String]) -> HTTPResponse? {
        do { try ValueTree.validateKeys(value) } catch {
            return .error(400, "Invalid data; \(errorMessage(error) ?? "invalid key")")
        }
        if keys.count + ValueTree.depth(value) > Path.maxDepth {
            return .error(400, "Invalid data; nested deeper than \(Path.maxDepth) levels from the root")
        }
        return nil
    }

    /// Builds the job for a plain write; a response when the request is bad. `parsed` is the
    /// body already parsed (a batch's writes), else `body` is.
    private func job(_ method: String, _ keys: [String], _ body: [UInt8], parsed: Value? = nil, caller: Caller, ns: Namespace) -> Result<WriteJob, HTTPResponseError> {
        var job = WriteJob(op: .set(.null), keys: keys, caller: caller, complete: { _ in })
        func parse(_ body: [UInt8]) -> Result<Value, HTTPResponseError> {
            if let parsed { return .success(parsed) }
            return self.parse(body)
        }
        switch method {
        case "DELETE":
            return .success(job)
        case "PUT", "POST":
            let value: Value
            switch parse(body) {
            case .success(let v): value = v
            case .failure(let e): return .failure(e)
            }
            if method == "POST" {
                let name = ns.nextPushID()
                job.keys.append(name)
                job.pushName = name
            }
            if let bad = check(value, at: job.keys) { return .failure(HTTPResponseError(bad)) }
            job.op = .set(value)
            return .success(job)
        default:  // PATCH
            let value: Value
            switch parse(body) {
            case .success(let v): value = v
            case .failure(let e): return .failure(e)
            }
            guard case .object(let dict) = value else { return .failure(HTTPResponseError(.error(400, "Invalid data; an update must be an object"))) }
            var children: [(keys: [String], value: Value)] = []
            for k in dict.keys.sorted() {
                guard let p = try? Path(validating: k), !p.keys.isEmpty else { return .failure(HTTPResponseError(.error(400, "Invalid data; invalid path in update: \(k.prefix(100))"))) }
                if let bad = check(dict[k]!, at: keys + p.keys) { return .failure(HTTPResponseError(bad)) }
                children.append((p.keys, dict[k]!))
            }
            for (i, a) in children.enumerated() {
                for b in children[(i + 1)...] where b.keys.starts(with: a.keys) || a.keys.starts(with: b.keys) {
                    return .failure(HTTPResponseError(.error(400, "Invalid data; /\(a.keys.joined(separator: "/")) and /\(b.keys.joined(separator: "/")) overlap in one update")))
                }
            }
            job.op = .update(children)
            return .success(job)
        }
    }

    private func write(_ r: HTTPRequest, _ keys: [String], _ caller: Caller, _ ns: Namespace) async -> HTTPResponse {
        for name in r.query.keys where WireQuery.parameterNames.contains(name) || name == "shallow" {
            return .error(400, "\(name) is not allowed on a \(r.method)")
        }
        var job: WriteJob
        switch self.job(r.method, keys, r.body, caller: caller, ns: ns) {
        case .success(let j): job = j
        case .failure(let e): return e.response
        }
        job.ifMatch = r.headers["if-match"]
        if let w = r.headers[WireHeader.write] {
            guard let identity = WriteIdentity(header: w) else { return .error(400, "X-Ferry-Write must be STORE/ID") }
            job.identity = identity
            if let a = r.headers[WireHeader.acked] {
                guard let acked = Int64(a), acked >= 0 else { return .error(400, "X-Ferry-Acked must be a write id") }
                job.acked = acked
            }
        }
        let outcome = await run([job], ns)[0]
        var headers: [(String, String)] = []
        if let etag = outcome.etag { headers.append(("ETag", etag)) }
        if outcome.duplicate { headers.append(("X-Ferry-Duplicate", "true")) }
        if let commit = outcome.commit { headers.append(("X-Ferry-Commit", String(commit))) }
        if outcome.status == 200 {
            if r.query["print"] == "silent" { return HTTPResponse(status: 204, headers: headers) }
            return .json(200, (r.method == "DELETE" ? Value.null : outcome.body).json, headers: headers)
        }
        if outcome.status == 412 { return .json(412, outcome.body.json, headers: headers) }
        var e = HTTPResponse.error(outcome.status, outcome.error ?? "failed")
        e.headers += headers
        return e
    }

    /// Submits jobs and waits (holding no thread) for their outcomes (durable when successful), in order.
    private func run(_ jobs: [WriteJob], _ ns: Namespace) async -> [WriteOutcome] {
        if jobs.isEmpty { return [] }
        return await withCheckedContinuation { (done: CheckedContinuation<[WriteOutcome], Never>) in
            let results = FerryMutex<[Int: WriteOutcome]>([:])
            var submitted = jobs
            for i in submitted.indices {
                submitted[i].complete = { o in
                    let all: [WriteOutcome]? = results.withLock { r in
                        r[i] = o
                        return r.count == jobs.count ? jobs.indices.map { r[$0]! } : nil
                    }
                    if let all { done.resume(returning: all) }
                }
            }
            ns.submit(submitted)
        }
    }

    // MARK: .settings and .ferry

    private func special(_ r: HTTPRequest, _ keys: [String], _ caller: Caller, _ ns: Namespace, _ output: StreamOutput) async -> HTTPResponse? {
        switch (r.method, keys) {
        case ("GET", [".settings", "rules"]):
            guard case .owner = caller else { return .error(401, "Permission denied") }
            let tree = ns.read { $0.rules.source }
            return .json(200, tree.map { Value.object(["rules": $0]).json } ?? #"{"rules":{".read":true,".write":true}}"#)
        case ("PUT", [".settings", "rules"]):
            guard case .owner = caller else { return .error(401, "Permission denied") }
            let value: Value
            switch parse(r.body) {
            case .success(let v): value = v
            case .failure(let e): return e.response
            }
            let rules: Rules
            do { rules = try Rules(body: value) } catch { return .error(400, error.message) }
            let outcome = await run([WriteJob(op: .rules(rules, text: value.json), keys: [], caller: caller, complete: { _ in })], ns)[0]
            return outcome.status == 200 ? .json(200, #"{"status":"ok"}"#) : .error(outcome.status, outcome.error ?? "failed")
        case ("GET", [".ferry", "info"]):
            return .json(200, Value.object([
                "server": "ferry-server", "protocol": 1, "idempotent": true, "batch": true, "commits": true, "presence": true,
                "maxBatchWrites": .int(Int64(configuration.maxBatchWrites)), "maxBatchBytes": .int(Int64(configuration.maxBody)),
            ]).json)
        case ("POST", [".ferry", "batch"]):
            return await batch(r, caller, ns)
        case ("GET", [".ferry", "presence"]) where r.headers["accept"]?.contains("text/event-stream") == true:
            return presenceStream(r, ns, output)
        case ("GET", [".ferry", "presence"]):
            // The registrations kept, by client (the owner only).
            guard case .owner = caller else { return .error(401, "Permission denied") }
            let all = ns.read { $0.presence }
            return .json(200, Value.object(all.mapValues { .array($0) }).json)
        case ("POST", [".ferry", "presence"]):
            return await presenceRegistration(r, caller, ns)
        case ("PUT", [".ferry", "tokens"]):
            guard case .owner = caller else { return .error(401, "Permission denied") }
            guard case .success(let v) = parse(r.body), case .array(let items) = v else {
                return .error(400, "the tokens must be a JSON array of strings")
            }
            var list: Set<String> = []
            for item in items {
                guard case .string(let t) = item, !t.isEmpty, t != "owner" else { return .error(400, "each token must be a non-empty string other than owner") }
                list.insert(t)
            }
            authenticator.tokens.withLock { $0 = list }
            // Streams whose token is no longer accepted: auth_revoked, then closed.
            for (_, task) in namespaces.withLock({ $0 }) {
                if let ns = try? await task.value { ns.revokeStreams { token in !list.contains(token) } }
            }
            return .json(200, v.json)
        default:
            return .error(400, "Invalid path: \(r.rawPath.prefix(100)) (keys may not contain . $ # [ ] /)")
        }
    }

    /// `GET /.ferry/presence.json` (an event stream, `X-Ferry-Client: STORE`): the client is
    /// connected while it is open; when its last one ends, its `onDisconnect` writes run.
    private func presenceStream(_ r: HTTPRequest, _ ns: Namespace, _ output: StreamOutput) -> HTTPResponse? {
        guard r.headers["accept"]?.contains("text/event-stream") == true else { return .error(400, "a presence stream is an event stream (Accept: text/event-stream)") }
        guard let client = r.headers[WireHeader.client], WriteIdentity.isStoreID(client) else {
            return .error(400, "a presence stream needs X-Ferry-Client: STORE (32 lowercase hex digits)")
        }
        ns.presenceConnected(client)
        output.onClose { ns.presenceDisconnected(client) }
        output.limitSilence(milliseconds: configuration.presenceTimeoutSeconds * 1000)
        output.send([.keepAlive])  // (the answer's head, and proof of life)
        return nil
    }

    /// `POST /.ferry/presence.json` `{"client": STORE, "op": "set"|"update"|"cancel", "path": P,
    /// "data": …}`: registers a write to run when the client's presence stream ends (the rules
    /// must let the caller write there now), or forgets those at or below P.
    private func presenceRegistration(_ r: HTTPRequest, _ caller: Caller, _ ns: Namespace) async -> HTTPResponse {
        guard case .success(let v) = parse(r.body), case .object(let o) = v else { return .error(400, "the registration must be a JSON object") }
        guard case .string(let client)? = o["client"], WriteIdentity.isStoreID(client) else { return .error(400, "client must be a store id (32 lowercase hex digits)") }
        guard case .string(let op)? = o["op"], ["set", "update", "cancel"].contains(op) else { return .error(400, "op must be set, update or cancel") }
        guard case .string(let path)? = o["path"], let keys = try? Path(validating: path).keys else { return .error(400, "path must be a valid location") }
        let change: PresenceChange
        if op == "cancel" {
            change = .cancel(keys)
        } else {
            let data = o["data"] ?? .null
            switch self.job(op == "set" ? "PUT" : "PATCH", keys, [], parsed: data, caller: caller, ns: ns) {
            case .failure(let e): return e.response
            case .success: break
            }
            change = .add(.object(["op": .string(op), "path": .string("/" + keys.joined(separator: "/")), "data": data, "caller": caller.stored]))
        }
        if case .add = change { ns.markPresence(true) }
        let outcome = await run([WriteJob(op: .presence(client: client, change), keys: keys, caller: caller, complete: { _ in })], ns)[0]
        if outcome.status == 200 { ns.presenceRegistered(client) }
        return outcome.status == 200 ? .json(200, #"{"status":"ok"}"#) : .error(outcome.status, outcome.error ?? "failed")
    }

    private func batch(_ r: HTTPRequest, _ caller: Caller, _ ns: Namespace) async -> HTTPResponse {
        let request: BatchRequest
        do {
            guard case .success(let v) = parse(r.body) else { return .error(400, "malformed batch: the body is not JSON") }
            request = try BatchRequest(v)
        } catch {
            return .error(400, errorMessage(error) ?? "malformed batch")
        }
        if request.writes.count > configuration.maxBatchWrites {
            return .error(413, "the batch has \(request.writes.count) writes; the limit is \(configuration.maxBatchWrites)")
        }
        var jobs: [WriteJob] = []
        for w in request.writes {
            var job: WriteJob
            let keys: [String]
            do { keys = try Path(validating: w.path).keys } catch {
                keys = []
                job = WriteJob(op: .rejected(.rejected(400, errorMessage(error) ?? "invalid path")), keys: [], caller: caller, complete: { _ in })
                job.identity = WriteIdentity(store: request.client, id: w.id)
                job.acked = request.acked
                jobs.append(job)
                continue
            }
            switch self.job(w.op == .set ? "PUT" : "PATCH", keys, [], parsed: w.data, caller: caller, ns: ns) {
            case .success(let j): job = j
            case .failure(let e):
                let message = (try? Value(jsonBytes: e.response.body)).flatMap { v -> String? in
                    if case .object(let o) = v, case .string(let m)? = o["error"] { return m }
                    return nil
                } ?? "invalid write"
                job = WriteJob(op: .rejected(.rejected(e.response.status, message)), keys: keys, caller: caller, complete: { _ in })
            }
            job.identity = WriteIdentity(store: request.client, id: w.id)
            job.acked = request.acked
            job.answersData = false
            jobs.append(job)
        }
        let outcomes = await run(jobs, ns)
        let results = zip(request.writes, outcomes).map { w, o in
            BatchResult(id: w.id, status: o.status, error: o.status == 200 ? nil : o.error, duplicate: o.duplicate, commit: o.commit)
        }
        return HTTPResponse(status: 200, headers: [("Content-Type", "application/json; charset=utf-8")], body: BatchResult.answer(results))
    }
}

/// The client-facing message of an error from Ferry or FerryWire.
func errorMessage(_ error: any Error) -> String? {
    if let e = error as? WireError { return e.message }
    if let e = error as? DatabaseError { return e.message }
    return nil
}

/// A connection past the limit: the answer goes out at once, the output is shut, what the client
/// sends is dropped, and the connection closes when the client does (or after a second), so the
/// client reads the answer instead of a reset.
final class RefusalHandler: ChannelInboundHandler {
    typealias InboundIn = ByteBuffer
    let answer: String

    init(answer: String) { self.answer = answer }

    func handlerAdded(context: ChannelHandlerContext) {
        let channel = context.channel
        context.writeAndFlush(NIOAny(channel.allocator.buffer(string: answer))).assumeIsolated().whenComplete { _ in
            channel.close(mode: .output, promise: nil)
        }
        context.eventLoop.assumeIsolated().scheduleTask(in: .seconds(1)) { channel.close(promise: nil) }
    }

    func channelRead(context: ChannelHandlerContext, data: NIOAny) {}
}
