#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
@_spi(Server) import Ferry
import FerryWire
import Foundation
import Logging
import Synchronization

/// How a ``FerryServer`` runs.
public struct ServerConfiguration: Sendable {
    /// The address to listen on: loopback unless told otherwise.
    public var host = "127.0.0.1"
    /// The port; 0 picks a free one (see ``FerryServer/start()``).
    public var port = 0
    /// The directory holding one store per namespace, under `ns/NAME`.
    public var dataDirectory: String
    /// Tokens accepted as authenticated users (`auth != null`). `owner` is always the administrator.
    public var tokens: Set<String> = []
    /// The largest request body accepted (Firebase's REST limit: 16 MB).
    public var maxBody = 16 * 1024 * 1024
    /// The most writes one batch may hold.
    public var maxBatchWrites = 500
    /// A client that sends nothing for this long while a request is unfinished is disconnected.
    public var requestTimeoutSeconds = 30
    /// Silence on a stream after which a `keep-alive` event is sent.
    public var keepAliveSeconds = 30
    /// The most connections served at once (each has a thread); more are closed on arrival.
    public var maxConnections = 1024
    /// Where the server logs; it never bootstraps logging itself.
    public var logger = Logger(label: "ferry-server")

    /// A configuration serving the stores under `dataDirectory`.
    public init(dataDirectory: String) { self.dataDirectory = dataDirectory }
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
/// One thread accepts; each connection gets a thread; each namespace has one writer task that
/// makes writes durable in groups before they are answered.
public final class FerryServer: Sendable {
    /// The configuration it runs with.
    public let configuration: ServerConfiguration
    private let listener = Mutex<Int32>(-1)
    private let namespaces = Mutex<[String: Namespace]>([:])
    private struct Connections {
        var open: [Int32: Bool] = [:]  // fd → busy with a request
        var stopping = false
    }
    private let connections = Mutex(Connections())
    /// The tokens accepted now: the configuration's, until the owner replaces them.
    private let tokens: Mutex<Set<String>>
    private var logger: Logger { configuration.logger }

    /// A server for `configuration`; call ``start()``.
    public init(configuration: ServerConfiguration) {
        self.configuration = configuration
        tokens = Mutex(configuration.tokens)
    }

    /// Binds and starts accepting; returns the port (the bound one when the configuration says 0).
    ///
    /// - Throws: ``ServerError``: `invalidAddress`, or `cannotListen` with the errno.
    public func start() throws -> Int {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        let address = "\(configuration.host):\(configuration.port)"
        guard fd >= 0 else { throw ServerError(code: .cannotListen, message: "socket() failed", address: address, errno: errno) }
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(configuration.port).bigEndian)
        guard inet_pton(AF_INET, configuration.host, &addr.sin_addr) == 1 else {
            close(fd)
            throw ServerError(code: .invalidAddress, message: "\(configuration.host) is not an IPv4 address", address: address)
        }
        let bound = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        guard bound == 0, listen(fd, 128) == 0 else {
            let e = errno
            close(fd)
            throw ServerError(code: .cannotListen, message: "cannot listen", address: address, errno: e)
        }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        listener.withLock { $0 = fd }
        Thread.detachNewThread { [self] in acceptLoop(fd) }
        return Int(UInt16(bigEndian: addr.sin_port))
    }

    private func acceptLoop(_ fd: Int32) {
        while true {
            let c = accept(fd, nil, nil)
            if c < 0 {
                if errno == EINTR || errno == ECONNABORTED { continue }
                if connections.withLock({ $0.stopping }) { return }
                logger.error("accept failed: errno \(errno)")
                usleep(10_000)
                continue
            }
            let admitted = connections.withLock { s -> Bool in
                if s.stopping || s.open.count >= configuration.maxConnections { return false }
                s.open[c] = false
                return true
            }
            if !admitted {
                logger.warning("refusing a connection: \(configuration.maxConnections) are open or the server is stopping")
                close(c)
                continue
            }
            Thread.detachNewThread { [self] in serve(c) }
        }
    }

