import FerryStore
import Foundation

/// A filter to combine with others (Firebase's `Filter`): `Filter.orFilter([...])`.
public struct Filter: @unchecked Sendable {
    let make: (Query) throws -> FilterNode

    public static func whereField(_ field: String, isEqualTo value: Any) -> Filter { op(field, .equal, value) }
    public static func whereField(_ field: String, isNotEqualTo value: Any) -> Filter { op(field, .notEqual, value) }
    public static func whereField(_ field: String, isLessThan value: Any) -> Filter { op(field, .lessThan, value) }
    public static func whereField(_ field: String, isLessThanOrEqualTo value: Any) -> Filter { op(field, .lessThanOrEqual, value) }
    public static func whereField(_ field: String, isGreaterThan value: Any) -> Filter { op(field, .greaterThan, value) }
    public static func whereField(_ field: String, isGreaterThanOrEqualTo value: Any) -> Filter { op(field, .greaterThanOrEqual, value) }
    public static func whereField(_ field: String, arrayContains value: Any) -> Filter { op(field, .arrayContains, value) }
    public static func whereField(_ field: String, arrayContainsAny values: [Any]) -> Filter { op(field, .arrayContainsAny, values) }
    public static func whereField(_ field: String, in values: [Any]) -> Filter { op(field, .in, values) }
    public static func whereField(_ field: String, notIn values: [Any]) -> Filter { op(field, .notIn, values) }
    public static func whereField(_ path: FieldPath, isEqualTo value: Any) -> Filter { op(path, .equal, value) }
    public static func whereField(_ path: FieldPath, isNotEqualTo value: Any) -> Filter { op(path, .notEqual, value) }
    public static func whereField(_ path: FieldPath, isLessThan value: Any) -> Filter { op(path, .lessThan, value) }
    public static func whereField(_ path: FieldPath, isGreaterThan value: Any) -> Filter { op(path, .greaterThan, value) }
    public static func whereField(_ path: FieldPath, in values: [Any]) -> Filter { op(path, .in, values) }
    public static func whereField(_ path: FieldPath, isLessThanOrEqualTo value: Any) -> Filter { op(path, .lessThanOrEqual, value) }
    public static func whereField(_ path: FieldPath, isGreaterThanOrEqualTo value: Any) -> Filter { op(path, .greaterThanOrEqual, value) }
    public static func whereField(_ path: FieldPath, arrayContains value: Any) -> Filter { op(path, .arrayContains, value) }
    public static func whereField(_ path: FieldPath, arrayContainsAny values: [Any]) -> Filter { op(path, .arrayContainsAny, values) }
    public static func whereField(_ path: FieldPath, notIn values: [Any]) -> Filter { op(path, .notIn, values) }

    /// Documents matching every one of `filters`.
    public static func andFilter(_ filters: [Filter]) -> Filter { Filter { q in .and(try filters.map { try $0.make(q) }) } }
    /// Documents matching at least one of `filters`.
    public static func orFilter(_ filters: [Filter]) -> Filter { Filter { q in .or(try filters.map { try $0.make(q) }) } }

    static func op(_ field: Any, _ op: FilterOperator, _ value: Any) -> Filter {
        Filter { q in try q.fieldFilter(try fieldPath(field), op, value) }
    }
}

/// A query of documents (Firebase's `Query`). Builders never throw: the first invalid step
/// is kept and fails every read and listener of the query with `invalidArgument`.
public class Query: @unchecked Sendable {
    public let firestore: Firestore
    let core: QueryCore
    let invalid: FirestoreErrorCode?

    init(firestore: Firestore, core: QueryCore, invalid: FirestoreErrorCode?) {
        self.firestore = firestore
        self.core = core
        self.invalid = invalid
    }

    static let serverUnavailable = FirestoreErrorCode(.unavailable, "the server cannot be reached: this store has no server connected (read with source: .cache or .default)")

    func with(_ change: (inout QueryCore) throws -> Void) -> Query {
        guard invalid == nil else { return self }
        var c = core
        do {
            try change(&c)
            return Query(firestore: firestore, core: c, invalid: nil)
        } catch {
            return Query(firestore: firestore, core: core, invalid: error as? FirestoreErrorCode ?? FirestoreErrorCode(.invalidArgument, "\(error)"))
        }
    }

    // MARK: Filters

