import AsyncHTTPClient
import FerryLog
import FerryTestSupport
import Foundation
import NIOCore
import NIOHTTP1
import NIOSSL

/// How the tests reach `ferry-server`: plaintext (the default), or over TLS with signed tokens —
/// which ``ServerProcess``, ``Client`` and ``TestHTTP/request(_:_:_:headers:body:)`` follow, so
/// a test written for the first runs as is in the second (`TLSTests` runs the sync suite so).
enum ServerMode: Sendable {
    case plaintext
    case tlsWithSignedTokens(SecureSetup)

    @TaskLocal static var current = ServerMode.plaintext

    var secure: SecureSetup? { if case .tlsWithSignedTokens(let s) = self { s } else { nil } }
}

/// A certificate authority and its certificate for the server, signing keys and the files the
/// server is given.
final class SecureSetup: Sendable {
    /// One for every test that runs over TLS: one HTTPS client, one key set, the files made once.
    static let shared = Task { () throws -> SecureSetup in
        let dir = try TemporaryDirectory("tls-setup")
        return try await SecureSetup(in: dir.path, keeping: dir)
    }

    /// Where the files are (removed with the setup).
    private let directory: TemporaryDirectory?
    let certificates: TestCertificates
    let mint: TokenMint
    let serverArguments: [String]
    private let client: HTTPClient
    /// HTTPS clients, by the authority they trust: never shut down (as AsyncHTTPClient's `shared`).
    private static let clients = FerryMutex<[String: HTTPClient]>([:])

    init(in dir: String, keeping directory: TemporaryDirectory? = nil) async throws {
        self.directory = directory
        certificates = try TestCertificates(in: dir)
        mint = try await TokenMint()
        serverArguments = certificates.serverArguments + (try mint.serverArguments(dir))
        var config = HTTPClient.Configuration()
        var tls = TLSConfiguration.makeClientConfiguration()
        tls.trustRoots = .certificates(try NIOSSLCertificate.fromPEMBytes(Array(certificates.authorityPEM.utf8)))
        config.tlsConfiguration = tls
        let pem = certificates.authorityPEM
        client = Self.clients.withLock { all in
            if let c = all[pem] { return c }
            let c = HTTPClient(eventLoopGroupProvider: .singleton, configuration: config)
            all[pem] = c
            return c
        }
    }

    /// One HTTPS request, answered whole (blocking: as the plaintext ``TestHTTP`` is).
    func request(_ port: Int, _ method: String, _ path: String, headers: [String: String], body: [UInt8]?) throws -> TestResponse {
        var request = try HTTPClient.Request(url: "https://127.0.0.1:\(port)\(path)", method: HTTPMethod(rawValue: method))
        for (k, v) in headers { request.headers.add(name: k, value: v) }
        if let body { request.body = .bytes(body) }
        let response = try client.execute(request: request).wait()
        var out: [String: String] = [:]
        for (name, value) in response.headers { out[name.lowercased()] = value }
        return TestResponse(status: Int(response.status.code), headers: out, body: response.body.map { Array(buffer: $0) } ?? [])
    }
}
