#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Dispatch
import Logging
import Synchronization

/// A segmented, checksummed, LZ4-compressed append-only log of records.
///
/// One ``WriteAheadLog`` owns a store directory (under an exclusive `flock`) until it is closed.
/// Any number of tasks may append concurrently; one serial writer turns waiting batches into
/// frames, writes them and — per ``Durability`` — calls `fdatasync` once for all of them (group
/// commit). Readers iterate records from any LSN while appends go on.
///
/// After any failure of a step that changes its files — a write or sync of appends, or a roll,
/// the close's cutting of the zeros a segment was grown by, a deletion of segments, or a
/// side-file write — the log is *fail-stop*: every waiting and
/// later call throws ``LogError/Code/failed`` with the first cause; nothing is retried. Reopen
/// the store to recover.
///
/// See FORMAT.md for the bytes on disk and the recovery rules.
public final class WriteAheadLog: Sendable {
    /// The store directory.
    public let path: String
    /// The store's identity (written into every segment header).
    public let storeID: StoreID
    /// What the open found and repaired.
    public let recovery: RecoveryReport
    let options: LogOptions
    let directory: StoreDirectory
    let queue: DispatchQueue
    let shared: FerryMutex<Shared>
    let writer: FerryMutex<Writer>
    /// Wakes the writer while it waits for work (cheaper than queueing a new run).
    let wake = DispatchSemaphore(value: 0)
    /// Open segments and decompressed frames for ``withRecord(at:_:)``.
    let recordCache = FerryMutex(RecordCache())

    var logger: Logger { options.logger }
    var system: SystemCalls { options.system }

    /// Opens the store at `path`, creating it if absent, and recovers it.
    ///
    /// Recovery truncates a torn tail (reported in ``recovery``) and finishes interrupted file
    /// operations. Any other damage fails the open with ``LogError/Code/corruption`` naming the
    /// file and byte offset, unless `options.recovery` is ``RecoveryMode/salvage``.
    ///
    /// - Throws: ``LogError`` with code ``LogError/Code/storeInUse`` when another opener holds
    ///   the store, ``LogError/Code/corruption``, ``LogError/Code/unsupportedFormat`` (nothing was
    ///   modified), or ``LogError/Code/io``.
    public static func open(at path: String, options: LogOptions = LogOptions()) throws -> WriteAheadLog {
        guard options.segmentSize >= 4096 else {
            throw LogError(.invalidArgument, "segmentSize must be at least 4096 bytes (got \(options.segmentSize))")
        }
        let dir = StoreDirectory(path: path, system: options.system)
        try dir.createIfNeeded()
        try Recovery.refuseUnsupported(dir)
        let lock = try acquireLock(dir)

        var report = RecoveryReport()
        var scan = try StoreScan.scan(dir, deep: false, resync: options.recovery == .salvage)
        if let p = scan.unsupportedProblem { throw Recovery.error(for: p, in: dir) }
        let storeID = scan.storeID ?? options.newStoreID ?? .random()
        if let p = scan.blockingProblem {
            guard options.recovery == .salvage else { throw Recovery.error(for: p, in: dir) }
            try Recovery.salvage(scan, storeID: storeID, report: &report)
            scan = try StoreScan.scan(dir, deep: false, resync: false)
            if let p = scan.blockingProblem {
                throw LogError(.corruption, "salvage could not repair the store: \(p.message)", file: dir.path(p.file), offset: p.offset)
            }
        }
        try Recovery.finish(scan, report: &report)

        // The segment to append to: the newest unsealed one, or a new one.
        let created = options.fixedCreationTime ?? wallClockNanos()
        var sealed = scan.segments.map(SegmentInfo.init(scan:))
        let segment: SegmentWriter
        if let last = scan.segments.last, !last.sealed {
            sealed.removeLast()
            segment = try SegmentWriter.reopen(in: dir, scan: last, sizeLimit: options.segmentSize)
        } else {
            report.created = scan.isEmpty
            let seq = (scan.segments.last?.seq ?? scan.start.map { $0.seq - 1 } ?? 0) + 1
            segment = try SegmentWriter.create(in: dir, storeID: storeID, seq: seq, firstLSN: scan.nextLSN, createdNanos: created,
                                               sizeLimit: options.segmentSize)
        }
        report.segmentCount = sealed.count + 1
        let activeFirst = segment.firstLSN
        report.firstLSN = sealed.first?.firstLSN ?? activeFirst
        report.nextLSN = scan.nextLSN
        if !report.isClean { options.logger.warning("recovered store at \(path): \(report)") }

        return WriteAheadLog(path: path, storeID: storeID, report: report, options: options, directory: dir,
                             sealed: sealed, segment: segment, lock: lock)
    }

