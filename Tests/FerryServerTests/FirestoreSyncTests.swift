import FerryDocuments
import FerryDocumentsSync
import FerryTestSupport
import Foundation
import Synchronization
import Testing

/// Ferry's document store connected to `ferry-server`'s Firestore API.
@Suite struct FirestoreSyncTests {
    /// A store in `dir`, connected to the server.
    static func connected(_ dir: TemporaryDirectory, _ name: String, _ server: ServerProcess, project: String = "sync-test") throws -> (Firestore, FirestoreConnection) {
        let db = try Firestore.open(at: dir.sub(name))
        let c = try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: server.firestorePort!, project: project))
        return (db, c)
    }

    @Test func oneStoresWritesReachAnotherStoresListenerThroughTheServer() async throws {
        let dir = try TemporaryDirectory("firestore-sync")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (a, ca) = try Self.connected(dir, "a", server)
        let (b, cb) = try Self.connected(dir, "b", server)
        let seen = Mutex<[(names: [String], fromCache: Bool)]>([])
        let reg = b.collection("cities").addSnapshotListener { snap, _ in
            guard let snap else { return }
            seen.withLock { $0.append((snap.documents.map(\.documentID).sorted(), snap.metadata.isFromCache)) }
        }
        // B's listener hears the server: an empty, current result first.
        #expect(await eventually { seen.withLock { $0.contains { $0.names.isEmpty && !$0.fromCache } } })
        try await a.collection("cities").document("SF").setData(["name": "San Francisco", "population": 860_000])
        try await a.collection("cities").document("LA").setData(["name": "Los Angeles"])
        try await a.waitForPendingWrites()
        #expect(await eventually { seen.withLock { $0.last.map { $0.names == ["LA", "SF"] && !$0.fromCache } ?? false } })
        let doc = try await b.collection("cities").document("SF").getDocument(source: .cache)
        #expect(doc.data()?["population"] as? Int == 860_000)

        // A's updates with transforms, applied by the server once.
        try await a.collection("cities").document("SF").updateData(["population": FieldValue.increment(Int64(5))])
        try await a.waitForPendingWrites()
        #expect(await eventually { (try? await b.collection("cities").document("SF").getDocument(source: .cache).data()?["population"] as? Int) == 860_005 })
        reg.remove()
        await ca.close()
        await cb.close()
        try await a.terminate()
        try await b.terminate()
        #expect(server.terminate() == 0)
    }
}

extension FirestoreSyncTests {
    @Test func aListenerReopenedAfterARestartGetsOnlyWhatChanged() async throws {
        let dir = try TemporaryDirectory("firestore-restart-resume")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (writer, cw) = try Self.connected(dir, "writer", server)
        let batch = writer.batch()
        for i in 0..<100 { batch.setData(["i": i], forDocument: writer.collection("many").document("d\(i)")) }
        try await batch.commit()
        try await writer.waitForPendingWrites()

        func listenUntilSynced(_ db: Firestore, count: Int) async throws {
            let synced = Mutex(false)
            let reg = db.collection("many").addSnapshotListener { snap, _ in
                if let snap, !snap.metadata.isFromCache, snap.documents.count == count { synced.withLock { $0 = true } }
            }
            #expect(await eventually { synced.withLock { $0 } })
            reg.remove()
        }
        var (reader, cr) = try Self.connected(dir, "reader", server)
        try await listenUntilSynced(reader, count: 100)
        #expect(cr.statistics.documentsReceived == 100)
        await cr.close()
        try await reader.terminate()

        try await writer.collection("many").document("d7").updateData(["i": 700])
        try await writer.collection("many").document("new").setData(["i": 1000])
        try await writer.waitForPendingWrites()

        (reader, cr) = try Self.connected(dir, "reader", server)
        try await listenUntilSynced(reader, count: 101)
        #expect(cr.statistics.documentsReceived == 2, "a restarted store resumes its listen from the token it kept")
        #expect(try await reader.collection("many").document("d7").getDocument(source: .cache).data()?["i"] as? Int == 700)
        await cr.close()
        await cw.close()
        try await reader.terminate()
        try await writer.terminate()
        #expect(server.terminate() == 0)
    }
}

