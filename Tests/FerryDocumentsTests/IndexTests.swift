import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable import FerryDocuments

@Suite struct IndexTests {
    /// The ids a query returns with the store's indexes, without them, and the indexes used.
    func both(_ db: Firestore, _ q: Query) throws -> (indexed: [String], scanned: [String], used: Int) {
        let core = try q.validated()
        return db.state.withLock { e in
            var plain = e
            plain.indexes = []
            let (docs, run) = e.execute(core)
            return (docs.map(\.key.description), plain.execute(core).docs.map(\.key.description), run.indexes.count)
        }
    }

    let configuration = """
        {"indexes": [
          {"collectionGroup": "items", "queryScope": "COLLECTION", "fields": [{"fieldPath": "color", "order": "ASCENDING"}, {"fieldPath": "n", "order": "DESCENDING"}]},
          {"collectionGroup": "items", "queryScope": "COLLECTION", "fields": [{"fieldPath": "tags", "arrayConfig": "CONTAINS"}, {"fieldPath": "n", "order": "ASCENDING"}]},
          {"collectionGroup": "items", "queryScope": "COLLECTION_GROUP", "fields": [{"fieldPath": "n", "order": "ASCENDING"}]}
        ],
        "fieldOverrides": [
          {"collectionGroup": "items", "fieldPath": "s", "indexes": [{"order": "ASCENDING", "queryScope": "COLLECTION"}]},
          {"collectionGroup": "items", "fieldPath": "color", "indexes": [{"order": "ASCENDING", "queryScope": "COLLECTION"}]},
          {"collectionGroup": "items", "fieldPath": "tags", "indexes": [{"arrayConfig": "CONTAINS", "queryScope": "COLLECTION"}]}
        ]}
        """

