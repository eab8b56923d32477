@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

@Suite struct TornTailTests {
    @Test func truncationAtEveryByteOfTheLastFramesLeavesExactlyThePrefix() async throws {
        let dir = try await writeStore(40, batchSize: 2, options: testOptions(.fsync))
        let files = try readStore(dir)
        #expect(files.count == 1)
        let (name, bytes) = files.first!
        let frames = parseFrames(bytes)
        #expect(frames.count == 20)
        let from = frames[frames.count - 3].offset
        for cut in from...bytes.count {
            let trial = try storeWith([name: Array(bytes[0..<cut])])
            let log = try WriteAheadLog.open(at: trial.path, options: testOptions())
            let whole = frames.filter { $0.end <= cut }
            let boundary = whole.last?.end ?? 64
            let expected = whole.map(\.records).reduce(0, +)
            expectPosts(try log.records(), count: expected)
            #expect(log.nextLSN == LSN(UInt64(expected + 1)))
            if cut == boundary {
                #expect(log.recovery.tornTail == nil, "cut at \(cut)")
            } else {
                #expect(log.recovery.tornTail?.offset == Int64(boundary), "cut at \(cut)")
                #expect(log.recovery.tornTail?.discardedBytes == Int64(cut - boundary), "cut at \(cut)")
                #expect(try Files.size(trial.sub(name)) == boundary)
            }
            // The log continues from there.
            try await appendPosts(log, expected..<(expected + 1))
            try await log.close()
            let again = try WriteAheadLog.open(at: trial.path, options: testOptions())
            #expect(again.recovery.isClean)
            expectPosts(try again.records(), count: expected + 1)
            try await again.close()
        }
    }

    @Test(arguments: ["garbage", "a frame header of garbage, then zeros"])
    func junkAfterTheLastFrameIsATornTail(_ junk: String) async throws {
        let dir = try await writeStore(30, batchSize: 3, options: testOptions(.fsync))
        let name = try segmentFiles(dir.path)[0]
        let size = try Files.size(dir.sub(name))
        let bytes: [UInt8] = switch junk {
        case "garbage": Payloads.random(5000, seed: 77)
        default: Payloads.random(32, seed: 78) + [UInt8](repeating: 0, count: 8192)
        }
        try Files.append(dir.sub(name), bytes)
        let verify = try LogInspection.inspect(dir.path)
        #expect(verify.firstProblem?.severity == .tornTail)
        #expect(verify.firstProblem?.offset == Int64(size))
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(log.recovery.tornTail?.offset == Int64(size))
        #expect(log.recovery.tornTail?.discardedBytes == Int64(bytes.count))
        expectPosts(try log.records(), count: 30)
        try await log.close()
    }

