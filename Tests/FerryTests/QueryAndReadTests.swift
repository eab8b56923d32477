import FerryLog
import FerryTestSupport
import Foundation
import Synchronization
import Testing

@testable @_spi(Server) import Ferry

@Suite struct QueryTests {
    func scores(_ db: Database) async throws {
        try await db.applyServerPut(at: "scores", [
            "ada": ["score": 90], "bob": ["score": 70], "cy": ["score": 80], "dee": ["score": 60],
        ])
    }

    @Test func orderByChildWithALimitKeepsTheWindowAndMovesChildrenInAndOut() async throws {
        let db = Database.inMemory()
        try await scores(db)
        let top2 = try db.root.child("scores").queryOrdered(byChild: "score").queryLimited(toLast: 2)
        let rec = Recorder()
        rec.listen(top2)
        #expect(rec.all.map(\.description) == [
            #"child_added cy {"score":80}"#, #"child_added ada {"score":90} after cy"#, #"value scores {"ada":{"score":90},"cy":{"score":80}}"#,
        ])
        rec.reset()
        try await db.root.child("scores/bob/score").setValue(100)  // bob enters at the top, cy leaves
        #expect(rec.all.map(\.description) == [
            #"child_removed cy {"score":80}"#, #"child_added bob {"score":100} after ada"#, #"value scores {"ada":{"score":90},"bob":{"score":100}}"#,
        ])
        rec.reset()
        try await db.root.child("scores/ada/score").setValue(120)  // ada moves above bob
        #expect(rec.all.map(\.type) == [.childMoved, .childChanged, .value])
        #expect(rec.all[0].prev == "bob")
        rec.reset()
        try await db.root.child("scores/bob").removeValue()  // bob leaves, the window refills with cy
        #expect(rec.all.map(\.description) == [
            #"child_removed bob {"score":100}"#, #"child_added cy {"score":80}"#, #"value scores {"ada":{"score":120},"cy":{"score":80}}"#,
        ])
    }

    @Test func rangeQueriesFollowFirebaseOrdering() async throws {
        let db = Database.inMemory()
        try await db.applyServerPut(at: "v", ["a": .null, "b": false, "c": true, "d": 3, "e": 10, "f": "apple", "g": "pear", "h": ["x": 1]])
        let byValue = try db.root.child("v").queryOrderedByValue()
        let order = try await byValue.getData().children.map(\.key!)
        #expect(order == ["b", "c", "d", "e", "f", "g", "h"])
        let closed = try byValue.queryStarting(atValue: 3).queryEnding(atValue: "apple")
        #expect(try await closed.getData().children.map(\.key!) == ["d", "e", "f"])
        let open = try byValue.queryStarting(afterValue: 3).queryEnding(beforeValue: "pear")
        #expect(try await open.getData().children.map(\.key!) == ["e", "f"])
        #expect(try await (try byValue.queryEqual(toValue: true)).getData().children.map(\.key!) == ["c"])
        #expect(try await (try byValue.queryLimited(toFirst: 2)).getData().children.map(\.key!) == ["b", "c"])

        try await db.applyServerPut(at: "k", ["10": 1, "9": 1, "a": 1, "-1": 1, "007": 1, "7": 1, "b": 1])
        let keys = try await db.root.child("k").queryOrderedByKey().getData().children.map(\.key!)
        #expect(keys == ["-1", "7", "007", "9", "10", "a", "b"], "integer keys first, numerically")
        let range = try db.root.child("k").queryOrderedByKey().queryStarting(atValue: "9").queryEnding(atValue: "a")
        #expect(try await range.getData().children.map(\.key!) == ["9", "10", "a"])
    }

    @Test func priorityOrderAndKeyTieBreaks() async throws {
        let db = Database.inMemory()
        try await db.applyServerPut(at: "p", [
            "a": [".value": 1, ".priority": 2], "b": [".value": 1, ".priority": 1], "c": 1, "d": [".value": 1, ".priority": "z"],
        ])
        let byPriority = try await db.root.child("p").queryOrderedByPriority().getData().children.map(\.key!)
        #expect(byPriority == ["c", "b", "a", "d"], "no priority, then numbers, then strings")
        let fromB = try await (try db.root.child("p").queryOrdered(byChild: "x").queryStarting(atValue: .null, childKey: "b")).getData()
        #expect(fromB.children.map(\.key!) == ["b", "c", "d"])
        #expect(try await db.root.child("p/a").getData().exportValue == [".value": 1, ".priority": 2])
    }

    @Test func invalidQueriesAreRefused() throws {
        let db = Database.inMemory()
        let ref = db.root
        #expect(throws: DatabaseError.self) { _ = try ref.queryOrderedByKey().queryOrderedByValue() }
        #expect(throws: DatabaseError.self) { _ = try ref.queryLimited(toFirst: 0) }
        #expect(throws: DatabaseError.self) { _ = try ref.queryLimited(toFirst: 1).queryLimited(toLast: 1) }
        #expect(throws: DatabaseError.self) { _ = try ref.queryStarting(atValue: 1).queryEqual(toValue: 2) }
        #expect(throws: DatabaseError.self) { _ = try ref.queryOrderedByKey().queryStarting(atValue: 1) }
        #expect(throws: DatabaseError.self) { _ = try ref.queryOrdered(byChild: "$key") }
        #expect(throws: DatabaseError.self) { _ = try ref.queryOrderedByPriority().queryStarting(atValue: ["o": 1]) }
    }

    @Test func aQueryOverCachedChildrenWorksOfflineWhileItsLocationIsIncomplete() async throws {
        let db = Database.inMemory()
        try await db.root.child("posts/p1").setValue(["n": 1])
        try await db.root.child("posts/p2").setValue(["n": 2])
        let rec = Recorder()
        rec.listen(try db.root.child("posts").queryOrdered(byChild: "n").queryLimited(toFirst: 5))
        #expect(rec.all.map(\.type) == [.childAdded, .childAdded], "children known; the location is not complete, so no value")
    }
}