    /// Random documents, queries and pending writes: every query returns the same documents
    /// in the same order with the indexes as by a scan.
    @Test(arguments: [11, 12, 13])
    func indexedAndUnindexedQueriesAgreeOnRandomData(seed: UInt64) async throws {
        var rng = SplitMix(seed: seed)
        let db = Firestore.inMemory()
        try await db.setIndexConfiguration(configuration)
        let colors = ["red", "green", "blue", "x"]
        func randomDoc() -> [String: Any] {
            var d: [String: Any] = [:]
            if rng.next() % 8 != 0 { d["color"] = colors[Int(rng.next() % 4)] }
            if rng.next() % 8 != 0 { d["n"] = rng.next() % 5 == 0 ? Double(rng.next() % 20) / 2 : Int(rng.next() % 10) }
            if rng.next() % 9 == 0 { d["n"] = "text" }
            if rng.next() % 3 != 0 { d["tags"] = colors.filter { _ in rng.next() % 2 == 0 } }
            if rng.next() % 2 == 0 { d["s"] = "s\(rng.next() % 6)" }
            return d
        }
        for round in 0..<6 {
            for _ in 0..<40 {
                let ref = db.collection(rng.next() % 5 == 0 ? "other/p/items" : "items").document("d\(rng.next() % 60)")
                switch rng.next() % 5 {
                case 0: try await ref.delete()
                case 1: try await ref.setData(["n": FieldValue.increment(Int64(1)), "tags": FieldValue.arrayUnion(["red"])], merge: true)
                default: try await ref.setData(randomDoc())
                }
            }
            let c = db.collection("items")
            let queries: [Query] = [
                c.whereField("color", isEqualTo: "red"),
                c.whereField("color", isEqualTo: "blue").order(by: "n", descending: true).limit(to: 3),
                c.whereField("color", isEqualTo: "green").whereField("n", isGreaterThan: 3).order(by: "n", descending: true),
                c.whereField("color", in: ["red", "x"]).whereField("n", isLessThanOrEqualTo: 4),
                c.whereField("tags", arrayContains: "blue").order(by: "n").limit(to: 4),
                c.whereField("tags", arrayContainsAny: ["red", "x"]).whereField("n", isGreaterThanOrEqualTo: 2.5),
                c.whereFilter(.orFilter([.whereField("color", isEqualTo: "x"), .whereField("tags", arrayContains: "green")])),
                c.whereField("s", isGreaterThan: "s2").order(by: "s").limit(toLast: 2),
                c.order(by: "n").limit(to: 5),
                c.order(by: "n").start(after: [3]).end(at: [8]),
                c.whereField("color", isEqualTo: "red").order(by: "n", descending: true).start(at: [5]).limit(to: 2),
                c.whereField("n", isNotEqualTo: 4).whereField("color", isEqualTo: "blue"),
                db.collectionGroup("items").whereField("n", isGreaterThan: 5),
                db.collectionGroup("items").order(by: "n").limit(toLast: 3),
            ]
            for (i, q) in queries.enumerated() {
                let r = try both(db, q)
                #expect(r.indexed == r.scanned, "seed \(seed) round \(round) query \(i): indexed \(r.indexed), scanned \(r.scanned)")
                if i < 7 { #expect(r.used > 0, "query \(i) used no index") }
            }
        }
    }

    @Test func anIndexIsUsedKeptCurrentAndRebuiltAfterAReopen() async throws {
        let store = try Store()
        var db = try store.open()
        for i in 0..<300 { try await db.collection("items").document("d\(i)").setData(["color": i % 30 == 0 ? "red" : "blue", "n": i]) }
        try await db.setIndexConfiguration(configuration)
        let q = db.collection("items").whereField("color", isEqualTo: "red")
        #expect(try await q.getDocuments(source: .cache).count == 10)
        var run = db.state.withLock { $0.lastRun }
        #expect(run.indexes.count == 1 && run.documentsRead == 10, "\(run)")
        try await db.document("items/d1").updateData(["color": "red"])
        #expect(try await q.getDocuments(source: .cache).count == 11)
        try await db.terminate()
        db = try store.open()
        #expect(db.indexDefinitions.count == 6)
        let again = try await db.collection("items").whereField("color", isEqualTo: "red").getDocuments(source: .cache)
        #expect(again.count == 11)
        run = db.state.withLock { $0.lastRun }
        #expect(run.indexes.count == 1 && run.documentsRead == 11)
        try await db.persistentCacheIndexManager?.deleteAllIndexes()
        #expect(db.indexDefinitions.isEmpty)
        try await db.terminate()
        db = try store.open()
        #expect(db.indexDefinitions.isEmpty)
        try await db.terminate()
    }

    @Test func aLimitedOrderedQueryStopsReadingAtItsLimit() async throws {
        let db = Firestore.inMemory()
        for i in 0..<1000 { try await db.collection("items").document("d\(i)").setData(["color": "blue", "n": i]) }
        try await db.setIndexConfiguration(configuration)
        let top = try await db.collection("items").whereField("color", isEqualTo: "blue").order(by: "n", descending: true).limit(to: 5).getDocuments(source: .cache)
        #expect(ids(top) == ["d999", "d998", "d997", "d996", "d995"])
        let run = db.state.withLock { $0.lastRun }
        #expect(run.documentsRead <= 6, "read \(run.documentsRead) entries for 5 results")
    }

    @Test func autoCreationIndexesAQueryThatScannedTooMuch() async throws {
        let store = try Store()
        var db = try store.open()
        for i in 0..<200 { try await db.collection("posts").document("p\(i)").setData(["author": "a\(i % 50)", "likes": i]) }
        let q = db.collection("posts").whereField("author", isEqualTo: "a7").order(by: "likes")
        _ = try await q.getDocuments(source: .cache)
        #expect(db.indexDefinitions.isEmpty, "auto-creation is off by default")
        db.persistentCacheIndexManager?.enableIndexAutoCreation()
        _ = try await q.getDocuments(source: .cache)
        let made = db.indexDefinitions
        #expect(made.count == 1 && made[0].automatic && made[0].segments.map(\.description) == ["author ascending", "likes ascending"], "\(made)")
        let r = try await q.getDocuments(source: .cache)
        #expect(ids(r) == ["p7", "p57", "p107", "p157"])
        #expect(db.state.withLock { $0.lastRun.indexes.count } == 1)
        // A small result of a small collection makes no index.
        _ = try await db.collection("tiny").whereField("a", isEqualTo: 1).getDocuments(source: .cache)
        #expect(db.indexDefinitions.count == 1)
        // An OR makes one index per branch, and then runs through them.
        let or = db.collection("posts").whereFilter(.orFilter([.whereField("author", isEqualTo: "a1"), .whereField("likes", isEqualTo: 3)]))
        _ = try await or.getDocuments(source: .cache)
        #expect(db.indexDefinitions.count == 3, "\(db.indexDefinitions)")
        #expect(ids(try await or.getDocuments(source: .cache)) == ["p1", "p101", "p151", "p3", "p51"])
        #expect(db.state.withLock { $0.lastRun.indexes.count } == 2)
        try await db.terminate()
        db = try store.open()
        #expect(db.indexDefinitions.count == 3, "automatic indexes are kept")
        try await db.terminate()
        #expect(Firestore.inMemory().persistentCacheIndexManager == nil)
    }

    @Test func aMalformedIndexConfigurationIsRefusedWhole() async throws {
        let db = Firestore.inMemory()
        try await db.setIndexConfiguration(configuration)
        for bad in ["not json", "[]", #"{"indexes": [{"fields": [{"fieldPath": "a", "order": "ASCENDING"}]}]}"#,
                    #"{"indexes": [{"collectionGroup": "c", "fields": []}]}"#,
                    #"{"indexes": [{"collectionGroup": "c", "fields": [{"fieldPath": "a", "order": "UP"}]}]}"#,
                    #"{"indexes": [{"collectionGroup": "c", "fields": [{"fieldPath": "a"}]}]}"#,
                    #"{"indexes": [{"collectionGroup": "c", "queryScope": "EVERYWHERE", "fields": [{"fieldPath": "a", "order": "ASCENDING"}]}]}"#] {
            do {
                try await db.setIndexConfiguration(bad)
                Issue.record("accepted: \(bad)")
            } catch let e as FirestoreErrorCode { #expect(e.code == .invalidArgument) }
        }
        #expect(db.indexDefinitions.count == 6, "the configuration before stays")
    }
}

extension IndexTests {
    /// Exported index files often end with `__name__`: the document name orders every index
    /// already, and the index still serves its queries.
    @Test func anIndexEndingWithTheDocumentNameServesQueries() async throws {
        let db = Firestore.inMemory()
        for i in 0..<50 { try await db.collection("items").document("d\(i)").setData(["color": i % 5 == 0 ? "red" : "blue", "n": i]) }
        try await db.setIndexConfiguration(#"{"indexes": [{"collectionGroup": "items", "queryScope": "COLLECTION", "fields": [{"fieldPath": "color", "order": "ASCENDING"}, {"fieldPath": "__name__", "order": "DESCENDING"}]}]}"#)
        let r = try both(db, db.collection("items").whereField("color", isEqualTo: "red"))
        #expect(r.indexed == r.scanned && r.indexed.count == 10 && r.used == 1)
    }
}