    private init(path: String, storeID: StoreID, report: RecoveryReport, options: LogOptions, directory: StoreDirectory,
                 sealed: [SegmentInfo], segment: consuming SegmentWriter, lock: consuming FileHandle) {
        self.path = path
        self.storeID = storeID
        self.recovery = report
        self.options = options
        self.directory = directory
        self.queue = DispatchQueue(label: "ferry.log.writer")
        let next = report.nextLSN
        let active = segment.info(nextLSN: next)
        self.shared = FerryMutex(Shared(nextLSN: next, firstLSN: report.firstLSN, sealed: sealed, active: active))
        self.writer = FerryMutex(Writer(segment: segment, lock: lock, frameTarget: options.frameTargetSize))
    }

    /// The pid the lock file names (its holder's, written when it was taken).
    private static func holderPID(_ dir: StoreDirectory) -> Int? {
        guard let bytes = try? readSmallFile(dir, LogFormat.lockFileName, limit: 32) else { return nil }
        return Int(String(decoding: bytes.filter { $0 >= 0x30 && $0 <= 0x39 }, as: UTF8.self))
    }

    private static func acquireLock(_ dir: StoreDirectory) throws -> FileHandle {
        let lock = try dir.open(LogFormat.lockFileName, flags: O_RDWR | O_CREAT)
        var attempt = 0
        var result = dir.system.lockExclusive(lock.fd)
        // Held by this process: a child being spawned (between its fork and its exec, where
        // close-on-exec descriptors are still open) can hold it for a moment after the store
        // was closed here. Ask again for up to half a second before calling it in use.
        while case .failure(let e) = result, e == .EWOULDBLOCK, attempt < 20, holderPID(dir) == Int(getpid()) {
            attempt += 1
            usleep(25_000)
            result = dir.system.lockExclusive(lock.fd)
        }
        switch result {
        case .success: break
        case .failure(let e) where e == .EWOULDBLOCK:
            var holder = ""
            if let pid = holderPID(dir) {
                holder = pid == Int(getpid()) ? " (by another open in this process)" : " (by process \(pid))"
            }
            throw LogError(.storeInUse, "the store is in use\(holder); only one opener at a time may hold it",
                           file: dir.path(LogFormat.lockFileName))
        case .failure(let e):
            throw LogError.io("flock", path: lock.path, e)
        }
        // Who holds it, for the message a second opener gets. It changes a file, so like every
        // such step it goes through `SystemCalls` and a failure is an error (the open fails
        // before the store is touched), never ignored.
        let pid = Array("\(getpid())\n".utf8)
        if case .failure(let e) = dir.system.ftruncate(lock.fd, 0) { throw LogError.io("ftruncate", path: lock.path, e) }
        if case .failure(let e) = pid.withUnsafeBytes({ dir.system.pwriteAll(lock.fd, $0, at: 0) }) {
            throw LogError.io("pwrite", path: lock.path, e)
        }
        return lock
    }

    // MARK: - State

