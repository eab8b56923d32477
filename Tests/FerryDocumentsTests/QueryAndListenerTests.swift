import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable import FerryDocuments

@Suite struct QueryAndListenerTests {
    /// Ten cities with a mix of fields.
    func cities() async throws -> Firestore {
        let db = Firestore.inMemory()
        let rows: [(String, [String: Any])] = [
            ("SF", ["name": "San Francisco", "state": "CA", "pop": 860_000, "tags": ["west", "coast"], "capital": false]),
            ("LA", ["name": "Los Angeles", "state": "CA", "pop": 3_900_000, "tags": ["west", "coast", "big"], "capital": false]),
            ("DC", ["name": "Washington", "state": NSNull(), "pop": 680_000, "tags": ["east"], "capital": true]),
            ("TOK", ["name": "Tokyo", "country": "JP", "pop": 9_000_000.0, "tags": ["big"], "capital": true]),
            ("BJ", ["name": "Beijing", "country": "CN", "pop": 21_500_000, "tags": ["big"], "capital": true]),
            ("NaN", ["name": "Nowhere", "pop": Double.nan]),
        ]
        for (id, data) in rows { try await db.collection("cities").document(id).setData(data) }
        return db
    }

    func run(_ q: Query) async throws -> [String] { ids(try await q.getDocuments(source: .cache)) }

    @Test func everyFilterOperatorMatchesAsFirestoresDoes() async throws {
        let db = try await cities()
        let c = db.collection("cities")
        #expect(try await run(c.whereField("state", isEqualTo: "CA")) == ["LA", "SF"])
        #expect(try await run(c.whereField("state", isEqualTo: NSNull())) == ["DC"])
        #expect(try await run(c.whereField("pop", isEqualTo: Double.nan)) == ["NaN"])
        #expect(try await run(c.whereField("state", isNotEqualTo: "CA")) == [], "!= skips null and missing fields")
        #expect(try await run(c.whereField("capital", isNotEqualTo: false)) == ["BJ", "DC", "TOK"])
        #expect(try await run(c.whereField("pop", isLessThan: 1_000_000)) == ["NaN", "DC", "SF"])
        #expect(try await run(c.whereField("pop", isLessThanOrEqualTo: 860_000)) == ["NaN", "DC", "SF"])
        #expect(try await run(c.whereField("pop", isGreaterThan: 9_000_000)) == ["BJ"])
        #expect(try await run(c.whereField("pop", isGreaterThanOrEqualTo: 9_000_000)) == ["TOK", "BJ"], "9,000,000.0 equals 9,000,000 as a number")
        #expect(try await run(c.whereField("name", isGreaterThanOrEqualTo: "T")) == ["TOK", "DC"])
        #expect(try await run(c.whereField("tags", arrayContains: "big")) == ["BJ", "LA", "TOK"])
        #expect(try await run(c.whereField("tags", arrayContainsAny: ["east", "coast"])) == ["DC", "LA", "SF"])
        #expect(try await run(c.whereField("country", in: ["JP", "CN", "FR"])) == ["BJ", "TOK"])
        #expect(try await run(c.whereField("country", notIn: ["JP"])) == ["BJ"])
        #expect(try await run(c.whereField(FieldPath.documentID(), isEqualTo: "SF")) == ["SF"])
        #expect(try await run(c.whereField(FieldPath.documentID(), in: ["SF", "DC"])) == ["DC", "SF"])
        // A type mismatch never matches a range.
        #expect(try await run(c.whereField("name", isLessThan: 5)) == [])
    }

    @Test func orAndAndFiltersCombine() async throws {
        let db = try await cities()
        let q = db.collection("cities").whereFilter(.orFilter([
            .whereField("state", isEqualTo: "CA"),
            .andFilter([.whereField("capital", isEqualTo: true), .whereField("pop", isGreaterThan: 10_000_000)]),
        ]))
        // The inequality on pop orders the results by pop, then by id.
        #expect(try await run(q) == ["SF", "LA", "BJ"])
        #expect(try await run(q.order(by: "pop", descending: true)) == ["BJ", "LA", "SF"])
        #expect(try await run(q.order(by: "pop")) == ["SF", "LA", "BJ"])
    }

