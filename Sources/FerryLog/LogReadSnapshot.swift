import Dispatch
import Foundation
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
/// each frame once, and reads ahead: once a reader has taken two frames in a row, the next
/// few (up to 4, or 256 KiB) are read, checked and decompressed on another thread while it
/// works through the one it has — a walk of a million posts spent ~18% of its time reading and
/// decompressing — and an ``Inspector`` given to the snapshot looks at their records there.
public final class LogReadSnapshot: Sendable {
    private struct State {
        /// Readers of the segments read last (each holds a read buffer: a few, not one per segment).
        var cursors: [(segment: Int, cursor: SegmentCursor)] = []
        var frames: [CachedFrame] = []
        /// The frames being read ahead, if they are.
        var ahead: ReadAhead?
        /// Whether the reads look sequential: the last frame read was the one after the frame
        /// read before it (reads at random read nothing ahead).
        var sequential = false
        /// The last frame read ahead (or read in order), after which the next read ahead starts.
        var tail: CachedFrame?
        /// The first records of frames read ahead that no read has used yet.
        var unclaimed: [LSN] = []
        /// The reader the read ahead uses: taken by it while it runs (only one runs at a time,
        /// so it is never shared).
        var aheadCursor: (segment: Int, cursor: SegmentCursor)?
        /// Frames read ahead so far (for tests).
        var framesReadAhead = 0
    }

    /// Frames being read ahead: a reader that needs one of them waits until the next is
    /// delivered (among the state's frames) or the read ahead ends — a read that fails ends
    /// it, and the reader then reads that frame itself, and meets the error.
    private final class ReadAhead: @unchecked Sendable {
        /// The first record it reads: a reader of an earlier one reads it itself.
        let start: LSN
        private let condition = NSCondition()
        private var delivered = 0
        private var finished = false

        init(start: LSN) { self.start = start }

        /// Frames delivered so far.
        var progress: Int {
            condition.lock()
            defer { condition.unlock() }
            return delivered
        }

        func deliver() {
            condition.lock()
            delivered += 1
            condition.broadcast()
            condition.unlock()
        }

        func finish() {
            condition.lock()
            finished = true
            condition.broadcast()
            condition.unlock()
        }

        /// Waits until more than `seen` frames are delivered, or the read ahead ends.
        func wait(past seen: Int) {
            condition.lock()
            while delivered == seen && !finished { condition.wait() }
            condition.unlock()
        }
    }

    /// A reader handed to the thread reading ahead, which alone uses it until it is done.
    private struct Handed: @unchecked Sendable {
        let cursor: (segment: Int, cursor: SegmentCursor)?
        let previous: CachedFrame
    }

    private static let aheadQueue = DispatchQueue(label: "ferry.log.read-ahead", attributes: .concurrent)

    /// Looks at a record (its kind and payload) of a frame read ahead, on the thread reading
    /// ahead; what it returns is the record's ``RecordView/note`` when it is read. A user of
    /// the records can do there, beside the reader, work it would otherwise do on reading
    /// each record (the database checks the value a record holds).
    public typealias Inspector = @Sendable (_ kind: UInt8, _ payload: UnsafeRawBufferPointer) -> UInt64
    private let inspect: Inspector?

    /// The segments' descriptors, open for as long as the snapshot lives (a deleted segment
    /// stays readable through them); readers use duplicates of them.
    private final class Descriptors: @unchecked Sendable {
        let fds: [Int32]
        /// What the snapshot counts against ``descriptorBudget``: these and its readers' own.
        let counted: Int
        init(_ fds: [Int32], counted: Int) {
            self.fds = fds
            self.counted = counted
        }
        deinit {
            for fd in fds { _ = close(fd) }
            LogReadSnapshot.held.subtract(counted, ordering: .relaxed)
        }
    }

    /// Descriptors all read snapshots of the process may hold: past this, taking a snapshot
    /// fails (its reader then reads another way) rather than leave the log itself without a
    /// descriptor for its next segment. A snapshot counts one per segment it keeps, and one
    /// for each reader of its own (at most two cursors and the read ahead's).
    public static let descriptorBudget = 256
    private static let held = Atomic<Int>(0)

