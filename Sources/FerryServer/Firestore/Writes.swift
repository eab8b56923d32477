import FerryDocuments
import FerryFirestoreWire
import Foundation

/// One write of a commit, checked and translated from the wire (`google.firestore.v1.Write`).
struct ParsedWrite: Sendable {
    enum Operation: Sendable {
        /// The fields replace the document's (mask nil) or only the masked paths (a masked
        /// path absent from `fields` is deleted; an empty mask changes no field).
        case update([String: FieldValueData], mask: [FieldPath]?)
        case delete
        /// Only the transforms (the older `transform` form).
        case transform
    }

    enum Transform: Sendable {
        case requestTime
        case increment(FieldValueData)
        case maximum(FieldValueData)
        case minimum(FieldValueData)
        case appendMissing([FieldValueData])
        case removeAll([FieldValueData])
    }

    enum Precondition: Sendable {
        case none
        case exists(Bool)
        case updateTime(Int64)
    }

    var key: ResourcePath
    var operation: Operation
    var transforms: [(FieldPath, Transform)] = []
    var precondition: Precondition = .none

    init(wire w: Google_Firestore_V1_Write, in db: DatabaseName) throws {
        func bad(_ why: String) -> FirestoreErrorCode { FirestoreErrorCode(.invalidArgument, why) }
        var wireTransforms = w.updateTransforms
        switch w.operation {
        case nil: throw bad("a write has no operation (update, delete or transform)")
        case .update(let doc):
            key = try db.documentPath(doc.name)
            let fields = try FieldValueData.fields(wire: doc.fields, in: db)
            if w.hasUpdateMask {
                let mask = try w.updateMask.fieldPaths.map { try FieldPath.parseServer($0) }
                if mask.contains(where: \.isDocumentID) { throw bad("an update mask cannot name __name__") }
                operation = .update(fields, mask: mask)
            } else {
                operation = .update(fields, mask: nil)
            }
        case .delete(let name):
            key = try db.documentPath(name)
            operation = .delete
            guard wireTransforms.isEmpty else { throw bad("a delete cannot have transforms") }
        case .transform(let t):
            key = try db.documentPath(t.document)
            operation = .transform
            wireTransforms = t.fieldTransforms + wireTransforms
        }
        var seen = Set<[String]>()
        for t in wireTransforms {
            let path = try FieldPath.parseServer(t.fieldPath)
            if path.isDocumentID { throw bad("a transform cannot change __name__") }
            guard seen.insert(path.segments).inserted else { throw bad("the field \(path) is transformed twice in one write") }
            let transform: Transform
            switch t.transformType {
            case nil: throw bad("the transform of \(path) has no kind")
            case .setToServerValue(let v):
                guard v == .requestTime else { throw bad("the transform of \(path) asks for an unknown server value") }
                transform = .requestTime
            case .increment(let v): transform = .increment(try Self.number(v, db, path))
            case .maximum(let v): transform = .maximum(try Self.number(v, db, path))
            case .minimum(let v): transform = .minimum(try Self.number(v, db, path))
            case .appendMissingElements(let a): transform = .appendMissing(try a.values.map { try FieldValueData(wire: $0, in: db, depth: 1) })
            case .removeAllFromArray(let a): transform = .removeAll(try a.values.map { try FieldValueData(wire: $0, in: db, depth: 1) })
            }
            transforms.append((path, transform))
        }
        if w.hasCurrentDocument {
            switch w.currentDocument.conditionType {
            case .exists(let e)?: precondition = .exists(e)
            case .updateTime(let t)?: precondition = .updateTime(try Timestamp(wire: t).micros)
            case nil: break
            }
        }
    }

    private static func number(_ v: Google_Firestore_V1_Value, _ db: DatabaseName, _ path: FieldPath) throws -> FieldValueData {
        let value = try FieldValueData(wire: v, in: db)
        guard value.isNumber else { throw FirestoreErrorCode(.invalidArgument, "the transform of \(path) needs a number") }
        return value
    }

    /// The document after this write over `before` at commit `time`, and each transform's result.
    func apply(to before: StoredDocument?, at time: Int64) throws -> (StoredDocument?, [FieldValueData]) {
        switch precondition {
        case .none: break
        case .exists(true):
            if before == nil { throw FirestoreErrorCode(.notFound, "no document to update: \(key)") }
        case .exists(false):
            if before != nil { throw FirestoreErrorCode(.alreadyExists, "the document already exists: \(key)") }
        case .updateTime(let t):
            if before?.updateTime != t { throw FirestoreErrorCode(.failedPrecondition, "the document \(key) was changed since its update time \(Timestamp(micros: t))") }
        }
        var fields: [String: FieldValueData]
        switch operation {
        case .delete: return (nil, [])
        case .update(let new, nil): fields = new
        case .update(let new, let mask?):
            fields = before?.fields ?? [:]
            let source = FieldValueData.map(new)
            for p in mask { setField(&fields, p.segments[...], source.value(at: p)) }
        case .transform: fields = before?.fields ?? [:]
        }
        var results: [FieldValueData] = []
        for (path, t) in transforms {
            let previous = FieldValueData.map(fields).value(at: path)
            let result = Self.result(t, previous: previous, time: time)
            setField(&fields, path.segments[...], result)
            results.append(result)
        }
        let size = UserData.documentSize(path: key, fields: fields)
        if size > UserData.maxDocumentBytes {
            throw FirestoreErrorCode(.invalidArgument, "the document \(key) would be \(size) bytes, over Firestore's limit of \(UserData.maxDocumentBytes)")
        }
        if fields.values.contains(where: { Self.nestedTooDeep($0, depth: 0) }) {
            throw FirestoreErrorCode(.invalidArgument, "the document \(key) would nest values more than \(UserData.maxDepth) levels deep (Firestore's limit)")
        }
        return (StoredDocument(fields: fields, createTime: before?.createTime ?? time, updateTime: time), results)
    }

    /// Whether a value nests past Firestore's limit (a masked merge can nest a value deeper
    /// than either side alone; the depths are counted as the wire's are).
    private static func nestedTooDeep(_ v: FieldValueData, depth: Int) -> Bool {
        if depth > UserData.maxDepth { return true }
        switch v {
        case .map(let m): return m.values.contains { nestedTooDeep($0, depth: depth + 1) }
        case .array(let a): return a.contains { nestedTooDeep($0, depth: depth + 1) }
        default: return false
        }
    }

    static func result(_ t: Transform, previous: FieldValueData?, time: Int64) -> FieldValueData {
        switch t {
        case .requestTime: return .timestamp(Timestamp(micros: time))
        case .increment(let n): return Mutation.localResult(.increment(n), previous: previous, writeTime: Timestamp(micros: time))
        case .appendMissing(let e): return Mutation.localResult(.arrayUnion(e), previous: previous, writeTime: Timestamp(micros: time))
        case .removeAll(let e): return Mutation.localResult(.arrayRemove(e), previous: previous, writeTime: Timestamp(micros: time))
        case .maximum(let n):
            guard let p = previous, p.isNumber else { return n }
            return FieldValueData.compare(n, p) > 0 ? n : p
        case .minimum(let n):
            guard let p = previous, p.isNumber else { return n }
            return FieldValueData.compare(n, p) < 0 ? n : p
        }
    }
}
