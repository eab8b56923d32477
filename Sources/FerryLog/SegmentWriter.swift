#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The segment being appended to. Only the log's writer touches it.
///
/// The file is grown ahead of the writes, a step of zeros at a time (`fallocate`, then the
/// zeros written), and frames are written into that space at their offsets: an `fdatasync`
/// after a write that does not change the file's size, into blocks already written, has no
/// size and no block conversion to write. On ext4 here a durable 230-byte write costs ~83 µs
/// that way against ~120 µs appended, and 5 KB ~90 µs against ~140 µs appended (and ~180 µs
/// into space `fallocate` only reserved: each sync then turned new blocks written). The cost:
/// where syncs come between the step and the frames (`.fsync`, `sync()`), the step's zeros
/// reach the device at the next sync (one write of up to 1 MiB per MiB of log, besides the
/// frames'). The zeros past the last frame are cut off when the segment is sealed or the log
/// closed; after a crash, a scan takes a rest of the file that is all zeros for that space
/// (FORMAT.md, *Writing* and *Recovery*).
struct SegmentWriter: ~Copyable {
    let file: FileHandle
    let seq: UInt64
    let firstLSN: LSN
    let name: String
    /// Bytes of frames written to the file so far (where the next frame goes).
    private(set) var size: Int64
    /// The file's size, zeros past `size` included.
    private(set) var allocated: Int64
    /// False once the file system refused to preallocate.
    private var preallocates = true
    /// How far ahead the file may be grown (the segment's target size).
    private let sizeLimit: Int64
    /// LSN → offset entries for readers (one per ~64 KiB).
    private(set) var index: [IndexEntry]
    private var nextIndexAt: Int64

    /// What `fallocate` answers when it cannot grow a file here (not a failing disk):
    /// unsupported, or no space or quota.
    static let refusals: Set<Int32> = [EOPNOTSUPP, ENOSYS, EINVAL, ENOSPC, EDQUOT]

    /// Bytes the file grows by at a time.
    static let preallocationStep: Int64 = 1 << 20

    /// A step of zeros to write ahead (`calloc`'s: pages that stay the shared zero page).
    nonisolated(unsafe) private static let zeros = UnsafeRawBufferPointer(
        start: calloc(1, Int(preallocationStep)), count: Int(preallocationStep))

    private init(file: consuming FileHandle, seq: UInt64, firstLSN: LSN, name: String, size: Int64, allocated: Int64,
                 sizeLimit: Int, index: [IndexEntry]) {
        self.file = file
        self.seq = seq
        self.firstLSN = firstLSN
        self.name = name
        self.size = size
        self.allocated = allocated
        self.sizeLimit = Int64(sizeLimit)
        self.index = index
        nextIndexAt = index.last.map { $0.offset + SegmentScanner.indexStride } ?? 0
    }

    /// Creates a new segment file atomically (it appears with its whole header, or not at all).
    static func create(in dir: StoreDirectory, storeID: StoreID, seq: UInt64, firstLSN: LSN, createdNanos: UInt64,
                       sizeLimit: Int) throws -> SegmentWriter {
        let name = LogFormat.segmentName(seq: seq, firstLSN: firstLSN)
        let header = SegmentHeader(storeID: storeID, seq: seq, firstLSN: firstLSN, createdNanos: createdNanos)
        let file = try dir.createAtomicallyKeepingOpen(name, contents: header.bytes, append: false)
        let size = Int64(LogFormat.segmentHeaderSize)
        return SegmentWriter(file: file, seq: seq, firstLSN: firstLSN, name: name, size: size, allocated: size,
                             sizeLimit: sizeLimit, index: [])
    }

    /// Continues an existing, unsealed segment after its last valid frame (over any zeros
    /// after it).
    static func reopen(in dir: StoreDirectory, scan: SegmentScan, sizeLimit: Int) throws -> SegmentWriter {
        let file = try dir.open(scan.name, flags: O_WRONLY)
        // The size now (a torn tail may have been cut since the scan).
        let fileSize: Int64
        switch dir.system.fileSize(file.fd) {
        case .success(let s): fileSize = s
        case .failure(let e): throw LogError.io("fstat", path: file.path, e)
        }
        return SegmentWriter(file: file, seq: scan.seq, firstLSN: scan.firstLSN, name: scan.name, size: scan.validEnd,
                             allocated: max(fileSize, scan.validEnd), sizeLimit: sizeLimit, index: scan.index)
    }

    /// Writes bytes that hold whole frames at the end of those written, growing the file ahead
    /// of them first if they reach past its zeros.
    mutating func write(_ bytes: UnsafeRawBufferPointer, system: SystemCalls) throws {
        let end = size + Int64(bytes.count)
        if preallocates && end > allocated {
            let step = Self.preallocationStep
            let target = max(end, min((end / step + 1) * step, sizeLimit))
            switch system.preallocate(file.fd, target) {
            case .success:
                // The zeros written too: `fallocate` alone leaves the space "unwritten", and the
                // first sync after a write into each new block then has metadata to write
                // (the block turned written). Written zeros need that once, at the next sync,
                // which writes them to the device; without a sync before the frames come, the
                // frames overwrite them in the page cache first. A failure of this write stops
                // the log, as any failed write does (the space is reserved: where `fallocate`
                // really reserves it, a full disk refuses `fallocate` first).
                if target > end {
                    let zeros = UnsafeRawBufferPointer(rebasing: Self.zeros[0..<Int(target - end)])
                    if case .failure(let e) = system.pwriteAll(file.fd, zeros, at: end) {
                        throw LogError.io("pwrite", path: file.path, e)
                    }
                }
                allocated = target
            case .failure(let e):
                // It may have grown the file part of the way: know its size (to cut it back).
                if case .success(let s) = system.fileSize(file.fd) { allocated = max(allocated, s) }
                // Unsupported here, or the disk is full (the frames themselves may still fit):
                // plain appends from now on. Anything else is a failing disk: the log stops.
                guard Self.refusals.contains(e.rawValue) else { throw LogError.io("fallocate", path: file.path, e) }
                preallocates = false
            }
        }
        if case .failure(let e) = system.pwriteAll(file.fd, bytes, at: size) { throw LogError.io("pwrite", path: file.path, e) }
        size = end
        allocated = max(allocated, end)
    }

    /// Cuts the zeros past the last frame off the file (before a seal's sync, and at close);
    /// false if there were none.
    @discardableResult
    mutating func trimPreallocation(_ system: SystemCalls) throws -> Bool {
        guard allocated > size else { return false }
        if case .failure(let e) = system.ftruncate(file.fd, size) { throw LogError.io("ftruncate", path: file.path, e) }
        allocated = size
        return true
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