    func fieldFilter(_ path: FieldPath, _ op: FilterOperator, _ value: Any) throws -> FilterNode {
        let v: FieldValueData
        if path.isDocumentID {
            v = try documentIDValue(value, op)
        } else if op.takesArray, let list = value as? [Any] {
            // Each value on its own: an array may be one of the values `in` compares with.
            v = .array(try list.map { try UserData.plain($0, depth: 1) })
        } else {
            v = try UserData.plain(value, depth: 1)
        }
        if op.takesArray {
            guard case .array(let a) = v, !a.isEmpty else {
                throw FirestoreErrorCode(.invalidArgument, "'\(op.rawValue)' needs a non-empty array of values")
            }
            if a.count > 30 { throw FirestoreErrorCode(.invalidArgument, "'\(op.rawValue)' takes at most 30 values (\(a.count) given)") }
        }
        if op.isRange || op == .arrayContains || op == .arrayContainsAny {
            if case .null = v { throw FirestoreErrorCode(.invalidArgument, "'\(op.rawValue)' cannot compare with null: only == and != can") }
            if v.isNaN { throw FirestoreErrorCode(.invalidArgument, "'\(op.rawValue)' cannot compare with NaN: only == and != can") }
        }
        return .field(path, op, v)
    }

    private func documentIDValue(_ value: Any, _ op: FilterOperator) throws -> FieldValueData {
        if op == .arrayContains || op == .arrayContainsAny {
            throw FirestoreErrorCode(.invalidArgument, "'\(op.rawValue)' cannot be used on the document id")
        }
        if op.takesArray {
            guard let a = value as? [Any] else { throw FirestoreErrorCode(.invalidArgument, "'\(op.rawValue)' needs an array") }
            return .array(try a.map { try documentIDValue($0, .equal) })
        }
        if let r = value as? DocumentReference { return .reference(try r.key().description) }
        if let s = value as? String {
            let p = core.collectionGroup == nil ? core.path.appending(try ResourcePath.parse(s, what: "document id")) : try ResourcePath.parse(s, what: "document path")
            guard p.isDocument else { throw FirestoreErrorCode(.invalidArgument, "a document id filter needs a document (\"\(s)\")") }
            return .reference(p.description)
        }
        throw FirestoreErrorCode(.invalidArgument, "a document id filter needs a String id or a DocumentReference, not \(type(of: value))")
    }

    private func adding(_ node: @escaping (Query) throws -> FilterNode) -> Query {
        with { c in
            let n = try node(self)
            for (_, op, _) in n.fieldFilters {
                for (_, existing, _) in c.filter?.fieldFilters ?? [] where op.conflicts.contains(existing) {
                    throw FirestoreErrorCode(.invalidArgument, "'\(op.rawValue)' cannot be used with '\(existing.rawValue)' in one query")
                }
            }
            if let f = c.filter { c.filter = .and([f, n]) } else { c.filter = n }
        }
    }

    public func whereField(_ field: String, isEqualTo value: Any) -> Query { whereFilter(.whereField(field, isEqualTo: value)) }
    public func whereField(_ field: String, isNotEqualTo value: Any) -> Query { whereFilter(.whereField(field, isNotEqualTo: value)) }
    public func whereField(_ field: String, isLessThan value: Any) -> Query { whereFilter(.whereField(field, isLessThan: value)) }
    public func whereField(_ field: String, isLessThanOrEqualTo value: Any) -> Query { whereFilter(.whereField(field, isLessThanOrEqualTo: value)) }
    public func whereField(_ field: String, isGreaterThan value: Any) -> Query { whereFilter(.whereField(field, isGreaterThan: value)) }
    public func whereField(_ field: String, isGreaterThanOrEqualTo value: Any) -> Query { whereFilter(.whereField(field, isGreaterThanOrEqualTo: value)) }
    public func whereField(_ field: String, arrayContains value: Any) -> Query { whereFilter(.whereField(field, arrayContains: value)) }
    public func whereField(_ field: String, arrayContainsAny values: [Any]) -> Query { whereFilter(.whereField(field, arrayContainsAny: values)) }
    public func whereField(_ field: String, in values: [Any]) -> Query { whereFilter(.whereField(field, in: values)) }
    public func whereField(_ field: String, notIn values: [Any]) -> Query { whereFilter(.whereField(field, notIn: values)) }
    public func whereField(_ path: FieldPath, isEqualTo value: Any) -> Query { whereFilter(.whereField(path, isEqualTo: value)) }
    public func whereField(_ path: FieldPath, isNotEqualTo value: Any) -> Query { whereFilter(.whereField(path, isNotEqualTo: value)) }
    public func whereField(_ path: FieldPath, isLessThan value: Any) -> Query { whereFilter(.whereField(path, isLessThan: value)) }
    public func whereField(_ path: FieldPath, isGreaterThan value: Any) -> Query { whereFilter(.whereField(path, isGreaterThan: value)) }
    public func whereField(_ path: FieldPath, in values: [Any]) -> Query { whereFilter(.whereField(path, in: values)) }
    public func whereField(_ path: FieldPath, isLessThanOrEqualTo value: Any) -> Query { whereFilter(.whereField(path, isLessThanOrEqualTo: value)) }
    public func whereField(_ path: FieldPath, isGreaterThanOrEqualTo value: Any) -> Query { whereFilter(.whereField(path, isGreaterThanOrEqualTo: value)) }
    public func whereField(_ path: FieldPath, arrayContains value: Any) -> Query { whereFilter(.whereField(path, arrayContains: value)) }
    public func whereField(_ path: FieldPath, arrayContainsAny values: [Any]) -> Query { whereFilter(.whereField(path, arrayContainsAny: values)) }
    public func whereField(_ path: FieldPath, notIn values: [Any]) -> Query { whereFilter(.whereField(path, notIn: values)) }

