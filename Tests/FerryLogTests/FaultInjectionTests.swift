@_spi(Testing) import FerryLog
import FerryTestSupport
import Synchronization
import Testing

#if canImport(Glibc)
import Glibc
#endif

/// Fails chosen system calls once armed. The log under test makes every call through it.
final class Faults: Sendable {
    enum Call: Sendable { case write, fdatasync, fsync, rename, unlink }
    struct Plan: Sendable {
        var call: Call
        var errno: Errno
        /// Calls of that kind allowed to succeed after arming before the first failure.
        var after: Int
        /// When set, a `write` first writes this many bytes (a short write) instead of failing.
        var shortWriteBytes: Int?
        /// Keep failing after the first failure (a dead disk) rather than once.
        var sticky = true
    }

    private let state = FerryMutex<(plan: Plan?, seen: Int, failed: Int)>((nil, 0, 0))

    func arm(_ plan: Plan) { state.withLock { $0 = (plan, 0, 0) } }
    var failures: Int { state.withLock { $0.failed } }

    /// What to do for one call of `kind`: nil to let it through.
    private func decide(_ kind: Call) -> (errno: Errno, short: Int?)? {
        state.withLock { s in
            guard let plan = s.plan, plan.call == kind else { return nil }
            s.seen += 1
            guard s.seen > plan.after else { return nil }
            if !plan.sticky && s.failed > 0 { return nil }
            s.failed += 1
            let short = s.failed == 1 ? plan.shortWriteBytes : nil
            return (plan.errno, short)
        }
    }

    var system: SystemCalls {
        var sys = SystemCalls.live
        let live = SystemCalls.live
        // Segments are written at offsets, side files appended to: the same faults for both.
        let writing: @Sendable (UnsafeRawBufferPointer, (UnsafeRawBufferPointer) -> Result<Int, Errno>) -> Result<Int, Errno> = { bytes, call in
            guard let d = self.decide(.write) else { return call(bytes) }
            if let short = d.short { return call(UnsafeRawBufferPointer(rebasing: bytes[0..<min(short, bytes.count)])) }
            return .failure(d.errno)
        }
        sys.write = { fd, bytes in writing(bytes) { live.write(fd, $0) } }
        sys.pwrite = { fd, bytes, offset in writing(bytes) { live.pwrite(fd, $0, offset) } }
        sys.fdatasync = { fd in self.decide(.fdatasync).map { .failure($0.errno) } ?? live.fdatasync(fd) }
        sys.fsync = { fd in self.decide(.fsync).map { .failure($0.errno) } ?? live.fsync(fd) }
        sys.rename = { a, b in self.decide(.rename).map { .failure($0.errno) } ?? live.rename(a, b) }
        sys.unlink = { p in self.decide(.unlink).map { .failure($0.errno) } ?? live.unlink(p) }
        return sys
    }
}

@Suite struct FaultInjectionTests {
    /// Appends tagged single-record batches from `writers` tasks until the log fails; returns
    /// every acknowledged (LSN, payload).
    func appendUntilFailure(_ log: WriteAheadLog, writers: Int, limit: Int = 400) async -> (acked: [(LSN, [UInt8])], errors: [LogError]) {
        await withTaskGroup(of: ([(LSN, [UInt8])], LogError?).self) { group in
            for w in 0..<writers {
                group.addTask {
                    var acked: [(LSN, [UInt8])] = []
                    for n in 0..<limit {
                        let payload = Payloads.tagged(writer: w, batch: n, record: 0)
                        var b = LogBatch()
                        b.append(kind: 1, payload: payload)
                        do {
                            let r = try await log.append(b)
                            acked.append((r.lowerBound, payload))
                        } catch let e as LogError {
                            return (acked, e)
                        } catch {
                            return (acked, LogError?.none)
                        }
                    }
                    return (acked, nil)
                }
            }
            var all: [(LSN, [UInt8])] = []
            var errors: [LogError] = []
            for await (a, e) in group {
                all += a
                if let e { errors.append(e) }
            }
            return (all, errors)
        }
    }

