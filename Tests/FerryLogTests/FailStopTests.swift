@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

/// Fail-stop on every path that changes files, not only appends: a roll, a deletion of
/// segments, a side file and the lock file. Each fault is one-shot (it clears at once), so a
/// log that went on after it would be seen using the disk again.
@Suite struct FailStopTests {
    typealias Plan = SystemCallRecorder.Plan

    /// Runs `body` and returns the `LogError` it threw (recording an issue if it threw none).
    static func thrown(sourceLocation: SourceLocation = #_sourceLocation, _ body: () async throws -> Void) async -> LogError? {
        do {
            try await body()
            Issue.record("expected a LogError, nothing was thrown", sourceLocation: sourceLocation)
        } catch let e as LogError {
            return e
        } catch {
            Issue.record("expected a LogError, got \(error)", sourceLocation: sourceLocation)
        }
        return nil
    }

    /// The log is stopped: `error` (what the failed step threw) and every later call are
    /// ``LogError/Code/failed`` naming the failed call, and nothing touched the disk after it.
    static func expectStopped(_ log: WriteAheadLog, _ error: LogError?, by call: SystemCallRecorder.Kind, _ recorder: SystemCallRecorder,
                              sourceLocation: SourceLocation = #_sourceLocation) async {
        #expect(error?.code == .failed, "\(error.map { "\($0)" } ?? "nothing")", sourceLocation: sourceLocation)
        let cause = error?.cause as? LogError
        #expect(cause?.code == .io, sourceLocation: sourceLocation)
        #expect(cause?.message.contains(call.rawValue) == true, "the cause names \(call): \(cause.map { "\($0)" } ?? "none")", sourceLocation: sourceLocation)
        #expect(log.failure?.code == .failed, sourceLocation: sourceLocation)
        let later = await thrown(sourceLocation: sourceLocation) { try await log.append({ var b = LogBatch(); b.append(kind: 1, payload: [7]); return b }()) }
        #expect(later?.code == .failed, sourceLocation: sourceLocation)
        #expect(later?.message == log.failure?.message, "the first cause is kept", sourceLocation: sourceLocation)
        #expect(await thrown(sourceLocation: sourceLocation) { try await log.roll() }?.code == .failed, sourceLocation: sourceLocation)
        #expect(await thrown(sourceLocation: sourceLocation) { try await log.deleteSegments(before: log.nextLSN) }?.code == .failed, sourceLocation: sourceLocation)
        #expect(await thrown(sourceLocation: sourceLocation) { try log.writeSideFile(named: "later", contents: [1]) }?.code == .failed, sourceLocation: sourceLocation)
        #expect(recorder.failedAt != nil, "the fault was reached", sourceLocation: sourceLocation)
        #expect(recorder.callsAfterTheFault.isEmpty, "the log used the disk after the failure: \(recorder.callsAfterTheFault)", sourceLocation: sourceLocation)
        await #expect(throws: LogError.self, sourceLocation: sourceLocation) { try await log.close() }
    }

