#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The pending local writes, oldest first: ids, paths (as index keys, in one byte arena) and
/// flags — about 30 bytes a write. Their values stay in their log records (or, for a memory-only
/// store, in the inline records).
struct PendingList {
    private(set) var ids: [Int64] = []
    private var flags: [UInt8] = []
    private var pathEnds: [UInt32] = []
    private var pathBytes: [UInt8] = []
    /// Whole records, for stores that keep values in memory.
    private var inline: [Int64: WriteRecord] = [:]

    static let overwriteFlag: UInt8 = 1
    static let visibleFlag: UInt8 = 2

    var count: Int { ids.count }
    /// The bytes of every pending write's path key.
    var keyBytes: Int { pathBytes.count }
    var isEmpty: Bool { ids.isEmpty }

    mutating func append(_ id: Int64, path: Path, isOverwrite: Bool, visible: Bool, inline record: WriteRecord?) {
        precondition(ids.last.map { $0 < id } ?? true, "pending writes are kept in id order")
        ids.append(id)
        flags.append((isOverwrite ? Self.overwriteFlag : 0) | (visible ? Self.visibleFlag : 0))
        pathBytes.append(contentsOf: PathKey.encode(path))
        pathEnds.append(UInt32(pathBytes.count))
        if let record { inline[id] = record }
    }

    /// Makes room for `count` more writes whose path keys take about `keyBytes` in all.
    mutating func reserveCapacity(adding count: Int, keyBytes: Int) {
        ids.reserveCapacity(ids.count + count)
        flags.reserveCapacity(flags.count + count)
        pathEnds.reserveCapacity(pathEnds.count + count)
        pathBytes.reserveCapacity(pathBytes.count + keyBytes)
    }

    /// Appends a write as a checkpoint kept it: its path as an index key.
    mutating func append(_ id: Int64, flags: UInt8, key: UnsafeRawBufferPointer) {
        precondition(ids.last.map { $0 < id } ?? true, "pending writes are kept in id order")
        ids.append(id)
        self.flags.append(flags & (Self.overwriteFlag | Self.visibleFlag))
        pathBytes.append(contentsOf: key)
        pathEnds.append(UInt32(pathBytes.count))
    }

    func index(of id: Int64) -> Int? {
        var lo = 0, hi = ids.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if ids[mid] < id { lo = mid + 1 } else { hi = mid }
        }
        return lo < ids.count && ids[lo] == id ? lo : nil
    }

    func path(at i: Int) -> Path { PathKey.decode(pathBytes[(i == 0 ? 0 : Int(pathEnds[i - 1]))..<Int(pathEnds[i])]) }
    /// The path of the write at `i` as an index key, valid only during the call.
    func withKey<R>(at i: Int, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try pathBytes.withUnsafeBytes { try body(UnsafeRawBufferPointer(rebasing: $0[(i == 0 ? 0 : Int(pathEnds[i - 1]))..<Int(pathEnds[i])])) }
    }
    func flags(at i: Int) -> UInt8 { flags[i] }

    /// Whether the path of the write at `i` and the path whose index key is `key` are on one
    /// line (one contains the other), compared as bytes without building paths.
    func isRelated(at i: Int, toKey key: UnsafeRawBufferPointer) -> Bool {
        withKey(at: i) { k in
            let n = min(k.count, key.count)
            return n == 0 || memcmp(k.baseAddress!, key.baseAddress!, n) == 0
        }
    }
    func isOverwrite(at i: Int) -> Bool { flags[i] & Self.overwriteFlag != 0 }
    func isVisible(at i: Int) -> Bool { flags[i] & Self.visibleFlag != 0 }
    func inlineRecord(_ id: Int64) -> WriteRecord? { inline[id] }

    mutating func remove(at i: Int) {
        let start = i == 0 ? 0 : Int(pathEnds[i - 1])
        let end = Int(pathEnds[i])
        pathBytes.removeSubrange(start..<end)
        pathEnds.remove(at: i)
        for j in i..<pathEnds.count { pathEnds[j] -= UInt32(end - start) }
        inline[ids[i]] = nil
        ids.remove(at: i)
        flags.remove(at: i)
    }

    mutating func removeAll() { self = PendingList() }

    var footprint: Int { ids.capacity * 8 + flags.capacity + pathEnds.capacity * 4 + pathBytes.capacity }
}
