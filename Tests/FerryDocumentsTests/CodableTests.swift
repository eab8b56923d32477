import Foundation
import Testing

@testable import FerryDocuments

@Suite struct CodableTests {
    enum Color: String, Codable { case red, green }
    enum Level: Int, Codable { case low = 1, high = 2 }

    struct Address: Codable, Equatable {
        var street: String
        var zip: Int
    }

    struct Everything: Codable, Equatable {
        var string: String
        var bool: Bool
        var int: Int
        var int8: Int8
        var int32: Int32
        var int64: Int64
        var uint8: UInt8
        var uint64: UInt64
        var double: Double
        var float: Float
        var date: Date
        var timestamp: Timestamp
        var geo: GeoPoint
        var bytes: Data
        var ref: DocumentReference
        var url: URL
        var color: Color
        var level: Level
        var address: Address
        var addresses: [Address]
        var tags: [String]
        var optionalTags: [String?]
        var counts: [String: Int]
        var missingString: String?
        var presentInt: Int?
        var missingAddress: Address?
        var presentAddress: Address?
    }

    struct City: Codable, Equatable {
        @DocumentID var id: String?
        var name: String
    }

    struct CityByReference: Codable {
        @DocumentID var ref: DocumentReference? = nil
        var name: String
    }

    struct Post: Codable {
        var title: String
        @ServerTimestamp var createdAt: Date?
        @ServerTimestamp var editedAt: Timestamp?
    }

    struct Counter: Encodable {
        var name: String
        var visits: FieldValue
    }

    struct Big: Codable {
        var n: UInt64
    }

    struct Small: Codable {
        var n: Int8
    }

    struct Measures: Codable {
        var d: Double
        var f: Float
        var u: UInt16
    }

    /// Writes `note` with `encode(_:forKey:)` (not `encodeIfPresent`), and `gone` with `encodeNil`.
    struct ExplicitNulls: Encodable {
        var note: String?
        enum CodingKeys: CodingKey { case note, gone }
        func encode(to encoder: any Encoder) throws {
            var c = encoder.container(keyedBy: CodingKeys.self)
            try c.encode(note, forKey: .note)
            try c.encodeNil(forKey: .gone)
        }
    }

    func everything(_ db: Firestore) -> Everything {
        Everything(
            string: "héllo", bool: true, int: -42, int8: -8, int32: 1 << 30, int64: .min, uint8: 255, uint64: UInt64(Int64.max),
            double: 3.25, float: 1.5, date: Date(timeIntervalSince1970: 1_700_000_000.5),
            timestamp: Timestamp(seconds: 1_700_000_000, nanoseconds: 123_456_000), geo: GeoPoint(latitude: 48.85, longitude: 2.35),
            bytes: Data([0, 1, 2, 255]), ref: db.document("cities/SF"), url: URL(string: "https://example.com/a?b=c")!,
            color: .green, level: .high, address: Address(street: "Main", zip: 94105),
            addresses: [Address(street: "A", zip: 1), Address(street: "B", zip: 2)], tags: ["x", "y"], optionalTags: ["a", nil],
            counts: ["a": 1, "b": 2], missingString: nil, presentInt: 7, missingAddress: nil, presentAddress: Address(street: "P", zip: 3))
    }

    @Test func aStructRoundTripsWithEveryFieldType() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("c/everything")
        let value = everything(db)
        try await ref.setData(from: value)
        let snap = try await ref.getDocument(source: .cache)
        #expect(try snap.data(as: Everything.self) == value)

