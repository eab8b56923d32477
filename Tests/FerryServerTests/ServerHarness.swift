import FerryLog
import Foundation
import Synchronization
import FerryTestSupport
import FerryWire
import Ferry
#if canImport(Glibc)
import Glibc
#endif

/// A `ferry-server` child process on a free loopback port.
final class ServerProcess: Sendable {
    let process: ChildProcess
    let port: Int
    let data: String

    init(data: String, port: Int = 0, _ extra: [String] = []) throws {
        self.data = data
        process = try ChildProcess(Locations.executable("ferry-server"),
                                   ["--port", String(port), "--data", data, "--keep-alive", "1", "--request-timeout", "2"] + extra
                                   + (ServerMode.current.secure?.serverArguments ?? [])
                                   + (ServerBackend.postgres.map { ["--postgres", $0] } ?? []))
        guard process.waitForLine({ $0.hasPrefix("listening on ") }),
              let line = process.outputLines.first(where: { $0.hasPrefix("listening on ") }),
              let port = Int(line.split(separator: ":").last ?? "") else {
            process.kill9()
            throw HTTPTestError(message: "ferry-server did not start")
        }
        self.port = port
        // With --firestore-port, its line comes before "listening on".
        firestorePort = process.outputLines.first(where: { $0.hasPrefix("firestore listening on ") })
            .flatMap { Int($0.split(separator: ":").last ?? "") }
    }

    /// The port of Cloud Firestore's gRPC API, when started with `--firestore-port`.
    let firestorePort: Int?

    private let ended = FerryMutex(false)

    /// SIGTERM, then the exit status.
    func terminate() -> Int32 {
        kill(process.pid, SIGTERM)
        let status = process.wait()
        ended.withLock { $0 = true }
        return status
    }

    func kill9() {
        process.kill9()
        ended.withLock { $0 = true }
    }

    /// A test that failed half-way leaves no server behind (it would hold the test's output open).
    deinit {
        if !ended.withLock({ $0 }) { process.kill9() }
    }
}

struct HTTPTestError: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}

/// A response as the test client read it.
struct TestResponse: Sendable {
    var status: Int
    var headers: [String: String]  // lowercase names
    var body: [UInt8]
    var text: String { String(decoding: body, as: UTF8.self) }
    var json: Value? { try? Value(jsonBytes: body) }
}

/// A tiny blocking HTTP/1.1 client over a socket: one request per connection, read to the end.
enum TestHTTP {
    /// A socket listening on a free loopback port: its descriptor and the port.
    static func listenOnLoopback() throws -> (Int32, Int) {
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(fd, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = 0
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        let bound = withUnsafeMutablePointer(to: &addr) { p in
            p.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, len) == 0 && getsockname(fd, $0, &len) == 0 }
        }
        guard bound, listen(fd, 64) == 0 else {
            close(fd)
            throw HTTPTestError(message: "cannot listen")
        }
        return (fd, Int(UInt16(bigEndian: addr.sin_port)))
    }

    static func connect(_ port: Int) throws -> Int32 {
        guard let fd = LoopbackHTTP.connect(port) else { throw HTTPTestError(message: "cannot connect to port \(port)") }
        return fd
    }

    static func send(_ fd: Int32, _ bytes: [UInt8]) { LoopbackHTTP.send(fd, bytes) }

    /// Reads until the server closes (or 20 s pass).
    static func readAll(_ fd: Int32) -> [UInt8] {
        var out: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return out }
            out += chunk[0..<n]
        }
    }

    static func parse(_ raw: [UInt8]) throws -> TestResponse {
        guard let h = LoopbackHTTP.head(raw) else {
            throw HTTPTestError(message: "no complete response: \(String(decoding: raw, as: UTF8.self))")
        }
        return TestResponse(status: h.status, headers: h.headers, body: Array(raw[h.bodyStart...]))
    }

    /// One request; `path` includes the query (`/a.json?ns=t`).
    static func request(_ port: Int, _ method: String, _ path: String, headers: [String: String] = [:], body: [UInt8]? = nil) throws -> TestResponse {
        if let secure = ServerMode.current.secure { return try secure.request(port, method, path, headers: headers, body: body) }
        let fd = try connect(port)
        defer { close(fd) }
        var head = "\(method) \(path) HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n"
        for (k, v) in headers { head += "\(k): \(v)\r\n" }
        if let body { head += "Content-Length: \(body.count)\r\n" }
        head += "\r\n"
        send(fd, Array(head.utf8) + (body ?? []))
        return try parse(readAll(fd))
    }

    static func request(_ port: Int, _ method: String, _ path: String, headers: [String: String] = [:], json: String) throws -> TestResponse {
        try request(port, method, path, headers: headers, body: Array(json.utf8))
    }
}

/// A scripted HTTP server on loopback, for what `ferry-server` never does: a skewed clock, garbage
/// answers. Each request (read up to its body) is answered with the raw bytes `answer` returns
/// for its request line, then the connection closes.
final class ScriptedServer: @unchecked Sendable {
    let port: Int
    private let fd: Int32
    private final class Lines: Sendable { let list = FerryMutex<[String]>([]) }
    private let requestLines = Lines()
    private let heldConnections = Lines()
    private let stopped = FerryMutex(false)