    /// Adds a filter (a field filter, or an AND / OR of filters).
    public func whereFilter(_ filter: Filter) -> Query { adding(filter.make) }

    // MARK: Order, limits, cursors

    public func order(by field: String, descending: Bool = false) -> Query {
        with { c in c.explicitOrders.append(OrderBy(field: try FieldPath.parse(field), descending: descending)); try Self.checkOrderAfterCursor(c) }
    }
    public func order(by path: FieldPath, descending: Bool = false) -> Query {
        with { c in c.explicitOrders.append(OrderBy(field: try path.validated(), descending: descending)); try Self.checkOrderAfterCursor(c) }
    }
    private static func checkOrderAfterCursor(_ c: QueryCore) throws {
        if c.start != nil || c.end != nil { throw FirestoreErrorCode(.invalidArgument, "order(by:) must come before start(at:), end(at:) and the other cursors") }
    }

    /// The first `limit` results.
    public func limit(to limit: Int) -> Query {
        with { c in
            guard limit > 0 else { throw FirestoreErrorCode(.invalidArgument, "limit(to:) needs a positive number (\(limit))") }
            c.limit = limit
            c.limitType = .first
        }
    }
    /// The last `limit` results (needs an `order(by:)`).
    public func limit(toLast limit: Int) -> Query {
        with { c in
            guard limit > 0 else { throw FirestoreErrorCode(.invalidArgument, "limit(toLast:) needs a positive number (\(limit))") }
            c.limit = limit
            c.limitType = .last
        }
    }

    public func start(at fieldValues: [Any]) -> Query { cursor(fieldValues, start: true, inclusive: true) }
    public func start(after fieldValues: [Any]) -> Query { cursor(fieldValues, start: true, inclusive: false) }
    public func end(at fieldValues: [Any]) -> Query { cursor(fieldValues, start: false, inclusive: true) }
    public func end(before fieldValues: [Any]) -> Query { cursor(fieldValues, start: false, inclusive: false) }
    public func start(atDocument document: DocumentSnapshot) -> Query { cursor(document, start: true, inclusive: true) }
    public func start(afterDocument document: DocumentSnapshot) -> Query { cursor(document, start: true, inclusive: false) }
    public func end(atDocument document: DocumentSnapshot) -> Query { cursor(document, start: false, inclusive: true) }
    public func end(beforeDocument document: DocumentSnapshot) -> Query { cursor(document, start: false, inclusive: false) }

    private func cursor(_ values: [Any], start: Bool, inclusive: Bool) -> Query {
        with { c in
            let orders = c.orders
            guard values.count <= orders.count else {
                throw FirestoreErrorCode(.invalidArgument, "too many cursor values: \(values.count) for the query's \(orders.count) orderings (its order(by:) clauses and the document id)")
            }
            var position: [FieldValueData] = []
            for (i, v) in values.enumerated() {
                if orders[i].field.isDocumentID {
                    guard let s = v as? String ?? (v as? DocumentReference)?.path else {
                        throw FirestoreErrorCode(.invalidArgument, "a cursor value for the document id must be a String id")
                    }
                    let p = v is DocumentReference || c.collectionGroup != nil ? try ResourcePath.parse(s, what: "document path") : c.path.appending(try ResourcePath.parse(s, what: "document id"))
                    guard p.isDocument else { throw FirestoreErrorCode(.invalidArgument, "a document id cursor value must name a document (\"\(s)\")") }
                    position.append(.reference(p.description))
                } else {
                    position.append(try UserData.plain(v, depth: 1))
                }
            }
            let b = Bound(position: position, inclusive: inclusive)
            if start { c.start = b } else { c.end = b }
        }
    }

