/// An error from the document store, with Firestore's codes (Firebase's `FirestoreErrorCode`):
/// catch it as `catch let error as FirestoreErrorCode where error.code == .unavailable`.
public struct FirestoreErrorCode: Error, Sendable, Hashable, CustomStringConvertible {
    /// Firestore's error codes; the raw values are gRPC's status codes.
    public enum Code: Int, Sendable, Hashable, CustomStringConvertible {
        case ok = 0, cancelled = 1, unknown = 2, invalidArgument = 3, deadlineExceeded = 4, notFound = 5
        case alreadyExists = 6, permissionDenied = 7, resourceExhausted = 8, failedPrecondition = 9
        case aborted = 10, outOfRange = 11, unimplemented = 12, `internal` = 13, unavailable = 14
        case dataLoss = 15, unauthenticated = 16

        public var description: String {
            switch self {
            case .ok: "ok"
            case .cancelled: "cancelled"
            case .unknown: "unknown"
            case .invalidArgument: "invalid argument"
            case .deadlineExceeded: "deadline exceeded"
            case .notFound: "not found"
            case .alreadyExists: "already exists"
            case .permissionDenied: "permission denied"
            case .resourceExhausted: "resource exhausted"
            case .failedPrecondition: "failed precondition"
            case .aborted: "aborted"
            case .outOfRange: "out of range"
            case .unimplemented: "unimplemented"
            case .internal: "internal"
            case .unavailable: "unavailable"
            case .dataLoss: "data loss"
            case .unauthenticated: "unauthenticated"
            }
        }
    }

    /// What kind of failure this is.
    public let code: Code
    /// A sentence saying what went wrong and, where there is one, what to do.
    public let message: String

    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { "\(code): \(message)" }
    public var localizedDescription: String { message }
}

import FerryStore

extension FirestoreErrorCode: LedgerFailure {
    package static func rejectedWrite(_ writeID: Int64) -> FirestoreErrorCode {
        FirestoreErrorCode(.failedPrecondition, "the server refused write batch \(writeID); it was reverted locally")
    }
}
