/// A value in an index: the node itself, or where it sits in a log record.
enum ValueHandle: Sendable {
    case inline(Node)
    case stored(ValueRef)
}

/// An index entry, 16 bytes: where the value sits in a record (or, for a value given as a
/// node, which in-memory node it is), whether it is empty (null) and whether it carries a
/// priority — both known when the entry is made, so that stored values need not be read to
/// know them — and the depth of its path.
struct LayeredEntry: Sendable, Equatable {
    /// Bit 63: empty; bit 62: inline; bits 56–61: depth; bits 0–55: LSN or inline slot.
    private var word: UInt64
    private var offset: UInt32
    /// Bit 31: the value carries a priority; bits 0–30: the value's length (records are far
    /// smaller than 2 GiB).
    private var length: UInt32
    private static let priorityBit: UInt32 = 1 << 31

    private static let emptyBit: UInt64 = 1 << 63
    private static let inlineBit: UInt64 = 1 << 62
    private static let idMask: UInt64 = (1 << 56) - 1
    /// The largest LSN a stored entry can refer to.
    static let largestLSN: UInt64 = idMask

    init(ref: ValueRef, empty: Bool, depth: Int, priority: Bool = false) {
        precondition(ref.lsn <= Self.idMask && depth < 64 && ref.length < Self.priorityBit)
        word = ref.lsn | UInt64(depth) << 56 | (empty ? Self.emptyBit : 0)
        offset = ref.offset
        length = ref.length | (priority ? Self.priorityBit : 0)
    }

    init(slot: UInt64, empty: Bool, depth: Int) {
        word = slot | UInt64(depth) << 56 | Self.inlineBit | (empty ? Self.emptyBit : 0)
        offset = 0
        length = 0
    }

    var isEmpty: Bool { word & Self.emptyBit != 0 }
    var isInline: Bool { word & Self.inlineBit != 0 }
    /// An empty entry that is not stored anywhere: where a leaf that later values turned into
    /// an object was (see ``LayeredIndex/set(_:empty:at:)``).
    var isMarker: Bool { word & (Self.inlineBit | Self.idMask) == 0 }
    var depth: Int { Int((word >> 56) & 0x3f) }
    var slot: UInt64 { word & Self.idMask }
    /// Where a stored value sits (meaningless for an inline one).
    var ref: ValueRef { ValueRef(lsn: word & Self.idMask, offset: offset, length: length & ~Self.priorityBit) }
    /// Whether a stored value carries a priority (see ``LayeredIndex/knowsPriorities``).
    var hasPriority: Bool { length & Self.priorityBit != 0 }
    /// A null that stands for its record's write folded into another entry (see
    /// ``ValueHandle/folded``): stored, of no length, with an LSN.
    var isFoldedNull: Bool { isEmpty && !isInline && !isMarker && length & ~Self.priorityBit == 0 }
}

extension ValueRef {
    /// An empty value that is not stored anywhere (a marker entry's).
    static let emptyValue = ValueRef(lsn: 0, offset: 0, length: 0)
}

extension ValueHandle {
    /// A null standing for this value's write where the write's effect was folded into the
    /// data (a removal that emptied a node with a priority, at that node; a priority written on
    /// an empty node): no bytes, and for a stored value its record's LSN, so that compaction and
    /// the write tree can tell it (``LayeredEntry/isFoldedNull``).
    var folded: ValueHandle {
        switch self {
        case .stored(let ref): .stored(ValueRef(lsn: ref.lsn, offset: 0, length: 0))
        case .inline: .inline(.empty)
        }
    }
}

