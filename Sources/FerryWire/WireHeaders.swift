/// Header names of the protocol (lowercase: HTTP header names are case-insensitive).
public enum WireHeader {
    /// `STORE/ID`: the client store and the write's id (idempotent writes).
    public static let write = "x-ferry-write"
    /// The highest write id whose outcome the client has recorded durably.
    public static let acked = "x-ferry-acked"
    /// `true` on the answer to a write the server had already processed.
    public static let duplicate = "x-ferry-duplicate"
    /// The server's clock in milliseconds since 1970, on every response.
    public static let serverTime = "x-ferry-server-time"
    /// On a stream's request: the client store it belongs to. After a group of writes, the
    /// streams of each client whose writes it answered get a progress mark (`id:` alone).
    public static let client = "x-ferry-client"
    /// On a write's success: the commit it is visible at (see ``BatchResult/commit``).
    public static let commit = "x-ferry-commit"
    /// On a stream's answer: the stream resumes after the `Last-Event-ID` it was asked with,
    /// and its first events bring it to the commit this header names.
    public static let resumedThrough = "x-ferry-resumed-through"
    /// On a stream's answer: what names the namespace's commits (it changes when its store is
    /// made anew). On a stream's request with `Last-Event-ID`: the epoch that commit was of —
    /// the stream resumes only in the same one.
    public static let epoch = "x-ferry-epoch"
    /// The standard header of a reconnecting event stream: the last `id:` it applied.
    public static let lastEventID = "last-event-id"
    /// `true` asks a read for its ETag.
    public static let firebaseETag = "x-firebase-etag"
}

/// A client's write identity, from `X-Ferry-Write: STORE/ID`.
public struct WriteIdentity: Sendable, Hashable {
    /// The client store's id: 32 lowercase hex digits.
    public var store: String
    /// The write's id (the client's LSN); a client sends its writes in id order.
    public var id: Int64

    /// Creates an identity.
    public init(store: String, id: Int64) {
        self.store = store
        self.id = id
    }

    /// Parses `STORE/ID`; nil when malformed.
    public init?(header: String) {
        let parts = header.split(separator: "/", omittingEmptySubsequences: false)
        guard parts.count == 2, let id = Int64(parts[1]), id >= 0, WriteIdentity.isStoreID(String(parts[0])) else { return nil }
        self.store = String(parts[0])
        self.id = id
    }

    /// Whether `s` is a store id: 32 lowercase hex digits.
    public static func isStoreID(_ s: String) -> Bool {
        s.utf8.count == 32 && s.utf8.allSatisfy { (0x30...0x39).contains($0) || (0x61...0x66).contains($0) }
    }

    /// The header value.
    public var header: String { "\(store)/\(id)" }
}
