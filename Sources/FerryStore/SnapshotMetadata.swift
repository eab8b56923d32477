/// How fresh a snapshot's data is: what every data model's snapshots say of it (Firebase's
/// `SnapshotMetadata`, in the Realtime Database's naming).
public struct SnapshotMetadata: Sendable, Hashable, CustomStringConvertible {
    /// True when no live server listen has confirmed the data: it comes from the local cache
    /// (and local writes). Always true while offline.
    public var fromCache: Bool
    /// True when local writes not yet acknowledged by the server touch the data.
    public var hasPendingWrites: Bool

    /// Metadata with the given flags.
    public init(fromCache: Bool, hasPendingWrites: Bool) {
        self.fromCache = fromCache
        self.hasPendingWrites = hasPendingWrites
    }

    public var description: String { "fromCache: \(fromCache), hasPendingWrites: \(hasPendingWrites)" }
}