/// Where stored values are read from (the database's log).
protocol ValueReader: AnyObject {
    /// Calls `body` with the encoded value `ref` names (valid during the call only).
    func withValue<R>(_ ref: ValueRef, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R
    /// Told of a stored value that could not be read (the reader's owner decides what follows).
    func readFailed(_ error: any Error, lsn: UInt64)
}

extension ValueReader {
    /// `body` over the encoded value `ref` names; `fallback` (the failure told to
    /// ``readFailed(_:lsn:)``) when it cannot be read or decoded.
    private func reading<T>(_ ref: ValueRef, else fallback: T, _ body: (UnsafeRawBufferPointer) throws -> T) -> T {
        do {
            return try withValue(ref, body)
        } catch {
            readFailed(error, lsn: ref.lsn)
            return fallback
        }
    }

    func node(_ ref: ValueRef) -> Node {
        reading(ref, else: .empty) { try ValueCodec.decode($0) }
    }

    /// The node at `path` below the value `ref` names, decoding only that node.
    func node(_ ref: ValueRef, at path: Path) -> Node {
        reading(ref, else: .empty) { try ValueCodec.decode($0, at: path) }
    }

    /// Where the priority of the node at `path` below the value `ref` names is stored (a value
    /// of its own), or nil when that node has none.
    func priorityRef(_ ref: ValueRef, at path: Path) -> ValueRef? {
        reading(ref, else: nil) { bytes in
            try ValueCodec.priorityRange(bytes, at: path).map {
                ValueRef(lsn: ref.lsn, offset: ref.offset + UInt32($0.lowerBound), length: UInt32($0.count))
            }
        }
    }

    /// How many children the node at `path` below the value `ref` names has, read from its
    /// header (0 for a leaf, none, or a value that cannot be read).
    func childCount(_ ref: ValueRef, at path: Path) -> Int {
        reading(ref, else: 0) { try ValueCodec.childCount($0, at: path) }
    }

    /// Whether the node at `path` below the value `ref` names is empty, read from its tag
    /// (true for a value that cannot be read).
    func isEmpty(_ ref: ValueRef, at path: Path) -> Bool {
        reading(ref, else: true) { try ValueCodec.isEmpty($0, at: path) }
    }

    /// The first byte of the stored value (nil when it cannot be read): whether it carries a
    /// priority, without decoding it.
    func firstByte(_ ref: ValueRef) -> UInt8? {
        try? withValue(ref) { $0.first }
    }
}

/// Complete values at paths, layered: setting a value at a path replaces everything below it,
/// so an entry below another is always newer and overrides that part of it. The data at a
/// path is the value of the deepest entry on the way to it, with the entries below it on top
/// (in key order, which puts every entry before the ones below it), priorities last (see
/// ``layered(_:onto:folded:)``); ``set(_:empty:at:key:)`` keeps the entries what applying the
/// writes in turn gives.
///
/// The write tree's overlay and the database's server cache are both one of these.
final class LayeredIndex {
    private(set) var index = PathIndex<LayeredEntry>()
    weak var reader: (any ValueReader)?
    /// Told before entries change (the child-value indexes; a frozen copy has none).
    var observers: [any LayeredChangeObserver] = []
    /// Nodes of inline entries (values given as nodes, not records), by slot.
    private var inline: [UInt64: Node] = [:]
    private var nextSlot: UInt64 = 1
    /// How many entries sit at each depth: ancestors are looked up only at depths that have any.
    private var depthCounts = [Int](repeating: 0, count: 64)
    /// How many marker entries there are (compaction carries them forward).
    private(set) var markerCount = 0
    /// Whether every stored entry says whether its value carries a priority: false after a
    /// checkpoint older than format 5 was loaded (then a walk reads the values' first bytes).
    var knowsPriorities = true

    init() {}

    /// A copy of the index as it is now, reading stored values through `reader` (which the
    /// caller keeps alive). Cheap: the chunks are shared until either copy changes.
    func frozen(reader: any ValueReader) -> LayeredIndex {
        let copy = LayeredIndex()
        copy.install(self)
        copy.reader = reader
        return copy
    }

