import Foundation

/// A special value to write in place of a field's value (Firebase's `FieldValue`): delete the
/// field, the server's time, an increment, an array union or removal.
public final class FieldValue: Sendable, CustomStringConvertible {
    enum Kind: Sendable {
        case delete, serverTimestamp
        case increment(FieldValueData)
        case arrayUnion([FieldValueData])
        case arrayRemove([FieldValueData])
        /// Elements that cannot be stored: the write using it fails with this error.
        case invalid(FirestoreErrorCode)
    }
    let kind: Kind
    private init(_ kind: Kind) { self.kind = kind }

    /// Deletes the field: with `updateData` or `setData(_:merge: true)` / `mergeFields`.
    public static func delete() -> FieldValue { FieldValue(.delete) }
    /// The server's time when it commits the write. Until then, reads show what
    /// ``ServerTimestampBehavior`` asks for.
    public static func serverTimestamp() -> FieldValue { FieldValue(.serverTimestamp) }
    /// Adds `n` to the field's number (a field that is not a number counts as 0). Integers
    /// saturate at the 64-bit limits.
    public static func increment(_ n: Int64) -> FieldValue { FieldValue(.increment(.integer(n))) }
    public static func increment(_ n: Int) -> FieldValue { FieldValue(.increment(.integer(Int64(n)))) }
    public static func increment(_ n: Double) -> FieldValue { FieldValue(.increment(.double(n))) }
    /// Appends each element the array does not hold yet (a field that is not an array becomes
    /// these elements).
    public static func arrayUnion(_ elements: [Any]) -> FieldValue {
        do { return FieldValue(.arrayUnion(try UserData.elements(elements))) } catch {
            return FieldValue(.invalid(error as? FirestoreErrorCode ?? FirestoreErrorCode(.invalidArgument, "\(error)")))
        }
    }
    /// Removes every element equal to one of these (a field that is not an array becomes `[]`).
    public static func arrayRemove(_ elements: [Any]) -> FieldValue {
        do { return FieldValue(.arrayRemove(try UserData.elements(elements))) } catch {
            return FieldValue(.invalid(error as? FirestoreErrorCode ?? FirestoreErrorCode(.invalidArgument, "\(error)")))
        }
    }

    public var description: String {
        switch kind {
        case .delete: "FieldValue.delete()"
        case .serverTimestamp: "FieldValue.serverTimestamp()"
        case .increment(let v): "FieldValue.increment(\(v))"
        case .arrayUnion(let v): "FieldValue.arrayUnion(\(v.count) elements)"
        case .arrayRemove(let v): "FieldValue.arrayRemove(\(v.count) elements)"
        case .invalid(let e): "FieldValue (invalid: \(e.message))"
        }
    }
}

/// A transform the server applies after a write's fields (local reads apply it at once).
package enum FieldTransform: Sendable, Hashable {
    case serverTimestamp
    case increment(FieldValueData)
    case arrayUnion([FieldValueData])
    case arrayRemove([FieldValueData])
}

