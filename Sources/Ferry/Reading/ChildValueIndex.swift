/// Sort keys whose byte order is the Realtime Database's order of children by a value: the
/// value (Firebase's order of values: null, server values, booleans, numbers, strings, objects)
/// then the child's key (Firebase's key order: 32-bit integers by value, then strings by
/// UTF-16). Strings are written as UTF-16 code units, each as three bytes of (unit + 1), ended
/// by three zero bytes, so that a prefix sorts first.
enum SortKey {
    /// Writes the sort key of `value` (the child's indexed value) and `key`; false when the value
    /// cannot be ordered by bytes exactly (an integer beyond ±2^53, where Firebase's mixed
    /// integer and double comparisons are not a total order of doubles).
    static func encode(value: Node, key: String, into out: inout [UInt8]) -> Bool {
        var valueLength = 0
        return encode(value: value, key: key, into: &out, valueLength: &valueLength)
    }

    /// ``encode(value:key:into:)``, telling how many of the bytes encode the value (the rest
    /// encode the key, so that keys with equal values sort in key order).
    static func encode(value: Node, key: String, into out: inout [UInt8], valueLength: inout Int) -> Bool {
        out.removeAll(keepingCapacity: true)
        valueLength = 0  // (also when no sort key is made: nothing of `out` is a value)
        switch value {
        case .empty: out.append(0)
        case .plainLeaf(let v), .prioritizedLeaf(let v, _):
            switch v {
            case .deferred, .post: out.append(1)
            case .bool(let b): out.append(contentsOf: [2, b ? 1 : 0])
            case .int(let i):
                guard i.magnitude <= 1 << 53 else { return false }
                number(Double(i), into: &out)
            case .double(let d): number(d, into: &out)
            case .string(let s):
                out.append(4)
                units(s, into: &out)
            }
        case .plainChildren, .prioritizedChildren: out.append(5)
        case .max: out.append(6)
        }
        valueLength = out.count
        if let n = KeyOrder.integerValue(key) {
            out.append(0)
            let biased = UInt32(bitPattern: Int32(n)) ^ 0x8000_0000
            out.append(contentsOf: [UInt8(biased >> 24), UInt8(biased >> 16 & 0xff), UInt8(biased >> 8 & 0xff), UInt8(biased & 0xff)])
            let length = key.utf8.count  // (leading zeros make long integer keys: up to 768 bytes)
            out.append(contentsOf: [UInt8(length >> 8), UInt8(length & 0xff)])
        } else {
            out.append(1)
        }
        units(key, into: &out)
        return true
    }

    private static func number(_ d: Double, into out: inout [UInt8]) {
        out.append(3)
        let bits = (d == 0 ? 0.0 : d).bitPattern  // -0 and 0 are equal
        let ordered = bits & (1 << 63) != 0 ? ~bits : bits | (1 << 63)
        for shift in stride(from: 56, through: 0, by: -8) { out.append(UInt8(ordered >> UInt64(shift) & 0xff)) }
    }

    private static func units(_ s: String, into out: inout [UInt8]) {
        var s = s
        let ascii = s.withUTF8 { utf8 -> Bool in
            // (An ASCII key's units are its bytes: read as such, not through the UTF-16 view,
            // which was ~12% of building an index over a million posts.)
            guard !utf8.contains(where: { $0 >= 0x80 }) else { return false }
            out.reserveCapacity(out.count + 3 * utf8.count + 3)
            for b in utf8 {
                out.append(0)
                out.append(0)
                out.append(b + 1)  // (a unit is stored plus one: 0 0 0 ends the units)
            }
            return true
        }
        if !ascii {
            for u in s.utf16 {
                let v = UInt32(u) + 1
                out.append(UInt8(v >> 16))
                out.append(UInt8(v >> 8 & 0xff))
                out.append(UInt8(v & 0xff))
            }
        }
        out.append(0)
        out.append(0)
        out.append(0)
    }

    /// Where the child's key's units start in a sort key; nil when the bytes are not a sort
    /// key (checked whole: every unit in range, the terminators where they belong).
    static func keyStart(_ bytes: [UInt8]) -> Int? { bytes.withUnsafeBytes { keyStart($0) } }

