import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable @_spi(Server) @_spi(Tools) import Ferry

@Suite struct CompactionTests {
    static func options(segmentSize: Int = 16 << 10, automatic: Int? = nil) -> DatabaseOptions {
        var o = quietOptions(.none)
        o.segmentSize = segmentSize
        o.compactionSegments = automatic
        return o
    }

    /// 50 posts written `rounds` times each and acknowledged as a server does (in order), plus
    /// server data with a leaf turned into an object below it; returns the ids still pending.
    @discardableResult
    static func fill(_ db: Database, rounds: Int, acknowledge: Bool = true) async throws -> [Int64] {
        try await db.applyServerPut(at: "s", ["leaf": "text", "n": 1])
        try await db.applyServerMerge(at: "s/leaf", ["child": "now an object"])
        var ids: [Int64] = []
        for r in 0..<rounds {
            for i in 0..<50 {
                let id = try await db.reference("posts/p\(i)").setValue(post(round: r, i)).writeID!
                if acknowledge { try await db.acknowledgeWrite(id) } else { ids.append(id) }
            }
        }
        return ids
    }

    /// The value at a slash-separated path inside `v` (null where there is none).
    static func at(_ v: Value, _ path: String) -> Value {
        path.split(separator: "/").reduce(v) { v, k in
            if case .object(let o) = v { return o[String(k)] ?? .null }
            return .null
        }
    }

    /// A fresh database whose server data is known to start empty (so the root reads complete).
    static func open(_ dir: TemporaryDirectory, _ options: DatabaseOptions = options()) async throws -> Database {
        let db = try Database.open(at: dir.path, options: options)
        try await db.applyServerPut(at: "", [:])
        return db
    }

    /// A post that compresses little (so that a few rounds fill several 16 KiB segments).
    static func post(round r: Int, _ i: Int) -> Value {
        let body = (0..<24).map { String(($0 &* 7919 &+ i &* 104_729 &+ r &* 1_299_709) % 1_000_003, radix: 36) }.joined(separator: " ")
        return ["round": .int(Int64(r)), "body": .string(body)]
    }

    static func everything(_ db: Database) async throws -> Value { try await db.root.getData().value }

    static func removeCheckpoints(_ dir: TemporaryDirectory) throws {
        for f in try Files.list(dir.path) where f.hasPrefix("checkpoint-") { try Files.remove(dir.sub(f)) }
    }

    @Test func compactionDeletesAcknowledgedSegmentsAndEveryReadStaysTheSame() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.open(dir)
        try await Self.fill(db, rounds: 20)
        // With .none durability the writer may still hold records (a loaded machine); the
        // figures below are about segments on disk, so let it write them all first.
        try await db.sync()
        let before = try await Self.everything(db)
        #expect(Self.at(before, "posts/p7") == Self.post(round: 19, 7))
        #expect(Self.at(before, "s") == .object(["leaf": ["child": "now an object"], "n": 1]))
        let segmentsBefore = db.log!.segments.count

        let report = try await db.compact()
        #expect(!report.deletedSegments.isEmpty)
        #expect(report.restatedEntries >= 50, "every post, and the server data, is carried forward")
        #expect(report.segmentBytesAfter * 3 < report.segmentBytesBefore, "\(report.segmentBytesAfter) of \(report.segmentBytesBefore) bytes left")
        #expect(db.log!.segments.count < segmentsBefore)
        #expect(try await Self.everything(db) == before)
        // The deleted files are gone from the directory.
        let files = try Files.list(dir.path)
        for name in report.deletedSegments { #expect(!files.contains(name)) }
        try await db.close()

        for keepCheckpoint in [true, false] {
            if !keepCheckpoint { try Self.removeCheckpoints(dir) }
            var o = Self.options()
            o.checkpointOnClose = false
            let again = try Database.open(at: dir.path, options: o)
            #expect(try await Self.everything(again) == before, keepCheckpoint ? "from the checkpoint" : "replaying the log alone")
            #expect(again.pendingWriteCount == 0)
            try await again.close()
        }
    }

    @Test func aPendingWriteHoldsBackItsSegmentAndEveryLaterOne() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.open(dir)
        let first = try await db.reference("first").setValue("not yet acknowledged").writeID!
        try await Self.fill(db, rounds: 10)
        let before = try await Self.everything(db)

        let held = try await db.compact()
        #expect(held.deletedSegments.isEmpty, "the oldest segment holds a pending write")
        #expect(db.pendingWriteIDs == [first], "the pending write keeps its id")

