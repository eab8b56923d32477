#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Turns a scan into an open store: refuses what must be refused, repairs what a salvage open
/// may repair, truncates a torn tail and finishes interrupted file operations.
///
/// Nothing is modified until every segment has been scanned and no unsupported format was found.
enum Recovery {
    static func error(for problem: StoreProblem, in directory: StoreDirectory) -> LogError {
        switch problem.severity {
        case .unsupported:
            return LogError(.unsupportedFormat,
                "the store was written by a newer or different version of Ferry (\(problem.message)); nothing was modified",
                file: directory.path(problem.file), offset: problem.offset)
        case .corruption, .tornTail:
            return LogError(.corruption,
                "\(problem.message). Open with RecoveryMode.salvage to drop the damaged records and keep the rest",
                file: directory.path(problem.file), offset: problem.offset)
        }
    }

    /// Checks only the segment headers and the start marker for a format this build does not
    /// read, before anything (even the lock file) is created.
    static func refuseUnsupported(_ directory: StoreDirectory) throws {
        for name in try directory.list() {
            let decoded: String?
            if LogFormat.parseSegmentName(name) != nil {
                let head = try readSmallFile(directory, name, limit: LogFormat.segmentHeaderSize)
                if case .unsupported(let why) = head.withUnsafeBytes({ SegmentHeader.decode($0) }) { decoded = why } else { decoded = nil }
            } else if name == LogFormat.startFileName {
                if case .unsupported(let why) = StartMarker.decode(try readSmallFile(directory, name, limit: LogFormat.startFileSize)) {
                    decoded = why
                } else { decoded = nil }
            } else { decoded = nil }
            if let why = decoded {
                throw error(for: StoreProblem(severity: .unsupported, file: name, offset: 0, message: why), in: directory)
            }
        }
    }

    /// Rewrites damaged segments so that a strict scan passes, recording every lost LSN range as
    /// a hole frame. The original of every rewritten file is first copied to `damaged/`.
    static func salvage(_ scan: StoreScan, storeID: StoreID, report: inout RecoveryReport) throws {
        let dir = scan.directory
        let damaged = StoreDirectory(path: dir.path(LogFormat.damagedDirectory), system: dir.system)
        let stamp = String(UInt64(wallClockNanos()))

        for (i, seg) in scan.segments.enumerated() {
            let isNewest = i == scan.segments.count - 1
            let gapAfter = scan.gaps.first { $0.after == i }
            let needsRepair = seg.header == nil || seg.problem != nil || gapAfter != nil || (!isNewest && !seg.sealed)
            guard needsRepair else { continue }
            if seg.problem?.kind == .tail && isNewest && gapAfter == nil && seg.header != nil { continue }  // truncated below

            // Assemble the repaired file: header, every intact frame, holes, and the seal.
            let header = SegmentHeader(storeID: storeID, seq: seg.seq, firstLSN: seg.nameFirstLSN,
                                       createdNanos: seg.header?.createdNanos ?? wallClockNanos())
            var bytes = header.bytes
            let original = try dir.open(seg.name, flags: O_RDONLY)
            var reader = FrameReader(file: original, system: dir.system, limit: seg.fileSize)
            var pieces = seg.pieces
            if seg.sealed, case .frames(let o, let n)? = pieces.last {
                // Drop the old seal: holes must come before the (re-written) seal.
                pieces[pieces.count - 1] = .frames(offset: o, size: n - Int64(LogFormat.frameHeaderSize))
            }
            let lossesBefore = report.salvaged.count
            for piece in pieces {
                switch piece {
                case .frames(let offset, let size):
                    guard size > 0, let b = try reader.bytes(at: offset, length: Int(size)) else { continue }
                    bytes.append(contentsOf: b)
                case .hole(let first, let count, let offset, let reason):
                    bytes.append(contentsOf: FrameHeader.hole(firstLSN: first, count: UInt32(clamping: count)).bytes)
                    report.salvaged.append(.init(segment: seg.name, offset: offset,
                                                 lsns: first.rawValue..<first.rawValue + count, reason: reason))
                }
            }
            var next = seg.nextLSN
            if let gap = gapAfter {
                var remaining = gap.count, at = gap.firstLSN
                while remaining > 0 {
                    let n = min(remaining, UInt64(UInt32.max))
                    bytes.append(contentsOf: FrameHeader.hole(firstLSN: at, count: UInt32(n)).bytes)
                    at = at + n
                    remaining -= n
                }
                next = gap.firstLSN + gap.count
                report.salvaged.append(.init(segment: seg.name, offset: seg.validEnd,
                                             lsns: gap.firstLSN.rawValue..<next.rawValue, reason: gap.reason))
            }
            if report.salvaged.count == lossesBefore {
                // Only structure was rebuilt (a header, a seal): no records were lost.
                let why = seg.problem?.message ?? "the segment ends without a seal, but newer segments exist"
                report.salvaged.append(.init(segment: seg.name, offset: seg.problem?.offset ?? seg.validEnd,
                                             lsns: next.rawValue..<next.rawValue, reason: why))
            }
            if !isNewest || seg.sealed {
                bytes.append(contentsOf: FrameHeader.seal(nextLSN: next).bytes)
            }

            // Keep the original, then replace it atomically.
            try damaged.createIfNeeded()
            let copy = try reader.bytes(at: 0, length: Int(seg.fileSize))
                .map { Array($0) } ?? []
            try damaged.createAtomically(seg.name + "." + stamp, contents: copy)
            try dir.createAtomically(seg.name, contents: bytes)
        }

        // A damaged start marker or missing segments at the front: restart the log at the first
        // segment that is present.
        let frontGap = scan.gaps.first { $0.after == nil }
        let startDamaged = scan.problems.contains { $0.file == LogFormat.startFileName }
        if let first = scan.segments.first, frontGap != nil || startDamaged {
            let marker = StartMarker(storeID: storeID, seq: first.seq, firstLSN: first.nameFirstLSN)
            try dir.createAtomically(LogFormat.startFileName, contents: marker.bytes)
            if let gap = frontGap {
                report.salvaged.append(.init(segment: first.name, offset: 0,
                                             lsns: gap.firstLSN.rawValue..<gap.firstLSN.rawValue + gap.count, reason: gap.reason))
            } else {
                report.salvaged.append(.init(segment: LogFormat.startFileName, offset: 0,
                                             lsns: 0..<0, reason: "the log-start file was damaged and was rewritten"))
            }
        }
    }

