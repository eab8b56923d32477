import Foundation

/// A path of segments below the database root: a collection (odd count) or a document (even).
package struct ResourcePath: Sendable, Hashable, Comparable, CustomStringConvertible {
    package var segments: [String]

    package init(_ segments: [String]) { self.segments = segments }

    /// Parses `a/b/c`, checking Firestore's name rules. `what` names the argument in errors.
    package static func parse(_ string: String, what: String) throws -> ResourcePath {
        var trimmed = Substring(string)
        if trimmed.hasPrefix("/") { trimmed = trimmed.dropFirst() }
        if trimmed.hasSuffix("/") { trimmed = trimmed.dropLast() }
        guard !trimmed.isEmpty else { throw FirestoreErrorCode(.invalidArgument, "\(what) must not be empty") }
        let parts = trimmed.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
        if parts.contains(where: \.isEmpty) { throw FirestoreErrorCode(.invalidArgument, "\(what) \"\(string)\" has an empty segment ('//')") }
        for p in parts { try checkSegment(p, what: what) }
        return ResourcePath(parts)
    }

    /// Firestore's rules for a collection id or document id.
    package static func checkSegment(_ s: String, what: String) throws {
        if s.isEmpty { throw FirestoreErrorCode(.invalidArgument, "\(what): an id must not be empty") }
        if s.contains("/") { throw FirestoreErrorCode(.invalidArgument, "\(what): the id \"\(s)\" must not contain '/'") }
        if s == "." || s == ".." { throw FirestoreErrorCode(.invalidArgument, "\(what): the id \"\(s)\" is reserved ('.' and '..' are not ids)") }
        if s.hasPrefix("__") && s.hasSuffix("__") && s.count >= 4 {
            throw FirestoreErrorCode(.invalidArgument, "\(what): the id \"\(s)\" matches __.*__, which Firestore reserves")
        }
        if s.utf8.count > 1500 { throw FirestoreErrorCode(.invalidArgument, "\(what): an id is at most 1,500 bytes (this one is \(s.utf8.count))") }
    }

    package var isDocument: Bool { segments.count % 2 == 0 && !segments.isEmpty }
    package var last: String { segments.last ?? "" }
    package var parent: ResourcePath { ResourcePath(Array(segments.dropLast())) }
    package func appending(_ other: ResourcePath) -> ResourcePath { ResourcePath(segments + other.segments) }
    package func appending(_ s: String) -> ResourcePath { ResourcePath(segments + [s]) }
    package func isPrefix(of other: ResourcePath) -> Bool { other.segments.count >= segments.count && Array(other.segments.prefix(segments.count)) == segments }
    package var description: String { segments.joined(separator: "/") }

    /// Segment by segment, each by its UTF-8 bytes (Firestore's order of document names).
    package static func < (a: ResourcePath, b: ResourcePath) -> Bool { FieldValueData.compareSegments(a.segments, b.segments) < 0 }
}

/// A path to a field inside a document (Firebase's `FieldPath`): its segments are field names,
/// taken as they are (a name may contain dots).
public struct FieldPath: Sendable, Hashable, CustomStringConvertible {
    /// The field names from the document's top level down.
    public let segments: [String]
    /// Internal: the document's own name (`__name__`).
    package let isDocumentID: Bool

    /// A path of field names, each taken literally. Throws on an empty list or an empty name.
    public init(_ fieldNames: [String]) {
        segments = fieldNames
        isDocumentID = false
    }

    private init(documentID: ()) {
        segments = ["__name__"]
        isDocumentID = true
    }

    /// The document's id, to order or filter by (`FieldPath.documentID()`).
    public static func documentID() -> FieldPath { FieldPath(documentID: ()) }

    /// Parses a dotted path (`"address.city"`); a name holding a dot needs ``init(_:)``.
    package static func parse(_ dotted: String) throws -> FieldPath {
        if dotted == "__name__" { return .documentID() }
        guard !dotted.isEmpty else { throw FirestoreErrorCode(.invalidArgument, "a field path must not be empty") }
        if let bad = dotted.first(where: { "~*/[]".contains($0) }) {
            throw FirestoreErrorCode(.invalidArgument, "invalid field path \"\(dotted)\": paths must not contain '~', '*', '/', '[' or ']' (found '\(bad)'); use FieldPath([...]) for such names")
        }
        let parts = dotted.split(separator: ".", omittingEmptySubsequences: false).map(String.init)
        if parts.contains(where: \.isEmpty) {
            throw FirestoreErrorCode(.invalidArgument, "invalid field path \"\(dotted)\": paths must not be empty, begin with '.', end with '.' or contain '..'")
        }
        return FieldPath(parts)
    }

    package func validated() throws -> FieldPath {
        if segments.isEmpty { throw FirestoreErrorCode(.invalidArgument, "a field path must have at least one field name") }
        if segments.contains(where: \.isEmpty) { throw FirestoreErrorCode(.invalidArgument, "a field path's names must not be empty (\(segments))") }
        return self
    }

    package func isPrefix(of other: FieldPath) -> Bool { other.segments.count >= segments.count && Array(other.segments.prefix(segments.count)) == segments }

    /// The path as Firestore writes it: names joined by dots, a name that is not a simple
    /// identifier back-quoted.
    public var description: String {
        segments.map { s in
            let simple = !s.isEmpty && s.first.map { $0 == "_" || $0.isLetter && $0.isASCII } == true
                && s.allSatisfy { $0 == "_" || ($0.isASCII && ($0.isLetter || $0.isNumber)) }
            return simple ? s : "`" + s.replacingOccurrences(of: "\\", with: "\\\\").replacingOccurrences(of: "`", with: "\\`") + "`"
        }.joined(separator: ".")
    }
}

/// A field path given as a `String` (dotted) or a ``FieldPath``.
protocol FieldPathConvertible { func fieldPath() throws -> FieldPath }
extension String: FieldPathConvertible { func fieldPath() throws -> FieldPath { try FieldPath.parse(self) } }
extension FieldPath: FieldPathConvertible { func fieldPath() throws -> FieldPath { try validated() } }

func fieldPath(_ any: Any) throws -> FieldPath {
    if let s = any as? String { return try FieldPath.parse(s) }
    if let p = any as? FieldPath { return try p.validated() }
    throw FirestoreErrorCode(.invalidArgument, "a field path must be a String or a FieldPath, not \(type(of: any))")
}

/// A new document id: 20 characters from A–Z, a–z and 0–9 (Firestore's auto ids), from the
/// system's random source.
func autoID() -> String {
    let chars = Array("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789")
    var g = SystemRandomNumberGenerator()
    return String((0..<20).map { _ in chars[Int(g.next(upperBound: UInt64(chars.count)))] })
}
