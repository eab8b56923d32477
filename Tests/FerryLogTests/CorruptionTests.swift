@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

@Suite struct CorruptionTests {
    /// Flips every bit of one frame in the middle of a sealed segment: each flip is reported as
    /// corruption in that segment at that frame's offset — never skipped, never read as part of
    /// a neighbouring frame.
    @Test func everyBitFlipInASealedFrameIsDetectedAtThatFrame() async throws {
        let dir = try await multiSegmentStore(records: 200, segmentSize: 8192)
        let files = try readStore(dir)
        let names = files.keys.sorted()
        #expect(names.count >= 3)
        let victimName = names[1]
        let original = files[victimName]!
        let frames = parseFrames(original)
        let victim = frames[frames.count / 2]
        let trial = try storeWith(files)
        for bit in 0..<((victim.end - victim.offset) * 8) {
            let byte = victim.offset + bit / 8
            var damaged = original
            damaged[byte] ^= UInt8(1 << (bit % 8))
            try Files.write(trial.sub(victimName), damaged)
            let inspection = try LogInspection.inspect(trial.path, deep: false)
            let problem = inspection.firstProblem
            #expect(problem?.severity == .corruption, "bit \(bit)")
            #expect(problem?.file == victimName, "bit \(bit)")
            #expect(problem?.offset == Int64(victim.offset), "bit \(bit): \(problem?.description ?? "none")")
            if bit % 61 == 0 {
                let e = logError { _ = try WriteAheadLog.open(at: trial.path, options: testOptions()) }
                #expect(e?.code == .corruption)
                #expect(e?.file == trial.sub(victimName))
                #expect(e?.offset == Int64(victim.offset))
            }
        }
    }

    @Test func aFlippedBitInTheSealOfAnOlderSegmentIsCorruption() async throws {
        let dir = try await multiSegmentStore(records: 200, segmentSize: 8192)
        let name = try segmentFiles(dir.path)[0]
        let bytes = try Files.read(dir.sub(name))
        let seal = try #require(parseFrames(bytes).last)
        #expect(seal.type == 2)
        try Files.flipBit(dir.sub(name), byte: seal.offset + 17, bit: 0)
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
        #expect(e?.code == .corruption)
        #expect(e?.offset == Int64(seal.offset))
    }

    /// Segments are scanned on two threads: with damage in two of them, the open still names
    /// the first in log order, whichever scan finished first, and a later strict open of the
    /// same files names it again.
    @Test func theFirstDamageInLogOrderIsReportedThoughSegmentsAreScannedTogether() async throws {
        let dir = try await multiSegmentStore(records: 600, segmentSize: 8192)
        let names = try segmentFiles(dir.path)
        #expect(names.count >= 8)
        var offsets: [String: Int] = [:]
        for name in [names[2], names[names.count - 3]] {
            let frames = parseFrames(try Files.read(dir.sub(name)))
            let victim = frames[frames.count / 2]
            offsets[name] = victim.offset
            try Files.flipBit(dir.sub(name), byte: victim.offset + 40, bit: 3)
        }
        for _ in 0..<5 {
            let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
            #expect(e?.code == .corruption)
            #expect(e?.file == dir.sub(names[2]))
            #expect(e?.offset == Int64(offsets[names[2]]!))
        }
        #expect(try LogInspection.inspect(dir.path).firstProblem?.file == names[2])
    }

    @Test func aMissingMiddleSegmentIsDetected() async throws {
        let dir = try await multiSegmentStore(records: 300, segmentSize: 8192)
        let names = try segmentFiles(dir.path)
        #expect(names.count >= 4)
        try Files.remove(dir.sub(names[2]))
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
        #expect(e?.code == .corruption)
        #expect(e?.message.contains("missing") == true)
        #expect(e?.file?.hasSuffix(names[3]) == true)
        #expect(try LogInspection.inspect(dir.path).firstProblem?.file == names[3])
    }

    @Test func aMissingFirstSegmentIsDetected() async throws {
        let dir = try await multiSegmentStore(records: 300, segmentSize: 8192)
        let names = try segmentFiles(dir.path)
        try Files.remove(dir.sub(names[0]))
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
        #expect(e?.code == .corruption)
        #expect(e?.message.contains("records 1–") == true)
    }

    @Test func aDamagedSegmentHeaderIsCorruptionAtOffsetZero() async throws {
        let dir = try await multiSegmentStore(records: 300, segmentSize: 8192)
        let names = try segmentFiles(dir.path)
        try Files.flipBit(dir.sub(names[1]), byte: 35, bit: 2)
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
        #expect(e?.code == .corruption)
        #expect(e?.file?.hasSuffix(names[1]) == true)
        #expect(e?.offset == 0)
    }

    @Test func aSegmentFromAnotherStoreIsRefused() async throws {
        let a = try await multiSegmentStore(records: 300, segmentSize: 8192)
        let b = try await multiSegmentStore(records: 300, segmentSize: 8192)
        let names = try segmentFiles(a.path)
        try Files.write(a.sub(names[1]), try Files.read(b.sub(names[1])))
        let e = logError { _ = try WriteAheadLog.open(at: a.path, options: testOptions()) }
        #expect(e?.code == .corruption)
        #expect(e?.message.contains("belongs to store") == true)
    }