@Suite struct ReadTests {
    @Test func getDataReadsTheCacheOrSaysWhyItCannot() async throws {
        let db = Database.inMemory()
        do {
            _ = try await db.root.child("nothing").getData()
            Issue.record("uncached data was returned")
        } catch let e as DatabaseError {
            #expect(e.code == .notCached)
            #expect(e.message.contains("neither available from a server"))
            #expect(e.message.contains("/nothing"))
        }
        try await db.applyServerPut(at: "cached", ["a": 1])
        #expect(try await db.root.child("cached").getData().value == ["a": 1])
        #expect(try await db.root.child("cached/a").getData().value == 1)
        #expect(try await db.root.child("cached/missing").getData().exists == false, "known absent: complete, null")
    }

    @Test func observeSingleEventTakesTheCacheFirstAndOtherwiseWaitsForData() async throws {
        let db = Database.inMemory()
        try await db.applyServerPut(at: "here", 1)
        #expect(try await db.root.child("here").observeSingleEvent().value == 1)
        let later = Task { try await (try db.root.child("later")).observeSingleEvent().value }
        // It waits (observes) before the data arrives: not a read of the cache after it came.
        try #require(await eventually { db.engine.withLock { !$0.registrations.isEmpty } }, "the single-event wait observes")
        try await db.applyServerPut(at: "later", "arrived")
        #expect(try await later.value == "arrived")
    }

    @Test func removedObserversHearNothingMore() async throws {
        let db = Database.inMemory()
        let rec = Recorder()
        let ref = try db.root.child("x")
        let handle = ref.observe(.value) { rec.record(.value, $0) }
        try await ref.setValue(1)
        ref.removeObserver(withHandle: handle)
        try await ref.setValue(2)
        #expect(rec.values == [1])
        let other = Recorder()
        ref.observe(.value) { other.record(.value, $0) }
        ref.observe(.childAdded) { other.record(.childAdded, $0) }
        ref.removeAllObservers()
        try await ref.setValue(["k": 3])
        #expect(other.values == [2])
    }

    @Test func theAsyncSequenceDeliversValuesAndStopsWhenCancelled() async throws {
        let db = Database.inMemory()
        let ref = try db.root.child("counter")
        let received = FerryMutex<[Value]>([])
        let reader = Task {
            for try await snapshot in ref.values() {
                received.withLock { $0.append(snapshot.value) }
                if snapshot.value == 3 { break }
            }
        }
        try #require(await eventually { db.engine.withLock { !$0.registrations.isEmpty } }, "the sequence observes before the writes")
        for i in 1...3 { try await ref.setValue(.int(Int64(i))) }
        try await reader.value
        #expect(received.withLock { $0 } == [1, 2, 3])
        #expect(await eventually { db.engine.withLock { $0.registrations.isEmpty } }, "the observer went away with the sequence")
    }

