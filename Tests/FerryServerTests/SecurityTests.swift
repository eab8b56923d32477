import CryptoExtras
@_spi(Server) import Ferry
import FerryDocuments
import FerryDocumentsSync
import FerryLog
import FerrySync
import FerryTestSupport
import FerryWire
import Foundation
import GRPCCore
import JWTKit
import Testing

/// The claims a test signs.
struct TestClaims: JWTPayload {
    var sub: String
    var iss = TokenMint.issuer
    var aud = TokenMint.audience
    var exp = Int(Date().timeIntervalSince1970) + 3600
    var nbf: Int?
    var iat = Int(Date().timeIntervalSince1970)
    var email_verified: Bool?
    var admin: Bool?
    func verify(using algorithm: some JWTAlgorithm) async throws {}
}

/// Signing keys made by the test, the key set and secret `ferry-server` is given, and tokens.
final class TokenMint: Sendable {
    static let issuer = "https://securetoken.google.com/ferry-test"
    static let audience = "ferry-test"
    static let secret = "a shared secret of at least thirty-two bytes"
    private let rsa = JWTKeyCollection(), ec = JWTKeyCollection(), hmac = JWTKeyCollection(), stranger = JWTKeyCollection()
    /// HS256 with the RSA public key as its secret (an attack on servers that mix the two up).
    private let confused = JWTKeyCollection()
    /// The JSON Web Key Set with the RSA and EC public keys.
    let jwks: String

    init() async throws {
        let rsaKey = try Insecure.RSA.PrivateKey(backing: _RSA.Signing.PrivateKey(keySize: .bits2048))
        await rsa.add(rsa: rsaKey, digestAlgorithm: .sha256, kid: "rsa-1")
        let ecKey = ES256PrivateKey()
        await ec.add(ecdsa: ecKey, kid: "ec-1")
        await hmac.add(hmac: HMACKey(from: Self.secret), digestAlgorithm: .sha256)
        // Another key under a kid the server knows: a token it signs is forged.
        await stranger.add(rsa: try Insecure.RSA.PrivateKey(backing: _RSA.Signing.PrivateKey(keySize: .bits2048)), digestAlgorithm: .sha256, kid: "rsa-1")
        await confused.add(hmac: HMACKey(from: rsaKey.publicKey.pemRepresentation), digestAlgorithm: .sha256, kid: "rsa-1")
        let (n, e) = try rsaKey.publicKey.getKeyPrimitives()
        let (x, y) = ecKey.publicKey.parameters!
        jwks = """
        {"keys": [
          {"kty": "RSA", "kid": "rsa-1", "alg": "RS256", "use": "sig", "n": "\(n.base64URL)", "e": "\(e.base64URL)"},
          {"kty": "EC", "kid": "ec-1", "alg": "ES256", "use": "sig", "crv": "P-256", "x": "\(x)", "y": "\(y)"}
        ]}
        """
    }

    enum Signer { case rs256, es256, hs256, stranger, rs256NamingTheECKey, rs256NamingNoKey, hs256WithTheRSAPublicKey }

    func token(_ signer: Signer, _ claims: TestClaims) async throws -> String {
        switch signer {
        case .rs256: try await rsa.sign(claims, kid: "rsa-1")
        case .es256: try await ec.sign(claims, kid: "ec-1")
        case .hs256: try await hmac.sign(claims)
        case .stranger: try await stranger.sign(claims, kid: "rsa-1")
        case .rs256NamingTheECKey: try await rsa.sign(claims, kid: "ec-1")
        case .rs256NamingNoKey: try await rsa.sign(claims, kid: "nope")
        case .hs256WithTheRSAPublicKey: try await confused.sign(claims, kid: "rsa-1")
        }
    }

    func token(_ signer: Signer, sub: String) async throws -> String { try await token(signer, TestClaims(sub: sub)) }

