#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Dispatch
import Synchronization

/// A problem found in a store, with the file and byte offset where it is.
public struct StoreProblem: Sendable, Equatable, CustomStringConvertible {
    /// Whether an open recovers from it by itself.
    public enum Severity: String, Sendable, Equatable {
        /// A torn tail: the end of the newest segment holds an incomplete or damaged frame with
        /// nothing valid after it. An open truncates it.
        case tornTail = "torn tail"
        /// Damage an open refuses (unless it salvages).
        case corruption
        /// A format version, codec or frame type this build does not read. An open refuses it.
        case unsupported
    }
    /// Torn tail, corruption, or unsupported format.
    public var severity: Severity
    /// The segment (or other file) name, relative to the store directory.
    public var file: String
    /// The byte offset in ``file`` where the problem starts.
    public var offset: Int64
    /// What is wrong.
    public var message: String

    public var description: String { "\(severity) in \(file) at offset \(offset): \(message)" }
}

/// A read-only scan of a whole store: every segment's header, frames and seal, the continuity
/// of LSNs from segment to segment, and the start marker. Recovery and `ferry-dump` both use it.
struct StoreScan: Sendable {
    var directory: StoreDirectory
    var storeID: StoreID?
    var start: StartMarker?
    /// Segments from the log's start, in sequence order.
    var segments: [SegmentScan] = []
    /// Segment files before the start marker (left by an interrupted deletion).
    var obsolete: [String] = []
    var temporaryFiles: [String] = []
    /// Every problem, in log order. The first one is what `verify` reports.
    var problems: [StoreProblem] = []
    /// LSN ranges lost between segments or before the first one: (after segment index or nil for
    /// the front, first lost LSN, count, reason).
    var gaps: [Gap] = []

    struct Gap: Sendable {
        /// The index of the segment the gap follows; nil for a gap before the first segment.
        var after: Int?
        var firstLSN: LSN
        var count: UInt64
        var reason: String
    }

    var nextLSN: LSN { segments.last?.nextLSN ?? start?.firstLSN ?? .first }
    var isEmpty: Bool { segments.isEmpty && start == nil }

    /// The torn tail an open would truncate: the newest segment's tail problem.
    var tornTail: StoreProblem? { problems.first { $0.severity == .tornTail } }
    /// The first problem an open refuses.
    var blockingProblem: StoreProblem? { problems.first { $0.severity != .tornTail } }
    var unsupportedProblem: StoreProblem? { problems.first { $0.severity == .unsupported } }

