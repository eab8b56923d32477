/// The engine's side of the cache size limit and of `keepSynced` pins: which server data is
/// kept when segments are evicted, and dropping the rest.
extension Engine {
    /// The paths whose server data eviction keeps: those under an active listener (a view of
    /// the sync tree) and those pinned with `keepSynced(true)`.
    var keptPaths: [Path] {
        var paths = Array(pins)
        syncTree.syncPoints.forEach { p, _ in paths.append(p) }
        return paths
    }

    /// Whether server data at `path` is kept by eviction: it lies under a kept path, or a kept
    /// path lies under it (the entry holds kept data, and is restated whole).
    static func isKept(_ path: Path, by kept: [Path]) -> Bool {
        kept.contains { $0.contains(path) || path.contains($0) }
    }

    /// Drops every stored server-cache entry whose value lies in a record below `cutoff`
    /// (an eviction's effect; markers and entries restated above the cutoff stay). Returns how
    /// many entries were dropped: that data is now "not cached".
    @discardableResult
    func dropServerEntries(below cutoff: UInt64) -> Int {
        server.removeEntries { _, e in !e.isInline && !e.isMarker && e.ref.lsn < cutoff }
    }

    /// A memory-only store's eviction: drops the server data not under a kept path.
    @discardableResult
    func dropUnkeptInlineEntries() -> Int {
        let kept = keptPaths
        return server.removeEntries { k, e in
            e.isInline && !e.isMarker && !Engine.isKept(PathKey.decode(Array(k)), by: kept)
        }
    }

    /// Sets or clears a `keepSynced` pin: one record (replayed on open).
    func setPin(_ path: Path, _ pinned: Bool) throws -> Int64? {
        try checkUsable()
        guard pins.contains(path) != pinned else { return nil }
        let lsn = try append(.pin, isPersistent ? RecordCodec.pin(path, pinned: pinned) : [])
        if pinned { pins.insert(path) } else { pins.remove(path) }
        return log == nil ? nil : lsn
    }

    /// Restates every pin at the head of the log (compaction and eviction, before they delete
    /// the segments holding the pins' records).
    func restatePins() throws {
        for p in pins.sorted(by: { $0.description < $1.description }) {
            _ = try append(.pin, RecordCodec.pin(p, pinned: true))
        }
    }
}
