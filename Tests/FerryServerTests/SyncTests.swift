@_spi(Server) import Ferry
import FerrySync
import FerryTestSupport
import FerryWire
import Foundation
import Synchronization
import Testing

/// Waits (polling, up to 30 s) until `condition` holds; false if it never did. Not a timed
/// assertion: the bound only keeps a broken build from hanging the suite.
func eventually(_ what: String = "", _ condition: () async throws -> Bool) async rethrows -> Bool {
    for _ in 0..<1500 {
        if try await condition() { return true }
        try? await Task.sleep(for: .milliseconds(20))
    }
    return false
}

/// A Ferry client: a stored database and its sync client.
struct Client {
    let db: Database
    let sync: SyncClient

    init(_ path: String, port: Int, ns: String = "t", token: String? = nil, batches: Bool = true) async throws {
        db = try Database.open(at: path)
        var options = SyncOptions()
        options.usesBatches = batches
        options.retryDelay = .milliseconds(20)
        options.maxRetryDelay = .milliseconds(200)
        if let token { options.tokenProvider = { _ in token } }
        sync = try SyncClient(database: db, url: "http://127.0.0.1:\(port)?ns=\(ns)", options: options)
    }

    func close() async throws {
        await sync.close()
        try await db.close()
    }
}

func serverValue(_ port: Int, _ path: String, ns: String = "t") throws -> Value? {
    try TestHTTP.request(port, "GET", "\(path).json?ns=\(ns)", headers: ["Authorization": "Bearer owner"]).json
}

@Suite struct SyncTests {
    @Test func writesMadeOfflineReachTheServerInOrderWhenTheClientGoesOnline() async throws {
        let dir = try TemporaryDirectory("sync-basic")
        let server = try ServerProcess(data: dir.sub("server"))
        let a = try await Client(dir.sub("a"), port: server.port)
        let posts = try a.db.reference("posts")
        _ = try await posts.child("p1").setValue(["title": "Hi", "likes": 1])
        _ = try await posts.child("p2").setValue(["title": "Two"])
        _ = try await posts.updateChildValues(["p1/likes": 2, "p2": .null])
        let pushed = posts.childByAutoId()
        _ = try await pushed.setValue(["title": "pushed"])
        let last = try await a.db.reference("count").setValue([".sv": ["increment": 5]])
        #expect(a.db.pendingWriteCount == 5)

        await a.sync.goOnline()
        try await last.serverAcknowledgement()
        #expect(a.db.pendingWriteCount == 0)
        #expect(a.db.acknowledgedThrough == last.writeID)
        #expect(try serverValue(server.port, "/posts/p1") == ["title": "Hi", "likes": 2])
        #expect(try serverValue(server.port, "/posts/p2") == .null)
        #expect(try serverValue(server.port, "/posts/\(pushed.key!)") == ["title": "pushed"])
        #expect(try serverValue(server.port, "/count") == 5)
        try await a.close()
        #expect(server.terminate() == 0)
    }

    @Test func aListenerOfAnotherClientSeesWritesMadeOfflineByAClientThatWasKilledAndRestarted() async throws {
        let dir = try TemporaryDirectory("sync-killed")
        let server = try ServerProcess(data: dir.sub("server"))
        let url = "http://127.0.0.1:\(server.port)?ns=t"
        // A writes offline and is killed (its writes are durable: the child printed them).
        let writer = try ChildProcess(Locations.executable("ferry-sync-child"), ["write", dir.sub("a"), "5", "hold"])
        #expect(writer.waitForLine { $0 == "written" })
        writer.kill9()

        let b = try await Client(dir.sub("b"), port: server.port)
        await b.sync.goOnline()
        let posts = try b.db.reference("posts")
        let seen = Mutex<[DataSnapshot]>([])
        let handle = posts.observe(.value, includeMetadataChanges: true) { s in seen.withLock { $0.append(s) } }
        #expect(await eventually { seen.withLock { $0.last.map { !$0.metadata.fromCache } ?? false } })
        #expect(seen.withLock { $0.last?.value } == .null)

        // A restarts and goes online: B's listener sees A's writes, from the server.
        let restarted = try ChildProcess(Locations.executable("ferry-sync-child"), ["sync", dir.sub("a"), url])
        #expect(restarted.waitForLine { $0.hasPrefix("synced ") })
        #expect(restarted.wait() == 0)
        #expect(await eventually { seen.withLock { $0.last?.childrenCount } == 5 })
        let last = try #require(seen.withLock { $0.last })
        #expect(!last.metadata.fromCache && !last.metadata.hasPendingWrites)
        #expect(last.childSnapshot(forPath: "p4").value == ["n": 4])
        #expect(try serverValue(server.port, "/count") == 5)
        posts.removeObserver(withHandle: handle)
        try await b.close()
        #expect(server.terminate() == 0)
    }

    @Test func aClientKilledAfterTheServerAppliedItsWritesResendsThemAndEachIncrementCountsOnce() async throws {
        let dir = try TemporaryDirectory("sync-lost-ack")
        let server = try ServerProcess(data: dir.sub("server"))
        let url = "http://127.0.0.1:\(server.port)?ns=t"
        let writer = try ChildProcess(Locations.executable("ferry-sync-child"), ["write", dir.sub("a"), "7"])
        #expect(writer.wait() == 0)

        // The server applies the batch; the client dies before it records the answer.
        let crashed = try ChildProcess(Locations.executable("ferry-sync-child"), ["sync", dir.sub("a"), url],
                                       environment: ["FERRY_CRASH_AT": "sync.answered"])
        #expect(crashed.wait() != 0)
        #expect(!crashed.outputLines.contains { $0.hasPrefix("synced") })
        #expect(try serverValue(server.port, "/count") == 7)
        let reopened = try Database.open(at: dir.sub("a"))
        #expect(reopened.pendingWriteCount == 7)  // nothing recorded: all above the cursor
        try await reopened.close()

        // Restarted, it sends them all again; the server answers them as duplicates.
        let again = try ChildProcess(Locations.executable("ferry-sync-child"), ["sync", dir.sub("a"), url])
        #expect(again.waitForLine { $0.hasPrefix("synced ") })
        #expect(again.wait() == 0)
        #expect(try serverValue(server.port, "/count") == 7)
        guard case .object(let posts)? = try serverValue(server.port, "/posts") else { Issue.record("no posts on the server"); return }
        #expect(posts.count == 7)
        let db = try Database.open(at: dir.sub("a"))
        #expect(db.pendingWriteCount == 0)
        try await db.close()
        #expect(server.terminate() == 0)
    }
}

