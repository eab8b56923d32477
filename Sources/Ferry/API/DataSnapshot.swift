/// The data at a location (or of a query) at one moment. Immutable.
///
/// A snapshot of a big location read from the cache (``DatabaseQuery/getData()``) does not
/// build its data up front: it keeps a frozen view of the store's indexes and decodes a child
/// when it is asked for. ``childrenCount``, ``hasChild(_:)``, ``childSnapshot(forPath:)`` and
/// ``exists`` read only what they need; ``forEachChild(_:)`` and ``childStream`` walk the
/// children in order holding one at a time (a child stored as one value comes as its checked
/// bytes, decoded only as far as it is read); ``value`` builds the whole value. Such a snapshot
/// keeps the log's segment files it may read open while it lives (space that compaction or
/// eviction frees comes back when it goes).
public struct DataSnapshot: Sendable, CustomStringConvertible {
    enum Content: Sendable {
        case node(Node)
        case lazy(LazyLocation)
        /// A child given by a walk: its stored value's bytes, checked (not empty, without a
        /// priority), decoded when read.
        case stored([UInt8])

        var isStored: Bool { if case .stored = self { true } else { false } }
    }

    /// Where the data is.
    public var ref: DatabaseReference {
        switch place {
        case .at(let ref): ref
        case .child(let parent, let key): DatabaseReference(database: parent.ref.database, path: parent.ref.path.child(key))
        }
    }

    /// Where a snapshot is: its reference, or for a child given by a walk its parent's and its
    /// key (the child's reference is made when asked: making a path for each of a million
    /// children was ~5% of walking them), the parent's held once for all the walk's children
    /// (a reference is two objects to retain and release per child).
    enum Place: Sendable {
        case at(DatabaseReference)
        case child(Parent, String)
    }

    /// A parent's reference, shared by the children a walk gives.
    final class Parent: Sendable {
        let ref: DatabaseReference
        init(_ ref: DatabaseReference) { self.ref = ref }
    }

    private let place: Place
    let content: Content
    let index: QueryIndex
    /// Whether the data comes from the cache and whether local writes touch it.
    public let metadata: SnapshotMetadata

    init(ref: DatabaseReference, node: Node, index: QueryIndex = .priority, metadata: SnapshotMetadata) {
        self.init(ref: ref, content: .node(node), index: index, metadata: metadata)
    }

    init(ref: DatabaseReference, content: Content, index: QueryIndex = .priority, metadata: SnapshotMetadata) {
        self.init(place: .at(ref), content: content, index: index, metadata: metadata)
    }

    private init(place: Place, content: Content, index: QueryIndex, metadata: SnapshotMetadata) {
        self.place = place
        self.content = content
        self.index = index
        self.metadata = metadata
    }

    /// The whole node (decoding everything, for a lazily read snapshot).
    var node: Node {
        switch content {
        case .node(let n): n
        case .lazy(let l): l.node
        // (Decoding cannot fail: the walk that gave the bytes checked them as decoding does.)
        case .stored(let bytes): (try? bytes.withUnsafeBytes { try ValueCodec.decode($0) }) ?? .empty
        }
    }

    /// The last key of the location; nil for the root.
    public var key: String? {
        switch place {
        case .at(let ref): ref.key
        case .child(_, let key): key
        }
    }
    /// The value: null, a leaf, an object (an array when its keys are dense integers).
    public var value: Value {
        if case .stored(let bytes) = content, let v = try? bytes.withUnsafeBytes({ try ValueCodec.value($0) }) { return v }
        return node.value()
    }
    /// The value with priorities (`.priority`, `{".value", ".priority"}`) and never arrays.
    public var exportValue: Value { node.value(export: true) }
    /// The priority: null, a number or a string.
    public var priority: Value {
        if case .lazy(let l) = content, l.plan != nil { return .null }  // (a location read lazily has none)
        if case .stored = content { return .null }  // (one with a priority is decoded)
        return node.priority.value()
    }
    /// Whether there is data (not null).
    public var exists: Bool {
        switch content {
        case .node(let n): !n.isEmpty
        case .lazy(let l): l.exists
        case .stored: true
        }
    }
    /// How many children the data here has.
    public var childrenCount: Int {
        switch content {
        case .node(let n): n.numChildren
        case .lazy(let l): l.childrenCount
        case .stored(let bytes): (try? bytes.withUnsafeBytes { try ValueCodec.childCount($0, at: .root) }) ?? 0
        }
    }
    /// Whether the data here has any children.
    public var hasChildren: Bool {
        switch content {
        case .node(let n): n.numChildren > 0
        case .lazy(let l): l.plan != nil ? l.exists : l.node.numChildren > 0
        case .stored(let bytes): bytes.first == ValueCodec.Tag.children.rawValue  // (never none of them)
        }
    }

    /// Whether there is data at `path` (relative, `/`-separated) below here.
    public func hasChild(_ path: String) -> Bool { !descendant(Path(path)).isEmpty }

