import Foundation

// Codable support (Firebase's `Firestore.Encoder`, `Firestore.Decoder`, `@DocumentID`,
// `@ServerTimestamp`, `setData(from:)`, `data(as:)`).
//
// Encoding builds the `[String: Any]` that `setData` takes; decoding reads the `[String: Any]`
// that `DocumentSnapshot.data()` returns. Firestore's own values (`Timestamp`, `GeoPoint`,
// `DocumentReference`, `FieldValue`, and `Date`, `Data`) are written and read as themselves,
// never field by field.

// MARK: - Firestore.Encoder and Firestore.Decoder

extension Firestore {
    /// Turns an `Encodable` value into a document's fields, as `setData` takes them (Firebase's
    /// `Firestore.Encoder`).
    ///
    /// Integers become `Int` (a `UInt`/`UInt64` above `Int64.max` is an error), `Float` becomes
    /// `Double`, `Date` becomes ``Timestamp``, `Data` stays `Data`, `URL` becomes its string;
    /// ``Timestamp``, ``GeoPoint``, ``DocumentReference`` and ``FieldValue`` are kept as they
    /// are. A nil optional property is left out (`encodeIfPresent`); an explicit `encodeNil`
    /// writes `NSNull`. ``DocumentID`` properties are not written.
    public struct Encoder: Sendable {
        /// Passed to the values' `encode(to:)` as the encoder's `userInfo`.
        public var userInfo: [CodingUserInfoKey: any Sendable] = [:]

        public init() {}

        /// The fields of `value`, which must encode as a map (a struct, a class, or a dictionary
        /// with `String` keys).
        ///
        /// - Throws: ``FirestoreErrorCode`` `invalidArgument` when `value` does not encode as a
        ///   map; `EncodingError.invalidValue` for a value Firestore cannot hold.
        public func encode<T: Encodable>(_ value: T) throws -> [String: Any] {
            let slot = try Boxing.slot(value, path: [], userInfo: userInfo.mapValues { $0 as Any })
            guard case .map(let fields) = slot else {
                throw FirestoreErrorCode(.invalidArgument, "a document must encode as a map of fields (a struct, a class or a dictionary with String keys), not as a single value or an array (\(T.self))")
            }
            return fields.materialized
        }
    }

    /// Turns a document's fields, as `DocumentSnapshot.data()` returns them, into a `Decodable`
    /// value (Firebase's `Firestore.Decoder`).
    ///
    /// Integers decode into any integer type that holds them and into `Double`/`Float`;
    /// ``Timestamp`` into `Date` or ``Timestamp``; ``GeoPoint``, ``DocumentReference`` and
    /// `Data` into themselves. A missing key is `DecodingError.keyNotFound`, a value of the
    /// wrong type `DecodingError.typeMismatch`, with the coding path.
    public struct Decoder: Sendable {
        /// Passed to the values' `init(from:)` as the decoder's `userInfo`.
        public var userInfo: [CodingUserInfoKey: any Sendable] = [:]

        public init() {}

        /// Decodes `type` from `data`. With a `reference`, ``DocumentID`` properties get the
        /// document's id or reference.
        public func decode<T: Decodable>(_ type: T.Type, from data: [String: Any], in reference: DocumentReference? = nil) throws -> T {
            let context = DecodingContext(reference: reference, userInfo: userInfo.mapValues { $0 as Any })
            return try Unboxing.value(data, as: T.self, path: [], context: context)
        }
    }
}

// MARK: - API taking and returning Codable values

extension DocumentReference {
    /// Replaces the document with the fields of `value` (see ``Firestore/Encoder``).
    public func setData<T: Encodable>(from value: T, encoder: Firestore.Encoder = Firestore.Encoder()) async throws {
        let data = try encoder.encode(value)
        try await setData(data)
    }

    /// With `merge`, writes only the fields `value` encodes, leaving the others.
    public func setData<T: Encodable>(from value: T, merge: Bool, encoder: Firestore.Encoder = Firestore.Encoder()) async throws {
        let data = try encoder.encode(value)
        try await setData(data, merge: merge)
    }

    /// Writes only the fields named in `mergeFields` (`String` dotted paths or `FieldPath`s)
    /// from the fields of `value`.
    public func setData<T: Encodable>(from value: T, mergeFields: [Any], encoder: Firestore.Encoder = Firestore.Encoder()) async throws {
        let data = try encoder.encode(value)
        try await setData(data, mergeFields: mergeFields)
    }
}

extension CollectionReference {
    /// Adds a document with an automatic id and the fields of `value`; returns its reference
    /// once the write is durable.
    @discardableResult
    public func addDocument<T: Encodable>(from value: T, encoder: Firestore.Encoder = Firestore.Encoder()) async throws -> DocumentReference {
        let data = try encoder.encode(value)
        return try await addDocument(data: data)
    }
}

