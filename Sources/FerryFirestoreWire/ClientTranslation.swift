import FerryDocuments
import Foundation
import SwiftProtobuf

// What Ferry's client sends and reads: the model's queries, mutations and documents on the wire.

extension QueryCore {
    /// The target that listens to this query: documents for a document query, else the
    /// structured query the server runs (a limit-to-last query as its limit-to-first mirror,
    /// as Firestore's SDKs send it).
    package func wireTarget(in database: DatabaseName) -> Google_Firestore_V1_Target {
        var target = Google_Firestore_V1_Target()
        if let documentKey {
            var d = Google_Firestore_V1_Target.DocumentsTarget()
            d.documents = [database.name(of: documentKey)]
            target.documents = d
            return target
        }
        var q = Google_Firestore_V1_Target.QueryTarget()
        var sq = Google_Firestore_V1_StructuredQuery()
        var from = Google_Firestore_V1_StructuredQuery.CollectionSelector()
        if let group = collectionGroup {
            q.parent = database.name(of: path)
            from.collectionID = group
            from.allDescendants = true
        } else {
            q.parent = database.name(of: path.parent)
            from.collectionID = path.last
        }
        sq.from = [from]
        if let filter { sq.where = filter.wire(in: database) }
        var orders = self.orders
        var (start, end) = (self.start, self.end)
        if limitType == .last, limit != nil {
            orders = orders.map { OrderBy(field: $0.field, descending: !$0.descending) }
            (start, end) = (end, start)
        }
        sq.orderBy = orders.map { o in
            var w = Google_Firestore_V1_StructuredQuery.Order()
            w.field.fieldPath = o.field.description
            w.direction = o.descending ? .descending : .ascending
            return w
        }
        func cursor(_ b: Bound, start: Bool) -> Google_Firestore_V1_Cursor {
            var c = Google_Firestore_V1_Cursor()
            c.values = b.position.map { $0.wire(in: database) }
            c.before = start ? b.inclusive : !b.inclusive
            return c
        }
        if let start { sq.startAt = cursor(start, start: true) }
        if let end { sq.endAt = cursor(end, start: false) }
        if let limit {
            var l = Google_Protobuf_Int32Value()
            l.value = Int32(clamping: limit)
            sq.limit = l
        }
        q.structuredQuery = sq
        target.query = q
        return target
    }
}

extension FilterNode {
    package func wire(in database: DatabaseName) -> Google_Firestore_V1_StructuredQuery.Filter {
        var f = Google_Firestore_V1_StructuredQuery.Filter()
        switch self {
        case .and(let parts), .or(let parts):
            var c = Google_Firestore_V1_StructuredQuery.CompositeFilter()
            if case .and = self { c.op = .and } else { c.op = .or }
            c.filters = parts.map { $0.wire(in: database) }
            f.compositeFilter = c
        case .field(let path, let op, let value):
            var field = Google_Firestore_V1_StructuredQuery.FieldReference()
            field.fieldPath = path.description
            if op == .equal || op == .notEqual, value == .null || value.isNaN {
                var u = Google_Firestore_V1_StructuredQuery.UnaryFilter()
                u.field = field
                switch (op == .equal, value == .null) {
                case (true, true): u.op = .isNull
                case (true, false): u.op = .isNan
                case (false, true): u.op = .isNotNull
                case (false, false): u.op = .isNotNan
                }
                f.unaryFilter = u
                return f
            }
            var ff = Google_Firestore_V1_StructuredQuery.FieldFilter()
            ff.field = field
            ff.value = value.wire(in: database)
            switch op {
            case .lessThan: ff.op = .lessThan
            case .lessThanOrEqual: ff.op = .lessThanOrEqual
            case .equal: ff.op = .equal
            case .notEqual: ff.op = .notEqual
            case .greaterThanOrEqual: ff.op = .greaterThanOrEqual
            case .greaterThan: ff.op = .greaterThan
            case .arrayContains: ff.op = .arrayContains
            case .arrayContainsAny: ff.op = .arrayContainsAny
            case .in: ff.op = .in
            case .notIn: ff.op = .notIn
            }
            f.fieldFilter = ff
        }
        return f
    }
}

