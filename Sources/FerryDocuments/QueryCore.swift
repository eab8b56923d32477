import Foundation

/// A filter's operator (Firestore's field filter operators).
package enum FilterOperator: String, Sendable, Hashable {
    case lessThan = "<", lessThanOrEqual = "<=", equal = "==", notEqual = "!="
    case greaterThanOrEqual = ">=", greaterThan = ">"
    case arrayContains = "array-contains", arrayContainsAny = "array-contains-any"
    case `in` = "in", notIn = "not-in"

    package var isInequality: Bool { [.lessThan, .lessThanOrEqual, .greaterThan, .greaterThanOrEqual, .notEqual, .notIn].contains(self) }
    var isRange: Bool { [.lessThan, .lessThanOrEqual, .greaterThan, .greaterThanOrEqual].contains(self) }
    var takesArray: Bool { [.in, .notIn, .arrayContainsAny].contains(self) }

    /// Operators that cannot be combined with this one in a query (the SDK's rules).
    var conflicts: [FilterOperator] {
        switch self {
        case .arrayContains: [.arrayContains, .arrayContainsAny]
        case .arrayContainsAny: [.arrayContains, .arrayContainsAny, .notIn]
        case .in: [.notIn]
        case .notIn: [.arrayContainsAny, .in, .notIn, .notEqual]
        case .notEqual: [.notEqual, .notIn]
        default: []
        }
    }
}

/// A filter: on a field, or AND / OR of filters.
package indirect enum FilterNode: Sendable, Hashable {
    case field(FieldPath, FilterOperator, FieldValueData)
    case and([FilterNode])
    case or([FilterNode])

    /// Every field filter inside.
    var fieldFilters: [(FieldPath, FilterOperator, FieldValueData)] {
        switch self {
        case .field(let p, let o, let v): [(p, o, v)]
        case .and(let fs), .or(let fs): fs.flatMap(\.fieldFilters)
        }
    }

    package func matches(_ doc: LocalDocument, _ fields: FieldValueData) -> Bool {
        switch self {
        case .and(let fs): return fs.allSatisfy { $0.matches(doc, fields) }
        case .or(let fs): return fs.contains { $0.matches(doc, fields) }
        case .field(let path, let op, let rhs):
            let lhs: FieldValueData? = path.isDocumentID ? .reference(doc.key.description) : fields.value(at: path)
            guard let lhs else { return false }
            switch op {
            case .arrayContains:
                guard case .array(let a) = lhs else { return false }
                return a.contains(rhs)
            case .arrayContainsAny:
                guard case .array(let a) = lhs, case .array(let any) = rhs else { return false }
                return a.contains { any.contains($0) }
            case .in:
                guard case .array(let vs) = rhs else { return false }
                return vs.contains(lhs)
            case .notIn:
                guard case .array(let vs) = rhs else { return false }
                if vs.contains(.null) { return false }
                if case .null = lhs { return false }
                return !vs.contains(lhs)
            case .notEqual:
                if case .null = lhs { return false }
                return FieldValueData.compare(lhs, rhs) != 0 || lhs.typeOrder != rhs.typeOrder
            default:
                guard lhs.typeOrder == rhs.typeOrder else { return false }
                let c = FieldValueData.compare(lhs, rhs)
                switch op {
                case .lessThan: return c < 0
                case .lessThanOrEqual: return c <= 0
                case .equal: return c == 0
                case .greaterThanOrEqual: return c >= 0
                case .greaterThan: return c > 0
                default: return false
                }
            }
        }
    }
}

/// One ordering of a query.
package struct OrderBy: Sendable, Hashable {
    package var field: FieldPath
    package var descending: Bool
    package init(field: FieldPath, descending: Bool) {
        self.field = field
        self.descending = descending
    }
}

/// A cursor: values in the query's order, inclusive or not.
package struct Bound: Sendable, Hashable {
    package var position: [FieldValueData]
    package var inclusive: Bool
    package init(position: [FieldValueData], inclusive: Bool) {
        self.position = position
        self.inclusive = inclusive
    }
}

