import CCRC32C
@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

/// FORMAT.md's reserved header bytes are written as zero, and a reader refuses any that are not
/// (with a checksum that passes: only the reserved-byte check can catch it) as corruption naming
/// the file and the byte's offset.
@Suite struct ReservedBytesTests {
    /// Sets `byte` of the 64-byte header at the start of `path` and recomputes the header's
    /// checksum (bytes 60..<64, over 0..<60), as segment headers and `log-start` both have.
    static func setHeaderByte(_ path: String, _ byte: Int, to value: UInt8) throws {
        var bytes = try Files.read(path)
        bytes[byte] = value
        let crc = bytes.withUnsafeBytes { ferry_crc32c(0, $0.baseAddress!, 60) }
        for k in 0..<4 { bytes[60 + k] = UInt8(truncatingIfNeeded: crc >> (8 * UInt32(k))) }
        try Files.write(path, bytes)
    }

    static func expectCorruption(_ dir: TemporaryDirectory, file: String, offset: Int64, sourceLocation: SourceLocation = #_sourceLocation) {
        do {
            let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.none))
            Issue.record("the open succeeded", sourceLocation: sourceLocation)
            Task { try? await log.close() }
        } catch let e as LogError {
            #expect(e.code == .corruption, "\(e)", sourceLocation: sourceLocation)
            #expect(e.file?.hasSuffix("/" + file) == true, "\(e)", sourceLocation: sourceLocation)
            #expect(e.offset == offset, "\(e)", sourceLocation: sourceLocation)
        } catch {
            Issue.record("unexpected error \(error)", sourceLocation: sourceLocation)
        }
        let problem = try? LogInspection.inspect(dir.path).firstProblem
        #expect(problem?.severity == .corruption && problem?.file == file && problem?.offset == offset,
                "verify reports \(String(describing: problem))", sourceLocation: sourceLocation)
    }

    @Test(arguments: [56, 57, 58, 59])
    func aSegmentHeaderWithANonZeroReservedByteIsCorruptionAtThatByte(byte: Int) async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.none, segmentSize: 8192))
        try await appendPosts(log, 0..<200, batchSize: 4)
        let segment = try #require(log.segments.first?.name)
        try await log.close()
        #expect(try Files.read(dir.sub(segment))[56..<60].allSatisfy { $0 == 0 }, "written as zero")
        let original = try Files.read(dir.sub(segment))

        try Self.setHeaderByte(dir.sub(segment), byte, to: 0x01)
        let damaged = try Files.read(dir.sub(segment))
        Self.expectCorruption(dir, file: segment, offset: Int64(byte))
        #expect(try Files.read(dir.sub(segment)) == damaged, "the refused segment is left as it was found")

        try Files.write(dir.sub(segment), original)
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions(.none, segmentSize: 8192))
        #expect(reopened.recovery.isClean)
        try await reopened.close()
    }

    @Test(arguments: [12, 15, 48, 59])
    func aLogStartWithANonZeroReservedByteIsCorruptionAtThatByte(byte: Int) async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.none, segmentSize: 8192))
        try await appendPosts(log, 0..<300, batchSize: 2)
        try await log.sync()
        try await log.deleteSegments(before: log.segments[2].firstLSN)
        try await log.close()
        let marker = dir.sub("log-start")
        let original = try Files.read(marker)
        #expect(original[12..<16].allSatisfy { $0 == 0 } && original[48..<60].allSatisfy { $0 == 0 }, "written as zero")

        try Self.setHeaderByte(marker, byte, to: 0x80)
        Self.expectCorruption(dir, file: "log-start", offset: Int64(byte))

        try Files.write(marker, original)
        let reopened = try WriteAheadLog.open(at: dir.path, options: testOptions(.none, segmentSize: 8192))
        #expect(reopened.recovery.isClean)
        try await reopened.close()
    }
}
