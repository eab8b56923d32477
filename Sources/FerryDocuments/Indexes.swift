import Foundation

/// One segment of a local index: a field in ascending or descending order, or the elements of
/// an array field (`array-contains`).
struct IndexSegment: Sendable, Hashable, CustomStringConvertible {
    enum Kind: String, Sendable, Hashable { case ascending = "ASCENDING", descending = "DESCENDING", contains = "CONTAINS" }
    var field: FieldPath
    var kind: Kind
    var description: String { "\(field) \(kind.rawValue.lowercased())" }
}

/// A local index over a collection group's documents (Firestore's index definition).
struct IndexDefinition: Sendable, Hashable, CustomStringConvertible {
    var collectionGroup: String
    var segments: [IndexSegment]
    /// Made by auto-creation (not by `setIndexConfiguration`).
    var automatic = false
    var description: String { "\(collectionGroup) (\(segments.map(\.description).joined(separator: ", ")))\(automatic ? " [auto]" : "")" }

    /// Parses Firestore's index definition JSON (`indexes`, `fieldOverrides`).
    static func parseConfiguration(_ json: String) throws -> [IndexDefinition] {
        let object: Any
        do { object = try JSONSerialization.jsonObject(with: Data(json.utf8)) } catch {
            throw FirestoreErrorCode(.invalidArgument, "the index configuration is not JSON: \(error.localizedDescription)")
        }
        guard let root = object as? [String: Any] else { throw FirestoreErrorCode(.invalidArgument, "the index configuration must be a JSON object with \"indexes\" (and optionally \"fieldOverrides\")") }
        var out: [IndexDefinition] = []
        for (i, entry) in ((root["indexes"] as? [Any]) ?? []).enumerated() {
            guard let e = entry as? [String: Any], let group = e["collectionGroup"] as? String, !group.isEmpty else {
                throw FirestoreErrorCode(.invalidArgument, "indexes[\(i)]: needs a \"collectionGroup\" string")
            }
            if let scope = e["queryScope"], !["COLLECTION", "COLLECTION_GROUP"].contains(scope as? String ?? "") {
                throw FirestoreErrorCode(.invalidArgument, "indexes[\(i)]: queryScope must be \"COLLECTION\" or \"COLLECTION_GROUP\", not \(scope)")
            }
            guard let fields = e["fields"] as? [Any], !fields.isEmpty else {
                throw FirestoreErrorCode(.invalidArgument, "indexes[\(i)]: needs a non-empty \"fields\" array")
            }
            var segments: [IndexSegment] = []
            for (j, f) in fields.enumerated() {
                guard let fd = f as? [String: Any], let path = fd["fieldPath"] as? String else {
                    throw FirestoreErrorCode(.invalidArgument, "indexes[\(i)].fields[\(j)]: needs a \"fieldPath\" string")
                }
                segments.append(IndexSegment(field: try FieldPath.parse(path), kind: try kind(fd, "indexes[\(i)].fields[\(j)]")))
            }
            // The document name orders every index's ties already: a `__name__` field adds nothing.
            segments.removeAll { $0.field.isDocumentID }
            guard !segments.isEmpty else { continue }
            if segments.filter({ $0.kind == .contains }).count > 1 {
                throw FirestoreErrorCode(.invalidArgument, "indexes[\(i)]: at most one field may have arrayConfig CONTAINS")
            }
            out.append(IndexDefinition(collectionGroup: group, segments: segments))
        }
        for (i, entry) in ((root["fieldOverrides"] as? [Any]) ?? []).enumerated() {
            guard let e = entry as? [String: Any], let group = e["collectionGroup"] as? String, let path = e["fieldPath"] as? String else {
                throw FirestoreErrorCode(.invalidArgument, "fieldOverrides[\(i)]: needs \"collectionGroup\" and \"fieldPath\" strings")
            }
            let field = try FieldPath.parse(path)
            if field.isDocumentID { continue }
            for (j, ix) in ((e["indexes"] as? [Any]) ?? []).enumerated() {
                guard let d = ix as? [String: Any] else { throw FirestoreErrorCode(.invalidArgument, "fieldOverrides[\(i)].indexes[\(j)]: must be an object") }
                out.append(IndexDefinition(collectionGroup: group, segments: [IndexSegment(field: field, kind: try kind(d, "fieldOverrides[\(i)].indexes[\(j)]"))]))
            }
        }
        return out
    }

