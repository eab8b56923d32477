/// How a query was answered (for tests, statistics and auto-indexing).
struct QueryRun {
    /// The indexes used (empty: a scan of the collection or group).
    var indexes: [IndexDefinition] = []
    /// Documents (or index entries) read.
    var documentsRead = 0
}

/// A field filter of a conjunction.
typealias FieldFilter = (path: FieldPath, op: FilterOperator, value: FieldValueData)

extension FilterNode {
    /// The filter as an OR of ANDs of field filters (nil: more than `limit` branches).
    func disjunctiveNormalForm(limit: Int = 64) -> [[FieldFilter]]? {
        switch self {
        case .field(let p, let o, let v): return [[(p, o, v)]]
        case .or(let fs):
            var out: [[FieldFilter]] = []
            for f in fs {
                guard let d = f.disjunctiveNormalForm(limit: limit) else { return nil }
                out += d
                if out.count > limit { return nil }
            }
            return out
        case .and(let fs):
            var out: [[FieldFilter]] = [[]]
            for f in fs {
                guard let d = f.disjunctiveNormalForm(limit: limit) else { return nil }
                out = out.flatMap { a in d.map { a + $0 } }
                if out.count > limit { return nil }
            }
            return out
        }
    }
}

/// How one index answers one conjunction: the value prefixes to look up, a range on the
/// next segment, and how many segments the filters constrain.
struct IndexProbe {
    var index: Int
    var prefixes: [[FieldValueData]]
    var range: ValueRange?
    var constrained: Int
}

extension DocumentEngine {
    /// The collection group a query reads.
    func group(of q: QueryCore) -> String { q.collectionGroup ?? q.path.last }

    /// The best index for a conjunction (nil: none constrains it). An index holds no entry for
    /// a document missing one of its fields, so it serves only a query that needs every one of
    /// them: filtered, or ordered by (and an array segment only an `array-contains` filter).
    func probe(_ branch: [FieldFilter], orders: [OrderBy], group: String) -> IndexProbe? {
        var best: IndexProbe?
        let required = Set(branch.map(\.path) + orders.map(\.field))
        let arrayFiltered = Set(branch.filter { $0.op == .arrayContains || $0.op == .arrayContainsAny }.map(\.path))
        for (i, ix) in indexes.enumerated() where ix.definition.collectionGroup == group {
            guard ix.definition.segments.allSatisfy({ $0.kind == .contains ? arrayFiltered.contains($0.field) : required.contains($0.field) }) else { continue }
            var prefixes: [[FieldValueData]] = [[]]
            var range: ValueRange?
            var constrained = 0
            segments: for seg in ix.definition.segments {
                let on = branch.filter { $0.path == seg.field && !$0.path.isDocumentID }
                var values: [FieldValueData]
                if seg.kind == .contains {
                    if let f = on.first(where: { $0.op == .arrayContains }) { values = [f.value] } else if let f = on.first(where: { $0.op == .arrayContainsAny }), case .array(let a) = f.value { values = a } else { break segments }
                } else if let f = on.first(where: { $0.op == .equal }) {
                    values = [f.value]
                } else if let f = on.first(where: { $0.op == .in }), case .array(let a) = f.value {
                    values = a
                } else {
                    var r = ValueRange()
                    for f in on {
                        switch f.op {
                        case .greaterThan: r.lower = (f.value, false)
                        case .greaterThanOrEqual: r.lower = (f.value, true)
                        case .lessThan: r.upper = (f.value, false)
                        case .lessThanOrEqual: r.upper = (f.value, true)
                        default: break
                        }
                    }
                    if r.lower != nil || r.upper != nil {
                        // A range is typed: `> 5` matches numbers only, so the scan ends with the type.
                        if let (v, _) = r.lower, r.upper == nil, let ceiling = Self.typeCeiling(v) { r.upper = (ceiling, false) }
                        if let (v, _) = r.upper, r.lower == nil { r.lower = (Self.typeFloor(v), true) }
                        range = r
                        constrained += 1
                    }
                    break segments
                }
                prefixes = prefixes.flatMap { p in values.map { p + [$0] } }
                constrained += 1
                if prefixes.count > 256 { return nil }
            }
            if constrained > 0, constrained > (best?.constrained ?? 0) {
                best = IndexProbe(index: i, prefixes: prefixes, range: range, constrained: constrained)
            }
        }
        return best
    }

