import FerryDocuments
import Foundation
import SwiftProtobuf

/// A database's resource names (`projects/P/databases/D`), and the documents' names below it.
package struct DatabaseName: Sendable, Hashable, CustomStringConvertible {
    package var project: String
    package var database: String

    package init(project: String, database: String) {
        self.project = project
        self.database = database
    }

    /// Parses `projects/P/databases/D`, refusing anything else with `invalidArgument`.
    package init(parsing name: String) throws {
        let parts = name.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        guard parts.count == 4, parts[0] == "projects", parts[2] == "databases", Self.isID(parts[1]), Self.isID(parts[3]) else {
            throw FirestoreErrorCode(.invalidArgument, "\"\(name.prefix(200))\" is not a database name (projects/PROJECT/databases/DATABASE)")
        }
        self.init(project: parts[1], database: parts[3])
    }

    /// A project or database id: 1 to 100 letters, digits, `-`, `_`, `.`, `(` or `)`, not `.` or `..`.
    package static func isID(_ s: String) -> Bool {
        !s.isEmpty && s.utf8.count <= 100 && s != "." && s != ".."
            && s.utf8.allSatisfy { c in (c >= 0x30 && c <= 0x39) || (c | 0x20 >= 0x61 && c | 0x20 <= 0x7A) || "-_.()".utf8.contains(c) }
    }

    package var description: String { "projects/\(project)/databases/\(database)" }
    /// The root of its documents: `projects/P/databases/D/documents`.
    package var documentsRoot: String { description + "/documents" }

    /// The full name of a document or collection.
    package func name(of path: ResourcePath) -> String {
        path.segments.isEmpty ? documentsRoot : documentsRoot + "/" + path.description
    }

    /// The path below the root of a full name (`…/documents` itself is the empty path).
    package func path(of name: String, what: String) throws -> ResourcePath {
        let root = documentsRoot
        guard name.hasPrefix(root) else {
            throw FirestoreErrorCode(.invalidArgument, "\(what) \"\(name.prefix(200))\" is not below \(root)")
        }
        let rest = name.dropFirst(root.count)
        if rest.isEmpty { return ResourcePath([]) }
        guard rest.first == "/" else {
            throw FirestoreErrorCode(.invalidArgument, "\(what) \"\(name.prefix(200))\" is not below \(root)")
        }
        return try ResourcePath.parse(String(rest.dropFirst()), what: what)
    }

    /// A document's path from its full name: refused unless it names a document.
    package func documentPath(_ name: String) throws -> ResourcePath {
        let p = try path(of: name, what: "document name")
        guard p.isDocument else {
            throw FirestoreErrorCode(.invalidArgument, "\"\(name.prefix(200))\" names a collection, not a document")
        }
        return p
    }

    /// A query's or listing's parent: the root or a document.
    package func parentPath(_ name: String) throws -> ResourcePath {
        let p = try path(of: name, what: "parent")
        guard p.segments.isEmpty || p.isDocument else {
            throw FirestoreErrorCode(.invalidArgument, "the parent \"\(name.prefix(200))\" must be the documents root or a document")
        }
        return p
    }
}

// MARK: Values

extension FieldValueData {
    /// A wire value as a stored one. References into `database` become paths below its root;
    /// a reference elsewhere keeps its full name behind a `/`. Refused (`invalidArgument`): no
    /// value, nesting deeper than Firestore's 20, a timestamp out of range.
    package init(wire v: Google_Firestore_V1_Value, in database: DatabaseName, depth: Int = 0) throws {
        guard depth <= UserData.maxDepth else {
            throw FirestoreErrorCode(.invalidArgument, "a value is nested more than \(UserData.maxDepth) levels deep (Firestore's limit)")
        }
        switch v.valueType {
        case nil: throw FirestoreErrorCode(.invalidArgument, "a value has no type set")
        case .nullValue: self = .null
        case .booleanValue(let b): self = .bool(b)
        case .integerValue(let i): self = .integer(i)
        case .doubleValue(let d): self = .double(d)
        case .timestampValue(let t): self = .timestamp(try Timestamp(wire: t))
        case .stringValue(let s): self = .string(s)
        case .bytesValue(let b): self = .bytes(b)
        case .referenceValue(let r):
            let root = database.documentsRoot + "/"
            if r.hasPrefix(root) {
                let p = try ResourcePath.parse(String(r.dropFirst(root.count)), what: "reference")
                guard p.isDocument else { throw FirestoreErrorCode(.invalidArgument, "the reference \"\(r.prefix(200))\" names a collection") }
                self = .reference(p.description)
            } else {
                guard r.hasPrefix("projects/"), r.contains("/documents/") else {
                    throw FirestoreErrorCode(.invalidArgument, "\"\(r.prefix(200))\" is not a document reference")
                }
                self = .reference("/" + r)
            }
        case .geoPointValue(let g):
            guard (-90...90).contains(g.latitude), (-180...180).contains(g.longitude) else {
                throw FirestoreErrorCode(.invalidArgument, "a geo point's latitude must be in -90...90 and its longitude in -180...180")
            }
            self = .geoPoint(GeoPoint(latitude: g.latitude, longitude: g.longitude))
        case .arrayValue(let a):
            var out: [FieldValueData] = []
            out.reserveCapacity(a.values.count)
            for e in a.values {
                let value = try FieldValueData(wire: e, in: database, depth: depth + 1)
                if case .array = value { throw FirestoreErrorCode(.invalidArgument, "an array cannot hold an array directly") }
                out.append(value)
            }
            self = .array(out)
        case .mapValue(let m): self = .map(try Self.fields(wire: m.fields, in: database, depth: depth + 1))
        }
    }

