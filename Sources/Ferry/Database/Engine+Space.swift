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

    /// Whether the server-cache entry at `path` is kept by eviction whole: it lies at or under
    /// a kept path. (An entry above a kept path is not: the kept part of its value is restated
    /// at the kept path, see ``restateKeptParts(below:_:)``.)
    static func isKept(_ path: Path, by kept: [Path]) -> Bool {
        kept.contains { $0.contains(path) }
    }

    /// For each kept path whose data comes from an entry above it lying below `cutoff` (or a
    /// marker), restates the data at the kept path (entries below it stay on top), so that the
    /// kept data stays complete when the entry above is dropped.
    func restateKeptParts(below cutoff: UInt64, _ restater: inout Restater) throws {
        for k in keptPaths.sorted(by: { $0.count < $1.count }) {
            // The source goes when it lies below the cutoff, or is a marker (dropped once the
            // entry above it has gone).
            guard let (above, entry) = server.deepestChainEntry(k), above != k, !entry.isInline,
                  entry.isMarker || entry.ref.lsn < cutoff, let part = server.completeNode(at: k) else { continue }
            var w = ByteWriter()
            ValueCodec.encode(part, into: &w)
            try w.bytes.withUnsafeBytes { try restater.add(k, $0, self) }
            // Replay the record now: a deeper kept path must see this entry as its source.
            try restater.flush(self)
        }
    }

    /// Drops every stored server-cache entry whose value lies in a record below `cutoff`
    /// (an eviction's effect; entries restated above the cutoff stay), and the markers left
    /// with no stored entry above them (a marker hides part of the entry above it: alone it
    /// would read as a null that is not the server's). Returns how many entries were dropped:
    /// that data is now "not cached".
    @discardableResult
    func dropServerEntries(below cutoff: UInt64) -> Int {
        server.removeEntries { _, e in !e.isInline && !e.isMarker && e.ref.lsn < cutoff } + dropOrphanMarkers()
    }

    /// A memory-only store's eviction: drops the server data not under a kept path.
    @discardableResult
    func dropUnkeptInlineEntries() -> Int {
        let kept = keptPaths
        return server.removeEntries { k, e in
            e.isInline && !e.isMarker && !Engine.isKept(PathKey.decode(k), by: kept)
        } + dropOrphanMarkers()
    }

    private func dropOrphanMarkers() -> Int {
        guard server.markerCount > 0 else { return 0 }
        return server.removeEntries { k, e in e.isMarker && !server.hasValueEntry(above: PathKey.decode(k)) }
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
