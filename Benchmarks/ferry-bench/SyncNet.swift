#if canImport(Glibc)
import Glibc
#endif
import Foundation
import Synchronization

// Plain sockets for `ferry-bench sync`: the server child process, a byte-counting proxy, raw
// streaming listeners and one-shot HTTP requests. Blocking calls on their own threads, so that
// what is measured is the server and the sync client, not a second HTTP stack.

struct BenchNetError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// Monotonic nanoseconds (CLOCK_MONOTONIC: the same clock in every process of this machine).
func monotonicNanos() -> Int64 {
    var ts = timespec()
    clock_gettime(CLOCK_MONOTONIC, &ts)
    return Int64(ts.tv_sec) * 1_000_000_000 + Int64(ts.tv_nsec)
}

/// `ferry-server` as a child process on a free loopback port, found next to this executable.
final class ServerChild: @unchecked Sendable {
    let process = Process()
    let port: Int
    let data: String
    /// Firestore's gRPC port, when started with `firestore: true`.
    private(set) var firestorePort: Int?

    init(data: String, firestore: Bool = false, _ extra: [String] = []) throws {
        self.data = data
        let exe = URL(fileURLWithPath: "/proc/self/exe").resolvingSymlinksInPath()
        let server = exe.deletingLastPathComponent().appendingPathComponent("ferry-server")
        guard FileManager.default.isExecutableFile(atPath: server.path) else {
            throw BenchNetError("ferry-server is not next to ferry-bench (\(server.path)): build it (swift build -c release --product ferry-server)")
        }
        process.executableURL = server
        process.arguments = ["--port", "0", "--data", data] + (firestore ? ["--firestore-port", "0"] : []) + extra
        let out = Pipe()
        process.standardOutput = out
        process.standardError = FileHandle.nullDevice
        try process.run()
        // Reads stdout until the "listening on HOST:PORT" line.
        var line = [UInt8]()
        let fd = out.fileHandleForReading.fileDescriptor
        var byte: UInt8 = 0
        while read(fd, &byte, 1) == 1 {
            if byte == 10 {
                let s = String(decoding: line, as: UTF8.self)
                if s.hasPrefix("firestore listening on ") { firestorePort = Int(s.split(separator: ":").last ?? "") }
                if s.hasPrefix("listening on "), let p = Int(s.split(separator: ":").last ?? "") {
                    port = p
                    return
                }
                line = []
            } else {
                line.append(byte)
            }
        }
        process.terminate()
        throw BenchNetError("ferry-server did not start (no \"listening on\" line)")
    }

    /// SIGTERM, then waits for the exit; SIGKILL after 10 s (a SIGTERM that arrives while the
    /// server installs its handlers is lost).
    func stop() {
        guard process.isRunning else { return }
        kill(process.processIdentifier, SIGTERM)
        for _ in 0..<1000 where process.isRunning { usleep(10_000) }
        if process.isRunning {
            FileHandle.standardError.write(Data("ferry-bench: ferry-server ignored SIGTERM for 10 s; killed\n".utf8))
            kill(process.processIdentifier, SIGKILL)
        }
        process.waitUntilExit()
    }

    deinit { if process.isRunning { kill(process.processIdentifier, SIGKILL) } }
}

func connectLoopback(_ port: Int) throws -> Int32 {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw BenchNetError("socket: errno \(errno)") }
    var one: Int32 = 1
    setsockopt(fd, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
    var addr = sockaddr_in()
    addr.sin_family = sa_family_t(AF_INET)
    addr.sin_port = in_port_t(UInt16(port).bigEndian)
    addr.sin_addr.s_addr = inet_addr("127.0.0.1")
    let r = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
    guard r == 0 else { close(fd); throw BenchNetError("connect to 127.0.0.1:\(port): errno \(errno)") }
    return fd
}

func sendAll(_ fd: Int32, _ bytes: [UInt8]) -> Bool {
    var off = 0
    while off < bytes.count {
        let n = bytes[off...].withUnsafeBytes { send(fd, $0.baseAddress, $0.count, Int32(MSG_NOSIGNAL)) }
        if n <= 0 { return false }
        off += n
    }
    return true
}