extension DocumentSnapshot {
    /// The document decoded as `type` (see ``Firestore/Decoder``); ``DocumentID`` properties
    /// get this document's id or reference. Pending server timestamps are shown as `behavior`
    /// says (nil with `.none`).
    ///
    /// - Throws: ``FirestoreErrorCode`` `notFound` when the document does not exist; a
    ///   `DecodingError` when its fields do not fit `type`.
    public func data<T: Decodable>(as type: T.Type, with behavior: ServerTimestampBehavior = .none,
                                   decoder: Firestore.Decoder = Firestore.Decoder()) throws -> T {
        guard let fields = data(with: behavior) else {
            throw FirestoreErrorCode(.notFound, "document \(reference.path) does not exist, so it cannot be decoded as \(T.self)")
        }
        return try decoder.decode(T.self, from: fields, in: reference)
    }
}

extension WriteBatch {
    /// Replaces the document with the fields of `value`.
    ///
    /// - Throws: what ``Firestore/Encoder`` throws; the batch is unchanged then.
    @discardableResult
    public func setData<T: Encodable>(from value: T, forDocument document: DocumentReference,
                                      encoder: Firestore.Encoder = Firestore.Encoder()) throws -> WriteBatch {
        setData(try encoder.encode(value), forDocument: document)
    }

    /// With `merge`, writes only the fields `value` encodes, leaving the others.
    @discardableResult
    public func setData<T: Encodable>(from value: T, forDocument document: DocumentReference, merge: Bool,
                                      encoder: Firestore.Encoder = Firestore.Encoder()) throws -> WriteBatch {
        setData(try encoder.encode(value), forDocument: document, merge: merge)
    }

    /// Writes only the fields named in `mergeFields` from the fields of `value`.
    @discardableResult
    public func setData<T: Encodable>(from value: T, forDocument document: DocumentReference, mergeFields: [Any],
                                      encoder: Firestore.Encoder = Firestore.Encoder()) throws -> WriteBatch {
        setData(try encoder.encode(value), forDocument: document, mergeFields: mergeFields)
    }
}

// MARK: - Firestore's values as Codable

/// A reference is written as itself by ``Firestore/Encoder`` and read back by
/// ``Firestore/Decoder``; other encoders and decoders cannot handle it.
extension DocumentReference: Codable {
    public convenience init(from decoder: any Swift.Decoder) throws {
        guard let d = decoder as? FirestoreValueDecoder else {
            throw DecodingError.typeMismatch(DocumentReference.self, .init(codingPath: decoder.codingPath,
                debugDescription: "a DocumentReference can only be decoded by Firestore.Decoder"))
        }
        guard let r = d.value as? DocumentReference else { throw Unboxing.mismatch(DocumentReference.self, d.value, d.codingPath) }
        self.init(firestore: r.firestore, keyResult: r.keyResult.mapError { $0 as any Error })
    }

    public func encode(to encoder: any Swift.Encoder) throws {
        guard let e = encoder as? FirestoreValueEncoder else {
            throw EncodingError.invalidValue(self, .init(codingPath: encoder.codingPath,
                debugDescription: "a DocumentReference can only be encoded by Firestore.Encoder"))
        }
        e.slot = .value(self)
    }
}

/// A `FieldValue` is written as itself by ``Firestore/Encoder`` (a struct may hold one, e.g.
/// `FieldValue.increment(1)`); other encoders cannot handle it.
extension FieldValue: Encodable {
    public func encode(to encoder: any Swift.Encoder) throws {
        guard let e = encoder as? FirestoreValueEncoder else {
            throw EncodingError.invalidValue(self, .init(codingPath: encoder.codingPath,
                debugDescription: "a FieldValue can only be encoded by Firestore.Encoder"))
        }
        e.slot = .value(self)
    }
}

// MARK: - @DocumentID

/// What a ``DocumentID`` can hold: the document's id (`String`) or its ``DocumentReference``.
public protocol DocumentIDWrappable {
    /// The value for the document at `reference`.
    static func wrap(_ reference: DocumentReference) throws -> Self
}

extension String: DocumentIDWrappable {
    public static func wrap(_ reference: DocumentReference) -> String { reference.documentID }
}

extension DocumentReference: DocumentIDWrappable {
    public static func wrap(_ reference: DocumentReference) -> DocumentReference { reference }
}

/// Marks values ``Firestore/Encoder`` does not write as fields.
fileprivate protocol SkippedByFirestoreEncoder {}

/// A property that holds the document's id (`String?`) or reference (`DocumentReference?`)
/// (Firebase's `@DocumentID`).
///
/// Decoded through ``DocumentSnapshot/data(as:with:decoder:)`` (or ``Firestore/Decoder`` given
/// a reference), it is the document's id or reference, whatever the fields hold; without a
/// reference it is the field of that name, or nil. ``Firestore/Encoder`` never writes it as a
/// field (other encoders write the value).
@propertyWrapper
public struct DocumentID<Value: DocumentIDWrappable & Codable & Sendable>: Codable, Sendable {
    public var wrappedValue: Value?

    public init(wrappedValue: Value?) { self.wrappedValue = wrappedValue }

    public init(from decoder: any Swift.Decoder) throws {
        if let d = decoder as? FirestoreValueDecoder, let reference = d.context.reference {
            wrappedValue = try Value.wrap(reference)
            return
        }
        let c = try decoder.singleValueContainer()
        wrappedValue = c.decodeNil() ? nil : try c.decode(Value.self)
    }