    static func keyStart(_ bytes: UnsafeRawBufferPointer) -> Int? {
        let n = bytes.count
        /// Past the units from `i` and their terminator; nil when a unit is out of range or
        /// the terminator is missing.
        @inline(__always) func skipUnits(_ from: Int) -> Int? {
            var i = from
            while i + 3 <= n {
                // A unit is 0x000000 (the terminator), below 0x010000, or 0x010000 itself.
                let high = bytes[i], rest = bytes[i + 1] | bytes[i + 2]
                i += 3
                if high == 0 {
                    if rest == 0 { return i }
                } else if high > 1 || rest != 0 {
                    return nil
                }
            }
            return nil
        }
        guard n > 0 else { return nil }
        var i = 1
        switch bytes[0] {
        case 0, 1, 5, 6: break
        case 2: i += 1
        case 3: i += 8
        case 4:
            guard let next = skipUnits(i) else { return nil }
            i = next
        default: return nil
        }
        guard i < n, bytes[i] <= 1 else { return nil }
        i += bytes[i] == 0 ? 7 : 1
        guard i <= n, skipUnits(i) == n else { return nil }
        return i
    }

    /// The child's key in a sort key; nil when the bytes are not a sort key.
    static func key(of bytes: [UInt8]) -> String? {
        guard var i = keyStart(bytes) else { return nil }
        var units: [UInt16] = []
        while i + 3 < bytes.count {
            units.append(UInt16((UInt32(bytes[i]) << 16 | UInt32(bytes[i + 1]) << 8 | UInt32(bytes[i + 2])) - 1))
            i += 3
        }
        return String(decoding: units, as: UTF16.self)
    }
}

/// The children of one location in the order of the value at one child path below each
/// (``DatabaseOptions/indexes``): derived state, kept in step with the data a reader sees.
///
/// Every change to the server cache or the pending writes' overlay is reported to it (it
/// observes both ``LayeredIndex``es): a change below a child marks that child (remembering,
/// the first time, where the child sat in the index); a change at or above the location
/// marks the whole index for a rebuild. Marked children are put in their new places before
/// the index is read (``refresh(_:)``) or checkpointed. A rebuild walks the location's
/// children on a frozen copy of the data, outside the engine's lock.
final class ChildValueIndex: LayeredChangeObserver {
    let location: Path
    let child: Path
    let locationKey: [UInt8]
    /// The sort keys (entries unused).
    private(set) var sorted = PathIndex<UInt8>()
    /// Children changed since their place in ``sorted`` was computed: child key → the sort key
    /// it had there (nil when it was not there).
    private var marked: [String: [UInt8]?] = [:]
    /// Whether ``sorted`` must be rebuilt from the data (never built, or changed at or above
    /// the location).
    private(set) var needsRebuild = true
    /// Whether some indexed value cannot be ordered by bytes (see ``SortKey``): not used then.
    private(set) var unusable = false
    /// Marks by key seen while a rebuild runs outside the lock (they are applied after it).
    private var markedDuringRebuild: Set<String>?
    /// How the current data at a path is read (the engine's visible node).
    weak var source: (any VisibleData)?
    /// Made for listeners, not declared (``DatabaseOptions/automaticIndexes``): dropped when
    /// they are gone, never kept in a checkpoint.
    var automatic = false
    /// Listeners being added that will use this index (it is built before they are
    /// registered): an automatic index is not dropped while there are any.
    var arrivingListeners = 0
    /// A rebuild outside the lock is scheduled (see ``Engine/takeIndexRebuildsDue()``).
    var rebuildScheduled = false
    /// The engine's registrations as they were when no listener was found using this index
    /// (``Registrations/version``): not asked again until they change.
    var idleAt: UInt64?
    /// The index was reset because it could not order a value and a child changed (the value
    /// may be gone): the next query rebuilds it, but no background rebuild is scheduled for
    /// that (it would run at every write below the location while the value stays).
    private(set) var resetForUnusable = false
    /// Bumped by every reset: a rebuild begun before one is refused when it finishes.
    private var generation: UInt64 = 0
    private var buffer: [UInt8] = []

    init(location: Path, child: Path) {
        self.location = location
        self.child = child
        self.locationKey = PathKey.encode(location)
    }

    var isCurrent: Bool { !needsRebuild && marked.isEmpty && !unusable }

    // MARK: LayeredChangeObserver