    /// The smallest value of `v`'s type (a bound below every value of that type).
    static func typeFloor(_ v: FieldValueData) -> FieldValueData {
        switch v {
        case .null: .null
        case .bool: .bool(false)
        case .integer, .double: .double(.nan)
        case .timestamp: .timestamp(Timestamp(seconds: .min, nanoseconds: 0))
        case .pendingServerTimestamp: .pendingServerTimestamp(local: Timestamp(seconds: .min, nanoseconds: 0), previous: nil)
        case .string: .string("")
        case .bytes: .bytes(.init())
        case .reference: .reference("")
        case .geoPoint: .geoPoint(GeoPoint(latitude: -.infinity, longitude: -.infinity))
        case .array: .array([])
        case .map: .map([:])
        }
    }

    /// The smallest value of the next type (a bound above every value of `v`'s type); nil for
    /// maps, the last type (the scan then runs to the index's end).
    static func typeCeiling(_ v: FieldValueData) -> FieldValueData? {
        switch v {
        case .null: .bool(false)
        case .bool: .double(.nan)
        case .integer, .double: .timestamp(Timestamp(seconds: .min, nanoseconds: 0))
        case .timestamp: .pendingServerTimestamp(local: Timestamp(seconds: .min, nanoseconds: 0), previous: nil)
        case .pendingServerTimestamp: .string("")
        case .string: .bytes(.init())
        case .bytes: .reference("")
        case .reference: .geoPoint(GeoPoint(latitude: -.infinity, longitude: -.infinity))
        case .geoPoint: .array([])
        case .array: .map([:])
        case .map: nil
        }
    }

    /// Runs a query: through indexes when every branch of its filter has one, else by a scan.
    /// `inOrder` false: the matching documents in no particular order (a count without a
    /// limit; sorting a million documents took most of its time).
    func execute(_ q: QueryCore, inOrder: Bool = true) -> (docs: [LocalDocument], run: QueryRun) {
        let inOrder = inOrder || q.limit != nil
        let orders = q.orders
        var run = QueryRun()
        if q.documentKey == nil, !indexes.isEmpty, let branches = (q.filter ?? .and([])).disjunctiveNormalForm() {
            let g = group(of: q)
            // No filter and a limit: an index in the query's order serves it from its start.
            if branches.count == 1, branches[0].isEmpty, q.limit != nil,
               let first = orders.first(where: { !$0.field.isDocumentID }) {
                let fields = Set(orders.map(\.field))
                if let i = indexes.firstIndex(where: { ix in
                    ix.definition.collectionGroup == g && ix.definition.segments.first?.field == first.field
                        && ix.definition.segments.allSatisfy { $0.kind != .contains && fields.contains($0.field) }
                }), let ordered = orderedScan(q, IndexProbe(index: i, prefixes: [[]], range: nil, constrained: 0), orders) {
                    return (Array(q.window(ordered.docs[...])), QueryRun(indexes: [indexes[i].definition], documentsRead: ordered.read))
                }
            }
            let probes = branches.map { probe($0, orders: orders, group: g) }
            if !probes.isEmpty, probes.allSatisfy({ $0 != nil }) {
                let ps = probes.map { $0! }
                if ps.count == 1, ps[0].prefixes.count == 1, q.limit != nil, let ordered = orderedScan(q, ps[0], orders) {
                    return (Array(q.window(ordered.docs[...])), QueryRun(indexes: [indexes[ps[0].index].definition], documentsRead: ordered.read))
                }
                var seen = Set<ResourcePath>()
                var docs: [LocalDocument] = []
                for p in ps {
                    let ix = indexes[p.index]
                    run.indexes.append(ix.definition)
                    for prefix in p.prefixes {
                        ix.scan(prefix: prefix, range: p.range, reverse: false) { e in
                            run.documentsRead += 1
                            if seen.insert(e.key).inserted, let d = document(e.key), q.matches(d, orders: orders) { docs.append(d) }
                            return true
                        }
                    }
                }
                if inOrder { docs.sort { QueryCore.compare($0, $1, orders) < 0 } }
                return (Array(q.window(docs[...])), run)
            }
        }
        let all = candidates(q)
        run.documentsRead = all.count
        let matching = all.filter { q.matches($0, orders: orders) }
        return (inOrder ? Self.ordered(matching, q, orders) : matching, run)
    }

