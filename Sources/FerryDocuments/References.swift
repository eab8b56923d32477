import FerryLog
import FerryStore
import Foundation

/// A document's location (Firebase's `DocumentReference`). Creating one checks nothing; an
/// invalid path fails the first operation with `invalidArgument`.
public final class DocumentReference: Sendable, Hashable, CustomStringConvertible {
    public let firestore: Firestore
    let keyResult: Result<ResourcePath, FirestoreErrorCode>

    init(firestore: Firestore, keyResult: Result<ResourcePath, any Error>) {
        self.firestore = firestore
        self.keyResult = keyResult.mapError { $0 as? FirestoreErrorCode ?? FirestoreErrorCode(.invalidArgument, "\($0)") }
    }

    func key() throws -> ResourcePath { try keyResult.get() }

    /// The document's id (its last segment).
    public var documentID: String { (try? key().last) ?? "" }
    /// The document's path below the root (`cities/SF`).
    public var path: String { (try? key().description) ?? "" }
    /// The collection holding the document.
    public var parent: CollectionReference {
        CollectionReference(firestore: firestore, pathResult: keyResult.map(\.parent).mapError { $0 as any Error })
    }

    /// A subcollection of this document.
    public func collection(_ collectionPath: String) -> CollectionReference {
        CollectionReference(firestore: firestore, pathResult: Result {
            let p = try key().appending(try ResourcePath.parse(collectionPath, what: "collection path"))
            guard !p.isDocument else { throw FirestoreErrorCode(.invalidArgument, "\"\(collectionPath)\" names a document, not a collection") }
            return p
        })
    }

    /// Replaces the document with `documentData` (creating it). Returns once the write is
    /// durable on this device; it is sent to the server when one is connected.
    public func setData(_ documentData: [String: Any]) async throws {
        try await firestore.write([try Self.setMutation(key(), documentData, merge: false)])
    }

    /// Replaces the document without waiting for the disk: the write is applied, seen by
    /// listeners and ordered at once, and durable after a later ``Firestore/sync()`` (or any
    /// awaited write). Like Firebase's `setData` without a completion.
    public func setDataNow(_ documentData: [String: Any]) throws {
        try firestore.writeNow([try Self.setMutation(key(), documentData, merge: false)])
    }

    /// With `merge`, writes only the given fields into the document (creating it), leaving
    /// the others; `FieldValue.delete()` removes a field.
    public func setData(_ documentData: [String: Any], merge: Bool) async throws {
        try await firestore.write([try Self.setMutation(key(), documentData, merge: merge)])
    }

    /// Writes only the fields named in `mergeFields` (`String` dotted paths or `FieldPath`s)
    /// from `documentData`.
    public func setData(_ documentData: [String: Any], mergeFields: [Any]) async throws {
        try await firestore.write([try Self.mergeFieldsMutation(key(), documentData, mergeFields)])
    }

    /// Updates fields of an existing document: keys are field paths (`"a.b"` or a
    /// `FieldPath`). A document the server does not hold makes the write fail there
    /// (`notFound`); locally, a document not in the cache stays absent.
    public func updateData(_ fields: [AnyHashable: Any]) async throws {
        try await firestore.write([try Self.updateMutation(key(), fields)])
    }

    /// Deletes the document (its subcollections stay).
    public func delete() async throws {
        try await firestore.write([Mutation(operation: .delete, key: try key())])
    }

    static func setMutation(_ key: ResourcePath, _ data: [String: Any], merge: Bool) throws -> Mutation {
        let p = try UserData.parseSet(data, merge: merge)
        if merge {
            return Mutation(operation: .patch, key: key, fields: p.fields, mask: p.mask ?? [], transforms: p.transforms)
        }
        return Mutation(operation: .set, key: key, fields: p.fields, transforms: p.transforms)
    }

    static func mergeFieldsMutation(_ key: ResourcePath, _ data: [String: Any], _ fields: [Any]) throws -> Mutation {
        let paths = try fields.map { try fieldPath($0) }
        let p = try UserData.parseMergeFields(data, fields: paths)
        return Mutation(operation: .patch, key: key, fields: p.fields, mask: p.mask ?? [], transforms: p.transforms)
    }

    static func updateMutation(_ key: ResourcePath, _ fields: [AnyHashable: Any]) throws -> Mutation {
        guard !fields.isEmpty else { throw FirestoreErrorCode(.invalidArgument, "updateData needs at least one field") }
        let p = try UserData.parseUpdate(fields)
        return Mutation(operation: .patch, key: key, fields: p.fields, mask: p.mask ?? [], transforms: p.transforms, mustExist: true)
    }