/// What a query asks, model-side: the collection (or group), filters, orders, limit, cursors.
package struct QueryCore: Sendable, Hashable {
    package enum LimitType: Sendable, Hashable { case first, last }
    /// A collection's path; for a collection group, the parent the group is searched under.
    package var path: ResourcePath
    package var collectionGroup: String?
    package var filter: FilterNode?
    package var explicitOrders: [OrderBy] = []
    package var limit: Int?
    package var limitType: LimitType = .first
    package var start: Bound?
    package var end: Bound?
    /// A query for one document (a document listener).
    package var documentKey: ResourcePath?

    /// The orders results follow: the explicit ones, then each inequality field not ordered
    /// yet (in field order), then the document name, in the last order's direction.
    package var orders: [OrderBy] {
        var out = explicitOrders
        let ordered = Set(out.map(\.field.segments))
        let inequalities = Set((filter?.fieldFilters ?? []).filter { $0.1.isInequality && !$0.0.isDocumentID }.map(\.0.segments))
            .subtracting(ordered)
            .sorted { FieldValueData.compareSegments($0, $1) < 0 }
        let dir = out.last?.descending ?? false
        out += inequalities.map { OrderBy(field: FieldPath($0), descending: dir) }
        if !out.contains(where: \.field.isDocumentID) { out.append(OrderBy(field: .documentID(), descending: dir)) }
        return out
    }

    /// Whether `key` is a document this query's collection (or group) holds.
    package func holds(_ key: ResourcePath) -> Bool {
        if let documentKey { return key == documentKey }
        if let group = collectionGroup {
            return key.segments.count >= 2 && key.parent.last == group && path.isPrefix(of: key) && key.segments.count > path.segments.count
        }
        return key.segments.count == path.segments.count + 1 && path.isPrefix(of: key)
    }

    /// Whether `doc` (existing) is in the query's results before limits.
    package func matches(_ doc: LocalDocument, orders: [OrderBy]) -> Bool {
        guard let fields = doc.fields, holds(doc.key) else { return false }
        let map = FieldValueData.map(fields)
        for o in orders where !o.field.isDocumentID {
            if map.value(at: o.field) == nil { return false }
        }
        if let filter, !filter.matches(doc, map) { return false }
        if let start, !Self.startAllows(start, doc, orders) { return false }
        if let end, !Self.endAllows(end, doc, orders) { return false }
        return true
    }

    /// Compares two documents in the query's order (-1, 0, 1).
    package static func compare(_ a: LocalDocument, _ b: LocalDocument, _ orders: [OrderBy]) -> Int {
        for o in orders {
            var c: Int
            if o.field.isDocumentID {
                c = FieldValueData.compareSegments(a.key.segments, b.key.segments)
            } else {
                let x = a.fields.flatMap { FieldValueData.map($0).value(at: o.field) } ?? .null
                let y = b.fields.flatMap { FieldValueData.map($0).value(at: o.field) } ?? .null
                c = FieldValueData.compare(x, y)
            }
            if o.descending { c = -c }
            if c != 0 { return c }
        }
        return 0
    }

    /// The bound against the document, in the query's order (-1: the bound sorts first).
    private static func compareBound(_ bound: Bound, _ doc: LocalDocument, _ orders: [OrderBy]) -> Int {
        let map = FieldValueData.map(doc.fields ?? [:])
        for (i, v) in bound.position.enumerated() where i < orders.count {
            let o = orders[i]
            var c: Int
            if o.field.isDocumentID {
                guard case .reference(let r) = v else { return 0 }
                c = FieldValueData.compareSegments(r.split(separator: "/").map(String.init), doc.key.segments)
            } else {
                c = FieldValueData.compare(v, map.value(at: o.field) ?? .null)
            }
            if o.descending { c = -c }
            if c != 0 { return c }
        }
        return 0
    }

    static func startAllows(_ b: Bound, _ doc: LocalDocument, _ orders: [OrderBy]) -> Bool {
        let c = compareBound(b, doc, orders)
        return b.inclusive ? c <= 0 : c < 0
    }

    static func endAllows(_ b: Bound, _ doc: LocalDocument, _ orders: [OrderBy]) -> Bool {
        let c = compareBound(b, doc, orders)
        return b.inclusive ? c >= 0 : c > 0
    }

    /// The results of this query from `matching` (every document it matches, in order):
    /// the limit applied.
    package func window(_ matching: ArraySlice<LocalDocument>) -> ArraySlice<LocalDocument> {
        guard let limit else { return matching }
        return limitType == .first ? matching.prefix(limit) : matching.suffix(limit)
    }
}

extension QueryCore {
    /// A query of the collection at `path`, or of the `collectionGroup` below it.
    package init(path: ResourcePath, collectionGroup: String? = nil) {
        self.init(path: path, collectionGroup: collectionGroup, filter: nil)
    }
}
