/// A receipt waiting for the server's answer to one write.
package struct AckWaiter {
    package var token: UInt64
    package var continuation: UnsafeContinuation<Void, any Error>
}

/// The pending-write ledger: what every data model on the log keeps of the server's answers
/// to its local writes, whatever the writes hold. Write ids are the LSNs of the writes'
/// records, so they increase in write order.
///
/// - The **sync cursor** (``ackedThrough``): every write up to it was answered in order. It is
///   durable as the records that moved it (and checkpoints).
/// - **Receipts** waiting for an answer, by write id. An answer is *settled* by the operation
///   that writes its record (``settle(_:recordLSN:_:)``); that operation resumes the receipts
///   (``takeSettled()``) once the record is durable, so a receipt never reports an answer a
///   crash could still take back.
/// - **Rejections**: the rejected writes the app has not cleared (``rejected``: write id → LSN
///   of the rejection record), and recent rejections' errors for receipts awaited after the
///   fact (bounded).
///
/// One per store, held by its engine and used under the engine's lock only; its state changes
/// through these functions alone.
package final class WriteLedger<Failure: LedgerFailure> {
    package init() {}
    /// The sync cursor: every write up to this id has been answered by the server in order
    /// (acknowledged, or rejected and recorded). 0 before the first answer.
    package private(set) var ackedThrough: Int64 = 0
    /// The LSN of the newest record that answered a write (acknowledgement or rejection).
    package private(set) var lastAnswerLSN: Int64 = 0
    /// The rejected writes the app has not cleared: write id → LSN of its rejection record
    /// (``noteRejected(_:recordLSN:)``, ``clearRejected(_:)``).
    package private(set) var rejected: [Int64: UInt64] = [:]
    /// The errors of the latest rejections (at most ``recentRejectionLimit``), for receipts
    /// awaited after the fact.
    private var recentRejections: [Int64: Failure] = [:]
    private var waiters: [Int64: [AckWaiter]] = [:]
    private var nextToken: UInt64 = 1
    /// Receipts whose answer the operation under way has decided (see ``takeSettled()``).
    private var settled: [(waiter: AckWaiter, outcome: Failure?)] = []

    /// How many rejections' errors are kept for receipts awaited after the fact; older ones
    /// answer with a generic rejection (while the write is in ``rejected``) or none.
    package static var recentRejectionLimit: Int { 16_384 }

    // MARK: The cursor

    /// The server answered every write through `through` in order (the answer's record is at
    /// `recordLSN`; 0 in replay, where no receipt waits). The cursor never goes back.
    package func advanceCursor(through: Int64, recordLSN: Int64 = 0) {
        ackedThrough = max(ackedThrough, through)
        lastAnswerLSN = max(lastAnswerLSN, recordLSN)
    }

    /// The cursor and rejections a checkpoint holds, installed as the ledger's.
    package func restore(ackedThrough: Int64, rejected: [Int64: UInt64]) {
        self.ackedThrough = ackedThrough
        self.rejected = rejected
    }

    // MARK: Rejections

    /// Write `writeID` was rejected by the record at `recordLSN`; it stays among the rejected
    /// writes until the app clears it.
    package func noteRejected(_ writeID: Int64, recordLSN: UInt64) {
        rejected[writeID] = recordLSN
    }

    /// The app cleared these rejected writes.
    package func clearRejected<S: Sequence>(_ writeIDs: S) where S.Element == Int64 {
        for id in writeIDs { rejected[id] = nil }
    }

    // MARK: Answers and receipts

    /// The server's answer to `writeID` (nil: acknowledged; else the rejection) is decided by
    /// the record at `recordLSN`: the receipts waiting for it move to the settled ones, which
    /// the operation that wrote the record resumes once it is durable.
    package func settle(_ writeID: Int64, recordLSN: Int64, _ outcome: Failure?) {
        if let outcome { noteRejection(writeID, outcome) }
        lastAnswerLSN = max(lastAnswerLSN, recordLSN)
        guard let ws = waiters.removeValue(forKey: writeID) else { return }
        for w in ws { settled.append((w, outcome)) }
    }

    /// Keeps a rejection's error for receipts awaited after the fact, forgetting the oldest
    /// past the limit (`bounded`: a live answer; replay keeps every one it reads, each once).
    package func noteRejection(_ writeID: Int64, _ error: Failure, bounded: Bool = true) {
        recentRejections[writeID] = error
        if bounded, recentRejections.count > Self.recentRejectionLimit, let oldest = recentRejections.keys.min() {
            recentRejections[oldest] = nil
        }
    }

    /// The receipts settled since the last call, with their outcomes, for the operation that
    /// settled them to resume.
    package func takeSettled() -> [(waiter: AckWaiter, outcome: Failure?)] {
        defer { settled = [] }
        return settled
    }

    /// A new token for one wait (to take it back on cancellation).
    package func newToken() -> UInt64 {
        defer { nextToken += 1 }
        return nextToken
    }

    /// What a receipt of `writeID` waits for: nothing more (`.answered`, with the LSN of a
    /// record that decided it, which must be durable first), or the answer (`.waiting`: the
    /// continuation is kept until an answer, ``endAll(_:)`` or ``cancel(_:token:)``).
    package enum Wait {
        case answered(Failure?, answerLSN: Int64)
        case waiting
        case failed(Failure)
        case cancelled
    }

    /// Registers a receipt of `writeID` (`pending`: the write still waits for its answer).
    package func wait(for writeID: Int64, token: UInt64, pending: Bool, _ c: UnsafeContinuation<Void, any Error>) -> Wait {
        if pending {
            waiters[writeID, default: []].append(AckWaiter(token: token, continuation: c))
            return .waiting
        }
        let outcome = recentRejections[writeID] ?? (rejected[writeID] != nil
            ? Failure.rejectedWrite(writeID) : nil)
        return .answered(outcome, answerLSN: lastAnswerLSN)
    }

    /// Takes back the wait `token` of a cancelled task (nil when an answer took it first).
    package func cancel(_ writeID: Int64, token: UInt64) -> UnsafeContinuation<Void, any Error>? {
        guard var ws = waiters[writeID], let i = ws.firstIndex(where: { $0.token == token }) else { return nil }
        let c = ws.remove(at: i).continuation
        waiters[writeID] = ws.isEmpty ? nil : ws
        return c
    }

    /// Ends every wait with `error` (the database closed or failed).
    package func endAll(_ error: Failure) {
        let all = waiters.values.flatMap { $0 }
        waiters = [:]
        for w in all { w.continuation.resume(throwing: error) }
    }

    /// How many receipts are waiting.
    package var waitingCount: Int { waiters.values.reduce(0) { $0 + $1.count } }
}

/// The error a data model reports for a rejected write (its ``WriteLedger`` keeps them).
package protocol LedgerFailure: Error, Sendable {
    /// The error for a rejected write whose own error is no longer kept (older than the
    /// ledger's recent rejections).
    static func rejectedWrite(_ writeID: Int64) -> Self
}
