import FerryLog
import Synchronization
import Dispatch
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Reads the stored values of a frozen state (see ``FrozenData``) outside the engine's lock:
/// records the log had not written when the state was frozen from a copy of their payloads,
/// the others through a ``LogReadSnapshot`` (its own files and frame cache) — or, for a read
/// that ends at once (a small location), through the live log: a record compaction or
/// eviction deleted meanwhile then makes the reader ``stale`` (the read is done again under
/// the lock), which is no failure of the database.
final class FrozenReader: ValueReader, @unchecked Sendable {
    private let recent: RecordList
    private let log: LogReadSnapshot?
    private let live: WriteAheadLog?
    private let staleFlag = FerryMutex(false)
    /// Whether a record was gone from the live log (see above).
    var stale: Bool { staleFlag.withLock { $0 } }
    private let store: String?
    /// Told of a record that could not be read (the database then stops, as when its own
    /// read fails).
    private let onFailure: @Sendable (DatabaseError) -> Void
    private let failure = FerryMutex<DatabaseError?>(nil)
    private let failedFlag = Atomic(false)

    init(recent: RecordList, log: LogReadSnapshot?, live: WriteAheadLog? = nil, store: String?,
         onFailure: @escaping @Sendable (DatabaseError) -> Void) {
        self.recent = recent
        self.log = log
        self.live = live
        self.store = store
        self.onFailure = onFailure
    }

    /// The first read that failed, if any.
    var error: DatabaseError? { failed ? failure.withLock { $0 } : nil }
    /// Whether a read failed (cheap enough to ask once per child).
    var failed: Bool { failedFlag.load(ordering: .acquiring) }

    /// Calls `body` with the encoded value `ref` names.
    func withValue<R>(_ ref: ValueRef, _ body: (UnsafeRawBufferPointer) throws -> R) throws -> R {
        try withValue(ref, checked: { bytes, _ in try body(bytes) })
    }

    /// Calls `body` with the encoded value `ref` names, and whether exactly those bytes were
    /// checked as ``ValueCodec/validate(_:)`` checks them when the log's snapshot read them
    /// ahead (``ValueNote``): nil when not, else whether the value is empty.
    func withValue<R>(_ ref: ValueRef, checked body: (UnsafeRawBufferPointer, Bool?) throws -> R) throws -> R {
        func slice(_ payload: UnsafeRawBufferPointer, _ note: UInt64) throws -> R {
            let start = Int(ref.offset), end = start + Int(ref.length)
            guard end <= payload.count else { throw ByteReader.damaged("a value reference past the record's end") }
            return try body(UnsafeRawBufferPointer(rebasing: payload[start..<end]), ValueNote.isEmpty(note, offset: ref.offset, length: ref.length))
        }
        if let r = recent.find(ref.lsn) { return try r.payload.withUnsafeBytes { try slice($0, 0) } }
        if let log { return try log.withRecord(at: LSN(ref.lsn)) { try slice($0.payload, $0.note) } }
        guard let live else { throw DatabaseError(.storage, "record \(ref.lsn) is not available") }
        do {
            return try live.withRecord(at: LSN(ref.lsn)) { try slice($0.payload, 0) }
        } catch let e as LogError where e.code == .recordsUnavailable {
            staleFlag.withLock { $0 = true }
            throw e
        }
    }

    /// Whether the stored value `ref` names carries a priority, read from its first byte.
    func hasPriority(_ ref: ValueRef) -> Bool {
        do {
            return try withValue(ref) { $0.first == ValueCodec.Tag.withPriority.rawValue }
        } catch {
            report(error, ref.lsn)
            return false
        }
    }

    func readFailed(_ error: any Error, lsn: UInt64) { report(error, lsn) }

    private func report(_ error: any Error, _ lsn: UInt64) {
        if stale { return }  // (read again under the lock: not a failure)
        let e = error as? DatabaseError
            ?? DatabaseError(.storage, "reading record \(lsn) failed: \(error)", underlying: error as? LogError, lsn: lsn, store: store)
        let first = failure.withLock { f -> Bool in
            if f != nil { return false }
            f = e
            failedFlag.store(true, ordering: .releasing)
            return true
        }
        if first { onFailure(e) }
    }
}

