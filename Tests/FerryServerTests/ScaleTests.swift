import FerryLog
import Ferry
import FerryTestSupport
import FerryWire
import Foundation
import Synchronization
import Testing
#if canImport(Glibc)
import Glibc
#endif

/// `ferry-server` under many connections: thousands of idle streams, many writers at once,
/// clients that do not read, and more connections than it may hold.
@Suite struct ScaleTests {
    /// Lets this process hold thousands of sockets (the soft limit is often 1,024).
    static func raiseFileLimit(to wanted: rlim_t) throws {
        var limit = rlimit()
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        if limit.rlim_cur < wanted {
            limit.rlim_cur = min(wanted, limit.rlim_max)
            setrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        }
        getrlimit(__rlimit_resource_t(RLIMIT_NOFILE.rawValue), &limit)
        guard limit.rlim_cur >= wanted else { throw HTTPTestError(message: "cannot open \(wanted) files (hard limit \(limit.rlim_max))") }
    }

    @Test func twoThousandIdleStreamsEachGetEveryWriteWhileWritesAreAnswered() throws {
        let count = 2_000
        try Self.raiseFileLimit(to: rlim_t(count + 200))
        let dir = try TemporaryDirectory("server-streams")
        // Keep-alives every 30 s: the streams stay silent unless something is written.
        let server = try ServerProcess(data: dir.path, ["--keep-alive", "30"])
        let p = server.port
        #expect(try TestHTTP.request(p, "PUT", "/room.json?ns=t", json: #"{"start": 0}"#).status == 200)
        var streams: [StreamReader] = []
        for _ in 0..<count { streams.append(try StreamReader(port: p, path: "/room.json?ns=t")) }
        for s in streams { #expect(try s.next(skippingKeepAlive: true) == .put("/", ["start": 0])) }
        // Writes are answered while the streams are held open, each durable before its answer.
        for k in 0..<5 {
            #expect(try TestHTTP.request(p, "PUT", "/room/k\(k).json?ns=t", json: "\(k)").status == 200)
        }
        #expect(try TestHTTP.request(p, "GET", "/room.json?ns=t").json == ["start": 0, "k0": 0, "k1": 1, "k2": 2, "k3": 3, "k4": 4])
        var complete = 0
        for s in streams {
            var got: [StreamEvent] = []
            for _ in 0..<5 { got.append(try s.next(skippingKeepAlive: true)) }
            if got == (0..<5).map({ StreamEvent.put("/k\($0)", .int(Int64($0))) }) { complete += 1 }
        }
        #expect(complete == count)
        streams = []
        #expect(server.terminate() == 0)
    }

    @Test func fiftyClientsWritingAtOnceLoseNoAcknowledgedWriteToKill9() throws {
        try Self.raiseFileLimit(to: 1_000)
        let dir = try TemporaryDirectory("server-fifty")
        var server = try ServerProcess(data: dir.path)
        let port = server.port
        let acknowledged = FerryMutex<[Int]>([])
        let stop = Atomic(false)
        let clients = DispatchGroup()
        for client in 0..<50 {
            clients.enter()
            Thread.detachNewThread {
                defer { clients.leave() }
                for i in 0..<10_000 where !stop.load(ordering: .relaxed) {
                    let n = client * 10_000 + i
                    guard let r = try? TestHTTP.request(port, "PUT", "/items/k\(n).json?ns=t&print=silent", json: "\(n)"), r.status == 204 else { return }
                    acknowledged.withLock { $0.append(n) }
                }
            }
        }
        // Kill the server mid-stream, once a good number of writes have been acknowledged.
        let started = eventuallyOnThisThread(timeout: .seconds(120)) { acknowledged.withLock { $0.count } >= 1_000 }
        server.kill9()
        stop.store(true, ordering: .relaxed)
        clients.wait()
        try #require(started, "1,000 writes acknowledged before the kill (\(acknowledged.withLock { $0.count }))")
        let acked = acknowledged.withLock { $0 }
        #expect(Set(acked.map { $0 / 10_000 }).count == 50)  // every client had writes answered
        server = try ServerProcess(data: dir.path)
        guard case .object(let items)? = try TestHTTP.request(server.port, "GET", "/items.json?ns=t").json else {
            Issue.record("no items after restart")
            return
        }
        let lost = acked.filter { items["k\($0)"] != .int(Int64($0)) }
        #expect(lost.isEmpty, "\(lost.count) of \(acked.count) acknowledged writes lost")
        #expect(server.terminate() == 0)
    }

    @Test func aStreamWhoseClientDoesNotReadIsClosedAndTheServerGoesOn() throws {
        let dir = try TemporaryDirectory("server-slow")
        let server = try ServerProcess(data: dir.path, ["--max-stream-buffer", "65536", "--keep-alive", "30"])
        let p = server.port
        // A small receive buffer, set before connecting (the window is agreed then).
        let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
        defer { close(fd) }
        var small: Int32 = 4096
        setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &small, socklen_t(MemoryLayout<Int32>.size))
        var tv = timeval(tv_sec: 20, tv_usec: 0)
        setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, socklen_t(MemoryLayout<timeval>.size))
        var addr = sockaddr_in()
        addr.sin_family = sa_family_t(AF_INET)
        addr.sin_port = in_port_t(UInt16(p).bigEndian)
        addr.sin_addr.s_addr = inet_addr("127.0.0.1")
        let connected = withUnsafePointer(to: &addr) { $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { Glibc.connect(fd, $0, socklen_t(MemoryLayout<sockaddr_in>.size)) } }
        try #require(connected == 0)
        TestHTTP.send(fd, Array("GET /big.json?ns=t HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\r\n".utf8))
        // 100 writes of 100 KB: 10 MB of events for a client that reads none of them.
        let value = "\"" + String(repeating: "x", count: 100_000) + "\""
        for i in 0..<100 {
            #expect(try TestHTTP.request(p, "PUT", "/big/k\(i).json?ns=t&print=silent", json: value).status == 204)
        }
        // The client reads at last: the stream was closed part-way, not kept growing in the server.
        var received = 0
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { break }
            received += n
        }
        #expect(received > 0 && received < 100 * 100_000)
        #expect(try TestHTTP.request(p, "GET", "/big.json?ns=t&shallow=true").json.map { v -> Int in
            if case .object(let o) = v { return o.count } else { return 0 }
        } == 100)
        #expect(server.terminate() == 0)
    }

    @Test func aConnectionBeyondTheLimitIsRefusedClearlyAndTheOthersAreServed() throws {
        let dir = try TemporaryDirectory("server-limit")
        let server = try ServerProcess(data: dir.path, ["--max-connections", "8", "--keep-alive", "30"])
        let p = server.port
        // The streams are the first connections (a closed one counts until the server has seen it close).
        var streams: [StreamReader] = []
        for _ in 0..<8 { streams.append(try StreamReader(port: p, path: "/a.json?ns=t")) }
        for s in streams { #expect(try s.next() == .put("/", .null)) }
        let refused = try TestHTTP.request(p, "GET", "/a.json?ns=t")
        #expect(refused.status == 503)
        guard case .object(let o)? = refused.json, case .string(let message)? = o["error"] else {
            Issue.record("no {\"error\": …} in \(refused.text)")
            return
        }
        #expect(message.contains("8 connections"))
        // One stream ends: its place is free again (once the server has seen it close).
        streams.removeLast()
        #expect(eventuallyOnThisThread { (try? TestHTTP.request(p, "GET", "/a.json?ns=t"))?.status == 200 }, "a connection is served again")
        // The streams held all along still get the writes.
        streams.removeLast()
        #expect(eventuallyOnThisThread { (try? TestHTTP.request(p, "PUT", "/a.json?ns=t", json: "2"))?.status == 200 }, "the write is taken")
        for s in streams { #expect(try s.next(skippingKeepAlive: true) == .put("/", 2)) }
        #expect(server.terminate() == 0)
    }

    /// Splits `raw` into responses framed by Content-Length (1xx ones have no body).
    static func responses(_ raw: [UInt8]) throws -> [TestResponse] {
        var out: [TestResponse] = []
        var rest = raw[...]
        while !rest.isEmpty {
            let r = try TestHTTP.parse(Array(rest))
            let headEnd = rest.count - r.body.count
            let length = r.status < 200 ? 0 : Int(r.headers["content-length"] ?? "0") ?? 0
            out.append(TestResponse(status: r.status, headers: r.headers, body: Array(r.body.prefix(length))))
            rest = rest.dropFirst(headEnd + length)
        }
        return out
    }

    @Test func requestsPipelinedOnOneKeptAliveConnectionAreAnsweredInOrder() throws {
        let dir = try TemporaryDirectory("server-pipeline")
        let server = try ServerProcess(data: dir.path)
        let fd = try TestHTTP.connect(server.port)
        defer { close(fd) }
        // A request waiting for 100 Continue gets it before it sends its body.
        TestHTTP.send(fd, Array("PUT /p.json?ns=t HTTP/1.1\r\nHost: x\r\nExpect: 100-continue\r\nContent-Length: 1\r\n\r\n".utf8))
        var chunk = [UInt8](repeating: 0, count: 4096)
        let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
        #expect(String(decoding: chunk.prefix(max(0, n)), as: UTF8.self).hasPrefix("HTTP/1.1 100 Continue\r\n"))
        // Its body, then three more requests in the same write: each answered, in order.
        let rest = "1"
            + "PATCH /p2.json?ns=t HTTP/1.1\r\nHost: x\r\nContent-Length: 8\r\n\r\n{\"a\": 2}"
            + "GET /.json?ns=t HTTP/1.1\r\nHost: x\r\n\r\n"
            + "GET /p.json?ns=t HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
        TestHTTP.send(fd, Array(rest.utf8))
        let answers = try Self.responses(TestHTTP.readAll(fd))
        #expect(answers.map(\.status) == [200, 200, 200, 200])
        #expect(answers.map { $0.headers["connection"] ?? "" } == ["keep-alive", "keep-alive", "keep-alive", "close"])
        #expect(answers.count == 4 && answers[2].json == ["p": 1, "p2": ["a": 2]] && answers[3].json == 1)
        #expect(server.terminate() == 0)
    }
}
