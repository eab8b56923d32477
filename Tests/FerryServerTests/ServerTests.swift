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

/// `ferry-server` as a real child process on loopback, driven with plain HTTP.
@Suite struct ServerTests {
    let store = "0123456789abcdef0123456789abcdef"

    @Test func aWriteResentAfterTheServerWasKilledIsAnsweredAsADuplicateAndAppliedOnce() throws {
        let dir = try TemporaryDirectory("server-dup")
        let increment = #"{".sv": {"increment": 1}}"#
        var server = try ServerProcess(data: dir.path)
        let first = try TestHTTP.request(server.port, "PUT", "/count.json?ns=t", headers: ["X-Ferry-Write": "\(store)/7", "X-Ferry-Acked": "0"], json: increment)
        #expect(first.status == 200)
        #expect(first.headers["x-ferry-duplicate"] == nil)
        server.kill9()

        server = try ServerProcess(data: dir.path)
        let again = try TestHTTP.request(server.port, "PUT", "/count.json?ns=t", headers: ["X-Ferry-Write": "\(store)/7", "X-Ferry-Acked": "0"], json: increment)
        #expect(again.status == 200)
        #expect(again.headers["x-ferry-duplicate"] == "true")
        #expect(try TestHTTP.request(server.port, "GET", "/count.json?ns=t").json == 1)
        // The next write of the same client is new.
        let next = try TestHTTP.request(server.port, "PUT", "/count.json?ns=t", headers: ["X-Ferry-Write": "\(store)/8", "X-Ferry-Acked": "7"], json: increment)
        #expect(next.headers["x-ferry-duplicate"] == nil)
        #expect(try TestHTTP.request(server.port, "GET", "/count.json?ns=t").json == 2)
        #expect(server.terminate() == 0)
    }

    /// The server's store is the truth, not a cache: past a client's default cache limit
    /// (10 MB) its data must all be there after a restart (nothing evicted).
    @Test func theServerKeepsEveryWritePastTheClientCacheLimit() throws {
        let dir = try TemporaryDirectory("server-big")
        var server = try ServerProcess(data: dir.path)
        var g = SystemRandomNumberGenerator()
        var sizes: [String: Int] = [:]
        for i in 0..<14 {
            // ~1 MB of hex digits: LZ4 cannot shrink it below ~half, so 14 of them pass 10 MB on disk.
            let text = (0..<(1 << 19)).map { _ in String(UInt8.random(in: 0...255, using: &g), radix: 16) }.joined()
            sizes["i\(i)"] = text.utf8.count
            let r = try TestHTTP.request(server.port, "PUT", "/big/i\(i).json?ns=t&print=silent", json: "\"\(text)\"")
            #expect(r.status == 204 || r.status == 200)
        }
        #expect(server.terminate() == 0)
        server = try ServerProcess(data: dir.path)
        for (key, size) in sizes {
            let r = try TestHTTP.request(server.port, "GET", "/big/\(key).json?ns=t")
            guard case .string(let s) = r.json else {
                Issue.record("\(key) is gone after a restart: \(String(describing: r.json))")
                continue
            }
            #expect(s.utf8.count == size)
        }
        #expect(server.terminate() == 0)
    }

