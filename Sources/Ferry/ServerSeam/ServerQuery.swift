/// A Realtime Database query evaluated on a value, as a server answers a REST query — with the
/// database's own ordering and filters, the code its local views use, so that a server built on
/// Ferry answers exactly as its clients' caches will (key order, value order, ranges, limits).
@_spi(Server) public enum ServerQuery {
    /// What the children are ordered by.
    public enum Order: Sendable, Hashable {
        case key, value, priority
        /// The value at this path below each child.
        case child(Path)
    }

    /// The children of `value` that the query selects, as an object (null when none), in the
    /// export form (priorities as `.priority`, leaves with one as `.value`). A leaf selects
    /// nothing. O(n log n) for n children (O(n log k) with a limit of k).
    ///
    /// - Throws: ``DatabaseError/Code/invalidData`` for a value or bound the data model refuses.
    public static func apply(to value: Value, order: Order, startAt: Value?, endAt: Value?,
                             limitToFirst: Int?, limitToLast: Int?) throws -> Value {
        var p = QueryParams()
        switch order {
        case .key: p.index = .key
        case .value: p.index = .value
        case .priority: p.index = .priority
        case .child(let path): p.index = .child(path)
        }
        func bound(_ v: Value) throws -> Node { p.index == .priority ? try Node.priorityNode(v, at: .root) : try Node(v) }
        if let s = startAt {
            p.startSet = true
            p.startValue = try bound(s)
        }
        if let e = endAt {
            p.endSet = true
            p.endValue = try bound(e)
        }
        if let n = limitToFirst {
            p.limit = n
            p.viewFromLeft = true
        } else if let n = limitToLast {
            p.limit = n
            p.viewFromLeft = false
        }
        let node = try Node(value)
        guard !node.isLeaf else { return .null }
        return p.filtered(node).value(export: true)
    }
}

/// Server values resolved as the database resolves them locally, for a server that must store
/// what its clients' caches showed.
@_spi(Server) public enum ServerValues {
    /// `value` (written at `path`) with `{".sv": "timestamp"}` made `time` and
    /// `{".sv": {"increment": n}}` the number in `existing` plus n (n when it holds no number),
    /// in the export form (priorities as `.priority`, integer keys as object keys).
    ///
    /// - Throws: ``DatabaseError/Code/invalidData`` for a value the data model refuses (an
    ///   unknown server value among them), or an increment whose sum is not finite.
    public static func resolve(_ value: Value, at path: String, existing: Value, time: Int64) throws -> Value {
        let at = try Path(validating: path)
        // A value already in the export form, valid, with no server value is its own result,
        // checked without building a node (most writes).
        if isPlain(value, depth: at.count) { return value }
        let node = try Node(value, path: at)
        // (Most writes hold none: the location's current value is then not needed at all.)
        guard ServerValueResolver.containsDeferred(node) else { return node.value(export: true) }
        return try ServerValueResolver.resolve(node, existing: try Node(existing), time: time, at: at).value(export: true)
    }

    /// Whether `value`, `depth` keys below the root, is one that ``Node/build(_:at:depth:)``
    /// accepts and ``Node/value(export:)`` gives back unchanged: leaves with finite numbers,
    /// and non-empty objects of valid keys (none special: `.sv`, `.value`, `.priority`),
    /// none null, within ``Path/maxDepth``. (No: the node's own checks decide.)
    private static func isPlain(_ value: Value, depth: Int) -> Bool {
        switch value {
        case .null, .bool, .int, .string: return true
        case .double(let d): return d.isFinite
        case .array: return false
        case .object(let o):
            guard !o.isEmpty, depth < Path.maxDepth else { return false }
            for (key, child) in o {
                if key.utf8.first == UInt8(ascii: ".") { return false }
                if case .null = child { return false }
                guard (try? Path.validate(key: key)) != nil, isPlain(child, depth: depth + 1) else { return false }
            }
            return true
        }
    }
}