    /// A document's or map's fields from the wire.
    package static func fields(wire: [String: Google_Firestore_V1_Value], in database: DatabaseName, depth: Int = 0) throws -> [String: FieldValueData] {
        var out: [String: FieldValueData] = [:]
        out.reserveCapacity(wire.count)
        for (k, v) in wire {
            if k.isEmpty { throw FirestoreErrorCode(.invalidArgument, "a field name must not be empty") }
            if k.hasPrefix("__"), k.hasSuffix("__"), k.count >= 4 {
                throw FirestoreErrorCode(.invalidArgument, "the field name \"\(k.prefix(200))\" matches __.*__, which Firestore reserves")
            }
            out[k] = try FieldValueData(wire: v, in: database, depth: depth)
        }
        return out
    }

    /// This value on the wire.
    package func wire(in database: DatabaseName) -> Google_Firestore_V1_Value {
        var v = Google_Firestore_V1_Value()
        switch self {
        case .null: v.nullValue = .nullValue
        case .bool(let b): v.booleanValue = b
        case .integer(let i): v.integerValue = i
        case .double(let d): v.doubleValue = d
        case .timestamp(let t): v.timestampValue = t.wire
        case .pendingServerTimestamp(let local, _): v.timestampValue = local.wire
        case .string(let s): v.stringValue = s
        case .bytes(let b): v.bytesValue = b
        case .reference(let r): v.referenceValue = r.hasPrefix("/") ? String(r.dropFirst()) : database.documentsRoot + "/" + r
        case .geoPoint(let g):
            var p = Google_Firestore_V1_LatLng()
            p.latitude = g.latitude
            p.longitude = g.longitude
            v.geoPointValue = p
        case .array(let a):
            var arr = Google_Firestore_V1_ArrayValue()
            arr.values = a.map { $0.wire(in: database) }
            v.arrayValue = arr
        case .map(let m):
            var map = Google_Firestore_V1_MapValue()
            map.fields = Self.wire(fields: m, in: database)
            v.mapValue = map
        }
        return v
    }

    package static func wire(fields: [String: FieldValueData], in database: DatabaseName) -> [String: Google_Firestore_V1_Value] {
        var out: [String: Google_Firestore_V1_Value] = [:]
        out.reserveCapacity(fields.count)
        for (k, v) in fields { out[k] = v.wire(in: database) }
        return out
    }
}

extension Timestamp {
    /// A wire timestamp, refused unless in Firestore's range (years 1 to 9999).
    package init(wire t: Google_Protobuf_Timestamp) throws {
        guard t.seconds >= -62_135_596_800, t.seconds <= 253_402_300_799, t.nanos >= 0, t.nanos < 1_000_000_000 else {
            throw FirestoreErrorCode(.invalidArgument, "a timestamp is out of range (0001-01-01 to 9999-12-31)")
        }
        self = Timestamp(seconds: t.seconds, nanoseconds: t.nanos).truncatedToMicroseconds
    }

    package var wire: Google_Protobuf_Timestamp {
        var t = Google_Protobuf_Timestamp()
        t.seconds = seconds
        t.nanos = nanoseconds
        return t
    }
}

/// Microseconds since 1970 as a wire timestamp.
package func wireTimestamp(micros: Int64) -> Google_Protobuf_Timestamp { Timestamp(micros: micros).wire }