    /// Takes `other`'s entries as its own (a loaded checkpoint's), keeping its reader and
    /// observers. Cheap: the chunks are shared until either changes.
    func install(_ other: LayeredIndex) {
        index = other.index
        inline = other.inline
        nextSlot = other.nextSlot
        depthCounts = other.depthCounts
        markerCount = other.markerCount
        knowsPriorities = other.knowsPriorities
        hasFoldedWrites = other.hasFoldedWrites
    }

    var isEmpty: Bool { index.isEmpty }
    var count: Int { index.count }

    func value(_ entry: LayeredEntry) -> Node {
        if entry.isEmpty { return .empty }  // (its bytes need not be read)
        if entry.isInline { return inline[entry.slot] ?? .empty }
        let ref = entry.ref
        return ref.length == 0 ? .empty : (reader?.node(ref) ?? .empty)
    }

    private func willChange(_ key: [UInt8]) {
        if observers.isEmpty { return }
        key.withUnsafeBytes { k in for o in observers { o.willChange(k) } }
    }

    /// `firstByte`: a stored value's first byte, when the caller has it (else it is read).
    private func makeEntry(_ handle: ValueHandle, empty: Bool, depth: Int, firstByte: UInt8? = nil) -> LayeredEntry {
        switch handle {
        case .stored(let ref):
            var priority = false
            if !empty && ref.length > 0 {
                let first = firstByte ?? reader?.firstByte(ref)
                if first == nil { knowsPriorities = false }  // (unread: walks read it themselves)
                priority = first == ValueCodec.Tag.withPriority.rawValue
            }
            return LayeredEntry(ref: ref, empty: empty, depth: depth, priority: priority)
        case .inline(let node):
            let slot = nextSlot
            nextSlot += 1
            inline[slot] = node
            return LayeredEntry(slot: slot, empty: empty, depth: depth)
        }
    }

    private func added(_ e: LayeredEntry) {
        depthCounts[e.depth] += 1
        if e.isMarker { markerCount += 1 }
    }

    private func dropped(_ e: LayeredEntry) {
        depthCounts[e.depth] -= 1
        if e.isMarker { markerCount -= 1 }
        if e.isInline { inline[e.slot] = nil }
    }

    /// Sets the node at `path` (kept in memory), dropping everything below it.
    func set(node: Node, at path: Path) { set(.inline(node), empty: node.isEmpty, at: path) }

    /// Sets the value at `path`, dropping everything below it.
    ///
    /// Writing a value below a leaf turns that leaf into an object. So that this holds even
    /// after the entry is itself replaced (by a null, say), an empty marker entry is put where
    /// the leaf was first — as folding the writes in order would leave it.
    func set(_ handle: ValueHandle, empty: Bool, at path: Path, firstByte: UInt8? = nil) {
        set(handle, empty: empty, at: path, key: PathKey.encode(path), firstByte: firstByte)
    }