/// The database's data as it was at one moment — frozen copies of the server cache's and the
/// pending writes' indexes (their chunks shared with the live ones until those change) and a
/// reader of the values they name — so that snapshots can be read, a child at a time, outside
/// the engine's lock while the database goes on changing.
final class FrozenData: @unchecked Sendable {
    let overlay: LayeredIndex
    let server: LayeredIndex
    let reader: FrozenReader

    init(overlay: LayeredIndex, server: LayeredIndex, reader: FrozenReader) {
        self.overlay = overlay.frozen(reader: reader)
        self.server = server.frozen(reader: reader)
        self.reader = reader
    }

    /// What a reader sees at `path` (``Engine/visibleNode(at:)`` on the frozen state).
    func visibleNode(at path: Path) -> Node? {
        WriteTree.visibleNode(at: path, overlay: overlay) { server.completeNode(at: path) }
    }
}

/// How the children of a location are found in a frozen state without building its node: the
/// value above the location's entries (`base`) and the indexes whose entries below the
/// location lie over it, lowest first.
struct ChildPlan {
    var base: Node
    var layers: [LayeredIndex]
}

/// The data at one location of a frozen state, read on demand: a big location's children are
/// found from the indexes and decoded one at a time as they are asked for; a small one (or a
/// child handed out by ``DataSnapshot/children``) is decoded whole the first time it is read.
final class LazyLocation: @unchecked Sendable {
    let data: FrozenData
    let path: Path
    let pathKey: [UInt8]
    /// How to walk the children without building the node; nil when the node is read whole.
    let plan: ChildPlan?
    /// The node, once read whole (never for a location with a plan: that would keep all of it).
    private let whole = FerryMutex<Node?>(nil)
    private let counted = FerryMutex<Int?>(nil)
    private let plain = FerryMutex<Bool?>(nil)

    /// Entries below a location from which its snapshot is read lazily.
    static let lazyThreshold = 512

    /// Whether at least ``lazyThreshold`` entries of the two indexes lie below the path whose
    /// key is `key` (counted no further).
    static func isBig(_ key: [UInt8], overlay: LayeredIndex, server: LayeredIndex) -> Bool {
        overlay.index.count(strictlyBelow: key, limit: lazyThreshold) + server.index.count(strictlyBelow: key, limit: lazyThreshold) >= lazyThreshold
    }

    /// The data at `path`, or nil when it is not complete. Small data is read at once.
    static func make(_ data: FrozenData, at path: Path) -> LazyLocation? {
        let key = PathKey.encode(path)
        if let plan = Self.plan(data, path, key) { return LazyLocation(data: data, path: path, key: key, plan: plan) }
        guard let node = data.visibleNode(at: path) else { return nil }
        let location = LazyLocation(data: data, path: path, key: key, plan: nil)
        location.whole.withLock { $0 = node }
        return location
    }

    /// The data at `path`, known to be complete (a child of a complete location), read when
    /// first asked for.
    static func deferred(_ data: FrozenData, at path: Path) -> LazyLocation {
        LazyLocation(data: data, path: path, key: PathKey.encode(path), plan: nil)
    }

    private init(data: FrozenData, path: Path, key: [UInt8], plan: ChildPlan?) {
        self.data = data
        self.path = path
        self.pathKey = key
        self.plan = plan
    }

    /// The plan for reading `path`'s children lazily, or nil when its data is small, not
    /// complete, or of a shape read whole (a leaf below entries, a priority on the location).
    private static func plan(_ data: FrozenData, _ path: Path, _ key: [UInt8]) -> ChildPlan? {
        let o = data.overlay, s = data.server
        guard isBig(key, overlay: o, server: s) else { return nil }
        let layers: [LayeredIndex]
        let chain: (path: Path, entry: LayeredEntry)
        if let c = o.deepestChainEntry(path) {
            layers = [o]
            chain = c
        } else if let c = s.deepestChainEntry(path) {
            layers = o.index.hasKey(strictlyBelow: key) ? [s, o] : [s]
            chain = c
        } else {
            return nil
        }
        let base = layers[0].value(chain.entry).getChild(chain.path.relative(to: path))
        if base.isLeaf || !base.priority.isEmpty { return nil }
        let priorityKey = key + PathKey.priorityComponent
        if layers.contains(where: { $0.index.get(priorityKey) != nil }) { return nil }
        return ChildPlan(base: base, layers: layers)
    }

