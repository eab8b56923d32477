import Dispatch

extension WriteAheadLog {
    /// Appends a batch of records atomically: after a crash, all of them are in the log or none.
    ///
    /// The records get contiguous LSNs, returned. With ``Durability/fsync`` the call returns
    /// only after `fdatasync` made the batch durable (concurrent appenders share one sync);
    /// with ``Durability/interval(_:)`` or ``Durability/none`` it returns once the log has taken
    /// the batch — call ``sync()`` to wait for durability. It waits (without blocking a thread)
    /// while more than ``LogOptions/maxPendingBytes`` wait to be written.
    ///
    /// - Throws: ``LogError`` — ``LogError/Code/invalidArgument`` for an empty or oversized
    ///   batch (nothing is appended), ``LogError/Code/failed`` after a write or sync failure (the
    ///   batch may or may not be in the log after a reopen), ``LogError/Code/closed``.
    @discardableResult
    public func append(_ batch: LogBatch) async throws -> ClosedRange<LSN> {
        if let problem = batch.problem { throw LogError(.invalidArgument, problem) }
        if options.durability.mode == .fsync {
            // The writer thread does the I/O and resumes us; no thread of Swift's cooperative
            // pool is ever held in a write or fdatasync. Appenders waiting at the same time
            // share one sync (the writer gathers them, see WriteAheadLog+Writer.swift).
            let range = try enqueue(batch)
            try await waitUntilDurable(range.upperBound + 1)
            return range
        }
        while true {
            let outcome = shared.withLock { s -> Enqueued in
                if let refusal = refusal(s) { return .refused(refusal) }
                if !s.pending.isEmpty && s.pending.count + batch.encodedSize > options.maxPendingBytes { return .full }
                let range = enqueue(batch, &s)
                if s.pending.count >= options.frameTargetSize { return .accepted(range, claimRun(&s)) }
                if !s.runQueued && !s.delayedQueued {
                    s.delayedQueued = true
                    return .acceptedDelayed(range)
                }
                return .accepted(range, .nothing)
            }
            switch outcome {
            case .refused(let e): throw e
            case .accepted(let range, let start):
                startWriter(start)
                return range
            case .acceptedDelayed(let range):
                queue.asyncAfter(deadline: .now() + options.flushDelay.dispatchInterval) { self.runDelayed() }
                return range
            case .full:
                await withUnsafeContinuation { (c: UnsafeContinuation<Void, Never>) in
                    let wait = shared.withLock { s -> (wait: Bool, start: WriterStart) in
                        guard s.failure == nil, !s.pending.isEmpty else { return (false, .nothing) }
                        s.spaceWaiters.append(c)
                        return (true, claimRun(&s, urgent: true))
                    }
                    startWriter(wait.start)
                    if !wait.wait { c.resume() }
                }
            }
        }
    }

    /// Takes a batch into the log without waiting: it gets its LSNs at once, and is written
    /// (and synced, per the durability mode) in the background. Pair it with
    /// ``awaitDurability(of:)``: the two together are ``append(_:)``, split so that a caller
    /// can order its own state by LSN under its own lock and wait outside it.
    ///
    /// Unlike ``append(_:)`` it never waits for room: it is for callers that bound their own
    /// pending data.
    ///
    /// - Throws: ``LogError`` as ``append(_:)`` does, at once.
    public func enqueue(_ batch: LogBatch) throws -> ClosedRange<LSN> {
        if let problem = batch.problem { throw LogError(.invalidArgument, problem) }
        let (range, start, delayed) = try shared.withLock { s -> (ClosedRange<LSN>, WriterStart, Bool) in
            if let refusal = refusal(s) { throw refusal }
            let range = enqueue(batch, &s)
            if options.durability.mode == .fsync || s.pending.count >= options.frameTargetSize {
                return (range, claimRun(&s), false)
            }
            if !s.runQueued && !s.delayedQueued {
                s.delayedQueued = true
                return (range, .nothing, true)
            }
            return (range, .nothing, false)
        }
        startWriter(start)
        if delayed { queue.asyncAfter(deadline: .now() + options.flushDelay.dispatchInterval) { self.runDelayed() } }
        return range
    }

    /// Waits until the records in `range` are acknowledged per the durability mode: durable
    /// (`fdatasync`) with ``Durability/fsync``; at once with the other modes.
    public func awaitDurability(of range: ClosedRange<LSN>) async throws {
        guard options.durability.mode == .fsync else {
            if let f = failure { throw f }
            return
        }
        try await waitUntilDurable(range.upperBound + 1)
    }

    /// Waits until every record appended before the call has been written to the operating
    /// system (it then survives a crash of this process, but not of the machine).
    public func flush() async throws {
        try await wait(durable: false)
    }

    /// Waits until every record appended before the call is on stable storage (`fdatasync`).
    public func sync() async throws {
        try await wait(durable: true)
    }