    /// Stops accepting, lets the requests in flight finish, closes idle connections and streams,
    /// waits for every queued write to be durable, and closes the stores.
    public func shutdown() async {
        let fd = listener.withLock { fd in defer { fd = -1 }; return fd }
        connections.withLock { $0.stopping = true }
        if fd >= 0 {
            Glibc.shutdown(fd, Int32(SHUT_RDWR))
            close(fd)
        }
        // Requests in flight finish (a stream is not in flight: it is ended below).
        while connections.withLock({ $0.open.values.contains(true) }) {
            try? await Task.sleep(for: .milliseconds(5))
        }
        for (_, ns) in namespaces.withLock({ $0 }) { await ns.close() }
        connections.withLock { s in for (c, _) in s.open { Glibc.shutdown(c, Int32(SHUT_RDWR)) } }
        logger.info("stopped")
    }

    // MARK: Connections

    private func serve(_ fd: Int32) {
        let conn = HTTPConnection(fd: fd, timeoutSeconds: configuration.requestTimeoutSeconds)
        defer {
            connections.withLock { _ = $0.open.removeValue(forKey: fd) }
            close(fd)
        }
        while true {
            let request: HTTPRequest
            do {
                guard let r = try conn.readRequest(maxBody: configuration.maxBody) else { return }
                request = r
            } catch {
                logger.notice("closing a connection: \(error.message)")
                if let status = error.status { conn.write(.error(status, error.message), keepAlive: false, serverTime: now()) }
                return
            }
            let admitted = connections.withLock { s -> Bool in
                if s.stopping { return false }
                s.open[fd] = true
                return true
            }
            if !admitted {
                conn.write(.error(503, "the server is shutting down"), keepAlive: false, serverTime: now())
                return
            }
            let response = handle(request, conn)
            connections.withLock { $0.open[fd] = false }
            guard let response else { return }  // a stream: it owned the connection and has ended
            if response.status >= 400 {
                logger.info("\(request.method) \(request.rawPath) → \(response.status) \(String(decoding: response.body.prefix(200), as: UTF8.self))")
            }
            let keepAlive = request.keepAlive && response.status != 413
            guard conn.write(response, keepAlive: keepAlive, serverTime: now()), keepAlive else { return }
        }
    }

    private func now() -> Int64 { Int64(Date().timeIntervalSince1970 * 1000) }

    // MARK: Routing

    private static let plainParameters: Set<String> = ["ns", "auth", "shallow", "print", "format", "auth_variable_override", "timeout", "writeSizeLimit", "download"]