    /// Whether every child key's byte order is its key order (no integer keys, no characters
    /// where UTF-8 and UTF-16 orders differ), so that children can be walked off the indexes
    /// in their order; else their keys are gathered and sorted. Found by a pass over the keys
    /// (no values read) the first time a walk needs it.
    var plainKeys: Bool {
        guard let plan else { return true }
        if let known = plain.withLock({ $0 }) { return known }
        var isPlainSoFar = true
        plan.base.forEachChild { k, _ in if isPlainSoFar && !Self.isPlain(k) { isPlainSoFar = false } }
        for layer in plan.layers where isPlainSoFar {
            isPlainSoFar = layer.index.allChildKeysArePlain(below: pathKey)
        }
        plain.withLock { $0 = isPlainSoFar }
        return isPlainSoFar
    }

    /// Whether a key's bytes sort as the key does (see ``ChildPlan/plainKeys``).
    static func isPlain(_ key: String) -> Bool {
        var key = key
        return key.withUTF8 { isPlain(UnsafeRawBufferPointer($0)) }
    }

    static func isPlain(_ bytes: UnsafeRawBufferPointer) -> Bool { KeyOrder.sortsAsBytes(utf8: bytes) }

    /// The whole node. For a location with a plan this decodes everything below it, each time
    /// (it is not kept: a snapshot of a big location stays small).
    var node: Node {
        if plan != nil { return data.visibleNode(at: path) ?? .empty }
        if let n = whole.withLock({ $0 }) { return n }
        let n = data.visibleNode(at: path) ?? .empty
        whole.withLock { $0 = n }
        return n
    }

    /// The child `key`'s node.
    func child(_ key: String) -> Node {
        guard plan != nil else { return node.getImmediateChild(key) }
        if key == ".priority" { return .empty }  // a location read by plan has none (see plan)
        return data.visibleNode(at: path.child(key)) ?? .empty
    }

    /// The node at `relative` below the location.
    func descendant(_ relative: Path) -> Node {
        guard let first = relative.front, plan != nil else { return node.getChild(relative) }
        return child(first).getChild(relative.popFront)
    }

    /// How many children there are (counted once, decoding only children with several entries).
    var childrenCount: Int {
        guard plan != nil else { return node.numChildren }
        if let n = counted.withLock({ $0 }) { return n }
        var cursor = ChildCursor(self, decode: false)
        var n = 0
        while cursor.next() != nil { n += 1 }
        counted.withLock { $0 = n }
        return n
    }

    var exists: Bool {
        guard plan != nil else { return !node.isEmpty }
        var cursor = ChildCursor(self, decode: false)
        return cursor.next() != nil
    }

    /// The children's keys in `index`'s order, or nil when that is key order (then
    /// ``ChildCursor`` walks them in order). Reads each child's indexed value once: whether it
    /// has a priority from its index entry (or, when the index does not know, the first byte
    /// of its stored value), a child value by decoding it.
    func indexOrder(_ index: QueryIndex) -> [String]? {
        if index == .key { return nil }
        let byPriority = index == .priority
        if byPriority {
            // Usually no child has a priority: then key order it is, and nothing was kept.
            var cursor = ChildCursor(self, decode: false, priorities: true)
            var any = false
            while !any, let (_, n) = cursor.next() { any = !(n?.priority.isEmpty ?? true) }
            if !any { return nil }
        }
        var cursor = ChildCursor(self, decode: !byPriority, priorities: byPriority)
        var keys: [String] = []
        var values: [Node] = []
        while let (k, n) = cursor.next() {
            keys.append(k)
            var v = index.indexedValue(n ?? .empty)
            if v.hasChildren { v = Self.anObject }  // objects all sort alike
            values.append(v)
        }
        var order = Array(values.indices)
        order.sort { i, j in
            let c = Node.compare(values[i], values[j])
            return c != 0 ? c < 0 : i < j
        }
        return order.map { keys[$0] }
    }