        // Stored as Firestore's own values, not field by field.
        let data = try #require(snap.data())
        #expect(data["date"] as? Timestamp == Timestamp(seconds: 1_700_000_000, nanoseconds: 500_000_000))
        #expect(data["timestamp"] as? Timestamp == value.timestamp)
        #expect(data["geo"] as? GeoPoint == value.geo)
        #expect(data["bytes"] as? Data == Data([0, 1, 2, 255]))
        #expect((data["ref"] as? DocumentReference)?.path == "cities/SF")
        #expect(data["url"] as? String == "https://example.com/a?b=c")
        #expect(data["float"] as? Double == 1.5)
        #expect(data["uint8"] as? Int == 255)
        #expect(data["color"] as? String == "green")
        #expect(data["level"] as? Int == 2)
        #expect(same(data["address"], ["street": "Main", "zip": 94105] as [String: Any]))
        #expect(same(data["optionalTags"], ["a", NSNull()] as [Any]))
        // nil optionals are left out.
        #expect(data["missingString"] == nil && data["missingAddress"] == nil)
        #expect(data["presentInt"] as? Int == 7)
    }

    @Test func firestoreValuesPassThroughTheEncoderUnchanged() throws {
        let db = Firestore.inMemory()
        let fields = try Firestore.Encoder().encode(everything(db))
        #expect(fields["timestamp"] is Timestamp)
        #expect(fields["date"] is Timestamp)
        #expect(fields["geo"] is GeoPoint)
        #expect(fields["ref"] is DocumentReference)
        #expect(fields["bytes"] is Data)
        #expect(fields["int64"] as? Int == Int(Int64.min))
        #expect(fields["addresses"] is [Any])
        #expect(fields["address"] is [String: Any])

        let counter = try Firestore.Encoder().encode(Counter(name: "c", visits: .increment(Int64(2))))
        #expect(counter["visits"] is FieldValue)
    }

    @Test func aFieldValueInAStructIsAppliedAsATransform() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("c/counter")
        try await ref.setData(["name": "c", "visits": 40])
        try await ref.setData(from: Counter(name: "c", visits: .increment(Int64(2))), merge: true)
        #expect(try await ref.getDocument(source: .cache).get("visits") as? Int == 42)
    }

    @Test func anExplicitNilIsWrittenAsNull() throws {
        let fields = try Firestore.Encoder().encode(ExplicitNulls(note: nil))
        #expect(fields["note"] is NSNull)
        #expect(fields["gone"] is NSNull)
        #expect(fields.count == 2)
    }

    @Test func documentIDIsFilledOnReadAndNeverWrittenAsAField() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("cities/SF")
        try await ref.setData(from: City(id: "ignored", name: "San Francisco"))
        let snap = try await ref.getDocument(source: .cache)
        let data = try #require(snap.data())
        #expect(data["id"] == nil)
        #expect(data.count == 1)
        let city = try snap.data(as: City.self)
        #expect(city.id == "SF")
        #expect(city.name == "San Francisco")
        #expect(try snap.data(as: CityByReference.self).ref == ref)
        try await db.document("cities/NY").setData(from: CityByReference(name: "New York"))
        #expect(try await db.document("cities/NY").getDocument(source: .cache).data()?.keys.sorted() == ["name"])

        // Added documents get their automatic id.
        let added = try await db.collection("cities").addDocument(from: City(id: nil, name: "LA"))
        let read = try await added.getDocument(source: .cache).data(as: City.self)
        #expect(read.id == added.documentID && read.id?.count == 20)

        // Without a reference, the decoder leaves it nil.
        #expect(try Firestore.Decoder().decode(City.self, from: ["name": "x"]).id == nil)
        #expect(try Firestore.Decoder().decode(City.self, from: ["name": "x"], in: ref).id == "SF")
    }

    @Test func aNilServerTimestampIsWrittenAsAPendingServerTimestamp() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("posts/1")
        let edited = Timestamp(seconds: 1_600_000_000, nanoseconds: 0)
        try await ref.setData(from: Post(title: "hi", createdAt: nil, editedAt: edited))
        let snap = try await ref.getDocument(source: .cache)

        let none = try snap.data(as: Post.self)
        #expect(none.createdAt == nil)
        #expect(none.editedAt == edited)
        #expect(snap.data()?["createdAt"] is NSNull)

        let estimate = try snap.data(as: Post.self, with: .estimate)
        let created = try #require(estimate.createdAt)
        #expect(abs(created.timeIntervalSinceNow) < 600)
        #expect(estimate.editedAt == edited)

        // A set timestamp is written as it is; a missing field decodes as nil.
        let when = Date(timeIntervalSince1970: 1_500_000_000)
        try await ref.setData(from: Post(title: "again", createdAt: when, editedAt: nil))
        let again = try await ref.getDocument(source: .cache)
        #expect(try again.data(as: Post.self).createdAt == when)
        #expect(try Firestore.Decoder().decode(Post.self, from: ["title": "t"]).createdAt == nil)
    }

    @Test func aValueOfTheWrongTypeThrowsTypeMismatchWithItsPath() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("cities/bad")
        try await ref.setData(["name": 42])
        let snap = try await ref.getDocument(source: .cache)
        let error = try #require(#expect(throws: DecodingError.self) { try snap.data(as: City.self) })
        guard case .typeMismatch(_, let context) = error else { Issue.record("not a type mismatch: \(error)"); return }
        #expect(context.codingPath.map(\.stringValue) == ["name"])

        let nested = try #require(#expect(throws: DecodingError.self) {
            try Firestore.Decoder().decode([String: Address].self, from: ["home": ["street": true, "zip": 1]])
        })
        guard case .typeMismatch(_, let nestedContext) = nested else { Issue.record("not a type mismatch: \(nested)"); return }
        #expect(nestedContext.codingPath.map(\.stringValue) == ["home", "street"])

        let inArray = try #require(#expect(throws: DecodingError.self) {
            try Firestore.Decoder().decode([String: [Address]].self, from: ["list": [["street": "a", "zip": 1], ["street": "b", "zip": "2"]]])
        })
        guard case .typeMismatch(_, let arrayContext) = inArray else { Issue.record("not a type mismatch: \(inArray)"); return }
        #expect(arrayContext.codingPath.map(\.stringValue) == ["list", "1", "zip"])

        #expect(throws: DecodingError.self) { try Firestore.Decoder().decode(Small.self, from: ["n": true]) }
        #expect(throws: DecodingError.self) { try Firestore.Decoder().decode(Measures.self, from: ["d": "1", "f": 1, "u": 1]) }
        #expect(throws: DecodingError.self) { try Firestore.Decoder().decode(Post.self, from: ["title": "t", "createdAt": "yesterday"]) }
    }

    @Test func aMissingNonOptionalKeyThrowsKeyNotFound() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("cities/empty")
        try await ref.setData(["population": 1])
        let snap = try await ref.getDocument(source: .cache)
        let error = try #require(#expect(throws: DecodingError.self) { try snap.data(as: City.self) })
        guard case .keyNotFound(let key, _) = error else { Issue.record("not keyNotFound: \(error)"); return }
        #expect(key.stringValue == "name")
    }

    @Test func nullForANonOptionalThrowsValueNotFound() throws {
        let error = try #require(#expect(throws: DecodingError.self) { try Firestore.Decoder().decode(City.self, from: ["name": NSNull()]) })
        guard case .valueNotFound = error else { Issue.record("not valueNotFound: \(error)"); return }
    }

    @Test func numbersDecodeIntoAnyTypeThatHoldsThem() throws {
        let m = try Firestore.Decoder().decode(Measures.self, from: ["d": 3, "f": 2, "u": 65535])
        #expect(m.d == 3 && m.f == 2 && m.u == 65535)
        #expect(try Firestore.Decoder().decode(Small.self, from: ["n": 4.0]).n == 4)
        #expect(throws: DecodingError.self) { try Firestore.Decoder().decode(Small.self, from: ["n": 300]) }
        #expect(throws: DecodingError.self) { try Firestore.Decoder().decode(Small.self, from: ["n": 1.5]) }
        #expect(throws: DecodingError.self) { try Firestore.Decoder().decode(Measures.self, from: ["d": 1, "f": 1, "u": -1]) }
        #expect(throws: DecodingError.self) { try Firestore.Decoder().decode(Measures.self, from: ["d": 1, "f": 1e300, "u": 1]) }
    }

    @Test func aTopLevelValueThatIsNotAMapThrowsInvalidArgument() async throws {
        for value in [[1, 2, 3] as any Encodable, 42, "text", Timestamp(seconds: 1, nanoseconds: 0), Optional<City>.none] {
            let error = try #require(#expect(throws: FirestoreErrorCode.self) { try Firestore.Encoder().encode(value) })
            #expect(error.code == .invalidArgument)
        }
        let db = Firestore.inMemory()
        await #expect(throws: FirestoreErrorCode.self) { try await db.document("c/array").setData(from: ["a", "b"]) }
        // A dictionary with String keys is a map.
        #expect(try Firestore.Encoder().encode(["a": 1])["a"] as? Int == 1)
    }

    @Test func anUnsignedIntegerAboveInt64MaxThrows() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("c/big")
        await #expect(throws: EncodingError.self) { try await ref.setData(from: Big(n: .max)) }
        await #expect(throws: FirestoreErrorCode.self) { try await ref.getDocument(source: .cache) }  // nothing written
        try await ref.setData(from: Big(n: UInt64(Int64.max)))
        #expect(try await ref.getDocument(source: .cache).data(as: Big.self).n == UInt64(Int64.max))
    }

    @Test func dataAsOnADocumentThatDoesNotExistThrowsNotFound() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("cities/gone")
        try await ref.setData(["name": "x"])
        try await ref.delete()
        let snap = try await ref.getDocument(source: .cache)
        #expect(!snap.exists)
        let error = try #require(#expect(throws: FirestoreErrorCode.self) { try snap.data(as: City.self) })
        #expect(error.code == .notFound)
    }

    @Test func mergeAndMergeFieldsWriteOnlyPartOfTheStruct() async throws {
        let db = Firestore.inMemory()
        let ref = db.document("cities/SF")
        try await ref.setData(["name": "old", "population": 5])
        try await ref.setData(from: City(id: nil, name: "San Francisco"), merge: true)
        var data = try #require(try await ref.getDocument(source: .cache).data())
        #expect(same(data, ["name": "San Francisco", "population": 5] as [String: Any]))

        try await ref.setData(from: Address(street: "Main", zip: 1), mergeFields: ["zip"])
        data = try #require(try await ref.getDocument(source: .cache).data())
        #expect(same(data, ["name": "San Francisco", "population": 5, "zip": 1] as [String: Any]))
    }

    @Test func aWriteBatchWritesEncodedValues() async throws {
        let db = Firestore.inMemory()
        let a = db.document("cities/A"), b = db.document("cities/B")
        try await b.setData(["name": "old", "population": 5])
        let batch = db.batch()
        try batch.setData(from: City(id: nil, name: "Alpha"), forDocument: a)
        try batch.setData(from: City(id: nil, name: "Beta"), forDocument: b, merge: true)
        #expect(throws: FirestoreErrorCode.self) { try batch.setData(from: [1], forDocument: a) }
        try await batch.commit()
        #expect(try await a.getDocument(source: .cache).data(as: City.self) == City(id: "A", name: "Alpha"))
        #expect(same(try await b.getDocument(source: .cache).data(), ["name": "Beta", "population": 5] as [String: Any]))
    }

    @Test func firestoreOnlyValuesRefuseOtherEncoders() {
        let db = Firestore.inMemory()
        #expect(throws: EncodingError.self) { try JSONEncoder().encode([db.document("a/b")]) }
        #expect(throws: EncodingError.self) { try JSONEncoder().encode([FieldValue.serverTimestamp()]) }
        // The wrappers encode their value with other encoders.
        #expect(throws: Never.self) { try JSONEncoder().encode(City(id: "x", name: "y")) }
    }
}
