#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A problem found in one segment, at a byte offset.
struct SegmentProblem: Sendable, Equatable {
    enum Kind: Sendable, Equatable {
        /// The bytes end inside a frame, or fail a check, and no valid frame follows: in the newest
        /// segment this is a torn write and is truncated away.
        case tail
        /// A damaged frame or header with valid data after it (or in a segment that is not the newest).
        case corruption
        /// A version, codec or frame type this build does not read.
        case unsupported
    }
    var kind: Kind
    var offset: Int64
    var message: String
}

/// A region of a segment a salvage open keeps or drops.
enum SalvagePiece: Sendable, Equatable {
    /// Frame bytes at `offset..<offset+size` that passed every check.
    case frames(offset: Int64, size: Int64)
    /// LSNs lost at `offset` (the damaged region starts there).
    case hole(firstLSN: LSN, count: UInt64, offset: Int64, reason: String)
}

/// Everything a scan learns about one segment file.
struct SegmentScan: Sendable {
    var name: String
    var seq: UInt64
    /// The first LSN the file name gives (the header must agree).
    var nameFirstLSN: LSN
    var header: SegmentHeader?
    var fileSize: Int64
    /// The offset just past the last good frame: where a writer would continue.
    var validEnd: Int64
    /// Bytes of zeros after the last frame (space grown ahead of the writes, see
    /// ``SegmentWriter``); `validEnd` is where they start.
    var zeroTail: Int64 = 0
    /// The LSN after the last good record.
    var nextLSN: LSN
    var sealed = false
    var dataFrames = 0
    var records: UInt64 = 0
    var storedBodyBytes: Int64 = 0
    var rawBodyBytes: Int64 = 0
    /// LSN → frame offset, one entry per ~64 KiB of file, for seeking.
    var index: [IndexEntry] = []
    /// The first problem, if any.
    var problem: SegmentProblem?
    /// With `resync`: the pieces a salvage keeps and drops, in order.
    var pieces: [SalvagePiece] = []

    var firstLSN: LSN { header?.firstLSN ?? nameFirstLSN }
}

struct IndexEntry: Sendable, Equatable {
    var lsn: LSN
    var offset: Int64
}

enum SegmentScanner {
    static let indexStride: Int64 = 64 << 10

    struct Options {
        /// The segment is the newest: a bad tail with nothing valid after it is a torn tail.
        var isNewest: Bool
        /// Decompress every frame and check its records, not just the checksums.
        var deep: Bool
        /// Keep going past problems, collecting ``SalvagePiece``s (salvage mode).
        var resync: Bool
    }

