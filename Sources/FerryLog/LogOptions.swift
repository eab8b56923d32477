import Logging

/// When an append counts as done, and how often the log calls `fdatasync`.
public struct Durability: Sendable, Hashable, CustomStringConvertible {
    enum Mode: Hashable, Sendable {
        case fsync
        case interval(Duration)
        case none
    }
    let mode: Mode

    /// An append returns only after `fdatasync` made it durable. Concurrent appenders share
    /// one `fdatasync` (group commit). Survives kill -9 and power loss.
    public static let fsync = Durability(mode: .fsync)

    /// An append returns once the log has taken it; the log writes it to the operating system
    /// once a frame's worth is waiting or within about ``LogOptions/flushDelay``, and calls
    /// `fdatasync` at most once per `period` (and at
    /// least once per period while anything is unsynced). A crash can lose up to a period.
    public static func interval(_ period: Duration) -> Durability { Durability(mode: .interval(period)) }

    /// An append returns once the log has taken it; the log writes it to the operating system
    /// once a frame's worth is waiting or within about ``LogOptions/flushDelay``, and never
    /// calls `fdatasync` on its own (only on a
    /// segment roll, ``WriteAheadLog/sync()`` and ``WriteAheadLog/close()``).
    public static let none = Durability(mode: .none)

    public var description: String {
        switch mode {
        case .fsync: "fsync"
        case .interval(let d): "interval(\(d))"
        case .none: "none"
        }
    }
}

/// What an open does with damage other than a torn tail.
public struct RecoveryMode: Sendable, Hashable, CustomStringConvertible {
    enum Mode: Hashable, Sendable { case strict, salvage }
    let mode: Mode

    /// Refuse to open, with an error naming the file and byte offset. The default.
    public static let strict = RecoveryMode(mode: .strict)

    /// Drop damaged frames and missing segments, keep every intact record, and open. Each lost
    /// LSN range is listed in ``RecoveryReport/salvaged`` and recorded in the log as a hole; the
    /// original of every rewritten segment is kept under `damaged/` in the store directory.
    public static let salvage = RecoveryMode(mode: .salvage)

    public var description: String { mode == .strict ? "strict" : "salvage" }
}

/// How a ``WriteAheadLog`` behaves.
public struct LogOptions: Sendable {
    /// When appends return and how often the log syncs. Default: ``Durability/fsync``.
    public var durability: Durability = .fsync
    /// A segment is sealed and a new one started once it reaches this many bytes. Default 8 MiB;
    /// at least 4 KiB. Small caches want small segments (segments are what compaction and
    /// eviction delete).
    public var segmentSize: Int = 8 << 20
    /// What to do with corruption found when opening. Default: ``RecoveryMode/strict``.
    public var recovery: RecoveryMode = .strict
    /// Batches are packed into frames of at least this many bytes (before compression) when
    /// several are waiting (up to about 1.5 times it: a round's short last frame joins the one
    /// before). With ``Durability/none`` and ``Durability/interval(_:)``, the writer waits for
    /// this many bytes (or ``flushDelay``) unless a sync or flush asks. Default 64 KiB.
    public var frameTargetSize: Int = 64 << 10
    /// With ``Durability/none`` and ``Durability/interval(_:)``: how long appended records may
    /// wait in memory before they are written to the operating system (counted from the
    /// append, or from the end of the writer's round that left them, fewer than a frame's
    /// worth, waiting). Default 5 ms.
    public var flushDelay: Duration = .milliseconds(5)
    /// Appends wait while this many bytes are waiting to be written. Default 16 MiB.
    public var maxPendingBytes: Int = 16 << 20
    /// Where the log reports recoveries and failures.
    public var logger: Logger = Logger(label: "ferry.log")

    /// The system calls the log uses; tests replace single calls to inject faults.
    @_spi(Testing) public var system: SystemCalls = .live
    /// The id a newly created store gets (random when nil); fixtures use a fixed one.
    @_spi(Testing) public var newStoreID: StoreID?
    /// The creation time written into new segment headers (the clock when nil); fixtures fix it.
    @_spi(Testing) public var fixedCreationTime: UInt64?