/// One request on its own connection (`Connection: close`), as the owner; the status and body.
func rawRequest(_ port: Int, _ method: String, _ target: String, body: [UInt8] = []) throws -> (status: Int, body: String) {
    let fd = try connectLoopback(port)
    defer { close(fd) }
    let head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\nAuthorization: Bearer owner\r\nConnection: close\r\nContent-Length: \(body.count)\r\n\r\n"
    guard sendAll(fd, Array(head.utf8) + body) else { throw BenchNetError("\(method) \(target): send failed") }
    var answer = [UInt8]()
    var buf = [UInt8](repeating: 0, count: 65536)
    while true {
        let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        if n <= 0 { break }
        answer += buf[0..<n]
    }
    let text = String(decoding: answer, as: UTF8.self)
    guard let status = Int(text.split(separator: " ").dropFirst().first ?? "") else {
        throw BenchNetError("\(method) \(target): no HTTP answer")
    }
    let body = text.range(of: "\r\n\r\n").map { String(text[$0.upperBound...]) } ?? ""
    return (status, body)
}

/// A TCP proxy on a free loopback port in front of `target`, counting the bytes the server
/// sends to clients (everything it sends: heads, chunk framing and event data).
final class CountingProxy: @unchecked Sendable {
    let port: Int
    private let listener: Int32
    private let serverPort: Int
    private let counted = Atomic<Int>(0)
    private let sockets = Mutex<[Int32]>([])