extension Mutation {
    /// The write this mutation is on the wire.
    package func wire(in database: DatabaseName) -> Google_Firestore_V1_Write {
        var w = Google_Firestore_V1_Write()
        let name = database.name(of: key)
        switch operation {
        case .delete:
            w.delete = name
            return w
        case .set, .patch:
            var doc = Google_Firestore_V1_Document()
            doc.name = name
            doc.fields = FieldValueData.wire(fields: fields, in: database)
            w.update = doc
        }
        if operation == .patch {
            var mask = Google_Firestore_V1_DocumentMask()
            // A transformed field is the transform's alone (in the mask, the server would first
            // delete it, as the fields do not hold it).
            let transformed = Set(transforms.map(\.0.segments))
            mask.fieldPaths = self.mask.filter { !transformed.contains($0.segments) }.map(\.description)
            w.updateMask = mask
            if mustExist {
                var p = Google_Firestore_V1_Precondition()
                p.exists = true
                w.currentDocument = p
            }
        }
        w.updateTransforms = transforms.map { path, t in
            var ft = Google_Firestore_V1_DocumentTransform.FieldTransform()
            ft.fieldPath = path.description
            switch t {
            case .serverTimestamp: ft.setToServerValue = .requestTime
            case .increment(let n): ft.increment = n.wire(in: database)
            case .arrayUnion(let e):
                var a = Google_Firestore_V1_ArrayValue()
                a.values = e.map { $0.wire(in: database) }
                ft.appendMissingElements = a
            case .arrayRemove(let e):
                var a = Google_Firestore_V1_ArrayValue()
                a.values = e.map { $0.wire(in: database) }
                ft.removeAllFromArray = a
            }
            return ft
        }
        return w
    }
}

extension WatchDocument {
    /// A document a listen sent.
    package init(wire d: Google_Firestore_V1_Document, in database: DatabaseName) throws {
        self.init(key: try database.documentPath(d.name), fields: try FieldValueData.fields(wire: d.fields, in: database),
                  version: try Timestamp(wire: d.updateTime).micros, createTime: try Timestamp(wire: d.createTime).micros)
    }
}

/// A commit carrying several batches of one client store (Ferry's extension): the
/// `x-ferry-client` and `x-ferry-batches` headers, and each batch's answer in the response's
/// `ferry_batch_answers`.
package enum BatchAnswers {
    package static let clientHeader = "x-ferry-client"
    package static let batchesHeader = "x-ferry-batches"

    package enum Answer: Sendable, Equatable {
        /// Committed at this time (µs); also for a batch the server had committed before.
        case committed(Int64)
        case rejected(FirestoreErrorCode)
    }

    /// `id:count,id:count…`: each batch's id and how many of the commit's writes are its.
    package static func header(_ batches: [(id: Int64, count: Int)]) -> String {
        batches.map { "\($0.id):\($0.count)" }.joined(separator: ",")
    }

    package static func parseHeader(_ s: String) -> [(id: Int64, count: Int)]? {
        var out: [(Int64, Int)] = []
        for part in s.split(separator: ",") {
            let p = part.split(separator: ":")
            guard p.count == 2, let id = Int64(p[0]), let n = Int(p[1]), n >= 0 else { return nil }
            out.append((id, n))
        }
        return out
    }

    package static func wire(_ a: Answer) -> Google_Firestore_V1_FerryBatchAnswer {
        var w = Google_Firestore_V1_FerryBatchAnswer()
        switch a {
        case .committed(let t): w.commitTimeMicros = t
        case .rejected(let e):
            w.code = Int32(e.code.rawValue == 0 ? FirestoreErrorCode.Code.unknown.rawValue : e.code.rawValue)
            w.message = e.message
        }
        return w
    }

    package static func answer(_ w: Google_Firestore_V1_FerryBatchAnswer) -> Answer {
        w.code == 0 ? .committed(w.commitTimeMicros) : .rejected(FirestoreErrorCode(FirestoreErrorCode.Code(rawValue: Int(w.code)) ?? .unknown, w.message))
    }
}