    /// State shared by appenders, the writer and readers.
    struct Shared: ~Copyable {
        /// Encoded records appended but not yet taken by the writer.
        var pending: [UInt8] = []
        var pendingBatches: [BatchMark] = []
        var pendingFirstLSN: LSN
        /// The LSN the next appended record gets.
        var nextLSN: LSN
        /// Records below this LSN are written to the operating system (and visible to readers).
        var writtenLSN: LSN
        /// Records below this LSN are on stable storage.
        var durableLSN: LSN
        /// The oldest LSN kept.
        var firstLSN: LSN
        var sealed: [SegmentInfo]
        var active: SegmentInfo
        var waiters: [Waiter] = []
        var spaceWaiters: [UnsafeContinuation<Void, Never>] = []
        /// A writer run is queued or running (enqueuers then do not queue another).
        var runQueued = false
        /// The running writer is blocked on ``WriteAheadLog/wake`` waiting for work.
        var writerWaiting: WriterWait = .no
        var delayedQueued = false
        /// The delayed flush is due: the next round takes the pending records however few
        /// (other rounds without a sync or a waiter wait for a frame's worth, see
        /// ``WriteAheadLog/nextRound``).
        var flushRequested = false
        /// An ``Durability/interval(_:)`` sync is scheduled.
        var syncTimerQueued = false
        var syncRequested = false
        var failure: LogError?
        var closed = false
        var statistics = LogStatistics()

        init(nextLSN: LSN, firstLSN: LSN, sealed: [SegmentInfo], active: SegmentInfo) {
            self.nextLSN = nextLSN
            self.pendingFirstLSN = nextLSN
            self.writtenLSN = nextLSN
            self.durableLSN = nextLSN
            self.firstLSN = firstLSN
            self.sealed = sealed
            self.active = active
        }

        var segments: [SegmentInfo] { sealed + [active] }
    }

    /// What the writer, blocked on ``WriteAheadLog/wake``, waits for.
    enum WriterWait: Equatable {
        case no
        /// This many durability waiters (appenders in flight), so that one sync serves them all.
        case gather(Int)
    }

    struct BatchMark {
        /// Offset just past the batch's last byte in the pending buffer.
        var end: Int
        var count: Int
    }

    /// Someone waiting for records below `target` to be written (or made durable).
    struct Waiter {
        var target: LSN
        var durable: Bool
        var continuation: UnsafeContinuation<Void, any Error>
    }

    /// State only the writer touches.
    struct Writer: ~Copyable {
        var segment: SegmentWriter
        var lock: FileHandle?
        /// The buffer swapped with ``Shared/pending`` each round.
        var taken: [UInt8] = []
        var takenBatches: [BatchMark] = []
        var out: OutputBuffer
        var lastSync = ContinuousClock.now
        /// How long the last `fdatasync` took: the scale for how long to gather appenders.
        var lastSyncDuration: Duration = .microseconds(200)
        var unsynced = false
        var closed = false
        var framesInRound: UInt64 = 0
        var bytesInRound: UInt64 = 0

        init(segment: consuming SegmentWriter, lock: consuming FileHandle, frameTarget: Int) {
            self.segment = segment
            self.lock = .some(lock)
            self.out = OutputBuffer(capacity: 2 * frameTarget + 1024)
        }
    }

    // MARK: - Observing

    /// The LSN the next appended record will get.
    public var nextLSN: LSN { shared.withLock { $0.nextLSN } }
    /// Records below this LSN have been written to the operating system.
    public var writtenLSN: LSN { shared.withLock { $0.writtenLSN } }
    /// Records below this LSN are on stable storage (`fdatasync` returned for them).
    public var durableLSN: LSN { shared.withLock { $0.durableLSN } }
    /// The oldest LSN the log still holds.
    public var firstLSN: LSN { shared.withLock { $0.firstLSN } }
    /// The segments, oldest first; the last is the one being written.
    public var segments: [SegmentInfo] { shared.withLock { $0.segments } }
    /// The bytes of every segment's frames, the one being written included (without copying the
    /// list of segments: cheap enough to ask after every write). The file being written may
    /// hold zeros past them, grown ahead of the writes (see FORMAT.md, *Writing*).
    public var segmentBytes: Int64 { shared.withLock { s in s.sealed.reduce(s.active.size) { $0 + $1.size } } }
    /// The error that stopped the log, if one did.
    public var failure: LogError? { shared.withLock { $0.failure } }
    /// Counters of the writer's work since the log was opened.
    public var statistics: LogStatistics { shared.withLock { $0.statistics } }
}