    @Test func ordersLimitsAndCursorsPageThroughResults() async throws {
        let db = try await cities()
        let byPop = db.collection("cities").order(by: "pop")
        #expect(try await run(byPop) == ["NaN", "DC", "SF", "LA", "TOK", "BJ"])
        #expect(try await run(byPop.limit(to: 2)) == ["NaN", "DC"])
        #expect(try await run(byPop.limit(toLast: 2)) == ["TOK", "BJ"])
        #expect(try await run(byPop.start(at: [860_000])) == ["SF", "LA", "TOK", "BJ"])
        #expect(try await run(byPop.start(after: [860_000])) == ["LA", "TOK", "BJ"])
        #expect(try await run(byPop.end(at: [3_900_000])) == ["NaN", "DC", "SF", "LA"])
        #expect(try await run(byPop.end(before: [3_900_000])) == ["NaN", "DC", "SF"])
        let sf = try await db.document("cities/SF").getDocument(source: .cache)
        #expect(try await run(byPop.start(afterDocument: sf).limit(to: 2)) == ["LA", "TOK"])
        #expect(try await run(byPop.end(beforeDocument: sf)) == ["NaN", "DC"])
        // A field missing from a document leaves it out of a query ordered by that field.
        #expect(try await run(db.collection("cities").order(by: "country")) == ["BJ", "TOK"])
        // Ties are broken by the document id, in the last order's direction.
        #expect(try await run(db.collection("cities").whereField("state", isEqualTo: "CA").order(by: "state", descending: true)) == ["SF", "LA"])
        // Without orders, documents come in id order; a cursor on the id works.
        #expect(try await run(db.collection("cities").start(after: ["LA"])) == ["NaN", "SF", "TOK"])
    }