    /// ``set(_:empty:at:)`` with the path's index key already made (`PathKey.encode(path)`).
    /// `firstByte` is the stored value's first byte, when the caller has it at hand (the
    /// entry notes whether it carries a priority; without it, the byte is read).
    ///
    /// The entries stay what applying the writes in turn to one tree gives (Firebase's
    /// `updateChild`), priorities included, wherever an entry at or above makes the data
    /// complete (below none, the entries are a compound write, applied with priorities last):
    /// - a priority written on an empty node changes nothing: its entry is empty;
    /// - a leaf turned into an object keeps its priority (an entry at `.priority` below the
    ///   marker carries it);
    /// - a node with a priority that a removal below it empties loses the priority for good
    ///   (the removal's entry moves up to it).
    func set(_ handle: ValueHandle, empty: Bool, at path: Path, key: [UInt8], firstByte: UInt8? = nil) {
        let isPriority = path.keys.last == ".priority"
        // A priority on an empty node is left out: a folded null (so that a value written there
        // later has none, and a write it folded into can be told).
        let leftOut = isPriority && !empty && isEmptyNode(at: path.parent!) == true
        let handle = leftOut ? handle.folded : handle, empty = empty || leftOut
        // An empty entry between here and a leaf above (a removal below the leaf, which changed
        // nothing) does not shield the leaf: look past it to the entry above.
        var searchFrom = path, searchKey = key
        while !empty, let (above, aboveEntry) = deepestChainEntry(searchFrom, key: searchKey, strictlyAbove: true) {
            if aboveEntry.isEmpty && !above.isEmpty && !aboveEntry.isMarker {
                searchFrom = above
                searchKey = PathKey.encode(above)
                continue
            }
            let keys = above.relative(to: path).keys
            // (A leaf at or below a removal passed over above is gone: nothing to turn.)
            if let (j, node) = leafOnTheWay(aboveEntry, keys), node.isLeaf, above.count + j < searchFrom.count,
               keys[j] != ".priority" {
                let location = above.child(Path(keys: Array(keys[0..<j])))
                if !hasNonEmptyEntry(below: location) {
                    turnIntoObject(location, leaf: node, of: aboveEntry, at: Path(keys: Array(keys[0..<j])))
                }
            }
            break
        }
        willChange(key)
        let entry = makeEntry(handle, empty: empty, depth: path.count, firstByte: leftOut ? nil : firstByte)
        added(entry)
        index.replaceSubtree(key, entry, removed: dropped)
        if empty && !isPriority { forgetPrioritiesOfEmptiedNodes(above: path, key: key, handle: handle) }
    }

    /// The last key of a priority's path, as an index key ends with it.

    /// Whether a non-empty entry lies below `path`, its own priority aside (which does not turn
    /// a leaf into an object).
    private func hasNonEmptyEntry(below path: Path) -> Bool {
        let prefix = PathKey.encode(path)
        let ownPriority = prefix.count + PathKey.priorityComponent.count
        var found = false
        index.forEach(withPrefix: prefix) { k, e in
            if k.count > prefix.count && !e.isEmpty && !(k.count == ownPriority && k.starts(with: prefix) && k[prefix.count...].elementsEqual(PathKey.priorityComponent)) {
                found = true
            }
        }
        return found
    }

    /// Puts an empty marker where `leaf` (at `relative` below the value of `source`) was, as a
    /// value written below the leaf turns it into an object, and keeps the leaf's priority: the
    /// one written at `location/.priority` if there is one, else its own (an entry at
    /// `location/.priority` referring to where the leaf's value stores it).
    private func turnIntoObject(_ location: Path, leaf: Node, of source: LayeredEntry, at relative: Path) {
        let markerKey = PathKey.encode(location)
        let priorityKey = markerKey + PathKey.priorityComponent
        var carried: LayeredEntry?
        if let written = index.get(priorityKey) {
            carried = written.isInline ? makeEntry(.inline(value(written)), empty: written.isEmpty, depth: location.count + 1) : written
        } else if !leaf.priority.isEmpty {
            if source.isInline {
                carried = makeEntry(.inline(leaf.priority), empty: false, depth: location.count + 1)
            } else if let ref = reader?.priorityRef(source.ref, at: relative) {
                carried = LayeredEntry(ref: ref, empty: false, depth: location.count + 1)
            }
        }
        let marker = LayeredEntry(ref: .emptyValue, empty: true, depth: location.count)
        willChange(markerKey)
        added(marker)
        index.replaceSubtree(markerKey, marker, removed: dropped)
        if let carried {
            added(carried)
            if let old = index.set(priorityKey, carried) { dropped(old) }
        }
    }

