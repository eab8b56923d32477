/// Paths as index keys: each key's UTF-8 followed by a 0x00 byte (keys cannot contain control
/// characters), the root empty. A location's subtree is then exactly the keys that start with
/// its key, and sorts right after it.
enum PathKey {
    static func encode(_ path: Path) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(path.keys.reduce(0) { $0 + $1.utf8.count + 1 })
        for k in path.keys {
            out.append(contentsOf: k.utf8)
            out.append(0)
        }
        return out
    }

    static func decode(_ bytes: some Collection<UInt8>) -> Path {
        Path(keys: bytes.split(separator: 0, omittingEmptySubsequences: true).map { String(decoding: $0, as: UTF8.self) })
    }

    /// The keys of `path` and of each of its ancestors, root first.
    static func prefixes(of path: Path) -> [[UInt8]] {
        var out: [[UInt8]] = [[]]
        var current: [UInt8] = []
        for k in path.keys {
            current.append(contentsOf: k.utf8)
            current.append(0)
            out.append(current)
        }
        return out
    }
}

/// A sorted map from byte-string keys to small entries, in chunks of contiguous bytes (no
/// object per entry): ~25 bytes plus the key per entry. Keys sort bytewise.
final class PathIndex<Entry> {
    final class Chunk {
        var keyBytes: [UInt8] = []
        var keyEnds: [UInt32] = []
        var entries: [Entry] = []

        var count: Int { entries.count }

        func keyRange(_ i: Int) -> Range<Int> { (i == 0 ? 0 : Int(keyEnds[i - 1]))..<Int(keyEnds[i]) }

        func key(_ i: Int) -> ArraySlice<UInt8> { keyBytes[keyRange(i)] }

        func compare(_ i: Int, _ key: [UInt8]) -> Int {
            let r = keyRange(i)
            return keyBytes.withUnsafeBufferPointer { kb in
                key.withUnsafeBufferPointer { k in
                    let n = min(r.count, k.count)
                    for j in 0..<n {
                        let a = kb[r.lowerBound + j], b = k[j]
                        if a != b { return a < b ? -1 : 1 }
                    }
                    return r.count == k.count ? 0 : (r.count < k.count ? -1 : 1)
                }
            }
        }

        func hasPrefix(_ i: Int, _ prefix: [UInt8]) -> Bool {
            let r = keyRange(i)
            guard r.count >= prefix.count else { return false }
            return keyBytes.withUnsafeBufferPointer { kb in
                prefix.withUnsafeBufferPointer { p in
                    for j in 0..<p.count where kb[r.lowerBound + j] != p[j] { return false }
                    return true
                }
            }
        }

        /// Position of `key`, or where it would go.
        func search(_ key: [UInt8]) -> (Int, Bool) {
            var lo = 0, hi = count
            while lo < hi {
                let mid = (lo + hi) / 2
                let c = compare(mid, key)
                if c == 0 { return (mid, true) }
                if c < 0 { lo = mid + 1 } else { hi = mid }
            }
            return (lo, false)
        }

        func insert(_ key: [UInt8], _ entry: Entry, at i: Int) {
            let start = i == 0 ? 0 : Int(keyEnds[i - 1])
            keyBytes.insert(contentsOf: key, at: start)
            keyEnds.insert(UInt32(start + key.count), at: i)
            for j in (i + 1)..<keyEnds.count { keyEnds[j] += UInt32(key.count) }
            entries.insert(entry, at: i)
        }

        func remove(_ range: Range<Int>) {
            guard !range.isEmpty else { return }
            let byteStart = range.lowerBound == 0 ? 0 : Int(keyEnds[range.lowerBound - 1])
            let byteEnd = Int(keyEnds[range.upperBound - 1])
            let removedBytes = UInt32(byteEnd - byteStart)
            keyBytes.removeSubrange(byteStart..<byteEnd)
            keyEnds.removeSubrange(range)
            for j in range.lowerBound..<keyEnds.count { keyEnds[j] -= removedBytes }
            entries.removeSubrange(range)
        }

