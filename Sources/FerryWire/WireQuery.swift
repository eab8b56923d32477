@_spi(Server) import Ferry

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

    /// The matching children of `value` (a node as the server stores it: validated when it was
    /// written), as an object — evaluated by Ferry's own query code (``ServerQuery``), so the
    /// answer orders and filters exactly as a Ferry client's cache does.
    /// O(n log n) in the number of children.
    public func apply(to value: Value) -> Value {
        do {
            let ferryOrder: ServerQuery.Order
            switch order {
            case .key: ferryOrder = .key
            case .value: ferryOrder = .value
            case .priority: ferryOrder = .priority
            case .child(let keys): ferryOrder = .child(try Path(validating: keys.joined(separator: "/")))
            }
            return try ServerQuery.apply(to: value, order: ferryOrder, startAt: startAt, endAt: endAt,
                                         limitToFirst: limitToFirst, limitToLast: limitToLast)
        } catch {
            // The tree was validated on write and the bounds when the query was read.
            preconditionFailure("a stored tree or a validated bound was refused by the data model: \(error)")
        }
    }
}
