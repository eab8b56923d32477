@_spi(Server) import Ferry
import FerryLog
import FerrySync
import FerryTestSupport
import Foundation
import Testing

/// `ferry-server --postgres`: the suites that run against the Ferry store backend, and what only
/// several servers over one database can show.
@Suite struct PostgresBackendTests {
    // One case at a time, each in a database of its own.
    @Test(.serialized, arguments: SyncSuiteCase.allCases)
    func theSyncSuitePassesWithTheNamespacesInPostgreSQL(_ test: SyncSuiteCase) async throws {
        try await ServerBackend.$postgres.withValue(try TestPostgres.newDatabase()) { try await test.run() }
    }

    @Test func firebaseAdminGetsWhatItExpectsWithTheNamespacesInPostgreSQL() throws {
        try ServerBackend.$postgres.withValue(try TestPostgres.newDatabase()) {
            try FirebaseAdminTests().firebaseAdminGetsWhatItExpectsFromEveryCall()
        }
    }

    @Test func aListenerOnOneServerSeesAnotherServersWritesInCommitOrder() async throws {
        let dir = try TemporaryDirectory("pg-two-servers")
        try await ServerBackend.$postgres.withValue(try TestPostgres.newDatabase()) {
            let s1 = try ServerProcess(data: dir.sub("s1")), s2 = try ServerProcess(data: dir.sub("s2"))
            let a = try await Client(dir.sub("a"), port: s1.port), b = try await Client(dir.sub("b"), port: s2.port)
            await a.sync.goOnline()
            await b.sync.goOnline()
            let listener = try TopicListener(b.db, "room")
            let n = 200
            var last: WriteReceipt?
            for i in 1...n { last = try a.db.reference("room/topic").setValueNow(.int(Int64(i))) }
            try await last!.serverAcknowledgement()
            #expect(await eventually { listener.shown.last == .int(Int64(n)) })
            // B's listener went only forward: every value it showed after A's first is larger than the one before.
            let numbers = listener.shown.compactMap { if case .int(let v) = $0 { v } else { nil } }
            #expect(numbers == numbers.sorted() && Set(numbers).count == numbers.count, "went back: \(numbers)")
            #expect(try serverValue(s2.port, "/room/topic") == .int(Int64(n)))
            listener.stop()
            try await a.close()
            try await b.close()
            #expect(s1.terminate() == 0)
            #expect(s2.terminate() == 0)
        }
    }

    @Test func incrementsResentThroughASecondServerAfterTheFirstIsKilledMidBatchAreCountedOnce() async throws {
        let dir = try TemporaryDirectory("pg-failover")
        try await ServerBackend.$postgres.withValue(try TestPostgres.newDatabase()) {
            let s1 = try ServerProcess(data: dir.sub("s1")), s2 = try ServerProcess(data: dir.sub("s2"))
            var a = try await Client(dir.sub("a"), port: s1.port)
            let n = 600
            // Queued offline, then sent in batches: the server is killed while they go.
            var last: WriteReceipt?
            for i in 0..<n { last = try a.db.root.updateChildValuesNow(["count": [".sv": ["increment": 1]], "items/i\(i)": .int(Int64(i))]) }
            await a.sync.goOnline()
            #expect(await eventually { a.db.acknowledgedThrough > 0 })
            s1.kill9()
            // The same store, now through the second server: the writes not acknowledged go again.
            await a.sync.close()
            try await a.db.close()
            a = try await Client(dir.sub("a"), port: s2.port)
            await a.sync.goOnline()
            try await last!.durable()
            #expect(await eventually { a.db.pendingWriteCount == 0 })
            #expect(try serverValue(s2.port, "/count") == .int(Int64(n)))
            guard case .object(let items)? = try serverValue(s2.port, "/items") else { Issue.record("no items"); return }
            #expect(items.count == n)
            try await a.close()
            #expect(s2.terminate() == 0)
        }
    }