    public func encode(to encoder: any Swift.Encoder) throws {
        var c = encoder.singleValueContainer()
        if let wrappedValue { try c.encode(wrappedValue) } else { try c.encodeNil() }
    }
}

extension DocumentID: SkippedByFirestoreEncoder {}
extension DocumentID: Equatable where Value: Equatable {}
extension DocumentID: Hashable where Value: Hashable {}

// MARK: - @ServerTimestamp

/// What a ``ServerTimestamp`` can hold: `Date` or ``Timestamp``.
public protocol ServerTimestampWrappable {
    /// The value of `timestamp`.
    static func wrap(_ timestamp: Timestamp) throws -> Self
    /// The timestamp of `value`.
    static func unwrap(_ value: Self) throws -> Timestamp
}

extension Date: ServerTimestampWrappable {
    public static func wrap(_ timestamp: Timestamp) -> Date { timestamp.dateValue() }
    public static func unwrap(_ value: Date) -> Timestamp { Timestamp(date: value) }
}

extension Timestamp: ServerTimestampWrappable {
    public static func wrap(_ timestamp: Timestamp) -> Timestamp { timestamp }
    public static func unwrap(_ value: Timestamp) -> Timestamp { value }
}

/// A `Date?` or `Timestamp?` property that the server sets when nil (Firebase's
/// `@ServerTimestamp`).
///
/// ``Firestore/Encoder`` writes nil as `FieldValue.serverTimestamp()` and a value as its
/// ``Timestamp``. Read back before the server's time arrives, it is what the
/// ``ServerTimestampBehavior`` of `data(as:with:)` shows: nil with `.none`, the local time with
/// `.estimate`. A missing field or `NSNull` decodes as nil.
@propertyWrapper
public struct ServerTimestamp<Value: ServerTimestampWrappable & Codable & Sendable>: Codable, Sendable {
    public var wrappedValue: Value?

    public init(wrappedValue: Value?) { self.wrappedValue = wrappedValue }

    public init(from decoder: any Swift.Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() {
            wrappedValue = nil
        } else if decoder is FirestoreValueDecoder {
            wrappedValue = try Value.wrap(c.decode(Timestamp.self))
        } else {
            wrappedValue = try c.decode(Value.self)
        }
    }

    public func encode(to encoder: any Swift.Encoder) throws {
        var c = encoder.singleValueContainer()
        if encoder is FirestoreValueEncoder {
            if let wrappedValue { try c.encode(Value.unwrap(wrappedValue)) } else { try c.encode(FieldValue.serverTimestamp()) }
        } else if let wrappedValue {
            try c.encode(wrappedValue)
        } else {
            try c.encodeNil()
        }
    }
}

extension ServerTimestamp: Equatable where Value: Equatable {}
extension ServerTimestamp: Hashable where Value: Hashable {}

extension KeyedDecodingContainer {
    /// A ``DocumentID`` is not a field: decoded whether or not its key is present.
    public func decode<V>(_ type: DocumentID<V>.Type, forKey key: Key) throws -> DocumentID<V> {
        let decoder: any Swift.Decoder
        do { decoder = try superDecoder(forKey: key) } catch {
            if contains(key) { throw error }
            return DocumentID(wrappedValue: nil)
        }
        return try DocumentID(from: decoder)
    }

    /// A ``ServerTimestamp`` whose key is absent decodes as nil.
    public func decode<V>(_ type: ServerTimestamp<V>.Type, forKey key: Key) throws -> ServerTimestamp<V> {
        try decodeIfPresent(type, forKey: key) ?? ServerTimestamp(wrappedValue: nil)
    }
}

// MARK: - Encoding machinery

/// A coding key for array indexes and `super`.
private struct IndexKey: CodingKey {
    let stringValue: String
    let intValue: Int?
    init(stringValue: String) { self.stringValue = stringValue; intValue = nil }
    init(intValue: Int) { stringValue = "\(intValue)"; self.intValue = intValue }
    static let `super` = IndexKey(stringValue: "super")
}

/// A value being encoded: final, or a map or array still being filled, or the result of a
/// `superEncoder` (read when the whole value is done).
fileprivate enum Slot {
    case value(Any)
    case map(MapSlot)
    case array(ArraySlot)
    case deferred(FirestoreValueEncoder)

    var materialized: Any {
        switch self {
        case .value(let v): v
        case .map(let m): m.materialized
        case .array(let a): a.items.map(\.materialized)
        case .deferred(let e): (e.slot ?? .map(MapSlot())).materialized
        }
    }
}

fileprivate final class MapSlot {
    var entries: [String: Slot] = [:]
    var materialized: [String: Any] { entries.mapValues(\.materialized) }
}

fileprivate final class ArraySlot {
    var items: [Slot] = []
}

