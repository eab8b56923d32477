/// The constants of on-disk format version 1 (see FORMAT.md, which this file matches).
enum LogFormat {
    /// The format version this build writes, and the only one it reads.
    static let version: UInt16 = 1

    static let segmentMagic: [UInt8] = Array("FERRYLOG".utf8)
    static let startMagic: [UInt8] = Array("FERRYSTA".utf8)

    static let segmentHeaderSize = 64
    static let frameHeaderSize = 32
    static let startFileSize = 64

    /// The largest uncompressed frame body (and so the largest batch) the format allows.
    static let maxFrameBody = 64 << 20
    /// The largest record payload: a record and its 6 bytes of framing fit one frame body.
    static let maxRecordPayload = maxFrameBody - 6

    static let segmentSuffix = ".wal"
    static let temporarySuffix = ".tmp"
    static let startFileName = "log-start"
    static let lockFileName = "LOCK"
    static let damagedDirectory = "damaged"

    /// `{seq:016x}-{firstLSN:016x}.wal`: names that `ls` sorts in log order.
    static func segmentName(seq: UInt64, firstLSN: LSN) -> String {
        hex(seq) + "-" + hex(firstLSN.rawValue) + segmentSuffix
    }

    /// Parses a segment file name; nil for any other name.
    static func parseSegmentName(_ name: String) -> (seq: UInt64, firstLSN: LSN)? {
        let u = Array(name.utf8)
        guard u.count == 16 + 1 + 16 + segmentSuffix.utf8.count, name.hasSuffix(segmentSuffix), u[16] == UInt8(ascii: "-")
        else { return nil }
        func parse(_ s: ArraySlice<UInt8>) -> UInt64? {
            guard s.allSatisfy({ (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }) else { return nil }
            return UInt64(String(decoding: s, as: UTF8.self), radix: 16)
        }
        guard let seq = parse(u[0..<16]), let lsn = parse(u[17..<33]) else { return nil }
        return (seq, LSN(lsn))
    }
}

/// The 64-byte header at the start of every segment file.
struct SegmentHeader: Equatable {
    var storeID: StoreID
    var seq: UInt64
    var firstLSN: LSN
    var createdNanos: UInt64

    func encode(into p: UnsafeMutableRawPointer) {
        p.initializeMemory(as: UInt8.self, repeating: 0, count: LogFormat.segmentHeaderSize)
        LogFormat.segmentMagic.withUnsafeBytes { p.copyMemory(from: $0.baseAddress!, byteCount: 8) }
        p.storeLE(LogFormat.version, at: 8)
        p.storeLE(UInt16(LogFormat.segmentHeaderSize), at: 10)
        p.storeLE(UInt32(0), at: 12)
        p.storeLE(storeID.high, at: 16)
        p.storeLE(storeID.low, at: 24)
        p.storeLE(seq, at: 32)
        p.storeLE(firstLSN.rawValue, at: 40)
        p.storeLE(createdNanos, at: 48)
        p.storeLE(CRC32C.checksum(UnsafeRawPointer(p), count: 60), at: 60)
    }

    var bytes: [UInt8] {
        [UInt8](unsafeUninitializedCapacity: LogFormat.segmentHeaderSize) { b, n in
            encode(into: UnsafeMutableRawPointer(b.baseAddress!))
            n = LogFormat.segmentHeaderSize
        }
    }

    enum Decoded {
        case valid(SegmentHeader)
        /// Magic matches but the version (or header size, or flags) is one this build does not read.
        case unsupported(String)
        /// Damaged: why, and the offset in the file of the byte found wrong.
        case corrupt(String, offset: Int = 0)
    }

    /// Decodes a header. The version is checked before the checksum, so a header written by a
    /// later format (whose layout may differ) is refused as unsupported, not called corrupt.
    static func decode(_ b: UnsafeRawBufferPointer) -> Decoded {
        guard b.count >= LogFormat.segmentHeaderSize else {
            return .corrupt("the file is \(b.count) bytes, shorter than a segment header")
        }
        let p = b.baseAddress!
        guard LogFormat.segmentMagic.withUnsafeBytes({ memcmpEqual($0.baseAddress!, p, 8) }) else {
            return .corrupt("bad segment magic")
        }
        let version: UInt16 = p.le(8)
        if version > LogFormat.version {
            return .unsupported("segment format version \(version); this build reads version \(LogFormat.version)")
        }
        let stored: UInt32 = p.le(60)
        guard CRC32C.checksum(p, count: 60) == stored else { return .corrupt("segment header checksum mismatch") }
        guard version == LogFormat.version else { return .corrupt("segment format version \(version) is not valid") }
        let size: UInt16 = p.le(10), flags: UInt32 = p.le(12)
        guard size == UInt16(LogFormat.segmentHeaderSize), flags == 0 else {
            return .unsupported("segment header size \(size) / flags \(flags) not understood by this build")
        }
        if let at = firstNonZero(p, 56..<60) {
            return .corrupt("reserved byte \(at) of the segment header is not zero", offset: at)
        }
        return .valid(SegmentHeader(
            storeID: StoreID(high: p.le(16), low: p.le(24)), seq: p.le(32),
            firstLSN: LSN(p.le(40)), createdNanos: p.le(48)))
    }
}

/// The offset of the first non-zero byte of `range` at `p`, if any (reserved bytes must be zero).
func firstNonZero(_ p: UnsafeRawPointer, _ range: Range<Int>) -> Int? {
    range.first { p.load(fromByteOffset: $0, as: UInt8.self) != 0 }
}

@inline(__always) func memcmpEqual(_ a: UnsafeRawPointer, _ b: UnsafeRawPointer, _ n: Int) -> Bool {
    for i in 0..<n where a.load(fromByteOffset: i, as: UInt8.self) != b.load(fromByteOffset: i, as: UInt8.self) {
        return false
    }
    return true
}
