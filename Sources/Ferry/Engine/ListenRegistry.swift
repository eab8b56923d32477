import FerryLog

/// What changed for the sync layer.
@_spi(Server) public enum SyncSignal: Sendable {
    /// New local writes are pending.
    case writes
    /// The set of listens (``Database/activeListens()``) changed.
    case listens
}

/// Keeps the listens the views need (the ``ListenProvider`` of the sync tree), whether or not
/// a sync layer is attached, so that one attached later learns them all.
final class ListenRegistry: ListenProvider {
    private(set) var active: [QuerySpec: Int?] = [:]
    /// Where the sync layer hears of changes (nil: none attached).
    private(set) var signal: AsyncStream<SyncSignal>.Continuation?

    /// Attaches a sync layer's stream (nil: detaches); returns the one it replaces.
    func attach(_ continuation: AsyncStream<SyncSignal>.Continuation?) -> AsyncStream<SyncSignal>.Continuation? {
        defer { signal = continuation }
        return signal
    }

    func startListening(_ query: QuerySpec, tag: Int?) {
        active[query] = tag
        signal?.yield(.listens)
    }

    func stopListening(_ query: QuerySpec, tag: Int?) {
        active[query] = nil
        signal?.yield(.listens)
    }
}
