import AsyncHTTPClient
@_spi(Server) import Ferry
import FerryLog
import FerryWire
import Foundation
import NIOCore
import NIOHTTP1
import NIOSSL

/// Where a database lives on a server: `http://127.0.0.1:9000?ns=NAME`, or
/// `https://NAME.firebaseio.com` (namespace from the host).
public struct ServerAddress: Sendable, Equatable, CustomStringConvertible {
    /// Scheme, host and port, without a trailing slash: `http://127.0.0.1:9000`.
    public var base: String
    /// The namespace (`ns`).
    public var namespace: String
    /// Whether requests carry `?ns=` (a local server) or not (the namespace is in the host).
    var namespaceInQuery: Bool

    /// Parses a server URL.
    ///
    /// - Throws: ``SyncError`` (`invalidURL`) naming what is wrong.
    public init(_ url: String) throws {
        guard let c = URLComponents(string: url), let scheme = c.scheme, scheme == "http" || scheme == "https",
              let host = c.host, !host.isEmpty
        else { throw SyncError(.invalidURL, "not an http(s) URL with a host: \(url)") }
        let ns = c.queryItems?.first { $0.name == "ns" }?.value
        base = "\(scheme)://\(host)" + (c.port.map { ":\($0)" } ?? "")
        if let ns, !ns.isEmpty {
            namespace = ns
            namespaceInQuery = true
        } else if let label = host.split(separator: ".").first, host.contains(".") && !host.allSatisfy({ $0.isNumber || $0 == "." }) {
            namespace = String(label)
            namespaceInQuery = false
        } else {
            throw SyncError(.invalidURL, "no namespace: give one as ?ns=NAME (\(url))")
        }
    }

    /// The URL as given (`http://127.0.0.1:9000?ns=NAME`).
    public var description: String { namespaceInQuery ? "\(base)?ns=\(namespace)" : base }

    /// The URL of a location (`/a/b`) with query parameters.
    func url(_ path: String, _ parameters: [String: String] = [:]) -> String {
        let keys = path.split(separator: "/").map { String($0).addingPercentEncoding(withAllowedCharacters: Self.keyCharacters) ?? String($0) }
        var query = parameters
        if namespaceInQuery { query["ns"] = namespace }
        let q = query.keys.sorted().map { k in
            "\(k)=\(query[k]!.addingPercentEncoding(withAllowedCharacters: Self.valueCharacters) ?? query[k]!)"
        }.joined(separator: "&")
        return base + "/" + keys.joined(separator: "/") + ".json" + (q.isEmpty ? "" : "?" + q)
    }

    private static let keyCharacters = CharacterSet.alphanumerics.union(CharacterSet(charactersIn: "-_~!*'(),;:@+"))
    private static let valueCharacters = CharacterSet.alphanumerics.union(CharacterSet(charactersIn: "-_.~"))
}

/// Why sync could not do something.
public struct SyncError: Error, Sendable, CustomStringConvertible, Equatable {
    /// The kind of failure.
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        let name: String
        /// The server URL cannot be used.
        public static let invalidURL = Code(name: "invalid URL")
        /// The trusted certificates given are not PEM certificates.
        public static let invalidCertificates = Code(name: "invalid certificates")
        /// The server cannot be reached, or answered 5xx (a retry may succeed).
        public static let unavailable = Code(name: "unavailable")
        /// The token was not accepted (401 other than "Permission denied").
        public static let unauthenticated = Code(name: "unauthenticated")
        /// The server refused the request (4xx), with its message.
        public static let rejected = Code(name: "rejected")
        /// The server answered something that is not the protocol.
        public static let badAnswer = Code(name: "bad answer")
        /// A transaction's data changed on the server more than 25 times in a row.
        public static let tooManyRetries = Code(name: "too many retries")
        /// The sync client is closed.
        public static let closed = Code(name: "closed")
        /// The code's name.
        public var description: String { name }
    }
    /// The kind of failure.
    public var code: Code
    /// What happened.
    public var message: String
    /// The HTTP status, when the server answered.
    public var status: Int?

    /// An error of `code` saying `message`, with the server's status if it answered.
    public init(_ code: Code, _ message: String, status: Int? = nil) {
        self.code = code
        self.message = message
        self.status = status
    }

    /// Code, message and status.
    public var description: String { "\(code): \(message)" + (status.map { " (HTTP \($0))" } ?? "") }
}

/// An answer read whole.
struct Answer: Sendable {
    var status: Int
    var headers: HTTPHeaders
    var body: [UInt8]
    /// The server's clock at the midpoint of the request minus ours, when it said.
    var clockOffset: Int64?

    var value: Value? { body.isEmpty ? nil : try? Value(jsonBytes: body) }
    var errorMessage: String {
        if case .object(let o)? = value, case .string(let m)? = o["error"] { return m }
        return String(decoding: body.prefix(200), as: UTF8.self)
    }
    var isSuccess: Bool { (200..<300).contains(status) }
    /// A 401 that means "get a new token", not a rules denial.
    var isTokenProblem: Bool { status == 401 && errorMessage != "Permission denied" }
}

/// The HTTP side of a sync client.
struct Transport: Sendable {
    let address: ServerAddress
    let timeout: TimeAmount
    private let clients: Clients

    /// HTTP clients for the process (as AsyncHTTPClient's own `shared`), never shut down: a
    /// sync client dropped without ``SyncClient/close()`` leaks no connection pool and trips no
    /// assertion. Writes go through one that does not follow redirects; reads (listens and
    /// `GET`s) through one that does: the Realtime Database redirects a stream (307) to the
    /// machine that holds its data, and its clients must follow.
    private struct Clients: Sendable {
        let writing: HTTPClient
        let reading: HTTPClient
    }

