/// A value in an index: the node itself, or where it sits in a log record.
enum ValueHandle: Sendable {
    case inline(Node)
    case stored(ValueRef)
}

/// An index entry: a value, its sequence number (the write id or LSN that put it there), and
/// whether the value is empty (null) — known when the entry is made, so that stored values need
/// not be read to know it.
struct LayeredEntry: Sendable {
    var seq: Int64
    var value: ValueHandle
    var empty: Bool

    init(seq: Int64, value: ValueHandle, empty: Bool) {
        self.seq = seq
        self.value = value
        self.empty = empty
    }

    /// An entry with an inline node.
    init(seq: Int64, node: Node) {
        self.init(seq: seq, value: .inline(node), empty: node.isEmpty)
    }
}

extension ValueRef {
    /// An empty value that is not stored anywhere (a marker entry's).
    static let emptyValue = ValueRef(lsn: 0, offset: 0, length: 0)
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
        case .stored(let ref): return ref.length == 0 ? .empty : (reader?.node(ref) ?? .empty)
        }
    }

    /// Sets the value at `path`, dropping everything below it. `removed` sees each dropped entry.
    ///
    /// Writing a value below a leaf turns that leaf into an object. So that this holds even
    /// after the entry is itself replaced (by a null, say), an empty marker entry is put where
    /// the leaf was first — as folding the writes in order would leave it.
    func set(_ entry: LayeredEntry, at path: Path, removed: (LayeredEntry) -> Void = { _ in }) {
        if !entry.empty, let (above, aboveEntry) = deepestChainEntry(path, strictlyAbove: true) {
            let keys = above.relative(to: path).keys
            var node = value(aboveEntry.value)
            for j in 0..<keys.count {
                let location = above.child(Path(keys: Array(keys[0..<j])))
                if node.isLeaf {
                    if keys[j] != ".priority" && !hasNonEmptyEntry(below: location) {
                        let markerKey = PathKey.encode(location)
                        index.removeAll(withPrefix: markerKey, removed)
                        index.set(markerKey, LayeredEntry(seq: entry.seq, value: .stored(.emptyValue), empty: true))
                    }
                    break
                }
                if node.isEmpty { break }
                node = node.getImmediateChild(keys[j])
            }
        }
        let key = PathKey.encode(path)
        index.removeAll(withPrefix: key, removed)
        index.set(key, entry)
    }

    private func hasNonEmptyEntry(below path: Path) -> Bool {
        let prefix = PathKey.encode(path)
        var found = false
        index.forEach(withPrefix: prefix) { k, e in if k.count > prefix.count && !e.empty { found = true } }
        return found
    }

    /// Puts back an entry exactly as a checkpoint stored it (no markers: they are stored too).
    func restore(_ entry: LayeredEntry, key: [UInt8]) { index.set(key, entry) }

    /// Removes the entry at `path` and everything below it.
    func removeSubtree(_ path: Path, removed: (LayeredEntry) -> Void = { _ in }) {
        index.removeAll(withPrefix: PathKey.encode(path), removed)
    }

    func removeAll() { index.removeAll() }

    /// The deepest entry from the root down to `path` (or to its parent).
    func deepestChainEntry(_ path: Path, strictlyAbove: Bool = false) -> (path: Path, entry: LayeredEntry)? {
        guard !index.isEmpty else { return nil }
        var found: (Path, LayeredEntry)?
        var current = Path.root
        var key: [UInt8] = []
        if let e = index.get(key), !(strictlyAbove && path.isEmpty) { found = (current, e) }
        for k in (strictlyAbove ? Array(path.keys.dropLast()) : path.keys) {
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
