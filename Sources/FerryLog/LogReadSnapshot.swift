import Synchronization

#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The log's written records as they were at one moment, readable for as long as the
/// snapshot lives — also after compaction or cache eviction delete their segments, or the log
/// closes: the snapshot opens every segment when it is taken and keeps the files open (a
/// deleted segment's space comes back when the last snapshot holding it goes), as a LevelDB
/// iterator keeps its version's files.
///
/// Reads go through the snapshot's own files and its own small cache of decompressed frames,
/// so they take none of the log's locks and do not disturb its cache: a long scan of a
/// snapshot can run beside appends and other reads. Reading records in LSN order decompresses
/// each frame once.
public final class LogReadSnapshot: Sendable {
    private struct State {
        var cursors: [SegmentCursor?]
        var frames: [CachedFrame] = []
    }

    /// The records this snapshot can read: from the oldest kept when it was taken, up to (not
    /// including) the first not yet written then.
    public let range: Range<LSN>
    private let segments: [SegmentInfo]
    /// Each segment's next LSN, for finding a record's segment without copying segment infos.
    private let nextLSNs: [LSN]
    private let directory: StoreDirectory
    private let state: Mutex<State>
    private static let maxFrames = 4

    init(segments: [SegmentInfo], first: LSN, written: LSN, directory: StoreDirectory) throws {
        var cursors: [SegmentCursor?] = []
        cursors.reserveCapacity(segments.count)
        for s in segments where s.nextLSN > s.firstLSN && s.size > 0 {
            let file = try directory.open(s.name, flags: O_RDONLY)
            cursors.append(SegmentCursor(name: s.name, reader: FrameReader(file: file, system: directory.system, limit: s.size)))
        }
        self.segments = segments.filter { $0.nextLSN > $0.firstLSN && $0.size > 0 }
        self.nextLSNs = self.segments.map(\.nextLSN)
        self.range = first..<max(first, written)
        self.directory = directory
        self.state = Mutex(State(cursors: cursors))
    }

    /// Calls `body` with record `lsn`, which must lie in ``range``.
    ///
    /// - Throws: ``LogError`` — ``LogError/Code/recordsUnavailable`` for an LSN outside
    ///   ``range``; ``LogError/Code/corruption`` naming file and offset.
    public func withRecord<R>(at lsn: LSN, _ body: (RecordView) throws -> R) throws -> R {
        guard range.contains(lsn) else {
            throw LogError(.recordsUnavailable, "record \(lsn) is not in the snapshot (\(range.lowerBound)..<\(range.upperBound))", file: directory.path)
        }
        let frame = try state.withLock { s -> CachedFrame in
            // Frames first: a walk in LSN order finds most records in the last one read.
            if let i = s.frames.lastIndex(where: { $0.firstLSN <= lsn && lsn.rawValue < $0.firstLSN.rawValue + UInt64($0.count) }) {
                return s.frames[i]
            }
            var lo = 0, hi = nextLSNs.count
            while lo < hi {
                let mid = (lo + hi) / 2
                if nextLSNs[mid] <= lsn { lo = mid + 1 } else { hi = mid }
            }
            guard lo < segments.count, segments[lo].firstLSN <= lsn, let cursor = s.cursors[lo] else {
                throw LogError(.recordsUnavailable, "no segment holds record \(lsn)", file: directory.path)
            }
            let f = try WriteAheadLog.readFrame(containing: lsn, in: segments[lo], cursor: cursor, directory: directory)
            s.frames.append(f)
            if s.frames.count > Self.maxFrames { s.frames.removeFirst() }
            return f
        }
        let i = Int(lsn.rawValue - frame.firstLSN.rawValue)
        return try frame.bytes.withUnsafeBytes { raw in
            let kind = raw[Int(frame.layout[3 * i])]
            let start = Int(frame.layout[3 * i + 1]), length = Int(frame.layout[3 * i + 2])
            return try body(RecordView(lsn: lsn, kind: kind, payload: UnsafeRawBufferPointer(rebasing: raw[start..<start + length])))
        }
    }
}

extension WriteAheadLog {
    /// The records written so far, readable through the returned snapshot for as long as it
    /// lives (see ``LogReadSnapshot``). Opens one file descriptor per segment.
    ///
    /// - Throws: ``LogError`` when a segment cannot be opened (for instance, too many open files).
    public func readSnapshot() throws -> LogReadSnapshot {
        let (segments, first, written) = shared.withLock { s in (s.segments, s.firstLSN, s.writtenLSN) }
        do {
            return try LogReadSnapshot(segments: segments, first: first, written: written, directory: directory)
        } catch let e as LogError {
            throw e
        } catch {
            throw LogError(.io, "opening the log's segments for a read snapshot failed: \(error)", file: path)
        }
    }
}