    @Test func aFutureFormatVersionIsRefusedWithoutTouchingAnything() async throws {
        let dir = try await multiSegmentStore(records: 100, segmentSize: 8192)
        let names = try segmentFiles(dir.path)
        var bytes = try Files.read(dir.sub(names.last!))
        bytes[8] = 2  // format version 2, as a later Ferry might write
        try Files.write(dir.sub(names.last!), bytes)
        try Files.remove(dir.sub("LOCK"))
        let before = try Files.snapshot(dir.path)
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
        #expect(e?.code == .unsupportedFormat)
        #expect(e?.message.contains("version 2") == true)
        #expect(try Files.snapshot(dir.path) == before)
        let salvage = logError {
            var o = testOptions()
            o.recovery = .salvage
            _ = try WriteAheadLog.open(at: dir.path, options: o)
        }
        #expect(salvage?.code == .unsupportedFormat)
        #expect(try Files.snapshot(dir.path) == before)
    }

    @Test func anUnknownCodecIsRefusedWithoutTouchingTheLog() async throws {
        let dir = try await writeStore(20, batchSize: 1, options: testOptions(.fsync))
        let name = try segmentFiles(dir.path)[0]
        // A torn frame at the end, which an ordinary open would truncate, shows the refusal
        // happens before any repair.
        try Files.append(dir.sub(name), craftedFrameHeader(codec: 9, storedLength: 0, rawLength: 0, firstLSN: 21, records: 1)
                         + [1, 2, 3])
        let before = try Files.snapshot(dir.path)
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
        #expect(e?.code == .unsupportedFormat)
        #expect(e?.message.contains("codec 9") == true)
        #expect(try Files.snapshot(dir.path).filter { $0.key != "LOCK" } == before.filter { $0.key != "LOCK" })
    }
}

@Suite struct SalvageTests {
    func salvageOptions() -> LogOptions {
        var o = testOptions()
        o.recovery = .salvage
        return o
    }

    @Test func salvageDropsExactlyTheDamagedFrameAndKeepsEverythingElse() async throws {
        let dir = try await multiSegmentStore(records: 200, segmentSize: 8192)
        let names = try segmentFiles(dir.path)
        let frames = parseFrames(try Files.read(dir.sub(names[1])))
        let victim = frames[3]
        try Files.flipBit(dir.sub(names[1]), byte: victim.offset + 50, bit: 5)

        let log = try WriteAheadLog.open(at: dir.path, options: salvageOptions())
        let loss = try #require(log.recovery.salvaged.first)
        #expect(log.recovery.salvaged.count == 1)
        #expect(loss.segment == names[1])
        #expect(loss.offset == Int64(victim.offset))
        #expect(loss.lsns == victim.firstLSN..<victim.firstLSN + UInt64(victim.records))
        let records = try log.records()
        #expect(records.count == 200 - victim.records)
        for r in records {
            #expect(!loss.lsns.contains(r.lsn.rawValue))
            #expect(r.payload == Payloads.post(Int(r.lsn.rawValue) - 1))
        }
        try await appendPosts(log, 200..<201)
        #expect(try log.records(from: 201).first?.payload == Payloads.post(200))
        try await log.close()

        // The original is kept; a strict open now succeeds and sees the same records.
        #expect(try Files.list(dir.sub("damaged")).count == 1)
        let strict = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(strict.recovery.isClean)
        #expect(try strict.records().count == 201 - victim.records)
        try await strict.close()
    }

    @Test func salvageRecordsAMissingMiddleSegmentAsAHole() async throws {
        let dir = try await multiSegmentStore(records: 300, segmentSize: 8192)
        let names = try segmentFiles(dir.path)
        let missing = try LogInspection.inspect(dir.path).segments[2].info
        try Files.remove(dir.sub(names[2]))
        let log = try WriteAheadLog.open(at: dir.path, options: salvageOptions())
        #expect(log.recovery.salvaged.map(\.lsns) == [missing.firstLSN.rawValue..<missing.nextLSN.rawValue])
        let lsns = try log.records().map(\.lsn.rawValue)
        #expect(lsns.count == 300 - Int(missing.nextLSN.rawValue - missing.firstLSN.rawValue))
        #expect(!lsns.contains(missing.firstLSN.rawValue))
        try await log.close()
        #expect(try LogInspection.inspect(dir.path).firstProblem == nil)
    }

    @Test func salvageRebuildsADamagedHeaderFromTheFileName() async throws {
        let dir = try await multiSegmentStore(records: 300, segmentSize: 8192)
        let names = try segmentFiles(dir.path)
        try Files.flipBit(dir.sub(names[1]), byte: 20, bit: 1)
        let log = try WriteAheadLog.open(at: dir.path, options: salvageOptions())
        #expect(log.recovery.salvaged.count == 1)
        #expect(log.recovery.salvaged[0].lsns.isEmpty)
        expectPosts(try log.records(), count: 300)
        try await log.close()
    }

    @Test func salvageRestartsTheLogAfterAMissingFirstSegment() async throws {
        let dir = try await multiSegmentStore(records: 300, segmentSize: 8192)
        let names = try segmentFiles(dir.path)
        let first = try LogInspection.inspect(dir.path).segments[0].info
        try Files.remove(dir.sub(names[0]))
        let log = try WriteAheadLog.open(at: dir.path, options: salvageOptions())
        #expect(log.recovery.salvaged.map(\.lsns) == [1..<first.nextLSN.rawValue])
        #expect(log.firstLSN == first.nextLSN)
        #expect(try log.records().count == 300 - Int(first.nextLSN.rawValue - 1))
        try await log.close()
        let strict = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(strict.firstLSN == first.nextLSN)
        try await strict.close()
    }
}