    /// Scans the store at `directory` without modifying anything.
    static func scan(_ directory: StoreDirectory, deep: Bool, resync: Bool) throws -> StoreScan {
        var s = StoreScan(directory: directory)
        var found: [(seq: UInt64, lsn: LSN, name: String)] = []
        for name in try directory.list() {
            if let (seq, lsn) = LogFormat.parseSegmentName(name) {
                found.append((seq, lsn, name))
            } else if name.hasSuffix(LogFormat.temporarySuffix) {
                s.temporaryFiles.append(name)
            }
        }
        found.sort { $0.seq < $1.seq }

        if directory.exists(LogFormat.startFileName) {
            let bytes = try readSmallFile(directory, LogFormat.startFileName, limit: LogFormat.startFileSize + 1)
            switch StartMarker.decode(bytes) {
            case .valid(let m): s.start = m
            case .unsupported(let why):
                s.problems.append(StoreProblem(severity: .unsupported, file: LogFormat.startFileName, offset: 0, message: why))
                return s
            case .corrupt(let why, let at):
                s.problems.append(StoreProblem(severity: .corruption, file: LogFormat.startFileName, offset: Int64(at), message: why))
                if !resync { return s }
            }
        }
        if let start = s.start {
            s.obsolete = found.filter { $0.seq < start.seq }.map(\.name)
            found.removeAll { $0.seq < start.seq }
            s.storeID = start.storeID
        }
        for i in found.indices.dropFirst() where found[i].seq == found[i - 1].seq {
            s.problems.append(StoreProblem(severity: .corruption, file: found[i].name, offset: 0,
                message: "two segment files have sequence number \(found[i].seq) (\(found[i - 1].name))"))
            return s
        }

        // The front of the log.
        let expectedFirst = s.start?.firstLSN ?? .first
        if let first = found.first, first.lsn != expectedFirst {
            if first.lsn > expectedFirst {
                let count = first.lsn.rawValue - expectedFirst.rawValue
                let why = "records \(expectedFirst)–\(first.lsn - 1) are missing: the log should start at LSN \(expectedFirst) but its first segment starts at \(first.lsn) (a segment file is missing)"
                s.problems.append(StoreProblem(severity: .corruption, file: first.name, offset: 0, message: why))
                s.gaps.append(Gap(after: nil, firstLSN: expectedFirst, count: count, reason: why))
            } else {
                s.problems.append(StoreProblem(severity: .corruption, file: first.name, offset: 0,
                    message: "the first segment starts at LSN \(first.lsn), before the log's start at \(expectedFirst)"))
            }
            if !resync { return s }
        } else if found.isEmpty, let start = s.start {
            s.problems.append(StoreProblem(severity: .corruption, file: LogFormat.startFileName, offset: 0,
                message: "the log starts at segment \(start.seq) (LSN \(start.firstLSN)) but no segment files exist"))
            return s
        }

        let files = found.map { (name: $0.name, seq: $0.seq, lsn: $0.lsn) }
        let scans = scanSegments(files, in: directory, deep: deep, resync: resync)
        for (i, f) in found.enumerated() {
            let isNewest = i == found.count - 1
            // (Scanned here when not scanned ahead: few segments, or past a problem that ends a
            // strict scan, which returns before reaching it.)
            let seg = try (i < scans.count ? scans[i] : nil)?.get()
                ?? scanSegment(files, i, in: directory, deep: deep, resync: resync)
            if let h = seg.header {
                if let id = s.storeID, id != h.storeID {
                    s.problems.append(StoreProblem(severity: .corruption, file: f.name, offset: 0,
                        message: "the segment belongs to store \(h.storeID), not \(id)"))
                    if !resync { return s }
                }
                s.storeID = s.storeID ?? h.storeID
            }
            if let p = seg.problem {
                let severity: StoreProblem.Severity = switch p.kind {
                case .tail: .tornTail
                case .corruption: .corruption
                case .unsupported: .unsupported
                }
                s.problems.append(StoreProblem(severity: severity, file: f.name, offset: p.offset, message: p.message))
                if severity == .unsupported || (severity == .corruption && !resync) {
                    s.segments.append(seg)
                    return s
                }
            }
            if !isNewest && !seg.sealed && seg.problem == nil {
                s.problems.append(StoreProblem(severity: .corruption, file: f.name, offset: seg.validEnd,
                    message: "the segment ends at offset \(seg.validEnd) without a seal, but newer segments exist: its tail is missing"))
                if !resync { s.segments.append(seg); return s }
            }
            if let prev = s.segments.last {
                let expected = prev.nextLSN
                if seg.firstLSN != expected {
                    if seg.firstLSN > expected {
                        let count = seg.firstLSN.rawValue - expected.rawValue
                        let why = "records \(expected)–\(seg.firstLSN - 1) are missing between \(prev.name) and \(f.name) (a segment file is missing or truncated)"
                        // A clean, sealed predecessor means whole segments are missing; otherwise the
                        // predecessor's own problem (damage, or no seal) already reported the gap.
                        if prev.problem == nil && prev.sealed {
                            s.problems.append(StoreProblem(severity: .corruption, file: f.name, offset: 0, message: why))
                        }
                        s.gaps.append(Gap(after: s.segments.count - 1, firstLSN: expected, count: count, reason: why))
                    } else {
                        s.problems.append(StoreProblem(severity: .corruption, file: f.name, offset: 0,
                            message: "the segment starts at LSN \(seg.firstLSN) but the previous one ends at \(expected - 1)"))
                    }
                    if !resync { s.segments.append(seg); return s }
                }
            }
            s.segments.append(seg)
        }
        return s
    }