    /// After a removal at `path` (its value `handle`): a node above it that had a priority and
    /// that the removal left empty loses the priority for good — a value written there again
    /// starts without one, as in Firebase's tree, where layering the entries would bring it
    /// back. The removal's entry moves up to the highest such node (everything below it is
    /// empty now), and ``hasFoldedWrites`` becomes true.
    private func forgetPrioritiesOfEmptiedNodes(above path: Path, key: [UInt8], handle: ValueHandle) {
        // Upwards from the parent, among the nodes with a priority (nearly always none), while
        // they are empty (a non-empty node's ancestors are not). Whether a node has a priority
        // is asked first: it reads an entry's flag or one stored node's first tags, where
        // whether it is empty may walk every removal below it.
        var ends: [Int] = [0]  // (the end of the key of the node at each depth)
        for (i, byte) in key.enumerated() where byte == 0 { ends.append(i + 1) }
        var highest: Int?
        for d in stride(from: path.count - 1, through: 0, by: -1) {
            let node = Path(keys: Array(path.keys.prefix(d)))
            guard hasPriority(node, key: Array(key[0..<ends[d]])) else { continue }
            guard isEmptyNode(at: node) == true else { break }
            highest = d
        }
        guard let d = highest else { return }
        let nodeKey = Array(key[0..<ends[d]])
        let entry = makeEntry(handle.folded, empty: true, depth: d)
        willChange(nodeKey)
        added(entry)
        index.replaceSubtree(nodeKey, entry, removed: dropped)
        hasFoldedWrites = true
    }

    /// Whether, since the index was last emptied, a write's entry may lie above its own path: a
    /// removal's entry moved up to the node it emptied (see
    /// ``forgetPrioritiesOfEmptiedNodes(above:key:handle:)``), made or restored from a
    /// checkpoint. The write tree then re-layers its remaining writes to remove one, rather than
    /// remove its entries.
    private(set) var hasFoldedWrites = false

    /// Whether the node at `path` (whose index key is `key`) has a priority where the entries
    /// make it complete: one written at `path/.priority`, else the one its value carries.
    private func hasPriority(_ path: Path, key: [UInt8]) -> Bool {
        if depthCounts[path.count + 1] > 0, let written = index.get(key + PathKey.priorityComponent) { return !written.isEmpty }
        guard let (chainPath, entry) = deepestChainEntry(path, key: key, strictlyAbove: false) else { return false }
        if entry.isEmpty { return false }
        let relative = chainPath.relative(to: path)
        if entry.isInline { return !value(entry).getChild(relative).priority.isEmpty }
        if relative.isEmpty && knowsPriorities { return entry.hasPriority }
        return reader?.priorityRef(entry.ref, at: relative) != nil
    }

    /// Whether the data at `path` is empty, or nil when no entry at or above it makes it
    /// complete. Reads the value at `path` alone, not the whole of an entry's value above it,
    /// and usually less: a non-empty entry below it with nothing below that entry settles it.
    func isEmptyNode(at path: Path) -> Bool? {
        guard let (chainPath, entry) = deepestChainEntry(path) else { return nil }
        let key = PathKey.encode(path), relative = chainPath.relative(to: path)
        var w = PathIndex.Walker(index, atOrAfter: key)
        if !w.isAtEnd && w.keyCount == key.count { w.advance() }  // (the node's own entry: the chain's)
        var anyBelow = false, onlyRemovals = true
        var previousKey: [UInt8] = [], buffer: [UInt8] = [], lastChild: [UInt8] = []
        var previousSettles = false  // (the previous entry is neither empty nor a priority)
        var touchedChildren = 0
        while key.withUnsafeBytes({ w.hasPrefix($0) }) {
            anyBelow = true
            w.key(into: &buffer)
            if previousSettles && !buffer.starts(with: previousKey) { return false }  // (nothing below it)
            let isPriority = buffer.reversed().starts(with: PathKey.priorityComponent.reversed())
            previousSettles = !w.entry.isEmpty && !isPriority
            if !w.entry.isEmpty && !isPriority { onlyRemovals = false }
            let child = buffer[key.count...].prefix { $0 != 0 }
            if !child.elementsEqual(lastChild) {
                touchedChildren += 1
                lastChild = Array(child)
            }
            if previousSettles { swap(&previousKey, &buffer) }
            w.advance()
        }
        if previousSettles { return false }
        if entry.isEmpty && (!anyBelow || onlyRemovals) { return true }
        if !anyBelow || onlyRemovals {
            // The stored node, with only removals (and priorities) below it: not empty while it
            // is a leaf (nothing below a leaf removes it) or has a child no removal touches.
            let (exists, children): (Bool, Int)
            if entry.isInline {
                let node = value(entry).getChild(relative)
                (exists, children) = (!node.isEmpty, node.numChildren)
            } else if let reader {
                (exists, children) = (!reader.isEmpty(entry.ref, at: relative), reader.childCount(entry.ref, at: relative))
            } else {
                (exists, children) = (false, 0)
            }
            if !exists { return true }
            if children == 0 || children > touchedChildren { return false }
        }
        return layered(entries(below: path), onto: base(entry, at: relative)).isEmpty
    }

