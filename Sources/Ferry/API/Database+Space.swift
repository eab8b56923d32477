import FerryLog

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension DatabaseOptions {
    /// The segment size used: at most an eighth of the cache limit, so that eviction frees
    /// space in small steps and "within the limit plus one segment" stays close to the limit.
    var effectiveSegmentSize: Int {
        guard let limit = cacheSizeBytes.limit else { return segmentSize }
        return min(segmentSize, max(64 << 10, limit / 8))
    }
}

extension Database {
    /// Reclaims the log's space: deletes the segments whose local writes the server has all
    /// acknowledged, carrying forward the server data still read from them.
    ///
    /// A segment is compacted only when every local write in it, and in every segment before
    /// it, has been acknowledged (or rejected) by the server: a pending write is never moved
    /// or dropped, and keeps its id. What the segments still hold that reads need — server
    /// data that nothing newer replaced — is restated in new records at the head of the log;
    /// superseded values, acknowledged writes and acknowledgements disappear. The restated
    /// records are made durable and a checkpoint is written before any segment is deleted, so
    /// a crash at any point leaves the same data on the next open.
    ///
    /// Writes and reads go on while it runs (it holds the database's lock only in short steps).
    /// The database compacts by itself after acknowledgements (see
    /// ``DatabaseOptions/compactionSegments``); call this to compact now. A memory-only
    /// database has nothing to compact.
    @discardableResult
    public func compact() async throws -> CompactionReport {
        try await compactAfterOtherJobs()
    }

    // MARK: Statistics

    /// What the store holds and how it uses its space: bytes on disk (segments, checkpoint),
    /// segments, the cache limit and by how much what must be kept exceeds it, pending writes
    /// (count, bytes, age of the oldest), rejected writes, cached paths, pins, and the last
    /// compaction and eviction. The same as `ferry-dump stats` shows for a closed store.
    public var statistics: StoreStatistics {
        var s = StoreStatistics()
        if let log {
            let segments = log.segments
            s.segments = segments.count
            s.segmentBytes = segments.reduce(0) { $0 + $1.size }
            s.checkpointBytes = checkpointBytes(log)
        }
        s.cacheLimit = options.cacheSizeBytes.limit
        maintenance.accounting.withLock { st in
            s.lastCompaction = st.lastCompaction
            s.lastEviction = st.lastEviction
        }
        if let limit = s.cacheLimit, log != nil { s.overLimitBytes = max(0, s.bytesOnDisk - Int64(limit)) }
        withEngine { e in e.fillStatistics(&s) }
        return s
    }

    // MARK: Housekeeping

    /// Waits until the server has answered (acknowledged or rejected) every local write made
    /// before the call. Rejections do not make it throw (see ``rejectedWrites()``).
    ///
    /// - Throws: ``DatabaseError/Code/closed`` if the database closes first;
    ///   ``DatabaseError/Code/storage`` if it fails.
    public func waitForPendingWrites() async throws {
        let ids = withEngine { Array($0.writeTree.pending.ids) }
        for id in ids {
            do {
                try await WriteReceipt(database: self, writeID: id).serverAcknowledgement()
            } catch let e as DatabaseError where e.code == .writeRejected {
                continue
            }
        }
    }

    /// Deletes the store at `path` — log, checkpoints, everything the database wrote there —
    /// leaving an empty directory (Firestore's `clearPersistence`).
    ///
    /// Refused while the store is open (here or in another process), and, unless `force`,
    /// while it holds local writes the server has not acknowledged (they would be lost). A
    /// directory that holds no store is left alone.
    ///
    /// - Throws: ``DatabaseError/Code/failedPrecondition`` naming the pending writes;
    ///   ``DatabaseError/Code/storage`` when the store is in use or cannot be read or deleted.
    public static func clearPersistence(at path: String, force: Bool = false) async throws {
        let names = try listDirectory(path)
        guard names.contains(where: { $0.hasSuffix(".wal") }) else { return }
        var o = DatabaseOptions()
        o.checkpointOnClose = false
        o.cacheSizeBytes = .unlimited
        o.compactionSegments = nil
        o.checkpointPolicy = nil
        let db = try Database.open(at: path, options: o)
        let pending = db.pendingWriteCount
        if pending > 0 && !force {
            try await db.close()
            throw DatabaseError(.failedPrecondition,
                "the store at \(path) holds \(pending) local write(s) the server has not acknowledged; clearing it would lose them (pass force: true to clear anyway)")
        }
        try await db.close()
        for name in try listDirectory(path) where isStoreFile(name) {
            let full = path + "/" + name
            if unlink(full) != 0 && errno != ENOENT {
                if errno == EISDIR || errno == EPERM { removeTree(full); continue }
                throw DatabaseError(.storage, "clearing the store: cannot delete \(full): errno \(errno)")
            }
        }
    }

    private static func isStoreFile(_ name: String) -> Bool {
        name.hasSuffix(".wal") || name.hasSuffix(".tmp") || name.hasPrefix(Checkpoint.prefix) || name == "log-start"
            || name == "LOCK" || name == "damaged"
    }
}
