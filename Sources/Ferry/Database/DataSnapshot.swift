/// How fresh a snapshot's data is.
public struct SnapshotMetadata: Sendable, Hashable, CustomStringConvertible {
    /// True when no live server listen has confirmed the data: it comes from the local cache
    /// (and local writes). Always true while offline.
    public var fromCache: Bool
    /// True when local writes not yet acknowledged by the server touch the data.
    public var hasPendingWrites: Bool

    /// Metadata with the given flags.
    public init(fromCache: Bool, hasPendingWrites: Bool) {
        self.fromCache = fromCache
        self.hasPendingWrites = hasPendingWrites
    }

    public var description: String { "fromCache: \(fromCache), hasPendingWrites: \(hasPendingWrites)" }
}

/// The data at a location (or of a query) at one moment. Immutable.
public struct DataSnapshot: Sendable, CustomStringConvertible {
    /// Where the data is.
    public let ref: DatabaseReference
    let node: Node
    let index: QueryIndex
    /// Whether the data comes from the cache and whether local writes touch it.
    public let metadata: SnapshotMetadata

    init(ref: DatabaseReference, node: Node, index: QueryIndex = .priority, metadata: SnapshotMetadata) {
        self.ref = ref
        self.node = node
        self.index = index
        self.metadata = metadata
    }

    /// The last key of the location; nil for the root.
    public var key: String? { ref.key }
    /// The value: null, a leaf, an object (an array when its keys are dense integers).
    public var value: Value { node.value() }
    /// The value with priorities (`.priority`, `{".value", ".priority"}`) and never arrays.
    public var exportValue: Value { node.value(export: true) }
    /// The priority: null, a number or a string.
    public var priority: Value { node.priority.value() }
    /// Whether there is data (not null).
    public var exists: Bool { !node.isEmpty }
    /// How many children the data here has.
    public var childrenCount: Int { node.numChildren }
    /// Whether the data here has any children.
    public var hasChildren: Bool { node.numChildren > 0 }

    /// Whether there is data at `path` (relative, `/`-separated) below here.
    public func hasChild(_ path: String) -> Bool { !node.getChild(Path(path)).isEmpty }

    /// The data at a relative path (a snapshot of null when there is none).
    public func childSnapshot(forPath path: String) -> DataSnapshot {
        let p = Path(path)
        return DataSnapshot(ref: ref.childUnchecked(p), node: node.getChild(p), metadata: metadata)
    }

    /// The children, in the query's order (key order for a plain location).
    public var children: [DataSnapshot] {
        IndexedNode(node, index: index).ordered.map {
            DataSnapshot(ref: ref.childUnchecked(Path(keys: [$0.name])), node: $0.node, metadata: metadata)
        }
    }

    /// Decodes the value into a `Decodable` type (through JSON).
    public func decode<T: Decodable>(_ type: T.Type = T.self) throws -> T {
        try ValueCoding.decode(type, from: value)
    }

    public var description: String { "DataSnapshot(\(ref.path) = \(value))" }
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
