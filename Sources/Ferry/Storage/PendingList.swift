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
    var isEmpty: Bool { ids.isEmpty }

    mutating func append(_ id: Int64, path: Path, isOverwrite: Bool, visible: Bool, inline record: WriteRecord?) {
        precondition(ids.last.map { $0 < id } ?? true, "pending writes are kept in id order")
        ids.append(id)
        flags.append((isOverwrite ? Self.overwriteFlag : 0) | (visible ? Self.visibleFlag : 0))
        pathBytes.append(contentsOf: PathKey.encode(path))
        pathEnds.append(UInt32(pathBytes.count))
        if let record { inline[id] = record }
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
