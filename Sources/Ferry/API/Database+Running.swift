import FerryLog

/// A local write as the public types ask for it; the engine applies it under its lock, so that
/// ``DatabaseReference`` never reaches the engine itself.
enum LocalWrite {
    /// The encoded value at a path.
    case set(Path, EncodedValue)
    /// A node at a path (a priority, a transaction's result).
    case setNode(Path, Node)
    /// A multi-path update: encoded values at paths below a path.
    case update(Path, [(Path, EncodedValue)])

    @inline(__always)
    func apply(to e: Engine) throws -> (Int64, [Event]) {
        switch self {
        case .set(let path, let value): try e.localSet(path, value)
        case .setNode(let path, let node): try e.localSet(path, node)
        case .update(let path, let children): try e.localUpdate(path, children)
        }
    }
}

/// How operations run on the engine: under its lock, in the log's order, with the events they
/// raise delivered after it, and the database's life cycle (closed or failed) ending every
/// observer in one place.
extension Database {
    /// Runs `body` with the engine under its lock. Every hold of the lock goes through here:
    /// when the database closed or failed during it (a write or a read of the log failed, or
    /// ``close()``), every observer's stream or wait is ended once the lock is released — an
    /// end handler may call back in to remove its observer. (Waits for a server's answer end
    /// under the lock, as ``Engine/failure`` or ``Engine/closed`` is set.)
    func withEngine<R, E: Error>(_ body: (inout sending Engine) throws(E) -> sending R) throws(E) -> sending R {
        var stopped = false
        defer { if stopped { endObservers() } }
        return try engine.withLock { (e: inout sending Engine) throws(E) -> sending R in
            defer { stopped = e.observersToEnd }
            return try body(&e)
        }
    }

    /// A local write: ``perform(_:)``, then the upkeep is told of it (which waits for an
    /// eviction only when the store is over its limit). Returns the write's id.
    @inline(__always)  // (an async layer per write costs ~2% of a bulk load)
    func write(_ w: LocalWrite) async throws -> Int64? {
        try await write { e in try w.apply(to: e) }
    }

    /// A local write that returns at once: ``apply(_:)``, then the upkeep is told of it.
    @inline(__always)
    func writeNow(_ w: LocalWrite) throws -> Int64? {
        try writeNow { e in try w.apply(to: e) }
    }

    /// A transaction's write: `node` at `location`, committed only if the data there is still
    /// `current` (what the transaction's function saw). Returns the write's id, or nil when the
    /// data changed and the function must run again.
    func commitTransaction(at location: Path, over current: Node, _ node: Node) async throws -> Int64? {
        try await perform { e in
            guard (e.visibleNode(at: location) ?? .empty) == current else { return (nil, []) }
            let (id, events) = try e.localSet(location, node)
            return (id, events)
        }
    }

    /// Sets or clears a `keepSynced` pin at `path` (a record of its own).
    func setPin(_ path: Path, _ pinned: Bool) async throws {
        _ = try await perform { e in (try e.setPin(path, pinned), []) }
    }

    @inline(__always)
    private func write(_ body: (Engine) throws -> (Int64, [Event])) async throws -> Int64? {
        var facts: SpaceFacts?
        let id = try await perform { e in
            let (id, events) = try body(e)
            facts = SpaceFacts(e)
            return (id, events)
        }
        if let facts { await notedWrite(facts) }
        return id
    }

    /// A local write that returns at once: ``apply(_:)``, then the upkeep is told of it.
    @inline(__always)
    private func writeNow(_ body: (Engine) throws -> (Int64, [Event])) throws -> Int64? {
        var facts: SpaceFacts?
        let (id, _) = try apply { e in
            let (id, events) = try body(e)
            facts = SpaceFacts(e)
            return (id, events)
        }
        if let facts { notedWriteNow(facts) }
        return id
    }

    /// The error to throw for a failure of the log (which stops the database when the log
    /// failed for good).
    func storageError(_ error: any Error) -> DatabaseError {
        withEngine { $0.storageError(error) }
    }

    /// Runs `body` on the engine under the lock (in the log's order), delivers the events it
    /// raised, waits for the record's durability per the durability mode, and returns its id.
    func perform(_ body: (Engine) throws -> (Int64?, [Event])) async throws -> Int64? {
        let (id, seq) = try apply(body)
        if let id {
            do {
                // Only `.fsync` waits; the others are acknowledged at once unless the log failed
                // (checked here without an `await`, which costs a suspension check per write).
                if options.durability == .fsync {
                    try await medium.awaitDurable(UInt64(id))
                } else if let failure = medium.failure {
                    throw failure
                }
            } catch {
                throw storageError(error)
            }
        }
        if !delivery.isDelivered(seq) { await delivery.waitDelivered(seq) }
        return id
    }

    /// Runs `body` on the engine under the lock (in the log's order) and delivers the events it
    /// raised, without waiting for anything: returns its id and the events' delivery number.
    func apply(_ body: (Engine) throws -> (Int64?, [Event])) throws -> (Int64?, UInt64) {
        var rebuild = false
        let (id, seq) = try withEngine { e -> (Int64?, UInt64) in
            let (id, events) = try body(e)
            // A record read while applying failed: the events would show data as missing.
            if let failure = e.failure { throw failure }
            let delivered = e.finish(events)
            e.refreshIndexesIfDue()
            e.pruneRecent()
            rebuild = e.takeIndexRebuildsDue()
            return (id, delivery.enqueue(delivered))
        }
        if rebuild { scheduleIndexRebuilds() }
        delivery.drain()
        return (id, seq)
    }

    /// Like ``perform(_:)`` for operations that write nothing (registrations).
    func raise(_ body: (Engine) throws -> [Event]) rethrows {
        var rebuild = false
        try withEngine { e in
            let events = try body(e)
            // A read failed: deliver nothing that may show data as missing.
            if e.failure != nil { return }
            _ = delivery.enqueue(e.finish(events))
            rebuild = e.takeIndexRebuildsDue()
        }
        if rebuild { scheduleIndexRebuilds() }
        delivery.drain()
    }

    /// Ends every active observer's stream or wait with the reason the database stopped
    /// (called by ``withEngine(_:)`` outside the lock, once it has).
    private func endObservers() {
        guard let (reason, ends) = engine.withLock({ $0.takeEndedRegistrations() }) else { return }
        for end in ends { end(reason) }
    }
}
