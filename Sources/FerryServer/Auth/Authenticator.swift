@_spi(Server) import Ferry
import FerryLog
import Foundation

/// Decides whom a request's bearer token speaks for:
/// - no token: an anonymous caller (`auth == null`);
/// - in emulator mode, `owner`: the administrator (firebase-admin's convention; with
///   `auth_variable_override` it acts as the user it names, under the rules);
/// - the configured admin token (compared in constant time), or a verified token carrying the
///   admin claim: the administrator;
/// - a signed token that verifies (``TokenVerifier``): that user, `auth.uid` its `sub`;
/// - a development token of the configuration (`UID:SECRET`, or a bare token that is its own
///   uid): that user;
/// - anything else: refused (401).
final class Authenticator: Sendable {
    let emulator: Bool
    private let adminToken: [UInt8]?
    private let adminClaim: String?
    private let verifier: TokenVerifier?
    /// The development tokens accepted now: the configuration's, until the owner replaces them.
    let tokens: FerryMutex<Set<String>>

    init(emulator: Bool, adminToken: String?, adminClaim: String?, verifier: TokenVerifier?, tokens: Set<String>) {
        self.emulator = emulator
        self.adminToken = adminToken.map { Array($0.utf8) }
        self.adminClaim = adminClaim
        self.verifier = verifier
        self.tokens = FerryMutex(tokens)
    }

    /// The caller for `token` (the bearer token or `auth` parameter; nil: none), acting as
    /// `override` (`auth_variable_override`: JSON, `null` or an object) when the administrator.
    func caller(token: String?, override: String? = nil) async -> Result<Caller, TokenRejection> {
        guard let token else { return .success(.anonymous) }
        let caller: Caller
        if (emulator && token == "owner") || isAdminToken(token) {
            caller = .owner
        } else if let verifier, TokenVerifier.looksSigned(token) {
            do {
                let claims = try await verifier.claims(token)
                if let adminClaim, claims[adminClaim] == .bool(true) {
                    caller = .owner
                } else {
                    guard case .string(let uid)? = claims["sub"] else { return .failure(TokenRejection(reason: "no sub")) }
                    caller = .user(uid: uid, claims: claims)
                }
            } catch {
                return .failure(error)
            }
        } else if tokens.withLock({ $0.contains(token) }) {
            let uid = token.split(separator: ":", maxSplits: 1).first.map(String.init) ?? token
            caller = .user(uid: uid, claims: ["sub": .string(uid)])
        } else {
            return .failure(TokenRejection(reason: "the token is not one this server accepts"))
        }
        guard case .owner = caller, let override else { return .success(caller) }
        switch try? Value(json: override) {
        case .null?: return .success(.anonymous)
        case .object(let o)?:
            var auth = o
            if auth["token"] == nil { auth["token"] = .object(o) }
            return .success(.user(.object(auth)))
        default: return .failure(TokenRejection(reason: "auth_variable_override must be null or a JSON object"))
        }
    }

    /// Compares with the admin token in time independent of where they differ.
    private func isAdminToken(_ token: String) -> Bool {
        guard let adminToken else { return false }
        let t = Array(token.utf8)
        var difference = UInt8(t.count == adminToken.count ? 0 : 1)
        for i in 0..<adminToken.count { difference |= adminToken[i] ^ (i < t.count ? t[i] : 0) }
        return difference == 0
    }
}
