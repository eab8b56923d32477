import FerryLog
import FerryTestSupport
import Foundation
import Synchronization
import Testing

@testable @_spi(Server) @_spi(Tools) import Ferry

/// The sync cursor (acknowledgements in write order, one record per batch), rejected writes
/// kept for the app, the receipts that wait for either, and writes that do not wait.
@Suite struct SyncCursorTests {
    static func records(_ dir: TemporaryDirectory, kind: UInt8) throws -> Int {
        let log = try LogInspection.inspect(dir.path)
        var n = 0
        try log.forEachRecord { r in if r.kind == kind { n += 1 } }
        return n
    }

    @Test func acknowledgingInWriteOrderWritesOneCursorRecordPerBatchAndSurvivesReopen() async throws {
        let dir = try TemporaryDirectory()
        var ids: [Int64] = []
        do {
            let db = try Database.open(at: dir.path, options: quietOptions(.none))
            for i in 0..<200 { ids.append(try db.reference("posts/p\(i)").setValueNow(["n": .int(Int64(i))]).writeID!) }
            #expect(db.pendingWriteCount == 200)
            try await db.acknowledgeWrites(through: ids[149])
            #expect(db.pendingWriteCount == 50)
            #expect(db.acknowledgedThrough == ids[149])
            try await db.acknowledgeWrites(through: ids[199])
            #expect(db.pendingWriteIDs.isEmpty)
            try await db.acknowledgeWrites(through: ids[10])  // an older cursor changes nothing
            #expect(db.acknowledgedThrough == ids[199])
            try await db.close()
        }
        #expect(try Self.records(dir, kind: 7) == 2, "one cursor record per batch, none for a cursor that does not move")
        #expect(try Self.records(dir, kind: 5) == 0)
        for withCheckpoint in [true, false] {
            if !withCheckpoint { try CompactionTests.removeCheckpoints(dir) }
            let db = try Database.open(at: dir.path, options: quietOptions(.none))
            #expect(db.acknowledgedThrough == ids[199])
            #expect(db.pendingWriteCount == 0)
            // The acknowledged values are the server's data now (no listen covered them).
            #expect(try await db.reference("posts/p7/n").getData().value == 7)
            #expect(try await db.reference("posts/p7").getData().metadata.hasPendingWrites == false)
            try await db.close()
        }
    }

    @Test func theCursorGivesTheSameStateAsOneAcknowledgementAtATime() async throws {
        // Overlapping writes (a newer one below an older, one shadowing another, updates over
        // sets) acknowledged in order by the cursor and one by one must leave the same data.
        func run(cursor: Bool) async throws -> (Value, Value, [Int64]) {
            let dir = try TemporaryDirectory()
            let db = try Database.open(at: dir.path, options: quietOptions(.none))
            try await db.applyServerPut(at: "", ["other": 1])
            let listened = Recorder()
            try db.reference("a").observe(.value) { listened.record(.value, $0) }
            var ids: [Int64] = []
            ids.append(try await db.reference("a").setValue(["x": 1, "y": ["z": 2]]).writeID!)
            ids.append(try await db.reference("a/y/z").setValue(3).writeID!)
            ids.append(try await db.reference("b").setValue("leaf").writeID!)
            ids.append(try await db.reference("b/c").setValue(4).writeID!)
            ids.append(try await db.reference("a").updateChildValues(["x": 5, "w/v": 6]).writeID!)
            ids.append(try await db.reference("b").setValue(.null).writeID!)
            ids.append(try await db.reference("d").setValue(7).writeID!)
            if cursor {
                try await db.acknowledgeWrites(through: ids[3])
                try await db.acknowledgeWrites(through: ids[6])
            } else {
                for id in ids { try await db.acknowledgeWrite(id) }
            }
            let live = try await db.root.getData().value
            try await db.close()
            let reopened = try Database.open(at: dir.path, options: quietOptions(.none))
            let replayed = try await reopened.root.getData().value
            let pending = reopened.pendingWriteIDs
            try await reopened.close()
            #expect(listened.values.last == live["a"] ?? .null)
            return (live, replayed, pending)
        }
        let byCursor = try await run(cursor: true)
        let oneByOne = try await run(cursor: false)
        #expect(byCursor.0 == oneByOne.0)
        #expect(byCursor.1 == byCursor.0, "replay gives the live state")
        #expect(byCursor.2.isEmpty)
        // A listen keeps /a current, so its acknowledged values wait for the server's own update
        // there and are not taken as server data; /d has no listen: its value is.
        #expect(byCursor.0 == json(#"{"other":1,"d":7}"#))
    }

