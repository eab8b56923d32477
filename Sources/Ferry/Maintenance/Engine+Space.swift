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

    /// A memory-only store's eviction: drops the server data not under a kept path (the
    /// records no entry refers to any more are then swept: ``sweepMemory()``).
    @discardableResult
    func dropUnkeptEntries() -> Int {
        let kept = keptPaths
        var keys: [[UInt8]] = []
        let n = server.removeEntries { k, e in
            let drop = !e.isMarker && !Engine.isKept(PathKey.decode(k), by: kept)
            if drop { keys.append(Array(k)) }
            return drop
        }
        return n + dropMarkers(above: keys)
    }

    /// A slice of ``dropServerEntries(below:)``, live: of the entries below the cutoff found in
    /// an earlier snapshot of the cache (every entry below the cutoff now was in it: newer
    /// entries refer to newer records), removes those still there, one by one. Slices run in
    /// turn with the lock released between them, then ``dropMarkers(above:)``: the state is then
    /// the replay's (a newer write at a path replaces the entry there either way; one below an
    /// evicted entry stays either way).
    func dropServerEntries(_ found: ArraySlice<(key: [UInt8], entry: LayeredEntry)>, into dropped: inout [[UInt8]]) {
        for (k, e) in found where server.index.get(k) == e {
            server.removeEntryOnly(k)
            dropped.append(k)
        }
    }

    /// Sets or clears a `keepSynced` pin: one record (replayed on open).
    func setPin(_ path: Path, _ pinned: Bool) throws -> Int64? {
        try checkUsable()
        guard pins.contains(path) != pinned else { return nil }
        let lsn = try append(.pin, RecordCodec.pin(path, pinned: pinned))
        setPinned(path, pinned)
        listens.signal?.yield(.listens)
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