    /// Scans one segment file. Never modifies it.
    static func scan(directory: StoreDirectory, name: String, seq: UInt64, firstLSN: LSN, options: Options) throws -> SegmentScan {
        let file = try directory.open(name, flags: O_RDONLY)
        let size: Int64
        switch directory.system.fileSize(file.fd) {
        case .success(let s): size = s
        case .failure(let e): throw LogError.io("fstat", path: file.path, e)
        }
        var reader = FrameReader(file: file, system: directory.system, limit: size)
        var scan = SegmentScan(name: name, seq: seq, nameFirstLSN: firstLSN, header: nil, fileSize: size,
                               validEnd: 0, nextLSN: firstLSN)

        // Header.
        let headBytes = try reader.bytes(at: 0, length: min(Int(size), LogFormat.segmentHeaderSize))
        switch SegmentHeader.decode(headBytes ?? UnsafeRawBufferPointer(start: nil, count: 0)) {
        case .valid(let h):
            if h.seq != seq || h.firstLSN != firstLSN {
                scan.problem = SegmentProblem(kind: .corruption, offset: 0,
                    message: "the header says segment \(h.seq) starting at LSN \(h.firstLSN), the file name says \(seq) at \(firstLSN)")
                if !options.resync { return scan }
            }
            scan.header = h
        case .unsupported(let why):
            scan.problem = SegmentProblem(kind: .unsupported, offset: 0, message: why)
            return scan
        case .corrupt(let why, let at):
            scan.problem = SegmentProblem(kind: .corruption, offset: Int64(at), message: why)
            if !options.resync { return scan }
        }

        var offset = Int64(LogFormat.segmentHeaderSize)
        scan.validEnd = min(offset, size)
        var piecesStart = offset
        var nextIndexAt: Int64 = 0

        func closePiece(at end: Int64) {
            if end > piecesStart { scan.pieces.append(.frames(offset: piecesStart, size: end - piecesStart)) }
        }

        frames: while true {
            var problem: SegmentProblem
            switch try reader.readFrame(at: offset) {
            case .end:
                break frames
            case .frame(let h, let body):
                if scan.sealed {
                    problem = SegmentProblem(kind: .corruption, offset: offset, message: "a frame follows the segment's seal")
                } else if h.firstLSN != scan.nextLSN {
                    problem = SegmentProblem(kind: .corruption, offset: offset,
                        message: "LSN discontinuity: expected a frame starting at \(scan.nextLSN), found \(h.firstLSN)")
                } else if h.kind == .data, options.deep, !deepCheck(&reader, h, body) {
                    problem = SegmentProblem(kind: .corruption, offset: offset,
                        message: "the frame's records do not decode to the \(h.recordCount) records its header announces")
                } else {
                    if offset >= nextIndexAt && h.kind == .data {
                        scan.index.append(IndexEntry(lsn: h.firstLSN, offset: offset))
                        nextIndexAt = offset + indexStride
                    }
                    switch h.kind {
                    case .data:
                        scan.dataFrames += 1
                        scan.records += UInt64(h.recordCount)
                        scan.storedBodyBytes += Int64(h.storedLength)
                        scan.rawBodyBytes += Int64(h.rawLength)
                    case .seal: scan.sealed = true
                    case .hole: break
                    }
                    scan.nextLSN = h.nextLSN
                    offset += Int64(h.frameSize)
                    scan.validEnd = offset
                    continue frames
                }
            case .incomplete(let why):
                problem = SegmentProblem(kind: .tail, offset: offset, message: why)
            case .invalid(let why):
                problem = SegmentProblem(kind: .tail, offset: offset, message: why)
            case .unsupported(let why):
                scan.problem = scan.problem ?? SegmentProblem(kind: .unsupported, offset: offset, message: why)
                return scan
            }

            // Zeros to the end: space the writer grew the file by ahead of its frames (a crash
            // before the seal or close cut it off), not a problem.
            if problem.kind == .tail, try reader.isZero(from: offset) {
                scan.zeroTail = size - offset
                break frames
            }
            // A bad frame at `offset`. Anything valid later makes it corruption, not a torn tail
            // — except, in the newest segment, after a frame that begins with zeros: frames land
            // in space grown ahead of them, where a crash may keep a later page of a write and
            // not an earlier one; none of it was synced (a sync covers the earlier pages too).
            let zeroHeader = try reader.bytes(at: offset, length: Int(min(Int64(LogFormat.frameHeaderSize), size - offset)))?
                .allSatisfy { $0 == 0 } ?? false
            if problem.kind == .tail, options.isNewest, zeroHeader {
                problem.message += "; a frame of zeros in space grown ahead of the frames: a write a crash tore (what follows was not synced either)"
                if scan.problem == nil { scan.problem = problem }
                break frames
            }
            let later = try reader.findNextValidFrame(after: offset)
            if problem.kind == .tail && (later != nil || !options.isNewest) {
                problem.kind = .corruption
                if later == nil { problem.message += "; the segment is not the newest, so its tail is missing" }
            }
            if scan.problem == nil { scan.problem = problem }
            guard options.resync, problem.kind == .corruption else { break frames }

            // Salvage: keep what came before, drop up to the next usable frame.
            closePiece(at: offset)
            var resume = later
            while let (at, h) = resume, h.firstLSN < scan.nextLSN || (h.kind == .seal && scan.sealed) {
                resume = try reader.findNextValidFrame(after: at)  // stale or duplicate: keep looking
            }
            guard let (at, h) = resume else {
                scan.validEnd = offset
                break frames
            }
            if h.firstLSN > scan.nextLSN {
                let lost = h.firstLSN.rawValue - scan.nextLSN.rawValue
                scan.pieces.append(.hole(firstLSN: scan.nextLSN, count: lost, offset: offset, reason: problem.message))
                scan.nextLSN = h.firstLSN
            }
            offset = at
            piecesStart = at
        }
        closePiece(at: scan.validEnd)
        return scan
    }

    private static func deepCheck(_ reader: inout FrameReader, _ h: FrameHeader, _ body: UnsafeRawBufferPointer) -> Bool {
        guard let raw = reader.rawBody(of: h, body: body) else { return false }
        return RecordDecoding.forEach(in: raw, header: h) { _ in }
    }
}