    private static func kind(_ d: [String: Any], _ place: String) throws -> IndexSegment.Kind {
        if let order = d["order"] {
            guard let o = order as? String, let k = IndexSegment.Kind(rawValue: o), k != .contains else {
                throw FirestoreErrorCode(.invalidArgument, "\(place): order must be \"ASCENDING\" or \"DESCENDING\", not \(order)")
            }
            return k
        }
        if let array = d["arrayConfig"] {
            guard array as? String == "CONTAINS" else { throw FirestoreErrorCode(.invalidArgument, "\(place): arrayConfig must be \"CONTAINS\", not \(array)") }
            return .contains
        }
        throw FirestoreErrorCode(.invalidArgument, "\(place): needs \"order\" or \"arrayConfig\"")
    }
}

/// An index entry: the document's values for the index's segments, and its key.
struct IndexEntry: Sendable {
    var values: [FieldValueData]
    var key: ResourcePath
}

/// A built index: its entries in order, in chunks (an insert moves at most one chunk).
struct LocalIndex {
    let definition: IndexDefinition
    private(set) var chunks: [[IndexEntry]] = []
    private(set) var count = 0
    static let chunkSize = 512

    init(_ definition: IndexDefinition) { self.definition = definition }

    /// Compares entries: values by segment (descending segments reversed), then keys.
    func compare(_ a: IndexEntry, _ b: IndexEntry) -> Int {
        let c = compareValues(a.values, b.values)
        return c != 0 ? c : FieldValueData.compareSegments(a.key.segments, b.key.segments)
    }

    /// Compares value prefixes segment by segment (the shorter one's length).
    func compareValues(_ a: [FieldValueData], _ b: [FieldValueData]) -> Int {
        for i in 0..<min(a.count, b.count) {
            var c = FieldValueData.compare(a[i], b[i])
            if definition.segments[i].kind == .descending { c = -c }
            if c != 0 { return c }
        }
        return 0
    }

    /// The entries a document has (none when a field the index orders by is missing).
    func entries(for doc: LocalDocument) -> [IndexEntry] {
        guard let fields = doc.fields, doc.key.segments.count >= 2, doc.key.parent.last == definition.collectionGroup else { return [] }
        let map = FieldValueData.map(fields)
        var values: [FieldValueData] = []
        var containsAt: Int?
        var elements: [FieldValueData] = []
        for (i, s) in definition.segments.enumerated() {
            guard let v = map.value(at: s.field) else { return [] }
            if s.kind == .contains {
                guard case .array(let a) = v, !a.isEmpty else { return [] }
                containsAt = i
                for e in a where !elements.contains(e) { elements.append(e) }
                values.append(.null)
            } else {
                values.append(v)
            }
        }
        guard let at = containsAt else { return [IndexEntry(values: values, key: doc.key)] }
        return elements.map { e in
            var vs = values
            vs[at] = e
            return IndexEntry(values: vs, key: doc.key)
        }
    }

    /// Builds the index over `docs` at once (one sort).
    mutating func build(_ docs: [LocalDocument]) {
        var all: [IndexEntry] = []
        for d in docs { all += entries(for: d) }
        all.sort { compare($0, $1) < 0 }
        chunks = stride(from: 0, to: all.count, by: Self.chunkSize).map { Array(all[$0..<min($0 + Self.chunkSize, all.count)]) }
        count = all.count
    }

