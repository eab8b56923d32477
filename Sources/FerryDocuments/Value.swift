import Foundation

/// A point in time with microsecond precision, as Firestore stores it (Firebase's `Timestamp`).
///
/// Nanoseconds finer than a microsecond are dropped when a timestamp is written, as Firestore
/// drops them.
public struct Timestamp: Sendable, Hashable, Comparable, Codable, CustomStringConvertible {
    /// Seconds since 1970-01-01T00:00:00Z.
    public let seconds: Int64
    /// Nanoseconds into the second, 0 ..< 1,000,000,000.
    public let nanoseconds: Int32

    /// A timestamp; `nanoseconds` must be in 0 ..< 1,000,000,000 (it is brought into range).
    public init(seconds: Int64, nanoseconds: Int32) {
        var s = seconds, n = Int64(nanoseconds)
        s += n / 1_000_000_000
        n %= 1_000_000_000
        if n < 0 { n += 1_000_000_000; s -= 1 }
        self.seconds = s
        self.nanoseconds = Int32(n)
    }

    /// The timestamp of `date`.
    public init(date: Date) {
        let t = date.timeIntervalSince1970
        let s = t.rounded(.down)
        self.init(seconds: Int64(s), nanoseconds: Int32(((t - s) * 1e9).rounded()))
    }

    /// Now.
    public init() { self.init(date: Date()) }

    /// The date of this timestamp.
    public func dateValue() -> Date { Date(timeIntervalSince1970: Double(seconds) + Double(nanoseconds) / 1e9) }

    /// This timestamp with what is finer than a microsecond dropped.
    package var truncatedToMicroseconds: Timestamp { Timestamp(seconds: seconds, nanoseconds: nanoseconds / 1000 * 1000) }

    /// Microseconds since 1970.
    package var micros: Int64 { seconds &* 1_000_000 &+ Int64(nanoseconds / 1000) }
    package init(micros: Int64) {
        var s = micros / 1_000_000, us = micros % 1_000_000
        if us < 0 { us += 1_000_000; s -= 1 }
        self.init(seconds: s, nanoseconds: Int32(us * 1000))
    }

    public static func < (a: Timestamp, b: Timestamp) -> Bool { (a.seconds, a.nanoseconds) < (b.seconds, b.nanoseconds) }
    public var description: String { "Timestamp(seconds=\(seconds), nanoseconds=\(nanoseconds))" }
}

/// A latitude and longitude (Firebase's `GeoPoint`), ordered by latitude, then longitude.
public struct GeoPoint: Sendable, Hashable, Codable, CustomStringConvertible {
    public let latitude: Double
    public let longitude: Double
    /// A point; latitude must be in -90...90 and longitude in -180...180 (checked when written).
    public init(latitude: Double, longitude: Double) {
        self.latitude = latitude
        self.longitude = longitude
    }
    public var description: String { "GeoPoint(\(latitude), \(longitude))" }
}