    /// Writes the key set, the secret and `rules` under `dir`; the server's arguments for them.
    func serverArguments(_ dir: String, rules: String? = nil) throws -> [String] {
        try jwks.write(toFile: dir + "/jwks.json", atomically: true, encoding: .utf8)
        try Self.secret.write(toFile: dir + "/secret", atomically: true, encoding: .utf8)
        var args = ["--jwks-file", dir + "/jwks.json", "--jwt-secret-file", dir + "/secret", "--jwt-issuer", Self.issuer, "--jwt-audience", Self.audience]
        if let rules {
            try rules.write(toFile: dir + "/rules.json", atomically: true, encoding: .utf8)
            args += ["--rules", dir + "/rules.json"]
        }
        return args
    }
}

extension Data {
    var base64URL: String {
        base64EncodedString().replacingOccurrences(of: "+", with: "-").replacingOccurrences(of: "/", with: "_").replacingOccurrences(of: "=", with: "")
    }
}

/// Users' own data, typed and bounded; an append-only log of entries stamped no later than now.
let usersRules = #"""
{"rules": {
  "users": {"$uid": {
    ".read": "auth != null && auth.uid === $uid",
    ".write": "auth.uid === $uid",
    "name": {".validate": "newData.isString() && newData.val().length <= 20"},
    "age": {".validate": "newData.isNumber() && newData.val() >= 0"},
    "$other": {".validate": false}
  }},
  "log": {".read": "auth != null", "$entry": {
    ".write": "auth != null && !data.exists() && newData.exists()",
    ".validate": "newData.hasChildren(['by', 'at']) && newData.child('by').val() === auth.uid && newData.child('at').val() <= now"
  }},
  "verified": {".write": "auth.token.email_verified === true", ".read": true}
}}
"""#

/// `ferry-server` with verified tokens and per-user rules, as real processes on loopback.
@Suite struct SecurityTests {
    func put(_ port: Int, _ path: String, _ json: String, token: String?) throws -> Int {
        try TestHTTP.request(port, "PUT", "\(path).json?ns=t", headers: token.map { ["Authorization": "Bearer \($0)"] } ?? [:], json: json).status
    }

    @Test func eachUserWritesAndReadsUnderTheirOwnUidOnly() async throws {
        let dir = try TemporaryDirectory("security-users")
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules))
        let alice = try await mint.token(.rs256, sub: "alice"), bob = try await mint.token(.es256, sub: "bob")
        let carol = try await mint.token(.hs256, sub: "carol")
        #expect(try put(server.port, "/users/alice/name", #""Alice""#, token: alice) == 200)
        #expect(try put(server.port, "/users/bob/name", #""Bob""#, token: bob) == 200)
        #expect(try put(server.port, "/users/carol/age", "30", token: carol) == 200)
        // Not each other's, and not without a token.
        #expect(try put(server.port, "/users/bob/name", #""Mallory""#, token: alice) == 401)
        #expect(try put(server.port, "/users/bob", #"{"name": "Mallory"}"#, token: alice) == 401)
        #expect(try put(server.port, "/users/bob/name", #""Mallory""#, token: nil) == 401)
        #expect(try put(server.port, "/users", #"{}"#, token: alice) == 401)
        #expect(try TestHTTP.request(server.port, "GET", "/users/bob.json?ns=t", headers: ["Authorization": "Bearer \(alice)"]).status == 401)
        #expect(try TestHTTP.request(server.port, "GET", "/users/alice.json?ns=t", headers: ["Authorization": "Bearer \(alice)"]).json == ["name": "Alice"])
        #expect(try TestHTTP.request(server.port, "GET", "/users/alice.json?ns=t&auth=\(alice)").json == ["name": "Alice"])
        // A claim in a rule.
        let verified = try await mint.token(.hs256, TestClaims(sub: "dave", email_verified: true))
        #expect(try put(server.port, "/verified/dave", "1", token: verified) == 200)
        #expect(try put(server.port, "/verified/erin", "1", token: try await mint.token(.hs256, TestClaims(sub: "erin", email_verified: false))) == 401)
        #expect(try serverValue(server.port, "/users") == ["alice": ["name": "Alice"], "bob": ["name": "Bob"], "carol": ["age": 30]])
        #expect(server.terminate() == 0)
    }

    @Test func validateRefusesAWrongTypeOrATooLongStringAloneInABatchAndWholeInAnUpdate() async throws {
        let dir = try TemporaryDirectory("security-validate")
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules))
        let alice = try await mint.token(.rs256, sub: "alice")
        #expect(try put(server.port, "/users/alice/name", "5", token: alice) == 401)
        #expect(try put(server.port, "/users/alice/name", #""a name far longer than twenty""#, token: alice) == 401)
        #expect(try put(server.port, "/users/alice/age", #""old""#, token: alice) == 401)
        #expect(try put(server.port, "/users/alice/shoe", "42", token: alice) == 401)
        #expect(try put(server.port, "/users/alice", #"{"name": "Alice", "shoe": 42}"#, token: alice) == 401)
        #expect(try put(server.port, "/users/alice", #"{"name": "Alice", "age": 7}"#, token: alice) == 200)
        // A multi-path update is judged whole: one bad location refuses all of it.
        let update = try TestHTTP.request(server.port, "PATCH", "/users/alice.json?ns=t", headers: ["Authorization": "Bearer \(alice)"], json: #"{"name": "Alicia", "age": -1}"#)
        #expect(update.status == 401)
        // Deleting passes .validate (it judges only what is left non-null).
        #expect(try TestHTTP.request(server.port, "DELETE", "/users/alice/age.json?ns=t", headers: ["Authorization": "Bearer \(alice)"]).status == 200)
        // In a batch, a refused write is rejected alone.
        let store = "0123456789abcdef0123456789abcdef"
        let batch = """
        {"client": "\(store)", "acked": 0, "writes": [
          {"id": 1, "op": "set", "path": "/users/alice/name", "data": "Al"},
          {"id": 2, "op": "set", "path": "/users/alice/age", "data": "seven"},
          {"id": 3, "op": "update", "path": "/users/alice", "data": {"age": 8}},
          {"id": 4, "op": "set", "path": "/users/bob/name", "data": "Bob"}
        ]}
        """
        let r = try TestHTTP.request(server.port, "POST", "/.ferry/batch.json?ns=t", headers: ["Authorization": "Bearer \(alice)"], json: batch)
        guard case .object(let o)? = r.json, case .array(let results)? = o["results"] else {
            Issue.record("no results: \(r.text)")
            return
        }
        let statuses: [Value?] = results.map { if case .object(let w) = $0 { w["status"] } else { nil } }
        #expect(statuses == [200, 401, 200, 401])
        #expect(try serverValue(server.port, "/users") == ["alice": ["name": "Al", "age": 8]])
        #expect(server.terminate() == 0)
    }

    @Test func dataAndNewDataRulesKeepALogAppendOnlyAndItsTimesNoLaterThanNow() async throws {
        let dir = try TemporaryDirectory("security-log")
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules))
        let alice = try await mint.token(.hs256, sub: "alice")
        #expect(try put(server.port, "/log/e1", #"{"by": "alice", "at": {".sv": "timestamp"}}"#, token: alice) == 200)
        // Not again (append-only), not as someone else, not in the future, not without its fields.
        #expect(try put(server.port, "/log/e1", #"{"by": "alice", "at": 1}"#, token: alice) == 401)
        #expect(try TestHTTP.request(server.port, "DELETE", "/log/e1.json?ns=t", headers: ["Authorization": "Bearer \(alice)"]).status == 401)
        #expect(try put(server.port, "/log/e2", #"{"by": "bob", "at": 1}"#, token: alice) == 401)
        let tomorrow = Int64(Date().timeIntervalSince1970 * 1000) + 86_400_000
        #expect(try put(server.port, "/log/e3", #"{"by": "alice", "at": \#(tomorrow)}"#, token: alice) == 401)
        #expect(try put(server.port, "/log/e4", #"{"by": "alice"}"#, token: alice) == 401)
        #expect(try put(server.port, "/log/e5", #"{"by": "alice", "at": 1}"#, token: alice) == 200)
        guard case .object(let log)? = try serverValue(server.port, "/log") else { Issue.record("no log"); return }
        #expect(Set(log.keys) == ["e1", "e5"])
        #expect(server.terminate() == 0)
    }

    @Test func everyBadTokenIsRefusedAndWritesNothing() async throws {
        let dir = try TemporaryDirectory("security-tokens")
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: #"{"rules": {".read": "auth != null", ".write": "auth != null"}}"#))
        let now = Int(Date().timeIntervalSince1970)
        let good = try await mint.token(.rs256, sub: "alice")
        let parts = good.split(separator: ".").map(String.init)
        let otherPayload = Data(#"{"sub":"mallory","iss":"\#(TokenMint.issuer)","aud":"\#(TokenMint.audience)","exp":\#(now + 3600)}"#.utf8).base64URL
        let none = Data(#"{"alg":"none","typ":"JWT"}"#.utf8).base64URL
        var bad: [(String, String)] = [
            ("a forged signature (the payload changed)", "\(parts[0]).\(otherPayload).\(parts[2])"),
            ("signed by the wrong key", try await mint.token(.stranger, sub: "alice")),
            ("RS256 naming the EC key", try await mint.token(.rs256NamingTheECKey, sub: "alice")),
            ("a kid the key set does not have", try await mint.token(.rs256NamingNoKey, sub: "alice")),
            ("HS256 with the RSA public key as its secret", try await mint.token(.hs256WithTheRSAPublicKey, sub: "alice")),
            ("the wrong audience", try await mint.token(.rs256, TestClaims(sub: "alice", aud: "another-project"))),
            ("the wrong issuer", try await mint.token(.es256, TestClaims(sub: "alice", iss: "https://evil.example"))),
            ("expired", try await mint.token(.hs256, TestClaims(sub: "alice", exp: now - 600))),
            ("not yet valid", try await mint.token(.hs256, TestClaims(sub: "alice", nbf: now + 600))),
            ("alg none", "\(none).\(otherPayload)."),
            ("no subject", try await mint.token(.hs256, TestClaims(sub: ""))),
            ("garbage", "not.a.token"),
        ]
        // Within the clock-skew allowance: accepted.
        #expect(try put(server.port, "/skew", "1", token: try await mint.token(.hs256, TestClaims(sub: "alice", exp: now - 5))) == 200)
        bad.append(("a word the server does not know", "owner-but-not-quite"))
        for (i, (what, token)) in bad.enumerated() {
            #expect(try put(server.port, "/w\(i)", "1", token: token) == 401, "\(what)")
            #expect(try TestHTTP.request(server.port, "GET", "/skew.json?ns=t", headers: ["Authorization": "Bearer \(token)"]).status == 401, "\(what)")
        }
        #expect(try put(server.port, "/w", "1", token: good) == 200)
        #expect(try serverValue(server.port, "/") == ["skew": 1, "w": 1])
        #expect(server.terminate() == 0)
    }

    @Test func ownerIsTheAdministratorOnlyInEmulatorModeAndAnAdminCredentialOrClaimIsOtherwise() async throws {
        let dir = try TemporaryDirectory("security-admin")
        let mint = try await TokenMint()
        try "the-admin-credential".write(toFile: dir.path + "/admin", atomically: true, encoding: .utf8)
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules)
                                       + ["--no-emulator", "--admin-token-file", dir.path + "/admin", "--admin-claim", "admin"])
        #expect(!server.process.outputLines.contains { $0.hasPrefix("emulator mode") })
        #expect(try put(server.port, "/users/bob/name", #""x""#, token: "owner") == 401)
        #expect(try TestHTTP.request(server.port, "PUT", "/.settings/rules.json?ns=t", headers: ["Authorization": "Bearer owner"], json: #"{"rules": {".write": true}}"#).status == 401)
        #expect(try put(server.port, "/users/bob/name", #""by the admin""#, token: "the-admin-credential") == 200)
        let claimed = try await mint.token(.es256, TestClaims(sub: "ops", admin: true))
        #expect(try put(server.port, "/anything", "1", token: claimed) == 200)
        #expect(try TestHTTP.request(server.port, "GET", "/.settings/rules.json?ns=t", headers: ["Authorization": "Bearer \(claimed)"]).status == 200)
        #expect(server.terminate() == 0)

        // On loopback by default, emulator mode says so.
        let emulator = try ServerProcess(data: dir.sub("emulator"))
        #expect(emulator.process.outputLines.contains { $0.hasPrefix("emulator mode") })
        #expect(try put(emulator.port, "/x", "1", token: "owner") == 200)
        #expect(emulator.terminate() == 0)
    }

    @Test func listeningBeyondLoopbackNeedsVerifiedTokensAndRulesOrSayingSo() async throws {
        let dir = try TemporaryDirectory("security-public")
        let mint = try await TokenMint()
        let server = Locations.executable("ferry-server")
        let base = ["--port", "0", "--data", dir.sub("data"), "--host", "0.0.0.0"]
        for refused in [[], ["--emulator"], try mint.serverArguments(dir.path), try mint.serverArguments(dir.path, rules: usersRules) + ["--token", "dev"]] {
            let r = try run(server, base + refused)
            #expect(r.status == 1 && r.stderr.contains("so many words"), "\(refused): \(r.stderr)")
        }
        for accepted in [["--insecure-public"], try mint.serverArguments(dir.path, rules: usersRules)] {
            let p = try ChildProcess(server, base + accepted)
            #expect(p.waitForLine { $0.hasPrefix("listening on ") }, "\(accepted)")
            p.kill9()
        }
        // Rules that do not parse refuse the start, naming the rule and the character.
        try #"{"rules": {"a": {".read": "auth.uid ==="}}}"#.write(toFile: dir.path + "/broken.json", atomically: true, encoding: .utf8)
        let broken = try run(server, ["--port", "0", "--data", dir.sub("data"), "--rules", dir.path + "/broken.json"])
        #expect(broken.status == 1 && broken.stderr.contains(".read at /a") && broken.stderr.contains("character 13"), "\(broken.stderr)")
    }

    @Test func rulesThatDoNotParseAreRefusedWithTheirPositionAndTheOldOnesStay() async throws {
        let dir = try TemporaryDirectory("security-upload")
        let server = try ServerProcess(data: dir.path)
        #expect(try setRules(server.port, #"{"rules": {".read": true, ".write": "auth != null"}}"#))
        let cases: [(String, String)] = [
            (#"{"rules": {".write": "auth.uid === "}}"#, "character 14"),
            (#"{"rules": {"users": {"$uid": {".write": "$user === auth.uid"}}}}"#, "unknown variable $user"),
            (#"{"rules": {".read": "newData.exists()"}}"#, "newData is not available"),
            (#"{"rules": {".write": "data.frobnicate()"}}"#, "unknown method frobnicate()"),
            (#"{"rules": {".write": "auth.token.email.matches(/(ab/)"}}"#, "invalid regular expression"),
            (#"{"rules": {"$a": {}, "$b": {}}}"#, "two $ children"),
            (#"{"rules": {".write": 3}}"#, "must be a boolean"),
        ]
        for (rules, message) in cases {
            let r = try TestHTTP.request(server.port, "PUT", "/.settings/rules.json?ns=t", headers: ["Authorization": "Bearer owner"], json: rules)
            #expect(r.status == 400 && r.text.contains(message), "\(rules): \(r.text)")
        }
        #expect(try TestHTTP.request(server.port, "GET", "/.settings/rules.json?ns=t", headers: ["Authorization": "Bearer owner"]).json
                == ["rules": [".read": true, ".write": "auth != null"]])
        #expect(try put(server.port, "/x", "1", token: nil) == 401)
        #expect(server.terminate() == 0)
    }

    @Test func aWriteIDReplayedByAnotherCallerReadsNothing() async throws {
        let dir = try TemporaryDirectory("security-replay")
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules))
        let alice = try await mint.token(.rs256, sub: "alice")
        #expect(try put(server.port, "/users/alice/name", #""secret""#, token: alice) == 200)
        // A refused write with a high id marks it processed; one below it is a duplicate, whose
        // answer must not show data the caller may not read.
        let store = "00000000000000000000000000000bad"
        let first = try TestHTTP.request(server.port, "PUT", "/users/alice/name.json?ns=t", headers: ["X-Ferry-Write": "\(store)/100"], json: #""x""#)
        #expect(first.status == 401)
        let replay = try TestHTTP.request(server.port, "PUT", "/users/alice/name.json?ns=t", headers: ["X-Ferry-Write": "\(store)/5"], json: #""x""#)
        #expect(!replay.text.contains("secret"), "\(replay.text)")
        #expect(try serverValue(server.port, "/users/alice/name") == "secret")
        #expect(server.terminate() == 0)
    }

    @Test func aListenerWhoseReadIsRevokedByAWriteGetsCancel() async throws {
        let dir = try TemporaryDirectory("security-members")
        let mint = try await TokenMint()
        let rules = #"{"rules": {"rooms": {"$room": {".read": "root.child('members/' + $room + '/' + auth.uid).exists()"}}}}"#
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: rules))
        let alice = try await mint.token(.rs256, sub: "alice")
        #expect(try TestHTTP.request(server.port, "PUT", "/.json?ns=t", headers: ["Authorization": "Bearer owner"],
                                     json: #"{"members": {"r1": {"alice": true}}, "rooms": {"r1": {"topic": "hi"}}}"#).status == 200)
        let stream = try StreamReader(port: server.port, path: "/rooms/r1.json?ns=t", headers: ["Authorization": "Bearer \(alice)"])
        #expect(try stream.next(skippingKeepAlive: true) == .put("/", ["topic": "hi"]))
        #expect(try TestHTTP.request(server.port, "DELETE", "/members/r1/alice.json?ns=t", headers: ["Authorization": "Bearer owner"]).status == 200)
        #expect(try stream.next(skippingKeepAlive: true) == .cancel)
        #expect(server.terminate() == 0)
    }

    @Test func aListenerWhoseReadIsRevokedGetsCancel() async throws {
        let dir = try TemporaryDirectory("security-cancel")
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules))
        let alice = try await mint.token(.rs256, sub: "alice"), bob = try await mint.token(.rs256, sub: "bob")
        // Bob may not listen to Alice's data at all.
        let refused = try TestHTTP.request(server.port, "GET", "/users/alice.json?ns=t", headers: ["Authorization": "Bearer \(bob)", "Accept": "text/event-stream"])
        #expect(refused.status == 401)
        // Alice listens to her own; the rules change so that she may not: her stream is cancelled.
        #expect(try put(server.port, "/users/alice/name", #""Alice""#, token: alice) == 200)
        let stream = try StreamReader(port: server.port, path: "/users/alice.json?ns=t", headers: ["Authorization": "Bearer \(alice)"])
        #expect(try stream.next(skippingKeepAlive: true) == .put("/", ["name": "Alice"]))
        #expect(try setRules(server.port, #"{"rules": {"users": {"$uid": {".read": false}}}}"#))
        #expect(try stream.next(skippingKeepAlive: true) == .cancel)
        #expect(server.terminate() == 0)
    }

    @Test func firestoresAPIFollowsTheSameIdentityRules() async throws {
        let dir = try TemporaryDirectory("security-firestore")
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules)
                                       + ["--no-emulator", "--admin-claim", "admin", "--firestore-port", "0"])
        let user = try await mint.token(.rs256, sub: "alice")
        let admin = try await mint.token(.es256, TestClaims(sub: "ops", admin: true))
        let expired = try await mint.token(.hs256, TestClaims(sub: "alice", exp: Int(Date().timeIntervalSince1970) - 3600))
        try await RawFirestore.with(server.firestorePort!) { fs, _ in
            func commit(_ token: String?) async -> RPCError.Code? {
                var md = Metadata()
                if let token { md.addString("Bearer \(token)", forKey: "authorization") }
                let write = RawFirestore.set("cities/SF", ["by": "someone"])
                return await FirestoreServerTests.code { _ = try await fs.commit(request: ClientRequest(message: RawFirestore.commit([write]), metadata: md)) }
            }
            #expect(await commit(admin) == nil)
            // With no Firestore rules, a user may not use the API outside emulator mode.
            #expect(await commit(user) == .permissionDenied)
            for refused in ["owner", expired, "forged.\(user.split(separator: ".")[1]).x"] {
                #expect(await commit(refused) == .unauthenticated, "\(refused)")
            }
            #expect(await commit(nil) == .permissionDenied)
        }
        // The emulator's clear-data request is the administrator's too.
        let clear = "/emulator/v1/projects/raw/databases/(default)/documents"
        #expect(try TestHTTP.request(server.port, "DELETE", clear).status == 401)
        #expect(try TestHTTP.request(server.port, "DELETE", clear, headers: ["Authorization": "Bearer \(user)"]).status == 401)
        #expect(try TestHTTP.request(server.port, "DELETE", clear, headers: ["Authorization": "Bearer \(admin)"]).status == 200)
        #expect(server.terminate() == 0)
    }

    @Test func ferrySyncWithSignedTokensKeepsToItsUserAndAsksAgainWhenOneExpires() async throws {
        let dir = try TemporaryDirectory("security-sync")
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules))
        let issued = FerryMutex(0)
        let a = try await Client(dir.sub("a"), port: server.port) { options in
            options.tokenProvider = { _ in
                // The first token has expired beyond the skew allowance; the next ones are fresh.
                let n = issued.withLock { $0 += 1; return $0 }
                let exp = Int(Date().timeIntervalSince1970) + (n == 1 ? -600 : 3600)
                return try await mint.token(.es256, TestClaims(sub: "alice", exp: exp))
            }
        }
        await a.sync.goOnline()
        let mine = try await a.db.reference("users/alice/name").setValue("Alice")
        _ = try await mine.serverAcknowledgement()
        #expect(issued.withLock { $0 } >= 2)
        // A write the rules refuse is rejected alone, and reverted.
        let theirs = try await a.db.reference("users/bob/name").setValue("Mallory")
        await #expect(throws: (any Error).self) { try await theirs.serverAcknowledgement() }
        let bad = try await a.db.reference("users/alice/age").setValue("old")
        await #expect(throws: (any Error).self) { try await bad.serverAcknowledgement() }
        #expect(await eventually { (try? a.db.rejectedWrites().count) == 2 })
        #expect(try serverValue(server.port, "/users") == ["alice": ["name": "Alice"]])
        try await a.close()
        #expect(server.terminate() == 0)
    }

    /// A document store syncing through a token provider: a token the server refuses (expired)
    /// makes the connection ask the provider again, with `forceRefresh`, and the writes go on.
    @Test func documentSyncAsksItsTokenProviderAgainWhenTheServerRefusesAToken() async throws {
        let dir = try TemporaryDirectory("security-documents")
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules)
                                       + ["--no-emulator", "--admin-claim", "admin", "--firestore-port", "0"])
        let asked = FerryMutex<[Bool]>([])
        var target = FirestoreConnection.Server(host: "127.0.0.1", port: server.firestorePort!, project: "docs", token: nil)
        target.tokenProvider = { forceRefresh in
            // The first token has expired beyond the skew allowance; the next ones are fresh.
            let n = asked.withLock { $0.append(forceRefresh); return $0.count }
            let exp = Int(Date().timeIntervalSince1970) + (n == 1 ? -600 : 3600)
            return try await mint.token(.es256, TestClaims(sub: "ops", exp: exp, admin: true))
        }
        let db = try Firestore.open(at: dir.sub("docs"))
        let connection = try FirestoreConnection.connect(db, to: target)
        let sf = db.collection("cities").document("SF")
        try await sf.setData(["name": "San Francisco"])
        #expect(await eventually { (try? await sf.getDocument(source: .server))?.data()?["name"] as? String == "San Francisco" }, "committed, and read back")
        try await db.waitForPendingWrites()
        let calls = asked.withLock { $0 }
        #expect(calls.count >= 2 && calls[0] == false && calls[1] == true, "\(calls)")
        await connection.close()
        try await db.terminate()
        #expect(server.terminate() == 0)
    }
}