// MARK: Field paths

extension FieldPath {
    /// Parses a field path as the API writes it: names joined by `.`, a name that is not a
    /// simple identifier between back quotes (`` `a.b`.c ``, with `\`` and `\\` escapes).
    /// `__name__` is the document's name.
    package static func parseServer(_ s: String) throws -> FieldPath {
        if s == "__name__" { return .documentID() }
        func bad(_ why: String) -> FirestoreErrorCode {
            FirestoreErrorCode(.invalidArgument, "invalid field path \"\(s.prefix(200))\": \(why)")
        }
        var segments: [String] = []
        var current = ""
        var quoted = false, wasQuoted = false
        var chars = s.makeIterator()
        while let c = chars.next() {
            if quoted {
                if c == "\\" {
                    guard let e = chars.next() else { throw bad("it ends inside an escape") }
                    current.append(e)
                } else if c == "`" {
                    quoted = false
                } else {
                    current.append(c)
                }
            } else if c == "`" {
                guard current.isEmpty, !wasQuoted else { throw bad("a back quote inside a name") }
                quoted = true
                wasQuoted = true
            } else if c == "." {
                guard !current.isEmpty else { throw bad("an empty name") }
                segments.append(current)
                current = ""
                wasQuoted = false
            } else {
                guard !wasQuoted else { throw bad("text after a quoted name") }
                guard c == "_" || (c.isASCII && (c.isLetter || c.isNumber)) else { throw bad("'\(c)' outside back quotes") }
                current.append(c)
            }
        }
        if quoted { throw bad("an unclosed back quote") }
        guard !current.isEmpty else { throw bad("an empty name") }
        segments.append(current)
        return FieldPath(segments)
    }
}

// MARK: Queries

/// A structured query, translated: the model's query, and what only the server applies.
package struct WireQuery: Sendable {
    package var core: QueryCore
    package var offset: Int
    /// The fields to return (nil: every field; empty: the names only).
    package var projection: [FieldPath]?
}

extension WireQuery {
    /// Translates `q`, asked below `parent` (the root or a document), refusing what Firestore
    /// refuses with `invalidArgument`.
    package init(_ q: Google_Firestore_V1_StructuredQuery, parent: ResourcePath, in database: DatabaseName) throws {
        func bad(_ why: String) -> FirestoreErrorCode { FirestoreErrorCode(.invalidArgument, "invalid query: \(why)") }
        guard q.from.count == 1 else { throw bad("it must name exactly one collection (from)") }
        let from = q.from[0]
        var core: QueryCore
        if from.allDescendants {
            guard !from.collectionID.isEmpty else { throw bad("a collection group needs its collection id") }
            try ResourcePath.checkSegment(from.collectionID, what: "collection id")
            core = QueryCore(path: parent, collectionGroup: from.collectionID)
        } else {
            guard !from.collectionID.isEmpty else { throw bad("a query needs its collection id") }
            try ResourcePath.checkSegment(from.collectionID, what: "collection id")
            core = QueryCore(path: parent.appending(from.collectionID))
        }
        if q.hasWhere { core.filter = try Self.filter(q.where, depth: 0, in: database) }
        for o in q.orderBy {
            let field = try FieldPath.parseServer(o.field.fieldPath)
            switch o.direction {
            case .ascending, .unspecified: core.explicitOrders.append(OrderBy(field: field, descending: false))
            case .descending: core.explicitOrders.append(OrderBy(field: field, descending: true))
            case .UNRECOGNIZED(let n): throw bad("unknown direction \(n)")
            }
        }
        if q.hasLimit {
            guard q.limit.value >= 0 else { throw bad("the limit must not be negative (\(q.limit.value))") }
            core.limit = Int(q.limit.value)
        }
        guard q.offset >= 0 else { throw bad("the offset must not be negative (\(q.offset))") }
        let orders = core.orders
        func bound(_ c: Google_Firestore_V1_Cursor, start: Bool) throws -> Bound {
            guard c.values.count <= orders.count else { throw bad("a cursor has more values (\(c.values.count)) than the query has orders (\(orders.count))") }
            var position: [FieldValueData] = []
            for (i, v) in c.values.enumerated() {
                let value = try FieldValueData(wire: v, in: database)
                if orders[i].field.isDocumentID {
                    guard case .reference(let r) = value, !r.hasPrefix("/") else { throw bad("a cursor on __name__ must be a reference to a document of this database") }
                    guard core.holds(ResourcePath(r.split(separator: "/").map(String.init))) || core.collectionGroup != nil else {
                        throw bad("a cursor's document \(r) is not in the queried collection")
                    }
                }
                position.append(value)
            }
            // start_at: before = true (inclusive); end_at: before = false (inclusive).
            return Bound(position: position, inclusive: start ? c.before : !c.before)
        }
        if q.hasStartAt { core.start = try bound(q.startAt, start: true) }
        if q.hasEndAt { core.end = try bound(q.endAt, start: false) }
        self.core = core
        self.offset = Int(q.offset)
        self.projection = q.hasSelect ? try q.select.fields.map { try FieldPath.parseServer($0.fieldPath) } : nil
    }