    /// Answers one request; nil when it was a stream that has ended (the connection closes).
    private func handle(_ r: HTTPRequest, _ conn: HTTPConnection) -> HTTPResponse? {
        for name in r.query.keys where !Self.plainParameters.contains(name) && !WireQuery.parameterNames.contains(name) {
            return .error(400, "Unknown parameter: \(name)")
        }
        // The namespace: ?ns=NAME, else the first label of NAME.firebaseio.com.
        var nsName = r.query["ns"]
        if nsName == nil, let host = r.headers["host"]?.split(separator: ":").first, host.contains("."), host.contains(where: \.isLetter) {
            nsName = String(host.split(separator: ".")[0])
        }
        guard let nsName else { return .error(400, "no namespace: add ?ns=NAME") }
        guard (1...63).contains(nsName.utf8.count), nsName.utf8.allSatisfy({ $0 == 0x2D || $0 == 0x5F || (0x30...0x39).contains($0) || (0x61...0x7A).contains($0) || (0x41...0x5A).contains($0) }) else {
            return .error(400, "invalid namespace: \(nsName.prefix(80))")
        }
        // Who is asking.
        var token = r.query["auth"]
        if let h = r.headers["authorization"] {
            guard h.hasPrefix("Bearer ") else { return .error(401, "Auth token is expired") }
            token = String(h.dropFirst(7)).trimmingCharacters(in: .whitespaces)
        }
        let caller: Caller
        switch token {
        case nil: caller = .anonymous
        case "owner"?:
            // The owner acting as a user (firebase-admin's databaseAuthVariableOverride): rules apply.
            switch r.query["auth_variable_override"] {
            case nil: caller = .owner
            case "null"?: caller = .anonymous
            default: caller = .user
            }
        case let t? where tokens.withLock({ $0.contains(t) }): caller = .user
        default: return .error(401, "Auth token is expired")
        }
        // The location.
        var keys = r.keys
        guard let last = keys.last, last.hasSuffix(".json") else { return .error(400, "the path must end with .json") }
        keys[keys.count - 1] = String(last.dropLast(5))
        if keys.last == "" { keys.removeLast() }
        if let print = r.query["print"], print != "silent" && print != "pretty" { return .error(400, "print must be silent or pretty") }

        let ns: Namespace
        do { ns = try namespace(nsName) } catch {
            logger.error("cannot open namespace \(nsName): \(error)")
            return .error(503, "the namespace's store cannot be opened")
        }
        if keys.first == ".settings" || keys.first == ".ferry" {
            return special(r, keys, caller, ns)
        }
        do {
            if keys.count > Path.maxDepth { return .error(400, "the path is \(keys.count) keys deep; the limit is \(Path.maxDepth)") }
            for k in keys { try Path.validate(key: k) }
        } catch {
            return .error(400, errorMessage(error) ?? "invalid path")
        }
        switch r.method {
        case "GET":
            if r.headers["accept"]?.contains("text/event-stream") == true { return stream(r, keys, caller, token: token, ns, conn) }
            return get(r, keys, caller, ns)
        case "PUT", "POST", "PATCH", "DELETE":
            return write(r, keys, caller, ns)
        default:
            return .error(405, "Unsupported method: \(r.method.prefix(20))")
        }
    }