    /// The records this snapshot can read: from the oldest kept when it was taken, up to (not
    /// including) the first not yet written then.
    public let range: Range<LSN>
    private let segments: [SegmentInfo]
    /// Each segment's next LSN, for finding a record's segment without copying segment infos.
    private let nextLSNs: [LSN]
    private let directory: StoreDirectory
    private let state: FerryMutex<State>
    private let descriptors: Descriptors
    /// Frames kept: the one being read, those read ahead and a few read before — no more than
    /// 4 once they hold more than `maxFrameBytes` (frames of big values).
    private static let maxFrames = 8
    private static let maxFrameBytes = 4 << 20
    /// Frames read ahead at a time (one wake of the thread reading them), stopping early once
    /// they hold `aheadBytes`.
    private static let aheadFrames = 4
    private static let aheadBytes = 256 << 10
    private static let maxCursors = 2

    init(segments: [SegmentInfo], first: LSN, written: LSN, directory: StoreDirectory, inspect: Inspector?) throws {
        let kept = segments.filter { $0.nextLSN > $0.firstLSN && $0.size > 0 }
        let counted = kept.count + Self.maxCursors + 1
        let total = Self.held.add(counted, ordering: .relaxed).newValue
        guard total <= Self.descriptorBudget else {
            Self.held.subtract(counted, ordering: .relaxed)
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
            Self.held.subtract(counted, ordering: .relaxed)
            throw error
        }
        self.descriptors = Descriptors(fds, counted: counted)
        self.segments = kept
        self.nextLSNs = kept.map(\.nextLSN)
        self.range = first..<max(first, written)
        self.directory = directory
        self.inspect = inspect
        self.state = FerryMutex(State())
    }

    /// A reader of segment `i`, made from a duplicate of its descriptor when none is at hand.
    private func cursor(_ i: Int, _ s: inout State) throws -> SegmentCursor {
        if let k = s.cursors.firstIndex(where: { $0.segment == i }) { return s.cursors[k].cursor }
        if s.cursors.count == Self.maxCursors { s.cursors.removeFirst() }  // (its descriptor closes first)
        let c = try newCursor(i)
        s.cursors.append((i, c))
        return c
    }

    /// A new reader of segment `i`, on a duplicate of its descriptor.
    private func newCursor(_ i: Int) throws -> SegmentCursor {
        let fd = dup(descriptors.fds[i])
        guard fd >= 0 else { throw LogError.io("dup", path: directory.path(segments[i].name), Errno(rawValue: errno)) }
        return SegmentCursor(name: segments[i].name, reader: FrameReader(file: FileHandle(fd: fd, path: directory.path(segments[i].name)),
                                                                     system: directory.system, limit: segments[i].size))
    }

    /// Calls `body` with record `lsn`, which must lie in ``range``.
    ///
    /// - Throws: ``LogError`` — ``LogError/Code/recordsUnavailable`` for an LSN outside
    ///   ``range``; ``LogError/Code/corruption`` naming file and offset.
    public func withRecord<R>(at lsn: LSN, _ body: (RecordView) throws -> R) throws -> R {
        guard range.contains(lsn) else {
            throw LogError(.recordsUnavailable, "record \(lsn) is not in the snapshot (\(range.lowerBound)..<\(range.upperBound))", file: directory.path)
        }
        return try frame(holding: lsn).withRecord(lsn, body)
    }

    /// How many frames were read ahead on another thread so far.
    @_spi(Testing) public var framesReadAhead: Int { state.withLock { $0.framesReadAhead } }

    private enum Lookup {
        case found(CachedFrame)
        case wait(ReadAhead, Int)
    }

    /// The frame holding record `lsn`: cached, read ahead (waited for while the read ahead is
    /// reading records from before it on: at most a few frames' read), or read now.
    private func frame(holding lsn: LSN) throws -> CachedFrame {
        while true {
            let lookup = try state.withLock { s -> Lookup in
                // Frames first: a walk in LSN order finds most records in the last one read.
                if let f = s.frames.last(where: { $0.contains(lsn) }) {
                    if !s.unclaimed.isEmpty, s.unclaimed[0] <= f.firstLSN {
                        s.unclaimed.removeAll { $0 <= f.firstLSN }
                        if s.unclaimed.count <= 2 { readAhead(&s) }
                    }
                    return .found(f)
                }
                // A record the read ahead may be reading: wait for it. (Progress read under the
                // state's lock: a frame delivered after this check moves it past `seen`, one
                // delivered before is among the frames.) An earlier one is read here, beside it.
                if let a = s.ahead, lsn >= a.start { return .wait(a, a.progress) }
                let i = try segmentIndex(of: lsn)
                let f = try WriteAheadLog.readFrame(containing: lsn, in: segments[i], cursor: try cursor(i, &s), directory: directory,
                                                    after: s.frames.last)
                s.sequential = s.frames.last?.nextLSN == f.firstLSN
                s.tail = f
                s.unclaimed = []
                keep(f, &s)
                readAhead(&s)
                return .found(f)
            }
            switch lookup {
            case .found(let f): return f
            case .wait(let a, let seen): a.wait(past: seen)
            }
        }
    }

