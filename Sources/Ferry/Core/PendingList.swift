#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The pending local writes, oldest first: ids, paths (as index keys, in one byte arena) and
/// flags — about 30 bytes a write. Their values stay in their log records (or, for a memory-only
/// store, in the inline records).
///
/// Writes are acknowledged in write order, so the oldest leaves first: ``removeFirst()`` moves a
/// head offset (O(1); the storage is compacted once the removed part is half of it, O(1)
/// amortized). Removing any other write (``remove(at:)``, an out-of-order acknowledgement or a
/// rejection) is O(n).
struct PendingList {
    private var storedIDs: [Int64] = []
    private var storedFlags: [UInt8] = []
    /// End offset in `pathBytes` of each write's path key (absolute, from `pathBytes[0]`).
    private var pathEnds: [UInt32] = []
    private var pathBytes: [UInt8] = []
    /// Writes below this index have been removed from the front.
    private var head = 0
    /// Whole records, for stores that keep values in memory.
    private var inline: [Int64: WriteRecord] = [:]

    static let overwriteFlag: UInt8 = 1
    static let visibleFlag: UInt8 = 2

    var count: Int { storedIDs.count - head }
    var isEmpty: Bool { count == 0 }
    /// The bytes of every pending write's path key.
    var keyBytes: Int { pathBytes.count - keyStart(head) }

    /// The id of the write at `i` (0 is the oldest).
    func id(at i: Int) -> Int64 { storedIDs[head + i] }
    var firstID: Int64? { isEmpty ? nil : storedIDs[head] }
    var lastID: Int64? { isEmpty ? nil : storedIDs[storedIDs.count - 1] }
    /// Every id, oldest first.
    var ids: ArraySlice<Int64> { storedIDs[head...] }

    private func keyStart(_ stored: Int) -> Int { stored == 0 ? 0 : Int(pathEnds[stored - 1]) }

    mutating func append(_ id: Int64, path: Path, isOverwrite: Bool, visible: Bool, inline record: WriteRecord?) {
        append(id, key: PathKey.encode(path), isOverwrite: isOverwrite, visible: visible, inline: record)
    }

    /// Appends a write whose path's index key (``PathKey/encode(_:)``) is `key`.
    mutating func append(_ id: Int64, key: [UInt8], isOverwrite: Bool, visible: Bool, inline record: WriteRecord?) {
        precondition(lastID.map { $0 < id } ?? true, "pending writes are kept in id order")
        storedIDs.append(id)
        storedFlags.append((isOverwrite ? Self.overwriteFlag : 0) | (visible ? Self.visibleFlag : 0))
        pathBytes.append(contentsOf: key)
        pathEnds.append(UInt32(pathBytes.count))
        if let record { inline[id] = record }
    }

    /// Makes room for `count` more writes whose path keys take about `keyBytes` in all.
    mutating func reserveCapacity(adding count: Int, keyBytes: Int) {
        storedIDs.reserveCapacity(storedIDs.count + count)
        storedFlags.reserveCapacity(storedFlags.count + count)
        pathEnds.reserveCapacity(pathEnds.count + count)
        pathBytes.reserveCapacity(pathBytes.count + keyBytes)
    }

    /// Appends a write as a checkpoint kept it: its path as an index key.
    mutating func append(_ id: Int64, flags: UInt8, key: UnsafeRawBufferPointer) {
        precondition(lastID.map { $0 < id } ?? true, "pending writes are kept in id order")
        storedIDs.append(id)
        storedFlags.append(flags & (Self.overwriteFlag | Self.visibleFlag))
        pathBytes.append(contentsOf: key)
        pathEnds.append(UInt32(pathBytes.count))
    }

