@_spi(Server) import Ferry
import FerryLog
import Foundation
import JWTKit

/// How signed ID tokens (JWTs) are verified: Firebase Authentication's, or any OpenID
/// provider's (RS256 or ES256 against a JWKS), or HS256 tokens made with a shared secret.
public struct TokenVerification: Sendable {
    /// The JSON Web Key Set (`{"keys": [...]}`) whose RS256 and ES256 keys sign tokens, as
    /// identity providers publish it. Each key needs its `kid`.
    public var jwks: String?
    /// The secret of HS256 tokens.
    public var hmacSecret: String?
    /// The `iss` every token must carry (Firebase: `https://securetoken.google.com/PROJECT`).
    public var issuer: String
    /// The audience every token must name in `aud` (Firebase: the project id).
    public var audience: String
    /// How far `exp` and `nbf` may be off from the server's clock.
    public var clockSkewSeconds: Double = 60

    public init(jwks: String? = nil, hmacSecret: String? = nil, issuer: String, audience: String) {
        self.jwks = jwks
        self.hmacSecret = hmacSecret
        self.issuer = issuer
        self.audience = audience
    }
}

/// A token that does not verify, and why (for the log; the client only gets 401).
struct TokenRejection: Error, CustomStringConvertible {
    var reason: String
    var description: String { reason }
}

/// Verifies signed tokens and keeps each verified one until it expires (a bounded cache: a
/// token is verified once, not on every request).
final class TokenVerifier: Sendable {
    private let configuration: TokenVerification
    /// The keys: RS256/ES256 ones from the key set, the HS256 secret (added on first use: jwt-kit's collection is an actor).
    private let keys: Task<(asymmetric: JWTKeyCollection, symmetric: JWTKeyCollection), Never>
    /// The key type (`RSA`, `EC`) of each JWKS key, by `kid`: an RS256 token must name an RSA
    /// key, an ES256 one an EC key.
    private let keyTypes: [String: String]
    private let verified = FerryMutex<[String: (claims: [String: Value], expires: Double)]>([:])
    private static let cacheLimit = 10_000

    /// - Throws: ``TokenRejection`` when the key set is not a JWKS whose keys have a `kid`, or
    ///   neither a key set nor a secret is given.
    init(_ configuration: TokenVerification) throws(TokenRejection) {
        self.configuration = configuration
        var types: [String: String] = [:]
        var set: JWKS?
        if let jwks = configuration.jwks {
            guard case .object(let o)? = try? Value(json: jwks), case .array(let keys)? = o["keys"], !keys.isEmpty else {
                throw TokenRejection(reason: "the key set is not a JWKS ({\"keys\": [...]}) with at least one key")
            }
            for key in keys {
                guard case .object(let k) = key, case .string(let kid)? = k["kid"], case .string(let kty)? = k["kty"] else {
                    throw TokenRejection(reason: "each key of the key set needs a kid and a kty")
                }
                types[kid] = kty
            }
            do { set = try JSONDecoder().decode(JWKS.self, from: Data(jwks.utf8)) } catch {
                throw TokenRejection(reason: "the key set cannot be read: \(error)")
            }
        }
        if let secret = configuration.hmacSecret, secret.utf8.count < 32 {
            throw TokenRejection(reason: "the HS256 secret must be at least 32 bytes")
        }
        guard configuration.jwks != nil || configuration.hmacSecret != nil else {
            throw TokenRejection(reason: "token verification needs a key set or a secret")
        }
        keyTypes = types
        keys = Task { [set] in
            let asymmetric = JWTKeyCollection(), symmetric = JWTKeyCollection()
            // One at a time: a key jwt-kit cannot use verifies nothing, and does not lose the others.
            for key in set?.keys ?? [] { _ = try? await asymmetric.add(jwk: key) }
            if let secret = configuration.hmacSecret { await symmetric.add(hmac: HMACKey(from: secret), digestAlgorithm: .sha256) }
            return (asymmetric, symmetric)
        }
    }