    /// The data a ranged or limited query shows here: the children it keeps are chosen
    /// walking them a child at a time (a limit keeps a heap of its window, O(n log k)), and
    /// only those are built into the node the query's filter then runs over.
    func filtered(by params: QueryParams) -> Node {
        let filter = params.nodeFilter
        guard plan != nil else { return params.filtered(node) }
        func walk(_ body: (String, Node) -> Void) {
            var cursor = ChildCursor(self, decode: true)
            while let (k, n) = cursor.next() { body(k, n ?? .empty) }
        }
        var kept: [NamedNode] = []
        if let limited = filter as? LimitedFilter {
            // The window is chosen by what orders the children alone — a child's value at a
            // path (decoded alone, in a node holding just it) or the key (nothing decoded, for
            // plain keys) — and only its children are then read whole.
            // (By key, every child's indexed value is empty: the names decide.)
            let ordering: (cursor: ChildCursor, byKey: Bool)? = switch params.index {
            case .child(let child): (ChildCursor(self, decode: true, projection: child), false)
            case .key: (ChildCursor(self, decode: false), true)
            default: nil
            }
            if case (var cursor, let byKey)? = ordering {
                kept = limited.selectWindow(byIndexedValue: { body in
                    while let (k, n) = cursor.next() { body(k, byKey ? .empty : n ?? .empty) }
                }).map { NamedNode(name: $0, node: self.child($0)) }
            } else {
                kept = limited.selectWindow(walk)
            }
        } else if let ranged = filter as? RangedFilter {
            walk { k, n in if ranged.matches(k, n) { kept.append(NamedNode(name: k, node: n)) } }
        } else {
            walk { k, n in kept.append(NamedNode(name: k, node: n)) }
        }
        return params.filtered(Node.empty.updatingImmediateChildren(kept.map { ($0.name, $0.node) }))
    }

    /// The children's keys in key order.
    var keys: [String] {
        var cursor = ChildCursor(self, decode: false)
        var keys: [String] = []
        while let (k, _) = cursor.next() { keys.append(k) }
        return keys
    }

    private static let anObject = Node.children(ChildMap(sorted: [NamedNode(name: "o", node: .leaf(.bool(true), priority: .empty))]), priority: .empty)
}

/// Walks a lazily read location's children in key order: the indexes' entries below it in
/// byte order (which is key order for plain keys; otherwise the keys are gathered and sorted
/// first), a child decoded from its one entry when that is all it has, and through the whole
/// layering (``FrozenData/visibleNode(at:)``) when more lies there. Empty children are skipped.
struct ChildCursor {
    let location: LazyLocation
    /// Decode every child (else only those whose emptiness or priority needs it).
    let decode: Bool
    /// Give each child's priority (its node, or a node carrying that priority).
    let priorities: Bool
    /// Give, for each child, only the node at this path below it (decoding nothing else of a
    /// stored value; empty for a child that has nothing there — the child is still given);
    /// nil: the child's whole node.
    let projection: Path?
    private let reader: FrozenReader
    /// Whether the location has a plan (asked once: reading the plan copies it).
    private let planned: Bool
    private let layers: [LayeredIndex]
    private var walkers: [PathIndex<LayeredEntry>.Walker] = []
    private let pathKey: [UInt8]
    private var baseChildren: [NamedNode] = []
    private var baseNext = 0
    /// For keys that are not plain, or a location read whole: every key, in key order.
    private var sortedKeys: [String]?
    private var nextSorted = 0
    private var buffer: [UInt8] = []
    private var smallest: [UInt8] = []
    private var childKey: [UInt8] = []