    @Test func invalidQueriesFailEveryReadWithInvalidArgument() async throws {
        let db = try await cities()
        let c = db.collection("cities")
        let bad: [Query] = [
            c.whereField("a", in: []),
            c.whereField("a", in: Array(0..<31)),
            c.whereField("a", isLessThan: NSNull()),
            c.whereField("a", arrayContains: 1).whereField("b", arrayContains: 2),
            c.whereField("a", notIn: [1]).whereField("b", isNotEqualTo: 2),
            c.limit(toLast: 2),
            c.limit(to: 0),
            c.order(by: "a").start(at: [1, 2, 3]),
            c.whereField("a..b", isEqualTo: 1),
        ]
        for q in bad {
            do {
                _ = try await q.getDocuments(source: .cache)
                Issue.record("an invalid query ran: \(q.core)")
            } catch let e as FirestoreErrorCode { #expect(e.code == .invalidArgument) }
        }
        let failed = Snapshots<QuerySnapshot>()
        _ = c.limit(toLast: 1).addSnapshotListener { failed.add($0, $1) }
        #expect(await eventually { !failed.errors.isEmpty })
    }

    @Test func aggregationsRunOverTheCache() async throws {
        let db = try await cities()
        let q = db.collection("cities").whereField("capital", isEqualTo: true)
        let agg = try await q.aggregate([.count(), .sum("pop"), .average("pop")]).getAggregation(source: .cache)
        #expect(agg.count == 3)
        #expect(agg.get(.sum("pop")) as? Double == 31_180_000, "a double among the values makes the sum a double")
        #expect((agg.get(.average("pop")) as? Double).map { abs($0 - 31_180_000.0 / 3) < 1e-6 } == true)
        let ints = try await db.collection("cities").whereField("state", isEqualTo: "CA").aggregate([.sum("pop"), .average("missing")]).getAggregation(source: .cache)
        #expect(ints.get(.sum("pop")) as? Int == 4_760_000)
        #expect(ints.get(.average("missing")) is NSNull)
        // A limit picks its documents in the query's order, so a limited aggregation keeps it.
        let ca = db.collection("cities").whereField("state", isEqualTo: "CA")
        let smallest = try await ca.order(by: "pop").limit(to: 1).aggregate([.sum("pop")]).getAggregation(source: .cache)
        #expect(smallest.get(.sum("pop")) as? Int == 860_000)
        let largest = try await ca.order(by: "pop").limit(toLast: 1).aggregate([.sum("pop")]).getAggregation(source: .cache)
        #expect(largest.get(.sum("pop")) as? Int == 3_900_000)
        let firstByID = try await ca.limit(to: 1).aggregate([.count(), .sum("pop")]).getAggregation(source: .cache)
        #expect(firstByID.count == 1 && firstByID.get(.sum("pop")) as? Int == 3_900_000, "LA sorts before SF")
        await #expect(throws: FirestoreErrorCode.self) { try await q.count.getAggregation(source: .server) }
    }

    @Test func aQueryListenerFiresAtOnceAndOnEveryLocalWriteWithIndexes() async throws {
        let db = Firestore.inMemory()
        let c = db.collection("scores")
        for (id, s) in [("a", 10), ("b", 20), ("c", 30)] { try await c.document(id).setData(["s": s]) }
        let snaps = Snapshots<QuerySnapshot>()
        let reg = c.order(by: "s").limit(to: 3).addSnapshotListener { snaps.add($0, $1) }
        var got = try await snaps.wait(for: 1)
        #expect(ids(got[0]) == ["a", "b", "c"])
        #expect(got[0].metadata.isFromCache && got[0].metadata.hasPendingWrites)
        #expect(got[0].documentChanges.map(\.type) == [.added, .added, .added])
        #expect(got[0].documentChanges.map(\.newIndex) == [0, 1, 2])

        // A new lowest score enters at 0 and pushes c out of the limit.
        try await c.document("d").setData(["s": 5])
        got = try await snaps.wait(for: 2)
        #expect(ids(got[1]) == ["d", "a", "b"])
        let ch = got[1].documentChanges
        #expect(ch.map(\.type) == [.removed, .added])
        #expect(ch[0].document.documentID == "c" && ch[0].oldIndex == 2 && ch[0].newIndex == UInt(NSNotFound))
        #expect(ch[1].document.documentID == "d" && ch[1].oldIndex == UInt(NSNotFound) && ch[1].newIndex == 0)

        // A modification that moves a document reports both indexes.
        try await c.document("a").updateData(["s": 25])
        got = try await snaps.wait(for: 3)
        #expect(ids(got[2]) == ["d", "b", "a"])
        #expect(got[2].documentChanges.map(\.type) == [.modified])
        #expect(got[2].documentChanges[0].oldIndex == 1 && got[2].documentChanges[0].newIndex == 2)

        // A write outside the results raises nothing; the next one that matters does.
        try await c.document("z").setData(["s": 99])
        try await c.document("b").delete()
        got = try await snaps.wait(for: 4)
        #expect(got.count == 4)
        #expect(ids(got[3]) == ["d", "a", "c"])
        #expect(got[3].documentChanges.map(\.type) == [.removed, .added])

        reg.remove()
        try await c.document("e").setData(["s": 1])
        // A listener added later sees e; the removed one got nothing more.
        let later = Snapshots<QuerySnapshot>()
        _ = c.order(by: "s").limit(to: 1).addSnapshotListener { later.add($0, $1) }
        #expect(ids(try await later.wait(for: 1)[0]) == ["e"])
        #expect(snaps.items.count == 4)
    }

    @Test func aDocumentListenerSeesCreationChangeAndDeletion() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("users/ada")
        let snaps = Snapshots<DocumentSnapshot>()
        _ = ref.addSnapshotListener { snaps.add($0, $1) }
        var got = try await snaps.wait(for: 1)
        #expect(!got[0].exists && got[0].metadata.isFromCache)
        try await ref.setData(["name": "Ada"])
        try await ref.setData(["name": "Ada"])  // the same data: no event
        try await ref.updateData(["age": 36])
        try await ref.delete()
        got = try await snaps.wait(for: 4)
        #expect(got.count == 4)
        #expect(got[1].data()?["name"] as? String == "Ada" && got[1].metadata.hasPendingWrites)
        #expect(got[2].data()?["age"] as? Int == 36)
        #expect(!got[3].exists)
    }

