import FerryDocuments
import FerryDocumentsSync
import FerryFirestoreWire
import FerryTestSupport
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import SwiftProtobuf
import Synchronization
import Testing

/// Firestore's semantics over the wire, each as a raw client sees it: transactions aborted on
/// conflict, aggregation aliases, masks and transforms, projects kept apart, and which changes
/// a limited listen is sent.
@Suite struct FirestoreSemanticsTests {
    static func document(_ fs: FS.Client<HTTP2ClientTransport.Posix>, _ path: String, transaction: Data? = nil,
                         database: String = RawFirestore.database) async throws -> Google_Firestore_V1_Document? {
        var get = Google_Firestore_V1_BatchGetDocumentsRequest()
        get.database = database
        get.documents = [database + "/documents/" + path]
        if let transaction { get.transaction = transaction }
        return try await fs.batchGetDocuments(request: ClientRequest(message: get)) { r in
            var found: Google_Firestore_V1_Document?
            for try await m in r.messages { if case .found(let d)? = m.result { found = d } }
            return found
        }
    }

    @Test func aTransactionWhoseReadChangedSinceIsAbortedAndNothingOfItIsCommitted() async throws {
        let dir = try TemporaryDirectory("firestore-abort")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        try await RawFirestore.with(server.firestorePort!) { fs, _ in
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("c/x", ["n": 1])]))
            var begin = Google_Firestore_V1_BeginTransactionRequest()
            begin.database = RawFirestore.database
            let transaction = try await fs.beginTransaction(begin).transaction
            #expect(try await Self.document(fs, "c/x", transaction: transaction)?.fields["n"]?.integerValue == 1)
            // Another client changes what the transaction read.
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("c/x", ["n": 10])]))
            var commit = RawFirestore.commit([RawFirestore.set("c/x", ["n": 2]), RawFirestore.set("c/y", ["n": 2])])
            commit.transaction = transaction
            let code = await FirestoreServerTests.code { _ = try await fs.commit(commit) }
            #expect(code == .aborted)
            #expect(try await Self.document(fs, "c/x")?.fields["n"]?.integerValue == 10)
            #expect(try await Self.document(fs, "c/y") == nil, "an aborted commit writes nothing")

            // Unchanged reads commit.
            let again = try await fs.beginTransaction(begin).transaction
            _ = try await Self.document(fs, "c/x", transaction: again)
            commit.transaction = again
            #expect(await FirestoreServerTests.code { _ = try await fs.commit(commit) } == nil)
            #expect(try await Self.document(fs, "c/y")?.fields["n"]?.integerValue == 2)
        }
        #expect(server.terminate() == 0)
    }

    @Test func runTransactionRetriesAnAbortAndGivesUpAfterFiveAttempts() async throws {
        let dir = try TemporaryDirectory("firestore-retry")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (a, ca) = try FirestoreSyncTests.connected(dir, "a", server)
        let ref = a.collection("counters").document("c")
        try await ref.setData(["n": 0])
        try await a.waitForPendingWrites()
        let port = server.firestorePort!
        /// Another client's write to the counter, between the transaction's read and its commit.
        @Sendable func interfere(_ n: Int) async throws {
            try await RawFirestore.with(port) { fs, _ in
                var w = RawFirestore.set("counters/c", ["n": n])
                w.update.name = "projects/sync-test/databases/(default)/documents/counters/c"
                var c = RawFirestore.commit([w])
                c.database = "projects/sync-test/databases/(default)"
                _ = try await fs.commit(c)
            }
        }

        // Interfered with once: the second attempt commits.
        let attempts = Mutex(0)
        try await a.runTransaction { t in
            let n = try await t.getDocument(ref).data()?["n"] as? Int ?? 0
            if attempts.withLock({ $0 += 1; return $0 }) == 1 { try await interfere(100) }
            t.updateData(["n": n + 1], forDocument: ref)
        }
        #expect(attempts.withLock { $0 } == 2)
        #expect(try await ref.getDocument(source: .server).data()?["n"] as? Int == 101)

        // Interfered with every time: five attempts, then `aborted`, and nothing of it committed.
        attempts.withLock { $0 = 0 }
        await #expect {
            try await a.runTransaction { t in
                _ = try await t.getDocument(ref)
                let k = attempts.withLock { $0 += 1; return $0 }
                try await interfere(1_000 + k)
                t.updateData(["n": -1], forDocument: ref)
            }
        } throws: { error in
            (error as? FirestoreErrorCode)?.code == .aborted
        }
        #expect(attempts.withLock { $0 } == 5)
        #expect(try await ref.getDocument(source: .server).data()?["n"] as? Int == 1_005)
        await ca.close()
        try await a.terminate()
        #expect(server.terminate() == 0)
    }

    @Test func aggregationsWithoutAnAliasAreNamedFieldNAmongThoseWithout() async throws {
        let dir = try TemporaryDirectory("firestore-aliases")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        try await RawFirestore.with(server.firestorePort!) { fs, _ in
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("p/a", ["n": 2]), RawFirestore.set("p/b", ["n": 4])]))
            typealias A = Google_Firestore_V1_StructuredAggregationQuery.Aggregation
            var count = A()
            count.count = A.Count()
            var sum = A()
            var field = Google_Firestore_V1_StructuredQuery.FieldReference()
            field.fieldPath = "n"
            sum.sum = A.Sum()
            sum.sum.field = field
            sum.alias = "total"
            var avg = A()
            avg.avg = A.Avg()
            avg.avg.field = field
            var request = Google_Firestore_V1_RunAggregationQueryRequest()
            request.parent = RawFirestore.root
            var aq = Google_Firestore_V1_StructuredAggregationQuery()
            aq.structuredQuery = RawFirestore.query("p").structuredQuery
            aq.aggregations = [count, sum, avg]
            request.structuredAggregationQuery = aq
            let fields = try await fs.runAggregationQuery(request: ClientRequest(message: request)) { r in
                var out: [String: Google_Firestore_V1_Value] = [:]
                for try await m in r.messages { out.merge(m.result.aggregateFields) { $1 } }
                return out
            }
            #expect(Set(fields.keys) == ["field_1", "total", "field_2"])
            #expect(fields["field_1"]?.integerValue == 2)
            #expect(fields["total"]?.integerValue == 6)
            #expect(fields["field_2"]?.doubleValue == 3)

            // An alias used twice is refused.
            sum.alias = "field_1"
            aq.aggregations = [count, sum]
            request.structuredAggregationQuery = aq
            let code = await FirestoreServerTests.code {
                _ = try await fs.runAggregationQuery(request: ClientRequest(message: request)) { r in for try await _ in r.messages {} }
            }
            #expect(code == .invalidArgument)
        }
        #expect(server.terminate() == 0)
    }

    @Test func aWriteWithoutAMaskReplacesTheDocumentAndItsTransformsApplyAfterItsFields() async throws {
        let dir = try TemporaryDirectory("firestore-replace")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        try await RawFirestore.with(server.firestorePort!) { fs, _ in
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("r/x", ["a": 1, "b": 2])]))
            let before = try await Self.document(fs, "r/x")
            var w = RawFirestore.set("r/x", ["a": 5])
            var increment = Google_Firestore_V1_DocumentTransform.FieldTransform()
            increment.fieldPath = "a"
            increment.increment = RawFirestore.value(1)
            var added = Google_Firestore_V1_DocumentTransform.FieldTransform()
            added.fieldPath = "c"
            added.increment = RawFirestore.value(7)
            w.updateTransforms = [increment, added]
            let answer = try await fs.commit(RawFirestore.commit([w]))
            #expect(answer.writeResults.first?.transformResults.map(\.integerValue) == [6, 7])
            let after = try await Self.document(fs, "r/x")
            // b is gone (no mask: the fields replace the document's); a = 5 + 1; c made by its transform.
            #expect(after?.fields.mapValues(\.integerValue) == ["a": 6, "c": 7])
            #expect(after?.createTime == before?.createTime)
            #expect(after.map { $0.updateTime.seconds * 1_000_000_000 + Int64($0.updateTime.nanos) } ?? 0
                    > before.map { $0.updateTime.seconds * 1_000_000_000 + Int64($0.updateTime.nanos) } ?? .max)
        }
        #expect(server.terminate() == 0)
    }

    @Test func eachProjectKeepsItsOwnDocumentsAndAClearTouchesOnlyItsOwn() async throws {
        let dir = try TemporaryDirectory("firestore-projects")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let other = "projects/other/databases/(default)"
        try await RawFirestore.with(server.firestorePort!) { fs, _ in
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("k/x", ["from": "raw"])]))
            var w = RawFirestore.set("k/x", ["from": "other"])
            w.update.name = other + "/documents/k/x"
            var c = RawFirestore.commit([w])
            c.database = other
            _ = try await fs.commit(c)
            #expect(try await Self.document(fs, "k/x")?.fields["from"]?.stringValue == "raw")
            #expect(try await Self.document(fs, "k/x", database: other)?.fields["from"]?.stringValue == "other")
        }
        let clear = "/emulator/v1/projects/raw/databases/(default)/documents"
        #expect(try TestHTTP.request(server.port, "DELETE", clear, headers: ["Authorization": "Bearer owner"]).status == 200)
        let (mine, theirs) = try await RawFirestore.with(server.firestorePort!) { fs, _ in
            (try await Self.document(fs, "k/x"), try await Self.document(fs, "k/x", database: other))
        }
        #expect(mine == nil)
        #expect(theirs?.fields["from"]?.stringValue == "other")
        #expect(server.terminate() == 0)
    }

    @Test func aLimitedListenIsSentADocumentOnlyWhenItsUpdateTimeChangedOrItEntersTheWindow() async throws {
        let dir = try TemporaryDirectory("firestore-window")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let port = server.firestorePort!
        try await RawFirestore.with(port) { fs, _ in
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("w/a", ["n": 1]), RawFirestore.set("w/b", ["n": 2]), RawFirestore.set("w/c", ["n": 3])]))
        }
        var sq = RawFirestore.query("w", limit: 2).structuredQuery
        var order = Google_Firestore_V1_StructuredQuery.Order()
        order.field.fieldPath = "n"
        order.direction = .ascending
        sq.orderBy = [order]
        let target = RawFirestore.target(sq, id: 2)
        // The first snapshot, then three commits: c outside the window (nothing to send), a
        // inside it (a), and c entering it (c in, b out).
        let first = AsyncStream<Void>.makeStream()
        let messages = Task {
            try await RawFirestore.with(port) { fs, _ in
                try await FirestoreServerTests.listen(fs, target, snapshots: 3) { n in if n == 1 { first.continuation.yield() } }
            }
        }
        for await _ in first.stream { break }
        try await RawFirestore.with(port) { fs, _ in
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("w/c", ["n": 30])]))
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("w/a", ["n": 0])]))
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("w/c", ["n": -1])]))
        }
        let all = try await messages.value
        let changes = all.compactMap { m -> String? in
            switch m.responseType {
            case .documentChange(let c)?: "+" + String(c.document.name.split(separator: "/").last!)
            case .documentRemove(let r)?: "-" + String(r.document.split(separator: "/").last!)
            default: nil
            }
        }
        #expect(changes == ["+a", "+b", "+a", "+c", "-b"])
        #expect(server.terminate() == 0)
    }
}