    /// No segment holds a frame after its seal frame.
    static func expectNothingAfterASeal(_ dir: TemporaryDirectory, sourceLocation: SourceLocation = #_sourceLocation) throws {
        for (name, bytes) in try readStore(dir) {
            let frames = parseFrames(bytes)
            if let seal = frames.firstIndex(where: { $0.type == 2 }) {
                #expect(seal == frames.count - 1, "\(name) has \(frames.count - 1 - seal) frame(s) after its seal", sourceLocation: sourceLocation)
                #expect(bytes[frames[seal].end...].allSatisfy { $0 == 0 }, "\(name) has bytes after its seal (other than zeros grown ahead)",
                        sourceLocation: sourceLocation)
            }
        }
    }

    // MARK: Roll

    static let rollCases: [(String, SystemCallRecorder.Kind, Plan)] = [
        ("the seal's write", .pwrite, Plan(kind: .pwrite, nameContains: ".wal", fault: .errno(.EIO))),
        ("a short write of the seal", .pwrite, Plan(kind: .pwrite, nameContains: ".wal", fault: .shortWrite)),
        ("cutting off the zeros grown ahead of the frames", .ftruncate, Plan(kind: .ftruncate, nameContains: ".wal", fault: .errno(.EIO))),
        ("the seal's fdatasync", .fdatasync, Plan(kind: .fdatasync, nameContains: ".wal", fault: .errno(.EIO))),
        ("the next segment's header write", .pwrite, Plan(kind: .pwrite, nameContains: ".tmp", fault: .errno(.ENOSPC))),
        ("the next segment's fdatasync", .fdatasync, Plan(kind: .fdatasync, nameContains: ".tmp", fault: .errno(.EIO))),
        ("the next segment's rename", .rename, Plan(kind: .rename, fault: .errno(.EIO))),
        ("the directory fsync after the next segment's rename", .fsync, Plan(kind: .fsync, fault: .errno(.EIO))),
        ("removing a stale temporary next segment", .unlink, Plan(kind: .unlink, fault: .errno(.EIO))),
    ]

    @Test(arguments: rollCases.indices)
    func aFailedRollStopsTheLogAppendsNothingAfterTheSealAndAStrictReopenHoldsEveryAcknowledgedRecord(_ i: Int) async throws {
        let (_, call, plan) = Self.rollCases[i]
        let dir = try TemporaryDirectory()
        let recorder = SystemCallRecorder(store: dir.path)
        var options = testOptions(.fsync)
        options.system = recorder.system
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        try await appendPosts(log, 0..<20)
        recorder.arm(plan)
        let error = await Self.thrown { try await log.roll() }
        await Self.expectStopped(log, error, by: call, recorder)
        try Self.expectNothingAfterASeal(dir)

        // Strict, not salvage: the store opens and holds every acknowledged record.
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        expectPosts(try reopened.records(), count: 20)
        try await appendPosts(reopened, 20..<21)
        try await reopened.close()
    }

    /// A roll the writer starts itself (a segment full) is the same roll: it stops the log.
    @Test func aFailedRollBetweenFramesStopsTheLog() async throws {
        let dir = try TemporaryDirectory()
        let recorder = SystemCallRecorder(store: dir.path)
        var options = testOptions(.fsync, segmentSize: 8192)
        options.system = recorder.system
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        recorder.arm(Plan(kind: .rename, fault: .errno(.EIO)))
        var acknowledged = 0
        var error: LogError?
        do {
            for i in 0..<400 {
                try await appendPosts(log, i..<(i + 1))
                acknowledged += 1
            }
        } catch let e as LogError { error = e }
        #expect(acknowledged > 0 && acknowledged < 400)
        await Self.expectStopped(log, error, by: .rename, recorder)
        try Self.expectNothingAfterASeal(dir)
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        expectPosts(try reopened.records(), count: acknowledged)
        try await reopened.close()
    }

    // MARK: Deleting segments

    static let deletionCases: [(String, SystemCallRecorder.Kind, Plan)] = [
        ("the log-start marker's write", .write, Plan(kind: .write, nameContains: "log-start", fault: .errno(.ENOSPC))),
        ("the log-start marker's rename", .rename, Plan(kind: .rename, nameContains: "log-start", fault: .errno(.EIO))),
        ("the first segment's unlink", .unlink, Plan(kind: .unlink, nameContains: ".wal", fault: .errno(.EIO))),
        ("the second segment's unlink", .unlink, Plan(kind: .unlink, nameContains: ".wal", skip: 1, fault: .errno(.EIO))),
        ("the directory fsync after the unlinks", .fsync, Plan(kind: .fsync, skip: 1, fault: .errno(.EIO))),
    ]

    @Test(arguments: deletionCases.indices)
    func aFailedDeletionOfSegmentsStopsTheLogAndLosesNothingItKept(_ i: Int) async throws {
        let (_, call, plan) = Self.deletionCases[i]
        let dir = try TemporaryDirectory()
        let recorder = SystemCallRecorder(store: dir.path)
        var options = testOptions(.fsync, segmentSize: 8192)
        options.system = recorder.system
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        try await appendPosts(log, 0..<200)
        let before = log.segments[3].firstLSN
        #expect(log.segments.count > 4)
        recorder.arm(plan)
        let error = await Self.thrown { try await log.deleteSegments(before: before) }
        await Self.expectStopped(log, error, by: call, recorder)

        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(reopened.firstLSN <= before, "no more was deleted than asked")
        let kept = try reopened.records()
        #expect(kept.first?.lsn == reopened.firstLSN)
        #expect(kept.last?.lsn == LSN(200))
        for r in kept { #expect(r.payload == Payloads.post(Int(r.lsn.rawValue) - 1)) }
        try await reopened.close()
    }

    // MARK: Side files

    static let sideFileCases: [(String, SystemCallRecorder.Kind, Plan)] = [
        ("a side file's write", .write, Plan(kind: .write, nameContains: "side", fault: .errno(.ENOSPC))),
        ("a side file's fdatasync", .fdatasync, Plan(kind: .fdatasync, nameContains: "side", fault: .errno(.EIO))),
        ("a side file's rename", .rename, Plan(kind: .rename, nameContains: "side", fault: .errno(.EIO))),
        ("a block side file's write", .write, Plan(kind: .write, nameContains: "blocks", skip: 1, fault: .errno(.ENOSPC))),
        ("a short write of a block side file", .write, Plan(kind: .write, nameContains: "blocks", fault: .shortWrite)),
        ("a block side file's fdatasync", .fdatasync, Plan(kind: .fdatasync, nameContains: "blocks", fault: .errno(.EIO))),
        ("a block side file's rename", .rename, Plan(kind: .rename, nameContains: "blocks", fault: .errno(.EIO))),
        ("a side file's removal", .unlink, Plan(kind: .unlink, nameContains: "old", fault: .errno(.EIO))),
    ]

    @Test(arguments: sideFileCases.indices)
    func aFailedSideFileWriteOrRemovalStopsTheLog(_ i: Int) async throws {
        let (_, call, plan) = Self.sideFileCases[i]
        let dir = try TemporaryDirectory()
        let recorder = SystemCallRecorder(store: dir.path)
        var options = testOptions(.fsync)
        options.system = recorder.system
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        try await appendPosts(log, 0..<10)
        try log.writeSideFile(named: "old", contents: [1, 2, 3])
        recorder.arm(plan)
        let error = await Self.thrown {
            try log.writeSideFile(named: "side", contents: Payloads.random(5000, seed: 1))
            try log.writeSideFile(named: "blocks") { out in
                for n in 0..<3 { try Payloads.random(3000, seed: UInt64(n)).withUnsafeBytes { try out.write($0) } }
            }
            try log.removeSideFiles(named: ["old"])
        }
        await Self.expectStopped(log, error, by: call, recorder)

        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        expectPosts(try reopened.records(), count: 10)
        #expect(try reopened.sideFiles(withPrefix: "").allSatisfy { ["old", "side", "blocks"].contains($0) }, "no temporary file is left")
        if let side = try reopened.readSideFile(named: "side") { #expect(side == Payloads.random(5000, seed: 1), "a side file is whole or absent") }
        try await reopened.close()
    }

    @Test func aSideFileWhoseBlocksThrowLeavesTheLogRunning() async throws {
        struct Refused: Error {}
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync))
        #expect(throws: Refused.self) {
            try log.writeSideFile(named: "image") { out in
                try [1, 2].withUnsafeBytes { try out.write($0) }
                throw Refused()
            }
        }
        #expect(log.failure == nil)
        #expect(try log.sideFiles(withPrefix: "").isEmpty)
        try await appendPosts(log, 0..<3)
        try await log.close()
    }

    // MARK: The lock file

    @Test(arguments: [SystemCallRecorder.Kind.ftruncate, .pwrite])
    func aFailedWriteOfTheLockFileFailsTheOpenAndTheStoreOpensOnceItClears(_ call: SystemCallRecorder.Kind) async throws {
        let dir = try await writeStore(5)
        let recorder = SystemCallRecorder(store: dir.path)
        var options = testOptions()
        options.system = recorder.system
        recorder.arm(Plan(kind: call, nameContains: "LOCK", fault: .errno(.EIO)))
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: options) }
        #expect(e?.code == .io)
        #expect(e?.errno == .EIO)
        #expect(e?.message.contains(call.rawValue) == true)
        #expect(e?.file?.hasSuffix("LOCK") == true)
        #expect(recorder.callsAfterTheFault.isEmpty, "the open went on after the failure: \(recorder.callsAfterTheFault)")
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        expectPosts(try log.records(), count: 5)
        try await log.close()
    }
}
