extension WriteAheadLog {
    /// What ``rewriteForward(before:_:)`` did.
    public struct Rewrite: Sendable {
        /// The LSNs the kept records got at the head of the log (nil if none were kept).
        public var appended: ClosedRange<LSN>?
        /// The segment files deleted.
        public var deletedSegments: [String]
    }

    /// Deletes every sealed segment whose records all lie below `lsn`. The segment being written
    /// is never deleted, so LSNs keep counting from where they were.
    ///
    /// Crash-safe: the new start of the log is recorded (atomically) before any file is removed,
    /// and an open finishes a deletion a crash interrupted.
    ///
    /// - Returns: the names of the deleted segment files, oldest first.
    /// - Throws: ``LogError`` — ``LogError/Code/failed`` if the log has failed, or if writing the
    ///   new start or deleting a file fails: that stops the log, as a failed append does (an open
    ///   then finishes the deletion); ``LogError/Code/closed``.
    @discardableResult
    public func deleteSegments(before lsn: LSN) async throws -> [String] {
        try await onWriter { w in try self.deleteSegmentsLocked(before: lsn, &w) }
    }

    /// Moves records out of the segments that lie wholly below `lsn` so those segments can be
    /// deleted: `keep` sees each of their records and appends what should survive (the same
    /// bytes, or a rewritten form) to the batch it is given. The kept records are appended at the
    /// head of the log and made durable, and only then are the old segments deleted.
    ///
    /// This is the seam compaction and cache eviction use. A crash between the append and the
    /// deletion leaves both copies; readers of the log must treat a forwarded record as a
    /// restatement, not a new event.
    ///
    /// - Throws: what `keep` throws (nothing was appended or deleted); ``LogError`` as
    ///   ``append(_:)`` and ``deleteSegments(before:)`` throw — a failed step stops the log.
    public func rewriteForward(before lsn: LSN, _ keep: (RecordView, inout LogBatch) throws -> Void) async throws -> Rewrite {
        let (victims, first) = shared.withLock { s in (s.sealed.filter { $0.nextLSN <= lsn }, s.firstLSN) }
        guard let last = victims.last else { return Rewrite(appended: nil, deletedSegments: []) }
        // Batches of at most half a frame body, so each fits a frame with room to spare.
        var batches = [LogBatch()]
        _ = try SegmentReading.read(directory, segments: victims, from: first, through: last.nextLSN - 1) { r in
            try keep(r, &batches[batches.count - 1])
            if batches[batches.count - 1].encodedSize >= LogFormat.maxFrameBody / 2 { batches.append(LogBatch()) }
        }
        var appended: ClosedRange<LSN>?
        for b in batches where !b.isEmpty {
            let r = try await append(b)
            appended = (appended?.lowerBound ?? r.lowerBound)...r.upperBound
        }
        try await sync()
        let deleted = try await deleteSegments(before: last.nextLSN)
        return Rewrite(appended: appended, deletedSegments: deleted)
    }

    private func deleteSegmentsLocked(before lsn: LSN, _ w: inout Writer) throws -> [String] {
        let (victims, keptFirst) = shared.withLock { s -> ([SegmentInfo], SegmentInfo) in
            let victims = s.sealed.filter { $0.nextLSN <= lsn }
            let kept = s.sealed.first { $0.nextLSN > lsn } ?? s.active
            return (victims, kept)
        }
        guard !victims.isEmpty else { return [] }
        let marker = StartMarker(storeID: storeID, seq: keptFirst.seq, firstLSN: keptFirst.firstLSN)
        try directory.createAtomically(LogFormat.startFileName, contents: marker.bytes)
        CrashPoint.hit("compaction.afterLogStart")
        shared.withLock { s in
            s.sealed.removeFirst(victims.count)
            s.firstLSN = keptFirst.firstLSN
        }
        let names = victims.map(\.name)
        recordCache.withLock { cache in for v in victims { cache.drop(v.name, seq: v.seq) } }
        try directory.remove(names, crashPointBetween: "compaction.betweenDeletions")
        logger.debug("deleted \(names.count) segment(s) before LSN \(lsn)")
        return names
    }

    /// Runs `body`, a step that changes the store's files, on the writer, after the writes
    /// queued before it, under the fail-stop rule (``changingFiles(_:)``): a failed log refuses
    /// it, and if it fails, the log stops.
    func onWriter<T: Sendable>(_ body: @escaping @Sendable (inout Writer) throws -> T) async throws -> T {
        if let f = failure { throw f }
        return try await withUnsafeThrowingContinuation { (c: UnsafeContinuation<T, any Error>) in
            queue.async {
                let result = Result { try self.writer.withLock { w -> T in
                    if w.closed { throw LogError(.closed, "the log is closed", file: self.path) }
                    return try self.changingFiles { try body(&w) }
                } }
                c.resume(with: result)
            }
        }
    }
}

extension WriteAheadLog {
    /// Seals the segment being written, if it holds any record, and starts a new one — so that
    /// everything appended before the call lies in sealed segments, which
    /// ``deleteSegments(before:)`` and ``rewriteForward(before:_:)`` can reach.
    ///
    /// - Returns: the LSN the new segment starts at (everything below it is sealed), or nil
    ///   when the segment being written was empty and nothing was done.
    /// - Throws: ``LogError`` — ``LogError/Code/failed`` if the log has failed, or if writing the
    ///   seal, its `fdatasync` or creating the next segment fails: that stops the log, and
    ///   nothing is ever written after the seal; ``LogError/Code/closed``.
    @discardableResult
    public func roll() async throws -> LSN? {
        try await flush()
        return try await onWriter { w in try self.rollLocked(&w) }
    }
}