    private func cursor(_ snapshot: DocumentSnapshot, start: Bool, inclusive: Bool) -> Query {
        with { c in
            guard let fields = snapshot.doc?.fields else {
                throw FirestoreErrorCode(.invalidArgument, "a cursor cannot be a document that does not exist (\(snapshot.reference.path))")
            }
            let map = FieldValueData.map(fields)
            var position: [FieldValueData] = []
            for o in c.orders {
                if o.field.isDocumentID { position.append(.reference(snapshot.key.description)); continue }
                guard let v = map.value(at: o.field) else {
                    throw FirestoreErrorCode(.invalidArgument, "the cursor document \(snapshot.key) has no field '\(o.field)', which the query orders by")
                }
                if case .pendingServerTimestamp = v {
                    throw FirestoreErrorCode(.invalidArgument, "the cursor document \(snapshot.key)'s field '\(o.field)' is a server timestamp the server has not set yet")
                }
                position.append(v)
            }
            let b = Bound(position: position, inclusive: inclusive)
            if start { c.start = b } else { c.end = b }
        }
    }

    // MARK: Reads

    func validated() throws -> QueryCore {
        if let invalid { throw invalid }
        if core.limitType == .last, core.limit != nil, core.explicitOrders.isEmpty {
            throw FirestoreErrorCode(.invalidArgument, "limit(toLast:) queries need at least one order(by:) clause")
        }
        return core
    }

    /// Runs the query. `.server` asks the connected server (`unavailable` offline); `.default`
    /// asks it when it can be reached, with the store's pending writes applied to its answer,
    /// else answers as `.cache` does: from the local cache, pending writes applied — what is
    /// cached, possibly nothing.
    public func getDocuments(source: FirestoreSource = .default) async throws -> QuerySnapshot {
        let q = try validated()
        if source != .cache, let server = firestore.reachableServer {
            do {
                let found = try await server.query(q, transaction: nil).map {
                    LocalDocument.stored($0.key, $0.fields, createTime: Timestamp(micros: $0.createTime), updateTime: Timestamp(micros: $0.version))
                }
                let docs = source == .server ? found : try firestore.read { $0.overlayPending(found, q) }
                let changes = docs.enumerated().map { ChangeData(type: .added, doc: $1, oldIndex: nil, newIndex: $0) }
                return QuerySnapshot(query: self, docs: docs, changes: changes, fromCache: false, hasPendingWrites: docs.contains(where: \.hasLocalMutations))
            } catch let e as FirestoreErrorCode where source == .default && e.code == .unavailable {
                // Unreachable after all: the cache answers.
            }
        } else if source == .server {
            throw Self.serverUnavailable
        }
        let docs = try firestore.read { $0.run(q) }
        let changes = docs.enumerated().map { ChangeData(type: .added, doc: $1, oldIndex: nil, newIndex: $0) }
        return QuerySnapshot(query: self, docs: docs, changes: changes, fromCache: true, hasPendingWrites: docs.contains(where: \.hasLocalMutations))
    }

    /// Listens to the query: called at once with what the cache holds, then at every change
    /// of its results (and of their metadata, with `includeMetadataChanges`).
    @discardableResult
    public func addSnapshotListener(includeMetadataChanges: Bool = false,
                                    _ listener: @escaping @Sendable (QuerySnapshot?, (any Error)?) -> Void) -> ListenerRegistration {
        addSnapshotListener(includeMetadataChanges: includeMetadataChanges, cacheOnly: false, listener)
    }

    func addSnapshotListener(includeMetadataChanges: Bool, cacheOnly: Bool,
                             _ listener: @escaping @Sendable (QuerySnapshot?, (any Error)?) -> Void) -> ListenerRegistration {
        let q: QueryCore
        do { q = try validated() } catch {
            firestore.queue.async { listener(nil, error) }
            return ListenerRegistration(remove: {})
        }
        return firestore.addListener(q, includeMetadataChanges: includeMetadataChanges, cacheOnly: cacheOnly) { [self] event in
            switch event {
            case .query(let docs, let changes, let fromCache, let pending):
                listener(QuerySnapshot(query: self, docs: docs, changes: changes, fromCache: fromCache, hasPendingWrites: pending), nil)
            case .failure(let e): listener(nil, e)
            }
        }
    }

