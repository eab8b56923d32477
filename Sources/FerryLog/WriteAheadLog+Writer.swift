import Dispatch

/// The serial writer: runs on the log's queue, one round at a time. A round takes every batch
/// waiting, packs them into frames (at batch boundaries, so a batch never spans two frames),
/// writes the frames with as few `write` calls as possible, rolls segments, syncs per the
/// durability mode, publishes the new end to readers and resumes the appenders it satisfied.
extension WriteAheadLog {
    private struct Round {
        var firstLSN: LSN
        var records: UInt64
        var sync: Bool
        var spaceWaiters: [UnsafeContinuation<Void, Never>]
    }

    /// Bytes of frames the writer collects before it calls `write`.
    private static let writeChunk = 1 << 20

    func runDelayed() {
        shared.withLock { s in
            s.delayedQueued = false
            s.runQueued = true
        }
        runWriter()
    }

    func runSyncTimer() {
        shared.withLock { s in
            s.syncRequested = true
            s.runQueued = true
        }
        writer.withLock { $0.syncTimerQueued = false }
        runWriter()
    }

    func runWriter() {
        writer.withLock { w in
            while let round = takeRound(&w) {
                for c in round.spaceWaiters { c.resume() }
                do {
                    try write(round, &w)
                } catch let error as LogError {
                    fail(error)
                    return
                } catch {
                    fail(LogError(.io, "\(error)"))
                    return
                }
            }
        }
    }

    private func takeRound(_ w: inout Writer) -> Round? {
        let intervalDue: Bool
        if case .interval(let period) = options.durability.mode {
            intervalDue = w.lastSync.duration(to: .now) >= period
        } else {
            intervalDue = false
        }
        let unsynced = w.unsynced
        return shared.withLock { s -> Round? in
            guard s.failure == nil, !w.closed else {
                s.runQueued = false
                return nil
            }
            let hasData = !s.pending.isEmpty
            let sync = s.syncRequested && (hasData || unsynced || !s.waiters.isEmpty)
            guard hasData || sync else {
                s.runQueued = false
                s.syncRequested = false
                return nil
            }
            w.taken.removeAll(keepingCapacity: true)
            w.takenBatches.removeAll(keepingCapacity: true)
            swap(&s.pending, &w.taken)
            swap(&s.pendingBatches, &w.takenBatches)
            let first = s.pendingFirstLSN
            s.pendingFirstLSN = s.nextLSN
            s.syncRequested = false
            let space = s.spaceWaiters
            s.spaceWaiters.removeAll()
            let fsyncMode = options.durability.mode == .fsync
            return Round(firstLSN: first, records: s.nextLSN.rawValue - first.rawValue,
                         sync: sync || (hasData && fsyncMode) || ((hasData || unsynced) && intervalDue),
                         spaceWaiters: space)
        }
    }

    private func write(_ round: Round, _ w: inout Writer) throws {
        var lsn = round.firstLSN
        if round.records > 0 {
            let target = options.frameTargetSize
            let batches = w.takenBatches
            try w.taken.withUnsafeBytes { (all: UnsafeRawBufferPointer) throws in
                var frameStart = 0, frameRecords = 0, previousEnd = 0
                for (i, mark) in batches.enumerated() {
                    if frameRecords > 0 && mark.end - frameStart > LogFormat.maxFrameBody {
                        try emitFrame(UnsafeRawBufferPointer(rebasing: all[frameStart..<previousEnd]), lsn, frameRecords, &w)
                        lsn = lsn + UInt64(frameRecords)
                        frameStart = previousEnd
                        frameRecords = 0
                    }
                    frameRecords += mark.count
                    previousEnd = mark.end
                    if mark.end - frameStart >= target || i == batches.count - 1 {
                        try emitFrame(UnsafeRawBufferPointer(rebasing: all[frameStart..<mark.end]), lsn, frameRecords, &w)
                        lsn = lsn + UInt64(frameRecords)
                        frameStart = mark.end
                        frameRecords = 0
                    }
                }
            }
            try writeOut(&w)
            w.unsynced = true
            if w.taken.capacity > 4 * options.maxPendingBytes { w.taken = [] }
            w.out.shrink(to: 2 * options.frameTargetSize + 1024)
        }
        precondition(lsn == round.firstLSN + round.records, "writer lost track of LSNs")
        if round.sync && w.unsynced {
            try w.segment.sync(system)
            w.unsynced = false
            w.lastSync = .now
        }
        publish(written: lsn, durable: round.sync || !w.unsynced, &w)
        if case .interval(let period) = options.durability.mode, w.unsynced, !w.syncTimerQueued {
            w.syncTimerQueued = true
            let due = period - w.lastSync.duration(to: .now)
            queue.asyncAfter(deadline: .now() + max(due, .zero).dispatchInterval) { self.runSyncTimer() }
        }
    }