extension FirestoreSyncTests {
    @Test func aLimitedListenerReopenedAfterItsWindowChangedShowsTheNewWindow() async throws {
        let dir = try TemporaryDirectory("firestore-limit-resume")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (writer, cw) = try Self.connected(dir, "writer", server)
        for (id, n) in [("a", 1), ("b", 2), ("c", 3)] { try await writer.collection("w").document(id).setData(["n": n]) }
        try await writer.waitForPendingWrites()
        let query = { (db: Firestore) in db.collection("w").order(by: "n").limit(to: 2) }
        func shown(_ db: Firestore, until expected: [String]) async throws -> Bool {
            let last = Mutex<[String]?>(nil)
            let failed = Mutex(false)
            let reg = query(db).addSnapshotListener { snap, error in
                if error != nil { failed.withLock { $0 = true } }
                if let snap, !snap.metadata.isFromCache { last.withLock { $0 = snap.documents.map(\.documentID) } }
            }
            let ok = await eventually { last.withLock { $0 } == expected || failed.withLock { $0 } }
            reg.remove()
            return ok && !failed.withLock { $0 }
        }
        var (reader, cr) = try Self.connected(dir, "reader", server)
        #expect(try await shown(reader, until: ["a", "b"]))
        await cr.close()
        try await reader.terminate()
        // b leaves the window and c slides in without changing.
        try await writer.collection("w").document("b").delete()
        try await writer.waitForPendingWrites()
        (reader, cr) = try Self.connected(dir, "reader", server)
        #expect(try await shown(reader, until: ["a", "c"]), "the listener must show the new window, without an error")
        #expect(throws: FirestoreErrorCode.self) { _ = try FirestoreConnection.connect(reader, to: .init(host: "127.0.0.1", port: server.firestorePort!, project: "sync-test")) }
        await cr.close()
        await cw.close()
        try await reader.terminate()
        try await writer.terminate()
        #expect(server.terminate() == 0)
    }
}

