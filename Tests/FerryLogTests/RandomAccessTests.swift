@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing
import Foundation
import Synchronization

@Suite struct RandomAccessTests {
    @Test func anyWrittenRecordCanBeReadByItsLSN() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 8192))
        try await appendPosts(log, 0..<500, batchSize: 3)
        var g = SplitMix(seed: 5)
        for _ in 0..<300 {
            let lsn = LSN(1 + g.next() % 500)
            let (kind, payload) = try log.withRecord(at: lsn) { ($0.kind, Array($0.payload)) }
            #expect(kind == UInt8((Int(lsn.rawValue) - 1) % 5))
            #expect(payload == Payloads.post(Int(lsn.rawValue) - 1))
        }
        #expect(throws: LogError.self) { try log.withRecord(at: 501) { _ in () } }
        #expect(throws: LogError.self) { try log.withRecord(at: 0) { _ in () } }
        try await log.close()
    }

    /// A walk in LSN order starts each frame where the one before it ended, and a read out of
    /// order at the segment's index: in order, backwards and at random, through the log and a
    /// read snapshot, across segments of many small frames, every record reads as written.
    @Test func recordsReadInOrderBackwardsAndAtRandomAcrossSegmentsAreThoseWritten() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 16 << 10))
        try await appendPosts(log, 0..<600, batchSize: 3)
        #expect(log.segments.count > 4)
        let snapshot = try log.readSnapshot()
        var g = SplitMix(seed: 11)
        let orders = [Array(1...600), Array((1...600).reversed()), (0..<600).map { _ in Int(1 + g.next() % 600) }]
        for order in orders {
            for n in order {
                let lsn = LSN(UInt64(n))
                #expect(try log.withRecord(at: lsn) { Array($0.payload) } == Payloads.post(n - 1), "log, record \(n)")
                #expect(try snapshot.withRecord(at: lsn) { Array($0.payload) } == Payloads.post(n - 1), "snapshot, record \(n)")
            }
        }
        try await log.close()
    }

    /// Frames on the way to a record are stepped over by their headers (each checked by its own
    /// checksum), so a frame whose body was damaged after the open fails the reads of its own
    /// records only, naming its offset — not those of the frames after it.
    @Test func aFrameDamagedAfterTheOpenFailsOnlyTheReadsOfItsOwnRecords() async throws {
        let dir = try TemporaryDirectory()
        let (log, victim) = try await logWithADamagedFrame(dir, posts: 60, victim: 10)

        let snapshot = try log.readSnapshot()
        for read in [{ (n: Int) in try log.withRecord(at: LSN(UInt64(n))) { Array($0.payload) } },
                     { (n: Int) in try snapshot.withRecord(at: LSN(UInt64(n))) { Array($0.payload) } }] {
            #expect(try read(45) == Payloads.post(44), "a record after the damaged frame")
            let error = logError { _ = try read(21) }
            #expect(error?.code == .corruption)
            #expect(error?.offset == Int64(victim.offset), "\(String(describing: error))")
            #expect(try read(23) == Payloads.post(22), "the record after the damaged frame's")
        }
        try await log.close()
    }

    /// A snapshot read in LSN order reads the frames ahead of the reader on another thread (and
    /// has its inspector look at their records there). That changes nothing it reads: walks in
    /// order, several at once on one snapshot, read every record as written, each with the
    /// inspector's note or none, and a frame damaged ahead of them fails only the reads of its
    /// own records, naming its offset, when a walk gets there — the records after it still read.
    @Test func walksInOrderReadAheadAndReadWhatWasWrittenWithDamageOnlyAtItsOwnRecords() async throws {
        let dir = try TemporaryDirectory()
        let (log, victim) = try await logWithADamagedFrame(dir, posts: 200, victim: 40)  // records 81 and 82

        // The inspector's note of a record read ahead comes with it; a record read otherwise has none.
        let note: LogReadSnapshot.Inspector = { kind, payload in UInt64(kind) << 32 | UInt64(payload.count) + 1 }
        let snapshot = try log.readSnapshot(inspect: note)
        let walks = 4
        let outcomes = FerryMutex<[(wrong: [Int], failed: [Int: LogError], noted: Int)]>([])
        DispatchQueue.concurrentPerform(iterations: walks) { _ in
            var wrong: [Int] = [], failed: [Int: LogError] = [:], noted = 0
            for n in 1...200 {
                do {
                    let (payload, ok, hasNote) = try snapshot.withRecord(at: LSN(UInt64(n))) { r in
                        (Array(r.payload), r.note == 0 || r.note == note(r.kind, r.payload), r.note != 0)
                    }
                    if payload != Payloads.post(n - 1) || !ok { wrong.append(n) }
                    if hasNote { noted += 1 }
                } catch {
                    failed[n] = error as? LogError
                }
            }
            outcomes.withLock { $0.append((wrong, failed, noted)) }
        }
        let all = outcomes.withLock { $0 }
        #expect(all.count == walks)
        for (wrong, failed, _) in all {
            #expect(wrong.isEmpty)
            #expect(failed.keys.sorted() == [81, 82])
            #expect(failed[81]?.code == .corruption)
            #expect(failed[81]?.offset == Int64(victim.offset))
        }
        #expect(snapshot.framesReadAhead > 50, "frames read ahead: \(snapshot.framesReadAhead)")
        #expect(all.map(\.noted).reduce(0, +) > 100, "records read with a note: \(all.map(\.noted))")
        // Read through the log itself, no record has a note.
        #expect(try (1...200).filter { $0 != 81 && $0 != 82 }.allSatisfy { try log.withRecord(at: LSN(UInt64($0))) { $0.note == 0 } })
        try await log.close()
    }

    @Test func enqueueAssignsLSNsAtOnceAndAwaitDurabilityWaitsPerMode() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync))
        var batch = LogBatch()
        batch.append(kind: 1, payload: Payloads.post(0))
        let a = try log.enqueue(batch)
        let b = try log.enqueue(batch)
        #expect(a == LSN(1)...LSN(1))
        #expect(b == LSN(2)...LSN(2))
        try await log.awaitDurability(of: b)
        #expect(log.durableLSN >= 3)
        #expect(try log.records().count == 2)
        try await log.close()
    }
}

/// Flips a bit in the middle of `frame`'s stored body in the segment file at `path`, its
/// checksums left as they were.
/// A log in `dir` of `posts` posts appended two at a time (a frame per append), whose data
/// frame number `index` then had its body damaged (its header, and so the open, still good).
private func logWithADamagedFrame(_ dir: TemporaryDirectory, posts: Int, victim index: Int) async throws -> (WriteAheadLog, ParsedFrame) {
    let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 1 << 20))
    try await appendPosts(log, 0..<posts, batchSize: 2)
    let name = try segmentFiles(dir.path)[0]
    let frames = parseFrames(try Files.read(dir.sub(name))).filter { $0.type == 1 }
    #expect(frames.count == posts / 2)
    let victim = frames[index]
    try damageBody(of: victim, inFile: dir.sub(name))
    return (log, victim)
}

private func damageBody(of frame: ParsedFrame, inFile path: String) throws {
    let handle = try #require(FileHandle(forUpdatingAtPath: path))
    try handle.seek(toOffset: UInt64(frame.offset + 32 + frame.storedLength / 2))
    let byte = try #require(try handle.read(upToCount: 1))
    try handle.seek(toOffset: UInt64(frame.offset + 32 + frame.storedLength / 2))
    try handle.write(contentsOf: Data([byte[0] ^ 0x10]))
    try handle.close()
}
