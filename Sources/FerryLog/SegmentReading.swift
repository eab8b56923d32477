#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// Reads records out of a list of segments, checking every checksum and the continuity of LSNs.
enum SegmentReading {
    /// Calls `body` for every record with `from <= lsn <= through` in `segments`, in LSN order.
    /// Returns the LSN after the last record it read (where a later call would continue).
    static func read(
        _ directory: StoreDirectory, segments: [SegmentInfo], from: LSN, through: LSN,
        _ body: (RecordView) throws -> Void
    ) throws -> LSN {
        var next = from
        for seg in segments where seg.nextLSN > next && seg.firstLSN <= through {
            guard next >= seg.firstLSN else {
                throw LogError(.recordsUnavailable, "records \(next)–\(seg.firstLSN - 1) are not in the log",
                               file: directory.path(seg.name))
            }
            let file: FileHandle
            do {
                file = try directory.open(seg.name, flags: O_RDONLY)
            } catch let e as LogError where e.errno == .ENOENT {
                throw LogError(.recordsUnavailable,
                    "records from LSN \(next) were deleted while being read (segment \(seg.name) is gone)",
                    file: directory.path(seg.name))
            }
            var reader = FrameReader(file: file, system: directory.system, limit: seg.size)
            var (offset, expected) = seg.seek(to: max(next, seg.firstLSN))
            frames: while offset < seg.size && expected <= through {
                let frameOffset = offset
                func corrupt(_ why: String) -> LogError {
                    LogError(.corruption, why, file: directory.path(seg.name), offset: frameOffset)
                }
                switch try reader.readFrame(at: offset) {
                case .end:
                    break frames
                case .incomplete(let why), .invalid(let why):
                    throw corrupt(why)
                case .unsupported(let why):
                    throw LogError(.unsupportedFormat, why, file: directory.path(seg.name), offset: frameOffset)
                case .frame(let h, let stored):
                    guard h.firstLSN == expected else {
                        throw corrupt("LSN discontinuity: expected a frame starting at \(expected), found \(h.firstLSN)")
                    }
                    offset += Int64(h.frameSize)
                    expected = h.nextLSN
                    guard h.kind == .data, expected > next else { continue frames }
                    guard let raw = reader.rawBody(of: h, body: stored) else { throw corrupt("the frame body does not decompress") }
                    let start = next
                    let wellFormed = try RecordDecoding.forEach(in: raw, header: h, from: start) { r in
                        if r.lsn <= through { try body(r) }
                    }
                    guard wellFormed else { throw corrupt("the frame's records do not match its header") }
                    next = min(expected, through + 1)
                }
            }
            next = max(next, min(seg.nextLSN, through + 1))
            if next > through { break }
        }
        return next
    }
}