/// Turns values into slots.
fileprivate enum Boxing {
    static func integer<I: BinaryInteger>(_ value: I, path: [any CodingKey]) throws -> Slot {
        guard let i = Int64(exactly: value) else {
            throw EncodingError.invalidValue(value, .init(codingPath: path,
                debugDescription: "\(value) does not fit in a 64-bit signed integer, Firestore's integer type"))
        }
        return .value(Int(i))
    }

    /// Firestore's own values and the Foundation types it stores as its own, unchanged (nil:
    /// any other value).
    static func firestoreValue(_ value: Any) -> Any? {
        switch value {
        case let v as Timestamp: v
        case let v as GeoPoint: v
        case let v as DocumentReference: v
        case let v as FieldValue: v
        case let v as Date: Timestamp(date: v)
        case let v as Data: v
        case let v as URL: v.absoluteString
        default: nil
        }
    }

    static func slot<T: Encodable>(_ value: T, path: [any CodingKey], userInfo: [CodingUserInfoKey: Any]) throws -> Slot {
        if let v = firestoreValue(value) { return .value(v) }
        let encoder = FirestoreValueEncoder(codingPath: path, userInfo: userInfo)
        try value.encode(to: encoder)
        // A value that encodes nothing is an empty map, as with JSONEncoder.
        return encoder.slot ?? .map(MapSlot())
    }
}

fileprivate final class FirestoreValueEncoder: Swift.Encoder {
    let codingPath: [any CodingKey]
    let userInfo: [CodingUserInfoKey: Any]
    var slot: Slot?

    init(codingPath: [any CodingKey], userInfo: [CodingUserInfoKey: Any]) {
        self.codingPath = codingPath
        self.userInfo = userInfo
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) -> KeyedEncodingContainer<Key> {
        let map: MapSlot
        if case .map(let m)? = slot { map = m } else { map = MapSlot(); slot = .map(map) }
        return KeyedEncodingContainer(KeyedFieldsEncoder<Key>(map: map, codingPath: codingPath, userInfo: userInfo))
    }

    func unkeyedContainer() -> any UnkeyedEncodingContainer {
        let array: ArraySlot
        if case .array(let a)? = slot { array = a } else { array = ArraySlot(); slot = .array(array) }
        return ArrayEncoder(array: array, codingPath: codingPath, userInfo: userInfo)
    }

    func singleValueContainer() -> any SingleValueEncodingContainer { self }
}

extension FirestoreValueEncoder: SingleValueEncodingContainer {
    func encodeNil() throws { slot = .value(NSNull()) }
    func encode(_ value: Bool) throws { slot = .value(value) }
    func encode(_ value: String) throws { slot = .value(value) }
    func encode(_ value: Double) throws { slot = .value(value) }
    func encode(_ value: Float) throws { slot = .value(Double(value)) }
    func encode(_ value: Int) throws { slot = .value(value) }
    func encode(_ value: Int8) throws { slot = try Boxing.integer(value, path: codingPath) }
    func encode(_ value: Int16) throws { slot = try Boxing.integer(value, path: codingPath) }
    func encode(_ value: Int32) throws { slot = try Boxing.integer(value, path: codingPath) }
    func encode(_ value: Int64) throws { slot = try Boxing.integer(value, path: codingPath) }
    func encode(_ value: UInt) throws { slot = try Boxing.integer(value, path: codingPath) }
    func encode(_ value: UInt8) throws { slot = try Boxing.integer(value, path: codingPath) }
    func encode(_ value: UInt16) throws { slot = try Boxing.integer(value, path: codingPath) }
    func encode(_ value: UInt32) throws { slot = try Boxing.integer(value, path: codingPath) }
    func encode(_ value: UInt64) throws { slot = try Boxing.integer(value, path: codingPath) }
    func encode<T: Encodable>(_ value: T) throws { slot = try Boxing.slot(value, path: codingPath, userInfo: userInfo) }
}

private struct KeyedFieldsEncoder<Key: CodingKey>: KeyedEncodingContainerProtocol {
    let map: MapSlot
    let codingPath: [any CodingKey]
    let userInfo: [CodingUserInfoKey: Any]

    private func put(_ slot: Slot, _ key: Key) { map.entries[key.stringValue] = slot }

    mutating func encodeNil(forKey key: Key) throws { put(.value(NSNull()), key) }
    mutating func encode(_ value: Bool, forKey key: Key) throws { put(.value(value), key) }
    mutating func encode(_ value: String, forKey key: Key) throws { put(.value(value), key) }
    mutating func encode(_ value: Double, forKey key: Key) throws { put(.value(value), key) }
    mutating func encode(_ value: Float, forKey key: Key) throws { put(.value(Double(value)), key) }
    mutating func encode(_ value: Int, forKey key: Key) throws { put(.value(value), key) }
    mutating func encode(_ value: Int8, forKey key: Key) throws { put(try Boxing.integer(value, path: codingPath + [key]), key) }
    mutating func encode(_ value: Int16, forKey key: Key) throws { put(try Boxing.integer(value, path: codingPath + [key]), key) }
    mutating func encode(_ value: Int32, forKey key: Key) throws { put(try Boxing.integer(value, path: codingPath + [key]), key) }
    mutating func encode(_ value: Int64, forKey key: Key) throws { put(try Boxing.integer(value, path: codingPath + [key]), key) }
    mutating func encode(_ value: UInt, forKey key: Key) throws { put(try Boxing.integer(value, path: codingPath + [key]), key) }
    mutating func encode(_ value: UInt8, forKey key: Key) throws { put(try Boxing.integer(value, path: codingPath + [key]), key) }
    mutating func encode(_ value: UInt16, forKey key: Key) throws { put(try Boxing.integer(value, path: codingPath + [key]), key) }
    mutating func encode(_ value: UInt32, forKey key: Key) throws { put(try Boxing.integer(value, path: codingPath + [key]), key) }
    mutating func encode(_ value: UInt64, forKey key: Key) throws { put(try Boxing.integer(value, path: codingPath + [key]), key) }

