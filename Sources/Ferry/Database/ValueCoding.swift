import Foundation

/// `Codable` at the edge: values go through JSON text (never into the log).
enum ValueCoding {
    static func encode<T: Encodable>(_ value: T) throws -> Value {
        let data: Data
        do {
            data = try JSONEncoder().encode(value)
        } catch {
            throw DatabaseError(.invalidData, "the value could not be encoded: \(error)")
        }
        return try Value(jsonBytes: [UInt8](data))
    }

    static func decode<T: Decodable>(_ type: T.Type, from value: Value) throws -> T {
        do {
            return try JSONDecoder().decode(type, from: Data(value.json.utf8))
        } catch {
            throw DatabaseError(.invalidData, "the value could not be decoded as \(T.self): \(error)")
        }
    }
}
