/// The data a transaction's update closure sees and changes.
public struct MutableData: Sendable {
    /// The current value (null when there is none, or when it is not cached).
    public var value: Value
    /// The current priority.
    public var priority: Value

    init(node: Node) {
        value = node.value()
        priority = node.priority.value()
    }
}

/// What a transaction's update closure decides.
public enum TransactionDecision: Sendable {
    /// Write the (possibly changed) data.
    case commit
    /// Leave the data as it is.
    case abort
}

/// How a transaction ended.
public struct TransactionResult: Sendable {
    /// True when the update was written; false when the closure aborted.
    public let committed: Bool
    /// The data after the transaction.
    public let snapshot: DataSnapshot
}

extension DatabaseReference {
    /// The most transactions are rerun (as in Firebase).
    public static let maxTransactionRuns = 25

    /// Runs `update` on the current local value and writes the result as one write, rerunning
    /// it when another local write changes the data in between (at most 25 runs).
    ///
    /// `update` may run several times and must not have side effects. Offline, the current
    /// value is the cached one (null when nothing is cached).
    ///
    /// - Throws: ``DatabaseError/Code/transactionTooManyRetries`` after 25 runs; write errors.
    public func runTransaction(_ update: @Sendable (inout MutableData) -> TransactionDecision) async throws -> TransactionResult {
        for _ in 0..<Self.maxTransactionRuns {
            let (current, metadata) = try database.localValue(at: path)
            var data = MutableData(node: current)
            if case .abort = update(&data) {
                return TransactionResult(committed: false, snapshot: DataSnapshot(ref: self, node: current, metadata: metadata))
            }
            let node = try Node(data.value, path: path).updatingPriority(try Node.priorityNode(data.priority, at: path))
            let location = path
            // Committed only on the data the closure saw; otherwise it runs again.
            let written = try await database.commitTransaction(at: location, over: current, node)
            if written != nil {
                let (shown, md) = try database.localValue(at: location, otherwise: node, checking: false)
                return TransactionResult(committed: true, snapshot: DataSnapshot(ref: self, node: shown, metadata: md))
            }
        }
        throw DatabaseError(.transactionTooManyRetries, "the transaction at \(path) was rerun \(Self.maxTransactionRuns) times; the data kept changing under it")
    }
}