    private func namespace(_ name: String) throws -> Namespace {
        try namespaces.withLock { all in
            if let ns = all[name] { return ns }
            var log = logger
            log[metadataKey: "ns"] = "\(name)"
            let ns = try Namespace(name: name, directory: configuration.dataDirectory + "/ns/" + name, logger: log)
            all[name] = ns
            return ns
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
        let (allowed, node) = ns.read { s in (Namespace.mayRead(caller, keys, s.rules), ValueTree.child(s.committed, keys[...])) }
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

    private func stream(_ r: HTTPRequest, _ keys: [String], _ caller: Caller, token: String?, _ ns: Namespace, _ conn: HTTPConnection) -> HTTPResponse? {
        let query: WireQuery?
        do { query = try WireQuery(parameters: r.query) } catch {
            return .error(400, errorMessage(error) ?? "invalid query")
        }
        guard ns.read({ Namespace.mayRead(caller, keys, $0.rules) }) else { return .error(401, "Permission denied") }
        let sink = StreamSink(keys: keys, query: query, caller: caller, token: caller.authenticated ? token : nil)
        guard let id = ns.addStream(sink) else { return .error(503, "the namespace is closing") }
        defer { ns.removeStream(id) }
        let head = "HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nCache-Control: no-cache\r\nX-Ferry-Server-Time: \(now())\r\nTransfer-Encoding: chunked\r\n\r\n"
        guard conn.write(Array(head.utf8)) else { return nil }
        func send(_ e: StreamEvent) -> Bool {
            let bytes = Array(e.encoded.utf8)
            return conn.write(Array(String(bytes.count, radix: 16).utf8) + [13, 10] + bytes + [13, 10])
        }
        connections.withLock { $0.open[conn.fd] = false }  // a stream does not hold up a shutdown
        while true {
            let (events, closed) = sink.next(timeout: .seconds(configuration.keepAliveSeconds))
            if events.isEmpty && !closed {
                guard send(.keepAlive) else { return nil }
                continue
            }
            for e in events { guard send(e) else { return nil } }
            if closed {
                _ = conn.write(Array("0\r\n\r\n".utf8))
                return nil
            }
        }
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

    /// Builds the job for a plain write; a response when the request is bad.
    private func job(_ method: String, _ keys: [String], _ body: [UInt8], caller: Caller, ns: Namespace) -> Result<WriteJob, HTTPResponseError> {
        var job = WriteJob(op: .set(.null), keys: keys, caller: caller, complete: { _ in })
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
                let name = ns.db.root.childByAutoId().key ?? "-"
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

    private func write(_ r: HTTPRequest, _ keys: [String], _ caller: Caller, _ ns: Namespace) -> HTTPResponse {
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
        let outcome = run([job], ns)[0]
        var headers: [(String, String)] = []
        if let etag = outcome.etag { headers.append(("ETag", etag)) }
        if outcome.duplicate { headers.append(("X-Ferry-Duplicate", "true")) }
        if outcome.status == 200 {
            if r.query["print"] == "silent" { return HTTPResponse(status: 204, headers: headers) }
            return .json(200, (r.method == "DELETE" ? Value.null : outcome.body).json, headers: headers)
        }
        if outcome.status == 412 { return .json(412, outcome.body.json, headers: headers) }
        var e = HTTPResponse.error(outcome.status, outcome.error ?? "failed")
        e.headers += headers
        return e
    }

    /// Submits jobs and waits for their outcomes (durable when successful), in order.
    private func run(_ jobs: [WriteJob], _ ns: Namespace) -> [WriteOutcome] {
        let results = Mutex<[Int: WriteOutcome]>([:])
        let group = DispatchGroup()
        var submitted = jobs
        for i in submitted.indices {
            group.enter()
            submitted[i].complete = { o in
                results.withLock { $0[i] = o }
                group.leave()
            }
        }
        ns.submit(submitted)
        group.wait()
        return results.withLock { r in jobs.indices.map { r[$0]! } }
    }

    // MARK: .settings and .ferry

    private func special(_ r: HTTPRequest, _ keys: [String], _ caller: Caller, _ ns: Namespace) -> HTTPResponse {
        switch (r.method, keys) {
        case ("GET", [".settings", "rules"]):
            guard case .owner = caller else { return .error(401, "Permission denied") }
            let tree = ns.read { $0.rules.tree }
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
            let outcome = run([WriteJob(op: .rules(rules, text: value.json), keys: [], caller: caller, complete: { _ in })], ns)[0]
            return outcome.status == 200 ? .json(200, #"{"status":"ok"}"#) : .error(outcome.status, outcome.error ?? "failed")
        case ("GET", [".ferry", "info"]):
            return .json(200, Value.object([
                "server": "ferry-server", "protocol": 1, "idempotent": true, "batch": true,
                "maxBatchWrites": .int(Int64(configuration.maxBatchWrites)), "maxBatchBytes": .int(Int64(configuration.maxBody)),
            ]).json)
        case ("POST", [".ferry", "batch"]):
            return batch(r, caller, ns)
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
            tokens.withLock { $0 = list }
            // Streams whose token is no longer accepted: auth_revoked, then closed.
            for (_, ns) in namespaces.withLock({ $0 }) { ns.revokeStreams { token in !list.contains(token) } }
            return .json(200, v.json)
        default:
            return .error(400, "Invalid path: \(r.rawPath.prefix(100)) (keys may not contain . $ # [ ] /)")
        }
    }

    private func batch(_ r: HTTPRequest, _ caller: Caller, _ ns: Namespace) -> HTTPResponse {
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
            let body = Array(w.data.json.utf8)
            switch self.job(w.op == .set ? "PUT" : "PATCH", keys, body, caller: caller, ns: ns) {
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
            jobs.append(job)
        }
        let outcomes = run(jobs, ns)
        let results = zip(request.writes, outcomes).map { w, o in
            BatchResult(id: w.id, status: o.status, error: o.status == 200 ? nil : o.error, duplicate: o.duplicate).value
        }
        return .json(200, Value.object(["results": .array(results)]).json)
    }
}

/// The client-facing message of an error from Ferry or FerryWire.
func errorMessage(_ error: any Error) -> String? {
    if let e = error as? WireError { return e.message }
    if let e = error as? DatabaseError { return e.message }
    return nil
}