    /// The defaults: `.fsync`, 8 MiB segments, strict recovery.
    public init() {}

    /// The defaults, with these changed.
    public init(durability: Durability, segmentSize: Int = 8 << 20, recovery: RecoveryMode = .strict) {
        self.durability = durability
        self.segmentSize = segmentSize
        self.recovery = recovery
    }
}

/// What opening a store found and did.
public struct RecoveryReport: Sendable, CustomStringConvertible {
    /// A torn tail that was truncated.
    public struct TornTail: Sendable, Equatable {
        /// The segment's file name.
        /// The segment's file name.
        public var segment: String
        /// Where the torn frame started; the segment now ends here.
        /// Where the damage started.
        public var offset: Int64
        /// How many bytes were cut.
        public var discardedBytes: Int64
        /// What was wrong with the bytes.
        /// What was wrong.
        public var reason: String
    }

    /// Records a salvage open dropped.
    public struct Loss: Sendable, Equatable {
        public var segment: String
        public var offset: Int64
        /// The LSNs lost (empty when only structure — a seal, a header — was rebuilt).
        public var lsns: Range<UInt64>
        public var reason: String
    }

    /// Zeros after the last frame of the newest segment: space the writer grew ahead of its
    /// frames (FORMAT.md, *Writing*) that a crash left uncut. Not
    /// damage — nothing was ever written there — but a sign the log was not closed.
    public struct ZeroTail: Sendable, Equatable {
        public var segment: String
        /// Where the zeros start (the end of the last frame).
        public var offset: Int64
        public var bytes: Int64
        /// Whether the open cut them off (after a sealed segment's seal; the active segment's
        /// are written into).
        public var cut: Bool
    }

    /// True when the store did not exist and was created.
    public var created = false
    /// The torn tail truncated, if there was one.
    public var tornTail: TornTail?
    /// Zeros after the newest segment's last frame, if a crash left them.
    public var zeroTail: ZeroTail?
    /// Everything a salvage open dropped; empty unless ``RecoveryMode/salvage`` was chosen and needed.
    public var salvaged: [Loss] = []
    /// Temporary files left by an interrupted file creation, now removed.
    public var removedTemporaryFiles: [String] = []
    /// Segments whose deletion was interrupted, now finished.
    public var finishedDeletions: [String] = []
    /// The LSN of the oldest record kept.
    public var firstLSN: LSN = .first
    /// The LSN the next append gets.
    public var nextLSN: LSN = .first
    /// Segments in the log after the open.
    public var segmentCount = 0

    /// True when the open found nothing to repair.
    public var isClean: Bool {
        tornTail == nil && zeroTail?.cut != true && salvaged.isEmpty && removedTemporaryFiles.isEmpty && finishedDeletions.isEmpty
    }

    public var description: String {
        var parts = ["\(segmentCount) segment(s), LSN \(firstLSN)..<\(nextLSN)"]
        if created { parts.append("created") }
        if let t = tornTail { parts.append("torn tail truncated in \(t.segment) at \(t.offset) (\(t.discardedBytes) bytes: \(t.reason))") }
        if let z = zeroTail { parts.append("\(z.bytes) bytes of space grown ahead left after the last frame of \(z.segment) at \(z.offset)" + (z.cut ? " (cut)" : "")) }
        for l in salvaged { parts.append("salvage dropped LSN \(l.lsns.lowerBound)..<\(l.lsns.upperBound) in \(l.segment) at \(l.offset): \(l.reason)") }
        if !removedTemporaryFiles.isEmpty { parts.append("removed \(removedTemporaryFiles.joined(separator: ", "))") }
        if !finishedDeletions.isEmpty { parts.append("finished deleting \(finishedDeletions.joined(separator: ", "))") }
        return parts.joined(separator: "; ")
    }
}