/// A stored field value: Firestore's value types, in its order across types.
///
/// `pendingServerTimestamp` never reaches a record: it is what a `serverTimestamp()` transform
/// shows locally until the server's time arrives (the write's local time and the field's
/// previous value, for ``ServerTimestampBehavior``).
package indirect enum FieldValueData: Sendable, Hashable {
    case null
    case bool(Bool)
    case integer(Int64)
    case double(Double)
    case timestamp(Timestamp)
    case pendingServerTimestamp(local: Timestamp, previous: FieldValueData?)
    case string(String)
    case bytes(Data)
    /// A document's path below the database root (`cities/SF`).
    case reference(String)
    case geoPoint(GeoPoint)
    case array([FieldValueData])
    case map([String: FieldValueData])

    /// Firestore's type order: null < booleans < numbers < timestamps < (pending server
    /// timestamps) < strings < bytes < references < geo points < arrays < maps.
    package var typeOrder: Int {
        switch self {
        case .null: 0
        case .bool: 1
        case .integer, .double: 2
        case .timestamp: 3
        case .pendingServerTimestamp: 4
        case .string: 5
        case .bytes: 6
        case .reference: 7
        case .geoPoint: 8
        case .array: 9
        case .map: 10
        }
    }

    package var isNumber: Bool { typeOrder == 2 }
    package var isNaN: Bool { if case .double(let d) = self { d.isNaN } else { false } }

    /// Equality as Firestore's SDK decides it (`array-contains`, `in`, `not-in`, whether a
    /// document changed): the same type and the same value, doubles bit for bit (so `1` is not `1.0`
    /// and NaN equals NaN). Ordering (``compare(_:_:)``) treats numbers as numbers instead.
    package static func == (a: FieldValueData, b: FieldValueData) -> Bool {
        switch (a, b) {
        case (.null, .null): true
        case (.bool(let x), .bool(let y)): x == y
        case (.integer(let x), .integer(let y)): x == y
        case (.double(let x), .double(let y)): x.bitPattern == y.bitPattern || (x.isNaN && y.isNaN)
        case (.timestamp(let x), .timestamp(let y)): x == y
        case (.pendingServerTimestamp(let x, let p), .pendingServerTimestamp(let y, let q)): x == y && p == q
        case (.string(let x), .string(let y)): x == y && x.utf8.elementsEqual(y.utf8)
        case (.bytes(let x), .bytes(let y)): x == y
        case (.reference(let x), .reference(let y)): x == y
        case (.geoPoint(let x), .geoPoint(let y)): x == y
        case (.array(let x), .array(let y)): x == y
        case (.map(let x), .map(let y)): x == y
        default: false
        }
    }

    package func hash(into h: inout Hasher) {
        switch self {
        case .null: h.combine(0)
        case .bool(let b): h.combine(b)
        case .integer(let i): h.combine(2); h.combine(i)
        case .double(let d): h.combine(3); h.combine(d.isNaN ? Double.nan.bitPattern : d.bitPattern)
        case .timestamp(let t): h.combine(t)
        case .pendingServerTimestamp(let t, let p): h.combine(t); h.combine(p)
        case .string(let s): h.combine(s)
        case .bytes(let d): h.combine(d)
        case .reference(let r): h.combine(r)
        case .geoPoint(let g): h.combine(g)
        case .array(let a): h.combine(a)
        case .map(let m): h.combine(m)
        }
    }

    /// Firestore's total order of values: -1, 0 or 1. Integers and doubles compare as numbers
    /// (NaN first, NaN equal to NaN, -0.0 equal to 0); strings by their UTF-8 bytes; maps by
    /// their keys in order, then values.
    package static func compare(_ a: FieldValueData, _ b: FieldValueData) -> Int {
        let ta = a.typeOrder, tb = b.typeOrder
        if ta != tb { return ta < tb ? -1 : 1 }
        switch (a, b) {
        case (.null, .null): return 0
        case (.bool(let x), .bool(let y)): return x == y ? 0 : (x ? 1 : -1)
        case (.integer(let x), .integer(let y)): return x == y ? 0 : (x < y ? -1 : 1)
        case (.double(let x), .double(let y)): return compareDoubles(x, y)
        case (.integer(let x), .double(let y)): return -compareDoubleToInt(y, x)
        case (.double(let x), .integer(let y)): return compareDoubleToInt(x, y)
        case (.timestamp(let x), .timestamp(let y)): return x == y ? 0 : (x < y ? -1 : 1)
        case (.pendingServerTimestamp(let x, _), .pendingServerTimestamp(let y, _)): return x == y ? 0 : (x < y ? -1 : 1)
        case (.string(let x), .string(let y)): return compareUTF8(x, y)
        case (.bytes(let x), .bytes(let y)):
            if x == y { return 0 }
            return x.lexicographicallyPrecedes(y) ? -1 : 1
        case (.reference(let x), .reference(let y)): return compareSegments(x.split(separator: "/", omittingEmptySubsequences: false), y.split(separator: "/", omittingEmptySubsequences: false))
        case (.geoPoint(let x), .geoPoint(let y)):
            let c = compareDoubles(x.latitude, y.latitude)
            return c != 0 ? c : compareDoubles(x.longitude, y.longitude)
        case (.array(let x), .array(let y)):
            for (u, v) in zip(x, y) { let c = compare(u, v); if c != 0 { return c } }
            return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
        case (.map(let x), .map(let y)):
            let kx = x.keys.sorted(by: utf8Less), ky = y.keys.sorted(by: utf8Less)
            for (k1, k2) in zip(kx, ky) {
                let c = compareUTF8(k1, k2)
                if c != 0 { return c }
                let v = compare(x[k1]!, y[k2]!)
                if v != 0 { return v }
            }
            return kx.count == ky.count ? 0 : (kx.count < ky.count ? -1 : 1)
        default: return 0
        }
    }

    static func compareDoubles(_ x: Double, _ y: Double) -> Int {
        if x.isNaN { return y.isNaN ? 0 : -1 }
        if y.isNaN { return 1 }
        return x < y ? -1 : (x > y ? 1 : 0)
    }

    /// A double against an integer, exactly (no rounding of the integer to a double).
    static func compareDoubleToInt(_ d: Double, _ i: Int64) -> Int {
        if d.isNaN { return -1 }
        if d < -9_223_372_036_854_775_808.0 { return -1 }
        if d >= 9_223_372_036_854_775_808.0 { return 1 }
        let t = Int64(d.rounded(.towardZero))
        if t != i { return t < i ? -1 : 1 }
        let frac = d - d.rounded(.towardZero)
        return frac > 0 ? 1 : (frac < 0 ? -1 : 0)
    }

    static func compareUTF8(_ x: String, _ y: String) -> Int {
        if x == y { return 0 }
        return x.utf8.lexicographicallyPrecedes(y.utf8) ? -1 : 1
    }
    static func utf8Less(_ x: String, _ y: String) -> Bool { x.utf8.lexicographicallyPrecedes(y.utf8) }

    package static func compareSegments<S: StringProtocol>(_ x: [S], _ y: [S]) -> Int {
        for (u, v) in zip(x, y) {
            let c = compareUTF8(String(u), String(v))
            if c != 0 { return c }
        }
        return x.count == y.count ? 0 : (x.count < y.count ? -1 : 1)
    }

    /// The value at `path` below this map (nil: absent).
    package func value(at path: FieldPath) -> FieldValueData? {
        var v = self
        for s in path.segments {
            guard case .map(let m) = v, let next = m[s] else { return nil }
            v = next
        }
        return v
    }

    /// The fields of a map value (empty for any other value).
    package var mapFields: [String: FieldValueData] { if case .map(let m) = self { m } else { [:] } }
}

/// Sets `value` at `path` in `fields`, creating maps on the way (replacing non-maps); nil
/// deletes the field.
package func setField(_ fields: inout [String: FieldValueData], _ path: ArraySlice<String>, _ value: FieldValueData?) {
    guard let first = path.first else { return }
    if path.count == 1 {
        fields[first] = value
        return
    }
    var inner = fields[first]?.mapFields ?? [:]
    if value == nil, fields[first] == nil { return }  // deleting below a missing field
    if value == nil, case .map = fields[first] {} else if value == nil { return }  // below a non-map: nothing to delete
    setField(&inner, path.dropFirst(), value)
    fields[first] = .map(inner)
}