    init(_ location: LazyLocation, decode: Bool, priorities: Bool = false, projection: Path? = nil) {
        self.location = location
        self.decode = decode
        self.priorities = priorities
        self.projection = projection
        reader = location.data.reader
        pathKey = location.pathKey
        planned = location.plan != nil
        guard let plan = location.plan else {
            layers = []
            baseChildren = location.node.childMap.entries
            return
        }
        layers = plan.layers
        baseChildren = plan.base.childMap.entries
        if location.plainKeys {
            walkers = plan.layers.map { layer in
                var w = PathIndex.Walker(layer.index, atOrAfter: location.pathKey)
                if !w.isAtEnd && w.keyCount == location.pathKey.count { w.advance() }  // the location's own entry
                return w
            }
        } else {
            var keys = Set(baseChildren.map(\.name))
            let key = location.pathKey
            for layer in plan.layers {
                layer.index.forEach(withPrefix: key) { k, _ in
                    guard k.count > key.count else { return }
                    let rest = k[key.count...]
                    let end = rest.firstIndex(of: 0)!
                    keys.insert(String(decoding: rest[rest.startIndex..<end], as: UTF8.self))
                }
            }
            sortedKeys = keys.sorted { KeyOrder.compare($0, $1) < 0 }
        }
    }

    /// The next child: its key, and its node when decoded (nil means not empty, not decoded).
    mutating func next() -> (String, Node?)? {
        guard let (key, child) = step(keepingStored: false) else { return nil }
        guard case .node(let node) = child else { preconditionFailure("a stored child not asked for") }
        return (key, node)
    }

    /// What ``step(keepingStored:)`` gives for a child.
    enum Child {
        /// Its node when decoded (nil means not empty, not decoded).
        case node(Node?)
        /// Its whole stored value, checked but not decoded, without a priority (not empty).
        case stored([UInt8])
    }

    /// The next child, as ``next()`` gives it; with `keepingStored`, a decoding cursor gives a
    /// child whose data is one stored value as its checked bytes (``ValueCodec/validate(_:)``),
    /// to decode when read: copying them costs a fraction of building the node.
    mutating func step(keepingStored: Bool) -> (String, Child)? {
        guard planned else {
            guard baseNext < baseChildren.count else { return nil }
            defer { baseNext += 1 }
            return (baseChildren[baseNext].name, .node(projected(baseChildren[baseNext].node)))
        }
        if let sortedKeys {
            while nextSorted < sortedKeys.count {
                let k = sortedKeys[nextSorted]
                nextSorted += 1
                let node = location.child(k)
                if !node.isEmpty { return (k, .node(projected(node))) }
            }
            return nil
        }
        while true {
            // The smallest child key among the layers' next entries and the base's next child.
            var found = false
            for i in walkers.indices {
                guard pathKey.withUnsafeBytes({ walkers[i].hasPrefix($0) }) else { continue }
                walkers[i].key(into: &buffer)
                if Self.takeChildKey(of: buffer, below: pathKey.count, into: &smallest, unlessAfter: found) { found = true }
            }
            var fromBase: Node?
            if baseNext < baseChildren.count {
                let name = baseChildren[baseNext].name.utf8
                if !found || !smallest.lexicographicallyPrecedes(name) {
                    if !found || name.elementsEqual(smallest) == false {
                        smallest.removeAll(keepingCapacity: true)
                        smallest.append(contentsOf: name)
                        found = true
                    }
                    fromBase = baseChildren[baseNext].node
                    baseNext += 1
                }
            }
            guard found else { return nil }
            // The child's entries: how many, and the one when it is alone and at the child itself.
            Self.join(pathKey, smallest, into: &childKey)
            var count = 0
            var single: (layer: Int, entry: LayeredEntry)?
            for i in walkers.indices {
                while childKey.withUnsafeBytes({ walkers[i].hasPrefix($0) }) {
                    count += 1
                    if walkers[i].keyCount == childKey.count { single = (i, walkers[i].entry) }
                    walkers[i].advance()
                }
            }
            let name = String(decoding: smallest, as: UTF8.self)
            if count == 0, let fromBase { return (name, .node(projected(fromBase))) }
            if count == 1, fromBase == nil, let (layer, entry) = single {
                if entry.isEmpty { continue }
                if decode {
                    if keepingStored, projection == nil, !entry.isInline, entry.ref.length > 0, let child = stored(entry.ref) {
                        return (name, child)
                    }
                    return (name, .node(value(entry, layer)))
                }
                if priorities && (entry.isInline || (layers[layer].knowsPriorities ? entry.hasPriority : reader.hasPriority(entry.ref))) {
                    return (name, .node(value(entry, layer)))
                }
                return (name, .node(nil))
            }
            let node = location.data.visibleNode(at: location.path.child(name)) ?? .empty
            if node.isEmpty { continue }
            return (name, .node(projected(node)))
        }
    }