    /// Reads the document. `.server` asks the connected server (`unavailable` offline);
    /// `.default` asks it when it can be reached and the document has no pending write here,
    /// else answers as `.cache` does: from the local cache — a document the cache knows
    /// nothing of is an `unavailable` error; one known to be deleted is a snapshot whose
    /// `exists` is false.
    public func getDocument(source: FirestoreSource = .default) async throws -> DocumentSnapshot {
        let k = try key()
        let pendingHere = source == .default ? try firestore.read { $0.batchesByKey[k] != nil } : false
        if source != .cache, !pendingHere, let server = firestore.reachableServer {
            do {
                let found = try await server.documents([k], transaction: nil).first
                let doc = found.map { LocalDocument.stored($0.key, $0.fields, createTime: Timestamp(micros: $0.createTime), updateTime: Timestamp(micros: $0.version)) }
                return DocumentSnapshot(firestore: firestore, key: k, doc: doc, fromCache: false)
            } catch let e as FirestoreErrorCode where source == .default && e.code == .unavailable {
                // Unreachable after all: the cache answers.
            }
        } else if source == .server {
            throw Query.serverUnavailable
        }
        let doc = try firestore.read { $0.document(k) }
        guard let doc, !doc.unknown else {
            throw FirestoreErrorCode(.unavailable, "failed to get document \(k) from the cache: it is not cached (it may exist on the server, which is not reachable)")
        }
        return DocumentSnapshot(firestore: firestore, key: k, doc: doc, fromCache: true)
    }

    /// Listens to the document: called at once with what the cache holds, then at each change.
    @discardableResult
    public func addSnapshotListener(includeMetadataChanges: Bool = false,
                                    _ listener: @escaping @Sendable (DocumentSnapshot?, (any Error)?) -> Void) -> ListenerRegistration {
        addSnapshotListener(includeMetadataChanges: includeMetadataChanges, cacheOnly: false, listener)
    }

    func addSnapshotListener(includeMetadataChanges: Bool, cacheOnly: Bool,
                             _ listener: @escaping @Sendable (DocumentSnapshot?, (any Error)?) -> Void) -> ListenerRegistration {
        let k: ResourcePath
        do { k = try key() } catch {
            firestore.queue.async { listener(nil, error) }
            return ListenerRegistration(remove: {})
        }
        var core = QueryCore(path: k.parent)
        core.documentKey = k
        let fs = firestore
        return firestore.addListener(core, includeMetadataChanges: includeMetadataChanges, cacheOnly: cacheOnly) { event in
            switch event {
            case .query(let docs, _, let fromCache, let pending):
                listener(DocumentSnapshot(firestore: fs, key: k, doc: docs.first, fromCache: fromCache, hasPendingWrites: pending), nil)
            case .failure(let e): listener(nil, e)
            }
        }
    }

    /// The document's snapshots as an asynchronous sequence.
    public func snapshots(includeMetadataChanges: Bool = false) -> AsyncThrowingStream<DocumentSnapshot, any Error> {
        AsyncThrowingStream { continuation in
            let reg = addSnapshotListener(includeMetadataChanges: includeMetadataChanges) { snap, error in
                if let snap { continuation.yield(snap) } else { continuation.finish(throwing: error) }
            }
            continuation.onTermination = { _ in reg.remove() }
        }
    }

    public static func == (a: DocumentReference, b: DocumentReference) -> Bool { a.firestore === b.firestore && a.path == b.path }
    public func hash(into h: inout Hasher) { h.combine(path) }
    public var description: String { "DocumentReference(\(path))" }
}

/// A collection's location (Firebase's `CollectionReference`), and the query of all its documents.
public final class CollectionReference: Query, @unchecked Sendable {
    let pathResult: Result<ResourcePath, FirestoreErrorCode>

    init(firestore: Firestore, pathResult: Result<ResourcePath, any Error>) {
        let r = pathResult.mapError { $0 as? FirestoreErrorCode ?? FirestoreErrorCode(.invalidArgument, "\($0)") }
        self.pathResult = r
        let core = QueryCore(path: (try? r.get()) ?? ResourcePath([]))
        super.init(firestore: firestore, core: core, invalid: { if case .failure(let e) = r { e } else { nil } }())
    }

    /// The collection's id (its last segment).
    public var collectionID: String { (try? pathResult.get().last) ?? "" }
    /// The collection's path below the root.
    public var path: String { (try? pathResult.get().description) ?? "" }
    /// The document holding this subcollection (nil for a top-level collection).
    public var parent: DocumentReference? {
        guard let p = try? pathResult.get(), p.segments.count > 1 else { return nil }
        return DocumentReference(firestore: firestore, keyResult: .success(p.parent))
    }