    /// Whether `token` has the shape of a JWT (three dot-separated parts).
    static func looksSigned(_ token: String) -> Bool {
        token.utf8.count(where: { $0 == UInt8(ascii: ".") }) == 2
    }

    /// The verified claims of `token`.
    ///
    /// - Throws: ``TokenRejection``: a malformed token, an algorithm other than RS256, ES256 or
    ///   HS256 (`none` included), a key the server does not have, a signature that does not
    ///   verify, the wrong issuer or audience, expired or not yet valid.
    func claims(_ token: String) async throws(TokenRejection) -> [String: Value] {
        let now = Date().timeIntervalSince1970
        if let hit = verified.withLock({ $0[token] }), hit.expires + configuration.clockSkewSeconds > now { return hit.claims }
        let parts = token.split(separator: ".", omittingEmptySubsequences: false)
        guard parts.count == 3, case .object(let header)? = Self.decodePart(parts[0]), case .object(let claims)? = Self.decodePart(parts[1]) else {
            throw TokenRejection(reason: "not a JWT")
        }
        guard case .string(let alg)? = header["alg"] else { throw TokenRejection(reason: "the token names no algorithm") }
        let collections = await keys.value
        let keys: JWTKeyCollection
        switch alg {
        case "HS256":
            guard configuration.hmacSecret != nil else { throw TokenRejection(reason: "HS256 tokens are not accepted (no secret)") }
            keys = collections.symmetric
        case "RS256", "ES256":
            guard case .string(let kid)? = header["kid"], let kty = keyTypes[kid] else { throw TokenRejection(reason: "the token's kid names no key of the key set") }
            guard kty == (alg == "RS256" ? "RSA" : "EC") else { throw TokenRejection(reason: "\(alg) with a \(kty) key") }
            keys = collections.asymmetric
        default:
            throw TokenRejection(reason: "the algorithm \(alg) is not accepted")
        }
        do { _ = try await keys.verify(token, as: SignedClaims.self) } catch {
            throw TokenRejection(reason: "the signature does not verify (\(error))")
        }
        let skew = configuration.clockSkewSeconds
        guard let exp = claims["exp"]?.number else { throw TokenRejection(reason: "the token has no exp") }
        guard exp + skew > now else { throw TokenRejection(reason: "the token expired") }
        if let nbf = claims["nbf"]?.number, nbf - skew > now { throw TokenRejection(reason: "the token is not valid yet") }
        if let iat = claims["iat"]?.number, iat - skew > now { throw TokenRejection(reason: "the token was issued in the future") }
        guard claims["iss"] == .string(configuration.issuer) else { throw TokenRejection(reason: "the token's issuer is not \(configuration.issuer)") }
        let audiences: [Value] = if case .array(let a)? = claims["aud"] { a } else { claims["aud"].map { [$0] } ?? [] }
        guard audiences.contains(.string(configuration.audience)) else { throw TokenRejection(reason: "the token is not for \(configuration.audience)") }
        guard case .string(let sub)? = claims["sub"], !sub.isEmpty, sub.utf8.count <= 128 else { throw TokenRejection(reason: "the token's sub must be 1 to 128 bytes") }
        verified.withLock { cache in
            if cache.count >= Self.cacheLimit { cache.removeAll(keepingCapacity: true) }
            cache[token] = (claims, exp)
        }
        return claims
    }

    /// A base64url part of a token, as JSON.
    private static func decodePart(_ part: Substring) -> Value? {
        var s = part.replacingOccurrences(of: "-", with: "+").replacingOccurrences(of: "_", with: "/")
        while s.utf8.count % 4 != 0 { s += "=" }
        guard let data = Data(base64Encoded: s) else { return nil }
        return try? Value(jsonBytes: Array(data))
    }
}

/// What jwt-kit decodes while it checks the signature; the claims themselves are checked by
/// ``TokenVerifier`` (with the clock-skew allowance).
private struct SignedClaims: JWTPayload {
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}
