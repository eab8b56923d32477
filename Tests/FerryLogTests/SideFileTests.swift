import FerryLog
import FerryTestSupport
import Testing

@Suite struct SideFileTests {
    /// Blocks of every kind: compressible text, random bytes, one byte, a large one.
    static func sampleBlocks() -> [[UInt8]] {
        [Payloads.post(1), Payloads.random(3000, seed: 7), [42], Array(repeating: 9, count: 100_000),
         (0..<40).flatMap { Payloads.post($0) }, Payloads.random(17, seed: 3)]
    }

    static func write(_ log: WriteAheadLog, _ name: String, _ blocks: [[UInt8]]) throws {
        try log.writeSideFile(named: name) { out in
            for b in blocks { try b.withUnsafeBytes { try out.write($0) } }
        }
    }

    static func read(_ log: WriteAheadLog, _ name: String) throws -> [[UInt8]]? {
        var blocks: [[UInt8]] = []
        guard try log.readSideFile(named: name, blocks: { blocks.append(Array($0)) }) else { return nil }
        return blocks
    }

    @Test func blocksComeBackInOrderWhetherTheyCompressOrNot() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.none))
        let blocks = Self.sampleBlocks()
        try Self.write(log, "image", blocks)
        #expect(try Self.read(log, "image") == blocks)
        #expect(try Files.size(dir.sub("image")) < blocks.reduce(0) { $0 + $1.count } / 2, "compressible blocks are stored compressed")
        #expect(try Self.read(log, "absent") == nil)
        #expect(try log.sideFiles(withPrefix: "") == ["image"], "no temporary file is left")
        try await log.close()
    }

    @Test func anEmptyOrOversizedBlockIsRefused() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.none))
        #expect(logError { try Self.write(log, "f", [[1], []]) }?.code == .invalidArgument)
        #expect(logError { try Self.write(log, "f", [[UInt8](repeating: 0, count: WriteAheadLog.maximumSideFileBlock + 1)]) }?.code == .invalidArgument)
        #expect(try Self.read(log, "f") == nil, "a refused write leaves no file")
        try await log.close()
    }

    @Test func aBodyThatThrowsLeavesThePreviousVersion() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.none))
        try Self.write(log, "f", [[1, 2, 3]])
        struct Stop: Error {}
        #expect(throws: Stop.self) {
            try log.writeSideFile(named: "f") { out in
                try [UInt8]([4, 5]).withUnsafeBytes { try out.write($0) }
                throw Stop()
            }
        }
        #expect(try Self.read(log, "f") == [[1, 2, 3]])
        #expect(try log.sideFiles(withPrefix: "") == ["f"])
        try await log.close()
    }

    @Test func everyFlippedBitAndEveryCutIsReportedAsCorruption() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.none))
        let blocks = [Payloads.post(1), Payloads.random(40, seed: 1), Array(repeating: 7, count: 300)]
        try Self.write(log, "f", blocks)
        let good = try Files.read(dir.sub("f"))
        for i in 0..<good.count {
            var bad = good
            bad[i] ^= 1 << UInt8(i % 8)
            try Files.write(dir.sub("f"), bad)
            #expect(logError { _ = try Self.read(log, "f") }?.code == .corruption, "bit flipped in byte \(i)")
        }
        for n in 0..<good.count {
            try Files.write(dir.sub("f"), Array(good[0..<n]))
            #expect(logError { _ = try Self.read(log, "f") }?.code == .corruption, "cut to \(n) bytes")
        }
        try Files.write(dir.sub("f"), good + [0])
        #expect(logError { _ = try Self.read(log, "f") }?.code == .corruption, "a byte after the end marker")
        try Files.write(dir.sub("f"), good)
        #expect(try Self.read(log, "f") == blocks)
        try await log.close()
    }
}