    func expectAcknowledgedRecordsSurvive(_ dir: TemporaryDirectory, _ acked: [(LSN, [UInt8])], sourceLocation: SourceLocation = #_sourceLocation) async throws {
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        let records = Dictionary(uniqueKeysWithValues: try log.records().map { ($0.lsn, $0.payload) })
        for (lsn, payload) in acked {
            #expect(records[lsn] == payload, "acknowledged LSN \(lsn) lost", sourceLocation: sourceLocation)
        }
        // LSNs are contiguous from the start.
        #expect(records.keys.sorted() == (1...UInt64(records.count)).map { LSN($0) }, sourceLocation: sourceLocation)
        try await log.close()
    }

    static let cases: [(String, Faults.Plan, Int)] = [
        ("EIO from fdatasync", .init(call: .fdatasync, errno: .EIO, after: 25), 1),
        ("EIO from fdatasync, 8 writers", .init(call: .fdatasync, errno: .EIO, after: 25), 8),
        ("ENOSPC from write", .init(call: .write, errno: .ENOSPC, after: 30), 1),
        ("ENOSPC from write, 8 writers", .init(call: .write, errno: .ENOSPC, after: 30), 8),
        ("short write then ENOSPC", .init(call: .write, errno: .ENOSPC, after: 30, shortWriteBytes: 50), 4),
        ("EIO from the directory fsync of a roll", .init(call: .fsync, errno: .EIO, after: 0), 2),
        ("EIO from the rename of a roll", .init(call: .rename, errno: .EIO, after: 0), 2),
    ]

    @Test(arguments: cases.indices)
    func aFailedWriteOrSyncStopsTheLogAndLosesNothingAcknowledged(_ i: Int) async throws {
        let (_, plan, writers) = Self.cases[i]
        let dir = try TemporaryDirectory()
        let faults = Faults()
        var options = testOptions(.fsync, segmentSize: 8192)
        options.system = faults.system
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        faults.arm(plan)
        let (acked, errors) = await appendUntilFailure(log, writers: writers)
        #expect(faults.failures >= 1)
        #expect(errors.count == writers, "every writer saw the failure")
        for e in errors {
            #expect(e.code == .failed)
            #expect(e.errno == plan.errno)
        }
        #expect(log.failure?.code == .failed)
        // Fail-stop: later appends and syncs fail at once, without touching the disk.
        let callsBefore = faults.failures
        await #expect(throws: LogError.self) { try await log.append({ var b = LogBatch(); b.append(kind: 1, payload: [1]); return b }()) }
        await #expect(throws: LogError.self) { try await log.sync() }
        #expect(faults.failures == callsBefore)
        await #expect(throws: LogError.self) { try await log.close() }
        try await expectAcknowledgedRecordsSurvive(dir, acked)
    }

    /// Growing a segment ahead of its writes is only a speed-up: a file system that refuses it
    /// (no `fallocate`, or full while the frames themselves still fit) gets plain appends, and
    /// nothing fails.
    @Test(arguments: [Errno.EINVAL, .ENOSPC])
    func aSegmentThatCannotBeGrownAheadIsAppendedTo(_ refusal: Errno) async throws {
        let dir = try TemporaryDirectory()
        var options = testOptions(.fsync, segmentSize: 8192)
        let asked = FerryMutex(0)
        options.system.preallocate = { _, _ in
            asked.withLock { $0 += 1 }
            return .failure(refusal)
        }
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        try await appendPosts(log, 0..<400, batchSize: 3)
        #expect(log.segments.count > 2, "it rolled")
        let before = try LogInspection.inspect(dir.path)
        #expect(before.firstProblem == nil && before.segments.allSatisfy { $0.zeroTail == 0 })
        try await log.close()
        #expect(asked.withLock { $0 } > 0)
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(reopened.recovery.isClean)
        expectPosts(try reopened.records(), count: 400)
        try await reopened.close()
    }

    /// Any other failure of `fallocate` is a failing disk: the log stops, as for a failed write.
    @Test func aFailingFallocateStopsTheLog() async throws {
        let dir = try TemporaryDirectory()
        var options = testOptions(.fsync)
        options.system.preallocate = { _, _ in .failure(.EIO) }
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        let error = await #expect(throws: LogError.self) { try await appendPosts(log, 0..<1) }
        #expect(error?.code == .failed)
        #expect((error?.cause as? LogError)?.message.contains("fallocate") == true, "\(String(describing: error))")
        await #expect(throws: LogError.self) { try await log.close() }
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(reopened.nextLSN == LSN(1))
        try await reopened.close()
    }