    /// The clients trusting the system's certificate authorities, and those trusting others
    /// (by their PEM text): one pair per set of authorities in the process.
    private static let system = Clients(writing: makeClient(followingRedirects: false, trustRoots: nil),
                                        reading: makeClient(followingRedirects: true, trustRoots: nil))
    private static let custom = FerryMutex<[String: Clients]>([:])

    init(address: ServerAddress, timeout: TimeAmount, trusting pem: String? = nil) throws {
        self.address = address
        self.timeout = timeout
        guard let pem else {
            clients = Self.system
            return
        }
        let certificates: [NIOSSLCertificate]
        do { certificates = try NIOSSLCertificate.fromPEMBytes(Array(pem.utf8)) } catch {
            throw SyncError(.invalidCertificates, "the trusted certificates are not PEM certificates: \(error)")
        }
        guard !certificates.isEmpty else { throw SyncError(.invalidCertificates, "the trusted certificates hold no certificate") }
        clients = Self.custom.withLock { all in
            if let c = all[pem] { return c }
            let c = Clients(writing: Self.makeClient(followingRedirects: false, trustRoots: certificates),
                            reading: Self.makeClient(followingRedirects: true, trustRoots: certificates))
            all[pem] = c
            return c
        }
    }

    /// The client for a request of `method` (see ``Clients``).
    func client(for method: HTTPMethod) -> HTTPClient { method == .GET ? clients.reading : clients.writing }

    private static func makeClient(followingRedirects: Bool, trustRoots: [NIOSSLCertificate]?) -> HTTPClient {
        var config = HTTPClient.Configuration()
        if let trustRoots {
            var tls = TLSConfiguration.makeClientConfiguration()
            tls.trustRoots = .certificates(trustRoots)
            config.tlsConfiguration = tls
        }
        // Each listen holds a streaming request; do not queue them behind a per-host limit. Idle
        // connections close before ferry-server's (120 s) would: a request sent on a connection
        // the server is closing fails, and a write's outcome is then unknown.
        config.connectionPool = .init(idleTimeout: .seconds(30), concurrentHTTP1ConnectionsPerHostSoftLimit: 100_000)
        config.timeout = .init(connect: .seconds(5))
        // Writes do not follow redirects: one sent on to another address (a captive portal, a
        // misrouted proxy) and answered 2xx there would count as the server's acknowledgement of
        // a write the server never saw. A 3xx to a write is an unavailable server, retried and
        // logged with where it pointed (`SyncClient.send`).
        config.redirectConfiguration = followingRedirects ? .follow(max: 5, allowCycles: false) : .disallow
        return HTTPClient(eventLoopGroupProvider: .singleton, configuration: config)
    }

    func request(_ method: HTTPMethod, _ path: String, parameters: [String: String] = [:],
                 headers: [(String, String)] = [], body: [UInt8]? = nil, token: String?) -> HTTPClientRequest {
        var r = HTTPClientRequest(url: address.url(path, parameters))
        r.method = method
        if let token { r.headers.add(name: "Authorization", value: "Bearer \(token)") }
        for (n, v) in headers { r.headers.add(name: n, value: v) }
        if let body {
            r.headers.add(name: "Content-Type", value: "application/json")
            r.body = .bytes(ByteBuffer(bytes: body))
        }
        return r
    }

    /// Sends a request and reads its whole answer.
    ///
    /// - Throws: ``SyncError`` (`unavailable`) when the server cannot be reached or the answer
    ///   does not arrive in time.
    func send(_ request: HTTPClientRequest, maxBytes: Int = 512 << 20) async throws -> Answer {
        let start = wallClockMillis()
        do {
            let response = try await client(for: request.method).execute(request, timeout: timeout)
            let body = try await response.body.collect(upTo: maxBytes)
            let end = wallClockMillis()
            var offset: Int64?
            if let t = response.headers.first(name: WireHeader.serverTime).flatMap(Int64.init) {
                offset = t - (start + end) / 2
            } else if let date = response.headers.first(name: "Date").flatMap(Self.httpDate) {
                // A foreign server: its Date header has one-second resolution; less is noise.
                let o = date - (start + end) / 2
                offset = abs(o) > 1500 ? o : 0
            }
            return Answer(status: Int(response.status.code), headers: response.headers, body: Array(buffer: body), clockOffset: offset)
        } catch let e as SyncError {
            throw e
        } catch is CancellationError {
            throw CancellationError()
        } catch {
            if Task.isCancelled { throw CancellationError() }
            throw SyncError(.unavailable, "\(request.method) \(request.url): \(error)")
        }
    }
}

extension Transport {
    /// Milliseconds since 1970 of an HTTP date (`Tue, 24 Nov 2026 03:37:48 GMT`), at the
    /// middle of its second.
    static func httpDate(_ text: String) -> Int64? {
        let f = DateFormatter()
        f.locale = Locale(identifier: "en_US_POSIX")
        f.timeZone = TimeZone(identifier: "GMT")
        f.dateFormat = "EEE, dd MMM yyyy HH:mm:ss zzz"
        return f.date(from: text).map { Int64($0.timeIntervalSince1970 * 1000) + 500 }
    }
}

func wallClockMillis() -> Int64 { Int64((Date().timeIntervalSince1970 * 1000).rounded()) }
