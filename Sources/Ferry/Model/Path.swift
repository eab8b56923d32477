/// A location in the database: a sequence of keys from the root.
///
/// Keys follow the Realtime Database's rules (see ``Path/validate(key:)``); the internal key
/// `.priority` addresses a node's priority.
public struct Path: Hashable, Sendable, Comparable, CustomStringConvertible, ExpressibleByStringLiteral {
    /// The keys, root first. Empty for the root.
    public private(set) var keys: [String]

    /// The root.
    public static let root = Path(keys: [])

    /// The deepest a location may be, as in the Realtime Database.
    public static let maxDepth = 32

    init(keys: [String]) { self.keys = keys }

    /// A path from a string like `"a/b/c"` (leading, trailing and repeated slashes ignored),
    /// without validation. Use ``init(validating:)`` for user input.
    init(_ string: String) {
        keys = string.split(separator: "/", omittingEmptySubsequences: true).map(String.init)
    }

    public init(stringLiteral value: String) { self.init(value) }

    /// A path from a string like `"users/ada/name"`, checking every key and the depth.
    /// - Throws: ``DatabaseError`` with code ``DatabaseError/Code/invalidPath``, naming the key and the rule.
    public init(validating string: String) throws {
        self.init(string)
        try validate()
    }

    var isEmpty: Bool { keys.isEmpty }
    var count: Int { keys.count }
    var front: String? { keys.first }
    var back: String? { keys.last }

    /// The path without its first key.
    var popFront: Path { isEmpty ? self : Path(keys: Array(keys.dropFirst())) }
    /// The parent location; nil for the root.
    var parent: Path? { isEmpty ? nil : Path(keys: Array(keys.dropLast())) }

    func child(_ key: String) -> Path { Path(keys: keys + [key]) }
    func child(_ path: Path) -> Path { path.isEmpty ? self : Path(keys: keys + path.keys) }

    /// True when `self` is `other` or an ancestor of it.
    func contains(_ other: Path) -> Bool {
        guard keys.count <= other.keys.count else { return false }
        for i in keys.indices where keys[i] != other.keys[i] { return false }
        return true
    }

    /// `other` relative to `self`, which must contain it.
    func relative(to other: Path) -> Path {
        precondition(contains(other), "\(self) does not contain \(other)")
        return Path(keys: Array(other.keys.dropFirst(keys.count)))
    }

    public static func < (a: Path, b: Path) -> Bool {
        for (x, y) in zip(a.keys, b.keys) where x != y { return KeyOrder.compare(x, y) < 0 }
        return a.keys.count < b.keys.count
    }

    /// `/a/b/c`, or `/` for the root.
    public var description: String { "/" + keys.joined(separator: "/") }

    /// Checks every key and the depth.
    public func validate() throws {
        if keys.count > Path.maxDepth {
            throw DatabaseError(.invalidPath, "the path \(self) is \(keys.count) keys deep; the limit is \(Path.maxDepth)")
        }
        for key in keys where key != ".priority" { try Path.validate(key: key) }
    }

    /// The Realtime Database's key rules: non-empty, at most 768 bytes of UTF-8, and none of
    /// `.`, `$`, `#`, `[`, `]`, `/` or ASCII control characters.
    public static func validate(key: String) throws {
        if key.isEmpty { throw DatabaseError(.invalidPath, "a key may not be empty") }
        let bytes = key.utf8.count
        if bytes > 768 {
            throw DatabaseError(.invalidPath, "the key \"\(key.prefix(40))…\" is \(bytes) bytes of UTF-8; the limit is 768")
        }
        for scalar in key.unicodeScalars {
            switch scalar {
            case ".", "$", "#", "[", "]", "/":
                throw DatabaseError(.invalidPath, "the key \"\(key)\" contains \"\(scalar)\"; keys may not contain . $ # [ ] or /")
            case _ where scalar.value < 0x20 || scalar.value == 0x7F:
                throw DatabaseError(.invalidPath,
                    "the key \"\(key.unicodeScalars.map { $0.value < 0x20 || $0.value == 0x7F ? "\\u{\(String($0.value, radix: 16))}" : String($0) }.joined())\" contains an ASCII control character")
            default: continue
            }
        }
    }
}

/// The Realtime Database's key order: keys that are 32-bit integers first, numerically (ties —
/// "007" and "7" — by length), then every other key by UTF-16 code units.
enum KeyOrder {
    /// Sentinels for the boundaries of query ranges; never real keys.
    static let minName = "[MIN_NAME]"
    static let maxName = "[MAX_NAME]"

    static func compare(_ a: String, _ b: String) -> Int {
        if a == b { return 0 }
        if a == minName || b == maxName { return -1 }
        if b == minName || a == maxName { return 1 }
        let ai = integerValue(a), bi = integerValue(b)
        switch (ai, bi) {
        case let (x?, y?): return x == y ? a.utf16.count - b.utf16.count : (x < y ? -1 : 1)
        case (_?, nil): return -1
        case (nil, _?): return 1
        default: return a.utf16.lexicographicallyPrecedes(b.utf16) ? -1 : 1
        }
    }

    /// The key as a 32-bit integer, if it is one: an optional `-`, digits (leading zeros
    /// allowed, at most 10 significant), within Int32.
    static func integerValue(_ key: String) -> Int64? {
        var utf8 = key.utf8[...]
        var negative = false
        if utf8.first == UInt8(ascii: "-") {
            negative = true
            utf8 = utf8.dropFirst()
        }
        guard !utf8.isEmpty else { return nil }
        var zeros = 0
        while zeros < utf8.count - 1, utf8[utf8.index(utf8.startIndex, offsetBy: zeros)] == UInt8(ascii: "0") { zeros += 1 }
        guard utf8.count - zeros <= 10 else { return nil }
        var value: Int64 = 0
        for c in utf8 {
            guard c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int64(c - UInt8(ascii: "0"))
        }
        if negative { value = -value }
        return value >= Int64(Int32.min) && value <= Int64(Int32.max) ? value : nil
    }
}
