import FerryLog

/// An error from the database.
///
/// Carries a ``Code`` to switch on and a message a person can act on; errors from the log
/// underneath keep their ``FerryLog/LogError`` as ``underlying``.
public struct DatabaseError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is. New codes may be added; match the ones you handle.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        enum Wrapped: Hashable, Sendable {
            case invalidPath, invalidData, notCached, storage, closed, writeRejected, transactionAborted
            case transactionTooManyRetries, invalidQuery, failedPrecondition
        }
        let wrapped: Wrapped

        /// A key or path breaks the Realtime Database's rules; the message names the key and rule.
        public static let invalidPath = Code(wrapped: .invalidPath)
        /// A value cannot be stored (NaN, an unsupported type, a misplaced `.priority`, deeper than
        /// 32 levels below the root, not JSON, an integer beyond 64 bits, too large…).
        public static let invalidData = Code(wrapped: .invalidData)
        /// The data is neither available from a server nor complete in the local cache.
        public static let notCached = Code(wrapped: .notCached)
        /// The log or a checkpoint failed; see ``DatabaseError/underlying``.
        public static let storage = Code(wrapped: .storage)
        /// The database was closed.
        public static let closed = Code(wrapped: .closed)
        /// The server rejected a write; it was reverted locally.
        public static let writeRejected = Code(wrapped: .writeRejected)
        /// A transaction's update closure aborted.
        public static let transactionAborted = Code(wrapped: .transactionAborted)
        /// A transaction was rerun too many times because the data kept changing under it.
        public static let transactionTooManyRetries = Code(wrapped: .transactionTooManyRetries)
        /// A query combines constraints the Realtime Database does not allow.
        public static let invalidQuery = Code(wrapped: .invalidQuery)
        /// The operation is refused in the store's present state (clearing a store that holds
        /// pending writes, say); the message says what would allow it.
        public static let failedPrecondition = Code(wrapped: .failedPrecondition)

        public var description: String {
            switch wrapped {
            case .invalidPath: "invalid path"
            case .invalidData: "invalid data"
            case .notCached: "not cached"
            case .storage: "storage"
            case .closed: "closed"
            case .writeRejected: "write rejected"
            case .transactionAborted: "transaction aborted"
            case .transactionTooManyRetries: "transaction retried too often"
            case .invalidQuery: "invalid query"
            case .failedPrecondition: "failed precondition"
            }
        }
    }

    /// What kind of failure this is.
    public var code: Code
    /// A sentence saying what went wrong.
    public var message: String
    /// The error underneath (a ``FerryLog/LogError`` for ``Code/storage``), if any.
    public var underlying: (any Error & Sendable)?
    /// The store directory, for errors about a stored database.
    public var store: String?
    /// The log record involved (its LSN), if any: a record that could not be read or decoded.
    public var lsn: UInt64?
    /// The file involved (a segment or checkpoint), if known.
    public var file: String?
    /// The byte offset in ``file`` (of the frame holding ``lsn``), if known.
    public var offset: Int64?
    /// Where in Ferry's source the error was raised (for bug reports).
    public var source: String

    init(_ code: Code, _ message: String, underlying: (any Error & Sendable)? = nil, lsn: UInt64? = nil,
         file: String? = nil, offset: Int64? = nil, store: String? = nil, fileID: StaticString = #fileID, line: UInt = #line) {
        self.code = code
        self.message = message
        self.underlying = underlying
        self.lsn = lsn
        self.file = file
        self.offset = offset
        self.store = store
        self.source = "\(fileID):\(line)"
        if let log = underlying as? LogError {
            if self.file == nil { self.file = log.file }
            if self.offset == nil { self.offset = log.offset }
        }
    }

    public var description: String {
        var s = "\(code): \(message)"
        var place: [String] = []
        if let lsn { place.append("record \(lsn)") }
        if let file { place.append("file: \(file)" + (offset.map { ", offset \($0)" } ?? "")) }
        if let store, file == nil { place.append("store: \(store)") }
        if !place.isEmpty { s += " [" + place.joined(separator: ", ") + "]" }
        if let underlying, !(underlying is LogError && message.contains(String(describing: underlying))) { s += " (\(underlying))" }
        return s
    }
}

extension DatabaseError: LedgerFailure {
    package static func rejectedWrite(_ writeID: Int64) -> DatabaseError {
        DatabaseError(.writeRejected, "the server refused write \(writeID); it was reverted locally and kept in the database's rejected writes")
    }
}
