/// Records in LSN order, kept in chunks of at most ``chunkCapacity``: a copy (what a snapshot
/// read outside the lock holds) shares the chunks, and an append after it copies the chunk
/// list and the last chunk, not every record.
package struct RecordList {
    package typealias Record = (lsn: UInt64, kind: UInt8, payload: [UInt8])

    package static let chunkCapacity = 4096
    /// Non-empty chunks, in LSN order.
    private var chunks: [[Record]] = []
    package private(set) var count = 0

    package var isEmpty: Bool { count == 0 }
    package var first: Record? { chunks.first?.first }

    package init() {}

    package mutating func append(_ record: Record) {
        if chunks.isEmpty || chunks[chunks.count - 1].count >= Self.chunkCapacity {
            var chunk: [Record] = []
            chunk.reserveCapacity(chunks.isEmpty ? 16 : Self.chunkCapacity)
            chunks.append(chunk)
        }
        chunks[chunks.count - 1].append(record)
        count += 1
    }

    /// Record `lsn`, if it is here. (Not a generic `withRecord`: a generic function of this
    /// module is not specialized in the model's, and every stored value read comes here.)
    package func find(_ lsn: UInt64) -> Record? {
        if let (c, i) = computedPlace(of: lsn) { return chunks[c][i] }
        // The last chunk whose first record is at or before `lsn`.
        var lo = 0, hi = chunks.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if chunks[mid][0].lsn <= lsn { lo = mid + 1 } else { hi = mid }
        }
        guard lo > 0 else { return nil }
        let chunk = chunks[lo - 1]
        var a = 0, b = chunk.count
        while a < b {
            let mid = (a + b) / 2
            if chunk[mid].lsn < lsn { a = mid + 1 } else { b = mid }
        }
        guard a < chunk.count, chunk[a].lsn == lsn else { return nil }
        return chunk[a]
    }

    /// Where record `lsn` is, computed from its LSN: records appended to a log have
    /// consecutive LSNs, and every chunk after the first is full but the last. Nil when the
    /// record there is not `lsn` (the records are not consecutive: ``find(_:)`` then searches).
    package func computedPlace(of lsn: UInt64) -> (chunk: Int, index: Int)? {
        guard let first = chunks.first?.first, lsn >= first.lsn else { return nil }
        var i = Int(truncatingIfNeeded: lsn &- first.lsn), c = 0
        if i >= chunks[0].count {
            i -= chunks[0].count
            c = 1 + i / Self.chunkCapacity
            i %= Self.chunkCapacity
        }
        guard c < chunks.count, i < chunks[c].count, chunks[c][i].lsn == lsn else { return nil }
        return (c, i)
    }

    /// Removes the records below `lsn` (they are first).
    package mutating func removeAll(below lsn: UInt64) {
        var dropChunks = 0
        while dropChunks < chunks.count, let last = chunks[dropChunks].last, last.lsn < lsn { dropChunks += 1 }
        for c in chunks[..<dropChunks] { count -= c.count }
        chunks.removeFirst(dropChunks)
        guard !chunks.isEmpty else { return }
        let n = chunks[0].firstIndex { $0.lsn >= lsn } ?? chunks[0].count
        chunks[0].removeFirst(n)
        count -= n
        if chunks[0].isEmpty { chunks.removeFirst() }
    }

    /// Keeps only the records `keep` selects, in order, in full chunks.
    package mutating func removeAll(keeping keep: (UInt64) -> Bool) {
        var out = RecordList()
        for chunk in chunks {
            for r in chunk where keep(r.lsn) { out.append(r) }
        }
        self = out
    }

    /// The payload bytes of every record.
    package var payloadBytes: Int { chunks.reduce(0) { $0 + $1.reduce(0) { $0 + $1.payload.count } } }
}
