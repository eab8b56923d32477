/// An error from the write-ahead log.
///
/// Every error carries a ``Code`` to switch on, a message a person can act on, and — where a
/// file is involved — the file and byte offset. Corruption errors always name both.
public struct LogError: Error, Sendable, CustomStringConvertible {
    /// What kind of failure this is. New codes may be added; match the ones you handle.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        enum Wrapped: Hashable, Sendable {
            case storeInUse, corruption, unsupportedFormat, io, failed, closed
            case invalidArgument, recordsUnavailable
        }
        let wrapped: Wrapped

        /// Another opener (this process or another) holds the store's lock.
        public static let storeInUse = Code(wrapped: .storeInUse)
        /// Bytes on disk fail a checksum or a structural check; the error names file and offset.
        public static let corruption = Code(wrapped: .corruption)
        /// A format version, codec or frame type this build does not read. Nothing was modified.
        public static let unsupportedFormat = Code(wrapped: .unsupportedFormat)
        /// A system call failed (see ``LogError/errno``).
        public static let io = Code(wrapped: .io)
        /// The log stopped after a step that changes its files failed (see ``LogError/cause``);
        /// it accepts no more appends nor maintenance.
        public static let failed = Code(wrapped: .failed)
        /// The log was closed.
        public static let closed = Code(wrapped: .closed)
        /// The caller passed something the log cannot take (an empty batch, an oversized record).
        public static let invalidArgument = Code(wrapped: .invalidArgument)
        /// The requested records were deleted or lie beyond the end of the log.
        public static let recordsUnavailable = Code(wrapped: .recordsUnavailable)

        public var description: String {
            switch wrapped {
            case .storeInUse: "store in use"
            case .corruption: "corruption"
            case .unsupportedFormat: "unsupported format"
            case .io: "I/O error"
            case .failed: "log failed"
            case .closed: "log closed"
            case .invalidArgument: "invalid argument"
            case .recordsUnavailable: "records unavailable"
            }
        }
    }

    /// What kind of failure this is.
    public var code: Code
    /// A sentence saying what went wrong and, where possible, what to do.
    public var message: String
    /// The file involved (a path), if any.
    public var file: String?
    /// The byte offset in ``file`` where the problem was found, if any.
    public var offset: Int64?
    /// The system error behind an ``Code/io`` or ``Code/failed`` error.
    public var errno: Errno?
    /// Where in Ferry's source the error was raised (for bug reports).
    public var source: String
    /// The error underneath: for ``Code/failed``, the first failure that stopped the log (an
    /// ``Code/io`` error naming the system call, the file and the `errno`).
    public var cause: (any Error & Sendable)?

    init(
        _ code: Code, _ message: String, file: String? = nil, offset: Int64? = nil, errno: Errno? = nil,
        cause: (any Error & Sendable)? = nil, fileID: StaticString = #fileID, line: UInt = #line
    ) {
        self.cause = cause
        self.code = code
        self.message = message
        self.file = file
        self.offset = offset
        self.errno = errno
        self.source = "\(fileID):\(line)"
    }

    public var description: String {
        var s = "\(code): \(message)"
        if let file { s += " [file: \(file)" + (offset.map { ", offset \($0)" } ?? "") + "]" }
        if let errno { s += " (\(errno))" }
        return s
    }

    static func io(_ what: String, path: String?, _ errno: Errno, fileID: StaticString = #fileID, line: UInt = #line) -> LogError {
        LogError(.io, "\(what) failed: \(errno)", file: path, errno: errno, fileID: fileID, line: line)
    }
}