    @Test func writesGoingOnWhilePostgreSQLRestartsAreEachCountedOnceAndAllAcknowledged() async throws {
        let cluster = try TestPostgresCluster("pg-restart")
        let dir = try TemporaryDirectory("pg-restart-servers")
        try await ServerBackend.$postgres.withValue(try cluster.newDatabase()) {
            let server = try ServerProcess(data: dir.sub("s1"))
            let a = try await Client(dir.sub("a"), port: server.port)
            await a.sync.goOnline()
            let n = 400
            var receipts: [WriteReceipt] = []
            for i in 0..<n {
                receipts.append(try a.db.root.updateChildValuesNow(["count": [".sv": ["increment": 1]]]))
                if i == n / 4 {
                    #expect(await eventually { a.db.acknowledgedThrough > 0 })
                    try cluster.stop()
                }
                if i == n / 2 { try cluster.restart() }
            }
            var acknowledged = 0
            for r in receipts {
                try await r.serverAcknowledgement()
                acknowledged += 1
            }
            #expect(acknowledged == n)
            #expect(try serverValue(server.port, "/count") == .int(Int64(acknowledged)))
            try await a.close()
            #expect(server.terminate() == 0)
        }
    }

    @Test func aWriteReplacesOnlyTheRowsAtAndBelowItsLocationAndANewServerReadsThemBack() throws {
        let dir = try TemporaryDirectory("pg-rows")
        let url = try TestPostgres.newDatabase()
        try ServerBackend.$postgres.withValue(url) {
            let server = try ServerProcess(data: dir.sub("s1"))
            #expect(try TestHTTP.request(server.port, "PUT", "/.json?ns=t", json: #"{"a":{"x":1,"y":{"z":"deep"}},"ab":{"q":true},"b":[1,2]}"#).status == 200)
            #expect(try TestPostgresCluster.query(url, "SELECT path, value FROM ferry_data WHERE ns = 't' ORDER BY path")
                    == ["a/x|1", "a/y/z|\"deep\"", "ab/q|true", "b/0|1", "b/1|2"])
            // A write at a: rows at and below a go and come; ab's (a's prefix, not below it) stay.
            #expect(try TestHTTP.request(server.port, "PUT", "/a.json?ns=t", json: #"{"w":2}"#).status == 200)
            // A write below a leaf replaces the leaf's row.
            #expect(try TestHTTP.request(server.port, "PUT", "/b/0/c.json?ns=t", json: #""c""#).status == 200)
            #expect(try TestPostgresCluster.query(url, "SELECT path, value FROM ferry_data WHERE ns = 't' ORDER BY path")
                    == ["a/w|2", "ab/q|true", "b/0/c|\"c\"", "b/1|2"])
            #expect(try TestPostgresCluster.query(url, "SELECT commit FROM ferry_namespaces WHERE ns = 't'") == ["3"])
            #expect(server.terminate() == 0)
            // A new server reads the rows back as the tree they make.
            let again = try ServerProcess(data: dir.sub("s2"))
            #expect(try serverValue(again.port, "/") == ["a": ["w": 2], "ab": ["q": true], "b": ["0": ["c": "c"], "1": 2]])
            #expect(again.terminate() == 0)
        }
    }
}

extension PostgresBackendTests {
    /// A's server dies with A still running: once the server's lease expires, the other server
    /// runs A's registration, and nothing of it is left to run again.
    @Test func theOnDisconnectWritesOfAClientWhoseServerIsKilledRunOnceThroughAnotherServer() async throws {
        let dir = try TemporaryDirectory("pg-presence")
        let url = try TestPostgres.newDatabase()
        try await ServerBackend.$postgres.withValue(url) {
            let s1 = try ServerProcess(data: dir.sub("s1"), ["--presence-timeout", "2"])
            let s2 = try ServerProcess(data: dir.sub("s2"), ["--presence-timeout", "2"])
            let a = try PresenceTests.presentClient(dir, port: s1.port)
            let b = try await PresenceTests.Watcher(dir, port: s2.port)
            #expect(await eventually { b.last == "online" })
            #expect(try TestPostgresCluster.query(url, "SELECT count(*) FROM ferry_meta WHERE path LIKE 'meta/owners/%' AND value <> 'null'") == ["1"])
            s1.kill9()
            #expect(await eventually { b.last == .null }, "B saw \(b.shown)")
            #expect(try serverValue(s2.port, "/status/A") == .null)
            func kept() throws -> Value? { try TestHTTP.request(s2.port, "GET", "/.ferry/presence.json?ns=t", headers: ["Authorization": "Bearer owner"]).json }
            #expect(await eventually { (try? kept()) == [:] })
            #expect(try TestPostgresCluster.query(url, "SELECT count(*) FROM ferry_meta WHERE path LIKE 'meta/owners/%' AND value <> 'null'") == ["0"])
            a.kill9()
            try await b.client.close()
            #expect(s2.terminate() == 0)
        }
    }
}

