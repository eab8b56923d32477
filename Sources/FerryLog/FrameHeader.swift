/// The 32-byte header in front of every frame (see FORMAT.md, "Frames").
///
/// The header has its own checksum, so its lengths can be trusted before the body is read.
struct FrameHeader: Equatable {
    enum Kind: UInt8 {
        /// One or more whole batches of records.
        case data = 1
        /// The last frame of a segment that was closed for writing.
        case seal = 2
        /// Records lost to corruption and dropped by a salvage open; `recordCount` LSNs.
        case hole = 3
    }

    enum Codec: UInt8 {
        case raw = 0
        case lz4 = 1
    }

    var kind: Kind
    var codec: Codec
    var storedLength: UInt32
    var rawLength: UInt32
    var firstLSN: LSN
    var recordCount: UInt32
    var bodyCRC: UInt32

    /// The whole frame's size on disk.
    var frameSize: Int { LogFormat.frameHeaderSize + Int(storedLength) }
    /// The LSN after this frame's records (for seal frames: the first LSN of the next segment).
    var nextLSN: LSN {
        kind == .seal ? firstLSN : firstLSN + UInt64(recordCount)
    }

    static func seal(nextLSN: LSN) -> FrameHeader {
        FrameHeader(kind: .seal, codec: .raw, storedLength: 0, rawLength: 0, firstLSN: nextLSN, recordCount: 0,
                    bodyCRC: CRC32C.checksum(UnsafeRawBufferPointer(start: nil, count: 0)))
    }

    static func hole(firstLSN: LSN, count: UInt32) -> FrameHeader {
        FrameHeader(kind: .hole, codec: .raw, storedLength: 0, rawLength: 0, firstLSN: firstLSN, recordCount: count,
                    bodyCRC: CRC32C.checksum(UnsafeRawBufferPointer(start: nil, count: 0)))
    }

    func encode(into p: UnsafeMutableRawPointer) {
        p.storeLE(kind.rawValue, at: 4)
        p.storeLE(codec.rawValue, at: 5)
        p.storeLE(UInt16(0), at: 6)
        p.storeLE(storedLength, at: 8)
        p.storeLE(rawLength, at: 12)
        p.storeLE(firstLSN.rawValue, at: 16)
        p.storeLE(recordCount, at: 24)
        p.storeLE(bodyCRC, at: 28)
        p.storeLE(CRC32C.checksum(UnsafeRawPointer(p + 4), count: LogFormat.frameHeaderSize - 4), at: 0)
    }

    var bytes: [UInt8] {
        [UInt8](unsafeUninitializedCapacity: LogFormat.frameHeaderSize) { b, n in
            encode(into: UnsafeMutableRawPointer(b.baseAddress!))
            n = LogFormat.frameHeaderSize
        }
    }

    enum Decoded {
        case valid(FrameHeader)
        /// The checksum matches but a field holds a value this build does not know.
        case unsupported(String)
        /// The checksum fails, or a checked field is impossible.
        case invalid(String)
    }

    /// Decodes and checks a header from 32 bytes at `p`.
    static func decode(_ p: UnsafeRawPointer) -> Decoded {
        let stored: UInt32 = p.le(0)
        guard CRC32C.checksum(p + 4, count: LogFormat.frameHeaderSize - 4) == stored else {
            return .invalid("frame header checksum mismatch")
        }
        let kindByte: UInt8 = p.le(4), codecByte: UInt8 = p.le(5), reserved: UInt16 = p.le(6)
        guard let kind = Kind(rawValue: kindByte) else { return .unsupported("unknown frame type \(kindByte)") }
        guard let codec = Codec(rawValue: codecByte) else { return .unsupported("unknown codec \(codecByte)") }
        guard reserved == 0 else { return .unsupported("reserved frame header bits set (\(reserved))") }
        let h = FrameHeader(kind: kind, codec: codec, storedLength: p.le(8), rawLength: p.le(12),
                            firstLSN: LSN(p.le(16)), recordCount: p.le(24), bodyCRC: p.le(28))
        if let problem = h.structuralProblem { return .invalid(problem) }
        return .valid(h)
    }

    /// Why the header cannot describe a frame this format writes, or nil if it can.
    /// Lengths are bounded here, before anything is allocated for the body.
    var structuralProblem: String? {
        switch kind {
        case .data:
            if recordCount == 0 { return "data frame with no records" }
            if rawLength > UInt32(LogFormat.maxFrameBody) { return "frame body of \(rawLength) bytes exceeds the limit" }
            if UInt64(recordCount) * 2 > UInt64(rawLength) { return "\(recordCount) records cannot fit \(rawLength) bytes" }
            switch codec {
            case .raw where storedLength != rawLength: return "raw frame with stored length \(storedLength) != \(rawLength)"
            case .lz4 where storedLength == 0 || Int(storedLength) > LZ4.bound(Int(rawLength)):
                return "compressed length \(storedLength) impossible for \(rawLength) bytes"
            default: break
            }
        case .seal, .hole:
            if storedLength != 0 || rawLength != 0 || codec != .raw { return "\(kind) frame with a body" }
            if kind == .seal && recordCount != 0 { return "seal frame with records" }
            if kind == .hole && recordCount == 0 { return "empty hole frame" }
        }
        if firstLSN.rawValue == 0 { return "LSN 0" }
        if UInt64.max - firstLSN.rawValue < UInt64(recordCount) { return "LSNs from \(firstLSN) for \(recordCount) records run past the largest LSN" }
        return nil
    }
}
