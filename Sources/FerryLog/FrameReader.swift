/// One record as the log returns it while iterating.
///
/// `payload` points into the reader's buffer and is valid only inside the closure that received
/// the view; copy it (``LogRecord``) to keep it.
public struct RecordView {
    /// The record's position in the log.
    public let lsn: LSN
    /// The record's type byte, as given to ``LogBatch/append(kind:payload:)-(_,UnsafeRawBufferPointer)``.
    public let kind: UInt8
    /// The record's bytes, valid during the call only.
    public let payload: UnsafeRawBufferPointer
    /// What a read snapshot's inspector said of the record, when the snapshot read its frame
    /// ahead (see ``LogReadSnapshot/Inspector``); 0 when no inspector looked at it.
    public let note: UInt64

    init(lsn: LSN, kind: UInt8, payload: UnsafeRawBufferPointer, note: UInt64 = 0) {
        self.lsn = lsn
        self.kind = kind
        self.payload = payload
        self.note = note
    }

    /// An owned copy.
    public var record: LogRecord { LogRecord(lsn: lsn, kind: kind, payload: Array(payload)) }
}

/// One record, owned.
public struct LogRecord: Hashable, Sendable {
    /// The record's position in the log.
    public var lsn: LSN
    /// The record's type byte.
    public var kind: UInt8
    /// The record's bytes.
    public var payload: [UInt8]
    /// A record.
    public init(lsn: LSN, kind: UInt8, payload: [UInt8]) {
        self.lsn = lsn
        self.kind = kind
        self.payload = payload
    }
}

/// What reading a frame at an offset found.
enum FrameRead {
    /// A frame whose header and body checksums passed. `body` is valid until the next read.
    case frame(FrameHeader, body: UnsafeRawBufferPointer)
    /// The offset is exactly the end of the readable bytes.
    case end
    /// Fewer bytes remain than the header (or the body it announces) needs.
    case incomplete(String)
    /// The header or body fails its checksum or a structural check.
    case invalid(String)
    /// A checksummed header holds a type or codec this build does not know.
    case unsupported(String)
}

/// Reads frames out of one segment file through a bounded read-ahead window, and decodes their
/// bodies into records. Owns its buffers; nothing it allocates is sized by an unchecked length.
struct FrameReader: ~Copyable {
    let file: FileHandle
    let system: SystemCalls
    /// Bytes of the file that may be read (the file size, or the writer's published end).
    var limit: Int64

    private var window: UnsafeMutableRawBufferPointer
    private var windowStart: Int64 = 0
    private var windowCount = 0
    private var decoded: UnsafeMutableRawBufferPointer

    static let chunk = 1 << 20

    init(file: consuming FileHandle, system: SystemCalls, limit: Int64) {
        self.file = file
        self.system = system
        self.limit = limit
        window = .allocate(byteCount: Self.chunk, alignment: 16)
        decoded = .allocate(byteCount: 64 << 10, alignment: 16)
    }

    deinit {
        window.deallocate()
        decoded.deallocate()
    }

    /// `length` bytes at `offset`, or nil if fewer than that lie below `limit`.
    /// The pointer is valid until the next call.
    mutating func bytes(at offset: Int64, length: Int) throws -> UnsafeRawBufferPointer? {
        guard length >= 0, offset >= 0, offset + Int64(length) <= limit else { return nil }
        if offset >= windowStart, offset + Int64(length) <= windowStart + Int64(windowCount) {
            return UnsafeRawBufferPointer(rebasing: window[Int(offset - windowStart)..<Int(offset - windowStart) + length])
        }
        if length > window.count {
            window.deallocate()
            window = .allocate(byteCount: length, alignment: 16)
        }
        let want = Int(min(Int64(window.count), limit - offset))
        windowStart = offset
        windowCount = 0
        switch system.preadFully(file.fd, UnsafeMutableRawBufferPointer(rebasing: window[0..<want]), at: offset) {
        case .success(let n): windowCount = n
        case .failure(let e): throw LogError.io("read", path: file.path, e)
        }
        guard windowCount >= length else { return nil }
        return UnsafeRawBufferPointer(rebasing: window[0..<length])
    }

    /// Whether every byte from `offset` to `limit` is zero (space a writer grew the file by
    /// ahead of its frames; see ``SegmentWriter``). True when nothing remains.
    mutating func isZero(from offset: Int64) throws -> Bool {
        var at = offset
        while at < limit {
            let n = Int(min(Int64(Self.chunk), limit - at))
            guard let chunk = try bytes(at: at, length: n) else { return false }
            // Eight bytes at a time, then the rest.
            var i = 0
            while i + 8 <= n {
                if chunk.loadUnaligned(fromByteOffset: i, as: UInt64.self) != 0 { return false }
                i += 8
            }
            while i < n {
                if chunk[i] != 0 { return false }
                i += 1
            }
            at += Int64(n)
        }
        return true
    }