    private func descendant(_ p: Path) -> Node {
        switch content {
        case .node(let n): n.getChild(p)
        case .lazy(let l): l.descendant(p)
        case .stored(let bytes): (try? bytes.withUnsafeBytes { try ValueCodec.decode($0, at: p) }) ?? .empty
        }
    }

    /// The data at a relative path (a snapshot of null when there is none).
    public func childSnapshot(forPath path: String) -> DataSnapshot {
        let p = Path(path)
        if case .lazy(let l) = content, l.plan != nil, !p.isEmpty, !p.keys.contains(".priority") {
            guard let child = LazyLocation.make(l.data, at: l.path.child(p)) else {
                return DataSnapshot(ref: ref.childUnchecked(p), node: .empty, metadata: metadata)
            }
            return DataSnapshot(ref: ref.childUnchecked(p), content: .lazy(child), metadata: metadata)
        }
        return DataSnapshot(ref: ref.childUnchecked(p), node: descendant(p), metadata: metadata)
    }

    /// The children, in the query's order (key order for a plain location). For a lazily read
    /// snapshot, each child is decoded when it is first read.
    public var children: [DataSnapshot] {
        switch content {
        case .node(let n):
            let parent = Parent(ref)
            return IndexedNode(n, index: index).ordered.map { child($0.name, .node($0.node), of: parent) }
        case .lazy(let l):
            guard l.plan != nil else { return DataSnapshot(ref: ref, node: l.node, index: index, metadata: metadata).children }
            let keys = l.indexOrder(index) ?? l.keys
            let ref = self.ref
            return keys.map { k in
                let p = Path(keys: [k])
                return DataSnapshot(ref: ref.childUnchecked(p), content: .lazy(.deferred(l.data, at: l.path.child(p))), metadata: metadata)
            }
        case .stored:
            return DataSnapshot(ref: ref, node: node, index: index, metadata: metadata).children
        }
    }

    /// Calls `body` with each child in the query's order (key order for a plain location),
    /// one child at a time: the memory a walk over a million children needs is what `body`
    /// keeps. A child stored as one value comes as its bytes, checked as decoding would check
    /// them (so that damage throws here), and is decoded as far as it is read (``hasChildren``
    /// reads one byte, ``childSnapshot(forPath:)`` that path, ``value`` builds the value
    /// straight from the bytes). Ordering by priority gives the children without a priority as they are
    /// read (they come first, in key order), keeping only the keys and priorities of those with
    /// one, which then come sorted, each read again. Ordering by value or by a child's value
    /// reads every child once to sort them, keeping only their keys and the values ordered by,
    /// then reads each again.
    ///
    /// - Throws: what `body` throws; ``DatabaseError`` (``DatabaseError/Code/storage``) when a
    ///   stored value cannot be read (the database stops, as it does when its own read fails).
    public func forEachChild(_ body: (DataSnapshot) throws -> Void) throws {
        guard case .lazy(let l) = content, l.plan != nil else {
            for child in children { try body(child) }
            return
        }
        let parent = Parent(ref)
        // (The reader taken once: the indexes refer to it weakly, so each retain of it goes
        // through a side table — one per child was ~4% of a walk.)
        let reader = l.data.reader
        var walk = OrderedChildWalk(l, index: index)
        while let (key, child) = walk.step() {
            if let e = reader.error { throw e }
            try body(self.child(key, child, of: parent))
        }
        if let e = reader.error { throw e }
    }

    /// The snapshot of child `key`, whose data is `node`.
    func child(_ key: String, _ node: Node) -> DataSnapshot { child(key, .node(node), of: Parent(ref)) }

    /// The snapshot of child `key` with `content`, given this snapshot's reference as a
    /// ``Parent`` (made once for a walk of many children).
    func child(_ key: String, _ content: Content, of parent: Parent) -> DataSnapshot {
        DataSnapshot(place: .child(parent, key), content: content, index: .priority, metadata: metadata)
    }

    /// Decodes the value into a `Decodable` type (through JSON).
    public func decode<T: Decodable>(_ type: T.Type = T.self) throws -> T {
        try ValueCoding.decode(type, from: value)
    }

    public var description: String {
        if case .lazy(let l) = content, l.plan != nil { return "DataSnapshot(\(ref.path), \(childrenCount) children)" }
        return "DataSnapshot(\(ref.path) = \(value))"
    }
}

/// One event from an `AsyncSequence` of a query's events.
public struct DataEvent: Sendable {
    /// Which kind of event this is.
    public var type: DataEventType
    /// The data the event is about: the location's for `value`, the child's for child events.
    public var snapshot: DataSnapshot
    /// For child_added, child_changed and child_moved: the key of the sibling before it.
    public var previousSiblingKey: String?
}

/// Identifies an observer, for ``DatabaseQuery/removeObserver(withHandle:)``.
public struct ObserverHandle: Hashable, Sendable {
    let id: UInt64
}
