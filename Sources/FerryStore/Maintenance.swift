import FerryLog

/// The one owner of a database's upkeep: checkpoints, compaction and eviction.
///
/// It holds the three things they share, and nothing else holds them:
/// - **the lock** they run under (``run(_:)``): one job at a time, in the order asked, so that
///   a checkpoint taken before a compaction is never written after it, and ``Database/close()``
///   waits for the job under way (a job that runs after the close finds the database closed
///   and does nothing);
/// - **the schedule** (``schedule(_:_:)``): at most one background job of each kind waiting
///   or running; a fact that finds its job already scheduled adds nothing;
/// - **the accounting** (``accounting``): the checkpoint's size, the last compaction and
///   eviction, the frontier an eviction found futile, a memory-only store's received bytes.
///
/// The database tells it facts — a write was made, the server's data arrived, the server
/// answered writes (the tree database's `noted…` functions, in `Ferry`'s `Maintenance/Space.swift`) — and they decide what
/// is due. The API types (`DatabaseReference`, `DatabaseQuery`) never start upkeep. A writer
/// waits for an eviction only when the store is over its limit; below it, eviction runs
/// beside the writers.
package final class Maintenance: Sendable {
    /// A kind of background job.
    package enum Job: Sendable, Hashable {
        case checkpoint, compaction, eviction
    }

    /// What the upkeep knows of the store's space and its last runs.
    package struct Accounting {
        /// The newest checkpoint file's size (nil: not looked up yet).
        package var checkpointBytes: Int64?
        package var lastCompaction: MaintenanceRun?
        package var lastEviction: MaintenanceRun?
        /// The oldest pending write's id when an eviction last found no segment it could
        /// drop (every one holds that write or a later one): until it is answered, nothing
        /// becomes evictable, and writes over the limit need not try again.
        package var futileFrontier: Int64?
        /// A memory-only store: bytes of server data received since its last eviction.
        package var memoryBytes = 0
    }

    package init() {}

    package let accounting = FerryMutex(Accounting())
    private let serial = FerryMutex<(busy: Bool, waiters: [UnsafeContinuation<Void, Never>])>((false, []))
    private let scheduled = FerryMutex<Set<Job>>([])

    /// Runs `body` as the only job under way, after those asked before it.
    package func run<T>(_ body: () async throws -> T) async rethrows -> T {
        await withUnsafeContinuation { (c: UnsafeContinuation<Void, Never>) in
            let now = serial.withLock { s -> Bool in
                if s.busy { s.waiters.append(c); return false }
                s.busy = true
                return true
            }
            if now { c.resume() }
        }
        defer {
            let next = serial.withLock { s -> UnsafeContinuation<Void, Never>? in
                if s.waiters.isEmpty { s.busy = false; return nil }
                return s.waiters.removeFirst()
            }
            next?.resume()
        }
        return try await body()
    }

    /// Starts `work` in the background unless a job of that kind is scheduled already (then
    /// it does nothing). `work` takes the lock itself (``run(_:)``) for what must be
    /// serialized; it may return a follow-up, called once its job is no longer scheduled
    /// (a compaction that freed segments checks again whether another is due).
    package func schedule(_ job: Job, _ work: @escaping @Sendable () async -> (@Sendable () -> Void)?) {
        guard scheduled.withLock({ $0.insert(job).inserted }) else { return }
        Task {
            let then = await work()
            scheduled.withLock { _ = $0.remove(job) }
            then?()
        }
    }
}

/// One compaction or eviction, as ``StoreStatistics`` reports it.
public struct MaintenanceRun: Sendable, Equatable, Codable {
    /// When it ended, in milliseconds since 1970.
    public var endedAt: Int64
    /// Bytes of the log's segment files it freed (net of what it restated).
    public var bytesFreed: Int64
    /// How long it took, in seconds.
    public var seconds: Double
    /// Segment files it deleted.
    public var segmentsDeleted: Int
    /// Server-cache entries it carried forward (restated).
    public var entriesKept: Int
    /// Server-cache entries it dropped (an eviction's "not cached" data; 0 for a compaction).
    public var entriesEvicted: Int

    package init(bytesFreed: Int64, duration: Duration, segmentsDeleted: Int, entriesKept: Int, entriesEvicted: Int = 0) {
        endedAt = wallClockMillis()
        self.bytesFreed = bytesFreed
        let c = duration.components
        seconds = Double(c.seconds) + Double(c.attoseconds) / 1e18
        self.segmentsDeleted = segmentsDeleted
        self.entriesKept = entriesKept
        self.entriesEvicted = entriesEvicted
    }
}