    /// Along `keys` from the value of `entry`, the first node that is a leaf or empty (see
    /// ``ValueCodec/leafOnTheWay(_:_:)``), decoding that node alone.
    private func leafOnTheWay(_ entry: LayeredEntry, _ keys: [String]) -> (depth: Int, node: Node)? {
        if entry.isEmpty { return keys.isEmpty ? nil : (0, .empty) }
        guard !entry.isInline, let reader else {
            var node = value(entry)
            for (j, key) in keys.enumerated() {
                if node.isLeaf || node.isEmpty { return (j, node) }
                if key == ".priority" { return nil }
                node = node.getImmediateChild(key)
            }
            return nil
        }
        do {
            return try reader.withValue(entry.ref) { try ValueCodec.leafOnTheWay($0, keys) }
        } catch {
            reader.readFailed(error, lsn: entry.ref.lsn)
            return nil
        }
    }

    /// The node at `relative` below the value of `entry`, decoding that node alone.
    private func base(_ entry: LayeredEntry, at relative: Path) -> Node {
        if relative.isEmpty || entry.isInline || entry.isEmpty { return value(entry).getChild(relative) }
        return reader?.node(entry.ref, at: relative) ?? .empty
    }

    /// Puts back a stored entry exactly as a checkpoint kept it (no markers: they are kept too).
    /// Entries come in key order, so this appends; the caller has checked that `key` is a
    /// path's key, of the entry's depth (format 5 and older, an entry at a time).
    func restore(_ entry: LayeredEntry, key: UnsafeRawBufferPointer) {
        if entry.isFoldedNull { hasFoldedWrites = true }
        added(entry)
        if let old = index.append(key, entry) { dropped(old) }
    }

    /// Puts back a whole chunk of stored entries as a checkpoint kept it (format 6), after
    /// every entry here; the caller has checked the keys (paths, rising) and the entries'
    /// depths (see ``PathIndex/appendChunk(prefix:suffixes:ends:entries:)``).
    func restoreChunk(prefix: [UInt8], suffixes: [UInt8], ends: [UInt32], entries: [LayeredEntry]) {
        for e in entries {
            if e.isFoldedNull { hasFoldedWrites = true }
            added(e)
        }
        index.appendChunk(prefix: prefix, suffixes: suffixes, ends: ends, entries: entries)
    }

    /// Puts an entry back exactly as it was (compaction's restatement of it): it replaces the
    /// entry at `path` only, leaving the entries below it and the markers alone.
    func restate(_ handle: ValueHandle, empty: Bool, at path: Path) {
        let entry = makeEntry(handle, empty: empty, depth: path.count)
        added(entry)
        if let old = index.set(PathKey.encode(path), entry) { dropped(old) }
    }

    /// The entry at `path` itself, if there is one.
    func entry(at path: Path) -> LayeredEntry? { index.get(PathKey.encode(path)) }

    /// Removes the entry whose path key is `key`, which has no entry below it.
    func removeEntry(_ key: [UInt8]) {
        willChange(key)
        index.removeAll(withPrefix: key, dropped)
    }