    /// Puts the child key in `key` (its bytes after the location's `count`, up to the next 0)
    /// into `smallest`, unless `compare` and it does not sort before `smallest`; whether it did.
    /// (Through the arrays' buffers: slices and generic appends retained and released the
    /// arrays at each step, several times per child of a walk.)
    private static func takeChildKey(of key: [UInt8], below count: Int, into smallest: inout [UInt8], unlessAfter compare: Bool) -> Bool {
        key.withUnsafeBufferPointer { k in
            let rest = UnsafeBufferPointer(rebasing: k[count...])
            let child = UnsafeBufferPointer(rebasing: rest[..<rest.firstIndex(of: 0)!])
            if compare, !smallest.withUnsafeBufferPointer({ Self.precedes(child, $0) }) { return false }
            smallest.removeAll(keepingCapacity: true)
            smallest.append(contentsOf: child)
            return true
        }
    }

    /// Whether `a` sorts before `b` byte by byte (a location's keys are plain when walked so).
    private static func precedes(_ a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Bool {
        let n = min(a.count, b.count)
        if n > 0 {
            let c = memcmp(a.baseAddress!, b.baseAddress!, n)
            if c != 0 { return c < 0 }
        }
        return a.count < b.count
    }

    /// `out` = `a`, `b`, 0.
    private static func join(_ a: [UInt8], _ b: [UInt8], into out: inout [UInt8]) {
        out.removeAll(keepingCapacity: true)
        a.withUnsafeBufferPointer { out.append(contentsOf: $0) }
        b.withUnsafeBufferPointer { out.append(contentsOf: $0) }
        out.append(0)
    }

    /// The stored value, read once: its bytes, checked; decoded when it carries a priority
    /// (walks order by it) or is empty. Nil when it cannot be read or checked: then
    /// ``value(_:_:)`` reads it again and tells the reader of the failure.
    private func stored(_ ref: ValueRef) -> Child? {
        try? reader.withValue(ref, checked: { bytes, checkedEmpty in
            if bytes.first == ValueCodec.Tag.withPriority.rawValue { return .node(try ValueCodec.decode(bytes)) }
            // (Checked already when the log read the record ahead, on its thread: see ValueNote.)
            return try (checkedEmpty ?? ValueCodec.validate(bytes)) ? .node(.empty) : .stored(Array(bytes))
        })
    }

    private func projected(_ node: Node) -> Node {
        guard let projection else { return node }
        return node.getChild(projection)
    }

    private func value(_ entry: LayeredEntry, _ layer: Int) -> Node {
        if entry.isInline { return projected(layers[layer].value(entry)) }
        if entry.ref.length == 0 { return .empty }
        if let projection { return reader.node(entry.ref, at: projection) }
        return reader.node(entry.ref)
    }
}

extension View {
    /// The view ``SyncPoint/makeView(_:writes:serverCache:)`` makes for `query` when no view
    /// is at or above its location, built from frozen data (outside the lock): the complete
    /// server data there with the visible writes on top. Nil when the server data there is not
    /// complete (then the view is made under the lock, as always) or a stored value could not
    /// be read.
    static func prebuilt(_ query: QuerySpec, from data: FrozenData) -> View? {
        guard let server = data.server.completeNode(at: query.path) else { return nil }
        let event = WriteTree.visibleNode(at: query.path, overlay: data.overlay) { server }
        guard let event, data.reader.error == nil else { return nil }
        let initial = ViewCache(
            eventCache: CacheNode(indexed: IndexedNode(event, index: query.index), isFullyInitialized: true, isFiltered: false),
            serverCache: CacheNode(indexed: IndexedNode(server, index: query.index), isFullyInitialized: true, isFiltered: false))
        return View(query: query, initial: initial)
    }
}