    /// A write the server's store cannot hold is refused on its own; it does not stop the
    /// namespace (every later write got 503 until a restart).
    @Test func aWriteTheStoreCannotHoldIsRefusedAloneAndTheNamespaceGoesOn() throws {
        let dir = try TemporaryDirectory("server-unstorable")
        let server = try ServerProcess(data: dir.path)
        // 32 levels from the namespace root, the data model's limit; the store keeps data one
        // key deeper, so it cannot hold this one (yet): a clear 400, nothing changed.
        var deep = "1"
        for _ in 0..<31 { deep = #"{"k":\#(deep)}"# }
        let refused = try TestHTTP.request(server.port, "PUT", "/a.json?ns=t", json: deep)
        #expect(refused.status == 400, "\(refused.status)")
        let huge = #"{".sv": {"increment": 1.7e308}}"#
        #expect(try TestHTTP.request(server.port, "PUT", "/n.json?ns=t", json: huge).status == 200)
        let overflow = try TestHTTP.request(server.port, "PUT", "/n.json?ns=t", json: huge)
        #expect(overflow.status == 400, "an increment to infinity: \(overflow.status)")
        // The namespace goes on.
        let after = try TestHTTP.request(server.port, "PUT", "/ok.json?ns=t", json: "1")
        #expect(after.status == 200, "\(after.status)")
        #expect(try TestHTTP.request(server.port, "GET", "/ok.json?ns=t").json == 1)
        #expect(try TestHTTP.request(server.port, "GET", "/a.json?ns=t").json == .null)
        #expect(server.terminate() == 0)
    }

    @Test func aResentPushGetsTheSameNameAndARecordedRejectionIsRepeated() throws {
        let dir = try TemporaryDirectory("server-dup-push")
        let server = try ServerProcess(data: dir.path)
        let h = ["X-Ferry-Write": "\(store)/1"]
        let push = try TestHTTP.request(server.port, "POST", "/list.json?ns=t", headers: h, json: #"{"a": 1}"#)
        let again = try TestHTTP.request(server.port, "POST", "/list.json?ns=t", headers: h, json: #"{"a": 1}"#)
        #expect(push.status == 200 && again.status == 200)
        #expect(again.json == push.json)
        #expect(again.headers["x-ferry-duplicate"] == "true")
        guard case .object(let list)? = try TestHTTP.request(server.port, "GET", "/list.json?ns=t").json else { Issue.record("no list"); return }
        #expect(list.count == 1)

        // A stale if-match is rejected; resent, the same rejection comes back as a duplicate.
        let h2 = ["X-Ferry-Write": "\(store)/2", "if-match": "stale"]
        let rejected = try TestHTTP.request(server.port, "PUT", "/x.json?ns=t", headers: h2, json: "5")
        let rejectedAgain = try TestHTTP.request(server.port, "PUT", "/x.json?ns=t", headers: h2, json: "5")
        #expect(rejected.status == 412)
        #expect(rejectedAgain.status == 412)
        #expect(rejectedAgain.headers["x-ferry-duplicate"] == "true")
        #expect(try TestHTTP.request(server.port, "GET", "/x.json?ns=t").json == .null)
        #expect(server.terminate() == 0)
    }

    @Test func everyAcknowledgedWriteFromManyClientsSurvivesKill9() throws {
        let dir = try TemporaryDirectory("server-kill9")
        var server = try ServerProcess(data: dir.path)
        let port = server.port
        let acknowledged = FerryMutex<[Int]>([])
        DispatchQueue.concurrentPerform(iterations: 8) { client in
            for i in 0..<25 {
                let n = client * 100 + i
                if let r = try? TestHTTP.request(port, "PUT", "/items/k\(n).json?ns=t&print=silent", json: "\(n)"), r.status == 204 {
                    acknowledged.withLock { $0.append(n) }
                }
            }
        }
        server.kill9()
        server = try ServerProcess(data: dir.path)
        guard case .object(let items)? = try TestHTTP.request(server.port, "GET", "/items.json?ns=t").json else {
            Issue.record("no items after restart")
            return
        }
        let acked = acknowledged.withLock { $0 }
        #expect(acked.count == 200)
        for n in acked { #expect(items["k\(n)"] == .int(Int64(n))) }
        #expect(server.terminate() == 0)
    }

    @Test func aBatchIsAppliedInOrderEachWriteAtMostOnceAndAnsweredPerWrite() throws {
        let dir = try TemporaryDirectory("server-batch")
        let server = try ServerProcess(data: dir.path)
        let info = try TestHTTP.request(server.port, "GET", "/.ferry/info.json?ns=t")
        #expect(info.status == 200)
        guard case .object(let caps)? = info.json else { Issue.record("no info"); return }
        #expect(caps["idempotent"] == true && caps["batch"] == true && caps["server"] == "ferry-server" && caps["commits"] == true)

        let batch = """
        {"client": "\(store)", "acked": 0, "writes": [
          {"id": 17, "op": "set", "path": "/posts/p1", "data": {"title": "Hi"}},
          {"id": 18, "op": "update", "path": "/stats", "data": {"count": {".sv": {"increment": 1}}}},
          {"id": 19, "op": "set", "path": "/bad[key]", "data": 1},
          {"id": 20, "op": "set", "path": "/posts/p1/title", "data": "Hello"}
        ]}
        """
        let r = try TestHTTP.request(server.port, "POST", "/.ferry/batch.json?ns=t", json: batch)
        #expect(r.status == 200)
        let results = try #require(r.json.flatMap { v -> [Value]? in
            if case .object(let o) = v, case .array(let a)? = o["results"] { return a }
            return nil
        })
        #expect(results.count == 4)
        // Each applied write is a commit, numbered in order; a rejected one is none.
        #expect(results[0] == ["id": 17, "status": 200, "commit": 1])
        #expect(results[1] == ["id": 18, "status": 200, "commit": 2])
        if case .object(let third) = results[2] { #expect(third["status"] == 400 && third["commit"] == nil) } else { Issue.record("no third result") }
        #expect(results[3] == ["id": 20, "status": 200, "commit": 3])

        // Sent again (the answer was lost): nothing is applied twice, the rejection is repeated.
        let again = try TestHTTP.request(server.port, "POST", "/.ferry/batch.json?ns=t", json: batch)
        guard case .object(let o)? = again.json, case .array(let second)? = o["results"] else { Issue.record("no results"); return }
        // (A duplicate is visible at the last commit: at or after its own.)
        #expect(second[1] == ["id": 18, "status": 200, "duplicate": true, "commit": 3])
        if case .object(let third) = second[2] { #expect(third["status"] == 400 && third["duplicate"] == true) }
        #expect(try TestHTTP.request(server.port, "GET", "/.json?ns=t").json == ["posts": ["p1": ["title": "Hello"]], "stats": ["count": 1]])

        let unordered = #"{"client": "\#(store)", "acked": 0, "writes": [{"id": 30, "op": "set", "path": "/a", "data": 1}, {"id": 29, "op": "set", "path": "/b", "data": 1}]}"#
        #expect(try TestHTTP.request(server.port, "POST", "/.ferry/batch.json?ns=t", json: unordered).status == 400)
        #expect(try TestHTTP.request(server.port, "GET", "/a.json?ns=t").json == .null)
        #expect(server.terminate() == 0)
    }

    @Test func everyResponseCarriesTheServerTime() throws {
        let dir = try TemporaryDirectory("server-time")
        let server = try ServerProcess(data: dir.path)
        let before = Int64(Date().timeIntervalSince1970 * 1000)
        for r in [try TestHTTP.request(server.port, "GET", "/.json?ns=t"),
                  try TestHTTP.request(server.port, "GET", "/.json?ns=t&nope=1"),
                  try TestHTTP.request(server.port, "PUT", "/a.json?ns=t", json: "1")] {
            let t = try #require(r.headers["x-ferry-server-time"].flatMap { Int64($0) })
            #expect(t >= before - 60_000 && t <= Int64(Date().timeIntervalSince1970 * 1000) + 60_000)
        }
        #expect(server.terminate() == 0)
    }

    @Test func etagsGuardWritesAndSpareReads() throws {
        let dir = try TemporaryDirectory("server-etag")
        let server = try ServerProcess(data: dir.path)
        _ = try TestHTTP.request(server.port, "PUT", "/c.json?ns=t", json: "1")
        let read = try TestHTTP.request(server.port, "GET", "/c.json?ns=t", headers: ["X-Firebase-ETag": "true"])
        let etag = try #require(read.headers["etag"])
        #expect(etag == ETag.of(1))
        #expect(try TestHTTP.request(server.port, "GET", "/c.json?ns=t", headers: ["if-none-match": etag]).status == 304)
        let ok = try TestHTTP.request(server.port, "PUT", "/c.json?ns=t", headers: ["if-match": etag], json: "2")
        #expect(ok.status == 200 && ok.headers["etag"] == ETag.of(2))
        let stale = try TestHTTP.request(server.port, "PUT", "/c.json?ns=t", headers: ["if-match": etag], json: "3")
        #expect(stale.status == 412 && stale.headers["etag"] == ETag.of(2) && stale.json == 2)
        #expect(try TestHTTP.request(server.port, "PUT", "/new.json?ns=t", headers: ["if-match": ETag.absent], json: "1").status == 200)
        #expect(try TestHTTP.request(server.port, "PUT", "/new.json?ns=t", headers: ["if-match": ETag.absent], json: "2").status == 412)
        #expect(server.terminate() == 0)
    }

    @Test func badInputGetsAClearErrorAndNeverLosesDataOrTakesTheServerDown() throws {
        let dir = try TemporaryDirectory("server-bad")
        let server = try ServerProcess(data: dir.path, ["--max-body", "1000"])
        let p = server.port
        _ = try TestHTTP.request(p, "PUT", "/keep.json?ns=t", json: #"{"a": 1}"#)
        let deep = String(repeating: #"{"a":"#, count: 33) + "1" + String(repeating: "}", count: 33)
        let cases: [(String, String, String?, Int)] = [
            ("PUT", "/x.json?ns=t", "{not json", 400),
            ("PUT", "/x.json?ns=t", #"{"a.b": 1}"#, 400),
            ("PUT", "/x.json?ns=t", deep, 400),
            ("PUT", "/a%5Bb%5D.json?ns=t", "1", 400),
            ("PATCH", "/x.json?ns=t", "[1, 2]", 400),
            ("PATCH", "/x.json?ns=t", #"{"a": 1, "a/b": 2}"#, 400),
            ("PUT", "/x.json?ns=t", String(repeating: "1", count: 2000), 413),
            ("BREW", "/x.json?ns=t", nil, 405),
            ("GET", "/x.json?ns=t&limitToFirst=-1&orderBy=%22$key%22", nil, 400),
            ("GET", "/x.json?ns=t&limitToFirst=99999999999999&orderBy=%22$key%22", nil, 400),
            ("GET", "/x.json?ns=t&startAt=1", nil, 400),
            ("GET", "/x.json?ns=t&unknown=1", nil, 400),
            ("GET", "/x.json", nil, 400),
            ("GET", "/x?ns=t", nil, 400),
            ("PUT", "/x.json?ns=t", #"{".sv": "nonsense"}"#, 400),
            ("GET", "/x.json?ns=t", nil, 200),
        ]
        for (method, path, body, status) in cases {
            let r = try TestHTTP.request(p, method, path, body: body.map { Array($0.utf8) })
            #expect(r.status == status, "\(method) \(path): \(r.text)")
            if status >= 400 && status != 413 {
                guard case .object(let o)? = r.json, case .string? = o["error"] else {
                    Issue.record("\(method) \(path): no {\"error\": …} in \(r.text)")
                    continue
                }
            }
        }
        // A garbage request line, and a client that never finishes its request.
        let fd = try TestHTTP.connect(p)
        TestHTTP.send(fd, Array("NONSENSE\r\n\r\n".utf8))
        #expect(try TestHTTP.parse(TestHTTP.readAll(fd)).status == 400)
        close(fd)
        let slow = try TestHTTP.connect(p)
        TestHTTP.send(slow, Array("PUT /keep.json?ns=t HTTP/1.1\r\nContent-Length: 100\r\n\r\n{".utf8))
        // Meanwhile others are served; the slow one is dropped (--request-timeout 2) without a write.
        #expect(try TestHTTP.request(p, "GET", "/keep.json?ns=t").json == ["a": 1])
        #expect(TestHTTP.readAll(slow).isEmpty)
        close(slow)
        #expect(try TestHTTP.request(p, "GET", "/.json?ns=t").json == ["keep": ["a": 1]])
        #expect(server.terminate() == 0)
    }

    @Test func aKeptAliveConnectionOutlivesTheRequestTimeoutAndClosesAtTheIdleTimeout() throws {
        let dir = try TemporaryDirectory("server-idle")
        let server = try ServerProcess(data: dir.path, ["--request-timeout", "1", "--idle-timeout", "8"])
        /// Sends a kept-alive GET on `fd` and reads its one answer (up to its Content-Length).
        func get(_ fd: Int32) throws -> TestResponse {
            TestHTTP.send(fd, Array("GET /.json?ns=t HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n".utf8))
            var raw: [UInt8] = []
            var chunk = [UInt8](repeating: 0, count: 4096)
            while true {
                if let r = try? TestHTTP.parse(raw), let length = r.headers["content-length"].flatMap(Int.init), r.body.count >= length {
                    return r
                }
                let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
                guard n > 0 else { throw HTTPTestError(message: "the connection closed before its answer: \(String(decoding: raw, as: UTF8.self))") }
                raw += chunk[0..<n]
            }
        }
        let kept = try TestHTTP.connect(server.port)
        defer { close(kept) }
        #expect(try get(kept).status == 200)
        // A request left unfinished is dropped at the request timeout...
        let slow = try TestHTTP.connect(server.port)
        TestHTTP.send(slow, Array("PUT /x.json?ns=t HTTP/1.1\r\nContent-Length: 10\r\n\r\n{".utf8))
        #expect(TestHTTP.readAll(slow).isEmpty)
        close(slow)
        // ...while the connection waiting between requests is still served: a client's pool
        // never sends on a connection the server closes under it.
        #expect(try get(kept).status == 200)
        // It closes once idle for the idle timeout (recv sees the end, not its 20 s limit).
        var byte: UInt8 = 0
        #expect(recv(kept, &byte, 1, 0) == 0)
        #expect(server.terminate() == 0)
    }

    @Test func sigtermFinishesWhatIsInFlightAndClosesTheStore() throws {
        let dir = try TemporaryDirectory("server-term")
        var server = try ServerProcess(data: dir.path)
        let port = server.port
        let answered = FerryMutex<[Int]>([])
        let group = DispatchGroup()
        // Each client writes until the server stops answering: writes are in flight whenever
        // the SIGTERM comes.
        for c in 0..<4 {
            DispatchQueue.global().async(group: group) {
                for i in 0..<100_000 {
                    guard let r = try? TestHTTP.request(port, "PUT", "/w/k\(c)_\(i).json?ns=t", json: "1"), r.status == 200 else { return }
                    answered.withLock { $0.append(c * 100_000 + i) }
                }
            }
        }
        #expect(eventuallyOnThisThread { answered.withLock { $0.count } >= 10 }, "the clients are writing")
        #expect(server.terminate() == 0)
        group.wait()
        server = try ServerProcess(data: dir.path)
        let stored = try TestHTTP.request(server.port, "GET", "/w.json?ns=t&shallow=true").json
        for n in answered.withLock({ $0 }) {
            guard case .object(let o)? = stored else { Issue.record("nothing stored"); break }
            #expect(o["k\(n / 100_000)_\(n % 100_000)"] == true)
        }
        #expect(server.terminate() == 0)
    }

    @Test func streamsSendTheWholeValueThenEachChangeInWriteOrder() throws {
        let dir = try TemporaryDirectory("server-stream")
        let server = try ServerProcess(data: dir.path)
        let p = server.port
        _ = try TestHTTP.request(p, "PUT", "/room.json?ns=t", json: #"{"a": 1, "b": 2}"#)
        let plain = try StreamReader(port: p, path: "/room.json?ns=t")
        let query = try StreamReader(port: p, path: "/room.json?ns=t&orderBy=%22$value%22&limitToLast=1")
        #expect(try plain.next() == .put("/", ["a": 1, "b": 2]))
        #expect(try query.next() == .put("/", ["b": 2]))
        _ = try TestHTTP.request(p, "PUT", "/room/c.json?ns=t", json: "3")
        _ = try TestHTTP.request(p, "PATCH", "/room.json?ns=t", json: #"{"a": 5, "d/e": 6}"#)
        _ = try TestHTTP.request(p, "PUT", "/.json?ns=t", json: #"{"room": {"z": 0}}"#)
        #expect(try plain.next() == .put("/c", 3))
        #expect(try plain.next() == .patch("/", ["a": 5, "d/e": 6]))
        #expect(try plain.next() == .put("/", ["z": 0]))
        #expect(try query.next() == .put("/", ["c": 3]))
        #expect(try query.next() == .put("/", ["d": ["e": 6]]))  // objects sort after numbers
        #expect(try query.next() == .put("/", ["z": 0]))
        #expect(try plain.next() == .keepAlive)  // silence (--keep-alive 1)

        // Rules that stop the reading cancel the stream.
        let rules = #"{"rules": {".read": false, ".write": true}}"#
        let anonymous = try StreamReader(port: p, path: "/room.json?ns=t")
        #expect(try anonymous.next() == .put("/", ["z": 0]))
        #expect(try TestHTTP.request(p, "PUT", "/.settings/rules.json?ns=t", headers: ["Authorization": "Bearer owner"], json: rules).status == 200)
        #expect(try anonymous.next(skippingKeepAlive: true) == .cancel)
        #expect(try TestHTTP.request(p, "GET", "/room.json?ns=t").status == 401)
        #expect(server.terminate() == 0)
    }
}

extension ServerTests {
    /// Every write that changes the data is a commit, numbered in order and kept across a
    /// restart; its answer says the number, a stream's events carry it, a stream's first put
    /// says which commit it shows, and a client's streams learn each number its writes were
    /// answered at even where nothing they show changed.
    @Test func commitsAreNumberedDurablyAndStreamsSayWhichTheyReflect() throws {
        let dir = try TemporaryDirectory("server-commits")
        var server = try ServerProcess(data: dir.path)
        func put(_ path: String, _ json: String, write: Int? = nil) throws -> String? {
            var headers: [String: String] = [:]
            if let write { headers[WireHeader.write] = "\(store)/\(write)" }
            let r = try TestHTTP.request(server.port, "PUT", "\(path).json?ns=t", headers: headers, json: json)
            #expect(r.status == 200)
            return r.headers[WireHeader.commit]
        }
        #expect(try put("/a", "1") == "1")
        let mine = try StreamReader(port: server.port, path: "/b.json?ns=t", headers: [WireHeader.client: store])
        let other = try StreamReader(port: server.port, path: "/b.json?ns=t")
        let root = try StreamReader(port: server.port, path: "/.json?ns=t")
        #expect(try mine.next(keepingIDs: true) == .put("/", .null, id: "1"))
        #expect(try other.next(keepingIDs: true) == .put("/", .null, id: "1"))
        #expect(try root.next(keepingIDs: true) == .put("/", ["a": 1], id: "1"))
        // A write of this client elsewhere: its stream at /b learns commit 2 all the same.
        #expect(try put("/a", "2", write: 1) == "2")
        #expect(try root.next(keepingIDs: true) == .put("/a", 2, id: "2"))
        #expect(try mine.next(skippingKeepAlive: true, keepingIDs: true) == .progress("2"))
        #expect(try put("/b", "3") == "3")
        #expect(try other.next(skippingKeepAlive: true, keepingIDs: true) == .put("/", 3, id: "3"), "the other stream learns of commit 2 only by commit 3")
        #expect(try mine.next(skippingKeepAlive: true, keepingIDs: true) == .put("/", 3, id: "3"))
        // Sent again, the write is answered at the last commit (at or after its own), and
        // changes nothing.
        #expect(try put("/a", "2", write: 1) == "3")
        #expect(try mine.next(keepingIDs: true) == .keepAlive, "no event for a duplicate whose commit the stream has")
        // The numbers go on after a restart.
        #expect(server.terminate() == 0)
        server = try ServerProcess(data: dir.path)
        let again = try StreamReader(port: server.port, path: "/.json?ns=t")
        #expect(try again.next(keepingIDs: true) == .put("/", ["a": 2, "b": 3], id: "3"))
        #expect(try put("/c", "4") == "4")
        #expect(try again.next(skippingKeepAlive: true, keepingIDs: true) == .put("/c", 4, id: "4"))
        // An update whose parts lie below a stream is one event of its commit there (a client
        // takes the commit as applied once it has one event of it).
        let user = try StreamReader(port: server.port, path: "/users/u1.json?ns=t")
        #expect(try user.next(keepingIDs: true) == .put("/", .null, id: "4"))
        #expect(try TestHTTP.request(server.port, "PATCH", "/users.json?ns=t", json: #"{"u1/name": "Ann", "u1/age": 30, "u2/name": "Bo"}"#).headers[WireHeader.commit] == "5")
        #expect(try user.next(keepingIDs: true) == .patch("/", ["name": "Ann", "age": 30], id: "5"))
        #expect(server.terminate() == 0)
    }

    /// A stream reconnecting with `Last-Event-ID: N` gets the changes after commit N that
    /// concern it — from the namespace's history of recent commits, which a restart reads back
    /// from the store's log — instead of the whole value; from a commit older than the history
    /// holds, the whole value.
    @Test func aStreamResumingAfterACommitGetsOnlyWhatChangedSinceWhileTheHistoryHoldsIt() throws {
        let dir = try TemporaryDirectory("server-resume")
        var server = try ServerProcess(data: dir.path, ["--history-commits", "5"])
        for i in 1...10 {
            #expect(try TestHTTP.request(server.port, "PUT", "/room/k\(i % 3).json?ns=t", json: "\(i)").headers[WireHeader.commit] == "\(i)")
        }
        #expect(try TestHTTP.request(server.port, "PUT", "/elsewhere.json?ns=t", json: "true").status == 200)  // commit 11
        // After 7: commits 8…11, of which 8, 9 and 10 concern /room; then a mark at 11.
        let resumed = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "7", WireHeader.client: store])
        #expect(try resumed.next(keepingIDs: true) == .put("/k2", 8, id: "8"))
        #expect(try resumed.next(keepingIDs: true) == .put("/k0", 9, id: "9"))
        #expect(try resumed.next(keepingIDs: true) == .put("/k1", 10, id: "10"))
        #expect(try resumed.next(keepingIDs: true) == .progress("11"))
        #expect(resumed.head.contains("\(WireHeader.resumedThrough): 11"))
        let epoch = try #require(resumed.head.components(separatedBy: "\r\n").first { $0.hasPrefix(WireHeader.epoch + ":") }?.dropFirst(WireHeader.epoch.count + 1)
            .trimmingCharacters(in: .whitespaces))
        // A commit of another epoch (a store made anew since) is not one of this namespace's.
        let stranger = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "7", WireHeader.epoch: "1"])
        #expect(try stranger.next(keepingIDs: true) == .put("/", ["k0": 9, "k1": 10, "k2": 8], id: "11"))
        let same = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "10", WireHeader.epoch: epoch])
        #expect(try same.next(keepingIDs: true) == .keepAlive, "nothing after 10 concerns /room (and no mark without X-Ferry-Client)")
        #expect(same.head.contains("\(WireHeader.resumedThrough): 11"))
        // Nothing missed: only the mark.
        let current = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "11", WireHeader.client: store])
        #expect(try current.next(keepingIDs: true) == .progress("11"))
        // The history holds the last 5 (7…11): after 5, the whole value, as for a new stream.
        let old = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "5"])
        #expect(try old.next(keepingIDs: true) == .put("/", ["k0": 9, "k1": 10, "k2": 8], id: "11"))
        #expect(!old.head.contains(WireHeader.resumedThrough))
        // Live events follow a resumed stream as any other.
        _ = try TestHTTP.request(server.port, "PUT", "/room/k0.json?ns=t", json: "12")
        #expect(try resumed.next(skippingKeepAlive: true, keepingIDs: true) == .put("/k0", 12, id: "12"))
        // A restarted server reads its recent commits back from its store's log, as many as
        // its history holds (the oldest read only bounds it): a stream from before the
        // restart still resumes; one from before those gets the whole value.
        #expect(server.terminate() == 0)
        server = try ServerProcess(data: dir.path, ["--history-commits", "5"])
        let current2 = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "12", WireHeader.client: store])
        #expect(try current2.next(keepingIDs: true) == .progress("12"))
        let before = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "9", WireHeader.client: store])
        #expect(try before.next(keepingIDs: true) == .put("/k1", 10, id: "10"))
        #expect(try before.next(keepingIDs: true) == .put("/k0", 12, id: "12"))  // (current through its id: no mark needed)
        #expect(before.head.contains("\(WireHeader.resumedThrough): 12"))
        let older = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "7"])
        #expect(try older.next(keepingIDs: true) == .put("/", ["k0": 12, "k1": 10, "k2": 8], id: "12"))
        #expect(!older.head.contains(WireHeader.resumedThrough))
        #expect(server.terminate() == 0)
    }

    /// What a resuming stream missed is weighed by what lies at its location: big writes
    /// elsewhere — also inside one run read back from the log after a restart — do not turn a
    /// resume into the whole value; a big write at the location does.
    @Test func aResumeIsWeighedByWhatChangedAtTheStreamsLocationOnly() throws {
        let dir = try TemporaryDirectory("server-resume-weight")
        var server = try ServerProcess(data: dir.path, ["--max-stream-buffer", "65536"])  // (resumes up to 32 KiB)
        let big = "\"" + String(repeating: "x", count: 40_000) + "\""
        _ = try TestHTTP.request(server.port, "PUT", "/room/a.json?ns=t", json: "1")  // commit 1
        _ = try TestHTTP.request(server.port, "PUT", "/elsewhere.json?ns=t", json: big)  // commit 2
        _ = try TestHTTP.request(server.port, "PATCH", "/.json?ns=t", json: #"{"room/b": 2, "other": \#(big)}"#)  // commit 3
        for restarted in [false, true] {
            let resumed = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "1", WireHeader.client: store])
            let event = try resumed.next(keepingIDs: true)
            #expect(event == .put("/b", 2, id: "3"), "restarted: \(restarted): \(event)")
            #expect(resumed.head.contains("\(WireHeader.resumedThrough): 3"))
            if !restarted {
                #expect(server.terminate() == 0)
                server = try ServerProcess(data: dir.path, ["--max-stream-buffer", "65536"])
            }
        }
        _ = try TestHTTP.request(server.port, "PUT", "/room/c.json?ns=t", json: big)  // commit 4
        let whole = try StreamReader(port: server.port, path: "/room.json?ns=t", headers: ["Last-Event-ID": "3"])
        let first = try whole.next(keepingIDs: true)
        #expect(first.name == "put" && first.id == "4", "\(first.name) \(first.id ?? "-")")
        if case .object(let o) = first.data, case .object(let room)? = o["data"] { #expect(Set(room.keys) == ["a", "b", "c"]) } else { Issue.record("a whole put expected") }
        #expect(!whole.head.contains(WireHeader.resumedThrough))
        #expect(server.terminate() == 0)
    }

    /// Read back from the log after a restart, a set of the whole tree reaches a stream at the
    /// root as a put of it, and later writes as patches of the root.
    @Test func aStreamAtTheRootResumesAcrossARestartThroughASetOfTheWholeTree() throws {
        let dir = try TemporaryDirectory("server-resume-root")
        var server = try ServerProcess(data: dir.path)
        _ = try TestHTTP.request(server.port, "PUT", "/x.json?ns=t", json: "1")  // commit 1
        _ = try TestHTTP.request(server.port, "PUT", "/.json?ns=t", json: #"{"b": 2}"#)  // commit 2
        _ = try TestHTTP.request(server.port, "PUT", "/c.json?ns=t", json: "3")  // commit 3
        server.kill9()
        server = try ServerProcess(data: dir.path)
        let resumed = try StreamReader(port: server.port, path: "/.json?ns=t", headers: ["Last-Event-ID": "1", WireHeader.client: store])
        #expect(try resumed.next(keepingIDs: true) == .put("/", ["b": 2], id: "2"))
        #expect(resumed.head.contains("\(WireHeader.resumedThrough): 3"))
        #expect(try resumed.next(keepingIDs: true) == .patch("/", ["c": 3], id: "3"))
        #expect(server.terminate() == 0)
    }

    @Test func aStreamBelowAWriteGetsItsOwnValueAndNothingWhenItDidNotChange() throws {
        let dir = try TemporaryDirectory("server-stream-below")
        let server = try ServerProcess(data: dir.path)
        let p = server.port
        _ = try TestHTTP.request(p, "PUT", "/a.json?ns=t", json: #"{"b": {"c": 1}, "x": 1}"#)
        let below = try StreamReader(port: p, path: "/a/b.json?ns=t")
        #expect(try below.next() == .put("/", ["c": 1]))
        _ = try TestHTTP.request(p, "PUT", "/a.json?ns=t", json: #"{"b": {"c": 1}, "x": 2}"#)  // b unchanged: no event
        _ = try TestHTTP.request(p, "PUT", "/a.json?ns=t", json: #"{"b": {"c": 2}}"#)
        #expect(try below.next() == .put("/", ["c": 2]))
        _ = try TestHTTP.request(p, "PATCH", "/a.json?ns=t", json: #"{"b/d": 4, "y": 5}"#)  // a child below the stream
        #expect(try below.next() == .put("/d", 4))
        _ = try TestHTTP.request(p, "PATCH", "/.json?ns=t", json: #"{"a/b": {"e": 5}}"#)  // the stream's location replaced
        #expect(try below.next() == .put("/", ["e": 5]))
        _ = try TestHTTP.request(p, "DELETE", "/a.json?ns=t")
        #expect(try below.next() == .put("/", .null))
        #expect(try below.next() == .keepAlive)
        #expect(server.terminate() == 0)
    }

    @Test func aTokenTheOwnerNoLongerAcceptsRevokesItsStreamsAndItsRequests() throws {
        let dir = try TemporaryDirectory("server-tokens")
        let server = try ServerProcess(data: dir.path, ["--token", "t1", "--token", "t2"])
        let p = server.port
        _ = try TestHTTP.request(p, "PUT", "/a.json?ns=t", json: "1")
        let revoked = try StreamReader(port: p, path: "/a.json?ns=t", headers: ["Authorization": "Bearer t1"])
        let kept = try StreamReader(port: p, path: "/a.json?ns=t&auth=t2")
        #expect(try revoked.next() == .put("/", 1))
        #expect(try kept.next() == .put("/", 1))
        #expect(try TestHTTP.request(p, "PUT", "/.ferry/tokens.json?ns=t", json: #"["t2"]"#).status == 401)
        #expect(try TestHTTP.request(p, "PUT", "/.ferry/tokens.json?ns=t", headers: ["Authorization": "Bearer owner"], json: #"["t2"]"#).status == 200)
        #expect(try revoked.next(skippingKeepAlive: true) == .authRevoked)
        #expect(throws: HTTPTestError.self) { try revoked.next(skippingKeepAlive: true) }
        let refused = try TestHTTP.request(p, "GET", "/a.json?ns=t", headers: ["Authorization": "Bearer t1"])
        #expect(refused.status == 401 && refused.json == ["error": "Auth token is expired"])
        _ = try TestHTTP.request(p, "PUT", "/a.json?ns=t", headers: ["Authorization": "Bearer t2"], json: "2")
        #expect(try kept.next(skippingKeepAlive: true) == .put("/", 2))
        #expect(server.terminate() == 0)
    }
}

/// Reads a server's event stream.
final class StreamReader {
    let fd: Int32
    var parser = StreamEventParser()
    var pending: [StreamEvent] = []
    var headerDone = false
    var raw: [UInt8] = []
    var ended = false

    init(port: Int, path: String, headers: [String: String] = [:]) throws {
        fd = try TestHTTP.connect(port)
        let extra = headers.map { "\($0): \($1)\r\n" }.joined()
        TestHTTP.send(fd, Array("GET \(path) HTTP/1.1\r\nHost: x\r\nAccept: text/event-stream\r\n\(extra)\r\n".utf8))
    }

    deinit { close(fd) }

    /// The last `id:` read (an event's or a progress mark's).
    var lastID: String?
    /// The answer's status line and headers, lowercase, once read.
    var head = ""

    /// The next event (skipping keep-alives when asked); throws when the stream ends first.
    /// Unless `keepingIDs`, progress marks are skipped and events come without their ids.
    func next(skippingKeepAlive: Bool = false, keepingIDs: Bool = false) throws -> StreamEvent {
        var skipped = 0
        while true {
            while !pending.isEmpty {
                var e = pending.removeFirst()
                if let id = e.id { lastID = id }
                if !keepingIDs {
                    if e.isProgress { continue }
                    e.id = nil
                }
                if skippingKeepAlive && e.name == "keep-alive" {
                    skipped += 1
                    if skipped > 20 { throw HTTPTestError(message: "only keep-alives") }
                    continue
                }
                return e
            }
            if ended { throw HTTPTestError(message: "the stream ended") }
            var chunk = [UInt8](repeating: 0, count: 65536)
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            guard n > 0 else { throw HTTPTestError(message: "the stream ended") }
            raw += chunk[0..<n]
            if !headerDone {
                guard let end = raw.indices.dropLast(3).first(where: { raw[$0] == 13 && raw[$0 + 1] == 10 && raw[$0 + 2] == 13 && raw[$0 + 3] == 10 }) else { continue }
                head = String(decoding: raw[..<end], as: UTF8.self).lowercased()
                raw.removeFirst(end + 4)
                headerDone = true
            }
            // De-chunk what is complete.
            while let crlf = raw.indices.dropLast().first(where: { raw[$0] == 13 && raw[$0 + 1] == 10 }),
                  let size = Int(String(decoding: raw[..<crlf], as: UTF8.self), radix: 16),
                  raw.count >= crlf + 2 + size + 2 {
                let body = Array(raw[(crlf + 2)..<(crlf + 2 + size)])
                raw.removeFirst(crlf + 2 + size + 2)
                if size == 0 { ended = true; break }
                pending += try parser.feed(body)
            }
        }
    }
}