    /// Appends writes as a checkpoint kept them: ids (rising), flags, and path keys end to end,
    /// `keyEnds` giving the end of each within `keys`.
    mutating func append(ids: [Int64], flags: UnsafeRawBufferPointer, keys: UnsafeRawBufferPointer, keyEnds: [UInt32]) {
        precondition(ids.first.map { id in lastID.map { $0 < id } ?? true } ?? true, "pending writes are kept in id order")
        storedIDs.append(contentsOf: ids)
        for f in flags { storedFlags.append(f & (Self.overwriteFlag | Self.visibleFlag)) }
        let base = UInt32(pathBytes.count)
        pathBytes.append(contentsOf: keys)
        for end in keyEnds { pathEnds.append(base + end) }
    }

    /// The position of the write `id`, by binary search: O(log n).
    func index(of id: Int64) -> Int? {
        let i = firstIndex(notBelow: id)
        return i < count && self.id(at: i) == id ? i : nil
    }

    /// The position of the first write whose id is `id` or above (`count` when none is), by
    /// binary search: O(log n).
    func firstIndex(notBelow id: Int64) -> Int {
        var lo = head, hi = storedIDs.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if storedIDs[mid] < id { lo = mid + 1 } else { hi = mid }
        }
        return lo - head
    }

    func path(at i: Int) -> Path { PathKey.decode(pathBytes[keyStart(head + i)..<Int(pathEnds[head + i])]) }
    /// The path of the write at `i` as an index key, valid only during the call.
    func withKey<R>(at i: Int, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        let range = keyStart(head + i)..<Int(pathEnds[head + i])
        return try pathBytes.withUnsafeBytes { try body(UnsafeRawBufferPointer(rebasing: $0[range])) }
    }
    func flags(at i: Int) -> UInt8 { storedFlags[head + i] }

    /// Whether the path of the write at `i` and the path whose index key is `key` are on one
    /// line (one contains the other), compared as bytes without building paths.
    func isRelated(at i: Int, toKey key: UnsafeRawBufferPointer) -> Bool {
        withKey(at: i) { k in
            let n = min(k.count, key.count)
            return n == 0 || memcmp(k.baseAddress!, key.baseAddress!, n) == 0
        }
    }
    func isOverwrite(at i: Int) -> Bool { flags(at: i) & Self.overwriteFlag != 0 }
    func isVisible(at i: Int) -> Bool { flags(at: i) & Self.visibleFlag != 0 }
    func inlineRecord(_ id: Int64) -> WriteRecord? { inline.isEmpty ? nil : inline[id] }

    /// Removes the oldest write: O(1) amortized.
    mutating func removeFirst() {
        precondition(!isEmpty)
        if !inline.isEmpty { inline[storedIDs[head]] = nil }
        head += 1
        if head == storedIDs.count {
            storedIDs.removeAll(keepingCapacity: true)
            storedFlags.removeAll(keepingCapacity: true)
            pathEnds.removeAll(keepingCapacity: true)
            pathBytes.removeAll(keepingCapacity: true)
            head = 0
        } else if head >= 1024 && head * 2 >= storedIDs.count {
            compact()
        }
    }

    /// Drops the storage of writes removed from the front.
    private mutating func compact() {
        let start = keyStart(head)
        storedIDs.removeFirst(head)
        storedFlags.removeFirst(head)
        pathEnds.removeFirst(head)
        for j in pathEnds.indices { pathEnds[j] -= UInt32(start) }
        pathBytes.removeFirst(start)
        head = 0
    }

    /// Removes the write at `i`: O(n) (O(1) for the oldest, see ``removeFirst()``).
    mutating func remove(at i: Int) {
        if i == 0 { return removeFirst() }
        let s = head + i
        let start = keyStart(s)
        let end = Int(pathEnds[s])
        pathBytes.removeSubrange(start..<end)
        pathEnds.remove(at: s)
        for j in s..<pathEnds.count { pathEnds[j] -= UInt32(end - start) }
        if !inline.isEmpty { inline[storedIDs[s]] = nil }
        storedIDs.remove(at: s)
        storedFlags.remove(at: s)
    }

    mutating func removeAll() { self = PendingList() }

    var footprint: Int { storedIDs.capacity * 8 + storedFlags.capacity + pathEnds.capacity * 4 + pathBytes.capacity }
}
