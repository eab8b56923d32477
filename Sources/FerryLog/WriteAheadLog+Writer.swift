import Dispatch

/// The serial writer: runs on the log's queue, one round at a time. A round takes every batch
/// waiting (once there is a frame's worth, or someone asks: see `nextRound`), packs them into
/// frames (at batch boundaries, so a batch never spans two frames), writes the frames with as
/// few `pwrite` calls as possible (into space grown ahead of them, see ``SegmentWriter``), rolls
/// segments, syncs per the durability mode, publishes the new end to readers and resumes the
/// appenders it satisfied.
extension WriteAheadLog {
    private struct Round {
        var firstLSN: LSN
        var records: UInt64
        var sync: Bool
        var spaceWaiters: [UnsafeContinuation<Void, Never>]
    }

    /// Bytes of frames the writer collects before it calls `write`.
    private static let writeChunk = 1 << 20

    /// The delayed flush of ``Durability/none`` and ``Durability/interval(_:)`` appends.
    func runDelayed() {
        let start = shared.withLock { s -> WriterStart in
            s.delayedQueued = false
            s.flushRequested = true
            return claimRun(&s, urgent: true)
        }
        if case .schedule = start { runWriter() } else { startWriter(start) }
    }

    /// The periodic sync of ``Durability/interval(_:)``.
    func runSyncTimer() {
        let start = shared.withLock { s -> WriterStart in
            s.syncTimerQueued = false
            s.syncRequested = true
            return claimRun(&s, urgent: true)
        }
        if case .schedule = start { runWriter() } else { startWriter(start) }
    }

    /// The background writer: rounds until there is no work (gathering appenders where that
    /// pays, see ``nextRound(_:inFlight:)``).
    func runWriter() {
        writer.withLock { w in
            var inFlight = 0
            while let round = nextRound(&w, inFlight: inFlight) {
                guard let answered = perform(round, &w) else { return }
                inFlight = answered
            }
        }
    }

    /// Writes a round; returns how many appenders are in flight, or nil if the log failed.
    private func perform(_ round: Round, _ w: inout Writer) -> Int? {
        for c in round.spaceWaiters { c.resume() }
        return try? changingFiles { try write(round, &w) }
    }

    private enum Next {
        case round(Round)
        case wait(Duration)
        /// Nothing to do; `armFlush`: records are left pending (fewer than a frame's worth,
        /// nobody waiting), so the delayed flush must be queued for them.
        case stop(armFlush: Bool)
    }

    /// The next round of work. With `inFlight` > 1 appenders waiting for durability (or just
    /// answered, and likely to be back within microseconds), it first waits until they are all
    /// waiting, or one `fdatasync`'s time has passed, so that one sync serves them all.
    /// Returns nil (with `runQueued` cleared) when there is nothing to do.
    ///
    /// Pending records with no sync, flush or durability waiting on them make a round only
    /// once they fill a frame (``LogOptions/frameTargetSize``); fewer wait for the delayed
    /// flush. (A writer that took whatever was pending, round after round, while a caller
    /// appended in a loop wrote frames of ~8 KB, ~40 records, and a `pwrite` each; a frame's
    /// worth compresses better and costs the writer a round per 64 KB.)
    private func nextRound(_ w: inout Writer, inFlight: Int) -> Round? {
        var gathered = inFlight < 2
        let gatherFor = min(max(w.lastSyncDuration, .microseconds(20)), .milliseconds(2))
        while true {
            let next = shared.withLock { s -> Next in
                guard s.failure == nil, !w.closed else {
                    s.runQueued = false
                    return .stop(armFlush: false)
                }
                let urgent = s.flushRequested || s.syncRequested || !s.waiters.isEmpty || !s.spaceWaiters.isEmpty
                    || options.durability.mode == .fsync
                let hasWork = (!s.pending.isEmpty && (urgent || s.pending.count >= options.frameTargetSize))
                    || (s.syncRequested && (w.unsynced || !s.waiters.isEmpty))
                if hasWork && !gathered && s.waiters.count < inFlight && !s.syncRequested {
                    gathered = true
                    s.writerWaiting = .gather(inFlight)
                    return .wait(gatherFor)
                }
                if hasWork { return .round(takeRound(&s, &w)) }
                s.syncRequested = false
                s.runQueued = false
                let armFlush = !s.pending.isEmpty && !s.delayedQueued
                if armFlush { s.delayedQueued = true }
                return .stop(armFlush: armFlush)
            }
            switch next {
            case .round(let r): return r
            case .stop(let armFlush):
                if armFlush { queue.asyncAfter(deadline: .now() + options.flushDelay.dispatchInterval) { self.runDelayed() } }
                return nil
            case .wait(let d):
                if wake.wait(timeout: .now() + d.dispatchInterval) == .timedOut {
                    // An enqueuer that cleared `writerWaiting` has signalled (or is about to):
                    // take that signal so the semaphore stays balanced.
                    let signalled = shared.withLock { s in
                        defer { s.writerWaiting = .no }
                        return s.writerWaiting == .no
                    }
                    if signalled { wake.wait() }
                }
            }
        }
    }

