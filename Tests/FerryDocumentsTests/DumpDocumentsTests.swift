import Ferry
import FerryTestSupport
import Foundation
import Testing

@testable import FerryDocuments

/// `ferry-dump` on a document store: records, `at` and `stats` through the model's own code.
@Suite struct DumpDocumentsTests {
    let dump = Locations.executable("ferry-dump")

    @Test func ferryDumpDescribesDocumentRecordsAndRebuildsDocuments() async throws {
        let store = try Store()
        let db = try store.open()
        try await db.document("cities/SF").setData(["name": "SF", "pop": 860_000, "at": Timestamp(seconds: 1, nanoseconds: 0)])
        try await db.document("cities/SF").updateData(["pop": FieldValue.increment(Int64(1)), "when": FieldValue.serverTimestamp()])
        let batch = db.batch()
        batch.setData(["name": "LA"], forDocument: db.document("cities/LA"))
        batch.deleteDocument(db.document("cities/DC"))
        try await batch.commit()
        try await db.sync()
        // (ferry-dump reads a store another process has open; closing it would write a
        // checkpoint and delete the records it covers.)

        let records = try run(dump, ["records", store.path])
        #expect(records.status == 0)
        let lines = records.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 3)
        #expect(lines[0].contains(#"set cities/SF {"at": {"$timestamp": "1.000000"}, "name": "SF", "pop": 860000}"#), "\(lines[0])")
        #expect(lines[1].contains("update cities/SF") && lines[1].contains("mask [pop, when]") && lines[1].contains("serverTimestamp"))
        #expect(lines[2].contains("set cities/LA") && lines[2].contains("delete cities/DC"))

        let at = try run(dump, ["at", store.path, "--path", "cities/SF"])
        #expect(at.status == 0)
        #expect(at.stdout.contains(#""pop": 860001"#) && at.stdout.contains("$serverTimestamp") && at.stdout.contains("(pending writes)"), "\(at.stdout)")
        let atFirst = try run(dump, ["at", store.path, "1", "--path", "cities/SF"])
        #expect(atFirst.stdout.contains(#""pop": 860000"#))
        let coll = try run(dump, ["at", store.path, "--path", "cities"])
        #expect(coll.stdout.contains("2 documents: LA, SF"), "\(coll.stdout)")

        let stats = try run(dump, ["stats", "--json", store.path])
        let report = try JSONSerialization.jsonObject(with: Data(stats.stdout.utf8)) as! [String: Any]
        let docs = try #require(report["documents"] as? [String: Any])
        #expect(docs["documents"] as? Int == 2 && docs["deletedDocuments"] as? Int == 1 && docs["pendingWrites"] as? Int == 4)

        // Closed, its records are in the checkpoint: `at` and `stats` read it.
        try await db.terminate()
        let after = try run(dump, ["at", store.path, "--path", "cities/SF"])
        #expect(after.status == 0 && after.stdout.contains(#""pop": 860001"#), "\(after.stdout)")
        let statsAfter = try run(dump, ["stats", "--json", store.path])
        let reportAfter = try JSONSerialization.jsonObject(with: Data(statsAfter.stdout.utf8)) as! [String: Any]
        #expect((reportAfter["documents"] as? [String: Any])?["pendingWrites"] as? Int == 4)
    }

    @Test func aTreeDatabaseRefusesADocumentStoreAndTheOtherWayRound() async throws {
        let store = try Store()
        let db = try store.open()
        try await db.document("c/d").setData(["a": 1])
        try await db.terminate()
        do {
            _ = try Database.open(at: store.path)
            Issue.record("the tree database opened a document store")
        } catch let e as DatabaseError {
            #expect(e.message.contains("document store"), "\(e)")
        }

        let tree = try TemporaryDirectory()
        let t = try Database.open(at: tree.path)
        try await t.reference("a").setValue(1)
        try await t.close()
        do {
            _ = try Firestore.open(at: tree.path)
            Issue.record("a tree store opened as documents")
        } catch let e as FirestoreErrorCode {
            #expect(e.code == .dataLoss && e.message.contains("Realtime Database"), "\(e)")
        }
        // A document store whose records are all still in the log is refused by its records.
        let fresh = try TemporaryDirectory()
        let d = try Firestore.open(at: fresh.path)
        try d.document("c/d").setDataNow(["a": 1])
        try await d.sync()
        d.state.withLock { _ = $0.life.close(ledger: $0.ledger, reason: Firestore.closedError) }
        try await d.log!.close()
        do {
            _ = try Database.open(at: fresh.path)
            Issue.record("the tree database opened a document store's records")
        } catch let e as DatabaseError {
            #expect(e.message.contains("kind 32"), "\(e)")
        }
    }
}