    mutating func encode<T: Encodable>(_ value: T, forKey key: Key) throws {
        if value is any SkippedByFirestoreEncoder { return }
        put(try Boxing.slot(value, path: codingPath + [key], userInfo: userInfo), key)
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type, forKey key: Key) -> KeyedEncodingContainer<NestedKey> {
        let nested: MapSlot
        if case .map(let m)? = map.entries[key.stringValue] { nested = m } else { nested = MapSlot(); put(.map(nested), key) }
        return KeyedEncodingContainer(KeyedFieldsEncoder<NestedKey>(map: nested, codingPath: codingPath + [key], userInfo: userInfo))
    }

    mutating func nestedUnkeyedContainer(forKey key: Key) -> any UnkeyedEncodingContainer {
        let nested: ArraySlot
        if case .array(let a)? = map.entries[key.stringValue] { nested = a } else { nested = ArraySlot(); put(.array(nested), key) }
        return ArrayEncoder(array: nested, codingPath: codingPath + [key], userInfo: userInfo)
    }

    mutating func superEncoder() -> any Swift.Encoder { superEncoder(named: IndexKey.super) }
    mutating func superEncoder(forKey key: Key) -> any Swift.Encoder { superEncoder(named: key) }

    private func superEncoder(named key: any CodingKey) -> any Swift.Encoder {
        let e = FirestoreValueEncoder(codingPath: codingPath + [key], userInfo: userInfo)
        map.entries[key.stringValue] = .deferred(e)
        return e
    }
}

private struct ArrayEncoder: UnkeyedEncodingContainer {
    let array: ArraySlot
    let codingPath: [any CodingKey]
    let userInfo: [CodingUserInfoKey: Any]

    var count: Int { array.items.count }
    private var nextPath: [any CodingKey] { codingPath + [IndexKey(intValue: count)] }
    private func append(_ slot: Slot) { array.items.append(slot) }

    mutating func encodeNil() throws { append(.value(NSNull())) }
    mutating func encode(_ value: Bool) throws { append(.value(value)) }
    mutating func encode(_ value: String) throws { append(.value(value)) }
    mutating func encode(_ value: Double) throws { append(.value(value)) }
    mutating func encode(_ value: Float) throws { append(.value(Double(value))) }
    mutating func encode(_ value: Int) throws { append(.value(value)) }
    mutating func encode(_ value: Int8) throws { append(try Boxing.integer(value, path: nextPath)) }
    mutating func encode(_ value: Int16) throws { append(try Boxing.integer(value, path: nextPath)) }
    mutating func encode(_ value: Int32) throws { append(try Boxing.integer(value, path: nextPath)) }
    mutating func encode(_ value: Int64) throws { append(try Boxing.integer(value, path: nextPath)) }
    mutating func encode(_ value: UInt) throws { append(try Boxing.integer(value, path: nextPath)) }
    mutating func encode(_ value: UInt8) throws { append(try Boxing.integer(value, path: nextPath)) }
    mutating func encode(_ value: UInt16) throws { append(try Boxing.integer(value, path: nextPath)) }
    mutating func encode(_ value: UInt32) throws { append(try Boxing.integer(value, path: nextPath)) }
    mutating func encode(_ value: UInt64) throws { append(try Boxing.integer(value, path: nextPath)) }
    mutating func encode<T: Encodable>(_ value: T) throws { append(try Boxing.slot(value, path: nextPath, userInfo: userInfo)) }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy keyType: NestedKey.Type) -> KeyedEncodingContainer<NestedKey> {
        let nested = MapSlot()
        let path = nextPath
        append(.map(nested))
        return KeyedEncodingContainer(KeyedFieldsEncoder<NestedKey>(map: nested, codingPath: path, userInfo: userInfo))
    }

    mutating func nestedUnkeyedContainer() -> any UnkeyedEncodingContainer {
        let nested = ArraySlot()
        let path = nextPath
        append(.array(nested))
        return ArrayEncoder(array: nested, codingPath: path, userInfo: userInfo)
    }

    mutating func superEncoder() -> any Swift.Encoder {
        let e = FirestoreValueEncoder(codingPath: nextPath, userInfo: userInfo)
        append(.deferred(e))
        return e
    }
}

// MARK: - Decoding machinery

/// What every decoder of one `decode` call shares.
fileprivate struct DecodingContext {
    /// The document being decoded, for ``DocumentID``.
    let reference: DocumentReference?
    let userInfo: [CodingUserInfoKey: Any]
}