    /// Removes the entry at `path` and everything below it.
    func removeSubtree(_ path: Path) {
        let key = PathKey.encode(path)
        willChange(key)
        index.removeAll(withPrefix: key, dropped)
    }

    /// Drops every entry `drop` chooses, leaving the others exactly as they are (entries below
    /// a dropped one stay); returns how many were dropped. O(entries).
    @discardableResult
    func removeEntries(where drop: (UnsafeRawBufferPointer, LayeredEntry) -> Bool) -> Int {
        var kept = PathIndex<LayeredEntry>()
        var n = 0
        index.forEach(withPrefix: []) { k, e in
            if drop(k, e) {
                for o in observers { o.willChange(k) }
                dropped(e)
                n += 1
            } else {
                _ = kept.append(k, e)
            }
        }
        if n > 0 { index = kept }
        return n
    }

    /// Removes the entry whose path key is `key`, leaving the entries below it as they are.
    func removeEntryOnly(_ key: [UInt8]) {
        guard let target = index.get(key) else { return }
        willChange(key)
        var below: [([UInt8], LayeredEntry)] = []
        index.forEach(withPrefix: key) { k, e in if k.count > key.count { below.append((Array(k), e)) } }
        index.removeAll(withPrefix: key)
        dropped(target)
        for (k, e) in below { _ = index.set(k, e) }
    }

    /// Removes every entry, telling the observers that everything may change (`eachKey`
    /// false) or naming each entry's key (true: for a removal before the same entries, or
    /// nearly, are set again — an index then moves only the children named).
    func removeAll(eachKey: Bool = false) {
        if eachKey {
            if !observers.isEmpty { index.forEach(withPrefix: []) { k, _ in for o in observers { o.willChange(k) } } }
        } else {
            for o in observers { o.willChangeEverything() }
        }
        index.removeAll()
        inline = [:]
        for d in depthCounts.indices { depthCounts[d] = 0 }
        markerCount = 0
        knowsPriorities = true
        hasFoldedWrites = false
    }

    /// The deepest entry from the root down to `path` (or to its parent).
    func deepestChainEntry(_ path: Path, strictlyAbove: Bool = false) -> (path: Path, entry: LayeredEntry)? {
        guard !index.isEmpty else { return nil }
        return deepestChainEntry(path, key: PathKey.encode(path), strictlyAbove: strictlyAbove)
    }

    private func deepestChainEntry(_ path: Path, key: [UInt8], strictlyAbove: Bool) -> (path: Path, entry: LayeredEntry)? {
        guard !index.isEmpty else { return nil }
        let deepest = strictlyAbove ? path.count - 1 : path.count
        guard deepest >= 0 else { return nil }
        var found: (depth: Int, entry: LayeredEntry)?
        let counts = depthCounts
        key.withUnsafeBytes { k in
            var end = 0
            for depth in 0...deepest {
                if depth > 0 {
                    while k[end] != 0 { end += 1 }
                    end += 1
                }
                if counts[depth] > 0, let e = index.get(UnsafeRawBufferPointer(rebasing: k[0..<end])) { found = (depth, e) }
            }
        }
        guard let found else { return nil }
        return (Path(keys: Array(path.keys.prefix(found.depth))), found.entry)
    }

    /// Entries strictly below `path` with their paths relative to it, each before the ones
    /// below it (the order to layer them in).
    func entries(below path: Path) -> [(path: Path, entry: LayeredEntry)] {
        let prefix = PathKey.encode(path)
        var out: [(path: Path, entry: LayeredEntry)] = []
        index.forEach(withPrefix: prefix) { k, e in
            if k.count > prefix.count { out.append((PathKey.decode(k[prefix.count...]), e)) }
        }
        return out
    }

