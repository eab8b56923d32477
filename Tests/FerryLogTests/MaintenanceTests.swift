@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

@Suite struct MaintenanceTests {
    @Test func deletingSegmentsKeepsLaterRecordsAndLSNs() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 8192))
        try await appendPosts(log, 0..<300, batchSize: 2)
        let segments = log.segments
        let cut = segments[3].firstLSN
        let deleted = try await log.deleteSegments(before: cut + 1)
        #expect(deleted == segments[0..<3].map(\.name))
        #expect(log.firstLSN == cut)
        #expect(try log.records().first?.lsn == cut)
        #expect(throws: LogError.self) { _ = try log.records(from: 1) }
        try await log.close()

        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 8192))
        #expect(reopened.recovery.isClean)
        #expect(reopened.firstLSN == cut)
        #expect(reopened.nextLSN == 301)
        let records = try reopened.records()
        #expect(records.count == 300 - Int(cut.rawValue) + 1)
        #expect(records.allSatisfy { $0.payload == Payloads.post(Int($0.lsn.rawValue) - 1) })
        try await reopened.close()
        #expect(try LogInspection.inspect(dir.path).firstProblem == nil)
    }

    @Test func theActiveSegmentIsNeverDeleted() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 8192))
        try await appendPosts(log, 0..<100)
        let active = log.segments.last!
        try await log.deleteSegments(before: log.nextLSN + 100)
        #expect(log.segments.map(\.name) == [active.name])
        try await appendPosts(log, 100..<101)
        try await log.close()
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(reopened.nextLSN == 102)
        try await reopened.close()
    }

    @Test func anInterruptedDeletionIsFinishedOnOpen() async throws {
        let dir = try TemporaryDirectory()
        let faults = Faults()
        var options = testOptions(.fsync, segmentSize: 8192)
        options.system = faults.system
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        try await appendPosts(log, 0..<300, batchSize: 2)
        let segments = log.segments
        faults.arm(.init(call: .unlink, errno: .EIO, after: 2))  // fails part-way through the deletion
        let error = await #expect(throws: LogError.self) { try await log.deleteSegments(before: segments[3].firstLSN) }
        #expect(error?.code == .failed, "a failed deletion stops the log")
        await #expect(throws: LogError.self) { try await log.close() }
        #expect(Files.exists(dir.sub(segments[1].name)))

        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        let finished = reopened.recovery.finishedDeletions
        #expect(!finished.isEmpty)
        #expect(Set(finished).isSubset(of: segments[0..<3].map(\.name)))
        for s in segments[0..<3] { #expect(!Files.exists(dir.sub(s.name))) }
        #expect(reopened.firstLSN == segments[3].firstLSN)
        try await reopened.close()
    }

    @Test func rewritingForwardKeepsSelectedRecordsAndDeletesTheOldSegments() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 8192))
        try await appendPosts(log, 0..<300, batchSize: 3)
        let segments = log.segments
        let before = segments[4].firstLSN
        var kept: [[UInt8]] = []
        let result = try await log.rewriteForward(before: before) { r, batch in
            if r.lsn.rawValue % 10 == 0 {
                batch.append(kind: 9, payload: r.payload)
                kept.append(Array(r.payload))
            }
        }
        #expect(result.deletedSegments == segments[0..<4].map(\.name))
        #expect(result.appended == LSN(301)...LSN(300 + UInt64(kept.count)))
        #expect(log.firstLSN == before)
        let tail = try log.records(from: 301)
        #expect(tail.map(\.payload) == kept)
        #expect(tail.allSatisfy { $0.kind == 9 })
        try await log.close()
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(try reopened.records(from: 301).map(\.payload) == kept)
        try await reopened.close()
    }
}