/// Exactly once, with real processes: a client killed with kill -9 (at random moments, and
/// right after the server answered), and the server killed mid-sync.
@Suite struct FirestoreExactlyOnceTests {
    /// What the server holds: the ids in `log`, and `counters/c.n` (each batch wrote one of each).
    static func serverState(_ dir: TemporaryDirectory, _ server: ServerProcess) async throws -> (ids: Set<Int>, counter: Int) {
        let db = try Firestore.open(at: dir.sub("reader-\(UUID().uuidString)"))
        let c = try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: server.firestorePort!, project: "exactly-once"))
        let ids = Mutex<Set<Int>?>(nil)
        let counter = Mutex<Int?>(nil)
        let r1 = db.collection("log").addSnapshotListener { snap, _ in
            guard let snap, !snap.metadata.isFromCache else { return }
            ids.withLock { $0 = Set(snap.documents.compactMap { $0.data()["i"] as? Int }) }
        }
        let r2 = db.collection("counters").document("c").addSnapshotListener { snap, _ in
            guard let snap, !snap.metadata.isFromCache else { return }
            counter.withLock { $0 = snap.data()?["n"] as? Int ?? 0 }
        }
        #expect(await eventually { ids.withLock { $0 } != nil && counter.withLock { $0 } != nil })
        r1.remove()
        r2.remove()
        await c.close()
        try await db.terminate()
        return (ids.withLock { $0 } ?? [], counter.withLock { $0 } ?? -1)
    }

    /// Waits for the child's "drained" (killing it if it never comes, so the test ends).
    static func expectDrained(_ child: ChildProcess, timeout: Duration = .seconds(30)) async throws {
        let drained = await eventually(timeout: timeout) { child.outputLines.contains("drained") }
        #expect(drained, "the client never had every write answered")
        if !drained { child.kill9() }
        #expect(child.wait() == 0)
    }

    static func durable(_ child: ChildProcess) -> [Int] {
        child.outputLines.compactMap { $0.hasPrefix("durable ") ? Int($0.dropFirst(8)) : nil }
    }

    @Test func aClientKilledAtRandomMomentsCommitsEachDurableBatchExactlyOnce() async throws {
        let dir = try TemporaryDirectory("firestore-kill-client")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let port = String(server.firestorePort!)
        var rng = SplitMix(seed: 0xF1E57)
        var printed: [Int] = []
        for round in 0..<5 {
            let first = round * 1_000
            let child = try ChildProcess(Locations.executable("ferry-documents-child"), ["write", dir.sub("client"), port, String(first), "300"])
            let stopAfter = Int(rng.next() % 250) + 1
            #expect(await eventually { Self.durable(child).count >= stopAfter || child.outputLines.contains("drained") })
            child.kill9()
            _ = child.wait()
            printed += Self.durable(child)
        }
        let drain = try ChildProcess(Locations.executable("ferry-documents-child"), ["drain", dir.sub("client"), port])
        try await Self.expectDrained(drain)
        let (ids, counter) = try await Self.serverState(dir, server)
        #expect(Set(printed).isSubset(of: ids), "a batch durable on the client is missing on the server")
        #expect(counter == ids.count, "\(counter) increments for \(ids.count) batches: a batch was applied twice (or lost half)")
        #expect(server.terminate() == 0)
    }

    @Test func thousandsOfPendingBatchesDrainAfterAnOfflineRun() async throws {
        let dir = try TemporaryDirectory("firestore-many-pending")
        let db = try Firestore.open(at: dir.sub("client"))
        for i in 0..<3_000 {
            let batch = db.batch()
            batch.setData(["i": i], forDocument: db.collection("log").document("\(i)"))
            batch.setData(["n": FieldValue.increment(Int64(1))], forDocument: db.collection("counters").document("c"), merge: true)
            try await batch.commit()
        }
        try await db.terminate()
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let drain = try ChildProcess(Locations.executable("ferry-documents-child"), ["drain", dir.sub("client"), String(server.firestorePort!)])
        try await Self.expectDrained(drain, timeout: .seconds(120))
        let (ids, counter) = try await Self.serverState(dir, server)
        #expect(ids.count == 3_000)
        #expect(counter == 3_000)
        #expect(server.terminate() == 0)
    }

    @Test func aRefusedBatchWhoseAnswerWasLostIsRefusedAgainNotCommitted() async throws {
        let dir = try TemporaryDirectory("firestore-refused-lost")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let port = String(server.firestorePort!)
        // Both batches go in the first commit; the child dies once it is answered.
        let crashed = try ChildProcess(Locations.executable("ferry-documents-child"), ["refuse", dir.sub("client"), port],
                                       environment: ["FERRY_CRASH_AT": "documents.answered"])
        #expect(crashed.wait() != 0, "the crash point was not reached")
        #expect(!crashed.outputLines.contains("drained"))
        let drain = try ChildProcess(Locations.executable("ferry-documents-child"), ["drain", dir.sub("client"), port])
        try await Self.expectDrained(drain)
        #expect(drain.outputLines.contains("rejected 5"), "the refused batch, sent again, must be refused again (NOT_FOUND): \(drain.outputLines)")
        let (ids, counter) = try await Self.serverState(dir, server)
        #expect(ids == [0])
        #expect(counter == 1)
        #expect(server.terminate() == 0)
    }

    @Test func aClientKilledAfterTheServerAnsweredDoesNotCommitTwice() async throws {
        let dir = try TemporaryDirectory("firestore-crash-answered")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let port = String(server.firestorePort!)
        // Offline first, so that the batches are pending when the connection's first commit is answered.
        let crashed = try ChildProcess(Locations.executable("ferry-documents-child"), ["write", dir.sub("client"), port, "0", "50"],
                                       environment: ["FERRY_CRASH_AT": "documents.answered"])
        let status = crashed.wait()
        #expect(status != 0, "the crash point was not reached")
        let drain = try ChildProcess(Locations.executable("ferry-documents-child"), ["drain", dir.sub("client"), port])
        try await Self.expectDrained(drain)
        let (ids, counter) = try await Self.serverState(dir, server)
        #expect(Set(Self.durable(crashed)).isSubset(of: ids))
        #expect(!ids.isEmpty)
        #expect(counter == ids.count, "\(counter) increments for \(ids.count) batches: a batch answered before the crash was applied again")
        #expect(server.terminate() == 0)
    }

    @Test func theServerKilledMidSyncLosesNothingAndDoublesNothing() async throws {
        let dir = try TemporaryDirectory("firestore-kill-server")
        var server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let httpPort = server.port, firestorePort = server.firestorePort!
        let child = try ChildProcess(Locations.executable("ferry-documents-child"), ["write", dir.sub("client"), String(firestorePort), "0", "400"])
        for stop in [60, 200] {
            #expect(await eventually { Self.durable(child).count >= stop })
            server.kill9()
            server = try ServerProcess(data: dir.path, port: httpPort, ["--firestore-port", String(firestorePort)])
        }
        try await Self.expectDrained(child, timeout: .seconds(60))
        let (ids, counter) = try await Self.serverState(dir, server)
        #expect(ids == Set(0..<400))
        #expect(counter == 400)
        #expect(server.terminate() == 0)
    }
}