    /// `fallocate` alone leaves the space it adds "unwritten", and the first sync after a write
    /// into each of its blocks then has metadata to write as well (on this machine's ext4, 5 KB
    /// written and synced at a time cost ~180 µs so, against ~90 µs into written zeros). So the
    /// writer writes the zeros too, up to where it grew the file, and frames go into written
    /// space.
    @Test func theSpaceGrownAheadIsWrittenWithZeros() async throws {
        struct Seen { var grownTo: [Int64] = []; var zeros: [Range<Int64>] = []; var writeEnds: Set<Int64> = [] }
        let dir = try TemporaryDirectory()
        var options = testOptions(.fsync, segmentSize: 4 << 20)
        let live = SystemCalls.live
        let seen = FerryMutex(Seen())
        options.system.preallocate = { fd, length in
            let r = live.preallocate(fd, length)
            if case .success = r { seen.withLock { $0.grownTo.append(length) } }
            return r
        }
        options.system.pwrite = { fd, bytes, offset in
            // (A frame is never all zeros: its header holds a checksum and the frame's type.)
            let zeros = bytes.count > 0 && bytes.allSatisfy({ $0 == 0 })
            seen.withLock { s in
                if zeros { s.zeros.append(offset..<offset + Int64(bytes.count)) } else { s.writeEnds.insert(offset + Int64(bytes.count)) }
            }
            return live.pwrite(fd, bytes, offset)
        }
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        try await appendPosts(log, 0..<30_000, batchSize: 64)
        let s = seen.withLock { $0 }
        #expect(s.grownTo.count >= 2, "grown \(s.grownTo)")
        #expect(!s.zeros.isEmpty)
        for length in s.grownTo {
            // Zeros up to it, unless the frames themselves reached it.
            #expect(s.zeros.contains { $0.upperBound == length } || s.writeEnds.contains(length), "grown to \(length), zeros written \(s.zeros)")
        }
        try await log.close()
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(reopened.recovery.isClean)
        expectPosts(try reopened.records(), count: 30_000)
        try await reopened.close()
    }

    @Test func shortWritesThatCompleteAreNotErrors() async throws {
        let dir = try TemporaryDirectory()
        var options = testOptions(.fsync, segmentSize: 8192)
        let live = SystemCalls.live
        options.system.write = { fd, bytes in live.write(fd, UnsafeRawBufferPointer(rebasing: bytes[0..<min(7, bytes.count)])) }
        options.system.pwrite = { fd, bytes, offset in live.pwrite(fd, UnsafeRawBufferPointer(rebasing: bytes[0..<min(7, bytes.count)]), offset) }
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        try await appendPosts(log, 0..<300, batchSize: 4)
        try await log.close()
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(reopened.recovery.isClean)
        expectPosts(try reopened.records(), count: 300)
        try await reopened.close()
    }

    @Test func aBackgroundWriteFailureInNoneModeFailsLaterAppendsAndSync() async throws {
        let dir = try TemporaryDirectory()
        let faults = Faults()
        var options = testOptions(.none)
        options.system = faults.system
        let log = try WriteAheadLog.open(at: dir.path, options: options)
        try await appendPosts(log, 0..<10)
        try await log.sync()
        faults.arm(.init(call: .write, errno: .EIO, after: 0))
        // The delayed write may run (and fail) while these are appended, when the machine is
        // slow (ThreadSanitizer): then the later ones already report the failure.
        do { try await appendPosts(log, 10..<20) } catch let e as LogError { #expect(e.errno == .EIO || log.failure?.errno == .EIO) }
        await #expect(throws: LogError.self) { try await log.sync() }
        #expect(log.failure?.errno == .EIO)
        await #expect(throws: LogError.self) { try await appendPosts(log, 20..<21) }
        try? await log.close()
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(try reopened.records().count == 10)
        try await reopened.close()
    }
}
