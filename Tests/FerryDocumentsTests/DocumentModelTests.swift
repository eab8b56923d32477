import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable import FerryDocuments

@Suite struct DocumentModelTests {
    @Test func everyValueTypeRoundTripsExactlyThroughAReopen() async throws {
        let store = try Store()
        var db = try store.open()
        let ref = db.collection("types").document("all")
        let data: [String: Any] = [
            "null": NSNull(), "t": true, "f": false,
            "max": Int64.max, "min": Int64.min, "int": 42,
            "pi": 3.141592653589793, "nan": Double.nan, "negzero": -0.0, "inf": Double.infinity,
            "ts": Timestamp(seconds: 1_700_000_000, nanoseconds: 123_456_000),
            "s": "héllo \u{1F600}", "empty": "",
            "bytes": Data([0, 1, 2, 255]),
            "geo": GeoPoint(latitude: 48.85, longitude: 2.35),
            "ref": db.document("cities/SF"),
            "array": [1, "two", 3.5, ["nested": true]] as [Any],
            "map": ["a": ["b": ["c": 1]]],
        ]
        try await ref.setData(data)
        let before = try await ref.getDocument(source: .cache).data()
        #expect(same(before, data))
        try await db.terminate()
        db = try store.open()
        let after = try await db.collection("types").document("all").getDocument(source: .cache)
        #expect(after.exists)
        #expect(same(after.data(), data), "read back after a reopen: \(String(describing: after.data()))")
        #expect((after.get("negzero") as? Double)?.sign == .minus)
        try await db.terminate()
    }