        /// Moves the upper half into a new chunk.
        func split() -> Chunk {
            let half = count / 2
            let upper = Chunk()
            let byteStart = Int(keyEnds[half - 1])
            upper.keyBytes = Array(keyBytes[byteStart...])
            upper.keyEnds = keyEnds[half...].map { $0 - UInt32(byteStart) }
            upper.entries = Array(entries[half...])
            keyBytes.removeSubrange(byteStart...)
            keyEnds.removeSubrange(half...)
            entries.removeSubrange(half...)
            return upper
        }
    }

    private(set) var chunks: [Chunk] = []
    private(set) var count = 0
    static var chunkCapacity: Int { 256 }

    var isEmpty: Bool { count == 0 }

    /// The chunk that holds (or would hold) `key`.
    private func chunkIndex(_ key: [UInt8]) -> Int {
        if chunks.count <= 1 { return 0 }
        var lo = 0, hi = chunks.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if chunks[mid].compare(0, key) <= 0 { lo = mid + 1 } else { hi = mid }
        }
        return max(0, lo - 1)
    }

    func get(_ key: [UInt8]) -> Entry? {
        guard !chunks.isEmpty else { return nil }
        let c = chunks[chunkIndex(key)]
        guard c.count > 0 else { return nil }
        let (i, found) = c.search(key)
        return found ? c.entries[i] : nil
    }

    /// Sets `key`; returns the entry it replaced.
    @discardableResult
    func set(_ key: [UInt8], _ entry: Entry) -> Entry? {
        if chunks.isEmpty { chunks.append(Chunk()) }
        let ci = chunkIndex(key)
        let c = chunks[ci]
        let (i, found) = c.search(key)
        if found {
            let old = c.entries[i]
            c.entries[i] = entry
            return old
        }
        c.insert(key, entry, at: i)
        count += 1
        if c.count > Self.chunkCapacity { chunks.insert(c.split(), at: ci + 1) }
        return nil
    }

    /// Removes every key that starts with `prefix` (the key `prefix` itself included), calling
    /// `removed` for each entry.
    func removeAll(withPrefix prefix: [UInt8], _ removed: (Entry) -> Void = { _ in }) {
        guard !chunks.isEmpty else { return }
        var ci = chunkIndex(prefix)
        var (i, _) = chunks[ci].search(prefix)
        while ci < chunks.count {
            let c = chunks[ci]
            var j = i
            while j < c.count && c.hasPrefix(j, prefix) { removed(c.entries[j]); j += 1 }
            let n = j - i
            if n > 0 {
                c.remove(i..<j)
                count -= n
            }
            let stoppedInside = i < c.count  // a key without the prefix follows: done
            if c.count == 0 && chunks.count > 1 {
                chunks.remove(at: ci)
            } else {
                ci += 1
            }
            if stoppedInside { return }
            i = 0
        }
    }

    /// Calls `body` with each key starting with `prefix` (in order) and its entry.
    func forEach(withPrefix prefix: [UInt8], _ body: (ArraySlice<UInt8>, Entry) throws -> Void) rethrows {
        guard !chunks.isEmpty else { return }
        var ci = chunkIndex(prefix)
        var (i, _) = chunks[ci].search(prefix)
        while ci < chunks.count {
            let c = chunks[ci]
            while i < c.count {
                guard c.hasPrefix(i, prefix) else { return }
                try body(c.key(i), c.entries[i])
                i += 1
            }
            ci += 1
            i = 0
        }
    }

    /// Whether any key starts with `prefix`.
    func hasKey(withPrefix prefix: [UInt8]) -> Bool {
        guard !chunks.isEmpty else { return false }
        var ci = chunkIndex(prefix)
        var (i, _) = chunks[ci].search(prefix)
        while ci < chunks.count {
            if i < chunks[ci].count { return chunks[ci].hasPrefix(i, prefix) }
            ci += 1
            i = 0
        }
        return false
    }

    func removeAll() {
        chunks = []
        count = 0
    }

    /// Bytes held by keys and entries (an estimate of the index's memory).
    var footprint: Int {
        chunks.reduce(0) { $0 + $1.keyBytes.capacity + $1.keyEnds.capacity * 4 + $1.entries.capacity * MemoryLayout<Entry>.stride + 64 }
    }
}
