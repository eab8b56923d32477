/// Appends little-endian integers, varints and strings to a byte array.
struct ByteWriter {
    var bytes: [UInt8]

    init(capacity: Int = 256) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    var count: Int { bytes.count }

    mutating func u8(_ v: UInt8) { bytes.append(v) }

    mutating func varint(_ value: UInt64) {
        var v = value
        while v >= 0x80 {
            bytes.append(UInt8(truncatingIfNeeded: v) | 0x80)
            v >>= 7
        }
        bytes.append(UInt8(v))
    }

    /// Puts the varint of `n` in place of the one-byte placeholder at `offset` (a count
    /// written before it was known).
    mutating func patchVarint(_ n: Int, at offset: Int) {
        if n < 0x80 {
            bytes[offset] = UInt8(n)
        } else {
            var count = ByteWriter(capacity: 10)
            count.varint(UInt64(n))
            bytes.replaceSubrange(offset..<(offset + 1), with: count.bytes)
        }
    }

    mutating func signed(_ value: Int64) { varint(UInt64(bitPattern: (value << 1) ^ (value >> 63))) }

    mutating func double(_ d: Double) {
        withUnsafeBytes(of: d.bitPattern.littleEndian) { bytes.append(contentsOf: $0) }
    }

    mutating func string(_ s: String) {
        var s = s
        s.withUTF8 { utf8 in
            varint(UInt64(utf8.count))
            bytes.append(contentsOf: utf8)
        }
    }

    mutating func path(_ p: Path) {
        varint(UInt64(p.count))
        for k in p.keys { string(k) }
    }
}

/// Reads what ByteWriter wrote, with bounds checks: damaged input is an error, never a trap.
struct ByteReader {
    let bytes: UnsafeRawBufferPointer
    var offset: Int

    init(_ bytes: UnsafeRawBufferPointer, offset: Int = 0) {
        self.bytes = bytes
        self.offset = offset
    }

    var atEnd: Bool { offset >= bytes.count }

    static func damaged(_ why: String) -> DatabaseError { DatabaseError(.storage, "a stored record is damaged: \(why)") }

    @inline(__always)
    mutating func u8() throws -> UInt8 {
        guard offset < bytes.count else { throw Self.unexpectedEnd() }
        defer { offset += 1 }
        return bytes[offset]
    }

    /// (Kept out of line: building the error is most of the code of a read.)
    @inline(never)
    static func unexpectedEnd() -> DatabaseError { damaged("unexpected end") }

    /// A varint: one byte inline (most of what checkpoints and records hold), longer ones out
    /// of line.
    @inline(__always)
    mutating func varint() throws -> UInt64 {
        if offset < bytes.count {
            let b = bytes[offset]
            if b < 0x80 {
                offset += 1
                return UInt64(b)
            }
        }
        return try longVarint()
    }

    @inline(never)
    mutating func longVarint() throws -> UInt64 {
        var result: UInt64 = 0
        var shift: UInt64 = 0
        while true {
            let b = try u8()
            guard shift < 64 else { throw Self.damaged("varint too long") }
            result |= UInt64(b & 0x7F) << shift
            if b < 0x80 { return result }
            shift += 7
        }
    }

    /// A varint that counts something (bytes, keys, entries): one above `Int.max` is damage.
    @inline(__always)
    mutating func varintCount() throws -> Int {
        let v = try varint()
        guard v <= UInt64(Int.max) else { throw Self.badCount(v) }
        return Int(v)
    }

    @inline(never)
    static func badCount(_ v: UInt64) -> DatabaseError { damaged("a count of \(v)") }

    @inline(__always)
    mutating func signed() throws -> Int64 {
        let v = try varint()
        return Int64(bitPattern: (v >> 1) ^ (0 &- (v & 1)))
    }

    mutating func double() throws -> Double {
        guard offset + 8 <= bytes.count else { throw Self.damaged("unexpected end") }
        defer { offset += 8 }
        return Double(bitPattern: UInt64(littleEndian: bytes.loadUnaligned(fromByteOffset: offset, as: UInt64.self)))
    }

    mutating func string() throws -> String {
        String(decoding: try stringBytes(), as: UTF8.self)
    }

    /// The bytes of the string at the reader (moved past it), valid as long as the reader's.
    mutating func stringBytes() throws -> UnsafeBufferPointer<UInt8> {
        let n = try varintCount()
        guard n <= bytes.count - offset else { throw Self.damaged("string longer than the record") }
        defer { offset += n }
        return UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + n]).assumingMemoryBound(to: UInt8.self)
    }

    mutating func path() throws -> Path {
        let n = try varintCount()
        guard n <= 64 else { throw Self.damaged("a path of \(n) keys") }
        var keys: [String] = []
        keys.reserveCapacity(n)
        for _ in 0..<n { keys.append(try string()) }
        return Path(keys: keys)
    }
}