/// Reads from the server and transactions, through Ferry's client.
@Suite struct FirestoreOnlineTests {
    @Test func serverReadsSeeTheServerAndFailOrFallBackOffline() async throws {
        let dir = try TemporaryDirectory("firestore-online-reads")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (a, ca) = try FirestoreSyncTests.connected(dir, "a", server)
        let (b, cb) = try FirestoreSyncTests.connected(dir, "b", server)
        try await a.collection("items").document("one").setData(["n": 1])
        try await a.collection("items").document("two").setData(["n": 2])
        try await a.waitForPendingWrites()

        // B has nothing cached: the server answers.
        let one = try await b.collection("items").document("one").getDocument(source: .server)
        #expect(one.exists && !one.metadata.isFromCache)
        #expect(one.data()?["n"] as? Int == 1)
        #expect(try await b.collection("items").document("nope").getDocument(source: .server).exists == false)
        let all = try await b.collection("items").order(by: "n", descending: true).getDocuments(source: .server)
        #expect(all.documents.map(\.documentID) == ["two", "one"])
        #expect(!all.metadata.isFromCache)
        let last = try await b.collection("items").order(by: "n").limit(toLast: 1).getDocuments(source: .server)
        #expect(last.documents.map(\.documentID) == ["two"])

        // .default online, with a pending write of B's own applied over the server's answer.
        await cb.close()
        try await b.collection("items").document("three").setData(["n": 3])
        let cb2 = try FirestoreConnection.connect(b, to: .init(host: "127.0.0.1", port: server.firestorePort!, project: "sync-test"))
        let withPending = try await b.collection("items").order(by: "n").getDocuments()
        #expect(withPending.documents.map(\.documentID).contains("three"))

        // Offline: .server fails, .default answers from the cache.
        await b.disableNetwork()
        await #expect(throws: FirestoreErrorCode.self) { _ = try await b.collection("items").document("one").getDocument(source: .server) }
        let cached = try await b.collection("items").document("three").getDocument()
        #expect(cached.metadata.isFromCache)
        await b.enableNetwork()

        await ca.close()
        await cb2.close()
        try await a.terminate()
        try await b.terminate()
        #expect(server.terminate() == 0)
    }

