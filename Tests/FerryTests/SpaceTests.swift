import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable @_spi(Server) import Ferry

@Suite struct SpaceTests {
    static let limit = CacheSize.minimumBytes

    static func options(limit: Int = SpaceTests.limit) -> DatabaseOptions {
        var o = quietOptions(.none)
        o.segmentSize = 8 << 20  // the limit decides: an eighth of it
        o.cacheSizeBytes = .bytes(limit)
        return o
    }

    /// About 2 KB that compresses little, different for every `i`.
    static func blob(_ i: Int) -> Value {
        var x = UInt64(bitPattern: Int64(i)) &* 0x9E37_79B9_7F4A_7C15 | 1
        var s = ""
        for _ in 0..<160 {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17
            s += String(x, radix: 36)
        }
        return ["i": .int(Int64(i)), "text": .string(s)]
    }

    static func isNotCached(_ body: () async throws -> Void) async -> Bool {
        do {
            try await body()
            return false
        } catch let e as DatabaseError {
            return e.code == .notCached
        } catch {
            return false
        }
    }

    @Test func aCacheSizeBelowOneMegabyteIsRefusedNamingTheMinimum() async throws {
        let dir = try TemporaryDirectory()
        var o = quietOptions()
        o.cacheSizeBytes = .bytes(512 << 10)
        #expect {
            _ = try Database.open(at: dir.path, options: o)
        } throws: { error in
            guard let e = error as? DatabaseError else { return false }
            return e.code == .invalidData && e.message.contains("1048576") && e.message.contains("minimum")
        }
        o.cacheSizeBytes = .unlimited
        let db = try Database.open(at: dir.path, options: o)
        try await db.close()
    }

    /// Five times the limit of server data, a listener on one place and a pin on another: after
    /// every update the store is within the limit plus one segment; the listened and pinned
    /// data are intact (also after a reopen), old unkept data is "not cached".
    @Test func fillingFiveTimesTheLimitStaysWithinItAndKeepsListenedAndPinnedData() async throws {
        let dir = try TemporaryDirectory()
        let o = Self.options()
        let db = try Database.open(at: dir.path, options: o)
        let segment = Int64(o.effectiveSegmentSize)
        try await db.applyServerPut(at: "listened", ["a": Self.blob(-1)])
        try await db.applyServerPut(at: "pinned", ["b": Self.blob(-2)])
        try await db.reference("pinned").keepSynced(true)
        let recorder = Recorder()
        let handles = recorder.listen(try db.root.child("listened").query)
        var written: Int64 = 0
        var i = 0
        var worst: Int64 = 0
        while written < 5 * Int64(Self.limit) {
            let v = Self.blob(i)
            try await db.applyServerPut(at: "bulk/b\(i)", v)
            written += Int64(v.json.utf8.count)
            if i % 50 == 0 {
                try await db.applyServerMerge(at: "listened", ["n": .int(Int64(i))])
                try await db.applyServerMerge(at: "pinned", ["n": .int(Int64(i))])
            }
            let s = db.statistics
            worst = max(worst, s.bytesOnDisk)
            #expect(s.bytesOnDisk <= Int64(Self.limit) + segment, "update \(i): \(s.bytesOnDisk) bytes on disk: \(s)")
            i += 1
        }
        let last = (i - 1) / 50 * 50
        let stats = db.statistics
        #expect(stats.lastEviction != nil && stats.lastEviction!.entriesEvicted > 0)
        #expect(stats.pins == ["/pinned"])
        #expect(stats.overLimitBytes <= segment)
        #expect(await Self.isNotCached { _ = try await db.reference("bulk/b0").getData() })
        #expect(try await db.reference("bulk/b\(i - 1)").getData().value == Self.blob(i - 1))
        #expect(try await db.reference("listened").getData().value == ["a": Self.blob(-1), "n": .int(Int64(last))])
        #expect(try await db.reference("pinned").getData().value == ["b": Self.blob(-2), "n": .int(Int64(last))])
        #expect(recorder.values.last == ["a": Self.blob(-1), "n": .int(Int64(last))])
        // Closed with the listener still active: once removed, its data may be evicted.
        _ = handles
        try await db.close()

        let reopened = try Database.open(at: dir.path, options: o)
        #expect(reopened.statistics.pins.count == 1)
        #expect(try await reopened.reference("pinned").getData().value == ["b": Self.blob(-2), "n": .int(Int64(last))])
        #expect(try await reopened.reference("listened").getData().value == ["a": Self.blob(-1), "n": .int(Int64(last))])
        #expect(await Self.isNotCached { _ = try await reopened.reference("bulk/b0").getData() })
        try await reopened.close()
    }

    /// Pending writes are never evicted, even when they alone exceed the limit; the statistics
    /// say by how much the store is over.
    @Test func pendingWritesAreKeptWhenTheyAloneExceedTheLimitAndStatisticsSayByHowMuch() async throws {
        let dir = try TemporaryDirectory()
        let o = Self.options()
        let db = try Database.open(at: dir.path, options: o)
        var ids: [Int64] = []
        for i in 0..<600 {  // about 1.3 MB of local writes, never acknowledged
            ids.append(try await db.reference("mine/m\(i)").setValue(Self.blob(i)).writeID!)
        }
        for i in 0..<300 { try await db.applyServerPut(at: "bulk/b\(i)", Self.blob(10_000 + i)) }
        try await db.sync()  // (durability .none: the log may still be writing what it was given)
        let s = db.statistics
        #expect(s.pendingWrites == 600)
        #expect(s.pendingWriteBytes > Int64(Self.limit))
        #expect(s.oldestPendingWriteAge != nil)
        #expect(s.bytesOnDisk > Int64(Self.limit))
        #expect(s.overLimitBytes == s.bytesOnDisk - Int64(Self.limit))
        try await db.close()

        let reopened = try Database.open(at: dir.path, options: o)
        #expect(reopened.pendingWriteIDs == ids)
        for i in [0, 299, 599] {
            #expect(try await reopened.reference("mine/m\(i)").getData().value == Self.blob(i))
        }
        // Once the server has them, they are server data like any other, and go.
        try await reopened.acknowledgeWrites(through: ids.last!)
        for i in 0..<600 { try await reopened.applyServerPut(at: "bulk/c\(i)", Self.blob(20_000 + i)) }
        #expect(reopened.statistics.bytesOnDisk <= Int64(Self.limit) + Int64(o.effectiveSegmentSize))
        #expect(await Self.isNotCached { _ = try await reopened.reference("mine/m0").getData() })
        try await reopened.close()
    }

    /// While the oldest pending write blocks every segment, writes over the limit do not try to
    /// evict again and again; once it is answered, eviction goes on while the database stays open.
    @Test func evictionResumesOnceTheOldestPendingWriteIsAnsweredWhileOpen() async throws {
        let dir = try TemporaryDirectory()
        let o = Self.options()
        let db = try Database.open(at: dir.path, options: o)
        let first = try await db.reference("mine/first").setValue(Self.blob(-1))
        for i in 0..<900 { try await db.applyServerPut(at: "bulk/b\(i)", Self.blob(i)) }
        try await db.sync()  // (durability .none: the log may still be writing what it was given)
        #expect(db.statistics.bytesOnDisk > Int64(Self.limit) + Int64(o.effectiveSegmentSize))
        #expect(try await db.reference("bulk/b0").getData().value == Self.blob(0))  // nothing could go
        try await db.acknowledgeWrites(through: first.writeID!)
        for i in 0..<50 { try await db.applyServerPut(at: "more/m\(i)", Self.blob(5_000 + i)) }
        #expect(db.statistics.bytesOnDisk <= Int64(Self.limit) + Int64(o.effectiveSegmentSize))
        #expect(await Self.isNotCached { _ = try await db.reference("bulk/b0").getData() })
        try await db.close()
    }

    /// A listener added after its data was evicted fires nothing stale: no value until the
    /// server sends the data again.
    @Test func aListenerOnEvictedDataFiresNoValueUntilTheServerSendsItAgain() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: Self.options())
        try await db.applyServerPut(at: "old", Self.blob(-1))
        for i in 0..<1500 { try await db.applyServerPut(at: "bulk/b\(i)", Self.blob(i)) }
        #expect(await Self.isNotCached { _ = try await db.reference("old").getData() })
        let recorder = Recorder()
        _ = recorder.listen(try db.reference("old").query)
        #expect(recorder.values.isEmpty)
        try await db.applyServerPut(at: "old", "fresh")
        #expect(recorder.values == ["fresh"])
        try await db.close()
    }

    @Test func pinsAreRecordsThatSurviveReopenCheckpointsAndCompaction() async throws {
        let dir = try TemporaryDirectory()
        var o = quietOptions(.none)
        o.segmentSize = 16 << 10
        o.compactionSegments = nil
        o.checkpointOnClose = false
        do {
            let db = try Database.open(at: dir.path, options: o)
            try await db.reference("a/b").keepSynced(true)
            try await db.reference("c").keepSynced(true)
            try await db.reference("c").keepSynced(false)
            try await db.reference("d").keepSynced(true)
            try await db.close()
        }
        do {  // from the log
            let db = try Database.open(at: dir.path, options: o)
            #expect(db.statistics.pins == ["/a/b", "/d"].map { Path($0).description })
            // Fill and acknowledge segments, then compact the pins' records away.
            for i in 0..<60 {
                let id = try await db.reference("w/\(i)").setValue(Self.blob(i)).writeID!
                try await db.acknowledgeWrites(through: id)
            }
            let report = try await db.compact()
            #expect(!report.deletedSegments.isEmpty)
            try await db.close()
        }
        do {  // from the compacted log (the checkpoint removed: the restated pins alone)
            for f in try Files.list(dir.path) where f.hasPrefix("checkpoint-") { try Files.remove(dir.sub(f)) }
            let db = try Database.open(at: dir.path, options: o)
            #expect(db.statistics.pins.count == 2)
            try await db.checkpoint()
            try await db.close()
        }
        do {  // from the checkpoint
            let db = try Database.open(at: dir.path, options: o)
            #expect(db.statistics.pins == ["/a/b", "/d"].map { Path($0).description })
            try await db.reference("d").keepSynced(false)
            try await db.close()
        }
        let db = try Database.open(at: dir.path, options: o)
        #expect(db.statistics.pins == [Path("/a/b").description])
        try await db.close()
    }

    @Test func aMemoryOnlyStoreDropsUnkeptServerDataPastItsBound() async throws {
        var o = quietOptions()
        o.cacheSizeBytes = .bytes(Self.limit)
        let db = Database.inMemory(options: o)
        try await db.applyServerPut(at: "pinned", Self.blob(-1))
        try await db.reference("pinned").keepSynced(true)
        let recorder = Recorder()
        _ = recorder.listen(try db.reference("listened").query)
        try await db.applyServerPut(at: "listened", Self.blob(-2))
        for i in 0..<1000 { try await db.applyServerPut(at: "bulk/b\(i)", Self.blob(i)) }
        #expect(db.statistics.lastEviction != nil)
        #expect(db.statistics.cachedPaths < 1000)
        #expect(await Self.isNotCached { _ = try await db.reference("bulk/b0").getData() })
        #expect(try await db.reference("pinned").getData().value == Self.blob(-1))
        #expect(try await db.reference("listened").getData().value == Self.blob(-2))
        try await db.close()
    }

    @Test func clearPersistenceIsRefusedWhileWritesArePendingOrTheStoreIsOpenAndForcedDeletesIt() async throws {
        let dir = try TemporaryDirectory()
        let o = quietOptions()
        let db = try Database.open(at: dir.path, options: o)
        try await db.reference("x").setValue("pending")
        await #expect(throws: DatabaseError.self) { try await Database.clearPersistence(at: dir.path) }
        try await db.close()
        await #expect {
            try await Database.clearPersistence(at: dir.path)
        } throws: { ($0 as? DatabaseError)?.code == .failedPrecondition }
        // Nothing was lost by the refusal.
        let again = try Database.open(at: dir.path, options: o)
        #expect(again.pendingWriteCount == 1)
        try await again.close()
        try await Database.clearPersistence(at: dir.path, force: true)
        #expect(try Files.list(dir.path).isEmpty)
        let fresh = try Database.open(at: dir.path, options: o)
        #expect(fresh.pendingWriteCount == 0)
        #expect(await Self.isNotCached { _ = try await fresh.reference("x").getData() })
        try await fresh.close()
    }

    @Test func waitForPendingWritesReturnsOnceTheServerAnsweredEveryEarlierWrite() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        let a = try await db.reference("a").setValue(1).writeID!
        let b = try await db.reference("b").setValue(2).writeID!
        let waiter = Task { try await db.waitForPendingWrites() }
        try await db.acknowledgeWrites(through: a)
        try await db.acknowledgeWrites(through: b, rejecting: [WriteRejection(writeID: b, status: 403, message: "no")])
        try await waiter.value
        #expect(db.pendingWriteCount == 0)
        try await db.waitForPendingWrites()  // none pending: at once
        try await db.close()
    }

    /// `ferry-dump stats` of a closed store says what `statistics` said of it open.
    @Test func ferryDumpStatsOfAClosedStoreMatchesTheDatabasesStatistics() async throws {
        let dir = try TemporaryDirectory()
        var o = quietOptions()
        o.checkpointOnClose = false
        let db = try Database.open(at: dir.path, options: o)
        try await db.applyServerPut(at: "s", ["a": 1, "b": 2])
        try await db.reference("p").keepSynced(true)
        try await db.reference("w/1").setValue("pending")
        let b = try await db.reference("w/2").setValue("refused").writeID!
        try await db.reference("w/3").setValue("pending too")
        try await db.acknowledgeWrites(through: b, rejecting: [WriteRejection(writeID: b, status: 403, message: "no")])
        let open = db.statistics
        try await db.close()

        let text = try run(Locations.executable("ferry-dump"), ["stats", dir.path])
        #expect(text.status == 0)
        #expect(text.stdout.contains("pins (keepSynced):   /p"))
        let json = try run(Locations.executable("ferry-dump"), ["stats", "--json", dir.path])
        #expect(json.status == 0)
        struct Report: Decodable { var database: StoreStatistics }
        let closed = try JSONDecoder().decode(Report.self, from: Data(json.stdout.utf8)).database
        #expect(closed.pendingWrites == 1 && open.pendingWrites == 1)
        #expect(closed.pendingWriteBytes == open.pendingWriteBytes)
        #expect(closed.rejectedWrites == 1 && open.rejectedWrites == 1)
        #expect(closed.cachedPaths == open.cachedPaths)
        #expect(closed.pins == open.pins && closed.pins == ["/p"])
        #expect(closed.segmentBytes == open.segmentBytes)
    }

    @Test func aCheckpointIsWrittenByItselfOnceThePolicysRecordsHaveGathered() async throws {
        let dir = try TemporaryDirectory()
        var o = quietOptions(.none)
        o.checkpointPolicy = CheckpointPolicy(records: 50, bytes: nil)
        let db = try Database.open(at: dir.path, options: o)
        #expect(try Files.list(dir.path).filter { $0.hasPrefix("checkpoint-") }.isEmpty)
        for i in 0..<60 { try await db.applyServerPut(at: "s/\(i)", .int(Int64(i))) }
        // The checkpoint runs in the background: wait until its file is there and counted.
        #expect(try await eventually {
            try Files.list(dir.path).contains { $0.hasPrefix("checkpoint-") } && db.statistics.checkpointBytes > 0
        })
        try await db.close()
    }
}