/// Turns an app's values (`[String: Any]`) into stored values, checking Firestore's rules.
package enum UserData {
    /// Firestore's limit on nesting: a field at most 20 maps or arrays deep.
    package static let maxDepth = 20
    /// Firestore's limit on a document's size.
    package static let maxDocumentBytes = 1_048_576

    /// Where a value is written: which special values are allowed there.
    enum Context { case set, mergeSet, update, argument }

    struct Parsed {
        var fields: [String: FieldValueData] = [:]
        /// The fields written (merge and update; nil: the whole document).
        var mask: [FieldPath]?
        var transforms: [(FieldPath, FieldTransform)] = []
    }

    /// Array elements for `arrayUnion` / `arrayRemove`: plain values, none an array (a field
    /// cannot hold an array in an array).
    static func elements(_ list: [Any]) throws -> [FieldValueData] {
        try list.enumerated().map { i, e in
            let v = try plain(e, depth: 1)
            if case .array = v { throw FirestoreErrorCode(.invalidArgument, "element \(i) is an array: arrays cannot hold arrays") }
            return v
        }
    }

    /// A value with no special values (query arguments, array elements).
    static func plain(_ any: Any?, depth: Int) throws -> FieldValueData {
        var p = Parsed()
        guard let v = try parse(any, path: [], context: .argument, depth: depth, into: &p) else {
            throw FirestoreErrorCode(.invalidArgument, "FieldValue sentinels cannot be used here (only as field values of setData or updateData)")
        }
        return v
    }

    /// Parses a document's data for `setData` (merge: every leaf written is in the mask).
    static func parseSet(_ data: [String: Any], merge: Bool) throws -> Parsed {
        var p = Parsed()
        let ctx: Context = merge ? .mergeSet : .set
        for (k, v) in data {
            try checkFieldName(k)
            if let value = try parse(v, path: [k], context: ctx, depth: 1, into: &p) { p.fields[k] = value }
        }
        if merge { p.mask = leafPaths(data, prefix: []).sorted { FieldValueData.compareSegments($0.segments, $1.segments) < 0 } }
        p.transforms.sort { FieldValueData.compareSegments($0.0.segments, $1.0.segments) < 0 }
        return p
    }

    /// Parses `setData(_:mergeFields:)`: only the named fields are written.
    static func parseMergeFields(_ data: [String: Any], fields: [FieldPath]) throws -> Parsed {
        let full = try parseSet(data, merge: true)
        var p = Parsed()
        p.mask = fields
        for f in fields {
            guard let v = lookup(data, f.segments) else {
                throw FirestoreErrorCode(.invalidArgument, "field '\(f)' is specified in your field mask but missing from your input data")
            }
            if v is FieldValue { continue }
            if let value = FieldValueData.map(full.fields).value(at: f) { setField(&p.fields, f.segments[...], value) }
        }
        p.transforms = full.transforms.filter { t in fields.contains { $0.isPrefix(of: t.0) } }
        return p
    }

    /// Parses `updateData`: keys are field paths (`String`, dotted, or `FieldPath`).
    static func parseUpdate(_ data: [AnyHashable: Any]) throws -> Parsed {
        var p = Parsed()
        var mask: [FieldPath] = []
        for (k, v) in data {
            let path = try fieldPath(k.base)
            if path.isDocumentID { throw FirestoreErrorCode(.invalidArgument, "the document id cannot be updated") }
            if let value = try parse(v, path: path.segments, context: .update, depth: path.segments.count, into: &p) {
                setField(&p.fields, path.segments[...], value)
            }
            mask.append(path)
        }
        for a in mask { for b in mask where a != b && a.isPrefix(of: b) {
            throw FirestoreErrorCode(.invalidArgument, "field '\(a)' was specified multiple times: '\(b)' is below it")
        } }
        // In field order, so that equal writes make equal records.
        p.mask = mask.sorted { FieldValueData.compareSegments($0.segments, $1.segments) < 0 }
        p.transforms.sort { FieldValueData.compareSegments($0.0.segments, $1.0.segments) < 0 }
        return p
    }

    private static func checkFieldName(_ k: String) throws {
        if k.isEmpty { throw FirestoreErrorCode(.invalidArgument, "a field name must not be empty") }
    }

    private static func lookup(_ data: [String: Any], _ path: [String]) -> Any? {
        var cur: Any = data
        for s in path {
            guard let m = cur as? [String: Any], let next = m[s] else { return nil }
            cur = next
        }
        return cur
    }

    /// Every leaf's path (an empty map counts as a leaf, as a sentinel does).
    private static func leafPaths(_ data: [String: Any], prefix: [String]) -> [FieldPath] {
        var out: [FieldPath] = []
        for (k, v) in data {
            if let m = v as? [String: Any], !m.isEmpty { out += leafPaths(m, prefix: prefix + [k]) } else { out.append(FieldPath(prefix + [k])) }
        }
        return out
    }

    /// One value; nil when it is a sentinel (recorded in `into`).
    private static func parse(_ any: Any?, path: [String], context: Context, depth: Int, into p: inout Parsed) throws -> FieldValueData? {
        if depth > maxDepth {
            throw FirestoreErrorCode(.invalidArgument, "field '\(FieldPath(path))' is nested more than \(maxDepth) levels deep (Firestore's limit)")
        }
        guard let any else { return .null }
        if let fv = any as? FieldValue {
            let fp = FieldPath(path)
            switch fv.kind {
            case .invalid(let error):
                throw FirestoreErrorCode(.invalidArgument, "field '\(fp)': \(error.message)")
            case .delete:
                guard context == .update || context == .mergeSet else {
                    throw FirestoreErrorCode(.invalidArgument, "FieldValue.delete() can only be used with updateData() and setData() with merge (field '\(fp)')")
                }
                if context == .mergeSet, p.mask == nil {}  // merge masks are built from the data
            case .serverTimestamp:
                guard context != .argument else { throw FirestoreErrorCode(.invalidArgument, "FieldValue.serverTimestamp() cannot be used here (in an array or a query)") }
                p.transforms.append((fp, .serverTimestamp))
            case .increment(let n):
                guard context != .argument else { throw FirestoreErrorCode(.invalidArgument, "FieldValue.increment() cannot be used here (in an array or a query)") }
                p.transforms.append((fp, .increment(n)))
            case .arrayUnion(let e):
                guard context != .argument else { throw FirestoreErrorCode(.invalidArgument, "FieldValue.arrayUnion() cannot be used here (in an array or a query)") }
                p.transforms.append((fp, .arrayUnion(e)))
            case .arrayRemove(let e):
                guard context != .argument else { throw FirestoreErrorCode(.invalidArgument, "FieldValue.arrayRemove() cannot be used here (in an array or a query)") }
                p.transforms.append((fp, .arrayRemove(e)))
            }
            if path.isEmpty { throw FirestoreErrorCode(.invalidArgument, "\(fv) cannot be used here") }
            return nil
        }
        // The common types first, by their exact type (a failed cast costs; testing an array
        // against a class such as NSNull bridges it to Foundation first).
        let exact = Swift.type(of: any)
        if exact == String.self { return .string(any as! String) }
        if exact == Int.self { return .integer(Int64(any as! Int)) }
        if exact == Double.self { return .double(any as! Double) }
        if exact == Bool.self { return .bool(any as! Bool) }
        if exact == Dictionary<String, Any>.self { return try parseMap(any as! [String: Any], path: path, context: context, depth: depth, into: &p) }
        if exact == Array<Any>.self { return try parseArray(any as! [Any], path: path, depth: depth) }
        switch any {
        case is NSNull: return .null
        // A Foundation number (from JSONSerialization or Objective-C) keeps its own type: a
        // bridging cast to Int would take true for 1 and 2.0 for 2.
        case let n as NSNumber where type(of: any) is NSNumber.Type: return numberValue(n)
        case let b as Bool where type(of: any) == Bool.self: return .bool(b)
        case let i as Int: return .integer(Int64(i))
        case let i as Int64: return .integer(i)
        case let i as Int32: return .integer(Int64(i))
        case let i as Int16: return .integer(Int64(i))
        case let i as Int8: return .integer(Int64(i))
        case let i as UInt8: return .integer(Int64(i))
        case let i as UInt16: return .integer(Int64(i))
        case let i as UInt32: return .integer(Int64(i))
        case let i as UInt:
            guard i <= UInt(Int64.max) else { throw FirestoreErrorCode(.invalidArgument, "field '\(FieldPath(path))': \(i) does not fit in a 64-bit signed integer") }
            return .integer(Int64(i))
        case let i as UInt64:
            guard i <= UInt64(Int64.max) else { throw FirestoreErrorCode(.invalidArgument, "field '\(FieldPath(path))': \(i) does not fit in a 64-bit signed integer") }
            return .integer(Int64(i))
        case let d as Double: return .double(d)
        case let f as Float: return .double(Double(f))
        case let n as NSNumber: return numberValue(n)
        case let s as String: return .string(s)
        case let s as Substring: return .string(String(s))
        case let d as Data: return .bytes(d)
        case let t as Timestamp: return .timestamp(t.truncatedToMicroseconds)
        case let d as Date: return .timestamp(Timestamp(date: d).truncatedToMicroseconds)
        case let g as GeoPoint:
            guard (-90...90).contains(g.latitude), (-180...180).contains(g.longitude) else {
                throw FirestoreErrorCode(.invalidArgument, "field '\(FieldPath(path))': latitude must be in -90...90 and longitude in -180...180 (\(g))")
            }
            return .geoPoint(g)
        case let r as DocumentReference: return .reference(r.path)
        case let a as [Any?]: return try parseArray(a.map { $0 as Any }, path: path, depth: depth)
        case let m as [String: Any?]: return try parseMap(m.mapValues { $0 as Any }, path: path, context: context, depth: depth, into: &p)
        default:
            throw FirestoreErrorCode(.invalidArgument, "field '\(FieldPath(path))': unsupported type \(type(of: any)) (use Bool, integers, Double, String, Data, Date, Timestamp, GeoPoint, DocumentReference, arrays, [String: Any] or NSNull)")
        }
    }

    private static func parseArray(_ a: [Any], path: [String], depth: Int) throws -> FieldValueData {
        var out: [FieldValueData] = []
        out.reserveCapacity(a.count)
        for (i, e) in a.enumerated() {
            if e is [Any] || e is [Any?] { throw FirestoreErrorCode(.invalidArgument, "field '\(FieldPath(path))': nested arrays are not supported (element \(i) is an array)") }
            var inner = Parsed()
            guard let v = try parse(e, path: path + ["\(i)"], context: .argument, depth: depth + 1, into: &inner) else {
                throw FirestoreErrorCode(.invalidArgument, "field '\(FieldPath(path))': FieldValue sentinels cannot be used inside arrays")
            }
            out.append(v)
        }
        return .array(out)
    }

    private static func parseMap(_ m: [String: Any], path: [String], context: Context, depth: Int, into p: inout Parsed) throws -> FieldValueData {
        var out: [String: FieldValueData] = [:]
        out.reserveCapacity(m.count)
        for (k, v) in m {
            try checkFieldName(k)
            if let value = try parse(v, path: path + [k], context: context, depth: depth + 1, into: &p) { out[k] = value }
        }
        // An empty map written by a merge replaces what was there with an empty map.
        return .map(out)
    }

    private static func numberValue(_ n: NSNumber) -> FieldValueData {
        let t = String(cString: n.objCType)
        switch t {
        case "c", "B": return .bool(n.boolValue)
        case "f", "d": return .double(n.doubleValue)
        default: return .integer(n.int64Value)
        }
    }

    /// The stored size of a document, as Firestore counts it: its name, and each field's name
    /// (+1) and value.
    package static func documentSize(path: ResourcePath, fields: [String: FieldValueData]) -> Int {
        path.segments.reduce(16) { $0 + $1.utf8.count + 1 } + fields.reduce(0) { $0 + $1.key.utf8.count + 1 + size($1.value) } + 32
    }

    package static func size(_ v: FieldValueData) -> Int {
        switch v {
        case .null, .bool: 1
        case .integer, .double, .timestamp, .pendingServerTimestamp: 8
        case .string(let s): s.utf8.count + 1
        case .bytes(let d): d.count
        case .reference(let r): r.utf8.count + 1
        case .geoPoint: 16
        case .array(let a): a.reduce(0) { $0 + size($1) }
        case .map(let m): m.reduce(0) { $0 + $1.key.utf8.count + 1 + size($1.value) }
        }
    }
}