    @Test func contendedTransactionsFromTwoStoresCountEachIncrementOnce() async throws {
        let dir = try TemporaryDirectory("firestore-transactions")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (a, ca) = try FirestoreSyncTests.connected(dir, "a", server)
        let (b, cb) = try FirestoreSyncTests.connected(dir, "b", server)
        try await a.collection("counters").document("c").setData(["n": 0])
        try await a.waitForPendingWrites()
        try await withThrowingTaskGroup(of: Void.self) { group in
            for db in [a, b, a, b] {
                group.addTask {
                    var done = 0
                    while done < 10 {
                        do {
                            try await db.runTransaction { t in
                                let ref = db.collection("counters").document("c")
                                let n = try await t.getDocument(ref).data()?["n"] as? Int ?? 0
                                t.updateData(["n": n + 1], forDocument: ref)
                            }
                            done += 1
                        } catch let e as FirestoreErrorCode where e.code == .aborted {
                            continue  // five aborts in a row: run it again
                        }
                    }
                }
            }
            try await group.waitForAll()
        }
        let final = try await b.collection("counters").document("c").getDocument(source: .server)
        #expect(final.data()?["n"] as? Int == 40)

        // A read after a write is refused, and nothing is committed.
        await #expect(throws: FirestoreErrorCode.self) {
            try await a.runTransaction { t in
                let ref = a.collection("counters").document("c")
                t.setData(["n": -1], forDocument: ref)
                _ = try await t.getDocument(ref)
            }
        }
        #expect(try await b.collection("counters").document("c").getDocument(source: .server).data()?["n"] as? Int == 40)
        await ca.close()
        await cb.close()
        try await a.terminate()
        try await b.terminate()
        #expect(server.terminate() == 0)
    }
}

extension FirestoreOnlineTests {
    @Test func aBatchTheServerRefusesIsRevertedListedAndSurvivesARestartUntilCleared() async throws {
        let dir = try TemporaryDirectory("firestore-rejected")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        var (a, ca) = try FirestoreSyncTests.connected(dir, "a", server)
        let (b, cb) = try FirestoreSyncTests.connected(dir, "b", server)
        let ref = a.collection("things").document("x")
        try await ref.setData(["n": 1])
        try await a.waitForPendingWrites()

        // A updates x offline while B deletes it on the server: the server refuses A's update.
        await a.disableNetwork()
        try await ref.updateData(["n": 2])
        #expect(try await ref.getDocument(source: .cache).data()?["n"] as? Int == 2)
        try await b.collection("things").document("x").delete()
        try await b.waitForPendingWrites()
        await a.enableNetwork()
        // As Firebase's: the wait ends with the answer, a refusal included; the refusal is listed.
        try await a.waitForPendingWrites()
        let rejected = try a.rejectedWrites()
        #expect(rejected.count == 1)
        #expect(rejected.first?.documentPaths == ["things/x"])
        #expect(rejected.first?.error.code == .notFound)
        // Reverted: the cache no longer shows the update.
        #expect(await eventually { (try? await ref.getDocument(source: .cache).data()?["n"] as? Int) != 2 })

        // Kept across a restart, until cleared.
        await ca.close()
        try await a.terminate()
        a = try Firestore.open(at: dir.sub("a"))
        #expect(try a.rejectedWrites().map(\.error.code) == [.notFound])
        try await a.clearRejectedWrites()
        #expect(try a.rejectedWrites().isEmpty)
        try await a.terminate()
        a = try Firestore.open(at: dir.sub("a"))
        #expect(try a.rejectedWrites().isEmpty)
        try await a.terminate()
        await cb.close()
        try await b.terminate()
        _ = ca
        #expect(server.terminate() == 0)
    }
}

