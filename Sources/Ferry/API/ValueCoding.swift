import Foundation

/// `Codable` at the edge: values go through JSON text (never into the log). Integers outside
/// `Int64`'s range (`UInt64.max`, say) are refused with ``DatabaseError/Code/invalidData``.
enum ValueCoding {
    static func encode<T: Encodable>(_ value: T) throws -> Value {
        let data: Data
        do {
            data = try JSONEncoder().encode(value)
        } catch {
            throw DatabaseError(.invalidData, "the value could not be encoded: \(error)")
        }
        // JSONEncoder writes every integer type's value in digits alone (a Double never comes
        // out that way beyond 2^53), so an integer literal beyond 64 bits is a UInt64 or a wider
        // integer that cannot be kept exactly: refused rather than stored as a double.
        return try JSON.parse([UInt8](data), integersMustFit: true)
    }

    static func decode<T: Decodable>(_ type: T.Type, from value: Value) throws -> T {
        do {
            return try JSONDecoder().decode(type, from: Data(value.json.utf8))
        } catch {
            throw DatabaseError(.invalidData, "the value could not be decoded as \(T.self): \(error)")
        }
    }
}