/// Turns stored values into the types asked for.
fileprivate enum Unboxing {
    private enum Number {
        case signed(Int64), unsigned(UInt64), double(Double)
    }

    private static func number(_ v: Any) -> Number? {
        if type(of: v) is NSNumber.Type, let n = v as? NSNumber {
            switch String(cString: n.objCType) {
            case "f", "d": return .double(n.doubleValue)
            case "C", "S", "I", "L", "Q": return .unsigned(n.uint64Value)
            default: return .signed(n.int64Value)
            }
        }
        switch v {
        case let x as Int: return .signed(Int64(x))
        case let x as Int64: return .signed(x)
        case let x as Int32: return .signed(Int64(x))
        case let x as Int16: return .signed(Int64(x))
        case let x as Int8: return .signed(Int64(x))
        case let x as UInt: return .unsigned(UInt64(x))
        case let x as UInt64: return .unsigned(x)
        case let x as UInt32: return .unsigned(UInt64(x))
        case let x as UInt16: return .unsigned(UInt64(x))
        case let x as UInt8: return .unsigned(UInt64(x))
        case let x as Double: return .double(x)
        case let x as Float: return .double(Double(x))
        default: return nil
        }
    }

    /// What a stored value is, for error messages.
    private static func kind(_ v: Any) -> String {
        if v is NSNull { return "null" }
        if type(of: v) == Bool.self { return "a boolean" }
        switch number(v) {
        case .signed?, .unsigned?: return "an integer"
        case .double?: return "a double"
        case nil: break
        }
        switch v {
        case is String: return "a string"
        case is Data: return "bytes"
        case is Timestamp, is Date: return "a timestamp"
        case is GeoPoint: return "a geo point"
        case is DocumentReference: return "a reference"
        case is [Any]: return "an array"
        case is [String: Any]: return "a map"
        default: return "a value of type \(type(of: v))"
        }
    }

    /// The error for a value that is not a `type`: `valueNotFound` for null, else `typeMismatch`.
    static func mismatch(_ type: Any.Type, _ v: Any, _ path: [any CodingKey]) -> DecodingError {
        if v is NSNull {
            return .valueNotFound(type, .init(codingPath: path, debugDescription: "Expected \(type) value but found null instead."))
        }
        return .typeMismatch(type, .init(codingPath: path, debugDescription: "Expected to decode \(type) but found \(kind(v)) instead."))
    }

    private static func outOfRange(_ type: Any.Type, _ v: Any, _ path: [any CodingKey]) -> DecodingError {
        .dataCorrupted(.init(codingPath: path, debugDescription: "\(v) does not fit in \(type)."))
    }

    static func bool(_ v: Any, _ path: [any CodingKey]) throws -> Bool {
        if type(of: v) == Bool.self, let b = v as? Bool { return b }
        if type(of: v) is NSNumber.Type, let n = v as? NSNumber, ["c", "B"].contains(String(cString: n.objCType)) { return n.boolValue }
        throw mismatch(Bool.self, v, path)
    }

    static func string(_ v: Any, _ path: [any CodingKey]) throws -> String {
        guard let s = v as? String else { throw mismatch(String.self, v, path) }
        return s
    }

    static func integer<I: FixedWidthInteger>(_ v: Any, _ type: I.Type, _ path: [any CodingKey]) throws -> I {
        switch number(v) {
        case .signed(let i)?:
            guard let r = I(exactly: i) else { throw outOfRange(I.self, i, path) }
            return r
        case .unsigned(let u)?:
            guard let r = I(exactly: u) else { throw outOfRange(I.self, u, path) }
            return r
        case .double(let d)? where d.isFinite && d.rounded(.towardZero) == d:
            // A double with no fraction, as JSONDecoder takes it.
            guard let r = I(exactly: d) else { throw outOfRange(I.self, d, path) }
            return r
        default:
            throw mismatch(I.self, v, path)
        }
    }

    static func floatingPoint<F: BinaryFloatingPoint>(_ v: Any, _ type: F.Type, _ path: [any CodingKey]) throws -> F {
        switch number(v) {
        case .signed(let i)?: return F(i)
        case .unsigned(let u)?: return F(u)
        case .double(let d)?:
            let r = F(d)
            if r.isInfinite && d.isFinite { throw outOfRange(F.self, d, path) }
            return r
        case nil:
            throw mismatch(F.self, v, path)
        }
    }

    private static func timestamp(_ v: Any, _ path: [any CodingKey]) throws -> Timestamp {
        switch v {
        case let t as Timestamp: return t
        case let d as Date: return Timestamp(date: d)
        default: throw mismatch(Timestamp.self, v, path)
        }
    }

    private static func cast<T>(_ v: Any, _ type: T.Type, _ path: [any CodingKey]) throws -> T {
        guard let r = v as? T else { throw mismatch(T.self, v, path) }
        return r
    }

    /// `v` decoded as `T`: Firestore's own values as themselves, anything else by its
    /// `init(from:)`.
    static func value<T: Decodable>(_ v: Any, as type: T.Type, path: [any CodingKey], context: DecodingContext) throws -> T {
        if T.self == Timestamp.self { return try timestamp(v, path) as! T }
        if T.self == Date.self {
            if let d = v as? Date { return d as! T }
            return try timestamp(v, path).dateValue() as! T
        }
        if T.self == Data.self { return try cast(v, Data.self, path) as! T }
        if T.self == GeoPoint.self { return try cast(v, GeoPoint.self, path) as! T }
        if T.self == DocumentReference.self { return try cast(v, DocumentReference.self, path) as! T }
        if T.self == URL.self {
            let s = try string(v, path)
            guard let url = URL(string: s) else { throw DecodingError.dataCorrupted(.init(codingPath: path, debugDescription: "invalid URL \"\(s)\"")) }
            return url as! T
        }
        return try T(from: FirestoreValueDecoder(value: v, codingPath: path, context: context))
    }
}

