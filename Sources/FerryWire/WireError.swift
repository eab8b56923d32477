/// An error reading something off the wire: a batch, a query, a server value, an event stream.
public struct WireError: Error, Sendable, CustomStringConvertible {
    /// What kind of input was wrong. New codes may be added.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        let name: String
        /// A value or body that cannot be stored or parsed.
        public static let invalidData = Code(name: "invalid data")
        /// Query parameters the Realtime Database does not allow.
        public static let invalidQuery = Code(name: "invalid query")
        /// A description of the code.
        public var description: String { name }
    }

    /// What kind of failure this is.
    public var code: Code
    /// A message a person (or a client) can act on; sent as `{"error": message}`.
    public var message: String
    /// What it was caused by, if anything.
    public var underlying: (any Error & Sendable)?
    /// Where: the location (path) or parameter the input was for.
    public var location: String?

    /// Creates an error.
    public init(_ code: Code, _ message: String, underlying: (any Error & Sendable)? = nil, location: String? = nil) {
        self.code = code
        self.message = message
        self.underlying = underlying
        self.location = location
    }

    /// `code: message (at location)`.
    public var description: String { "\(code): \(message)" + (location.map { " (at \($0))" } ?? "") }
}