    /// The complete data at `path`, or nil when no entry at or above it makes it complete.
    func completeNode(at path: Path) -> Node? {
        guard let (chainPath, entry) = deepestChainEntry(path) else { return nil }
        return layered(entries(below: path), onto: base(entry, at: chainPath.relative(to: path)), folded: true)
    }

    /// `base` with `entries` (paths relative to it, in key order) layered on, built a level at
    /// a time — each node's new children sorted and merged once, not copied per entry (which
    /// is quadratic for a location with many children) — and the priorities last, each on its
    /// node as the other entries left it (an empty node takes none).
    ///
    /// Below an entry (and everywhere when `folded`: `base` is an entry's value), ``set(_:empty:at:)``
    /// kept the entries what applying the writes in turn gives, so a node keeps its priority
    /// unless it ends empty. Elsewhere the entries are a compound write over other data, applied
    /// as Firebase's `CompoundWrite` applies one: the changes to a node's children in key order,
    /// a node that one of them leaves empty losing its priority.
    func layered(_ entries: [(path: Path, entry: LayeredEntry)], onto base: Node, folded: Bool = false) -> Node {
        guard !entries.isEmpty else { return base }
        var i = 0
        var node = base
        let priorities = entries.filter { $0.path.keys.last == ".priority" }
        let others = priorities.isEmpty ? entries : entries.filter { $0.path.keys.last != ".priority" }
        while i < others.count { node = layer(node, depth: 0, others, &i, folded: folded) }
        for p in priorities { node = node.updatingChild(p.path, value(p.entry)) }
        return node
    }

    /// Layers the run of entries from `i` that share the first `d` keys of `entries[i]`.
    private func layer(_ node: Node, depth d: Int, _ entries: [(path: Path, entry: LayeredEntry)], _ i: inout Int, folded: Bool) -> Node {
        let prefix = entries[i].path.keys[0..<d]
        func inRun(_ j: Int, _ depth: Int) -> Bool {
            j < entries.count && entries[j].path.count > depth && entries[j].path.keys[0..<d] == prefix
        }
        var changes: [(String, Node)] = []
        while inRun(i, d) {
            let key = entries[i].path.keys[d]
            var child: Node
            var childFolded = folded
            if entries[i].path.count == d + 1 {
                child = value(entries[i].entry)
                childFolded = true
                i += 1
            } else {
                child = node.getImmediateChild(key)
            }
            if inRun(i, d + 1) && entries[i].path.keys[d] == key { child = layer(child, depth: d + 1, entries, &i, folded: childFolded) }
            changes.append((key, child))
        }
        let result = node.updatingImmediateChildren(changes)
        if folded && !result.isEmpty && result.priority.isEmpty && !node.priority.isEmpty { return result.updatingPriority(node.priority) }
        return result
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
            let rest = k[prefix.count...]
            if let end = rest.firstIndex(of: 0), end == rest.index(before: rest.endIndex) {
                keys.append(String(decoding: rest[rest.startIndex..<end], as: UTF8.self))
            }
        }
        for key in keys {
            if let child = completeNode(at: path.child(key)), !child.isEmpty { node = node.updatingImmediateChild(key, child) }
        }
        return node
    }

    /// Every entry, in key order (for checkpoints). The key's bytes are valid only during the call.
    func forEach(_ body: (UnsafeRawBufferPointer, LayeredEntry) throws -> Void) rethrows {
        try index.forEach(withPrefix: [], body)
    }

    var footprint: Int { index.footprint + inline.count * 48 }
}

/// Where the current data at a path is read from: what a local reader sees there (the
/// engine's server data with the visible local writes on top), nil when that is not complete.
protocol VisibleData: AnyObject {
    func visibleNode(at path: Path) -> Node?
}

protocol LayeredChangeObserver: AnyObject {
    /// The entry at the path whose key is `key`, or entries below it, are about to change.
    func willChange(_ key: UnsafeRawBufferPointer)
    /// Any entry may change.
    func willChangeEverything()
}