    func willChange(_ key: UnsafeRawBufferPointer) {
        if key.count > locationKey.count {
            guard locationKey.withUnsafeBytes({ key.starts(with: $0) }) else { return }
            let rest = UnsafeRawBufferPointer(rebasing: key[locationKey.count...])
            let end = rest.firstIndex(of: 0) ?? rest.count
            let name = String(decoding: UnsafeRawBufferPointer(rebasing: rest[..<end]), as: UTF8.self)
            if name == ".priority" { return }  // the location's own priority: not a child
            if markedDuringRebuild != nil { markedDuringRebuild!.insert(name) }
            // An index that could not order a value is built again (the value may be gone).
            if unusable && !needsRebuild {
                willChangeEverything()
                resetForUnusable = true
                return
            }
            if needsRebuild || marked[name] != nil { return }
            marked.updateValue(currentSortKey(name), forKey: name)
        } else if locationKey.withUnsafeBytes({ $0.starts(with: key) }) {
            willChangeEverything()
        }
    }

    /// Marked children beyond which the engine puts them in their places at the end of the
    /// operation under way (``refreshIsDue``), rather than holding many marks — and one long
    /// refresh under the lock — for the next read.
    static let markLimit = 4096

    var refreshIsDue: Bool { marked.count >= Self.markLimit }

    func willChangeEverything() {
        needsRebuild = true
        unusable = false
        resetForUnusable = false
        marked = [:]
        sorted.removeAll()
        markedDuringRebuild = nil  // (a rebuild under way is stale: refused when it finishes)
        generation &+= 1
    }

    /// The sort key child `name` has in the current data (nil when it has no data).
    private func currentSortKey(_ name: String) -> [UInt8]? {
        guard let engine = source else { return nil }
        let node = engine.visibleNode(at: location.child(name)) ?? .empty
        return sortKey(name, node)
    }

    private func sortKey(_ name: String, _ node: Node) -> [UInt8]? {
        if node.isEmpty { return nil }
        var out: [UInt8] = []
        guard SortKey.encode(value: node.getChild(child), key: name, into: &out) else {
            unusable = true
            return nil
        }
        return out
    }

    /// The name of the child right after `post` (before it, with `reverse`) in the index's
    /// order, by the data as it is now: `.some(nil)` when there is none, nil when the index
    /// cannot say (not built, or `post`'s value cannot be ordered by bytes). O(log n) plus
    /// the marked children put in their places.
    func child(after post: NamedNode, reverse: Bool) -> String?? {
        refresh()
        guard !needsRebuild && !unusable else { return nil }
        var key: [UInt8] = []
        guard SortKey.encode(value: post.node.getChild(child), key: post.name, into: &key) else { return nil }
        guard let next = sorted.neighbour(of: key, after: !reverse) else { return .some(nil) }
        guard let name = SortKey.key(of: next) else { return nil }
        return .some(name)
    }

    /// Puts every marked child in its place (under the engine's lock).
    func refresh() {
        guard !needsRebuild, !marked.isEmpty else { return }
        for (name, old) in marked {
            if let old { sorted.removeAll(withPrefix: old) }
            if let new = currentSortKey(name) { _ = sorted.set(new, 0) }
        }
        marked = [:]
    }

    /// Whether a rebuild is running outside the lock — until it finishes or is cancelled, even
    /// when a reset made it stale (only one at a time: a second would lose the first's record
    /// of the changes made meanwhile, and a stale one could install over it).
    private(set) var isRebuilding = false

    /// Starts a rebuild (under the lock): later changes are remembered by key. Returns the
    /// token its finish or cancellation gives back.
    func beginRebuild() -> UInt64 {
        precondition(!isRebuilding, "one rebuild at a time")
        isRebuilding = true
        markedDuringRebuild = []
        return generation
    }

    /// Gives up the rebuild begun with `token` (the data was not complete, or could not be read).
    func cancelRebuild(_ token: UInt64) {
        isRebuilding = false
        if token == generation { markedDuringRebuild = nil }
    }