    private func keep(_ f: CachedFrame, _ s: inout State) {
        s.frames.append(f)
        while s.frames.count > Self.maxFrames
            || (s.frames.count > 4 && s.frames.reduce(0, { $0 + $1.bytes.count }) > Self.maxFrameBytes) {
            s.frames.removeFirst()
        }
    }

    /// The index of the segment holding record `lsn`.
    private func segmentIndex(of lsn: LSN) throws -> Int {
        var lo = 0, hi = nextLSNs.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if nextLSNs[mid] <= lsn { lo = mid + 1 } else { hi = mid }
        }
        guard lo < segments.count, segments[lo].firstLSN <= lsn else {
            throw LogError(.recordsUnavailable, "no segment holds record \(lsn)", file: directory.path)
        }
        return lo
    }

    /// Starts reading the frames after the tail on another thread, when reads look sequential
    /// and none are being read. A read that fails ends it (see ``ReadAhead``).
    private func readAhead(_ s: inout State) {
        guard s.sequential, s.ahead == nil, let previous = s.tail, range.contains(previous.nextLSN) else { return }
        let ahead = ReadAhead(start: previous.nextLSN)
        s.ahead = ahead
        let handed = Handed(cursor: s.aheadCursor, previous: previous)
        s.aheadCursor = nil  // (the thread reading ahead has it, and gives it back when done)
        Self.aheadQueue.async { [self] in
            var previous = handed.previous
            var cursor = handed.cursor
            var bytes = 0
            for _ in 0..<Self.aheadFrames where bytes < Self.aheadBytes {
                let lsn = previous.nextLSN
                guard range.contains(lsn), let i = try? segmentIndex(of: lsn) else { break }
                if cursor?.segment != i {
                    cursor = nil  // (its descriptor closes before another is taken)
                    guard let c = try? newCursor(i) else { break }
                    cursor = (i, c)
                }
                guard let read = try? WriteAheadLog.readFrame(containing: lsn, in: segments[i], cursor: cursor!.cursor, directory: directory,
                                                              after: previous)
                else { break }
                let f = inspect.map { read.inspected(by: $0) } ?? read
                let more = state.withLock { s -> Bool in
                    guard s.tail === previous else { return false }  // (a read elsewhere took over)
                    if !s.frames.contains(where: { $0.firstLSN == f.firstLSN }) {
                        keep(f, &s)
                        s.unclaimed.append(f.firstLSN)
                        s.framesReadAhead += 1
                    }
                    s.tail = f
                    return true
                }
                guard more else { break }
                ahead.deliver()
                previous = f
                bytes += f.bytes.count
            }
            let kept = Handed(cursor: cursor, previous: previous)
            state.withLock { s in
                s.aheadCursor = kept.cursor
                s.ahead = nil
            }
            ahead.finish()
        }
    }
}

extension WriteAheadLog {
    /// The records written so far, readable through the returned snapshot for as long as it
    /// lives (see ``LogReadSnapshot``). Opens one file descriptor per segment. `inspect`, if
    /// given, looks at each record of the frames the snapshot reads ahead.
    ///
    /// - Throws: ``LogError`` when a segment cannot be opened (for instance, too many open files).
    public func readSnapshot(inspect: LogReadSnapshot.Inspector? = nil) throws -> LogReadSnapshot {
        let (segments, first, written) = shared.withLock { s in (s.segments, s.firstLSN, s.writtenLSN) }
        do {
            return try LogReadSnapshot(segments: segments, first: first, written: written, directory: directory, inspect: inspect)
        } catch let e as LogError {
            throw e
        } catch {
            throw LogError(.io, "opening the log's segments for a read snapshot failed: \(error)", file: path)
        }
    }
}