    init(to serverPort: Int) throws {
        self.serverPort = serverPort
        listener = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        var one: Int32 = 1
        setsockopt(listener, SOL_SOCKET, SO_REUSEADDR, &one, socklen_t(MemoryLayout<Int32>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = 0
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let fd = listener
        guard withUnsafePointer(to: &addr, { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }) == 0,
              listen(fd, 128) == 0 else { throw BenchNetError("proxy: cannot listen (errno \(errno))") }
        var len = socklen_t(MemoryLayout<sockaddr_in>.size)
        _ = withUnsafeMutablePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { getsockname(fd, $0, &len) } }
        port = Int(UInt16(bigEndian: addr.sin_port))
        Thread.detachNewThread { [self] in acceptLoop() }
    }

    /// Bytes the server sent through the proxy since the last reset.
    var serverBytes: Int { counted.load(ordering: .acquiring) }
    func reset() { counted.store(0, ordering: .releasing) }

    private func acceptLoop() {
        while true {
            let c = accept(listener, nil, nil)
            if c < 0 { return }
            // (Both sides without Nagle's delay: the proxy's writes to the client must not wait
            // for the client's delayed acknowledgement, which the server's own socket never does.)
            var one: Int32 = 1
            setsockopt(c, Int32(IPPROTO_TCP), TCP_NODELAY, &one, socklen_t(MemoryLayout<Int32>.size))
            guard let s = try? connectLoopback(serverPort) else { close(c); continue }
            sockets.withLock { $0 += [c, s] }
            Thread.detachNewThread { [self] in pump(from: c, to: s, count: false) }
            Thread.detachNewThread { [self] in pump(from: s, to: c, count: true) }
        }
    }

    private func pump(from: Int32, to: Int32, count: Bool) {
        var buf = [UInt8](repeating: 0, count: 1 << 16)
        while true {
            let n = buf.withUnsafeMutableBytes { recv(from, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            if count { counted.add(n, ordering: .relaxed) }
            guard sendAll(to, Array(buf[0..<n])) else { break }
        }
        shutdown(to, Int32(SHUT_WR))
        shutdown(from, Int32(SHUT_RD))
    }

    /// Stops accepting and cuts every proxied connection.
    func stop() {
        shutdown(listener, Int32(SHUT_RDWR))
        close(listener)
        for fd in sockets.withLock({ $0 }) { shutdown(fd, Int32(SHUT_RDWR)) }
    }
}

final class LatencyBox: Sendable { let m = Mutex<[Int64]>([]) }

/// Raw streaming listeners: each a thread holding `GET … Accept: text/event-stream` on its own
/// connection, which records, for every event whose data holds `"t":NANOS`, the delay from
/// NANOS (the writer's monotonic clock at the write) to the event's arrival.
final class RawListeners: @unchecked Sendable {
    private var fds: [Int32] = []
    /// Events carrying a timestamp, received by all listeners together.
    let received = Atomic<Int>(0)
    /// Listeners whose first event (the initial value) has arrived.
    let ready = Atomic<Int>(0)
    /// One array per listener: a shared one would have 100 threads fight over its lock (a
    /// contended lock spins, taking the CPU from the server being measured).
    private var latencies: [LatencyBox] = []
    private let lastArrival = Atomic<Int64>(0)
    private let recording = Atomic<Bool>(false)
    private let finished = DispatchGroup()

    init(count: Int, port: Int, target: String) throws {
        latencies = (0..<count).map { _ in LatencyBox() }
        for k in 0..<count {
            let fd = try connectLoopback(port)
            let head = "GET \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\nAccept: text/event-stream\r\nAuthorization: Bearer owner\r\n\r\n"
            guard sendAll(fd, Array(head.utf8)) else { throw BenchNetError("listener: send failed") }
            fds.append(fd)
            finished.enter()
            Thread.detachNewThread { [self] in read(fd, latencies[k]) }
        }
    }

    /// Whether arrivals are recorded (latencies and the last arrival time).
    func record(_ on: Bool) { recording.store(on, ordering: .releasing) }

    /// The latencies recorded so far (nanoseconds), emptied.
    func takeLatencies() -> [Int64] { latencies.flatMap { $0.m.withLock { l in defer { l = [] }; return l } } }
    var lastArrivalNanos: Int64 { lastArrival.load(ordering: .acquiring) }

    private func read(_ fd: Int32, _ box: LatencyBox) {
        defer { finished.leave() }
        var buf = [UInt8](repeating: 0, count: 1 << 16)
        var pending = [UInt8]()
        var local: [Int64] = []
        var first = true
        func flush() {
            if !local.isEmpty { let l = local; box.m.withLock { $0 += l }; local = [] }
        }
        while true {
            let n = buf.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            let now = monotonicNanos()
            pending += buf[0..<n]
            // Whole lines only; a `data:` line is one event's JSON.
            var start = 0
            var got = 0
            var i = 0
            while i < pending.count {
                if pending[i] == 10 {
                    if i - start > 6, pending[start] == UInt8(ascii: "d"), pending[start + 1] == UInt8(ascii: "a"), pending[start + 4] == UInt8(ascii: ":") {
                        if first {
                            first = false
                            ready.add(1, ordering: .releasing)
                        } else if let t = Self.timestamp(pending, start, i) {
                            got += 1
                            if recording.load(ordering: .relaxed) { local.append(now - t) }
                        }
                    }
                    start = i + 1
                }
                i += 1
            }
            pending.removeFirst(start)
            if got > 0 {
                if recording.load(ordering: .relaxed) { lastArrival.store(now, ordering: .relaxed) }
                flush()
                received.add(got, ordering: .releasing)
            }
        }
        flush()
    }

    /// The number after `"t":` in bytes[from..<to].
    private static func timestamp(_ b: [UInt8], _ from: Int, _ to: Int) -> Int64? {
        var i = from
        while i + 4 < to {
            if b[i] == UInt8(ascii: "\""), b[i + 1] == UInt8(ascii: "t"), b[i + 2] == UInt8(ascii: "\""), b[i + 3] == UInt8(ascii: ":") {
                var j = i + 4, v: Int64 = 0, digits = 0
                while j < to, b[j] >= 48, b[j] <= 57 { v = v * 10 + Int64(b[j] - 48); j += 1; digits += 1 }
                return digits > 0 ? v : nil
            }
            i += 1
        }
        return nil
    }

    /// Cuts the connections and waits for the reader threads.
    func stop() {
        for fd in fds { shutdown(fd, Int32(SHUT_RDWR)) }
        finished.wait()
        for fd in fds { close(fd) }
    }
}

/// Listeners on several servers, counted as one.
final class RawListenerGroup: Sendable {
    let groups: [RawListeners]
    init(_ groups: [RawListeners]) { self.groups = groups }
    var received: Int { groups.reduce(0) { $0 + $1.received.load(ordering: .acquiring) } }
    var ready: Int { groups.reduce(0) { $0 + $1.ready.load(ordering: .acquiring) } }
    var lastArrivalNanos: Int64 { groups.map(\.lastArrivalNanos).max() ?? 0 }
    func record(_ on: Bool) { for g in groups { g.record(on) } }
    func takeLatencies() -> [Int64] { groups.flatMap { $0.takeLatencies() } }
    func stop() { for g in groups { g.stop() } }
}
