import FerryLog
import FerryTestSupport
import Foundation
import Testing

@_spi(Tools) @testable import FerryDocuments

/// Checkpoints bound what an open replays and let the segments below them go; the cache limit
/// drops what nothing needs.
@Suite struct CheckpointTests {
    func settings(limit: Int64 = 64 << 20) -> FirestoreSettings {
        var s = FirestoreSettings()
        s.durability = .none
        s.cacheSettings = .persistent(sizeBytes: limit)
        return s
    }

    /// The server's documents for a target, as a sync connection would deliver them.
    func serve(_ db: Firestore, target: Int, docs: [(String, [String: FieldValueData])], version: Int64, token: String) {
        db.syncStep { e in
            e.watchAck([target])
            for (key, fields) in docs {
                let k = ResourcePath(key.split(separator: "/").map(String.init))
                e.watchDocument(WatchDocument(key: k, fields: fields, version: version), key: k, updated: [target], removed: [])
            }
            e.watchCurrent([target], resumeToken: token)
            return e.watchSnapshot(version: version)
        }
    }

    func attach(_ db: Firestore) { db.state.withLock { e in e.remoteAttached = true; e.onlineState = .unknown } }

    /// A collection's documents in a form that compares exactly (fields in key order).
    func everything(_ db: Firestore, _ collection: String) async throws -> [String] {
        try await db.collection(collection).getDocuments(source: .cache).documents.map {
            "\($0.documentID) \(DocumentTools.json(.map($0.doc?.fields ?? [:]))) \($0.metadata.hasPendingWrites) v\($0.doc?.version ?? -1)"
        }
    }

