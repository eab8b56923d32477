import FerryLog

/// What a ``WriteReceipt`` and a ``DatabaseReference`` ask of the engine (they never take its
/// lock themselves).
extension Database {
    /// A Firebase-compatible push id for a new child, by the server's clock as far as known.
    func nextPushID() -> String {
        let now = withEngine { $0.serverTime }
        return pushIDs.withLock { $0.next(now: now) }
    }

    /// What a local reader sees at `path` now (`otherwise` when nothing is cached), with its
    /// metadata: the value a transaction runs on, and shows once committed.
    /// - Throws: when the database is closed or failed, if `checking`.
    func localValue(at path: Path, otherwise: Node = .empty, checking: Bool = true) throws -> (Node, SnapshotMetadata) {
        try withEngine { e in
            if checking { try e.checkUsable() }
            return (e.visibleNode(at: path) ?? otherwise, e.metadata(for: .defaultQuery(at: path)))
        }
    }

    /// Returns when the server has answered write `id` (see ``WriteReceipt/serverAcknowledgement()``),
    /// once that answer is durable; throws its rejection, the database's stop, or
    /// `CancellationError`.
    func awaitAcknowledgement(of id: Int64) async throws {
        let token = withEngine { $0.ledger.newToken() }
        var answered: (outcome: DatabaseError?, lsn: Int64)?
        try await withTaskCancellationHandler {
            try await withUnsafeThrowingContinuation { (c: UnsafeContinuation<Void, any Error>) in
                let wait = withEngine { e -> WriteLedger<DatabaseError>.Wait in
                    Task.isCancelled ? .cancelled : e.registerAckWaiter(id, token: token, c)
                }
                switch wait {
                case .waiting: break
                case .cancelled: c.resume(throwing: CancellationError())
                case .failed(let error): c.resume(throwing: error)
                case .answered(let outcome, let lsn):
                    answered = (outcome, lsn)
                    c.resume()
                }
            }
        } onCancel: {
            withEngine { $0.ledger.cancel(id, token: token) }?.resume(throwing: CancellationError())
        }
        // Answered before this call: the answer's record must be durable before we say so.
        if let (outcome, lsn) = answered {
            if lsn > 0 {
                do { try await medium.awaitDurable(UInt64(lsn)) } catch {
                    throw storageError(error)
                }
            }
            if let outcome { throw outcome }
        }
    }
}