    /// Stops the log: waits for every appended record to be durable, then releases the store.
    /// Later appends throw ``LogError/Code/closed``. Calling it again does nothing.
    ///
    /// - Throws: the error that stopped the log, if it is failed.
    public func close() async throws {
        let wasClosed = shared.withLock { s in
            defer { s.closed = true }
            return s.closed
        }
        if wasClosed { return }
        var failure: (any Error)?
        do { try await wait(durable: true) } catch { failure = error }
        let failed = failure != nil
        let trimmed = await withUnsafeContinuation { (c: UnsafeContinuation<LogError?, Never>) in
            queue.async {
                let error = self.writer.withLock { w -> LogError? in
                    defer {
                        w.closed = true
                        w.lock = nil  // releases the flock
                    }
                    // The zeros grown ahead of the writes go: a store closed cleanly holds its
                    // frames only. (Records are durable by now; a failure still stops the log.)
                    guard !failed, !w.closed else { return nil }
                    do {
                        try self.changingFiles {
                            if try w.segment.trimPreallocation(self.system) { try w.segment.sync(self.system) }
                        }
                        return nil
                    } catch {
                        return error as? LogError
                    }
                }
                c.resume(returning: error)
            }
        }
        if failure == nil, let trimmed { failure = trimmed }
        if let failure { throw failure }
    }

    // MARK: - Internals of appending

    private enum Enqueued {
        case accepted(ClosedRange<LSN>, WriterStart)
        case acceptedDelayed(ClosedRange<LSN>)
        case refused(LogError)
        case full
    }

    private func refusal(_ s: borrowing Shared) -> LogError? {
        if let f = s.failure { return f }
        if s.closed { return LogError(.closed, "the log is closed", file: path) }
        return nil
    }

    private func enqueue(_ batch: LogBatch, _ s: inout Shared) -> ClosedRange<LSN> {
        if s.pending.capacity == 0 { s.pending.reserveCapacity(2 * options.frameTargetSize) }
        batch.bytes.withUnsafeBytes { s.pending.append(contentsOf: $0) }
        s.pendingBatches.append(BatchMark(end: s.pending.count, count: batch.count))
        let first = s.nextLSN
        s.nextLSN = first + UInt64(batch.count)
        return first...(s.nextLSN - 1)
    }

    enum WriterStart {
        case nothing
        /// Queue a writer run.
        case schedule
        /// Wake the writer that waits for work.
        case signal
    }

    /// Decides, under the lock, how work just added reaches the writer. `urgent` work (a sync
    /// or flush someone waits for, a full buffer) ends a gather early.
    func claimRun(_ s: inout Shared, urgent: Bool = false) -> WriterStart {
        switch s.writerWaiting {
        case .gather(let target):
            guard urgent || s.waiters.count >= target else { return .nothing }
            s.writerWaiting = .no
            return .signal
        case .no:
            if s.runQueued { return .nothing }
            s.runQueued = true
            return .schedule
        }
    }

    func startWriter(_ start: WriterStart) {
        switch start {
        case .nothing: break
        case .schedule: queue.async { self.runWriter() }
        case .signal: wake.signal()
        }
    }

    /// Returns once records below `target` are durable (at once if they are).
    private func waitUntilDurable(_ target: LSN) async throws {
        if let done = shared.withLock({ s -> Result<Void, LogError>? in
            if s.durableLSN >= target { return .success(()) }
            if let f = s.failure { return .failure(f) }
            return nil
        }) {
            return try done.get()
        }
        try await withUnsafeThrowingContinuation { (c: UnsafeContinuation<Void, any Error>) in
            let outcome = shared.withLock { s -> (Result<Void, LogError>?, WriterStart) in
                if s.durableLSN >= target { return (.success(()), .nothing) }
                if let f = s.failure { return (.failure(f), .nothing) }
                s.waiters.append(Waiter(target: target, durable: true, continuation: c))
                // In .fsync mode every round syncs; otherwise ask for one, now.
                let explicit = options.durability.mode != .fsync
                if explicit { s.syncRequested = true }
                return (nil, claimRun(&s, urgent: explicit))
            }
            startWriter(outcome.1)
            if let r = outcome.0 { c.resume(with: r.mapError { $0 as any Error }) }
        }
    }

    private func wait(durable: Bool) async throws {
        let target = try shared.withLock { s -> LSN in
            if let f = s.failure { throw f }
            return s.nextLSN
        }
        if durable { return try await waitUntilDurable(target) }
        try await withUnsafeThrowingContinuation { (c: UnsafeContinuation<Void, any Error>) in
            let outcome = shared.withLock { s -> (Result<Void, LogError>?, WriterStart) in
                if s.writtenLSN >= target { return (.success(()), .nothing) }
                if let f = s.failure { return (.failure(f), .nothing) }
                s.waiters.append(Waiter(target: target, durable: false, continuation: c))
                return (nil, claimRun(&s, urgent: true))
            }
            startWriter(outcome.1)
            if let r = outcome.0 { c.resume(with: r.mapError { $0 as any Error }) }
        }
    }
}

extension Duration {
    var dispatchInterval: DispatchTimeInterval {
        let (s, atto) = components
        return .nanoseconds(Int(clamping: s * 1_000_000_000 + atto / 1_000_000_000))
    }
}
