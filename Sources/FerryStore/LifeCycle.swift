/// Whether a store is open, closed or failed — the one place either ending takes effect, for
/// both data models' stores (the tree's `Database`, FerryDocuments' `Firestore`).
///
/// - The first failure is the one kept; a store that failed stays failed, and one closed stays
///   closed.
/// - Ending, by failure or close, ends at once every wait for a server's answer in the ledger
///   it is given (the model's ``WriteLedger``), and marks the observers to be ended
///   (``takeObserversToEnd()``): the tree ends its listeners and sequences once its lock is
///   released, so that an end handler may call back into the store; the document store,
///   whose listeners are only dropped, drops them under its lock.
///
/// A value type: it lives in the model's state, under the model's lock.
package struct LifeCycle<Failure: LedgerFailure> {
    /// The error that stopped the store, if one did.
    package private(set) var failure: Failure?
    /// Whether the store was closed.
    package private(set) var closed = false
    /// The store ended and its observers have not been ended yet.
    package private(set) var observersToEnd = false

    package init() {}

    /// Whether the store still answers.
    package var isOpen: Bool { failure == nil && !closed }

    /// Stops the store with `error` unless it already stopped; ends every wait in `ledger`.
    /// Returns whether this call stopped it.
    @discardableResult
    package mutating func fail(_ error: Failure, ledger: WriteLedger<Failure>) -> Bool {
        guard failure == nil else { return false }
        failure = error
        ledger.endAll(error)
        observersToEnd = true
        return true
    }

    /// Closes the store unless it already is closed; every wait in `ledger` ends with
    /// `reason`. Returns whether this call closed it.
    @discardableResult
    package mutating func close(ledger: WriteLedger<Failure>, reason: Failure) -> Bool {
        guard !closed else { return false }
        closed = true
        ledger.endAll(reason)
        observersToEnd = true
        return true
    }

    /// Whether the observers are due to be ended now; the model ends them (once) when it is.
    package mutating func takeObserversToEnd() -> Bool {
        defer { observersToEnd = false }
        return observersToEnd
    }
}