    private static func filter(_ f: Google_Firestore_V1_StructuredQuery.Filter, depth: Int, in database: DatabaseName) throws -> FilterNode {
        func bad(_ why: String) -> FirestoreErrorCode { FirestoreErrorCode(.invalidArgument, "invalid query: \(why)") }
        guard depth < 32 else { throw bad("filters nested more than 32 deep") }
        switch f.filterType {
        case nil: throw bad("a filter with nothing set")
        case .compositeFilter(let c):
            let parts = try c.filters.map { try filter($0, depth: depth + 1, in: database) }
            switch c.op {
            case .and: return parts.count == 1 ? parts[0] : .and(parts)
            case .or: return parts.count == 1 ? parts[0] : .or(parts)
            default: throw bad("a composite filter needs AND or OR")
            }
        case .fieldFilter(let ff):
            let field = try FieldPath.parseServer(ff.field.fieldPath)
            let value = try FieldValueData(wire: ff.value, in: database)
            let op: FilterOperator
            switch ff.op {
            case .lessThan: op = .lessThan
            case .lessThanOrEqual: op = .lessThanOrEqual
            case .greaterThan: op = .greaterThan
            case .greaterThanOrEqual: op = .greaterThanOrEqual
            case .equal: op = .equal
            case .notEqual: op = .notEqual
            case .arrayContains: op = .arrayContains
            case .in: op = .in
            case .arrayContainsAny: op = .arrayContainsAny
            case .notIn: op = .notIn
            default: throw bad("a field filter needs an operator")
            }
            if [.in, .notIn, .arrayContainsAny].contains(op) {
                guard case .array(let vs) = value, !vs.isEmpty else { throw bad("'\(op.rawValue)' needs a non-empty array") }
                guard vs.count <= 30 else { throw bad("'\(op.rawValue)' takes at most 30 values (\(vs.count) given)") }
            }
            if field.isDocumentID, ![.in, .notIn].contains(op) {
                guard case .reference(let r) = value, !r.hasPrefix("/") else { throw bad("a filter on __name__ needs a reference to a document of this database") }
            }
            return .field(field, op, value)
        case .unaryFilter(let u):
            guard case .field(let ref)? = u.operandType else { throw bad("a unary filter needs a field") }
            let field = try FieldPath.parseServer(ref.fieldPath)
            switch u.op {
            case .isNull: return .field(field, .equal, .null)
            case .isNan: return .field(field, .equal, .double(.nan))
            case .isNotNull: return .field(field, .notEqual, .null)
            case .isNotNan: return .field(field, .notEqual, .double(.nan))
            default: throw bad("a unary filter needs an operator")
            }
        }
    }
}

// MARK: Resume tokens

/// A listen's position: which store (its epoch) and which commit (µs) it reflects.
package struct ResumeToken: Sendable, Equatable {
    package var epoch: UInt64
    package var commit: Int64

    package init(epoch: UInt64, commit: Int64) {
        self.epoch = epoch
        self.commit = commit
    }

    package init?(_ data: Data) {
        guard data.count == 17, data.first == 1 else { return nil }
        var e: UInt64 = 0, c: UInt64 = 0
        for b in data.dropFirst().prefix(8) { e = e << 8 | UInt64(b) }
        for b in data.dropFirst(9) { c = c << 8 | UInt64(b) }
        epoch = e
        commit = Int64(bitPattern: c)
    }

    package var data: Data {
        var out = Data([1])
        for i in (0..<8).reversed() { out.append(UInt8(truncatingIfNeeded: epoch >> (UInt64(i) * 8))) }
        let c = UInt64(bitPattern: commit)
        for i in (0..<8).reversed() { out.append(UInt8(truncatingIfNeeded: c >> (UInt64(i) * 8))) }
        return out
    }
}