        try await db.acknowledgeWrite(first)
        let done = try await db.compact()
        #expect(!done.deletedSegments.isEmpty)
        #expect(try await Self.everything(db) == before)
        try await db.close()
    }

    @Test func pendingWritesSurviveCompactionAndReopenWithTheirIDs() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.open(dir)
        try await Self.fill(db, rounds: 10)
        let pending = try await Self.fill(db, rounds: 2, acknowledge: false)
        try await db.sync()  // the acknowledged segments written and sealed, however slow the writer
        let before = try await Self.everything(db)
        let report = try await db.compact()
        #expect(!report.deletedSegments.isEmpty, "the acknowledged segments before the first pending write go")
        #expect(db.pendingWriteIDs == pending)
        try await db.close()
        try Self.removeCheckpoints(dir)
        let again = try Database.open(at: dir.path, options: Self.options())
        #expect(again.pendingWriteIDs == pending)
        #expect(try await Self.everything(again) == before)
        try await again.close()
    }

    @Test func writesAndAcknowledgementsGoOnWhileACompactionRuns() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.open(dir)
        try await Self.fill(db, rounds: 10)
        async let compaction = db.compact()
        for r in 0..<200 {
            let id = try await db.reference("posts/p\(r % 50)").setValue(["late": .int(Int64(r))]).writeID!
            if r % 2 == 0 { try await db.acknowledgeWrite(id) }
            try await db.applyServerPut(at: "s/n", .int(Int64(r)))
        }
        _ = try await compaction
        let before = try await Self.everything(db)
        #expect(Self.at(before, "posts/p49") == .object(["late": 199]))
        #expect(Self.at(before, "s/n") == 199)
        try await db.compact()
        #expect(try await Self.everything(db) == before)
        try await db.close()
        try Self.removeCheckpoints(dir)
        let again = try Database.open(at: dir.path, options: Self.options())
        #expect(try await Self.everything(again) == before)
        #expect(again.pendingWriteCount == 100)
        try await again.close()
    }

    @Test func aCheckpointOlderThanACompactionIsRefusedAndTheLogReplayed() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.open(dir)
        try await Self.fill(db, rounds: 10)
        try await db.checkpoint()
        let oldName = try #require(try Files.list(dir.path).first { $0.hasPrefix("checkpoint-") })
        let oldImage = try Files.read(dir.sub(oldName))
        try await Self.fill(db, rounds: 10)
        try await db.compact()
        let before = try await Self.everything(db)
        try await db.close()
        // As if the newer checkpoint were lost and the one from before the compaction were left:
        // it names records in deleted segments.
        try Self.removeCheckpoints(dir)
        try Files.write(dir.sub(oldName), oldImage)
        var o = Self.options()
        o.checkpointOnClose = false
        let again = try Database.open(at: dir.path, options: o)
        #expect(try await Self.everything(again) == before)
        try await again.close()
    }

    @Test func theDatabaseCompactsByItselfOnceEnoughSegmentsAreAcknowledged() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.open(dir, Self.options(automatic: 3))
        // (Read before the writes: under load the compaction can be over before they are.)
        let firstSegment = db.log!.segments.first!.name
        try await Self.fill(db, rounds: 30)
        let before = try await Self.everything(db)
        // The compaction runs in the background; wait for it to have deleted something.
        #expect(await eventually { db.log!.segments.first!.name != firstSegment }, "no compaction started after the acknowledgements")
        #expect(db.log!.segments.count <= 6)
        #expect(try await Self.everything(db) == before)
        try await db.close()
    }

    @Test func aMemoryDatabaseHasNothingToCompact() async throws {
        let db = Database.inMemory(options: Self.options())
        try await db.applyServerPut(at: "", [:])
        try await Self.fill(db, rounds: 2)
        #expect(try await db.compact() == CompactionReport())
        #expect(Self.at(try await Self.everything(db), "posts/p1") == Self.post(round: 1, 1))
    }

    @Test func ferryDumpDescribesRestatedRecordsAndRebuildsTheStateAfterCompaction() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.open(dir)
        try await Self.fill(db, rounds: 5)
        let report = try await db.compact()
        #expect(report.restatedEntries > 0)
        let before = try await Self.everything(db)
        try await db.close()
        let log = try LogInspection.inspect(dir.path)
        let replayer = StateReplayer()
        var described: [String] = []
        try log.forEachRecord { r in
            if let d = RecordDescription.describe(kind: r.kind, payload: r.payload) { described.append(d) }
            try replayer.apply(kind: r.kind, lsn: r.lsn.rawValue, payload: r.payload)
        }
        // (Which posts are carried forward depends on where segments ended: under load the
        // writer puts more records in a frame, they compress better, and the last rounds can
        // all stay in the segment being written.)
        #expect(described.contains { $0.hasPrefix("server data carried forward ") })
        #expect(replayer.visible(at: "/") == before)
    }
}