    /// Adds one data frame to the output, rolling to a new segment first if this one is full.
    private func emitFrame(_ records: UnsafeRawBufferPointer, _ firstLSN: LSN, _ count: Int, _ w: inout Writer) throws {
        let header = Int64(LogFormat.segmentHeaderSize)
        let end = w.segment.size + Int64(w.out.count)
        // Roll before a frame that could take the segment past its size (a compressed frame is
        // at most a few bytes larger than its records); a lone frame may still exceed it.
        if end > header && end + Int64(records.count + 2 * LogFormat.frameHeaderSize) > Int64(options.segmentSize) {
            try roll(nextLSN: firstLSN, &w)
        }
        w.segment.noteFrame(firstLSN: firstLSN, at: w.segment.size + Int64(w.out.count))
        FrameEncoder.appendDataFrame(records: records, firstLSN: firstLSN, count: count, to: &w.out)
        if w.out.count >= Self.writeChunk { try writeOut(&w) }
    }

    private func writeOut(_ w: inout Writer) throws {
        guard w.out.count > 0 else { return }
        try w.segment.write(w.out.bytes, system: system)
        w.out.removeAll()
    }

    /// Seals the current segment (seal frame, `fdatasync`) and starts the next one. The old
    /// segment is durable and sealed before the new one exists, so a segment that is not the
    /// newest is always complete.
    private func roll(nextLSN: LSN, _ w: inout Writer) throws {
        FrameEncoder.appendHeaderOnlyFrame(.seal(nextLSN: nextLSN), to: &w.out)
        try writeOut(&w)
        try w.segment.sync(system)
        let sealed = SegmentInfo(name: w.segment.name, seq: w.segment.seq, firstLSN: w.segment.firstLSN,
                                 nextLSN: nextLSN, size: w.segment.size, sealed: true, index: w.segment.index)
        let created = options.fixedCreationTime ?? wallClockNanos()
        w.segment = try SegmentWriter.create(in: directory, storeID: storeID, seq: w.segment.seq + 1,
                                             firstLSN: nextLSN, createdNanos: created)
        let active = SegmentInfo(name: w.segment.name, seq: w.segment.seq, firstLSN: nextLSN, nextLSN: nextLSN,
                                 size: w.segment.size, sealed: false, index: [])
        shared.withLock { s in
            s.sealed.append(sealed)
            s.active = active
        }
    }

    /// Makes records below `written` visible to readers and resumes the waiters now satisfied.
    private func publish(written: LSN, durable: Bool, _ w: inout Writer) {
        let active = SegmentInfo(name: w.segment.name, seq: w.segment.seq, firstLSN: w.segment.firstLSN, nextLSN: written,
                                 size: w.segment.size, sealed: false, index: w.segment.index)
        let ready = shared.withLock { s -> [UnsafeContinuation<Void, any Error>] in
            s.writtenLSN = written
            if durable { s.durableLSN = written }
            s.active = active
            var ready: [UnsafeContinuation<Void, any Error>] = []
            s.waiters.removeAll { waiter in
                let done = waiter.target <= (waiter.durable ? s.durableLSN : s.writtenLSN)
                if done { ready.append(waiter.continuation) }
                return done
            }
            return ready
        }
        for c in ready { c.resume() }
    }

    /// Stops the log for good after a write or sync failure: nothing is retried and assumed good.
    private func fail(_ error: LogError) {
        let failure = LogError(.failed,
            "the log stopped after a failed write or sync and accepts no more appends; records not yet acknowledged may be lost, acknowledged ones are safe. Reopen the store to recover. Cause: \(error.message)",
            file: error.file, offset: error.offset, errno: error.errno)
        let (waiters, space) = shared.withLock { s -> ([Waiter], [UnsafeContinuation<Void, Never>]) in
            s.failure = failure
            s.runQueued = false
            defer {
                s.waiters.removeAll()
                s.spaceWaiters.removeAll()
                s.pending = []
                s.pendingBatches = []
            }
            return (s.waiters, s.spaceWaiters)
        }
        logger.error("\(failure)")
        for w in waiters { w.continuation.resume(throwing: failure) }
        for c in space { c.resume() }
    }
}
