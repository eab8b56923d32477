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
    var signal: AsyncStream<SyncSignal>.Continuation?

    func startListening(_ query: QuerySpec, tag: Int?) {
        active[query] = tag
        signal?.yield(.listens)
    }

    func stopListening(_ query: QuerySpec, tag: Int?) {
        active[query] = nil
        signal?.yield(.listens)
    }
}