    @Test func snapshotsArriveAsAnAsyncSequence() async throws {
        let db = Firestore.inMemory()
        let c = db.collection("feed")
        var it = c.snapshots().makeAsyncIterator()
        #expect(try await it.next()?.isEmpty == true)
        try await c.document("1").setData(["t": "hi"])
        #expect(try await it.next()?.documents.first?.data()["t"] as? String == "hi")
    }

    /// Random writes of random documents: after each, every listener's last snapshot equals
    /// the same query run afresh, and replaying its changes' indexes on the previous
    /// snapshot gives the new one.
    @Test(arguments: [1, 2, 3, 4])
    func listenersAlwaysShowWhatAFreshQueryReturns(seed: UInt64) async throws {
        var rng = SplitMix(seed: seed)
        let db = Firestore.inMemory()
        let c = db.collection("r")
        let queries: [Query] = [
            c,
            c.order(by: "n").limit(to: 4),
            c.order(by: "n", descending: true).limit(toLast: 3),
            c.whereField("n", isGreaterThan: 3).order(by: "n"),
            c.whereFilter(.orFilter([.whereField("tag", isEqualTo: "x"), .whereField("n", isLessThan: 2)])),
            c.whereField("tags", arrayContains: "red").order(by: "s"),
            c.whereField("n", in: [1, 2, 3.0]).order(by: "s", descending: true).limit(to: 2),
            c.order(by: "n").start(after: [2]).end(at: [7]),
        ]
        let recorders = queries.map { _ in Snapshots<QuerySnapshot>() }
        for (q, r) in zip(queries, recorders) { q.addSnapshotListener { r.add($0, $1) } }
        var writes = 0
        for _ in 0..<120 {
            let id = "d\(rng.next() % 12)"
            let ref = c.document(id)
            switch rng.next() % 6 {
            case 0: try await ref.delete()
            case 1: try await ref.updateData(["n": FieldValue.increment(Int64(rng.next() % 3))])
            case 2: try await ref.setData(["tag": rng.next() % 2 == 0 ? "x" : "y"], merge: true)
            default:
                var d: [String: Any] = ["n": Int(rng.next() % 10), "s": "s\(rng.next() % 5)"]
                if rng.next() % 2 == 0 { d["tags"] = ["red", "blue"].filter { _ in rng.next() % 2 == 0 } }
                if rng.next() % 4 == 0 { d["n"] = Double(rng.next() % 10) + 0.5 }
                try await ref.setData(d)
            }
            writes += 1
        }
        // Wait until every listener has caught up with a final marker write's effects.
        for (i, q) in queries.enumerated() {
            let fresh = try await q.getDocuments(source: .cache)
            let ok = await eventually { recorders[i].items.last.map(ids) == ids(fresh) }
            #expect(ok, "query \(i): listener shows \(recorders[i].items.last.map(ids) ?? []), a fresh run \(ids(fresh))")
            // Each snapshot follows from the one before by its changes' indexes.
            let snaps = recorders[i].items
            var list: [String] = []
            for s in snaps {
                for ch in s.documentChanges {
                    if ch.oldIndex != UInt(NSNotFound) {
                        #expect(list[Int(ch.oldIndex)] == ch.document.documentID)
                        list.remove(at: Int(ch.oldIndex))
                    }
                    if ch.newIndex != UInt(NSNotFound) { list.insert(ch.document.documentID, at: Int(ch.newIndex)) }
                }
                #expect(list == ids(s), "query \(i): changes lead to \(list), the snapshot holds \(ids(s))")
            }
        }
        #expect(writes == 120)
    }
}


