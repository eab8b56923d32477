import Ferry
import Foundation

/// ETags as `ferry-server` makes them: the base64 of the SHA-256 of the value's canonical JSON
/// (keys sorted, numbers as `Value.json` prints them). Opaque to clients.
public enum ETag {
    /// What `if-match: null_etag` means: "only if the location is absent".
    public static let absent = "null_etag"

    /// The ETag of `value` (``absent`` for null).
    public static func of(_ value: Value) -> String {
        if case .null = value { return absent }
        return Data(SHA256.hash(Array(value.json.utf8))).base64EncodedString()
    }
}
