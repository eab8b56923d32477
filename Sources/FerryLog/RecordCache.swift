#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A segment kept open for random reads.
final class SegmentCursor {
    let name: String
    var reader: FrameReader

    init(name: String, reader: consuming FrameReader) {
        self.name = name
        self.reader = reader
    }
}

/// A decompressed data frame and where each of its records starts.
final class CachedFrame: Sendable {
    let firstLSN: LSN
    /// The frame's byte offset in its segment file.
    let offset: Int64
    /// Where the next frame of the segment starts.
    let end: Int64
    let bytes: [UInt8]
    /// Offsets of kind byte, payload start and payload length, three per record.
    let layout: [UInt32]
    /// A read snapshot's inspector's note for each record (empty: none looked).
    let notes: [UInt64]

    init(firstLSN: LSN, offset: Int64, end: Int64, bytes: [UInt8], layout: [UInt32], notes: [UInt64] = []) {
        self.firstLSN = firstLSN
        self.offset = offset
        self.end = end
        self.bytes = bytes
        self.layout = layout
        self.notes = notes
    }

    /// The same frame with `inspect`'s note on each record.
    func inspected(by inspect: LogReadSnapshot.Inspector) -> CachedFrame {
        var notes: [UInt64] = []
        notes.reserveCapacity(count)
        bytes.withUnsafeBytes { raw in
            for i in 0..<count {
                let start = Int(layout[3 * i + 1]), length = Int(layout[3 * i + 2])
                notes.append(inspect(raw[Int(layout[3 * i])], UnsafeRawBufferPointer(rebasing: raw[start..<start + length])))
            }
        }
        return CachedFrame(firstLSN: firstLSN, offset: offset, end: end, bytes: bytes, layout: layout, notes: notes)
    }

    var count: Int { layout.count / 3 }
    /// The first record after this frame.
    var nextLSN: LSN { firstLSN + UInt64(count) }

    /// Whether record `lsn` is in this frame.
    func contains(_ lsn: LSN) -> Bool { firstLSN <= lsn && lsn.rawValue < firstLSN.rawValue + UInt64(count) }

    /// Calls `body` with record `lsn`, which is in this frame.
    func withRecord<R>(_ lsn: LSN, _ body: (RecordView) throws -> R) rethrows -> R {
        let i = Int(lsn.rawValue - firstLSN.rawValue)
        return try bytes.withUnsafeBytes { raw in
            let kind = raw[Int(layout[3 * i])]
            let start = Int(layout[3 * i + 1]), length = Int(layout[3 * i + 2])
            return try body(RecordView(lsn: lsn, kind: kind, payload: UnsafeRawBufferPointer(rebasing: raw[start..<start + length]),
                                       note: notes.isEmpty ? 0 : notes[i]))
        }
    }
}

/// Open segments and recently decompressed frames, for reading single records by LSN.
/// Bounded: a few open segments and a few frames (least recently used are dropped).
final class RecordCache {
    private var cursors: [SegmentCursor] = []
    private var frames: [(segment: UInt64, frame: CachedFrame)] = []
    static let maxCursors = 8
    static let maxFrames = 32

    func cursor(for segment: SegmentInfo, directory: StoreDirectory) throws -> SegmentCursor {
        if let i = cursors.firstIndex(where: { $0.name == segment.name }) {
            let c = cursors.remove(at: i)
            c.reader.limit = segment.size
            cursors.append(c)
            return c
        }
        let file = try directory.open(segment.name, flags: O_RDONLY)
        let c = SegmentCursor(name: segment.name, reader: FrameReader(file: file, system: directory.system, limit: segment.size))
        cursors.append(c)
        if cursors.count > Self.maxCursors { cursors.removeFirst() }
        return c
    }

    /// The cached frame holding record `lsn`, if any (checked before any file is read).
    func frame(containing lsn: LSN) -> CachedFrame? {
        guard let i = frames.lastIndex(where: { $0.frame.contains(lsn) }) else { return nil }
        return touch(i)
    }

    private func touch(_ i: Int) -> CachedFrame {
        if i != frames.count - 1 {
            let entry = frames.remove(at: i)
            frames.append(entry)
        }
        return frames[frames.count - 1].frame
    }

    /// The frame read or used last.
    var newest: CachedFrame? { frames.last?.frame }

    func store(_ frame: CachedFrame, segment: UInt64) {
        frames.append((segment, frame))
        if frames.count > Self.maxFrames { frames.removeFirst() }
    }

    /// Forgets a deleted segment (and its frames).
    func drop(_ name: String, seq: UInt64) {
        cursors.removeAll { $0.name == name }
        frames.removeAll { $0.segment == seq }
    }
}