    var requests: [String] { requestLines.list.withLock { $0 } }

    /// `holdOpen`: requests (by request line) whose connection stays open after the answer,
    /// sending nothing more (a server gone silent), until the server stops.
    init(holdOpen: @escaping @Sendable (String) -> Bool = { _ in false }, answer: @escaping @Sendable (String) -> [UInt8]) throws {
        (fd, port) = try TestHTTP.listenOnLoopback()
        let listener = fd
        let lines = requestLines
        let held = heldConnections
        let thread = Thread {
            while true {
                let c = accept(listener, nil, nil)
                if c < 0 { return }
                var raw: [UInt8] = []
                var chunk = [UInt8](repeating: 0, count: 65536)
                var headEnd: Int?
                var need = Int.max
                while raw.count < need {
                    let n = chunk.withUnsafeMutableBytes { recv(c, $0.baseAddress, $0.count, 0) }
                    if n <= 0 { break }
                    raw += chunk[0..<n]
                    if headEnd == nil, let e = raw.indices.dropLast(3).first(where: { raw[$0] == 13 && raw[$0 + 1] == 10 && raw[$0 + 2] == 13 && raw[$0 + 3] == 10 }) {
                        headEnd = e + 4
                        let head = String(decoding: raw[..<e], as: UTF8.self).lowercased()
                        let length = head.components(separatedBy: "\r\n").first { $0.hasPrefix("content-length:") }
                            .flatMap { Int($0.dropFirst("content-length:".count).trimmingCharacters(in: .whitespaces)) } ?? 0
                        need = e + 4 + length
                    }
                }
                let line = String(decoding: raw.prefix { $0 != 13 }, as: UTF8.self)
                lines.list.withLock { $0.append(line) }
                TestHTTP.send(c, answer(line))
                if holdOpen(line) { held.list.withLock { $0.append(String(c)) } } else { close(c) }
            }
        }
        thread.start()
    }

    /// Sends `bytes` on every connection held open (a stream's later events).
    func push(_ bytes: [UInt8]) {
        for c in heldConnections.list.withLock({ $0 }) { TestHTTP.send(Int32(c)!, bytes) }
    }

    func stop() {
        guard !stopped.withLock({ let was = $0; $0 = true; return was }) else { return }
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
        for c in heldConnections.list.withLock({ $0 }) { close(Int32(c)!) }
    }

    deinit { stop() }

    /// An HTTP/1.1 answer with a JSON body.
    /// A `put` event of a stream: `data` (JSON text) at `path`, relative to the listen.
    static func put(_ path: String, _ data: String, id: Int? = nil) -> [UInt8] {
        Array("\(id.map { "id: \($0)\n" } ?? "")event: put\ndata: {\"path\": \"\(path)\", \"data\": \(data)}\n\n".utf8)
    }

    /// The answer opening a stream (to hold open), with its first `put` at `/` when given.
    static func stream(firstPut data: String? = nil) -> [UInt8] {
        Array("HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\n\r\n".utf8) + (data.map { put("/", $0) } ?? [])
    }

    static func http(_ status: Int, _ body: String, headers: [String: String] = [:]) -> [UInt8] {
        var head = "HTTP/1.1 \(status) X\r\nContent-Type: application/json\r\nContent-Length: \(body.utf8.count)\r\nConnection: close\r\n"
        for (k, v) in headers { head += "\(k): \(v)\r\n" }
        return Array((head + "\r\n" + body).utf8)
    }
}

/// A TCP proxy on loopback in front of a server, whose connections a test can cut (a network
/// that drops a connection while both ends live on). Notes every request's head and its
/// answer's head (lowercase, up to the blank line), in order per connection.
final class CuttingProxy: @unchecked Sendable {
    let port: Int
    private let fd: Int32
    private struct Connection {
        var client: Int32
        var upstream: Int32
        var requests: [String] = []
        var answers: [String] = []
        /// Directions still forwarding; at 0 both descriptors are closed.
        var pumping = 2
        var closed = false
    }
    private let connections = FerryMutex<[Int: Connection]>([:])
    private let cutIDs = FerryMutex<Set<Int>>([])
    private let nextID = FerryMutex(0)

    /// Every request so far with its answer's head ("" while none came), by connection.
    var exchanges: [(request: String, answer: String)] {
        connections.withLock { all in
            all.keys.sorted().flatMap { k in
                all[k]!.requests.enumerated().map { i, r in (r, i < all[k]!.answers.count ? all[k]!.answers[i] : "") }
            }
        }
    }

    /// The exchanges that opened event streams.
    var streams: [(request: String, answer: String)] { exchanges.filter { $0.request.contains("accept: text/event-stream") } }

    /// Whether a stream asked to resume after commit `after` and was resumed through `through`.
    func resumedStream(after: Int, through: Int) -> Bool {
        streams.contains { $0.request.contains("last-event-id: \(after)\r\n") && $0.answer.contains("\(WireHeader.resumedThrough): \(through)") }
    }

