#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The segment being appended to. Only the log's writer touches it.
struct SegmentWriter: ~Copyable {
    let file: FileHandle
    let seq: UInt64
    let firstLSN: LSN
    let name: String
    /// Bytes written to the file so far.
    private(set) var size: Int64
    /// LSN → offset entries for readers (one per ~64 KiB).
    private(set) var index: [IndexEntry]
    private var nextIndexAt: Int64

    private init(file: consuming FileHandle, seq: UInt64, firstLSN: LSN, name: String, size: Int64, index: [IndexEntry]) {
        self.file = file
        self.seq = seq
        self.firstLSN = firstLSN
        self.name = name
        self.size = size
        self.index = index
        nextIndexAt = index.last.map { $0.offset + SegmentScanner.indexStride } ?? 0
    }

    /// Creates a new segment file atomically (it appears with its whole header, or not at all).
    static func create(in dir: StoreDirectory, storeID: StoreID, seq: UInt64, firstLSN: LSN, createdNanos: UInt64) throws -> SegmentWriter {
        let name = LogFormat.segmentName(seq: seq, firstLSN: firstLSN)
        let header = SegmentHeader(storeID: storeID, seq: seq, firstLSN: firstLSN, createdNanos: createdNanos)
        let file = try dir.createAtomicallyKeepingOpen(name, contents: header.bytes)
        return SegmentWriter(file: file, seq: seq, firstLSN: firstLSN, name: name, size: Int64(LogFormat.segmentHeaderSize), index: [])
    }

    /// Continues an existing, unsealed segment after its last valid frame.
    static func reopen(in dir: StoreDirectory, scan: SegmentScan) throws -> SegmentWriter {
        let file = try dir.open(scan.name, flags: O_WRONLY | O_APPEND)
        return SegmentWriter(file: file, seq: scan.seq, firstLSN: scan.firstLSN, name: scan.name, size: scan.validEnd, index: scan.index)
    }

    /// Writes bytes that hold whole frames; `frameStarts` are (first LSN, offset within `bytes`)
    /// of the data frames among them, for the index.
    mutating func write(_ bytes: UnsafeRawBufferPointer, system: SystemCalls) throws {
        if case .failure(let e) = system.writeAll(file.fd, bytes) { throw LogError.io("write", path: file.path, e) }
        size += Int64(bytes.count)
    }

    mutating func noteFrame(firstLSN: LSN, at offset: Int64) {
        if offset >= nextIndexAt {
            index.append(IndexEntry(lsn: firstLSN, offset: offset))
            nextIndexAt = offset + SegmentScanner.indexStride
        }
    }

    /// What readers may see of this segment: everything written, records below `nextLSN`.
    func info(nextLSN: LSN, sealed: Bool = false) -> SegmentInfo {
        SegmentInfo(name: name, seq: seq, firstLSN: firstLSN, nextLSN: nextLSN, size: size, sealed: sealed, index: index)
    }

    func sync(_ system: SystemCalls) throws {
        if case .failure(let e) = system.fdatasync(file.fd) { throw LogError.io("fdatasync", path: file.path, e) }
    }
}