extension WriteAheadLog {
    /// Calls `body` with the record at `lsn`, which must have been written (below ``writtenLSN``)
    /// and not deleted. Recently read frames are cached decompressed, so reading neighbours is cheap.
    ///
    /// - Throws: ``LogError`` — ``LogError/Code/recordsUnavailable`` for an LSN outside the
    ///   written, kept range; ``LogError/Code/corruption`` naming file and offset.
    public func withRecord<R>(at lsn: LSN, _ body: (RecordView) throws -> R) throws -> R {
        let (segments, first, written) = shared.withLock { s in (s.segments, s.firstLSN, s.writtenLSN) }
        guard lsn >= first, lsn < written else {
            throw LogError(.recordsUnavailable, "record \(lsn) is not in the written log (\(first)..<\(written))", file: path)
        }
        var lo = 0, hi = segments.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if segments[mid].nextLSN <= lsn { lo = mid + 1 } else { hi = mid }
        }
        guard lo < segments.count, segments[lo].firstLSN <= lsn else {
            throw LogError(.recordsUnavailable, "no segment holds record \(lsn)", file: path)
        }
        let segment = segments[lo]
        let frame = try recordCache.withLock { cache in try locateFrame(lsn, in: segment, cache: cache) }
        return try frame.withRecord(lsn, body)
    }

    /// Where record `lsn` is stored: its segment file and the byte offset of its frame — for
    /// errors about a record that names its place. Nil when the record is not in the written,
    /// kept log or its frame cannot be read.
    public func location(of lsn: LSN) -> RecordLocation? {
        let segments = shared.withLock { $0.segments }
        guard let segment = segments.last(where: { $0.firstLSN <= lsn && lsn < $0.nextLSN }) else { return nil }
        guard let frame = try? recordCache.withLock({ cache in try locateFrame(lsn, in: segment, cache: cache) }) else {
            return RecordLocation(lsn: lsn, file: directory.path(segment.name), frameOffset: nil)
        }
        return RecordLocation(lsn: lsn, file: directory.path(segment.name), frameOffset: frame.offset)
    }

    private func locateFrame(_ lsn: LSN, in segment: SegmentInfo, cache: RecordCache) throws -> CachedFrame {
        if let cached = cache.frame(containing: lsn) { return cached }
        let cursor = try cache.cursor(for: segment, directory: directory)
        let frame = try Self.readFrame(containing: lsn, in: segment, cursor: cursor, directory: directory, after: cache.newest)
        cache.store(frame, segment: segment.seq)
        return frame
    }

    /// Reads and decompresses the data frame of `segment` that holds record `lsn`, through `cursor`.
    ///
    /// It starts at the segment's index entry at or before `lsn` (one per ~64 KiB of file), or
    /// right after `previous` (a frame read before) when that is nearer: a walk in LSN order
    /// then reads each frame once. Frames on the way are stepped over by their headers (each
    /// checked by its own checksum); only the frame read has its body checked. (Before,
    /// stepping read and checked every body on the way: a walk of a million posts in frames of
    /// ~3.5 KB read ~17 frames per frame it needed, and checksummed 1.5 GB.)
    static func readFrame(containing lsn: LSN, in segment: SegmentInfo, cursor: SegmentCursor, directory: StoreDirectory,
                          after previous: CachedFrame? = nil) throws -> CachedFrame {
        var (offset, expected) = segment.seek(to: lsn)
        if let p = previous, p.end > offset, p.nextLSN <= lsn,
           segment.firstLSN <= p.firstLSN, p.firstLSN < segment.nextLSN {  // (the same segment)
            (offset, expected) = (p.end, p.nextLSN)
        }
        while offset < segment.size {
            let frameOffset = offset
            func corrupt(_ why: String) -> LogError { LogError(.corruption, why, file: directory.path(segment.name), offset: frameOffset) }
            /// The frame read, nil at the end, or the error it is.
            func frame(_ read: FrameRead) throws -> (FrameHeader, UnsafeRawBufferPointer)? {
                switch read {
                case .frame(let h, let body): return (h, body)
                case .end: return nil
                case .incomplete(let why), .invalid(let why): throw corrupt(why)
                case .unsupported(let why): throw LogError(.unsupportedFormat, why, file: directory.path(segment.name), offset: frameOffset)
                }
            }
            guard let (h, _) = try frame(cursor.reader.readHeader(at: offset)) else { break }
            guard h.firstLSN == expected else { throw corrupt("LSN discontinuity: expected \(expected), found \(h.firstLSN)") }
            if h.kind == .data && lsn < h.nextLSN {
                guard let (h, stored) = try frame(cursor.reader.readBody(of: h, at: offset)) else { break }
                guard let raw = cursor.reader.rawBody(of: h, body: stored) else { throw corrupt("the frame body does not decompress") }
                var layout: [UInt32] = []
                layout.reserveCapacity(Int(h.recordCount) * 3)
                let base = raw.baseAddress
                let ok = RecordDecoding.forEach(in: raw, header: h) { r in
                    layout.append(UInt32(UnsafeRawPointer(r.payload.baseAddress ?? base!) - base! - 1 - Varint.length(UInt32(r.payload.count))))
                    layout.append(UInt32((r.payload.baseAddress ?? base!) - base!))
                    layout.append(UInt32(r.payload.count))
                }
                guard ok else { throw corrupt("the frame's records do not match its header") }
                return CachedFrame(firstLSN: h.firstLSN, offset: frameOffset, end: frameOffset + Int64(h.frameSize),
                                   bytes: Array(raw), layout: layout)
            }
            offset += Int64(h.frameSize)
            expected = h.nextLSN
        }
        throw LogError(.recordsUnavailable, "record \(lsn) was not found in \(segment.name)", file: directory.path(segment.name))
    }
}

/// Where a record is stored: for errors that name the place of a record.
public struct RecordLocation: Sendable, Hashable {
    /// The record.
    public let lsn: LSN
    /// The segment file holding it.
    public let file: String
    /// The byte offset of the frame holding it in ``file``, if the frame could be read.
    public let frameOffset: Int64?
}