    /// Where new connections go.
    private let upstreamPort: FerryMutex<Int>

    /// New connections go to `port` from now on (another server of the same data).
    func retarget(to port: Int) { upstreamPort.withLock { $0 = port } }

    init(to upstreamPort: Int) throws {
        (fd, port) = try TestHTTP.listenOnLoopback()
        self.upstreamPort = FerryMutex(upstreamPort)
        Thread { [self] in
            while true {
                let c = accept(fd, nil, nil)
                if c < 0 {
                    // A signal (a child process ending) interrupts accept: go on.
                    if errno == EINTR || errno == ECONNABORTED { continue }
                    return
                }
                guard let u = try? TestHTTP.connect(self.upstreamPort.withLock({ $0 })) else { close(c); continue }
                var none = timeval(tv_sec: 0, tv_usec: 0)
                setsockopt(u, SOL_SOCKET, SO_RCVTIMEO, &none, socklen_t(MemoryLayout<timeval>.size))
                let id = nextID.withLock { n in defer { n += 1 }; return n }
                connections.withLock { $0[id] = Connection(client: c, upstream: u) }
                Thread {
                    self.pump(from: c, to: u) { h in self.connections.withLock { $0[id]?.requests.append(h) } }
                    self.cutIDs.withLock { _ = $0.insert(id) }  // (ended: nothing to cut)
                    self.finished(id)
                }.start()
                Thread {
                    self.pump(from: u, to: c) { h in self.connections.withLock { $0[id]?.answers.append(h) } }
                    self.finished(id)
                }.start()
            }
        }.start()
    }

    /// Forwards bytes, noting each message's head: after a head, a body of its
    /// `content-length` is skipped; a chunked body (an event stream) ends the noting.
    private func pump(from a: Int32, to b: Int32, head: @escaping (String) -> Void) {
        var chunk = [UInt8](repeating: 0, count: 65536)
        var pending: [UInt8] = []
        var skip = 0
        var noting = true
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(a, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            TestHTTP.send(b, Array(chunk[0..<n]))
            guard noting else { continue }
            pending += chunk[0..<n]
            while noting {
                if skip > 0 {
                    let k = min(skip, pending.count)
                    pending.removeFirst(k)
                    skip -= k
                    if skip > 0 { break }
                }
                guard let end = pending.indices.dropLast(3).first(where: { pending[$0] == 13 && pending[$0 + 1] == 10 && pending[$0 + 2] == 13 && pending[$0 + 3] == 10 }) else { break }
                let text = String(decoding: pending[..<end], as: UTF8.self).lowercased()
                pending.removeFirst(end + 4)
                head(text)
                let lines = text.components(separatedBy: "\r\n")
                if lines.contains(where: { $0.hasPrefix("transfer-encoding:") && $0.contains("chunked") }) { noting = false }
                skip = lines.first { $0.hasPrefix("content-length:") }.flatMap { Int($0.dropFirst(15).trimmingCharacters(in: .whitespaces)) } ?? 0
            }
        }
        shutdown(b, Int32(SHUT_RDWR))
        shutdown(a, Int32(SHUT_RDWR))
    }

    /// One direction of a connection stopped forwarding; after both, its descriptors are
    /// closed (under the lock a cut shuts them with, so a cut never reaches a number reused
    /// by then — and the test process does not run out of low descriptor numbers, past which
    /// `select`-style code corrupts memory).
    private func finished(_ id: Int) {
        connections.withLock { all in
            guard var c = all[id] else { return }
            c.pumping -= 1
            if c.pumping == 0 && !c.closed {
                c.closed = true
                close(c.client)
                close(c.upstream)
            }
            all[id] = c
        }
    }

    /// Cuts every open connection whose last request satisfies `matching` (with `answered`,
    /// only those whose answer has begun); returns how many it cut.
    @discardableResult
    func cut(answered: Bool = false, _ matching: (String) -> Bool) -> Int {
        connections.withLock { all in
            let picked = all.filter { k, c in
                !c.closed && !cutIDs.withLock { $0.contains(k) } && c.requests.last.map(matching) == true && (!answered || !c.answers.isEmpty)
            }
            cutIDs.withLock { $0.formUnion(picked.keys) }
            for (_, c) in picked {
                shutdown(c.client, Int32(SHUT_RDWR))
                shutdown(c.upstream, Int32(SHUT_RDWR))
            }
            return picked.count
        }
    }

    /// Connections open, not cut, and with a request head seen (what ``cut(answered:_:)`` can
    /// cut: an HTTP/2 connection's is its preface).
    var live: Int {
        connections.withLock { all in all.filter { k, c in !c.closed && !c.requests.isEmpty && !cutIDs.withLock { $0.contains(k) } }.count }
    }

    private let stopped = FerryMutex(false)

    /// Stops accepting and cuts every connection (their forwarding threads then close them).
    func stop() {
        guard !stopped.withLock({ let was = $0; $0 = true; return was }) else { return }
        shutdown(fd, Int32(SHUT_RDWR))
        close(fd)
        _ = cut { _ in true }
    }

    deinit { stop() }
}
