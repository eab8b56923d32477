@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

#if canImport(Glibc)
import Glibc
#endif

@Suite struct AppendAndReplayTests {
    @Test func recordsReadBackInOrderWithContiguousLSNs() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(log.recovery.created)
        let ranges = try await appendPosts(log, 0..<100, batchSize: 7)
        #expect(ranges.first == LSN(1)...LSN(7))
        #expect(ranges.last == LSN(99)...LSN(100))
        expectPosts(try log.records(), count: 100)
        try await log.close()
    }

    @Test func lsnsContinueAcrossRestarts() async throws {
        let dir = try TemporaryDirectory()
        for round in 0..<3 {
            let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
            #expect(log.nextLSN == LSN(UInt64(round * 50 + 1)))
            #expect(log.recovery.isClean)
            try await appendPosts(log, (round * 50)..<(round * 50 + 50), batchSize: 3)
            try await log.close()
        }
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        expectPosts(try log.records(), count: 150)
        try await log.close()
    }

    @Test func segmentsRollAtTheConfiguredSizeAndAreSealed() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(segmentSize: 16 << 10))
        try await appendPosts(log, 0..<2000, batchSize: 10)
        let segments = log.segments
        #expect(segments.count > 5)
        for s in segments.dropLast() {
            #expect(s.sealed)
            #expect(s.size <= 16 << 10, "segment \(s.name) is \(s.size) bytes")
        }
        for (a, b) in zip(segments, segments.dropFirst()) { #expect(a.nextLSN == b.firstLSN) }
        expectPosts(try log.records(), count: 2000)
        try await log.close()

        let inspection = try LogInspection.inspect(dir.path)
        #expect(inspection.firstProblem == nil)
        #expect(inspection.segments.count == segments.count)
    }

    @Test func readingFromTheMiddleStartsAtThatLSN() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(segmentSize: 8192))
        try await appendPosts(log, 0..<3000, batchSize: 5)
        for start in [1, 2, 77, 1000, 2999, 3000] {
            let r = try log.records(from: LSN(UInt64(start)), through: LSN(UInt64(min(start + 10, 3000))))
            #expect(r.first?.lsn == LSN(UInt64(start)))
            #expect(r.count == min(start + 10, 3000) - start + 1)
            #expect(r.first?.payload == Payloads.post(start - 1))
        }
        #expect(try log.records(from: 3001).isEmpty)
        try await log.close()
    }

    @Test func compressibleBatchesAreStoredCompressedAndRandomOnesRaw() async throws {
        let dir = try TemporaryDirectory()
        var options = testOptions()
        options.frameTargetSize = 64 << 10
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        var batch = LogBatch()
        for i in 0..<300 { batch.append(kind: 1, payload: Payloads.post(i)) }
        try await log.append(batch)
        try await log.close()
        let compressed = try LogInspection.inspect(dir.path)
        let seg = try #require(compressed.segments.first)
        #expect(Double(seg.rawBodyBytes) / Double(seg.storedBodyBytes) > 1.5)

        let dir2 = try TemporaryDirectory()
        let log2 = try WriteAheadLog.open(at: dir2.path, options: options)
        var random = LogBatch()
        for i in 0..<50 { random.append(kind: 1, payload: Payloads.random(1000, seed: UInt64(i))) }
        try await log2.append(random)
        #expect(try log2.records().map(\.payload) == (0..<50).map { Payloads.random(1000, seed: UInt64($0)) })
        try await log2.close()
        let raw = try #require(try LogInspection.inspect(dir2.path).segments.first)
        #expect(raw.storedBodyBytes == raw.rawBodyBytes)
    }

    @Test func emptyAndOversizedBatchesAreRefusedAndAppendNothing() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        await #expect(throws: LogError.self) { try await log.append(LogBatch()) }
        var huge = LogBatch()
        huge.append(kind: 1, exactLength: 65 << 20) { _ in }
        do {
            try await log.append(huge)
            Issue.record("a 65 MiB record was accepted")
        } catch let e as LogError {
            #expect(e.code == .invalidArgument)
            #expect(e.message.contains("exceeds the limit"))
        }
        #expect(log.nextLSN == .first)
        try await appendPosts(log, 0..<1)
        expectPosts(try log.records(), count: 1)
        try await log.close()
    }

    @Test func aLargeRecordNearTheLimitRoundTrips() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(segmentSize: 1 << 20))
        let big = Payloads.random(3 << 20, seed: 9)  // larger than a segment and a frame target
        var batch = LogBatch()
        batch.append(kind: 3, payload: big)
        try await log.append(batch)
        try await appendPosts(log, 0..<10)
        try await log.close()
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions(segmentSize: 1 << 20))
        let records = try reopened.records()
        #expect(records.count == 11)
        #expect(records[0].payload == big)
        try await reopened.close()
    }

    @Test(arguments: [Durability.none, .interval(.milliseconds(20))])
    func nonSyncingModesReturnEarlyAndSyncMakesEverythingDurable(_ durability: Durability) async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(durability))
        try await appendPosts(log, 0..<500, batchSize: 1)
        try await log.sync()
        #expect(log.durableLSN == LSN(501))
        #expect(log.writtenLSN == LSN(501))
        try await appendPosts(log, 500..<600)
        try await log.flush()
        #expect(log.writtenLSN == LSN(601))
        try await log.close()
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        expectPosts(try reopened.records(), count: 600)
        try await reopened.close()
    }

    @Test func intervalModeSyncsOnItsOwn() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.interval(.milliseconds(10))))
        try await appendPosts(log, 0..<20)
        #expect(await eventually { log.durableLSN >= LSN(21) }, "synced without being asked")
        #expect(log.durableLSN == LSN(21))
        try await log.close()
    }

    @Test func noneModeWritesToTheOperatingSystemWithoutBeingAsked() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.none))
        try await appendPosts(log, 0..<5)
        #expect(await eventually { log.writtenLSN >= LSN(6) }, "written without being asked")
        #expect(log.writtenLSN == LSN(6))
        try await log.close()
    }

    /// Records taken without waiting, in a loop, are written a frame's worth at a time (the
    /// writer does not take whatever is pending, round after round, while the loop runs) — and
    /// the rest, fewer than a frame's worth, still reaches the file without a flush or sync.
    @Test func appendsInALoopAreWrittenInFramesOfTheTargetSizeAndTheRestWithoutBeingAsked() async throws {
        let dir = try TemporaryDirectory()
        var options = testOptions(.none, segmentSize: 4 << 20)
        options.frameTargetSize = 16 << 10
        options.flushDelay = .seconds(2)  // (so that the loop, however slow, mostly fills frames first)
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        var bytes = 0
        for i in 0..<5_000 {
            var batch = LogBatch()
            batch.append(kind: UInt8(i % 5), payload: Payloads.post(i))
            bytes += batch.encodedSize
            _ = try log.enqueue(batch)
        }
        #expect(await eventually { log.writtenLSN >= LSN(5_001) }, "the rest written without being asked")
        #expect(log.writtenLSN == LSN(5_001))
        let frames = log.statistics.frames
        // (A delayed flush that came during a slow loop may have cut one frame short.)
        #expect(frames <= UInt64(bytes / options.frameTargetSize * 5 / 4 + 3), "\(frames) frames for \(bytes) bytes")
        try await log.close()
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        expectPosts(try reopened.records(), count: 5_000)
        try await reopened.close()
    }

    @Test func concurrentFsyncAppendersShareSyncsAndAllLand() async throws {
        let dir = try TemporaryDirectory()
        var options = testOptions(.fsync, segmentSize: 32 << 10)
        // A slow disk (2 ms per sync), so that appenders pile up behind each sync however the
        // test runner schedules them: batching is then certain, not a matter of timing.
        let live = SystemCalls.live
        options.system.fdatasync = { fd in
            usleep(2000)
            return live.fdatasync(fd)
        }
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        let perWriter = 200
        let ranges = try await withThrowingTaskGroup(of: [(Int, ClosedRange<LSN>)].self) { group in
            for w in 0..<16 {
                group.addTask {
                    var out: [(Int, ClosedRange<LSN>)] = []
                    for n in 0..<perWriter {
                        var b = LogBatch()
                        b.append(kind: 1, payload: Payloads.tagged(writer: w, batch: n, record: 0))
                        out.append((w * perWriter + n, try await log.append(b)))
                    }
                    return out
                }
            }
            var all: [(Int, ClosedRange<LSN>)] = []
            for try await r in group { all += r }
            return all
        }
        #expect(ranges.count == 16 * perWriter)
        #expect(Set(ranges.map(\.1.lowerBound)).count == 16 * perWriter)
        let records = try log.records()
        #expect(records.count == 16 * perWriter)
        for (id, r) in ranges {
            #expect(records[Int(r.lowerBound.rawValue) - 1].payload == Payloads.tagged(writer: id / perWriter, batch: id % perWriter, record: 0))
        }
        // Group commit: fewer syncs than appends (one per append without it). A CI run on a
        // machine loaded by two other builds saw 3.9 records per sync, under the bound of 4 this
        // asked for: the bound is 2, which a writer syncing each append still fails.
        let stats = log.statistics
        #expect(stats.records == UInt64(16 * perWriter))
        #expect(stats.syncs * 2 < stats.records, "\(stats)")
        try await log.close()
    }

    @Test func readersSeeRecordsWhileTheWriterAppends() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 8192))
        let writer = Task {
            _ = try await appendPosts(log, 0..<1500, batchSize: 3)
        }
        var seen = 0
        var lastLSN = LSN(0)
        while seen < 1500 {
            try log.forEachRecord(from: LSN(UInt64(seen + 1))) { r in
                #expect(r.lsn == lastLSN + 1)
                #expect(Array(r.payload) == Payloads.post(Int(r.lsn.rawValue) - 1))
                lastLSN = r.lsn
                seen += 1
            }
            await Task.yield()
        }
        try await writer.value
        #expect(seen == 1500)
        try await log.close()
    }

    @Test func appendsAfterCloseAreRefused() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        try await log.close()
        do {
            try await appendPosts(log, 0..<1)
            Issue.record("append after close succeeded")
        } catch let e as LogError {
            #expect(e.code == .closed)
        }
    }
}
