import FerryStore
import Foundation

extension SnapshotMetadata {
    /// Firebase's name for ``fromCache``.
    public var isFromCache: Bool { fromCache }
}

/// A document as read at one moment (Firebase's `DocumentSnapshot`).
public class DocumentSnapshot: @unchecked Sendable, CustomStringConvertible {
    let firestore: Firestore
    let key: ResourcePath
    /// The document (nil or without fields: it does not exist).
    let doc: LocalDocument?
    public let metadata: SnapshotMetadata

    init(firestore: Firestore, key: ResourcePath, doc: LocalDocument?, fromCache: Bool, hasPendingWrites: Bool? = nil) {
        self.firestore = firestore
        self.key = key
        self.doc = doc
        metadata = SnapshotMetadata(fromCache: fromCache, hasPendingWrites: hasPendingWrites ?? (doc?.hasPendingWrites ?? false))
    }

    /// Whether the document exists.
    public var exists: Bool { doc?.fields != nil }
    /// The document's id.
    public var documentID: String { key.last }
    /// The document's reference.
    public var reference: DocumentReference { DocumentReference(firestore: firestore, keyResult: .success(key)) }

    /// The document's fields (nil when it does not exist).
    public func data() -> [String: Any]? { data(with: .none) }

    /// The document's fields, with pending server timestamps shown as `behavior` says.
    public func data(with behavior: ServerTimestampBehavior) -> [String: Any]? {
        guard let fields = doc?.fields else { return nil }
        return fields.mapValues { export($0, behavior) }
    }

    /// One field (a dotted path `String` or a ``FieldPath``); nil when absent.
    public func get(_ field: Any, serverTimestampBehavior behavior: ServerTimestampBehavior = .none) -> Any? {
        guard let fields = doc?.fields, let path = try? fieldPath(field) else { return nil }
        if path.isDocumentID { return documentID }
        return FieldValueData.map(fields).value(at: path).map { export($0, behavior) }
    }

    /// The field `key` (a dotted path), as `get` reads it.
    public subscript(key: String) -> Any? { self.get(key) }

    func export(_ v: FieldValueData, _ behavior: ServerTimestampBehavior) -> Any {
        switch v {
        case .null: NSNull()
        case .bool(let b): b
        case .integer(let i): Int(i)
        case .double(let d): d
        case .timestamp(let t): t
        case .pendingServerTimestamp(let local, let previous):
            switch behavior {
            case .none: NSNull()
            case .estimate: local
            case .previous: previous.map { export($0, behavior) } ?? NSNull()
            }
        case .string(let s): s
        case .bytes(let d): d
        case .reference(let r): DocumentReference(firestore: firestore, keyResult: Result { try ResourcePath.parse(r, what: "reference") })
        case .geoPoint(let g): g
        case .array(let a): a.map { export($0, behavior) }
        case .map(let m): m.mapValues { export($0, behavior) }
        }
    }

    public var description: String { "DocumentSnapshot(\(key), exists: \(exists), \(metadata))" }
}

/// A document in a query's results: it exists, so ``data()`` is never nil (Firebase's
/// `QueryDocumentSnapshot`).
public final class QueryDocumentSnapshot: DocumentSnapshot, @unchecked Sendable {
    public override func data() -> [String: Any] { super.data(with: .none) ?? [:] }
    public override func data(with behavior: ServerTimestampBehavior) -> [String: Any] { super.data(with: behavior) ?? [:] }
}

/// How a document changed (Firebase's `DocumentChangeType`).
public enum DocumentChangeType: Int, Sendable {
    case added, modified, removed
}

/// One document's change between a query's snapshots (Firebase's `DocumentChange`).
public struct DocumentChange: @unchecked Sendable {
    public let type: DocumentChangeType
    public let document: QueryDocumentSnapshot
    /// Its index in the previous snapshot, after the changes before it (`UInt(NSNotFound)`
    /// for an addition).
    public let oldIndex: UInt
    /// Its index in this snapshot, after the changes before it (`UInt(NSNotFound)` for a removal).
    public let newIndex: UInt
}

/// A query's results at one moment (Firebase's `QuerySnapshot`).
public final class QuerySnapshot: @unchecked Sendable {
    public let query: Query
    public let documents: [QueryDocumentSnapshot]
    public let metadata: SnapshotMetadata
    private let changes: [ChangeData]

    init(query: Query, docs: [LocalDocument], changes: [ChangeData], fromCache: Bool, hasPendingWrites: Bool) {
        self.query = query
        let fs = query.firestore
        documents = docs.map { QueryDocumentSnapshot(firestore: fs, key: $0.key, doc: $0, fromCache: fromCache) }
        metadata = SnapshotMetadata(fromCache: fromCache, hasPendingWrites: hasPendingWrites)
        self.changes = changes
    }

    public var count: Int { documents.count }
    public var isEmpty: Bool { documents.isEmpty }

    /// The changes since the previous snapshot (every document as added in the first one).
    public var documentChanges: [DocumentChange] { documentChanges(includeMetadataChanges: false) }

    /// The changes, with documents whose metadata alone changed as `modified` when asked.
    public func documentChanges(includeMetadataChanges: Bool) -> [DocumentChange] {
        let fs = query.firestore
        return changes.compactMap { c in
            if c.type == .metadata && !includeMetadataChanges { return nil }
            let type: DocumentChangeType = switch c.type {
            case .added: .added
            case .removed: .removed
            case .modified, .metadata: .modified
            }
            return DocumentChange(type: type, document: QueryDocumentSnapshot(firestore: fs, key: c.doc.key, doc: c.doc, fromCache: metadata.fromCache),
                                  oldIndex: c.oldIndex.map(UInt.init) ?? UInt(NSNotFound), newIndex: c.newIndex.map(UInt.init) ?? UInt(NSNotFound))
        }
    }
}

/// Where a listener's snapshots come from (Firebase's `ListenSource`).
public enum ListenSource: Sendable {
    /// The cache and, when connected, the server.
    case `default`
    /// The local cache only (with pending writes): never waits for the server.
    case cache
}

/// A listener's options (Firebase's `SnapshotListenOptions`).
public struct SnapshotListenOptions: Sendable {
    public private(set) var includeMetadataChanges = false
    public private(set) var source: ListenSource = .default
    public init() {}
    public func withIncludeMetadataChanges(_ include: Bool) -> SnapshotListenOptions {
        var o = self
        o.includeMetadataChanges = include
        return o
    }
    public func withSource(_ source: ListenSource) -> SnapshotListenOptions {
        var o = self
        o.source = source
        return o
    }
}

extension Query {
    /// Listens with `options` (a `.cache` source listens to the cache alone).
    @discardableResult
    public func addSnapshotListener(options: SnapshotListenOptions,
                                    listener: @escaping @Sendable (QuerySnapshot?, (any Error)?) -> Void) -> ListenerRegistration {
        addSnapshotListener(includeMetadataChanges: options.includeMetadataChanges, cacheOnly: options.source == .cache, listener)
    }
}

extension DocumentReference {
    /// Listens with `options` (a `.cache` source listens to the cache alone).
    @discardableResult
    public func addSnapshotListener(options: SnapshotListenOptions,
                                    listener: @escaping @Sendable (DocumentSnapshot?, (any Error)?) -> Void) -> ListenerRegistration {
        addSnapshotListener(includeMetadataChanges: options.includeMetadataChanges, cacheOnly: options.source == .cache, listener)
    }
}
