/// The fail-stop rule, written once: every step that changes the store's files runs through
/// ``WriteAheadLog/changingFiles(_:)``, and the first failure of any of them stops the log.
extension WriteAheadLog {
    /// Runs `step`, which changes the store's files, under the fail-stop rule.
    ///
    /// A log that has failed refuses the step (it throws the log's failure without touching the
    /// disk). If the step throws, the log stops as a failed append stops it (see ``fail(_:)``)
    /// and the caller gets the same ``LogError/Code/failed`` error every waiting and later call
    /// gets. A step changes the writer's state only after its file operations succeeded, so a
    /// failed step leaves no state that a later step could build on — and there is no later step.
    ///
    /// The appends' rounds, rolls and deletions of segments run it on the writer (through
    /// ``onWriter(_:)``); side-file writes and removals run it on the caller's thread.
    func changingFiles<T: ~Copyable>(_ step: () throws -> T) throws -> T {
        if let f = failure { throw f }
        do {
            return try step()
        } catch let e as LogError {
            throw fail(e)
        } catch {
            throw fail(LogError(.io, "\(error)"))
        }
    }

    /// Stops the log for good after a failed step that changes files: nothing is retried and
    /// assumed good. Every waiter is resumed with the failure; later calls get it at once.
    /// The first cause is kept: a failure after the log stopped does not replace it.
    ///
    /// - Returns: the error that stopped the log.
    @discardableResult
    func fail(_ error: LogError) -> LogError {
        let failure = LogError(.failed,
            "the log stopped after a failed step that changes its files and accepts no more appends or maintenance; records not yet acknowledged may be lost, acknowledged ones are safe. Reopen the store to recover. Cause: \(error.message)",
            file: error.file, offset: error.offset, errno: error.errno, cause: error)
        let (first, waiters, space) = shared.withLock { s -> (LogError?, [Waiter], [UnsafeContinuation<Void, Never>]) in
            if let first = s.failure { return (first, [], []) }
            s.failure = failure
            s.runQueued = false
            defer {
                s.waiters.removeAll()
                s.spaceWaiters.removeAll()
                s.pending = []
                s.pendingBatches = []
            }
            return (nil, s.waiters, s.spaceWaiters)
        }
        if let first { return first }
        logger.error("\(failure)")
        for w in waiters { w.continuation.resume(throwing: failure) }
        for c in space { c.resume() }
        return failure
    }
}
