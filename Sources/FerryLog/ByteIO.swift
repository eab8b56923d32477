import CCRC32C
import CLZ4

// Little-endian integers, varints, CRC32C and LZ4 over raw buffers: the helpers every encoder
// and decoder in this module shares. Internal; bounds are the callers' responsibility and are
// checked in debug builds.

extension UnsafeRawPointer {
    @inline(__always) func le<T: FixedWidthInteger>(_ offset: Int, as: T.Type = T.self) -> T {
        T(littleEndian: loadUnaligned(fromByteOffset: offset, as: T.self))
    }
}

extension UnsafeMutableRawPointer {
    @inline(__always) func storeLE<T: FixedWidthInteger>(_ value: T, at offset: Int) {
        storeBytes(of: value.littleEndian, toByteOffset: offset, as: T.self)
    }
}

enum Varint {
    /// The most bytes a 32-bit LEB128 value takes.
    static let maxLength32 = 5

    @inline(__always) static func length(_ value: UInt32) -> Int {
        var v = value, n = 1
        while v >= 0x80 { v >>= 7; n += 1 }
        return n
    }

    /// Writes `value` as unsigned LEB128 at `p`; returns the bytes written.
    @inline(__always) static func write(_ value: UInt32, to p: UnsafeMutableRawPointer) -> Int {
        var v = value, i = 0
        while v >= 0x80 {
            p.storeBytes(of: UInt8(truncatingIfNeeded: v) | 0x80, toByteOffset: i, as: UInt8.self)
            v >>= 7
            i += 1
        }
        p.storeBytes(of: UInt8(v), toByteOffset: i, as: UInt8.self)
        return i + 1
    }

    /// Reads an unsigned LEB128 value of at most 5 bytes from `p[0..<limit]`.
    /// Returns nil when it runs past `limit` or overflows 32 bits.
    @inline(__always) static func read(_ p: UnsafeRawPointer, limit: Int) -> (value: UInt32, length: Int)? {
        var result: UInt32 = 0
        var shift: UInt32 = 0
        var i = 0
        while i < limit && i < maxLength32 {
            let byte = p.load(fromByteOffset: i, as: UInt8.self)
            if i == 4 && byte > 0x0F { return nil }
            result |= UInt32(byte & 0x7F) << shift
            i += 1
            if byte < 0x80 { return (result, i) }
            shift += 7
        }
        return nil
    }
}

enum CRC32C {
    @inline(__always) static func checksum(_ bytes: UnsafeRawBufferPointer, extending crc: UInt32 = 0) -> UInt32 {
        ferry_crc32c(crc, bytes.baseAddress, bytes.count)
    }

    @inline(__always) static func checksum(_ p: UnsafeRawPointer, count: Int, extending crc: UInt32 = 0) -> UInt32 {
        ferry_crc32c(crc, p, count)
    }
}

enum LZ4 {
    /// The largest output `compress` can produce for `count` input bytes.
    static func bound(_ count: Int) -> Int { Int(LZ4_compressBound(Int32(count))) }

    /// Compresses `source` into `destination`; returns the compressed size, or nil when the
    /// result would not be smaller than the input (the caller then stores the bytes raw).
    static func compress(_ source: UnsafeRawBufferPointer, into destination: UnsafeMutableRawBufferPointer) -> Int? {
        guard source.count > 16 else { return nil }
        // A capacity one below the input size makes LZ4 give up early on incompressible data.
        let capacity = min(destination.count, source.count - 1)
        let n = LZ4_compress_default(
            source.baseAddress!.assumingMemoryBound(to: CChar.self),
            destination.baseAddress!.assumingMemoryBound(to: CChar.self),
            Int32(source.count), Int32(capacity))
        return n > 0 ? Int(n) : nil
    }

    /// Decompresses `source` into exactly `destination.count` bytes; false if the block is
    /// malformed or does not decode to exactly that size.
    static func decompress(_ source: UnsafeRawBufferPointer, into destination: UnsafeMutableRawBufferPointer) -> Bool {
        guard let s = source.baseAddress, let d = destination.baseAddress else { return source.isEmpty && destination.isEmpty }
        let n = LZ4_decompress_safe(
            s.assumingMemoryBound(to: CChar.self), d.assumingMemoryBound(to: CChar.self),
            Int32(source.count), Int32(destination.count))
        return n == destination.count
    }
}