    /// The query's snapshots as an asynchronous sequence.
    public func snapshots(includeMetadataChanges: Bool = false) -> AsyncThrowingStream<QuerySnapshot, any Error> {
        AsyncThrowingStream { continuation in
            let reg = addSnapshotListener(includeMetadataChanges: includeMetadataChanges) { snap, error in
                if let snap { continuation.yield(snap) } else { continuation.finish(throwing: error) }
            }
            continuation.onTermination = { _ in reg.remove() }
        }
    }

    // MARK: Aggregations

    /// The number of documents the query matches.
    public var count: AggregateQuery { AggregateQuery(query: self, fields: [.count()]) }
    /// Counts, sums and averages over the documents the query matches.
    public func aggregate(_ fields: [AggregateField]) -> AggregateQuery { AggregateQuery(query: self, fields: fields) }
}

/// An aggregation (Firebase's `AggregateField`).
public struct AggregateField: Sendable, Hashable {
    enum Kind: Sendable, Hashable { case count, sum(FieldPath), average(FieldPath) }
    let kind: Kind
    public static func count() -> AggregateField { AggregateField(kind: .count) }
    public static func sum(_ field: String) -> AggregateField { AggregateField(kind: .sum((try? FieldPath.parse(field)) ?? FieldPath([field]))) }
    public static func sum(_ path: FieldPath) -> AggregateField { AggregateField(kind: .sum(path)) }
    public static func average(_ field: String) -> AggregateField { AggregateField(kind: .average((try? FieldPath.parse(field)) ?? FieldPath([field]))) }
    public static func average(_ path: FieldPath) -> AggregateField { AggregateField(kind: .average(path)) }
}

/// Where an aggregation is computed.
public enum AggregateSource: Sendable {
    /// By the server (`unavailable` while none is connected).
    case server
    /// Over the local cache, with pending writes applied.
    case cache
}

/// An aggregation over a query's documents (Firebase's `AggregateQuery`).
public final class AggregateQuery: @unchecked Sendable {
    public let query: Query
    let fields: [AggregateField]
    init(query: Query, fields: [AggregateField]) {
        self.query = query
        self.fields = fields
    }

    /// Computes the aggregation. `.cache` runs it over the cached documents.
    public func getAggregation(source: AggregateSource) async throws -> AggregateQuerySnapshot {
        let q = try query.validated()
        guard source == .cache else { throw Query.serverUnavailable }
        // A count without a limit does not depend on the documents' order; sums and averages
        // add in the query's order, so that the same data gives the same result (and type).
        let countsOnly = fields.allSatisfy { if case .count = $0.kind { true } else { false } }
        let docs = try query.firestore.read { $0.run(q, inOrder: !countsOnly) }
        var results: [AggregateField: Any] = [:]
        for f in fields {
            switch f.kind {
            case .count: results[f] = docs.count
            case .sum(let p), .average(let p):
                var intSum: Int64 = 0, doubleSum = 0.0, allInt = true, overflow = false, n = 0
                for d in docs {
                    guard let v = d.fields.flatMap({ FieldValueData.map($0).value(at: p) }) else { continue }
                    switch v {
                    case .integer(let i):
                        n += 1
                        doubleSum += Double(i)
                        let (r, o) = intSum.addingReportingOverflow(i)
                        if o { overflow = true } else { intSum = r }
                    case .double(let x):
                        n += 1
                        allInt = false
                        doubleSum += x
                    default: continue
                    }
                }
                if case .sum = f.kind {
                    results[f] = allInt && !overflow ? Int(intSum) as Any : doubleSum as Any
                } else {
                    results[f] = n == 0 ? NSNull() as Any : (doubleSum / Double(n)) as Any
                }
            }
        }
        return AggregateQuerySnapshot(query: self, results: results)
    }
}

/// The results of an ``AggregateQuery``.
public final class AggregateQuerySnapshot: @unchecked Sendable {
    public let query: AggregateQuery
    let results: [AggregateField: Any]
    init(query: AggregateQuery, results: [AggregateField: Any]) {
        self.query = query
        self.results = results
    }
    /// The count (of a `count()` aggregation).
    public var count: NSNumber { NSNumber(value: results[.count()] as? Int ?? 0) }
    /// A result: `Int` or `Double` for a count or sum, `Double` or `NSNull` for an average.
    public func get(_ field: AggregateField) -> Any? { results[field] }
}
