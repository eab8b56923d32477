/// What the server has said about the database's locations, apart from their data: where a
/// listen it keeps up to date has completed (snapshots there are not just from the cache),
/// and how far its clock is from the local one.
///
/// Invariants: a location is live from its listen's completion until that listen ends; a
/// live location makes every query at or below it live (``isLive(_:)``). One per engine, used
/// under the engine's lock; its state changes through these functions alone.
final class ServerStatus {
    /// Paths whose default (unfiltered) listen completed.
    private(set) var livePaths: Set<Path> = []
    /// Filtered queries whose tagged listen completed.
    private(set) var liveQueries: Set<QuerySpec> = []
    /// Milliseconds to add to the local clock to get the server's (`.info/serverTimeOffset`).
    private(set) var timeOffset: Int64 = 0

    /// The listen at `path` (a filtered query's listen: `query`) completed.
    func listenCompleted(at path: Path, query: QuerySpec? = nil) {
        if let query { liveQueries.insert(query) } else { livePaths.insert(path) }
    }

    /// The listen at `path` (a filtered query's listen: `query`) ended: its data stays, but it
    /// is from the cache again.
    func listenEnded(at path: Path, query: QuerySpec? = nil) {
        if let query { liveQueries.remove(query) } else { livePaths.remove(path) }
    }

    /// Whether `query`'s data is kept up to date by the server: its own listen completed, or
    /// one at or above its location.
    func isLive(_ query: QuerySpec) -> Bool {
        liveQueries.contains(query) || livePaths.contains { $0.contains(query.path) }
    }

    /// Whether a live listen is at, above or below `path`.
    func hasLiveListen(touching path: Path) -> Bool {
        livePaths.contains { $0.contains(path) || path.contains($0) }
            || liveQueries.contains { $0.path.contains(path) || path.contains($0.path) }
    }

    /// The sync layer measured the server's clock.
    func setTimeOffset(_ offset: Int64) { timeOffset = offset }
}