    @Test func aRejectedWriteIsRevertedKeptAcrossRestartsAndCompactionUntilCleared() async throws {
        let dir = try TemporaryDirectory()
        var options = CompactionTests.options()
        let db = try await CompactionTests.open(dir, options)
        let rec = Recorder()
        try db.reference("secret").observe(.value) { rec.record(.value, $0) }
        let ok = try await db.reference("open").setValue(1)
        let denied = try await db.reference("secret").setValue(["k": ServerValue.increment(2)])
        let update = try await db.reference("more").updateChildValues(["a/b": 1, "c": "d"])
        #expect(rec.values.last == json(#"{"k":2}"#))
        try await db.acknowledgeWrites(through: update.writeID!, rejecting: [
            WriteRejection(writeID: denied.writeID!, status: 401, message: "Permission denied"),
            WriteRejection(writeID: update.writeID!, status: 400, message: "Invalid data"),
        ])
        #expect(rec.values.last == .null, "the listener sees the revert")
        try await ok.serverAcknowledgement()
        await #expect(throws: DatabaseError.self) { try await denied.serverAcknowledgement() }
        do {
            try await update.serverAcknowledgement()
            Issue.record("a rejected write's receipt must throw")
        } catch let e as DatabaseError {
            #expect(e.code == .writeRejected)
            #expect(e.message.contains("Invalid data"))
        }
        let expected = [
            RejectedWrite(writeID: denied.writeID!, path: Path("secret"), kind: .set, value: json(#"{"k":{".sv":{"increment":2}}}"#),
                          status: 401, message: "Permission denied", rejectedAt: 0),
            RejectedWrite(writeID: update.writeID!, path: Path("more"), kind: .update, value: json(#"{"a/b":1,"c":"d"}"#),
                          status: 400, message: "Invalid data", rejectedAt: 0),
        ]
        func same(_ a: [RejectedWrite]) -> Bool {
            a.map { [$0.writeID, $0.path, $0.kind, $0.value, $0.status, $0.message] as [AnyHashable] }
                == expected.map { [$0.writeID, $0.path, $0.kind, $0.value, $0.status, $0.message] as [AnyHashable] }
        }
        #expect(same(try db.rejectedWrites()))
        // Compaction deletes the segments holding the writes and their rejections; the list stays.
        for r in 0..<6 { for i in 0..<50 { try await db.acknowledgeWrites(through: try await db.reference("posts/p\(i)").setValue(CompactionTests.post(round: r, i)).writeID!) } }
        let report = try await db.compact()
        #expect(!report.deletedSegments.isEmpty)
        #expect(try db.rejectedWrites().allSatisfy { $0.writeID < Int64(db.log!.firstLSN.rawValue) })
        #expect(same(try db.rejectedWrites()))
        options.checkpointOnClose = false
        try await db.close()
        let reopened = try Database.open(at: dir.path, options: options)
        #expect(same(try reopened.rejectedWrites()))
        #expect(reopened.acknowledgedThrough > update.writeID!)
        try await reopened.clearRejectedWrites([denied.writeID!])
        #expect(try reopened.rejectedWrites().map(\.writeID) == [update.writeID!])
        try await reopened.clearRejectedWrites()
        #expect(try reopened.rejectedWrites().isEmpty)
        try await reopened.close()
        let again = try Database.open(at: dir.path, options: options)
        #expect(try again.rejectedWrites().isEmpty)
        try await again.close()
    }

    @Test func aReceiptWaitEndsOnTheAnswerOnCloseAndOnCancellation() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        let a = try await db.reference("a").setValue(1)
        let b = try await db.reference("b").setValue(2)
        let c = try await db.reference("c").setValue(3)
        let waitA = Task { try await a.serverAcknowledgement() }
        let waitB = Task { try await b.serverAcknowledgement() }
        let waitC = Task { try await c.serverAcknowledgement() }
        try await db.acknowledgeWrites(through: a.writeID!)
        try await waitA.value
        waitB.cancel()
        await #expect(throws: CancellationError.self) { try await waitB.value }
        // Awaited after the answer too.
        try await a.serverAcknowledgement()
        try await db.close()
        do {
            try await waitC.value
            Issue.record("a wait must end when the database closes")
        } catch let e as DatabaseError {
            #expect(e.code == .closed)
        }
        // And awaited after close.
        await #expect(throws: DatabaseError.self) { try await c.serverAcknowledgement() }
    }

    @Test func aWriteThatDoesNotWaitIsAppliedAtOnceAndBecomesDurable() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        let rec = Recorder()
        try db.reference("list").observe(.childAdded) { rec.record(.childAdded, $0) }
        var receipts: [WriteReceipt] = [try db.reference("list").setValueNow(["start": true])]
        for i in 0..<100 {
            receipts.append(try db.reference("list/i\(i)").setValueNow(.int(Int64(i))))
            #expect(rec.all.last?.key == "i\(i)", "the listener has run when the call returns")
        }
        receipts.append(try db.reference("list").updateChildValuesNow(["i0": "zero", "i1": .null]))
        receipts.append(try db.reference("list/i2").removeValueNow())
        receipts.append(try db.reference("list/i3").setValueNow(jsonBytes: Array(#"{"three":3}"#.utf8)))
        #expect(try await db.reference("list/i0").getData().value == "zero")
        #expect(throws: DatabaseError.self) { try db.reference("list").updateChildValuesNow(["a": 1, "a/b": 2]) }
        for r in receipts { try await r.durable() }
        #expect(db.pendingWriteCount == 104)
        try await db.close()
        let reopened = try Database.open(at: dir.path, options: quietOptions())
        let list = try await reopened.reference("list").getData()
        #expect(list.childrenCount == 99)
        #expect(list.value["i3"] == json(#"{"three":3}"#))
        try await reopened.close()
    }

    @Test func ferryDumpShowsTheCursorAndTheRejectedWrites() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        let a = try await db.reference("a").setValue(1)
        let b = try await db.reference("b").setValue(2)
        try await db.acknowledgeWrites(through: b.writeID!, rejecting: [WriteRejection(writeID: b.writeID!, status: 401, message: "Permission denied")])
        try await db.close()
        let dump = Locations.executable("ferry-dump")
        func runDump(_ args: [String]) throws -> String {
            let r = try run(dump, args)
            #expect(r.status == 0, "ferry-dump \(args.joined(separator: " ")): \(r.stdout)")
            return r.stdout
        }
        let at = try runDump(["at", dir.path])
        #expect(at.contains("sync cursor:  \(b.writeID!)"))
        #expect(at.contains("rejected writes (1): \(b.writeID!) /b (401: Permission denied)"))
        let stats = try runDump(["stats", dir.path])
        #expect(stats.contains("sync cursor:         writes up to \(b.writeID!) answered by the server"))
        let records = try runDump(["records", dir.path])
        #expect(records.contains("write \(b.writeID!) rejected by the server (401: Permission denied), reverted and kept: set /b 2"))
        #expect(records.contains("sync cursor → \(b.writeID!)"))
        _ = a
    }
}

extension Value {
    subscript(key: String) -> Value? {
        if case .object(let o) = self { return o[key] }
        return nil
    }
}
