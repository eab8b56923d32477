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
        // Split on the byte "/" (as Firebase splits on the character code): no grapheme
        // breaking, which made parsing a path a tenth of a write's cost.
        var string = string
        keys = string.withUTF8 { bytes in
            bytes.split(separator: UInt8(ascii: "/"), omittingEmptySubsequences: true)
                .map { String(decoding: UnsafeBufferPointer(rebasing: $0), as: UTF8.self) }
        }
    }

    public init(stringLiteral value: String) { self.init(value) }

    /// A path from a string like `"users/ada/name"`, checking every key and the depth.
    /// - Throws: ``DatabaseError`` with code ``DatabaseError/Code/invalidPath``, naming the key and the rule.
    public init(validating string: String) throws {
        // One pass: split, and check each key's bytes on the way (a key with nothing to look
        // closer at needs no second pass); any other goes through `validate()` for its error.
        var string = string
        var plain = true
        keys = string.withUTF8 { bytes in
            var count = 0
            var previous = UInt8(ascii: "/")
            for b in bytes {
                if previous == UInt8(ascii: "/") && b != UInt8(ascii: "/") { count += 1 }
                previous = b
            }
            var keys: [String] = []
            keys.reserveCapacity(count)
            var start = 0
            for j in 0...bytes.count where j == bytes.count || bytes[j] == UInt8(ascii: "/") {
                if j > start {
                    let key = UnsafeBufferPointer(rebasing: bytes[start..<j])
                    if plain && !Path.isPlainKey(key) { plain = false }
                    keys.append(String(decoding: key, as: UTF8.self))
                }
                start = j + 1
            }
            return keys
        }
        if !plain || keys.count > Path.maxDepth { try validate() }
    }

    var isEmpty: Bool { keys.isEmpty }
    var count: Int { keys.count }
    var front: String? { keys.first }
    var back: String? { keys.last }

    /// The path without its first key.
    var popFront: Path { isEmpty ? self : Path(keys: Array(keys.dropFirst())) }
    /// The parent location; nil for the root.
    var parent: Path? { isEmpty ? nil : Path(keys: Array(keys.dropLast())) }

    func child(_ key: String) -> Path {
        var longer = [String]()
        longer.reserveCapacity(keys.count + 1)
        longer.append(contentsOf: keys)
        longer.append(key)
        return Path(keys: longer)
    }

    func child(_ path: Path) -> Path {
        if path.isEmpty { return self }
        if keys.isEmpty { return path }
        var longer = [String]()
        longer.reserveCapacity(keys.count + path.keys.count)
        longer.append(contentsOf: keys)
        longer.append(contentsOf: path.keys)
        return Path(keys: longer)
    }

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

    /// The error for a value whose key at `location` lies deeper than ``maxDepth`` below the
    /// root: the depth of a value's key is its path's keys plus the key's nesting in the value
    /// (`.priority`, `.value` and `.sv` add no level), as in the Realtime Database.
    static func valueTooDeep(at location: String, depth: Int) -> DatabaseError {
        DatabaseError(.invalidData,
            "the value at \(location.count > 200 ? location.prefix(200) + "…" : Substring(location)) lies \(depth) keys below the root (the path's keys plus the value's nesting); the limit is \(Path.maxDepth)")
    }

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
        // Every forbidden character is ASCII, and no byte of a longer UTF-8 sequence is.
        let clean = key.utf8.allSatisfy { byte in
            switch byte {
            case 0..<0x20, 0x7F, UInt8(ascii: "."), UInt8(ascii: "$"), UInt8(ascii: "#"), UInt8(ascii: "["), UInt8(ascii: "]"), UInt8(ascii: "/"): false
            default: true
            }
        }
        if clean { return }
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
        if a.utf8.first == UInt8(ascii: "[") || b.utf8.first == UInt8(ascii: "[") {
            // Only the sentinels start with "[" (real keys cannot contain it).
            if a == b { return 0 }
            if a == minName || b == maxName { return -1 }
            if b == minName || a == maxName { return 1 }
        }
        var a = a, b = b
        return a.withUTF8 { x in b.withUTF8 { y in compare(utf8: x, y) } }
    }

    /// Orders by UTF-16 code units, as Firebase does. UTF-8 bytes give the same order except
    /// where a character from U+E000–U+FFFF meets one beyond U+FFFF (lead bytes EE–F4), so the
    /// bytes decide unless the first difference is there.
    static func utf16Order(_ a: String, _ b: String) -> Int {
        var a = a, b = b
        return a.withUTF8 { x in b.withUTF8 { y in utf16Order(x, y) } }
    }

    static func utf16Order(_ x: UnsafeBufferPointer<UInt8>, _ y: UnsafeBufferPointer<UInt8>) -> Int {
        let n = min(x.count, y.count)
        var i = 0
        while i < n && x[i] == y[i] { i += 1 }
        if i == n { return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1) }
        if x[i] < 0xEE && y[i] < 0xEE { return x[i] < y[i] ? -1 : 1 }
        let a = String(decoding: x, as: UTF8.self), b = String(decoding: y, as: UTF8.self)
        return a.utf16.lexicographicallyPrecedes(b.utf16) ? -1 : 1
    }

    /// The key as a 32-bit integer, if it is one: an optional `-`, digits (leading zeros
    /// allowed, at most 10 significant), within Int32.
    static func integerValue(_ key: String) -> Int64? {
        if let n = key.utf8.withContiguousStorageIfAvailable({ integerValue(utf8: $0) }) { return n }
        return Array(key.utf8).withUnsafeBufferPointer { integerValue(utf8: $0) }
    }

    /// ``compare(_:_:)`` of two real keys (no sentinels) given as their UTF-8 bytes (decoding
    /// checks a stored object's key order this way, without making strings of the keys).
    static func compare(utf8 a: UnsafeBufferPointer<UInt8>, _ b: UnsafeBufferPointer<UInt8>) -> Int {
        switch (integerValue(utf8: a), integerValue(utf8: b)) {
        case let (x?, y?):
            if x != y { return x < y ? -1 : 1 }
            return a.count == b.count ? utf16Order(a, b) : (a.count < b.count ? -1 : 1)
        case (_?, nil): return -1
        case (nil, _?): return 1
        default: return utf16Order(a, b)
        }
    }

    /// Whether keys like this one sort as their UTF-8 bytes do: not an integer (integers sort
    /// first, by value), no character from U+E000 on (UTF-16 orders those before surrogates).
    static func sortsAsBytes(utf8 key: UnsafeRawBufferPointer) -> Bool {
        integerValue(utf8: key.assumingMemoryBound(to: UInt8.self)) == nil && !key.contains { $0 >= 0xEE }
    }

    static func integerValue(utf8 b: UnsafeBufferPointer<UInt8>) -> Int64? {
        // (Most keys are not integers: one look at the first byte answers for them.)
        guard let first = b.first, first == UInt8(ascii: "-") || (first >= UInt8(ascii: "0") && first <= UInt8(ascii: "9")) else {
            return nil
        }
        var i = 0
        var negative = false
        if i < b.count && b[i] == UInt8(ascii: "-") {
            negative = true
            i += 1
        }
        guard i < b.count else { return nil }
        while i < b.count - 1 && b[i] == UInt8(ascii: "0") { i += 1 }
        guard b.count - i <= 10 else { return nil }
        var value: Int64 = 0
        while i < b.count {
            let c = b[i]
            guard c >= UInt8(ascii: "0") && c <= UInt8(ascii: "9") else { return nil }
            value = value * 10 + Int64(c - UInt8(ascii: "0"))
            i += 1
        }
        if negative { value = -value }
        return value >= Int64(Int32.min) && value <= Int64(Int32.max) ? value : nil
    }
}

extension Path {
    /// A key that needs no closer look: 1–768 bytes, none of them forbidden (every forbidden
    /// character is ASCII, and no byte of a longer UTF-8 sequence is).
    @inline(__always)
    static func isPlainKey(_ b: UnsafeBufferPointer<UInt8>) -> Bool {
        guard b.count > 0 && b.count <= 768 else { return false }
        for byte in b {
            switch byte {
            case 0..<0x20, 0x7F, UInt8(ascii: "."), UInt8(ascii: "$"), UInt8(ascii: "#"), UInt8(ascii: "["), UInt8(ascii: "]"), UInt8(ascii: "/"):
                return false
            default: continue
            }
        }
        return true
    }
}