    /// While the log runs, the active segment's file is grown with zeros ahead of its frames
    /// (so that a sync does not commit a new size each time); a roll and a close cut them off.
    @Test func theActiveSegmentIsGrownAheadOfItsFramesAndCutBackAtARollAndAClose() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 64 << 10))
        try await appendPosts(log, 0..<20)
        var seen = try LogInspection.inspect(dir.path)
        #expect(seen.firstProblem == nil)
        #expect(seen.segments.map { $0.zeroTail > 0 } == [true], "grown ahead: \(seen.segments.map(\.zeroTail))")
        #expect(seen.segments[0].fileSize == 64 << 10, "no further than the segment's size")
        try await log.roll()
        try await appendPosts(log, 20..<40)
        seen = try LogInspection.inspect(dir.path)
        #expect(seen.segments.map { $0.zeroTail > 0 } == [false, true])
        try await log.close()
        seen = try LogInspection.inspect(dir.path)
        #expect(seen.firstProblem == nil)
        #expect(seen.segments.map(\.zeroTail) == [0, 0])
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        expectPosts(try reopened.records(), count: 40)
        try await reopened.close()
    }

    /// The writer grows a segment with zeros ahead of its frames and cuts them off at a seal or
    /// close; after a crash they are still there. A rest of the file that is all zeros is that
    /// space: no problem, nothing discarded, and the writer goes on over it.
    @Test(arguments: [32, 8192, 3 << 20])
    func zerosAfterTheLastFrameAreSpaceGrownAheadNotATornTail(_ zeros: Int) async throws {
        let dir = try await writeStore(30, batchSize: 3, options: testOptions(.fsync))
        let name = try segmentFiles(dir.path)[0]
        let size = try Files.size(dir.sub(name))
        try Files.append(dir.sub(name), [UInt8](repeating: 0, count: zeros))
        let verify = try LogInspection.inspect(dir.path)
        #expect(verify.firstProblem == nil)
        #expect(verify.segments.map(\.zeroTail) == [Int64(zeros)])
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync))
        #expect(log.recovery.isClean)
        let z = log.recovery.zeroTail
        #expect(z?.segment == name && z?.offset == Int64(size) && z?.bytes == Int64(zeros) && z?.cut == false, "\(log.recovery)")
        expectPosts(try log.records(), count: 30)
        try await appendPosts(log, 30..<40)
        try await log.close()
        #expect(try Files.size(dir.sub(name)) > size, "the new frames went where the zeros began")
        let again = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(again.recovery.isClean && again.recovery.zeroTail == nil)
        expectPosts(try again.records(), count: 40)
        try await again.close()
        #expect(try LogInspection.inspect(dir.path).segments.map(\.zeroTail) == [0], "the close cut the zeros off")
    }

    /// A crash can keep a later page of a write into the space grown ahead and lose an earlier
    /// one: zeros where a frame began, a valid frame after them. In the newest segment that is
    /// a torn tail (nothing of it was synced), not corruption that refuses the open.
    @Test func aFrameOfZerosBeforeAValidFrameInTheNewestSegmentIsATornTail() async throws {
        let dir = try await writeStore(30, batchSize: 3, options: testOptions(.fsync))
        let name = try segmentFiles(dir.path)[0]
        let bytes = try Files.read(dir.sub(name))
        let first = try #require(parseFrames(bytes).first)
        let kept = Array(bytes[first.offset..<first.end])  // a frame whose checksums pass
        try Files.append(dir.sub(name), [UInt8](repeating: 0, count: 100) + kept)
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(log.recovery.tornTail?.offset == Int64(bytes.count))
        #expect(log.recovery.tornTail?.discardedBytes == Int64(100 + kept.count))
        expectPosts(try log.records(), count: 30)
        try await log.close()
    }

    /// A crash after a seal and before the zeros after it were cut (and before the next segment
    /// was made): the open makes the next segment and cuts the zeros off the sealed one.
    @Test func zerosAfterTheSealOfTheNewestSegmentAreCutByTheOpen() async throws {
        let dir = try await writeStore(30, batchSize: 3, options: testOptions(.fsync))
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync))
        try await log.roll()
        try await log.close()
        let names = try segmentFiles(dir.path)
        #expect(names.count == 2)
        try Files.remove(dir.sub(names[1]))  // (the next segment not made yet)
        try Files.append(dir.sub(names[0]), [UInt8](repeating: 0, count: 5000))
        let sealedSize = try Files.size(dir.sub(names[0])) - 5000
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(reopened.recovery.tornTail == nil)
        let z = reopened.recovery.zeroTail
        #expect(z?.segment == names[0] && z?.offset == Int64(sealedSize) && z?.bytes == 5000 && z?.cut == true, "\(reopened.recovery)")
        #expect(!reopened.recovery.isClean, "a cut is a repair")
        expectPosts(try reopened.records(), count: 30)
        try await reopened.close()
        let seen = try LogInspection.inspect(dir.path)
        #expect(seen.firstProblem == nil)
        #expect(seen.segments.map(\.zeroTail) == [0, 0])
    }

    @Test func aValidFrameAfterJunkMakesItCorruptionNotATornTail() async throws {
        let dir = try await writeStore(10, batchSize: 1, options: testOptions(.fsync))
        let name = try segmentFiles(dir.path)[0]
        let bytes = try Files.read(dir.sub(name))
        let frames = parseFrames(bytes)
        // Damage the second-to-last frame's body: the last frame is still valid after it.
        let victim = frames[frames.count - 2]
        try Files.flipBit(dir.sub(name), byte: victim.offset + 40, bit: 3)
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
        #expect(e?.code == .corruption)
        #expect(e?.offset == Int64(victim.offset))
        #expect(e?.file?.hasSuffix(name) == true)
        // Nothing was truncated.
        #expect(try Files.size(dir.sub(name)) == bytes.count)
    }

    @Test func aHugeLengthFieldAllocatesNothingAndIsATornTail() async throws {
        let dir = try await writeStore(5, options: testOptions(.fsync))
        let name = try segmentFiles(dir.path)[0]
        let size = try Files.size(dir.sub(name))
        let (_, baseline) = try runMeasuringMemory(Locations.executable("ferry-dump"), ["verify", dir.path])
        // A header with a valid checksum announcing a 60 MiB body, followed by 100 bytes.
        try Files.append(dir.sub(name), craftedFrameHeader(storedLength: 60 << 20, rawLength: 60 << 20, firstLSN: 6, records: 1) + [UInt8](repeating: 1, count: 100))
        let (result, maxRSS) = try runMeasuringMemory(Locations.executable("ferry-dump"), ["verify", dir.path])
        #expect(result == 1, "verify should report a torn tail")
        #expect(maxRSS - baseline < 8 << 20,
                "ferry-dump used \((maxRSS - baseline) >> 20) MiB more to read a 60 MiB length claim than to read the store without it")
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(log.recovery.tornTail?.offset == Int64(size))
        expectPosts(try log.records(), count: 5)
        try await log.close()
    }

    @Test func aLengthBeyondTheFormatLimitIsNotTrustedEvenWithAValidChecksum() async throws {
        let dir = try await writeStore(5, options: testOptions(.fsync))
        let name = try segmentFiles(dir.path)[0]
        try Files.append(dir.sub(name), craftedFrameHeader(storedLength: 0xFFFF_FFF0, rawLength: 0xFFFF_FFF0, firstLSN: 6, records: 1))
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        #expect(log.recovery.tornTail?.reason.contains("exceeds the limit") == true)
        expectPosts(try log.records(), count: 5)
        try await log.close()
    }
}

/// A frame header with a correct header checksum (and any lengths), built per FORMAT.md.
func craftedFrameHeader(type: UInt8 = 1, codec: UInt8 = 1, storedLength: UInt32, rawLength: UInt32, firstLSN: UInt64, records: UInt32, bodyCRC: UInt32 = 0) -> [UInt8] {
    var h = [UInt8](repeating: 0, count: 32)
    func put<T: FixedWidthInteger>(_ v: T, _ at: Int) { withUnsafeBytes(of: v.littleEndian) { for (i, b) in $0.enumerated() { h[at + i] = b } } }
    h[4] = type
    h[5] = codec
    put(storedLength, 8)
    put(rawLength, 12)
    put(firstLSN, 16)
    put(records, 24)
    put(bodyCRC, 28)
    put(crc32c(Array(h[4..<32])), 0)
    return h
}
