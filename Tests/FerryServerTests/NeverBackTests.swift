@testable @_spi(Server) import Ferry
import FerryLog
import FerrySync
import FerryTestSupport
import FerryWire
import Foundation
import Testing

/// With `ferry-server`, which numbers its commits, a listener never shows a value go back: an
/// answer is applied only once every stream covering the location has reached the answer's
/// commit. These script the three ways it went back before: a listen still connecting when
/// the answer came, writes to one location in flight one after another, limited queries.
@Suite struct NeverBackTests {
    /// The story's reconnect: listeners on `/posts` and on a limited query, attached offline,
    /// with posts written offline; once online, the number of posts they show never goes down.
    @Test(arguments: [3, 20, 100])
    func listenersAttachedOfflineNeverShowFewerPostsOnceOnline(posts: Int) async throws {
        let dir = try TemporaryDirectory("never-back-\(posts)")
        let server = try ServerProcess(data: dir.sub("server"))
        let a = try await Client(dir.sub("a"), port: server.port)
        struct Seen: Sendable { var all: [Int] = [], limited: [Int] = [], allCached = true, limitedCached = true }
        let counts = FerryMutex(Seen())
        let ref = try a.db.reference("posts")
        let all = ref.observe(.value, includeMetadataChanges: true) { s in
            counts.withLock { seen in
                seen.all.append(Int(s.childrenCount))
                seen.allCached = s.metadata.fromCache
            }
        }
        let query = try ref.queryLimited(toLast: 10)
        let limited = query.observe(.value, includeMetadataChanges: true) { s in
            counts.withLock { seen in
                seen.limited.append(Int(s.childrenCount))
                seen.limitedCached = s.metadata.fromCache
            }
        }
        for i in 0..<posts {
            _ = try await ref.childByAutoId().setValue(["title": .string("post \(i)")])
        }
        await a.sync.goOnline()
        try await a.db.waitForPendingWrites()
        #expect(await eventually {
            counts.withLock { $0.all.last == posts && $0.limited.last == min(posts, 10) && !$0.allCached && !$0.limitedCached }
        }, "\(counts.withLock { $0 })")
        let seen = counts.withLock { $0 }
        #expect(zip(seen.all, seen.all.dropFirst()).allSatisfy { $0 <= $1 }, "the listener of /posts showed \(seen.all)")
        #expect(zip(seen.limited, seen.limited.dropFirst()).allSatisfy { $0 <= $1 }, "the limited query showed \(seen.limited)")
        ref.removeObserver(withHandle: all)
        query.removeObserver(withHandle: limited)
        try await a.close()
        #expect(server.terminate() == 0)
    }

    /// Two clients write one location in turn, both listening: each listener's values are
    /// server states and its own pending writes, in order — never older than one it showed.
    @Test func twoClientsWritingOneLocationInTurnNeverSeeItGoBack() async throws {
        let dir = try TemporaryDirectory("never-back-turns")
        let server = try ServerProcess(data: dir.sub("server"))
        let clients = [try await Client(dir.sub("a"), port: server.port), try await Client(dir.sub("b"), port: server.port)]
        let shown = FerryMutex<[[Int64]]>([[], []])
        var handles: [(DatabaseQuery, ObserverHandle)] = []
        for (i, c) in clients.enumerated() {
            // A listen on the location and a limited query above it, so that both kinds apply
            // the same commits.
            let q = try c.db.reference("turns").queryLimited(toLast: 5)
            handles.append((q, q.observe(.value) { _ in }))
            let loc = try c.db.reference("turns/n").query
            handles.append((loc, loc.observe(.value) { s in
                if case .int(let n) = s.value { shown.withLock { $0[i].append(n) } }
            }))
            await c.sync.goOnline()
        }
        // Each turn, one client writes three values in a row, in flight one after another;
        // the other's turn starts once the last is answered (so the server's order is n's).
        var n: Int64 = 0
        for turn in 0..<20 {
            let c = clients[turn % 2]
            var receipt: WriteReceipt?
            for _ in 0..<3 {
                n += 1
                receipt = try await c.db.reference("turns/n").setValue(.int(n))
            }
            _ = try await receipt!.serverAcknowledgement()
        }
        let rounds = n
        for c in clients { try await c.db.waitForPendingWrites() }
        #expect(await eventually { shown.withLock { $0[0].last == rounds && $0[1].last == rounds } })
        for (i, values) in shown.withLock({ $0 }).enumerated() {
            #expect(zip(values, values.dropFirst()).allSatisfy { $0 <= $1 }, "listener \(i) showed \(values)")
        }
        for (q, h) in handles { q.removeObserver(withHandle: h) }
        for c in clients { try await c.close() }
        #expect(server.terminate() == 0)
    }

    /// The numbered rule, scripted: a listen's first put from before the write (commit 5),
    /// then another client's write to the same location (commit 6, after the answer came),
    /// are no events of the write (commit 7): the acknowledgement waits for the stream to
    /// reach 7, so the listener never shows the other client's older value over its own.
    @Test func anAnswerWaitsForItsCommitNotForAnyEventAtItsLocation() async throws {
        let dir = try TemporaryDirectory("never-back-scripted")
        final class Box: @unchecked Sendable { var server: ScriptedServer? }
        let box = Box()
        let client = FerryMutex<Database?>(nil)
        let shown = FerryMutex<[Int64]>([])
        let other = FerryMutex(false)
        let info = #"{"server": "ferry-server", "protocol": 1, "idempotent": true, "batch": false, "commits": true, "maxBatchWrites": 1, "maxBatchBytes": 100000}"#
        let server = try ScriptedServer(holdOpen: { $0.hasPrefix("GET /stats") }) { line in
            if line.contains("ferry/info") { return ScriptedServer.http(200, info) }
            if line.hasPrefix("GET /stats") { return ScriptedServer.stream() }
            if line.hasPrefix("PUT /stats/count") {
                // The data as the server found it on taking the listen (commit 5), before the write.
                box.server?.push(ScriptedServer.put("/", #"{"count": 0}"#, id: 5))
                _ = eventuallyOnThisThread { !shown.withLock { $0.isEmpty } }
                DispatchQueue.global().async {
                    // Once the client has read the answer: another client's write, older than
                    // this one (6), shown once it is applied (`other`); then this write's (7).
                    _ = eventuallyOnThisThread { (client.withLock { $0 }?.engine.withLock { $0.serverStatus.timeOffset } ?? 0) > 43_200_000 }
                    box.server?.push(ScriptedServer.put("/", #"{"count": 0, "other": true}"#, id: 6))
                    _ = eventuallyOnThisThread { other.withLock { $0 } }
                    box.server?.push(ScriptedServer.put("/count", "1", id: 7))
                }
                let dayAhead = Int64(Date().timeIntervalSince1970 * 1000) + 86_400_000
                return ScriptedServer.http(200, "", headers: [WireHeader.serverTime: String(dayAhead), "X-Ferry-Commit": "7"])
            }
            return ScriptedServer.http(200, "null")
        }
        box.server = server
        let a = try await Client(dir.sub("a"), port: server.port, batches: false)
        client.withLock { $0 = a.db }
        await a.sync.goOnline()
        let handle = try a.db.reference("stats").observe(.value, includeMetadataChanges: true) { s in
            if case .int(let n) = s.childSnapshot(forPath: "count").value { shown.withLock { $0.append(n) } }
            if s.childSnapshot(forPath: "other").exists { other.withLock { $0 = true } }
        }
        #expect(await eventually { server.requests.contains { $0.hasPrefix("GET /stats") } })
        let receipt = try await a.db.reference("stats/count").setValue(1)
        _ = try await receipt.serverAcknowledgement()
        let values = shown.withLock { $0 }
        #expect(other.withLock { $0 }, "acknowledged only after the stream passed commit 6")
        #expect(!values.isEmpty && values.allSatisfy { $0 == 1 }, "the listener saw \(values)")
        #expect(try await a.db.reference("stats/count").getData().value == 1)
        try a.db.reference("stats").removeObserver(withHandle: handle)
        try await a.close()
        server.stop()
    }
}
