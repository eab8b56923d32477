#if canImport(Glibc)
import Glibc
#endif
import CCRC32C
import CLZ4

/// The ceiling every log workload is measured against: the same records, framed into blocks
/// compressed as one LZ4 block each and checksummed with CRC32C (a 32-byte header as Ferry's),
/// written with plain `write` and `fdatasync` at the same commit points. No segments, no
/// concurrency, no recovery: what the disk and the codecs allow.
struct RawCeiling {
    let path: String
    private var fd: Int32 = -1
    private var block: [UInt8] = []
    private var out: [UInt8] = []
    private var blockRecords = 0
    static let blockSize = 64 << 10

    init(path: String) {
        self.path = path
        fd = open(path, O_WRONLY | O_CREAT | O_TRUNC | O_APPEND, 0o644)
        precondition(fd >= 0, "cannot create \(path)")
        block.reserveCapacity(Self.blockSize + 4096)
        out = [UInt8](repeating: 0, count: 32 + Int(LZ4_compressBound(Int32(Self.blockSize * 2))))
    }

    /// Adds a record (kind + varint length + payload, as Ferry frames it); writes a block once
    /// it reaches 64 KiB.
    mutating func add(_ payload: UnsafeRawBufferPointer) {
        block.append(1)
        var n = UInt32(payload.count)
        while n >= 0x80 { block.append(UInt8(truncatingIfNeeded: n) | 0x80); n >>= 7 }
        block.append(UInt8(n))
        block.append(contentsOf: payload)
        blockRecords += 1
        if block.count >= Self.blockSize { writeBlock() }
    }

    /// Adds a record of two parts (a key, then its value).
    mutating func add(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) {
        block.append(1)
        var n = UInt32(key.count + value.count)
        while n >= 0x80 { block.append(UInt8(truncatingIfNeeded: n) | 0x80); n >>= 7 }
        block.append(UInt8(n))
        block.append(contentsOf: key)
        block.append(contentsOf: value)
        blockRecords += 1
        if block.count >= Self.blockSize { writeBlock() }
    }

    /// Frames and writes what is buffered.
    mutating func writeBlock() {
        guard blockRecords > 0 else { return }
        if out.count < 32 + Int(LZ4_compressBound(Int32(block.count))) {
            out = [UInt8](repeating: 0, count: 32 + Int(LZ4_compressBound(Int32(block.count))))
        }
        let stored: Int = block.withUnsafeBytes { src in
            out.withUnsafeMutableBytes { dst in
                let n = LZ4_compress_default(src.baseAddress!.assumingMemoryBound(to: CChar.self),
                                             dst.baseAddress!.advanced(by: 32).assumingMemoryBound(to: CChar.self),
                                             Int32(src.count), Int32(src.count - 1))
                if n <= 0 {
                    (dst.baseAddress! + 32).copyMemory(from: src.baseAddress!, byteCount: src.count)
                    return src.count
                }
                return Int(n)
            }
        }
        out.withUnsafeMutableBytes { dst in
            let p = dst.baseAddress!
            p.storeBytes(of: UInt32(stored).littleEndian, toByteOffset: 8, as: UInt32.self)
            p.storeBytes(of: UInt32(block.count).littleEndian, toByteOffset: 12, as: UInt32.self)
            p.storeBytes(of: UInt32(blockRecords).littleEndian, toByteOffset: 24, as: UInt32.self)
            p.storeBytes(of: ferry_crc32c(0, p + 32, stored).littleEndian, toByteOffset: 28, as: UInt32.self)
            p.storeBytes(of: ferry_crc32c(0, p + 4, 28).littleEndian, toByteOffset: 0, as: UInt32.self)
            var done = 0
            while done < 32 + stored {
                let w = write(fd, p + done, 32 + stored - done)
                precondition(w > 0, "raw ceiling write failed: errno \(errno)")
                done += w
            }
        }
        block.removeAll(keepingCapacity: true)
        blockRecords = 0
    }

    /// Writes what is buffered and calls `fdatasync`.
    mutating func commit() {
        writeBlock()
        precondition(fdatasync(fd) == 0, "raw ceiling fdatasync failed")
    }

    mutating func close() {
        writeBlock()
        Glibc.close(fd)
        fd = -1
    }

    /// Reads the file back: checks both checksums, decompresses each block and walks its
    /// records. Returns the number of records.
    static func replay(path: String) -> Int {
        let fd = open(path, O_RDONLY)
        defer { Glibc.close(fd) }
        var st = stat()
        fstat(fd, &st)
        var file = [UInt8](repeating: 0, count: Int(st.st_size))
        let n = file.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
        precondition(n == file.count)
        var raw = [UInt8](repeating: 0, count: blockSize * 2)
        var records = 0
        var checksum: UInt64 = 0
        file.withUnsafeBytes { f in
            var o = 0
            while o + 32 <= f.count {
                let p = f.baseAddress! + o
                precondition(ferry_crc32c(0, p + 4, 28) == p.loadUnaligned(as: UInt32.self))
                let stored = Int(p.loadUnaligned(fromByteOffset: 8, as: UInt32.self))
                let rawLength = Int(p.loadUnaligned(fromByteOffset: 12, as: UInt32.self))
                let count = Int(p.loadUnaligned(fromByteOffset: 24, as: UInt32.self))
                precondition(ferry_crc32c(0, p + 32, stored) == p.loadUnaligned(fromByteOffset: 28, as: UInt32.self))
                if raw.count < rawLength { raw = [UInt8](repeating: 0, count: rawLength) }
                raw.withUnsafeMutableBytes { r in
                    let body: UnsafeRawPointer
                    if stored == rawLength {
                        body = p + 32
                    } else {
                        let d = LZ4_decompress_safe((p + 32).assumingMemoryBound(to: CChar.self),
                                                    r.baseAddress!.assumingMemoryBound(to: CChar.self), Int32(stored), Int32(rawLength))
                        precondition(Int(d) == rawLength)
                        body = UnsafeRawPointer(r.baseAddress!)
                    }
                    var i = 0
                    for _ in 0..<count {
                        var len = 0, shift = 0
                        i += 1
                        while true {
                            let b = body.load(fromByteOffset: i, as: UInt8.self)
                            i += 1
                            len |= Int(b & 0x7f) << shift
                            if b < 0x80 { break }
                            shift += 7
                        }
                        checksum &+= UInt64(body.load(fromByteOffset: i, as: UInt8.self))
                        i += len
                    }
                }
                records += count
                o += 32 + stored
            }
        }
        precondition(checksum != 0 || records == 0)
        return records
    }
}