    /// The matching documents in query order, the limit applied: each document's order values
    /// taken once; with a limit, only the window is kept (a bounded selection, not a sort of
    /// every match).
    static func ordered(_ docs: [LocalDocument], _ q: QueryCore, _ orders: [OrderBy]) -> [LocalDocument] {
        let keys: [[FieldValueData]] = docs.map { d in
            let map = FieldValueData.map(d.fields ?? [:])
            return orders.map { $0.field.isDocumentID ? .null : (map.value(at: $0.field) ?? .null) }
        }
        func less(_ i: Int, _ j: Int) -> Bool {
            for (k, o) in orders.enumerated() {
                var c = o.field.isDocumentID ? FieldValueData.compareSegments(docs[i].key.segments, docs[j].key.segments) : FieldValueData.compare(keys[i][k], keys[j][k])
                if o.descending { c = -c }
                if c != 0 { return c < 0 }
            }
            return false
        }
        var order = Array(docs.indices)
        if let limit = q.limit, limit < docs.count / 4 {
            // Keep the `limit` first (or last) in a sorted window, inserting by binary search.
            let last = q.limitType == .last
            var window: [Int] = []
            window.reserveCapacity(limit + 1)
            for i in order {
                if window.count == limit {
                    let edge = last ? window[0] : window[limit - 1]
                    if last ? !less(edge, i) : !less(i, edge) { continue }
                }
                var lo = 0, hi = window.count
                while lo < hi { let mid = (lo + hi) / 2; if less(window[mid], i) { lo = mid + 1 } else { hi = mid } }
                window.insert(i, at: lo)
                if window.count > limit { if last { window.removeFirst() } else { window.removeLast() } }
            }
            return window.map { docs[$0] }
        }
        order.sort(by: less)
        let sorted = order.map { docs[$0] }
        return Array(q.window(sorted[...]))
    }

    /// A limited query whose order the index follows after its equality prefix: read entries in
    /// order and stop after the limit (and the ties at its edge).
    private func orderedScan(_ q: QueryCore, _ p: IndexProbe, _ orders: [OrderBy]) -> (docs: [LocalDocument], read: Int)? {
        let ix = indexes[p.index]
        let depth = p.prefixes[0].count
        let fixed = Set(ix.definition.segments.prefix(depth).map(\.field))
        let wanted = orders.filter { !$0.field.isDocumentID && !fixed.contains($0.field) }
        let rest = Array(ix.definition.segments.dropFirst(depth))
        guard !wanted.isEmpty, rest.count >= wanted.count, rest.allSatisfy({ $0.kind != .contains }) else { return nil }
        var sameDirection: Bool?
        for (o, s) in zip(wanted, rest) {
            guard o.field == s.field else { return nil }
            let same = o.descending == (s.kind == .descending)
            if let d = sameDirection, d != same { return nil }
            sameDirection = same
        }
        var reverse = !(sameDirection ?? true)
        if q.limitType == .last { reverse.toggle() }
        let limit = q.limit!
        var docs: [LocalDocument] = []
        var read = 0
        var edge: [FieldValueData]?
        ix.scan(prefix: p.prefixes[0], range: p.range, reverse: reverse) { e in
            read += 1
            let orderValues = Array(e.values[depth..<(depth + wanted.count)])
            if let edge, orderValues.count == edge.count, zip(orderValues, edge).contains(where: { FieldValueData.compare($0, $1) != 0 }) { return false }
            if let d = document(e.key), q.matches(d, orders: orders), !docs.contains(where: { $0.key == d.key }) {
                docs.append(d)
                if docs.count >= limit, edge == nil { edge = orderValues }
            }
            return true
        }
        docs.sort { QueryCore.compare($0, $1, orders) < 0 }
        return (docs, read)
    }

    /// The indexes auto-creation makes for a query: one per branch of its filter (an OR has
    /// several), of its equality fields, its array field, then its orders.
    static func automaticIndexes(for q: QueryCore) -> [IndexDefinition] {
        guard q.documentKey == nil, let branches = (q.filter ?? .and([])).disjunctiveNormalForm() else { return [] }
        var out: [IndexDefinition] = []
        for branch in branches {
            var segments: [IndexSegment] = []
            func add(_ s: IndexSegment) { if !segments.contains(where: { $0.field == s.field }) { segments.append(s) } }
            for f in branch where !f.path.isDocumentID && (f.op == .equal || f.op == .in) { add(IndexSegment(field: f.path, kind: .ascending)) }
            if let f = branch.first(where: { !$0.path.isDocumentID && ($0.op == .arrayContains || $0.op == .arrayContainsAny) }) {
                segments.append(IndexSegment(field: f.path, kind: .contains))
            }
            for o in q.orders where !o.field.isDocumentID { add(IndexSegment(field: o.field, kind: o.descending ? .descending : .ascending)) }
            let d = IndexDefinition(collectionGroup: q.collectionGroup ?? q.path.last, segments: segments, automatic: true)
            if !segments.isEmpty, !out.contains(d) { out.append(d) }
        }
        return out
    }
}

