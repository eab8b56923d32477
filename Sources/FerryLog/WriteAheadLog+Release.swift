extension WriteAheadLog {
    /// Releases the store at once, without waiting for anything: for a log that was opened and
    /// only read — its opener failed before appending (a database whose replay failed) — so that
    /// the store can be opened again right away, by this process or another. Records appended
    /// and not yet written are dropped (the caller appended none). Later calls throw
    /// ``LogError/Code/closed``; ``close()`` afterwards does nothing.
    public func release() {
        shared.withLock { $0.closed = true }
        writer.withLock { w in
            w.closed = true
            w.lock = nil  // releases the flock
        }
    }
}
