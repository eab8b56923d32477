/// A value in an index: the node itself, or where it sits in a log record.
enum ValueHandle: Sendable {
    case inline(Node)
    case stored(ValueRef)
}

/// An index entry: a value and its sequence number (the write id or LSN that put it there).
struct LayeredEntry: Sendable {
    var seq: Int64
    var value: ValueHandle
}

/// Where stored values are read from (the database's log).
protocol ValueReader: AnyObject {
    func node(_ ref: ValueRef) -> Node
}

/// Complete values at paths, layered: setting a value at a path replaces everything below it,
/// so an entry below another is always newer and overrides that part of it. The data at a
/// path is the value of the deepest entry on the way to it, with the entries below it on top.
///
/// The write tree's overlay and the database's server cache are both one of these.
final class LayeredIndex {
    private(set) var index = PathIndex<LayeredEntry>()
    weak var reader: (any ValueReader)?

    var isEmpty: Bool { index.isEmpty }
    var count: Int { index.count }

    func value(_ handle: ValueHandle) -> Node {
        switch handle {
        case .inline(let n): return n
        case .stored(let ref): return reader?.node(ref) ?? .empty
        }
    }

    /// Sets the value at `path`, dropping everything below it. `removed` sees each dropped entry.
    func set(_ entry: LayeredEntry, at path: Path, removed: (LayeredEntry) -> Void = { _ in }) {
        let key = PathKey.encode(path)
        index.removeAll(withPrefix: key, removed)
        index.set(key, entry)
    }

    /// Removes the entry at `path` and everything below it.
    func removeSubtree(_ path: Path, removed: (LayeredEntry) -> Void = { _ in }) {
        index.removeAll(withPrefix: PathKey.encode(path), removed)
    }

    func removeAll() { index.removeAll() }

    /// The deepest entry from the root down to `path`.
    func deepestChainEntry(_ path: Path) -> (path: Path, entry: LayeredEntry)? {
        guard !index.isEmpty else { return nil }
        var found: (Path, LayeredEntry)?
        var current = Path.root
        var key: [UInt8] = []
        if let e = index.get(key) { found = (current, e) }
        for k in path.keys {
            key.append(contentsOf: k.utf8)
            key.append(0)
            current = current.child(k)
            if let e = index.get(key) { found = (current, e) }
        }
        return found
    }

    /// Entries strictly below `path` with their paths relative to it, oldest first.
    func entries(below path: Path) -> [(path: Path, entry: LayeredEntry)] {
        let prefix = PathKey.encode(path)
        var out: [(key: ArraySlice<UInt8>, entry: LayeredEntry)] = []
        index.forEach(withPrefix: prefix) { k, e in if k.count > prefix.count { out.append((k, e)) } }
        out.sort { $0.entry.seq != $1.entry.seq ? $0.entry.seq < $1.entry.seq : $0.key.lexicographicallyPrecedes($1.key) }
        return out.map { (PathKey.decode($0.key.dropFirst(prefix.count)), $0.entry) }
    }

    /// The complete data at `path`, or nil when no entry at or above it makes it complete.
    func completeNode(at path: Path) -> Node? {
        guard let (chainPath, entry) = deepestChainEntry(path) else { return nil }
        var node = value(entry.value).getChild(chainPath.relative(to: path))
        for (relative, e) in entries(below: path) { node = node.updatingChild(relative, value(e.value)) }
        return node
    }

    func isComplete(at path: Path) -> Bool { deepestChainEntry(path) != nil }

    /// Whether any entry is at, above or below `path`.
    func touches(_ path: Path) -> Bool {
        deepestChainEntry(path) != nil || index.hasKey(withPrefix: PathKey.encode(path))
    }

    /// The complete children of `path` (each an entry at or above it): for partial data.
    func completeChildren(of path: Path) -> Node {
        var node = Node.empty
        let prefix = PathKey.encode(path)
        var keys: [String] = []
        index.forEach(withPrefix: prefix) { k, _ in
            let rest = k.dropFirst(prefix.count)
            if let end = rest.firstIndex(of: 0), end == rest.index(before: rest.endIndex) {
                keys.append(String(decoding: rest[rest.startIndex..<end], as: UTF8.self))
            }
        }
        for key in keys {
            if let child = completeNode(at: path.child(key)), !child.isEmpty { node = node.updatingImmediateChild(key, child) }
        }
        return node
    }

    /// Every entry, in key order (for checkpoints).
    func forEach(_ body: (ArraySlice<UInt8>, LayeredEntry) throws -> Void) rethrows {
        try index.forEach(withPrefix: [], body)
    }

    var footprint: Int { index.footprint }
}
