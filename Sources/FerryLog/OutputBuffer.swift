/// A growable byte buffer with one owner, written through raw pointers: the writer assembles
/// frames in it (header, then the LZ4 output straight into place) without zero-filling or copying.
struct OutputBuffer: ~Copyable {
    private var storage: UnsafeMutableRawBufferPointer
    private(set) var count = 0

    init(capacity: Int) {
        storage = .allocate(byteCount: max(capacity, 64), alignment: 16)
    }

    deinit { storage.deallocate() }

    var bytes: UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: storage[0..<count]) }

    /// Room for `n` more bytes at the end; returns where they go. Call ``commit(_:)`` after writing.
    mutating func reserve(_ n: Int) -> UnsafeMutableRawPointer {
        if count + n > storage.count {
            let bigger = UnsafeMutableRawBufferPointer.allocate(byteCount: max(count + n, storage.count * 2), alignment: 16)
            if count > 0 { bigger.baseAddress!.copyMemory(from: storage.baseAddress!, byteCount: count) }
            storage.deallocate()
            storage = bigger
        }
        return storage.baseAddress! + count
    }

    mutating func commit(_ n: Int) {
        precondition(count + n <= storage.count)
        count += n
    }

    mutating func append(_ bytes: UnsafeRawBufferPointer) {
        guard !bytes.isEmpty else { return }
        reserve(bytes.count).copyMemory(from: bytes.baseAddress!, byteCount: bytes.count)
        commit(bytes.count)
    }

    mutating func removeAll() { count = 0 }

    /// Shrinks a buffer that grew for one huge batch back to `capacity`.
    mutating func shrink(to capacity: Int) {
        guard storage.count > capacity * 4, count <= capacity else { return }
        let smaller = UnsafeMutableRawBufferPointer.allocate(byteCount: capacity, alignment: 16)
        if count > 0 { smaller.baseAddress!.copyMemory(from: storage.baseAddress!, byteCount: count) }
        storage.deallocate()
        storage = smaller
    }
}

enum FrameEncoder {
    /// Appends one data frame holding `records` (already in record layout) to `out`: compressed
    /// as one LZ4 block, or stored raw when LZ4 does not make it smaller.
    static func appendDataFrame(records: UnsafeRawBufferPointer, firstLSN: LSN, count: Int, to out: inout OutputBuffer) {
        let h = LogFormat.frameHeaderSize
        let p = out.reserve(h + LZ4.bound(records.count))
        let body = UnsafeMutableRawBufferPointer(start: p + h, count: LZ4.bound(records.count))
        var header = FrameHeader(kind: .data, codec: .raw, storedLength: UInt32(records.count), rawLength: UInt32(records.count),
                                 firstLSN: firstLSN, recordCount: UInt32(count), bodyCRC: 0)
        if let n = LZ4.compress(records, into: body) {
            header.codec = .lz4
            header.storedLength = UInt32(n)
        } else {
            body.baseAddress!.copyMemory(from: records.baseAddress!, byteCount: records.count)
        }
        header.bodyCRC = CRC32C.checksum(UnsafeRawPointer(p + h), count: Int(header.storedLength))
        header.encode(into: p)
        out.commit(h + Int(header.storedLength))
    }

    static func appendHeaderOnlyFrame(_ header: FrameHeader, to out: inout OutputBuffer) {
        header.encode(into: out.reserve(LogFormat.frameHeaderSize))
        out.commit(LogFormat.frameHeaderSize)
    }
}