    @Test func aCheckpointHoldsTheStateAndTheSegmentsItCoversGo() async throws {
        let store = try Store()
        var db = try Firestore.open(at: store.path, settings: settings(limit: 4 << 20))  // 512 KiB segments
        attach(db)
        let reg = db.collection("server").addSnapshotListener { _, _ in }
        let body = String(repeating: "r", count: 900)
        serve(db, target: 2, docs: (0..<1500).map { ("server/s\($0)", ["n": .integer(Int64($0)), "b": .string(body)]) }, version: 1000, token: "t-1000")
        for i in 0..<1500 { try db.collection("local").document("l\(i)").setDataNow(["n": i, "b": body]) }
        db.syncStep { $0.acknowledgeOldest(version: 2000).events }
        try await db.setIndexConfiguration(#"{"indexes": [{"collectionGroup": "local", "fields": [{"fieldPath": "n", "order": "DESCENDING"}]}]}"#)
        let segmentsBefore = db.log!.segments.count
        try await db.checkpoint()
        #expect(db.log!.firstLSN.rawValue > 1 && db.log!.segments.count < segmentsBefore, "the segments the checkpoint covers are deleted")
        // Records after the checkpoint, then a stop without the closing checkpoint (as a crash).
        try await db.document("local/after").setData(["n": -1])
        serve(db, target: 2, docs: [("server/s0", ["n": .integer(-5)])], version: 3000, token: "t-3000")
        let server = try await everything(db, "server"), local = try await everything(db, "local")
        let pending = db.state.withLock { $0.pending.count }
        reg.remove()
        try await db.log!.close()
        db.state.withLock { _ = $0.life.close(ledger: $0.ledger, reason: Firestore.closedError) }

        db = try Firestore.open(at: store.path, settings: settings(limit: 4 << 20))
        #expect(try await everything(db, "server") == server)
        #expect(try await everything(db, "local") == local)
        #expect(db.state.withLock { $0.pending.count } == pending && pending == 1500)
        #expect(db.state.withLock { $0.savedTargets.values.first?.resumeToken } == "t-3000")
        #expect(db.indexDefinitions.count == 1)
        let top = try await db.collection("local").order(by: "n", descending: true).limit(to: 1).getDocuments(source: .cache)
        #expect(ids(top) == ["l1499"] && db.state.withLock { $0.lastRun.indexes.count } == 1)
        try await db.terminate()
    }

    @Test func aDamagedCheckpointIsRefusedOnceItsRecordsAreGoneAndNothingChanges() async throws {
        let store = try Store()
        let db = try Firestore.open(at: store.path, settings: settings(limit: 1 << 20))  // 128 KiB segments
        for i in 0..<400 { try db.collection("c").document("d\(i)").setDataNow(["b": String(repeating: "x", count: 1000)]) }
        try await db.checkpoint()
        #expect(db.log!.firstLSN.rawValue > 1)
        try await db.terminate()
        let file = store.path + "/" + DocumentCheckpoint.fileName
        var bytes = try Files.read(file)
        bytes[bytes.count / 2] ^= 0xFF
        try Files.write(file, bytes)
        do {
            _ = try Firestore.open(at: store.path, settings: settings(limit: 1 << 20))
            Issue.record("a damaged checkpoint was accepted")
        } catch let e as FirestoreErrorCode {
            #expect(e.code == .dataLoss && e.message.contains("checksum") && e.message.contains("nothing was changed"), "\(e)")
        }
        #expect(try Files.read(file) == bytes, "the damaged file is left as it was")
    }

    @Test func aDamagedCheckpointIsSetAsideWhileTheLogHoldsEveryRecord() async throws {
        let store = try Store()
        var db = try store.open()
        for i in 0..<50 { try await db.collection("c").document("d\(i)").setData(["i": i]) }
        let before = try await everything(db, "c")
        // A checkpoint written and the process gone before its segments were deleted.
        let log = db.log!
        let snapshot = db.state.withLock { e in _ = e.life.close(ledger: e.ledger, reason: Firestore.closedError); return DocumentCheckpoint(e, throughLSN: log.nextLSN.rawValue) }
        try await log.sync()
        try log.writeSideFile(named: DocumentCheckpoint.fileName, contents: snapshot.encode())
        try await log.close()
        #expect(log.firstLSN.rawValue == 1)
        let file = store.path + "/" + DocumentCheckpoint.fileName
        var bytes = try Files.read(file)
        bytes[10] ^= 0x01
        try Files.write(file, bytes)
        db = try store.open()
        #expect(try await everything(db, "c") == before)
        try await db.terminate()
    }

    /// Over the limit, the server's documents that no listener, target or pending write needs
    /// are dropped with the segments that held them; what is needed stays.
    @Test func theCacheLimitDropsWhatNothingNeedsAndKeepsTheRest() async throws {
        let store = try Store()
        let limit: Int64 = 1 << 20
        let db = try Firestore.open(at: store.path, settings: settings(limit: limit))
        attach(db)
        // Random text: the log compresses its frames, and repeated bytes would take no room.
        var rng = SplitMix(seed: 7)
        func noise() -> String { String((0..<1000).map { _ in Character(UnicodeScalar(UInt8(33 + rng.next() % 90))) }) }
        let old = db.collection("old").addSnapshotListener { _, _ in }
        serve(db, target: 2, docs: (0..<1200).map { ("old/o\($0)", ["b": .string(noise())]) }, version: 1000, token: "a")
        _ = db.collection("kept").addSnapshotListener { _, _ in }
        serve(db, target: 4, docs: (0..<20).map { ("kept/k\($0)", ["n": .integer(Int64($0))]) }, version: 2000, token: "b")
        try await db.document("mine/pending").setData(["x": 1])
        old.remove()
        // The next write finds the store over its limit, with documents nothing needs.
        try await db.document("mine/pending2").setData(["x": 2])
        #expect(await eventually { db.state.withLock { $0.remote.keys.filter { $0.parent.last == "old" }.isEmpty } })
        #expect(await eventually {
            db.log!.segmentBytes + Int64(db.checkpointBytes.withLock { $0 }) <= limit + (limit / 8)
        }, "the store is within its limit and a segment")
        #expect(try await db.collection("kept").getDocuments(source: .cache).count == 20)
        #expect(try await db.document("mine/pending").getDocument(source: .cache).exists)
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("old/o5").getDocument(source: .cache) }
        try await db.terminate()
    }
}

/// A record's strings: ASCII and valid UTF-8 are read as written; bytes that are not UTF-8
/// are refused as damage, whichever way the reader takes.
@Suite struct RecordStringTests {
    func read(_ body: [UInt8]) throws -> String {
        let bytes = withUnsafeBytes(of: UInt32(body.count).littleEndian, Array.init) + body
        return try bytes.withUnsafeBytes { raw in
            var r = PayloadReader(raw)
            let s = try r.string()
            #expect(r.atEnd)
            return s
        }
    }

    @Test func asciiAndUTF8AreReadAsWrittenAndOtherBytesAreRefused() throws {
        #expect(try read(Array("title".utf8)) == "title")
        #expect(try read([]) == "")
        #expect(try read(Array("São Paulo 東京 🚀".utf8)) == "São Paulo 東京 🚀")
        for bad: [UInt8] in [[0xC3, 0x28], [0x61, 0xFF], [0xE6, 0x9D], [0x80]] {
            #expect(throws: FirestoreErrorCode.self, "\(bad)") { try read(bad) }
        }
    }
}