    @Test func timestampsKeepMicrosecondsAndDropFinerDigits() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("t/1")
        try await ref.setData(["at": Timestamp(seconds: 5, nanoseconds: 123_456_789)])
        let t = try await ref.getDocument(source: .cache).get("at") as? Timestamp
        #expect(t == Timestamp(seconds: 5, nanoseconds: 123_456_000))
    }

    @Test func valuesOfEveryTypeSortInFirestoresOrder() async throws {
        let db = Firestore.inMemory()
        let ordered: [(String, Any)] = [
            ("a-null", NSNull()), ("b-false", false), ("c-true", true),
            ("d-nan", Double.nan), ("e-minint", Int64.min), ("f-neg", -1.5), ("g-zero", 0), ("h-one", 1), ("i-onehalf", 1.5),
            ("j-ts", Timestamp(seconds: 1, nanoseconds: 0)), ("k-str", "A"), ("l-str", "a"), ("m-str", "é"),
            ("n-bytes", Data([1])), ("o-ref", db.document("a/b")), ("p-geo", GeoPoint(latitude: 1, longitude: 2)),
            ("q-array", [1]), ("r-array", [1, 2]), ("s-map", ["a": 1]), ("t-map", ["b": 0]),
        ]
        for (id, v) in ordered.shuffled() { try await db.collection("v").document(id).setData(["v": v]) }
        let asc = try await db.collection("v").order(by: "v").getDocuments(source: .cache)
        #expect(ids(asc) == ordered.map(\.0))
        let desc = try await db.collection("v").order(by: "v", descending: true).getDocuments(source: .cache)
        #expect(ids(desc) == ordered.map(\.0).reversed())
        // Integers and doubles compare as numbers.
        let ones = try await db.collection("v").whereField("v", isGreaterThanOrEqualTo: 1.0).whereField("v", isLessThan: 2).getDocuments(source: .cache)
        #expect(ids(ones) == ["h-one", "i-onehalf"])
    }

    @Test func setMergeMergeFieldsUpdateAndDeleteChangeWhatFirestoreSays() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("cities/SF")
        try await ref.setData(["name": "San Francisco", "state": "CA", "info": ["pop": 1, "area": 2]])
        try await ref.setData(["state": "California", "info": ["pop": 10]], merge: true)
        var d = try await ref.getDocument(source: .cache).data()!
        #expect(same(d, ["name": "San Francisco", "state": "California", "info": ["pop": 10, "area": 2]] as [String: Any]))

        try await ref.setData(["name": "SF", "state": "ignored", "info": ["pop": 99, "area": 7]], mergeFields: ["name", "info.area"])
        d = try await ref.getDocument(source: .cache).data()!
        #expect(same(d, ["name": "SF", "state": "California", "info": ["pop": 10, "area": 7]] as [String: Any]))

        try await ref.updateData(["info.pop": 11, FieldPath(["a.b"]): "dotted", "state": FieldValue.delete()])
        d = try await ref.getDocument(source: .cache).data()!
        #expect(same(d, ["name": "SF", "a.b": "dotted", "info": ["pop": 11, "area": 7]] as [String: Any]))

        try await ref.setData(["only": 1])
        d = try await ref.getDocument(source: .cache).data()!
        #expect(same(d, ["only": 1] as [String: Any]))

        try await ref.delete()
        let gone = try await ref.getDocument(source: .cache)
        #expect(!gone.exists && gone.data() == nil && gone.metadata.hasPendingWrites)
    }

    @Test func anUpdateOfADocumentTheCacheDoesNotHoldChangesNothingLocally() async throws {
        let db = Firestore.inMemory()
        try await db.document("c/missing").updateData(["a": 1])
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c/missing").getDocument(source: .cache) }
        let all = try await db.collection("c").getDocuments(source: .cache)
        #expect(all.isEmpty)
    }

    @Test func transformsApplyLocallyAtOnce() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("c/t")
        try await ref.setData(["n": 5, "d": 1.5, "big": Int64.max - 1, "tags": ["a", "b"], "old": "before", "s": "x"])
        try await ref.updateData([
            "n": FieldValue.increment(Int64(2)), "d": FieldValue.increment(1.0), "big": FieldValue.increment(Int64(10)),
            "s": FieldValue.increment(Int64(3)), "new": FieldValue.increment(Int64(4)),
            "tags": FieldValue.arrayUnion(["b", "c"]), "none": FieldValue.arrayRemove(["x"]),
            "old": FieldValue.serverTimestamp(),
        ])
        let snap = try await ref.getDocument(source: .cache)
        #expect(snap.get("n") as? Int == 7)
        #expect(snap.get("d") as? Double == 2.5)
        #expect(snap.get("big") as? Int == Int.max, "increments saturate")
        #expect(snap.get("s") as? Int == 3, "a field that is not a number counts as 0")
        #expect(snap.get("new") as? Int == 4)
        #expect(same(snap.get("tags"), ["a", "b", "c"]))
        #expect(same(snap.get("none"), [Any]()))
        #expect(snap.get("old") is NSNull)
        #expect(snap.get("old", serverTimestampBehavior: .previous) as? String == "before")
        let estimate = try #require(snap.get("old", serverTimestampBehavior: .estimate) as? Timestamp)
        #expect(abs(estimate.dateValue().timeIntervalSinceNow) < 600)
        #expect(same(snap.data(with: .previous)?["old"], "before"))
        try await ref.updateData(["tags": FieldValue.arrayRemove(["a"])])
        #expect(same(try await ref.getDocument(source: .cache).get("tags"), ["b", "c"]))
    }

    @Test func transformsReplayToTheSameValuesAfterAReopen() async throws {
        let store = try Store()
        var db = try store.open()
        try await db.document("c/t").setData(["n": 1, "when": FieldValue.serverTimestamp()])
        try await db.document("c/t").updateData(["n": FieldValue.increment(Int64(41))])
        let before = try await db.document("c/t").getDocument(source: .cache).get("when", serverTimestampBehavior: .estimate) as? Timestamp
        try await db.terminate()
        db = try store.open()
        let snap = try await db.document("c/t").getDocument(source: .cache)
        #expect(snap.get("n") as? Int == 42)
        #expect(snap.get("when", serverTimestampBehavior: .estimate) as? Timestamp == before)
        #expect(snap.metadata.hasPendingWrites)
        try await db.terminate()
    }

    @Test func firestoresLimitsAreRefusedWithClearErrorsAndNothingIsWritten() async throws {
        let db = Firestore.inMemory()
        var deep: [String: Any] = ["leaf": 1]
        for _ in 0..<20 { deep = ["m": deep] }
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c/deep").setData(deep) }
        var ok: [String: Any] = ["leaf": 1]
        for _ in 0..<19 { ok = ["m": ok] }
        try await db.document("c/ok").setData(ok)

        let big = String(repeating: "x", count: 1_048_576)
        do {
            try await db.document("c/big").setData(["s": big])
            Issue.record("a document over 1 MiB was accepted")
        } catch let e as FirestoreErrorCode {
            #expect(e.code == .invalidArgument && e.message.contains("1 MiB"))
        }
        for bad in ["c/__x__", "c/.", "c//", "c"] {
            await #expect(throws: FirestoreErrorCode.self, "\(bad)") { try await db.document(bad).setData(["a": 1]) }
        }
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c/d").setData(["a": FieldValue.delete()]) }
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c/d").setData(["a": [FieldValue.serverTimestamp()]]) }
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c/d").updateData(["a..b": 1]) }
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c/d").setData(["g": GeoPoint(latitude: 91, longitude: 0)]) }
        let docs = try await db.collection("c").getDocuments(source: .cache)
        #expect(ids(docs) == ["ok"])
    }

    @Test func aWriteBatchIsAllOrNothing() async throws {
        let store = try Store()
        var db = try store.open()
        let batch = db.batch()
        batch.setData(["a": 1], forDocument: db.document("c/1"))
        batch.setData(["b": FieldValue.delete()], forDocument: db.document("c/2"))  // invalid: delete in a plain set
        await #expect(throws: FirestoreErrorCode.self) { try await batch.commit() }
        #expect(try await db.collection("c").getDocuments(source: .cache).isEmpty)

        let good = db.batch()
        good.setData(["a": 1], forDocument: db.document("c/1"))
        good.updateData(["a": FieldValue.increment(Int64(1))], forDocument: db.document("c/1"))
        good.setData(["x": true], forDocument: db.document("c/2"))
        good.deleteDocument(db.document("c/3"))
        try await good.commit()
        await #expect(throws: FirestoreErrorCode.self) { try await good.commit() }
        try await db.terminate()
        db = try store.open()
        let docs = try await db.collection("c").getDocuments(source: .cache)
        #expect(ids(docs) == ["1", "2"])
        #expect(docs.documents[0].data()["a"] as? Int == 2)
        #expect(try await db.document("c/3").getDocument(source: .cache).exists == false)
        try await db.terminate()
    }

    @Test func addDocumentMakesTwentyCharacterIds() async throws {
        let db = Firestore.inMemory()
        var seen = Set<String>()
        for i in 0..<50 {
            let ref = try await db.collection("posts").addDocument(data: ["i": i])
            #expect(ref.documentID.count == 20 && ref.documentID.allSatisfy { $0.isASCII && ($0.isLetter || $0.isNumber) })
            seen.insert(ref.documentID)
        }
        #expect(seen.count == 50)
        #expect(try await db.collection("posts").count.getAggregation(source: .cache).count == 50)
    }

    @Test func subcollectionsAndCollectionGroupsFindTheirDocuments() async throws {
        let db = Firestore.inMemory()
        try await db.document("cities/SF").setData(["name": "SF"])
        try await db.collection("cities/SF/landmarks").document("bridge").setData(["type": "bridge"])
        try await db.document("cities/LA").collection("landmarks").document("sign").setData(["type": "sign"])
        try await db.document("parks/x/landmarks/tree").setData(["type": "tree"])
        // cities/LA was never written: only its subcollection holds a document.
        #expect(ids(try await db.collection("cities").getDocuments(source: .cache)) == ["SF"])
        #expect(ids(try await db.collection("cities/SF/landmarks").getDocuments(source: .cache)) == ["bridge"])
        let group = try await db.collectionGroup("landmarks").order(by: "type").getDocuments(source: .cache)
        #expect(ids(group) == ["bridge", "sign", "tree"])
        #expect(db.document("cities/SF/landmarks/bridge").parent.parent?.path == "cities/SF")
    }

    @Test func readsFromTheServerFailAndTheCacheAnswersOffline() async throws {
        let db = Firestore.inMemory()
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c/x").getDocument(source: .cache) }
        do {
            _ = try await db.document("c/x").getDocument(source: .server)
            Issue.record("a server read succeeded with no server")
        } catch let e as FirestoreErrorCode { #expect(e.code == .unavailable) }
        await #expect(throws: FirestoreErrorCode.self) { try await db.collection("c").getDocuments(source: .server) }
        let empty = try await db.collection("c").getDocuments(source: .cache)
        #expect(empty.isEmpty && empty.metadata.isFromCache)
        try await db.document("c/x").setData(["a": 1])
        let d = try await db.document("c/x").getDocument()
        #expect(d.exists && d.metadata.isFromCache && d.metadata.hasPendingWrites)
    }

    @Test func transactionsFailAtOnceOfflineWithoutRunningTheirBody() async throws {
        let db = Firestore.inMemory()
        let ran = FerryMutex(false)
        do {
            _ = try await db.runTransaction { _ in ran.withLock { $0 = true } }
            Issue.record("a transaction ran offline")
        } catch let e as FirestoreErrorCode {
            #expect(e.code == .unavailable)
        }
        #expect(ran.withLock { $0 } == false)
    }

    @Test func aSecondOpenOfTheSameStoreIsRefusedUntilTheFirstTerminates() async throws {
        let store = try Store()
        let db = try store.open()
        do {
            _ = try store.open()
            Issue.record("two opens of one store")
        } catch let e as FirestoreErrorCode { #expect(e.code == .unavailable) }
        try await db.terminate()
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c/d").setData(["a": 1]) }
        _ = try store.open()  // released by terminate
    }

    @Test func clearPersistenceNeedsATerminatedStoreAndDeletesIt() async throws {
        let store = try Store()
        var db = try store.open()
        try await db.document("c/d").setData(["a": 1])
        await #expect(throws: FirestoreErrorCode.self) { try await db.clearPersistence() }
        try await db.terminate()
        try await db.clearPersistence()
        db = try store.open()
        #expect(try await db.collection("c").getDocuments(source: .cache).isEmpty)
        try await db.terminate()
    }

    @Test func waitForPendingWritesWaitsOfflineUntilCancelled() async throws {
        let db = Firestore.inMemory()
        try await db.waitForPendingWrites()  // nothing pending: returns
        try await db.document("c/d").setData(["a": 1])
        let task = Task { try await db.waitForPendingWrites() }
        task.cancel()
        await #expect(throws: CancellationError.self) { try await task.value }
    }
}

extension DocumentModelTests {
    /// Live writes apply the batch as written and replay applies the decoded record: the two
    /// must be the same batch.
    @Test func aWriteBatchRecordDecodesToTheBatchWritten() throws {
        let key = ResourcePath(["c", "d"])
        let batch = MutationBatch(id: 7, localWriteTime: Timestamp(seconds: 9, nanoseconds: 5000), mutations: [
            Mutation(operation: .set, key: key, fields: ["a": .map(["b": .array([.integer(1), .double(.nan), .bytes(Data([1, 2]))])]), "t": .timestamp(Timestamp(seconds: -3, nanoseconds: 1000))]),
            Mutation(operation: .patch, key: key, fields: ["x": .geoPoint(GeoPoint(latitude: 1, longitude: -2))], mask: [FieldPath(["x"]), FieldPath(["y.z", "w"])],
                     transforms: [(FieldPath(["n"]), .increment(.integer(3))), (FieldPath(["s"]), .serverTimestamp), (FieldPath(["arr"]), .arrayUnion([.string("q"), .null])), (FieldPath(["r"]), .arrayRemove([.reference("a/b")]))],
                     mustExist: true),
            Mutation(operation: .delete, key: ResourcePath(["c", "e", "f", "g"])),
        ])
        let payload = DocumentRecords.encode(batch)
        let decoded = try payload.withUnsafeBytes { try DocumentRecords.decodeBatch(id: 7, $0) }
        #expect(decoded == batch)
        // A truncated record is refused, never misread.
        for cut in [1, payload.count / 2, payload.count - 1] {
            #expect(throws: FirestoreErrorCode.self) { try Array(payload.prefix(cut)).withUnsafeBytes { try DocumentRecords.decodeBatch(id: 7, $0) } }
        }
    }
}

extension DocumentModelTests {
    @Test func foundationNumbersKeepTheirTypes() async throws {
        let db = Firestore.inMemory()
        let parsed = try JSONSerialization.jsonObject(with: Data(#"{"b": true, "i": 2, "d": 2.5, "z": 2.0}"#.utf8)) as! [String: Any]
        try await db.document("c/n").setData(parsed)
        let snap = try await db.document("c/n").getDocument(source: .cache)
        #expect(snap.get("b") as? Bool == true && !(snap.get("b") is Int))
        #expect(snap.get("i") as? Int == 2)
        #expect(snap.get("d") as? Double == 2.5)
    }

    @Test func invalidArrayUnionElementsFailTheWrite() async throws {
        let db = Firestore.inMemory()
        try await db.document("c/a").setData(["tags": ["x"]])
        do {
            try await db.document("c/a").updateData(["tags": FieldValue.arrayUnion([[1, 2]])])
            Issue.record("a nested array in arrayUnion was accepted")
        } catch let e as FirestoreErrorCode { #expect(e.code == .invalidArgument) }
        #expect(same(try await db.document("c/a").getDocument(source: .cache).get("tags"), ["x"]))
    }

    @Test func theSizeLimitHoldsForTheDocumentAWriteLeaves() async throws {
        let db = Firestore.inMemory()
        let half = String(repeating: "x", count: 600_000)
        try await db.document("c/big").setData(["a": half])
        do {
            try await db.document("c/big").updateData(["b": half])
            Issue.record("an update grew a document past 1 MiB")
        } catch let e as FirestoreErrorCode { #expect(e.code == .invalidArgument && e.message.contains("after this write")) }
        #expect(try await db.document("c/big").getDocument(source: .cache).get("b") == nil)
    }

    @Test func pathsWithEmptySegmentsAreRefused() async throws {
        let db = Firestore.inMemory()
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c//d/e").setData(["a": 1]) }
        try await db.document("/c/d/").setData(["a": 1])  // a leading or trailing slash is allowed
        #expect(try await db.document("c/d").getDocument(source: .cache).exists)
    }
}
