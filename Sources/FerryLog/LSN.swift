/// A log sequence number: the position of one record in the log.
///
/// The first record of a store has LSN 1; every appended record gets the next number, with no
/// gaps, across segments and restarts.
public struct LSN: RawRepresentable, Hashable, Comparable, Sendable, CustomStringConvertible,
    ExpressibleByIntegerLiteral, Codable
{
    /// The number.
    public var rawValue: UInt64
    /// The LSN with this number.
    public init(rawValue: UInt64) { self.rawValue = rawValue }
    /// The LSN with this number.
    public init(_ value: UInt64) { self.rawValue = value }
    /// The LSN with this number.
    public init(integerLiteral value: UInt64) { self.rawValue = value }

    /// Log order.
    public static func < (a: LSN, b: LSN) -> Bool { a.rawValue < b.rawValue }
    /// The LSN `n` records later.
    public static func + (a: LSN, n: UInt64) -> LSN { LSN(a.rawValue + n) }
    /// The LSN `n` records earlier.
    public static func - (a: LSN, n: UInt64) -> LSN { LSN(a.rawValue - n) }

    /// The LSN of a store's first record.
    public static let first = LSN(1)

    public var description: String { String(rawValue) }

    /// Decodes the number.
    public init(from decoder: any Decoder) throws { rawValue = try UInt64(from: decoder) }
    /// Encodes the number.
    public func encode(to encoder: any Encoder) throws { try rawValue.encode(to: encoder) }
}

/// The 16-byte identity of a store, fixed when the store is created and written into every
/// segment header. A segment with another store's id is refused.
public struct StoreID: Hashable, Sendable, CustomStringConvertible {
    /// The first 8 bytes.
    public var high: UInt64
    /// The last 8 bytes.
    public var low: UInt64
    /// An id from its two halves.
    public init(high: UInt64, low: UInt64) { self.high = high; self.low = low }

    static func random() -> StoreID {
        var g = SystemRandomNumberGenerator()
        return StoreID(high: g.next(), low: g.next())
    }

    /// 32 lowercase hex digits.
    public var description: String { hex(high) + hex(low) }
}

func hex(_ v: UInt64, width: Int = 16) -> String {
    let s = String(v, radix: 16)
    return String(repeating: "0", count: max(0, width - s.count)) + s
}