    /// Scans segment `i` of `found` (the newest is the last).
    private static func scanSegment(_ found: [(name: String, seq: UInt64, lsn: LSN)], _ i: Int, in directory: StoreDirectory,
                                    deep: Bool, resync: Bool) throws -> SegmentScan {
        let f = found[i]
        return try SegmentScanner.scan(directory: directory, name: f.name, seq: f.seq, firstLSN: f.lsn,
                                       options: .init(isNewest: i == found.count - 1, deep: deep, resync: resync))
    }

    /// Scans the segments `found` (in sequence order) on up to two threads: each scan reads
    /// one file and modifies nothing, so scanning them at once finds what scanning them in turn
    /// finds, and the caller looks at the results in order as it would have. (Reading and
    /// checksumming a million posts' segments took 14 ms of a 0.1 s open on one thread.) A
    /// scan's error is kept for its place: the caller meets it where it would have. Segments
    /// after one whose problem ends a strict scan are left unscanned (nil), as are all of
    /// them when there are few (empty): the caller scans what it reaches itself.
    private static func scanSegments(_ found: [(name: String, seq: UInt64, lsn: LSN)], in directory: StoreDirectory,
                                     deep: Bool, resync: Bool) -> [Result<SegmentScan, any Error>?] {
        @Sendable func scan(_ i: Int) -> Result<SegmentScan, any Error> {
            Result { try scanSegment(found, i, in: directory, deep: deep, resync: resync) }
        }
        guard found.count >= 4 else { return [] }  // (the caller scans them in turn)
        final class Results: @unchecked Sendable {
            // Each slot is written by one iteration only, and read after all of them.
            var slots: [Result<SegmentScan, any Error>?]
            /// The next segment to scan, and the first whose problem ends a strict scan (none
            /// after it is needed: the caller stops there).
            let state = FerryMutex((next: 0, stop: Int.max))
            init(_ count: Int) { slots = Array(repeating: nil, count: count) }
        }
        let results = Results(found.count)
        results.slots.withUnsafeMutableBufferPointer { slots in
            nonisolated(unsafe) let slots = slots
            DispatchQueue.concurrentPerform(iterations: 2) { _ in
                while true {
                    let i = results.state.withLock { s in defer { s.next += 1 }; return s.next }
                    guard i < found.count, i <= results.state.withLock({ $0.stop }) else { return }
                    let result = scan(i)
                    slots[i] = result
                    let ends: Bool = switch result {
                    case .failure: true
                    case .success(let seg): seg.problem.map { $0.kind == .unsupported || ($0.kind == .corruption && !resync) } ?? false
                    }
                    if ends { results.state.withLock { $0.stop = min($0.stop, i) } }
                }
            }
        }
        return results.slots
    }

    /// A summary a person can read: the first problem, or that the store is sound.
    var verdict: String {
        if let p = blockingProblem ?? tornTail { return p.description }
        return "sound"
    }
}

func readSmallFile(_ directory: StoreDirectory, _ name: String, limit: Int) throws -> [UInt8] {
    let file = try directory.open(name, flags: O_RDONLY)
    var bytes = [UInt8](repeating: 0, count: limit)
    let n: Int
    switch bytes.withUnsafeMutableBytes({ directory.system.preadFully(file.fd, $0, at: 0) }) {
    case .success(let c): n = c
    case .failure(let e): throw LogError.io("read", path: file.path, e)
    }
    bytes.removeSubrange(n...)
    return bytes
}

/// Reads a whole file, sized by `fstat`.
func readWholeFile(_ directory: StoreDirectory, _ name: String) throws -> [UInt8] {
    let file = try directory.open(name, flags: O_RDONLY)
    let size: Int64
    switch directory.system.fileSize(file.fd) {
    case .success(let s): size = s
    case .failure(let e): throw LogError.io("fstat", path: file.path, e)
    }
    var bytes = [UInt8](repeating: 0, count: Int(size))
    switch bytes.withUnsafeMutableBytes({ directory.system.preadFully(file.fd, $0, at: 0) }) {
    case .success(let n) where n == Int(size): return bytes
    case .success: throw LogError(.io, "the file changed size while being read", file: file.path)
    case .failure(let e): throw LogError.io("read", path: file.path, e)
    }
}