fileprivate final class FirestoreValueDecoder: Swift.Decoder {
    let value: Any
    let codingPath: [any CodingKey]
    let context: DecodingContext
    var userInfo: [CodingUserInfoKey: Any] { context.userInfo }

    init(value: Any, codingPath: [any CodingKey], context: DecodingContext) {
        self.value = value
        self.codingPath = codingPath
        self.context = context
    }

    func container<Key: CodingKey>(keyedBy type: Key.Type) throws -> KeyedDecodingContainer<Key> {
        guard let map = value as? [String: Any] else { throw Unboxing.mismatch([String: Any].self, value, codingPath) }
        return KeyedDecodingContainer(KeyedFieldsDecoder<Key>(map: map, codingPath: codingPath, context: context))
    }

    func unkeyedContainer() throws -> any UnkeyedDecodingContainer {
        guard let array = value as? [Any] else { throw Unboxing.mismatch([Any].self, value, codingPath) }
        return ArrayDecoder(array: array, codingPath: codingPath, context: context)
    }

    func singleValueContainer() throws -> any SingleValueDecodingContainer { self }
}

extension FirestoreValueDecoder: SingleValueDecodingContainer {
    func decodeNil() -> Bool { value is NSNull }
    func decode(_ type: Bool.Type) throws -> Bool { try Unboxing.bool(value, codingPath) }
    func decode(_ type: String.Type) throws -> String { try Unboxing.string(value, codingPath) }
    func decode(_ type: Double.Type) throws -> Double { try Unboxing.floatingPoint(value, type, codingPath) }
    func decode(_ type: Float.Type) throws -> Float { try Unboxing.floatingPoint(value, type, codingPath) }
    func decode(_ type: Int.Type) throws -> Int { try Unboxing.integer(value, type, codingPath) }
    func decode(_ type: Int8.Type) throws -> Int8 { try Unboxing.integer(value, type, codingPath) }
    func decode(_ type: Int16.Type) throws -> Int16 { try Unboxing.integer(value, type, codingPath) }
    func decode(_ type: Int32.Type) throws -> Int32 { try Unboxing.integer(value, type, codingPath) }
    func decode(_ type: Int64.Type) throws -> Int64 { try Unboxing.integer(value, type, codingPath) }
    func decode(_ type: UInt.Type) throws -> UInt { try Unboxing.integer(value, type, codingPath) }
    func decode(_ type: UInt8.Type) throws -> UInt8 { try Unboxing.integer(value, type, codingPath) }
    func decode(_ type: UInt16.Type) throws -> UInt16 { try Unboxing.integer(value, type, codingPath) }
    func decode(_ type: UInt32.Type) throws -> UInt32 { try Unboxing.integer(value, type, codingPath) }
    func decode(_ type: UInt64.Type) throws -> UInt64 { try Unboxing.integer(value, type, codingPath) }
    func decode<T: Decodable>(_ type: T.Type) throws -> T { try Unboxing.value(value, as: type, path: codingPath, context: context) }
}

private struct KeyedFieldsDecoder<Key: CodingKey>: KeyedDecodingContainerProtocol {
    let map: [String: Any]
    let codingPath: [any CodingKey]
    let context: DecodingContext

    var allKeys: [Key] { map.keys.compactMap { Key(stringValue: $0) } }
    func contains(_ key: Key) -> Bool { map[key.stringValue] != nil }

    private func entry(_ key: Key) throws -> Any {
        guard let v = map[key.stringValue] else {
            throw DecodingError.keyNotFound(key, .init(codingPath: codingPath, debugDescription: "No value associated with key \"\(key.stringValue)\"."))
        }
        return v
    }

