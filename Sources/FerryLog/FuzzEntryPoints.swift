#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Narrow doors into the log's decoders for the libFuzzer targets of the `Fuzz/` package and
/// for the regression tests of what they found. Not API: the SPI keeps them out of the
/// library's public face (`@_spi(Fuzzing) import FerryLog` to see them).
///
/// Each entry point runs the real decoder, exactly as an open or a read runs it, on bytes it
/// is given; damaged input must come back as a reported problem or a thrown error. A trap,
/// an out-of-bounds access or a broken invariant (checked here with `preconditionFailure`, so
/// that libFuzzer sees a crash) is a bug.
@_spi(Fuzzing) public enum LogFuzzEntryPoints {
    /// What ``scanSegment(_:directory:)`` found.
    public struct SegmentOutcome: Sendable, Equatable {
        /// The first problem the scan reported ("tail", "corruption" or "unsupported", and its
        /// message), or nil for a segment that checks out.
        public var problem: String?
        /// The records the scan counted in whole, checked frames.
        public var records: UInt64
        /// The records read back through the frame reader (only for segments that checked out).
        public var recordsRead: UInt64
    }

    /// Bit 0 of `flags`: put right the checksums of the segment header and of every frame
    /// (header and body) before scanning, so the fuzzer reaches what lies behind them.
    public static let fixChecksums: UInt8 = 1
    /// Bit 1: scan as the newest segment (a bad tail is a torn tail).
    public static let newest: UInt8 = 2
    /// Bit 2: scan with resynchronization, as a salvage open does.
    public static let resync: UInt8 = 4

    /// Takes a flags byte (``fixChecksums``, ``newest``, ``resync``), then writes the rest of
    /// `input` as a segment file in `directory` (named after the sequence number and first
    /// LSN its header gives), scans it as an open does (deep: every frame decompressed and its
    /// records checked) and, when the scan finds no problem, reads every record back through
    /// the frame reader as a replay does. The file is removed afterwards.
    ///
    /// Checks: a segment the scan accepts reads back without an error and with exactly the
    /// records the scan counted.
    /// - Throws: ``LogError`` when the file cannot be written or read (the directory's problem,
    ///   not the input's).
    public static func scanSegment(_ input: UnsafeRawBufferPointer, directory: String) throws -> SegmentOutcome {
        let flags = input.first ?? 0
        var file = [UInt8](input.dropFirst())
        if flags & fixChecksums != 0 { putChecksumsRight(&file) }
        var seq: UInt64 = 1, first: UInt64 = 1
        if file.count >= LogFormat.segmentHeaderSize {
            file.withUnsafeBytes { b in
                seq = b.baseAddress!.le(32)
                first = b.baseAddress!.le(40)
            }
        }
        let name = LogFormat.segmentName(seq: seq, firstLSN: LSN(first))
        let store = StoreDirectory(path: directory, system: .live)
        let path = store.path(name)
        let system = store.system
        let fd: Int32
        switch system.open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644) {
        case .success(let d): fd = d
        case .failure(let e): throw LogError.io("open", path: path, e)
        }
        let written = file.withUnsafeBytes { system.writeAll(fd, $0) }
        _ = system.close(fd)
        defer { _ = system.unlink(path) }
        if case .failure(let e) = written { throw LogError.io("write", path: path, e) }

        let options = SegmentScanner.Options(isNewest: flags & newest != 0, deep: true, resync: flags & resync != 0)
        let scan = try SegmentScanner.scan(directory: store, name: name, seq: seq, firstLSN: LSN(first), options: options)
        var outcome = SegmentOutcome(problem: scan.problem.map { "\($0.kind): \($0.message)" }, records: scan.records, recordsRead: 0)
        guard scan.problem == nil, scan.nextLSN > scan.firstLSN else { return outcome }

        let info = SegmentInfo(scan: scan)
        var expected = scan.firstLSN
        let next: LSN
        do {
            next = try SegmentReading.read(store, segments: [info], from: scan.firstLSN, through: scan.nextLSN - 1) { r in
                guard r.lsn == expected else { preconditionFailure("record \(r.lsn) read where \(expected) was due") }
                expected = expected + 1
                outcome.recordsRead += 1
            }
        } catch {
            preconditionFailure("a segment the scan accepted does not read back: \(error)")
        }
        guard next == scan.nextLSN, outcome.recordsRead == scan.records else {
            preconditionFailure("the scan counted \(scan.records) records up to \(scan.nextLSN); reading gave \(outcome.recordsRead) up to \(next)")
        }
        return outcome
    }

    /// Recomputes the segment header's checksum and, walking the frames by the lengths their
    /// headers give, every frame header and body checksum. Stops at the first frame that does
    /// not fit the bytes.
    static func putChecksumsRight(_ file: inout [UInt8]) {
        file.withUnsafeMutableBytes { b in
            guard b.count >= LogFormat.segmentHeaderSize, let p = b.baseAddress else { return }
            p.storeLE(CRC32C.checksum(UnsafeRawPointer(p), count: 60), at: 60)
            var offset = LogFormat.segmentHeaderSize
            while offset + LogFormat.frameHeaderSize <= b.count {
                let h = p + offset
                let stored = Int(UnsafeRawPointer(h).le(8, as: UInt32.self))
                guard stored <= b.count - offset - LogFormat.frameHeaderSize else { return }
                let body = UnsafeRawBufferPointer(start: h + LogFormat.frameHeaderSize, count: stored)
                h.storeLE(CRC32C.checksum(body), at: 28)
                h.storeLE(CRC32C.checksum(UnsafeRawPointer(h + 4), count: LogFormat.frameHeaderSize - 4), at: 0)
                offset += LogFormat.frameHeaderSize + stored
            }
        }
    }
}