    /// Builds the index from `data` (a frozen copy, outside the lock): the sort keys in order.
    static func build(_ data: FrozenData, location: Path, child: Path) -> (PathIndex<UInt8>, usable: Bool)? {
        guard let lazy = LazyLocation.make(data, at: location) else { return nil }
        // The sort keys end to end in one buffer (not an array each), sorted by position.
        var bytes: [UInt8] = [], starts: [Int] = [0], values: [Int] = []
        var usable = true
        var out: [UInt8] = []
        var valueLength = 0
        // (Each child's indexed value alone, in key order: keys with equal values sort in
        // key order, so they are sorted by their values' bytes, ties kept in this order.)
        var cursor = ChildCursor(lazy, decode: true, projection: child)
        while let (name, value) = cursor.next() {
            if !SortKey.encode(value: value ?? .empty, key: name, into: &out, valueLength: &valueLength) { usable = false }
            values.append(bytes.count + valueLength)
            bytes.append(contentsOf: out)
            starts.append(bytes.count)
        }
        var index = PathIndex<UInt8>()
        bytes.withUnsafeBytes { all in
            func key(_ i: Int) -> UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: all[starts[i]..<starts[i + 1]]) }
            func value(_ i: Int32) -> UnsafeRawBufferPointer { UnsafeRawBufferPointer(rebasing: all[starts[Int(i)]..<values[Int(i)]]) }
            var order = (0..<(starts.count - 1)).map { SortEntry(value(Int32($0)), index: $0) }
            // (Most values fit in 16 bytes, compared as two numbers; memcmp through the buffer
            // for every comparison of whole keys was ~45% of building the index over a million
            // posts.)
            order.sort { a, b in
                if a.head != b.head { return a.head < b.head }
                if a.tail != b.tail { return a.tail < b.tail }
                if a.length <= 16 && b.length <= 16 {
                    if a.length != b.length { return a.length < b.length }
                } else {
                    let c = compareBytes(value(a.index), value(b.index))
                    if c != 0 { return c < 0 }
                }
                return a.index < b.index
            }
            for e in order { _ = index.append(key(Int(e.index)), 0) }
        }
        return (index, usable)
    }

    /// A sort key's value bytes: the first 16 as two big-endian numbers (zeros past their
    /// end), which order as the bytes do, and how many there are.
    private struct SortEntry {
        var head: UInt64
        var tail: UInt64
        var length: Int32
        var index: Int32

        init(_ value: UnsafeRawBufferPointer, index: Int) {
            var first = (UInt64(0), UInt64(0))
            withUnsafeMutableBytes(of: &first) { $0.copyMemory(from: UnsafeRawBufferPointer(rebasing: value.prefix(16))) }
            head = UInt64(bigEndian: first.0)
            tail = UInt64(bigEndian: first.1)
            length = Int32(clamping: value.count)
            self.index = Int32(index)
        }
    }

    /// Installs a rebuilt index (under the lock): children changed while it was built move
    /// from where the frozen data had them to where the current data has them. False when the
    /// location itself changed meanwhile (the rebuild is thrown away).
    func finishRebuild(_ built: PathIndex<UInt8>, usable: Bool, frozen: FrozenData, token: UInt64) -> Bool {
        isRebuilding = false
        guard token == generation, let changed = markedDuringRebuild else { return false }
        markedDuringRebuild = nil
        sorted = built
        needsRebuild = false
        unusable = !usable
        for name in changed {
            let then = frozen.visibleNode(at: location.child(name)) ?? .empty
            if let old = sortKey(name, then) { sorted.removeAll(withPrefix: old) }
            if let new = currentSortKey(name) { _ = sorted.set(new, 0) }
        }
        return true
    }

    /// Restores a sort key a checkpoint kept (in order); false when it is not a sort key.
    func restore(_ key: [UInt8]) -> Bool {
        guard SortKey.keyStart(key) != nil else { return false }
        _ = key.withUnsafeBytes { sorted.append($0, 0) }
        return true
    }

    /// Puts back a chunk of sort keys as a checkpoint kept it (format 6); the caller has
    /// checked them (sort keys, rising after every key here).
    func restoreChunk(prefix: [UInt8], suffixes: [UInt8], ends: [UInt32]) {
        sorted.appendChunk(prefix: prefix, suffixes: suffixes, ends: ends, entries: [UInt8](repeating: 0, count: ends.count))
    }

    func finishRestore() { needsRebuild = false }

    /// Takes the sort keys `other` restored from a checkpoint (whole: ``finishRestore()`` was
    /// called on it), as current.
    func installRestored(_ other: ChildValueIndex) {
        sorted = other.sorted
        needsRebuild = other.needsRebuild
    }

    /// The keys of the first (or last) `n` children in the index's order.
    func keys(first n: Int, fromEnd: Bool) -> [String] {
        sorted.keys(n, fromEnd: fromEnd).compactMap { SortKey.key(of: $0) }
    }
}

/// A child-value index: the children of `location` kept ordered by the value at `child`
/// below each (see ``DatabaseOptions/indexes``).
public struct ChildIndex: Sendable, Hashable {
    /// The location whose children are indexed, as a path ("posts").
    public var location: String
    /// The path below each child whose value orders them ("likes", "meta/score").
    public var child: String

    /// An index of `location`'s children by the value at `child`.
    public init(location: String, child: String) {
        self.location = location
        self.child = child
    }
}