extension FirestoreSyncTests {
    /// A document the store shows but the server's target no longer holds ("limbo") is looked
    /// up on the server: deleted while the store was offline, it leaves the listener and the
    /// cache, and the window fills from the server.
    @Test func aDocumentDeletedWhileOfflineIsResolvedOutOfLimboByTheServer() async throws {
        let dir = try TemporaryDirectory("firestore-limbo")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (writer, cw) = try Self.connected(dir, "writer", server)
        for (id, n) in [("a", 1), ("b", 2), ("c", 3)] { try await writer.collection("w").document(id).setData(["n": n]) }
        try await writer.waitForPendingWrites()

        let (reader, cr) = try Self.connected(dir, "reader", server)
        let shown = Mutex<(ids: [String], fromCache: Bool)>(([], true))
        let reg = reader.collection("w").order(by: "n").limit(to: 2).addSnapshotListener(includeMetadataChanges: true) { snap, _ in
            if let snap { shown.withLock { $0 = (snap.documents.map(\.documentID), snap.metadata.isFromCache) } }
        }
        #expect(await eventually { shown.withLock { $0.ids == ["a", "b"] && !$0.fromCache } })

        await reader.disableNetwork()
        try await writer.collection("w").document("b").delete()
        try await writer.waitForPendingWrites()
        // Offline, the cache still shows b.
        #expect(try await reader.collection("w").document("b").getDocument(source: .cache).exists)

        await reader.enableNetwork()
        // The limited target is sent whole again (without b); b is looked up and found gone.
        #expect(await eventually { shown.withLock { $0.ids == ["a", "c"] && !$0.fromCache } })
        #expect(await eventually { (try? await reader.collection("w").document("b").getDocument(source: .cache))?.exists != true },
                "b, deleted on the server, must leave the cache once resolved")
        let cached = try await reader.collection("w").getDocuments(source: .cache).documents.map(\.documentID).sorted()
        #expect(cached == ["a", "c"])
        reg.remove()
        await cr.close()
        await cw.close()
        try await reader.terminate()
        try await writer.terminate()
        #expect(server.terminate() == 0)
    }
}

extension FirestoreSyncTests {
    /// A memory cache with eager collection keeps only what is listened to: once the listener
    /// goes, the server's documents leave the cache; a memory cache without it keeps them.
    @Test func anEagerMemoryCacheDropsTheServersDocumentsOnceNothingListens() async throws {
        let dir = try TemporaryDirectory("firestore-eager")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (writer, cw) = try Self.connected(dir, "writer", server)
        try await writer.collection("cities").document("SF").setData(["name": "San Francisco"])
        try await writer.waitForPendingWrites()

        var eagerSettings = FirestoreSettings(), keepingSettings = FirestoreSettings()
        eagerSettings.cacheSettings = .memoryEager
        keepingSettings.cacheSettings = .memory
        let eager = Firestore.inMemory(settings: eagerSettings), keeping = Firestore.inMemory(settings: keepingSettings)
        #expect(eager.settings.cacheSettings.isEager && !keeping.settings.cacheSettings.isEager)
        var connections: [FirestoreConnection] = []
        for db in [eager, keeping] {
            connections.append(try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: server.firestorePort!, project: "sync-test")))
            let live = Mutex(false)
            let reg = db.collection("cities").addSnapshotListener { snap, _ in
                if let snap, !snap.metadata.isFromCache, snap.documents.map(\.documentID) == ["SF"] { live.withLock { $0 = true } }
            }
            #expect(await eventually { live.withLock { $0 } }, "the listener got the server's documents")
            #expect(try await db.collection("cities").document("SF").getDocument(source: .cache).exists)
            reg.remove()
        }
        // Eager: the document left with the listener.
        #expect(await eventually { (try? await eager.collection("cities").document("SF").getDocument(source: .cache)) == nil })
        await #expect(throws: FirestoreErrorCode.self) { try await eager.collection("cities").document("SF").getDocument(source: .cache) }
        // Without eager collection, it stays.
        #expect(try await keeping.collection("cities").document("SF").getDocument(source: .cache).data()?["name"] as? String == "San Francisco")
        for c in connections { await c.close() }
        await cw.close()
        for db in [eager, keeping, writer] { try await db.terminate() }
        #expect(server.terminate() == 0)
    }
}

extension CacheSettings {
    var isEager: Bool { if case .memoryEager = self { true } else { false } }
}