    func decodeNil(forKey key: Key) throws -> Bool { try entry(key) is NSNull }
    func decode(_ type: Bool.Type, forKey key: Key) throws -> Bool { try Unboxing.bool(entry(key), codingPath + [key]) }
    func decode(_ type: String.Type, forKey key: Key) throws -> String { try Unboxing.string(entry(key), codingPath + [key]) }
    func decode(_ type: Double.Type, forKey key: Key) throws -> Double { try Unboxing.floatingPoint(entry(key), type, codingPath + [key]) }
    func decode(_ type: Float.Type, forKey key: Key) throws -> Float { try Unboxing.floatingPoint(entry(key), type, codingPath + [key]) }
    func decode(_ type: Int.Type, forKey key: Key) throws -> Int { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode(_ type: Int8.Type, forKey key: Key) throws -> Int8 { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode(_ type: Int16.Type, forKey key: Key) throws -> Int16 { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode(_ type: Int32.Type, forKey key: Key) throws -> Int32 { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode(_ type: Int64.Type, forKey key: Key) throws -> Int64 { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode(_ type: UInt.Type, forKey key: Key) throws -> UInt { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode(_ type: UInt8.Type, forKey key: Key) throws -> UInt8 { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode(_ type: UInt16.Type, forKey key: Key) throws -> UInt16 { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode(_ type: UInt32.Type, forKey key: Key) throws -> UInt32 { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode(_ type: UInt64.Type, forKey key: Key) throws -> UInt64 { try Unboxing.integer(entry(key), type, codingPath + [key]) }
    func decode<T: Decodable>(_ type: T.Type, forKey key: Key) throws -> T {
        try Unboxing.value(entry(key), as: type, path: codingPath + [key], context: context)
    }

    func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type, forKey key: Key) throws -> KeyedDecodingContainer<NestedKey> {
        try FirestoreValueDecoder(value: entry(key), codingPath: codingPath + [key], context: context).container(keyedBy: type)
    }

    func nestedUnkeyedContainer(forKey key: Key) throws -> any UnkeyedDecodingContainer {
        try FirestoreValueDecoder(value: entry(key), codingPath: codingPath + [key], context: context).unkeyedContainer()
    }

    /// A decoder for the value at `key` (null when absent, as JSONDecoder does).
    func superDecoder() throws -> any Swift.Decoder {
        FirestoreValueDecoder(value: map[IndexKey.super.stringValue] ?? NSNull(), codingPath: codingPath + [IndexKey.super], context: context)
    }

    func superDecoder(forKey key: Key) throws -> any Swift.Decoder {
        FirestoreValueDecoder(value: map[key.stringValue] ?? NSNull(), codingPath: codingPath + [key], context: context)
    }
}

private struct ArrayDecoder: UnkeyedDecodingContainer {
    let array: [Any]
    let codingPath: [any CodingKey]
    let context: DecodingContext
    private(set) var currentIndex = 0

    init(array: [Any], codingPath: [any CodingKey], context: DecodingContext) {
        self.array = array
        self.codingPath = codingPath
        self.context = context
    }

    var count: Int? { array.count }
    var isAtEnd: Bool { currentIndex >= array.count }

    /// The next element decoded by `body`; moves past it only when that succeeds.
    private mutating func next<T>(_ type: T.Type, _ body: (Any, [any CodingKey]) throws -> T) throws -> T {
        let path = codingPath + [IndexKey(intValue: currentIndex)]
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(T.self, .init(codingPath: path, debugDescription: "Unkeyed container is at end."))
        }
        let r = try body(array[currentIndex], path)
        currentIndex += 1
        return r
    }

    /// Whether the next element is null (moving past it when it is).
    mutating func decodeNil() throws -> Bool {
        guard !isAtEnd else {
            throw DecodingError.valueNotFound(Any?.self, .init(codingPath: codingPath + [IndexKey(intValue: currentIndex)], debugDescription: "Unkeyed container is at end."))
        }
        guard array[currentIndex] is NSNull else { return false }
        currentIndex += 1
        return true
    }

    mutating func decode(_ type: Bool.Type) throws -> Bool { try next(type) { try Unboxing.bool($0, $1) } }
    mutating func decode(_ type: String.Type) throws -> String { try next(type) { try Unboxing.string($0, $1) } }
    mutating func decode(_ type: Double.Type) throws -> Double { try next(type) { try Unboxing.floatingPoint($0, type, $1) } }
    mutating func decode(_ type: Float.Type) throws -> Float { try next(type) { try Unboxing.floatingPoint($0, type, $1) } }
    mutating func decode(_ type: Int.Type) throws -> Int { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode(_ type: Int8.Type) throws -> Int8 { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode(_ type: Int16.Type) throws -> Int16 { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode(_ type: Int32.Type) throws -> Int32 { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode(_ type: Int64.Type) throws -> Int64 { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode(_ type: UInt.Type) throws -> UInt { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode(_ type: UInt8.Type) throws -> UInt8 { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode(_ type: UInt16.Type) throws -> UInt16 { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode(_ type: UInt32.Type) throws -> UInt32 { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode(_ type: UInt64.Type) throws -> UInt64 { try next(type) { try Unboxing.integer($0, type, $1) } }
    mutating func decode<T: Decodable>(_ type: T.Type) throws -> T {
        let context = context
        return try next(type) { try Unboxing.value($0, as: type, path: $1, context: context) }
    }

    mutating func nestedContainer<NestedKey: CodingKey>(keyedBy type: NestedKey.Type) throws -> KeyedDecodingContainer<NestedKey> {
        let context = context
        return try next(KeyedDecodingContainer<NestedKey>.self) { try FirestoreValueDecoder(value: $0, codingPath: $1, context: context).container(keyedBy: type) }
    }

    mutating func nestedUnkeyedContainer() throws -> any UnkeyedDecodingContainer {
        let context = context
        return try next((any UnkeyedDecodingContainer).self) { try FirestoreValueDecoder(value: $0, codingPath: $1, context: context).unkeyedContainer() }
    }

    mutating func superDecoder() throws -> any Swift.Decoder {
        let context = context
        return try next((any Swift.Decoder).self) { FirestoreValueDecoder(value: $0, codingPath: $1, context: context) }
    }
}