    /// Truncates a torn tail and removes leftovers of interrupted operations.
    static func finish(_ scan: StoreScan, report: inout RecoveryReport) throws {
        let dir = scan.directory
        if let torn = scan.tornTail, let seg = scan.segments.last, torn.file == seg.name {
            try cutAfterValidEnd(seg, dir)
            report.tornTail = .init(segment: seg.name, offset: seg.validEnd, discardedBytes: seg.fileSize - seg.validEnd,
                                    reason: torn.message)
        }
        // A crash between a seal and the cutting of the zeros after it: the writer starts a new
        // segment, so nothing would cut them.
        if scan.tornTail == nil, let seg = scan.segments.last, seg.zeroTail > 0 {
            if seg.sealed { try cutAfterValidEnd(seg, dir) }
            report.zeroTail = .init(segment: seg.name, offset: seg.validEnd, bytes: seg.zeroTail, cut: seg.sealed)
        }
        try dir.remove(scan.temporaryFiles)
        report.removedTemporaryFiles = scan.temporaryFiles.sorted()
        try dir.remove(scan.obsolete)
        report.finishedDeletions = scan.obsolete.sorted()
    }
}

extension Recovery {
    /// Truncates a segment to its last good frame, durably.
    private static func cutAfterValidEnd(_ seg: SegmentScan, _ dir: StoreDirectory) throws {
        let file = try dir.open(seg.name, flags: O_WRONLY)
        if case .failure(let e) = dir.system.ftruncate(file.fd, seg.validEnd) { throw LogError.io("ftruncate", path: file.path, e) }
        if case .failure(let e) = dir.system.fsync(file.fd) { throw LogError.io("fsync", path: file.path, e) }
        try file.close(dir.system)
    }
}

func wallClockNanos() -> UInt64 {
    var ts = timespec()
    clock_gettime(CLOCK_REALTIME, &ts)
    return UInt64(ts.tv_sec) * 1_000_000_000 + UInt64(ts.tv_nsec)
}
