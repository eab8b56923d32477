@_spi(Server) import Ferry
import FerryLog
import FerrySync
import FerryTestSupport
import FerryWire
import Foundation
import Testing

/// Clients and the server apply the same tree rules, so that whatever two clients do, online
/// or not, they end with the server's data.
@Suite struct ConvergenceTests {
    /// Null written below a leaf, in every form a client or a REST user sends it, leaves the
    /// leaf on the server as in a client's cache.
    @Test func nullBelowALeafLeavesTheLeafOnTheServerInEveryForm() async throws {
        let dir = try TemporaryDirectory("converge-leaf")
        let server = try ServerProcess(data: dir.sub("server"))
        let owner = ["Authorization": "Bearer owner"]
        for (i, form) in ["DELETE", "PUT null", "PATCH", "batch"].enumerated() {
            let k = "/k\(i)"
            #expect(try TestHTTP.request(server.port, "PUT", "\(k).json?ns=t", headers: owner, json: #""x""#).status == 200)
            let status: Int
            switch form {
            case "DELETE": status = try TestHTTP.request(server.port, "DELETE", "\(k)/a.json?ns=t", headers: owner).status
            case "PUT null": status = try TestHTTP.request(server.port, "PUT", "\(k)/a.json?ns=t", headers: owner, json: "null").status
            case "PATCH": status = try TestHTTP.request(server.port, "PATCH", "\(k).json?ns=t", headers: owner, json: #"{"a": null, "b/c": null}"#).status
            default:
                let body = #"{"client": "0123456789abcdef0123456789abcdef", "acked": 0, "writes": [{"id": 1, "op": "set", "path": "\#(k)/a/b", "data": null}]}"#
                status = try TestHTTP.request(server.port, "POST", "/.ferry/batch.json?ns=t", headers: owner, json: body).status
            }
            #expect(status == 200, "\(form)")
            #expect(try serverValue(server.port, k) == "x", "\(form) below a leaf removed it")
        }
        // A Ferry client writing the same keeps the same.
        let a = try await Client(dir.sub("a"), port: server.port)
        await a.sync.goOnline()
        let k = try a.db.reference("c")
        _ = try await k.setValue("x").serverAcknowledgement()
        _ = try await k.child("a").removeValue().serverAcknowledgement()
        _ = try await k.updateChildValues(["a/b": .null]).serverAcknowledgement()
        #expect(try await a.db.reference("c").getData().value == "x")
        #expect(try serverValue(server.port, "/c") == "x")
        try await a.close()
        #expect(server.terminate() == 0)
    }

    /// Two clients doing random sets, updates, removals, increments and transactions, each
    /// going offline and online at random, end with the server's data, for many seeds.
    @Test(arguments: 0..<8)
    func twoClientsDoingRandomOperationsWhileTogglingOnlineEndWithTheServersData(seed: Int) async throws {
        let dir = try TemporaryDirectory("converge-\(seed)")
        let server = try ServerProcess(data: dir.sub("server"))
        let clients = [try await Client(dir.sub("a"), port: server.port), try await Client(dir.sub("b"), port: server.port)]
        let views = FerryMutex<[Int: Value]>([:])
        var handles: [(DatabaseReference, ObserverHandle)] = []
        for (i, c) in clients.enumerated() {
            let r = try c.db.reference("r")
            handles.append((r, r.observe(.value) { s in views.withLock { $0[i] = s.value } }))
            await c.sync.goOnline()
        }
        var rng = SplitMix(seed: UInt64(seed) &* 7919 &+ 17)
        func pick<T>(_ list: [T]) -> T { list[Int(rng.next() % UInt64(list.count))] }
        func path(_ depth: Int) -> String { (0..<depth).map { _ in pick(["a", "b"]) }.joined(separator: "/") }
        func leaf() -> Value { pick([.string("x"), .int(Int64(rng.next() % 4)), .bool(false), .null]) }
        func value() -> Value { rng.next() % 3 == 0 ? .object(["a": leaf(), "b": leaf()]) : leaf() }
        var online = [true, true]
        var log: [String] = []
        // Every 40 operations, both clients online and their writes answered: all three agree.
        func converged(_ step: Int) async throws {
            for (i, c) in clients.enumerated() {
                await c.sync.goOnline()
                online[i] = true
                try await c.db.waitForPendingWrites()
            }
            let truth = try serverValue(server.port, "/r") ?? .null
            let agreed = await eventually { views.withLock { $0[0] == truth && $0[1] == truth } }
            var caches: [String] = []
            if !agreed { for c in clients { caches.append(try await c.db.reference("r").getData().value.json) } }
            #expect(agreed, """
                seed \(seed) step \(step): server \(truth.json), listeners \(views.withLock { $0[0] }?.json ?? "-") and \(views.withLock { $0[1] }?.json ?? "-"), caches \(caches)
                \(log.suffix(40).joined(separator: "\n"))
                """)
        }
        for step in 1...200 {
            if step % 40 == 0 { try await converged(step) }
            let i = Int(rng.next() % 2)
            let c = clients[i]
            let at = try c.db.reference("r/" + path(1 + Int(rng.next() % 3)))
            switch rng.next() % 8 {
            case 0:
                online[i].toggle()
                log.append("\(i) \(online[i] ? "online" : "offline")")
                if online[i] { await c.sync.goOnline() } else { await c.sync.goOffline() }
            case 1:
                log.append("\(i) remove \(at.path)")
                _ = try await at.removeValue()
            case 2:
                let children = rng.next() % 2 == 0 ? ["a": leaf(), "b/a": leaf()] : ["b": value()]
                log.append("\(i) update \(at.path) \(Value.object(children).json)")
                _ = try await at.updateChildValues(children)
            case 3:
                log.append("\(i) increment \(at.path)")
                _ = try await at.setValue(ServerValue.increment(1))
            case 4:
                log.append("\(i) transaction \(at.path)")
                _ = try await at.runTransaction { data in
                    if case .int(let n) = data.value { data.value = .int(n + 1) } else { data.value = 1 }
                    return .commit
                }
            default:
                let v = value()
                log.append("\(i) set \(at.path) \(v.json)")
                _ = try await at.setValue(v)
            }
        }
        try await converged(200)
        for (r, h) in handles { r.removeObserver(withHandle: h) }
        for c in clients { try await c.close() }
        #expect(server.terminate() == 0)
    }
}

extension ConvergenceTests {
    /// The server stores each group of writes as folded records (one per run of up to 1,000
    /// writes, stored while the next are decided); restarted — cleanly or after kill -9 — it
    /// reads back exactly the data it served, over random batches (one of 2,500 writes each
    /// round) that write above, below and beside one another, below leaves and at them.
    @Test func theServerReadsBackAfterARestartExactlyWhatItServed() async throws {
        let dir = try TemporaryDirectory("converge-restart")
        var server = try ServerProcess(data: dir.sub("server"))
        let port = server.port
        var rng = SplitMix(seed: 0xBA7C4)
        func pick() -> String { ["a", "b", "c"][Int(rng.next() % 3)] }
        var id: Int64 = 0
        for round in 0..<6 {
            for b in 0..<20 {
                var writes: [Value] = []
                for _ in 0..<(b == 10 ? 2_500 : Int(1 + rng.next() % 12)) {
                    id += 1
                    let path = "/" + (0..<Int(1 + rng.next() % 3)).map { _ in pick() }.joined(separator: "/")
                    let value: Value = [.null, .int(Int64(rng.next() % 9)), ["c": .string(pick()), "a": 1], "x", ServerValue.increment(1)][Int(rng.next() % 5)]
                    if rng.next() % 3 == 0 {
                        writes.append(["id": .int(id), "op": "update", "path": .string(path), "data": [pick(): value, "\(pick())/\(pick())x": value]])
                    } else {
                        writes.append(["id": .int(id), "op": "set", "path": .string(path), "data": value])
                    }
                }
                let batch: Value = ["client": "0123456789abcdef0123456789abcdef", "acked": .int(id), "writes": .array(writes)]
                #expect(try TestHTTP.request(port, "POST", "/.ferry/batch.json?ns=t", json: batch.json).status == 200)
            }
            let served = try serverValue(port, "/")
            if round % 2 == 1 { server.kill9() } else { #expect(server.terminate() == 0) }
            server = try ServerProcess(data: dir.sub("server"), port: port)
            #expect(try serverValue(port, "/") == served, "round \(round)")
        }
        #expect(server.terminate() == 0)
    }
}
