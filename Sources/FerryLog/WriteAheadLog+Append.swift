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
            var assigned: ClosedRange<LSN>?
            try await withUnsafeThrowingContinuation { (c: UnsafeContinuation<Void, any Error>) in
                let outcome = shared.withLock { s -> Enqueued in
                    if let refusal = refusal(s) { return .refused(refusal) }
                    let range = enqueue(batch, &s)
                    s.waiters.append(Waiter(target: range.upperBound + 1, durable: true, continuation: c))
                    return .accepted(range, runNow: claimRun(&s))
                }
                switch outcome {
                case .refused(let e): c.resume(throwing: e)
                case .accepted(let range, let runNow):
                    assigned = range
                    if runNow { queue.async { self.runWriter() } }
                case .acceptedDelayed, .full: fatalError("unreachable: fsync appends are neither delayed nor held back")
                }
            }
            return assigned!
        }
        while true {
            let outcome = shared.withLock { s -> Enqueued in
                if let refusal = refusal(s) { return .refused(refusal) }
                if !s.pending.isEmpty && s.pending.count + batch.encodedSize > options.maxPendingBytes { return .full }
                let range = enqueue(batch, &s)
                if s.pending.count >= options.frameTargetSize { return .accepted(range, runNow: claimRun(&s)) }
                if !s.runQueued && !s.delayedQueued {
                    s.delayedQueued = true
                    return .acceptedDelayed(range)
                }
                return .accepted(range, runNow: false)
            }
            switch outcome {
            case .refused(let e): throw e
            case .accepted(let range, let runNow):
                if runNow { queue.async { self.runWriter() } }
                return range
            case .acceptedDelayed(let range):
                queue.asyncAfter(deadline: .now() + options.flushDelay.dispatchInterval) { self.runDelayed() }
                return range
            case .full:
                await withUnsafeContinuation { (c: UnsafeContinuation<Void, Never>) in
                    let wait = shared.withLock { s -> (wait: Bool, runNow: Bool) in
                        guard s.failure == nil, !s.pending.isEmpty else { return (false, false) }
                        s.spaceWaiters.append(c)
                        return (true, claimRun(&s))
                    }
                    if wait.runNow { queue.async { self.runWriter() } }
                    if !wait.wait { c.resume() }
                }
            }
        }
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
        await withUnsafeContinuation { (c: UnsafeContinuation<Void, Never>) in
            queue.async {
                self.writer.withLock { w in
                    w.closed = true
                    w.lock = nil  // releases the flock
                }
                c.resume()
            }
        }
        if let failure { throw failure }
    }

    // MARK: - Internals of appending

    private enum Enqueued {
        case accepted(ClosedRange<LSN>, runNow: Bool)
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

    /// Marks a writer run as queued; true if the caller must queue it.
    private func claimRun(_ s: inout Shared) -> Bool {
        if s.runQueued { return false }
        s.runQueued = true
        return true
    }

    private func wait(durable: Bool) async throws {
        try await withUnsafeThrowingContinuation { (c: UnsafeContinuation<Void, any Error>) in
            let outcome = shared.withLock { s -> (done: Bool, error: LogError?, runNow: Bool) in
                if let f = s.failure { return (true, f, false) }
                let target = s.nextLSN
                if (durable ? s.durableLSN : s.writtenLSN) >= target { return (true, nil, false) }
                s.waiters.append(Waiter(target: target, durable: durable, continuation: c))
                if durable { s.syncRequested = true }
                return (false, nil, claimRun(&s))
            }
            if outcome.runNow { queue.async { self.runWriter() } }
            if outcome.done {
                if let e = outcome.error { c.resume(throwing: e) } else { c.resume() }
            }
        }
    }
}

extension Duration {
    var dispatchInterval: DispatchTimeInterval {
        let (s, atto) = components
        return .nanoseconds(Int(clamping: s * 1_000_000_000 + atto / 1_000_000_000))
    }
}