extension QueryAndListenerTests {
    @Test func aCacheSourceListenerAndMetadataChangesWork() async throws {
        let db = Firestore.inMemory()
        let snaps = Snapshots<QuerySnapshot>()
        db.collection("c").addSnapshotListener(options: SnapshotListenOptions().withSource(.cache).withIncludeMetadataChanges(true)) { snaps.add($0, $1) }
        let first = try await snaps.wait(for: 1)
        #expect(first[0].isEmpty && first[0].metadata.isFromCache && !first[0].metadata.hasPendingWrites)
        try await db.document("c/a").setData(["x": 1])
        let second = try await snaps.wait(for: 2)
        #expect(ids(second[1]) == ["a"] && second[1].metadata.hasPendingWrites)
        #expect(second[1].documentChanges(includeMetadataChanges: true).map(\.type) == [.added])
        await db.disableNetwork()
        try await db.document("c/b").setData(["x": 2])  // writes are kept while the network is off
        #expect(ids(try await snaps.wait(for: 3)[2]) == ["a", "b"])
        await db.enableNetwork()
    }
}

extension QueryAndListenerTests {
    @Test func inComparesWholeValuesIncludingArrays() async throws {
        let db = Firestore.inMemory()
        try await db.document("c/a").setData(["v": [1, 2]])
        try await db.document("c/b").setData(["v": 1])
        try await db.document("c/c").setData(["v": 1.0])
        #expect(ids(try await db.collection("c").whereField("v", in: [[1, 2]]).getDocuments(source: .cache)) == ["a"])
        // `in` compares as the SDK's Contains: an integer is not a double.
        #expect(ids(try await db.collection("c").whereField("v", in: [1]).getDocuments(source: .cache)) == ["b"])
        #expect(ids(try await db.collection("c").whereField("v", isEqualTo: 1).getDocuments(source: .cache)) == ["b", "c"])
    }

    @Test func aCursorFromAPendingServerTimestampIsRefused() async throws {
        let db = Firestore.inMemory()
        try await db.document("c/a").setData(["t": FieldValue.serverTimestamp()])
        let snap = try await db.document("c/a").getDocument(source: .cache)
        let q = db.collection("c").order(by: "t").start(afterDocument: snap)
        await #expect(throws: FirestoreErrorCode.self) { try await q.getDocuments(source: .cache) }
        let failed = Snapshots<QuerySnapshot>()
        q.addSnapshotListener { failed.add($0, $1) }
        #expect(await eventually { !failed.errors.isEmpty })
    }

    /// Writers on several tasks: the listener's snapshots come in the order of the writes,
    /// so the last one it gets is the collection as it is.
    @Test func concurrentWritersLeaveTheListenerOnTheLatestState() async throws {
        let db = Firestore.inMemory()
        let c = db.collection("w")
        let snaps = Snapshots<QuerySnapshot>()
        c.addSnapshotListener { snaps.add($0, $1) }
        try await withThrowingTaskGroup(of: Void.self) { group in
            for w in 0..<4 {
                group.addTask {
                    for i in 0..<200 { try c.document("d\(i % 25)").setDataNow(["w": w, "i": i]) }
                }
            }
            try await group.waitForAll()
        }
        let fresh = try await c.getDocuments(source: .cache)
        let want = fresh.documents.map { "\($0.documentID) \($0.data()["w"]!) \($0.data()["i"]!)" }
        let ok = await eventually {
            snaps.items.last.map { $0.documents.map { "\($0.documentID) \($0.data()["w"]!) \($0.data()["i"]!)" } } == want
        }
        #expect(ok, "the listener's last snapshot is not the collection's state")
    }
}