    private func takeRound(_ s: inout Shared, _ w: inout Writer) -> Round {
        let intervalDue: Bool
        if case .interval(let period) = options.durability.mode {
            intervalDue = w.lastSync.duration(to: .now) >= period
        } else {
            intervalDue = false
        }
        let hasData = !s.pending.isEmpty
        let sync = s.syncRequested && (hasData || w.unsynced || !s.waiters.isEmpty)
        w.taken.removeAll(keepingCapacity: true)
        w.takenBatches.removeAll(keepingCapacity: true)
        swap(&s.pending, &w.taken)
        swap(&s.pendingBatches, &w.takenBatches)
        let first = s.pendingFirstLSN
        s.pendingFirstLSN = s.nextLSN
        s.syncRequested = false
        s.flushRequested = false
        let space = s.spaceWaiters
        s.spaceWaiters.removeAll()
        let fsyncMode = options.durability.mode == .fsync
        return Round(firstLSN: first, records: s.nextLSN.rawValue - first.rawValue,
                     sync: sync || (hasData && fsyncMode) || ((hasData || w.unsynced) && intervalDue),
                     spaceWaiters: space)
    }

    /// Writes a round; returns how many appenders are in flight after it (see ``publish``).
    private func write(_ round: Round, _ w: inout Writer) throws -> Int {
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
                    // A frame ends once it holds `target` bytes — unless less than half that
                    // would be left for the round's last frame, which then joins this one.
                    let full = mark.end - frameStart >= target && all.count - mark.end >= target / 2
                    if full || i == batches.count - 1 {
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
            let start = ContinuousClock.now
            try w.segment.sync(system)
            w.lastSync = .now
            w.lastSyncDuration = start.duration(to: w.lastSync)
            w.unsynced = false
        }
        let answered = publish(written: lsn, durable: round.sync || !w.unsynced, round: round, synced: round.sync, &w)
        let armTimer = w.unsynced && shared.withLock { s in
            defer { s.syncTimerQueued = true }
            return !s.syncTimerQueued
        }
        if case .interval(let period) = options.durability.mode, armTimer {
            let due = period - w.lastSync.duration(to: .now)
            queue.asyncAfter(deadline: .now() + max(due, .zero).dispatchInterval) { self.runSyncTimer() }
        }
        return answered
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
        w.framesInRound += 1
        FrameEncoder.appendDataFrame(records: records, firstLSN: firstLSN, count: count, to: &w.out)
        if w.out.count >= Self.writeChunk { try writeOut(&w) }
    }

    private func writeOut(_ w: inout Writer) throws {
        guard w.out.count > 0 else { return }
        try w.segment.write(w.out.bytes, system: system)
        w.bytesInRound += UInt64(w.out.count)
        w.out.removeAll()
    }

    /// Seals the segment being written if it holds records written so far (see
    /// ``WriteAheadLog/roll()``); returns where the new one starts.
    func rollLocked(_ w: inout Writer) throws -> LSN? {
        let written = shared.withLock { $0.writtenLSN }
        guard written > w.segment.firstLSN else { return nil }
        try roll(nextLSN: written, &w)
        return written
    }

    /// Seals the current segment (seal frame, `fdatasync`) and starts the next one. The old
    /// segment is durable and sealed before the new one exists, so a segment that is not the
    /// newest is always complete.
    ///
    /// Every step can fail; the caller runs it under ``changingFiles(_:)``, so a failure stops
    /// the log and nothing is ever written after the seal. The writer's segment and the
    /// readers' list of segments change only once all the steps succeeded.
    private func roll(nextLSN: LSN, _ w: inout Writer) throws {
        FrameEncoder.appendHeaderOnlyFrame(.seal(nextLSN: nextLSN), to: &w.out)
        try writeOut(&w)
        try w.segment.trimPreallocation(system)
        CrashPoint.hit("roll.afterSeal")
        try w.segment.sync(system)
        CrashPoint.hit("roll.afterSealSync")
        let sealed = w.segment.info(nextLSN: nextLSN, sealed: true)
        let created = options.fixedCreationTime ?? wallClockNanos()
        let next = try SegmentWriter.create(in: directory, storeID: storeID, seq: w.segment.seq + 1,
                                            firstLSN: nextLSN, createdNanos: created, sizeLimit: options.segmentSize)
        w.segment = next
        CrashPoint.hit("roll.afterCreate")
        let active = w.segment.info(nextLSN: nextLSN)
        shared.withLock { s in
            s.sealed.append(sealed)
            s.active = active
            s.statistics.rolls += 1
            s.statistics.syncs += 1
        }
    }

    /// Makes records below `written` visible to readers and resumes the waiters now satisfied.
    /// Returns how many appenders are in flight (0 if none waiting for durability was answered).
    private func publish(written: LSN, durable: Bool, round: Round, synced: Bool, _ w: inout Writer) -> Int {
        let frames = w.framesInRound, bytes = w.bytesInRound
        w.framesInRound = 0
        w.bytesInRound = 0
        let active = w.segment.info(nextLSN: written)
        let (ready, inFlight) = shared.withLock { s -> ([UnsafeContinuation<Void, any Error>], Int) in
            s.writtenLSN = written
            if durable { s.durableLSN = written }
            s.active = active
            s.statistics.records += round.records
            s.statistics.rounds += 1
            s.statistics.frames += frames
            s.statistics.bytesWritten += bytes
            if synced { s.statistics.syncs += 1 }
            var ready: [UnsafeContinuation<Void, any Error>] = []
            var durableCount = 0
            s.waiters.removeAll { waiter in
                let done = waiter.target <= (waiter.durable ? s.durableLSN : s.writtenLSN)
                if done {
                    ready.append(waiter.continuation)
                    if waiter.durable { durableCount += 1 }
                }
                return done
            }
            // Appenders in flight: those just answered (who may come back) plus those already
            // waiting — counted now, before any answered one can come back and be counted twice.
            return (ready, durableCount == 0 ? 0 : durableCount + s.waiters.count { $0.durable })
        }
        for c in ready { c.resume() }
        return inFlight
    }
}