    @Test func listenersCanRunOnAChosenQueue() async throws {
        var options = quietOptions()
        let queue = DispatchQueue(label: "callbacks")
        options.callbackQueue = queue
        let db = Database.inMemory(options: options)
        let onQueue = FerryMutex(false)
        let label = DispatchSpecificKey<String>()
        queue.setSpecific(key: label, value: "callbacks")
        try db.root.child("q").observe(.value) { _ in onQueue.withLock { $0 = DispatchQueue.getSpecific(key: label) == "callbacks" } }
        try await db.root.child("q").setValue(1)
        queue.sync {}
        #expect(onQueue.withLock { $0 })
    }
}

@Suite struct TransactionTests {
    @Test func concurrentTransactionsCountExactly() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        let counter = try db.root.child("counter")
        try await counter.setValue(0)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for _ in 0..<8 {
                group.addTask {
                    for _ in 0..<25 {
                        let result = try await counter.runTransaction { data in
                            data.value = .int((data.value.number.map { Int64($0) } ?? 0) + 1)
                            return .commit
                        }
                        #expect(result.committed)
                    }
                }
            }
            try await group.waitForAll()
        }
        #expect(try await counter.getData().value == 200)
        try await db.close()
    }

    @Test func anAbortedTransactionWritesNothing() async throws {
        let db = Database.inMemory()
        try await db.root.child("x").setValue("keep")
        let result = try await db.root.child("x").runTransaction { data in
            data.value = "changed"
            return .abort
        }
        #expect(!result.committed)
        #expect(result.snapshot.value == "keep")
        #expect(try await db.root.child("x").getData().value == "keep")
    }

    @Test func aTransactionOnUncachedDataStartsFromNull() async throws {
        let db = Database.inMemory()
        let result = try await db.root.child("fresh").runTransaction { data in
            #expect(data.value == .null)
            data.value = ["created": true]
            return .commit
        }
        #expect(result.committed)
        #expect(result.snapshot.value == ["created": true])
    }
}

@Suite struct StoreTests {
    @Test func aSecondOpenerGetsAClearStoreInUseError() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        do {
            _ = try Database.open(at: dir.path, options: quietOptions())
            Issue.record("a second open succeeded")
        } catch let e as DatabaseError {
            #expect(e.code == .storage)
            #expect((e.underlying as? LogError)?.code == .storeInUse)
            #expect(e.message.contains("in use"))
        }
        try await db.close()
    }

    @Test func aClosedDatabaseRefusesWrites() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        try await db.close()
        do {
            try await db.root.child("x").setValue(1)
            Issue.record("a write after close succeeded")
        } catch let e as DatabaseError {
            #expect(e.code == .closed)
        }
    }

    @Test func aCorruptLogIsReportedWithFileAndOffsetAndNothingIsWiped() async throws {
        let dir = try TemporaryDirectory()
        do {
            var o = quietOptions()
            o.segmentSize = 4096
            let db = try Database.open(at: dir.path, options: o)
            for i in 0..<200 { try await db.root.child("k\(i)").setValue(["i": .int(Int64(i))]) }
            try await db.close()
        }
        let segments = try Files.list(dir.path).filter { $0.hasSuffix(".wal") }
        #expect(segments.count > 2)
        try Files.flipBit(dir.sub(segments[1]), byte: 300, bit: 2)
        let before = try Files.snapshot(dir.path)
        do {
            _ = try Database.open(at: dir.path, options: quietOptions())
            Issue.record("a corrupt store opened")
        } catch let e as DatabaseError {
            let log = try #require(e.underlying as? LogError)
            #expect(log.code == .corruption)
            #expect(log.file?.hasSuffix(segments[1]) == true)
            #expect(log.offset != nil)
        }
        #expect(try Files.snapshot(dir.path).filter { $0.key != "LOCK" } == before.filter { $0.key != "LOCK" })
    }

    @Test func aMemoryOnlyDatabaseBehavesTheSameAndWritesNothing() async throws {
        let dir = try TemporaryDirectory()
        let stored = try Database.open(at: dir.path, options: quietOptions())
        let memory = Database.inMemory(options: quietOptions())
        for db in [stored, memory] {
            try await db.applyServerPut(at: "s", ["a": 1])
            try await db.root.child("s/b").setValue(2)
            let w = try await db.root.child("s/c").setValue(3)
            try await db.applyServerMerge(at: "s", ["c": 3])
            try await db.acknowledgeWrite(w.writeID!)
        }
        #expect(try await stored.root.child("s").getData().value == memory.root.child("s").getData().value)
        #expect(memory.path == nil)
        try await stored.close()
    }
}
