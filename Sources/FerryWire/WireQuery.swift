import Ferry

/// A REST query: `orderBy`, `startAt`, `endAt`, `equalTo`, `limitToFirst`, `limitToLast`, their
/// values JSON-encoded as in the Realtime Database's REST API.
public struct WireQuery: Sendable, Hashable {
    /// What the children are ordered by.
    public enum Order: Sendable, Hashable {
        /// A child path of each child (`orderBy="a/b"`).
        case child([String])
        /// `"$key"`.
        case key
        /// `"$value"`.
        case value
        /// `"$priority"`.
        case priority
    }

    /// The ordering.
    public var order: Order
    /// The lowest value (inclusive).
    public var startAt: Value?
    /// The highest value (inclusive).
    public var endAt: Value?
    /// Only the first N children in order.
    public var limitToFirst: Int?
    /// Only the last N children in order.
    public var limitToLast: Int?

    /// The parameter names this type reads.
    public static let parameterNames: Set<String> = ["orderBy", "startAt", "endAt", "equalTo", "limitToFirst", "limitToLast"]

    /// The largest limit accepted; more is an absurd query value.
    public static let maxLimit = 1 << 30

    /// Reads a query from URL parameters; nil when they hold none.
    ///
    /// - Throws: ``WireError`` (`invalidQuery`) with a message for the client, for bad JSON,
    ///   a filter without `orderBy`, a negative or absurd limit, both limits, or `equalTo` with a
    ///   range.
    public init?(parameters p: [String: String]) throws {
        guard p.keys.contains(where: Self.parameterNames.contains) else { return nil }
        func bad(_ m: String) -> WireError { WireError(.invalidQuery, m) }
        guard let ob = p["orderBy"] else { throw bad("orderBy must be defined when other query parameters are defined") }
        guard case .string(let o) = (try? Value(json: ob)) ?? .null else { throw bad("orderBy must be a valid JSON encoded path") }
        switch o {
        case "$key": order = .key
        case "$value": order = .value
        case "$priority": order = .priority
        default:
            guard let path = try? Path(validating: o), !path.keys.isEmpty else { throw bad("orderBy must be a valid JSON encoded path") }
            order = .child(path.keys)
        }
        func bound(_ name: String) throws -> Value? {
            guard let text = p[name] else { return nil }
            guard let v = try? Value(json: text) else { throw bad("\(name) must be a valid JSON value") }
            switch v {
            case .object, .array: throw bad("\(name) must be a string, number, boolean or null")
            default: break
            }
            if order == .key, case .string = v {} else if order == .key { throw bad("\(name) must be a string when ordering by $key") }
            return v
        }
        startAt = try bound("startAt")
        endAt = try bound("endAt")
        if let eq = try bound("equalTo") {
            if startAt != nil || endAt != nil { throw bad("equalTo cannot be combined with startAt or endAt") }
            startAt = eq
            endAt = eq
        }
        func limit(_ name: String) throws -> Int? {
            guard let text = p[name] else { return nil }
            guard let n = Int(text), n > 0, n <= Self.maxLimit else { throw bad("\(name) must be a positive integer of at most \(Self.maxLimit)") }
            return n
        }
        limitToFirst = try limit("limitToFirst")
        limitToLast = try limit("limitToLast")
        if limitToFirst != nil && limitToLast != nil { throw bad("limitToFirst and limitToLast cannot both be set") }
    }

    /// The matching children of `value` (a node as the server stores it), as an object, in the
    /// query's order when encoded by a client that sorts. O(n log n) in the number of children.
    public func apply(to value: Value) -> Value {
        guard case .object(let o) = value, o[".value"] == nil else { return .null }
        var items: [(key: String, sort: Value, node: Value)] = []
        for (k, v) in o where k != ".priority" {
            let s: Value
            switch order {
            case .key: s = .string(k)
            case .value: s = ValueTree.exported(v)
            case .priority: s = ValueTree.priority(v)
            case .child(let path): s = ValueTree.exported(ValueTree.child(v, path[...]))
            }
            if let start = startAt, Self.compare(s, start, byKey: order == .key) < 0 { continue }
            if let end = endAt, Self.compare(s, end, byKey: order == .key) > 0 { continue }
            if case .child = order, case .null = s, startAt != nil || endAt != nil {
                // A child without the ordered value matches only a null bound (as in Firebase).
                if startAt != .null && endAt != .null { continue }
            }
            items.append((k, s, v))
        }
        items.sort { a, b in
            let c = Self.compare(a.sort, b.sort, byKey: order == .key)
            return c != 0 ? c < 0 : Self.compareKeys(a.key, b.key) < 0
        }
        if let n = limitToFirst, items.count > n { items.removeLast(items.count - n) }
        if let n = limitToLast, items.count > n { items.removeFirst(items.count - n) }
        var out: [String: Value] = [:]
        for item in items { out[item.key] = item.node }
        return out.isEmpty ? .null : .object(out)
    }

    /// The Realtime Database's order of values: null, false, true, numbers, strings, objects.
    public static func compare(_ a: Value, _ b: Value, byKey: Bool = false) -> Int {
        if byKey, case .string(let x) = a, case .string(let y) = b { return compareKeys(x, y) }
        func rank(_ v: Value) -> Int {
            switch v {
            case .null: 0
            case .bool(let b): b ? 2 : 1
            case .int, .double: 3
            case .string: 4
            case .array, .object: 5
            }
        }
        let (ra, rb) = (rank(a), rank(b))
        if ra != rb { return ra < rb ? -1 : 1 }
        switch (a, b) {
        case let (.string(x), .string(y)): return x == y ? 0 : (Array(x.utf8).lexicographicallyPrecedes(Array(y.utf8)) ? -1 : 1)
        default:
            if let x = a.number, let y = b.number { return x == y ? 0 : (x < y ? -1 : 1) }
            return 0
        }
    }

    /// Keys order: 32-bit integer keys first, numerically, then the rest by their UTF-8 bytes.
    public static func compareKeys(_ a: String, _ b: String) -> Int {
        if a == b { return 0 }
        let ia = Int32(a).flatMap { String($0) == a ? $0 : nil }
        let ib = Int32(b).flatMap { String($0) == b ? $0 : nil }
        switch (ia, ib) {
        case let (x?, y?): return x < y ? -1 : (x > y ? 1 : 0)
        case (_?, nil): return -1
        case (nil, _?): return 1
        default: return Array(a.utf8).lexicographicallyPrecedes(Array(b.utf8)) ? -1 : 1
        }
    }
}