    /// A new document with an automatic 20-character id.
    public func document() -> DocumentReference {
        DocumentReference(firestore: firestore, keyResult: pathResult.map { $0.appending(autoID()) }.mapError { $0 as any Error })
    }

    /// The document at `documentPath` below this collection.
    public func document(_ documentPath: String) -> DocumentReference {
        DocumentReference(firestore: firestore, keyResult: Result {
            let p = try pathResult.get().appending(try ResourcePath.parse(documentPath, what: "document path"))
            guard p.isDocument else { throw FirestoreErrorCode(.invalidArgument, "\"\(documentPath)\" names a collection, not a document") }
            return p
        })
    }

    /// Adds a document with an automatic id; returns its reference once the write is durable.
    @discardableResult
    public func addDocument(data: [String: Any]) async throws -> DocumentReference {
        let ref = document()
        try await ref.setData(data)
        return ref
    }
}

/// The writes of a batch or a transaction as the app makes them: each is checked when made,
/// and the first invalid one's error is kept for the commit.
final class CollectedWrites: Sendable {
    let firestore: Firestore
    private let state = FerryMutex<(list: [Mutation], error: FirestoreErrorCode?)>(([], nil))

    init(firestore: Firestore) { self.firestore = firestore }

    func set(_ data: [String: Any], _ document: DocumentReference, merge: Bool) {
        add { try DocumentReference.setMutation(key(of: document), data, merge: merge) }
    }
    func set(_ data: [String: Any], _ document: DocumentReference, mergeFields: [Any]) {
        add { try DocumentReference.mergeFieldsMutation(key(of: document), data, mergeFields) }
    }
    func update(_ fields: [AnyHashable: Any], _ document: DocumentReference) {
        add { try DocumentReference.updateMutation(key(of: document), fields) }
    }
    func delete(_ document: DocumentReference) {
        add { Mutation(operation: .delete, key: try key(of: document)) }
    }

    /// The document's key, refused when it belongs to another store.
    func key(of ref: DocumentReference) throws -> ResourcePath {
        guard ref.firestore === firestore else { throw FirestoreErrorCode(.invalidArgument, "the document \(ref.path) belongs to another Firestore instance") }
        return try ref.key()
    }

    /// Whether a valid write was made.
    var isEmpty: Bool { state.withLock { $0.list.isEmpty } }

    /// The writes, or the first invalid one's error.
    func take() throws -> [Mutation] {
        let (list, error) = state.withLock { ($0.list, $0.error) }
        if let error { throw error }
        return list
    }

    private func add(_ make: () throws -> Mutation) {
        do {
            let m = try make()
            state.withLock { $0.list.append(m) }
        } catch {
            state.withLock { if $0.error == nil { $0.error = error as? FirestoreErrorCode ?? FirestoreErrorCode(.invalidArgument, "\(error)") } }
        }
    }
}

/// A batch of writes applied together, as one record (Firebase's `WriteBatch`). Kept offline
/// and sent later, unlike a transaction.
public final class WriteBatch: @unchecked Sendable {
    let firestore: Firestore
    private let writes: CollectedWrites
    private let committed = FerryMutex(false)

    init(firestore: Firestore) {
        self.firestore = firestore
        writes = CollectedWrites(firestore: firestore)
    }

    @discardableResult public func setData(_ data: [String: Any], forDocument document: DocumentReference) -> WriteBatch {
        writes.set(data, document, merge: false)
        return self
    }
    @discardableResult public func setData(_ data: [String: Any], forDocument document: DocumentReference, merge: Bool) -> WriteBatch {
        writes.set(data, document, merge: merge)
        return self
    }
    @discardableResult public func setData(_ data: [String: Any], forDocument document: DocumentReference, mergeFields: [Any]) -> WriteBatch {
        writes.set(data, document, mergeFields: mergeFields)
        return self
    }
    @discardableResult public func updateData(_ fields: [AnyHashable: Any], forDocument document: DocumentReference) -> WriteBatch {
        writes.update(fields, document)
        return self
    }
    @discardableResult public func deleteDocument(_ document: DocumentReference) -> WriteBatch {
        writes.delete(document)
        return self
    }

    /// Writes the batch (all or nothing: one record); returns once it is durable. A batch
    /// commits once; an invalid write in it fails the commit with its error and writes nothing.
    public func commit() async throws {
        try committed.withLock { done in
            guard !done else { throw FirestoreErrorCode(.failedPrecondition, "this write batch was already committed") }
            done = true
        }
        try await firestore.write(try writes.take())
    }
}
