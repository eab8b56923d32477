/// A value as the Realtime Database stores it: JSON, with 64-bit integers kept exact.
///
/// Objects with the keys `.value` and `.priority` carry a priority (`{".value": 1,
/// ".priority": 2}` is the leaf 1 with priority 2; `.priority` beside other keys is an
/// object's priority). `{".sv": "timestamp"}` and `{".sv": {"increment": n}}` are server
/// values (see ``ServerValue``). Arrays are stored as objects with integer keys and read back as
/// arrays when dense enough (as the Realtime Database does); empty objects and arrays are null.
public enum Value: Sendable, CustomStringConvertible {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([Value])
    case object([String: Value])

    /// Compact JSON text (keys sorted, so equal values print equally).
    public var description: String { JSON.serialize(self) }

    /// The value as a `Double`, if it is a number.
    public var number: Double? {
        switch self {
        case .int(let i): Double(i)
        case .double(let d): d
        default: nil
        }
    }
}

extension Value: Equatable, Hashable {
    /// Numbers compare by value (`.int(1) == .double(1)`), as in the Realtime Database, and
    /// exactly (`.int(Int64.max)` is not the double 2^63 it rounds to). Strings compare by their
    /// code units, as in the Realtime Database: "é" written as one code point is not "e" and a
    /// combining accent (which Swift's `String` holds equal).
    public static func == (a: Value, b: Value) -> Bool {
        switch (a, b) {
        case (.null, .null): true
        case let (.bool(x), .bool(y)): x == y
        case let (.string(x), .string(y)): x.utf8.elementsEqual(y.utf8)
        case let (.array(x), .array(y)): x == y
        case let (.object(x), .object(y)): x == y
        case (.int, .int), (.int, .double), (.double, .int), (.double, .double): numbersEqual(a, b)
        default: false
        }
    }

    public func hash(into h: inout Hasher) {
        switch self {
        case .null: h.combine(0)
        case .bool(let b): h.combine(b)
        case .int(let i): h.combine(Double(i))
        case .double(let d): h.combine(d)
        case .string(let s): h.combine(s)
        case .array(let a): h.combine(a)
        case .object(let o): h.combine(o)
        }
    }
}

func numbersEqual(_ a: Value, _ b: Value) -> Bool {
    switch (a, b) {
    case let (.int(x), .int(y)): return x == y
    case let (.double(x), .double(y)): return x == y
    case let (.int(x), .double(y)), let (.double(y), .int(x)):
        // (Exactly: `Double(x) == y` holds for integers past 2^53 that round to y, and
        // converting a y of 2^63 to Int64 traps.)
        return Int64(exactly: y) == x
    default: return false
    }
}

// Deliberately not ExpressibleByNilLiteral: with it, `x ? nil : value` silently means `.null`
// where an Optional was meant. Write `.null` (or `removeValue()`).
extension Value: ExpressibleByBooleanLiteral, ExpressibleByIntegerLiteral,
    ExpressibleByFloatLiteral, ExpressibleByStringLiteral, ExpressibleByArrayLiteral, ExpressibleByDictionaryLiteral
{
    public init(booleanLiteral value: Bool) { self = .bool(value) }
    public init(integerLiteral value: Int64) { self = .int(value) }
    public init(floatLiteral value: Double) { self = .double(value) }
    public init(stringLiteral value: String) { self = .string(value) }
    public init(arrayLiteral elements: Value...) { self = .array(elements) }
    public init(dictionaryLiteral elements: (String, Value)...) {
        self = .object(Dictionary(elements, uniquingKeysWith: { _, last in last }))
    }
}

extension Value {
    /// Parses JSON text (RFC 8259). Integers that fit 64 bits stay exact; other numbers become
    /// doubles. Numbers must have JSON's syntax (`01`, `-01`, `1.`, `.5`, `+1`, `1.e5` are
    /// refused). A key given twice in one object is an error (which one would win is not defined
    /// by JSON).
    /// - Throws: ``DatabaseError`` with code ``DatabaseError/Code/invalidData`` and the byte offset.
    public init(json: String) throws { self = try JSON.parse(Array(json.utf8)) }

    /// Parses JSON bytes, which must be UTF-8: a byte sequence that is not well-formed UTF-8
    /// is an error naming its offset, never replaced with U+FFFD.
    /// - Throws: ``DatabaseError`` with code ``DatabaseError/Code/invalidData`` and the byte offset.
    public init(jsonBytes: [UInt8]) throws { self = try JSON.parse(jsonBytes) }

    /// Compact JSON text, keys sorted.
    public var json: String { JSON.serialize(self) }

    /// ``json`` as UTF-8 bytes, without making a string first.
    public var jsonBytes: [UInt8] {
        var out: [UInt8] = []
        JSON.write(self, to: &out)
        return out
    }
}

/// Values the server fills in.
public enum ServerValue {
    /// The server's time, in milliseconds since 1970. Until the server's value arrives, the local
    /// view shows the local clock corrected by the last known server offset.
    public static let timestamp: Value = [".sv": "timestamp"]

    /// Adds `delta` to the number stored (a non-number counts as 0). Until the server's value
    /// arrives, the local view applies it to the local value; integer overflow falls back to double.
    public static func increment<T: BinaryInteger>(_ delta: T) -> Value { [".sv": ["increment": .int(Int64(delta))]] }
    /// Adds `delta` to the number stored (a non-number counts as 0).
    public static func increment<T: BinaryFloatingPoint>(_ delta: T) -> Value { [".sv": ["increment": .double(Double(delta))]] }
}
