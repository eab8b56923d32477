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
/// Reads go through the snapshot's own descriptors (duplicates of them, for the two segments
/// read last) and its own small cache of decompressed frames,
/// so they take none of the log's locks and do not disturb its cache: a long scan of a
/// snapshot can run beside appends and other reads. Reading records in LSN order decompresses
/// each frame once.
public final class LogReadSnapshot: Sendable {
    private struct State {
        /// Readers of the segments read last (each holds a read buffer: a few, not one per segment).
        var cursors: [(segment: Int, cursor: SegmentCursor)] = []
        var frames: [CachedFrame] = []
    }

    /// The segments' descriptors, open for as long as the snapshot lives (a deleted segment
    /// stays readable through them); readers use duplicates of them.
    private final class Descriptors: @unchecked Sendable {
        let fds: [Int32]
        init(_ fds: [Int32]) { self.fds = fds }
        deinit {
            for fd in fds { _ = close(fd) }
            LogReadSnapshot.held.subtract(fds.count, ordering: .relaxed)
        }
    }

    /// Descriptors all read snapshots of the process may hold: past this, taking a snapshot
    /// fails (its reader then reads another way) rather than leave the log itself without a
    /// descriptor for its next segment.
    public static let descriptorBudget = 256
    private static let held = Atomic<Int>(0)

    /// The records this snapshot can read: from the oldest kept when it was taken, up to (not
    /// including) the first not yet written then.
    public let range: Range<LSN>
    private let segments: [SegmentInfo]
    /// Each segment's next LSN, for finding a record's segment without copying segment infos.
    private let nextLSNs: [LSN]
    private let directory: StoreDirectory
    private let state: Mutex<State>
    private let descriptors: Descriptors
    private static let maxFrames = 4
    private static let maxCursors = 2

    init(segments: [SegmentInfo], first: LSN, written: LSN, directory: StoreDirectory) throws {
        let kept = segments.filter { $0.nextLSN > $0.firstLSN && $0.size > 0 }
        let total = Self.held.add(kept.count, ordering: .relaxed).newValue
        guard total <= Self.descriptorBudget else {
            Self.held.subtract(kept.count, ordering: .relaxed)
            throw LogError(.invalidArgument, "read snapshots would hold \(total) descriptors, more than \(Self.descriptorBudget)", file: directory.path)
        }
        var fds: [Int32] = []
        fds.reserveCapacity(kept.count)
        do {
            for s in kept {
                let file = try directory.open(s.name, flags: O_RDONLY)
                fds.append(dup(file.fd))  // (the handle closes its own when it goes)
                if fds.last! < 0 { throw LogError.io("dup", path: directory.path(s.name), Errno(rawValue: errno)) }
            }
        } catch {
            for fd in fds where fd >= 0 { _ = close(fd) }
            Self.held.subtract(kept.count, ordering: .relaxed)
            throw error
        }
        self.descriptors = Descriptors(fds)
        self.segments = kept
        self.nextLSNs = kept.map(\.nextLSN)
        self.range = first..<max(first, written)
        self.directory = directory
        self.state = Mutex(State())
    }

    /// A reader of segment `i`, made from a duplicate of its descriptor when none is at hand.
    private func cursor(_ i: Int, _ s: inout State) throws -> SegmentCursor {
        if let k = s.cursors.firstIndex(where: { $0.segment == i }) { return s.cursors[k].cursor }
        let fd = dup(descriptors.fds[i])
        guard fd >= 0 else { throw LogError.io("dup", path: directory.path(segments[i].name), Errno(rawValue: errno)) }
        let c = SegmentCursor(name: segments[i].name, reader: FrameReader(file: FileHandle(fd: fd, path: directory.path(segments[i].name)),
                                                                      system: directory.system, limit: segments[i].size))
        s.cursors.append((i, c))
        if s.cursors.count > Self.maxCursors { s.cursors.removeFirst() }
        return c
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
            if let f = s.frames.last(where: { $0.contains(lsn) }) { return f }
            var lo = 0, hi = nextLSNs.count
            while lo < hi {
                let mid = (lo + hi) / 2
                if nextLSNs[mid] <= lsn { lo = mid + 1 } else { hi = mid }
            }
            guard lo < segments.count, segments[lo].firstLSN <= lsn else {
                throw LogError(.recordsUnavailable, "no segment holds record \(lsn)", file: directory.path)
            }
            let f = try WriteAheadLog.readFrame(containing: lsn, in: segments[lo], cursor: try cursor(lo, &s), directory: directory,
                                                after: s.frames.last)
            s.frames.append(f)
            if s.frames.count > Self.maxFrames { s.frames.removeFirst() }
            return f
        }
        return try frame.withRecord(lsn, body)
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