    /// The position of the first entry not below `probe` (by `cmp`).
    private func lowerBound(_ below: (IndexEntry) -> Bool) -> (chunk: Int, index: Int) {
        var lo = 0, hi = chunks.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if below(chunks[mid][chunks[mid].count - 1]) { lo = mid + 1 } else { hi = mid }
        }
        guard lo < chunks.count else { return (chunks.count, 0) }
        let c = chunks[lo]
        var a = 0, b = c.count
        while a < b {
            let mid = (a + b) / 2
            if below(c[mid]) { a = mid + 1 } else { b = mid }
        }
        return (lo, a)
    }

    mutating func insert(_ e: IndexEntry) {
        count += 1
        if chunks.isEmpty { chunks = [[e]]; return }
        var (ci, i) = lowerBound { compare($0, e) < 0 }
        if ci == chunks.count { ci = chunks.count - 1; i = chunks[ci].count }
        chunks[ci].insert(e, at: i)
        if chunks[ci].count > 2 * Self.chunkSize {
            let tail = Array(chunks[ci][Self.chunkSize...])
            chunks[ci].removeSubrange(Self.chunkSize...)
            chunks.insert(tail, at: ci + 1)
        }
    }

    mutating func remove(_ e: IndexEntry) {
        let (ci, i) = lowerBound { compare($0, e) < 0 }
        guard ci < chunks.count, i < chunks[ci].count, chunks[ci][i].key == e.key, compare(chunks[ci][i], e) == 0 else { return }
        chunks[ci].remove(at: i)
        count -= 1
        if chunks[ci].isEmpty { chunks.remove(at: ci) }
    }

    /// Replaces a document's entries.
    mutating func update(old: LocalDocument?, new: LocalDocument?) {
        if let old { for e in entries(for: old) { remove(e) } }
        if let new { for e in entries(for: new) { insert(e) } }
    }

    /// Calls `body` with the entries whose values start with `prefix` and whose next value
    /// lies in `range`, in index order (reversed with `reverse`), until it returns false.
    func scan(prefix: [FieldValueData], range: ValueRange?, reverse: Bool, _ body: (IndexEntry) -> Bool) {
        let depth = prefix.count
        let segmentDescending = depth < definition.segments.count && definition.segments[depth].kind == .descending
        // Where the scan starts and ends, in the index's order.
        func before(_ e: IndexEntry) -> Bool {
            let c = compareValues(Array(e.values.prefix(depth)), prefix)
            if c != 0 { return c < 0 }
            guard let range, depth < e.values.count else { return false }
            // The low end in index order: the range's lower bound, or its upper for a descending segment.
            let bound = segmentDescending ? range.upper : range.lower
            guard let (v, inclusive) = bound else { return false }
            var c2 = FieldValueData.compare(e.values[depth], v)
            if segmentDescending { c2 = -c2 }
            return inclusive ? c2 < 0 : c2 <= 0
        }
        func after(_ e: IndexEntry) -> Bool {
            let c = compareValues(Array(e.values.prefix(depth)), prefix)
            if c != 0 { return c > 0 }
            guard let range, depth < e.values.count else { return false }
            let bound = segmentDescending ? range.lower : range.upper
            guard let (v, inclusive) = bound else { return false }
            var c2 = FieldValueData.compare(e.values[depth], v)
            if segmentDescending { c2 = -c2 }
            return inclusive ? c2 > 0 : c2 >= 0
        }
        let start = lowerBound(before)
        let end = lowerBound { !after($0) }  // the first entry past the range
        if !reverse {
            var (ci, i) = start
            while (ci, i) < (end.chunk, end.index) {
                if !body(chunks[ci][i]) { return }
                i += 1
                if i == chunks[ci].count { ci += 1; i = 0 }
            }
        } else {
            var (ci, i) = end
            while true {
                if i == 0 {
                    if ci == 0 { return }
                    ci -= 1
                    i = chunks[ci].count
                }
                i -= 1
                if (ci, i) < (start.chunk, start.index) { return }
                if !body(chunks[ci][i]) { return }
            }
        }
    }
}

/// A range on one value: bounds with their inclusiveness, in value order.
struct ValueRange {
    var lower: (FieldValueData, Bool)?
    var upper: (FieldValueData, Bool)?
}
