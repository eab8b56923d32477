@_spi(Server) import Ferry

/// Who a request speaks for.
enum Caller: Sendable {
    /// The administrator (emulator mode's `Bearer owner`, the configured admin credential, or a
    /// verified token with the admin claim): rules do not apply.
    case owner
    /// A verified user: `auth` in rules (`{"uid", "provider", "token": {claims}}`).
    case user(Value)
    /// No token (`auth == null`).
    case anonymous

    /// `auth` in rules: nil for anonymous callers (and for the owner, whom rules do not judge).
    var auth: Value? {
        if case .user(let a) = self { return a }
        return nil
    }

    var authenticated: Bool { if case .anonymous = self { false } else { true } }

    /// As stored with a presence registration: `"owner"`, `"anonymous"` or the user's `auth`.
    var stored: Value {
        switch self {
        case .owner: "owner"
        case .anonymous: "anonymous"
        case .user(let auth): auth
        }
    }

    /// A stored caller (``stored``; `"user"`, from before `auth` was kept, is a user without claims).
    init?(stored: Value) {
        switch stored {
        case "owner": self = .owner
        case "anonymous": self = .anonymous
        case "user": self = .user(.object([:]))
        case .object: self = .user(stored)
        default: return nil
        }
    }

    /// `auth` for a user with `uid` and these verified `claims`.
    static func user(uid: String, claims: [String: Value]) -> Caller {
        var provider: Value = "custom"
        if case .object(let firebase)? = claims["firebase"], let p = firebase["sign_in_provider"] { provider = p }
        return .user(.object(["uid": .string(uid), "provider": provider, "token": .object(claims)]))
    }
}