    /// Reads and checks the frame at `offset`.
    mutating func readFrame(at offset: Int64) throws -> FrameRead {
        switch try readHeader(at: offset) {
        case .frame(let h, _): return try readBody(of: h, at: offset)
        case let other: return other
        }
    }

    /// Reads and checks the body of the frame at `offset`, whose header ``readHeader(at:)``
    /// gave (a frame looked for by its header is not read twice).
    mutating func readBody(of header: FrameHeader, at offset: Int64) throws -> FrameRead {
        let bodyOffset = offset + Int64(LogFormat.frameHeaderSize)
        guard let body = try bytes(at: bodyOffset, length: Int(header.storedLength)) else {
            return .incomplete("the file ended while reading the frame body")
        }
        guard CRC32C.checksum(body) == header.bodyCRC else { return .invalid("frame body checksum mismatch") }
        return .frame(header, body: body)
    }

    /// Reads and checks the header of the frame at `offset` (its own checksum, and that the
    /// body it announces lies within `limit`), not the body: for stepping over frames on the
    /// way to another. On success, the body is given empty.
    mutating func readHeader(at offset: Int64) throws -> FrameRead {
        if offset == limit { return .end }
        guard let head = try bytes(at: offset, length: LogFormat.frameHeaderSize) else {
            return .incomplete("\(limit - offset) bytes remain, fewer than a frame header")
        }
        let header: FrameHeader
        switch FrameHeader.decode(head.baseAddress!) {
        case .valid(let h): header = h
        case .invalid(let why): return .invalid(why)
        case .unsupported(let why): return .unsupported(why)
        }
        let bodyOffset = offset + Int64(LogFormat.frameHeaderSize)
        guard bodyOffset + Int64(header.storedLength) <= limit else {
            return .incomplete("the frame announces \(header.storedLength) body bytes; \(limit - bodyOffset) remain")
        }
        return .frame(header, body: UnsafeRawBufferPointer(start: nil, count: 0))
    }

    /// Looks for the next offset after `offset` where a whole valid frame starts (used to tell a
    /// torn tail from corruption, and to resynchronize in salvage mode). Returns its offset and
    /// header, or nil when none exists before `limit`.
    mutating func findNextValidFrame(after offset: Int64) throws -> (Int64, FrameHeader)? {
        var candidate = offset + 1
        while candidate + Int64(LogFormat.frameHeaderSize) <= limit {
            // Scan a window's worth of candidate header positions.
            let span = Int(min(Int64(Self.chunk), limit - candidate))
            guard let chunk = try bytes(at: candidate, length: span) else { return nil }
            let base = candidate
            var found: (Int64, FrameHeader)?
            var i = 0
            while i + LogFormat.frameHeaderSize <= chunk.count {
                if case .valid(let h) = FrameHeader.decode(chunk.baseAddress! + i) {
                    found = (base + Int64(i), h)
                    break
                }
                i += 1
            }
            if let (at, _) = found {
                if case .frame(let h, _) = try readFrame(at: at) { return (at, h) }
                candidate = at + 1
                continue
            }
            if span < Self.chunk { return nil }
            candidate = base + Int64(max(1, chunk.count - LogFormat.frameHeaderSize + 1))
        }
        return nil
    }

    /// The uncompressed body of a data frame (the frame's bytes themselves when stored raw).
    /// Valid until the next call. Nil if the block does not decode to the announced size.
    mutating func rawBody(of header: FrameHeader, body: UnsafeRawBufferPointer) -> UnsafeRawBufferPointer? {
        switch header.codec {
        case .raw: return body
        case .lz4:
            let n = Int(header.rawLength)
            if n > decoded.count {
                decoded.deallocate()
                decoded = .allocate(byteCount: max(n, decoded.count * 2), alignment: 16)
            }
            let out = UnsafeMutableRawBufferPointer(rebasing: decoded[0..<n])
            return LZ4.decompress(body, into: out) ? UnsafeRawBufferPointer(out) : nil
        }
    }
}

enum RecordDecoding {
    /// Calls `body` for each record of a decoded frame body. Returns false (after calling `body`
    /// for the well-formed prefix) if the body does not hold exactly `header.recordCount` records.
    @inline(__always)
    static func forEach(
        in raw: UnsafeRawBufferPointer, header: FrameHeader, from: LSN = .first,
        _ body: (RecordView) throws -> Void
    ) rethrows -> Bool {
        guard let base = raw.baseAddress else { return header.recordCount == 0 }
        var offset = 0
        var lsn = header.firstLSN
        let end = raw.count
        for _ in 0..<header.recordCount {
            guard offset < end else { return false }
            let kind = base.load(fromByteOffset: offset, as: UInt8.self)
            guard let (length, n) = Varint.read(base + offset + 1, limit: end - offset - 1) else { return false }
            let start = offset + 1 + n
            guard Int(length) <= end - start else { return false }
            if lsn >= from {
                try body(RecordView(lsn: lsn, kind: kind, payload: UnsafeRawBufferPointer(start: base + start, count: Int(length))))
            }
            offset = start + Int(length)
            lsn = lsn + 1
        }
        return offset == end
    }
}