extension PostgresBackendTests {
    /// A listener's stream through server 1 resumes through server 2 after server 1 dies: the
    /// commit numbers and the namespace's epoch are the database's, so server 2 sends only what
    /// changed since the last commit the client applied.
    @Test func aStreamResumesThroughAnotherServerAfterItsServerIsKilled() async throws {
        let dir = try TemporaryDirectory("pg-resume")
        try await ServerBackend.$postgres.withValue(try TestPostgres.newDatabase()) {
            let s1 = try ServerProcess(data: dir.sub("s1")), s2 = try ServerProcess(data: dir.sub("s2"))
            let proxy = try CuttingProxy(to: s1.port)
            let (a, last, handle) = try await ResumeTests.itemsListenedThenOffline(dir, port: s1.port, proxy: proxy)
            // Away: changes through server 2, and server 1 is killed.
            for i in 0..<5 { _ = try TestHTTP.request(s2.port, "PUT", "/items/c\(i)/n.json?ns=t", json: "-1") }
            _ = try TestHTTP.request(s2.port, "PATCH", "/items.json?ns=t", json: #"{"c10/n": -2, "c11": null, "new": {"n": 1000}}"#)
            s1.kill9()
            _ = try TestHTTP.request(s2.port, "DELETE", "/items/c199.json?ns=t")
            let truth = try #require(try serverValue(s2.port, "/items"))
            proxy.retarget(to: s2.port)
            await a.sync.goOnline()
            #expect(await eventually { last.value?.metadata.fromCache == false })
            #expect(last.value?.value == truth, "current once caught up")
            #expect(proxy.resumedStream(after: 200, through: 207), "\(proxy.streams.map { ($0.request, $0.answer) })")
            try a.db.reference("items").removeObserver(withHandle: handle)
            try await a.close()
            proxy.stop()
            #expect(s2.terminate() == 0)
        }
    }
}

extension PostgresBackendTests {
    /// PostgreSQL keeps its connections and answers nothing: writes and reads are answered 503
    /// after `--storage-timeout`, not held; once it answers again, writes go through.
    @Test func whilePostgreSQLAnswersNothingRequestsAre503AndWritesGoThroughOnceItAnswers() async throws {
        let cluster = try TestPostgresCluster("pg-frozen")
        let dir = try TemporaryDirectory("pg-frozen-server")
        try await ServerBackend.$postgres.withValue(try cluster.newDatabase()) {
            let server = try ServerProcess(data: dir.sub("s1"), ["--storage-timeout", "1"])
            #expect(try TestHTTP.request(server.port, "PUT", "/a.json?ns=t", json: "1").status == 200)
            try cluster.signalAll("STOP")
            let write = try TestHTTP.request(server.port, "PUT", "/a.json?ns=t", json: "2")
            let read = try TestHTTP.request(server.port, "GET", "/a.json?ns=t")
            try cluster.signalAll("CONT")
            #expect(write.status == 503, "\(write.status) \(write.text)")
            #expect(read.status == 503, "\(read.status) \(read.text)")
            #expect(await eventually { (try? TestHTTP.request(server.port, "PUT", "/a.json?ns=t", json: "3"))?.status == 200 })
            #expect(try serverValue(server.port, "/a") == 3)
            #expect(server.terminate() == 0)
        }
    }
}
