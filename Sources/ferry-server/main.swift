import ArgumentParser
import Dispatch
import FerryServer
import Foundation
import Logging
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

/// `ferry-server`: the Realtime Database REST + streaming protocol over Ferry stores.
struct FerryServerCommand: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ferry-server",
        abstract: "Serves Ferry stores over the Firebase Realtime Database REST + streaming protocol.",
        discussion: """
        Prints "listening on HOST:PORT" on stdout once it accepts connections. SIGTERM stops \
        accepting, finishes the requests in flight and closes the stores.
        Exit codes: 0 stopped by SIGTERM/SIGINT, 1 cannot start (bad address, port in use).
        """
    )

    @Option(help: "The port to listen on (0: pick a free one and print it).")
    var port: Int = 9000

    @Option(help: "The directory for the stores (one per namespace, under ns/NAME).")
    var data: String

    @Option(help: "The address to listen on.")
    var host: String = "127.0.0.1"

    @Option(name: .customLong("token"), help: "A development token accepted as a user (repeatable): UID:SECRET is the user UID; a token without a colon is its own uid.")
    var tokens: [String] = []

    @Flag(inversion: .prefixedNo, help: "Emulator mode: 'Bearer owner' is the administrator (default: on for a loopback --host, off otherwise).")
    var emulator: Bool?

    @Option(help: "A file holding a credential that makes its bearer the administrator.")
    var adminTokenFile: String?

    @Option(help: "A claim that makes the bearer of a verified token carrying it as true the administrator.")
    var adminClaim: String?

    @Option(help: "A JSON Web Key Set file: RS256 and ES256 ID tokens signed by its keys are verified (needs --jwt-issuer and --jwt-audience).")
    var jwksFile: String?

    @Option(help: "A file holding the secret of HS256 ID tokens (at least 32 bytes).")
    var jwtSecretFile: String?

    @Option(help: "The issuer (iss) every ID token must carry; Firebase: https://securetoken.google.com/PROJECT.")
    var jwtIssuer: String?

    @Option(help: "The audience (aud) every ID token must name; Firebase: the project id.")
    var jwtAudience: String?

    @Option(help: "A rules file ({\"rules\": {...}}) for every namespace that has not set its own.")
    var rules: String?

    @Option(help: "A PEM file with the TLS certificate chain (the server's certificate first); with --tls-key, every API is served over TLS.")
    var tlsCert: String?

    @Option(help: "A PEM file with the TLS certificate's private key.")
    var tlsKey: String?

    @Option(help: "The least severe messages logged: trace, debug, info, notice, warning, error or critical.")
    var logLevel: Logger.Level = .info

    @Flag(help: "Listen beyond loopback without verified tokens and rules, or in emulator mode: anyone who reaches the port may read and write.")
    var insecurePublic = false

    @Option(help: "The largest request body in bytes.")
    var maxBody: Int = 16 * 1024 * 1024

    @Option(help: "Seconds of silence after which a stream gets a keep-alive event.")
    var keepAlive: Int = 30

    @Option(help: "Seconds a client may take to send a whole request before it is disconnected.")
    var requestTimeout: Int = 30

    @Option(help: "Seconds an answered connection may wait for its next request before it is closed.")
    var idleTimeout: Int = 120

    @Option(help: "The most connections open at once (idle, busy or streaming); more are answered 503 and closed.")
    var maxConnections: Int = 16_384

    @Option(help: "The most bytes a stream (an event stream, or a Firestore Listen) may have waiting for a client that does not read; past it the stream is closed.")
    var maxStreamBuffer: Int = 16 * 1024 * 1024

    @Option(help: "The most recent commits each namespace keeps for streams that resume (Last-Event-ID); older ones get the whole value.")
    var historyCommits: Int = 100_000

    @Option(help: "About the most bytes of data those commits may hold.")
    var historyBytes: Int = 64 * 1024 * 1024

    @Option(help: "Also serve Cloud Firestore's gRPC API (google.firestore.v1.Firestore, plaintext HTTP/2) on this port (0: pick a free one). Its databases live under DATA/firestore.")
    var firestorePort: Int?

    @Option(help: "A Firestore database writes a checkpoint (and deletes the log below it) once the commits since the last one weigh this many bytes (and the last checkpoint), and on shutdown (when they weigh an eighth of the last one).")
    var firestoreCheckpointBytes: Int = 32 << 20

    @Option(help: "Seconds a disconnected client's onDisconnect writes wait: after a restart, for it to connect again; on a silent connection, for its acknowledgements.")
    var presenceTimeout: Int = 60

    @Option(help: "Keep the Realtime Database namespaces in this PostgreSQL database, shared with other ferry-server processes: postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE[?sslmode=disable|prefer|require]. The schema is created at start when missing. Default: a Ferry store per namespace under --data.")
    var postgres: String?

    @Option(help: "With --postgres: seconds a group of writes may wait for a connection and its namespace's lock (or a read for other servers' commits) before it is answered 503.")
    var storageTimeout: Int = 10

    func run() throws {
        let level = logLevel
        LoggingSystem.bootstrap { label in
            var handler = StreamLogHandler.standardError(label: label)
            handler.logLevel = level
            return handler
        }
        signal(SIGPIPE, SIG_IGN)
        raiseFileLimit()
        var config = ServerConfiguration(dataDirectory: data)
        config.host = host
        config.port = port
        config.tokens = Set(tokens)
        config.emulatorMode = emulator
        config.allowInsecurePublic = insecurePublic
        config.adminClaim = adminClaim
        switch (tlsCert, tlsKey) {
        case (let cert?, let key?): config.tls = TLSFiles(certificateChain: cert, privateKey: key)
        case (nil, nil): break
        default: throw ValidationError("TLS needs both --tls-cert and --tls-key")
        }
        do {
            config.adminToken = try adminTokenFile.map { try Self.secret(from: $0) }
            config.defaultRules = try rules.map { try String(contentsOfFile: $0, encoding: .utf8) }
            if jwksFile != nil || jwtSecretFile != nil {
                guard let jwtIssuer, let jwtAudience else { throw ValidationError("verifying ID tokens needs --jwt-issuer and --jwt-audience") }
                config.tokenVerification = TokenVerification(jwks: try jwksFile.map { try String(contentsOfFile: $0, encoding: .utf8) },
                                                             hmacSecret: try jwtSecretFile.map { try Self.secret(from: $0) },
                                                             issuer: jwtIssuer, audience: jwtAudience)
            }
        } catch let e as ValidationError {
            throw e
        } catch {
            FileHandle.standardError.write(Data("ferry-server: \(error)\n".utf8))
            throw ExitCode(1)
        }
        config.maxBody = maxBody
        config.keepAliveSeconds = max(1, keepAlive)
        config.requestTimeoutSeconds = max(1, requestTimeout)
        config.idleTimeoutSeconds = max(1, idleTimeout)
        config.maxConnections = max(1, maxConnections)
        config.maxStreamBufferBytes = max(1, maxStreamBuffer)
        config.historyCommits = max(0, historyCommits)
        config.historyBytes = max(0, historyBytes)
        config.presenceTimeoutSeconds = max(1, presenceTimeout)
        config.firestorePort = firestorePort
        config.firestoreCheckpointBytes = max(1, firestoreCheckpointBytes)
        config.storageWaitSeconds = max(1, storageTimeout)
        if let postgres {
            do { config.postgres = try Self.startPostgres(postgres, leaseSeconds: config.presenceTimeoutSeconds) } catch {
                FileHandle.standardError.write(Data("ferry-server: PostgreSQL: \(error)\n".utf8))
                throw ExitCode(1)
            }
        }
        let server = FerryServer(configuration: config)
        // The signal handlers are in place before "listening on" is printed: a SIGTERM sent as
        // soon as the line is seen is never lost (one sent between SIG_IGN and a handler was).
        var sources: [any DispatchSourceSignal] = []
        for sig in [SIGTERM, SIGINT] {
            signal(sig, SIG_IGN)
            let source = DispatchSource.makeSignalSource(signal: sig, queue: .global())
            source.setEventHandler {
                Task {
                    await server.shutdown()
                    Foundation.exit(0)
                }
            }
            source.resume()
            sources.append(source)
        }
        let bound: Int
        do { bound = try server.start() } catch {
            FileHandle.standardError.write(Data("ferry-server: \(error)\n".utf8))
            throw ExitCode(1)
        }
        if firestorePort != nil {
            // Printed before "listening on", which says the server is ready.
            let started = Mutex<Result<Int, any Error>?>(nil)
            let done = DispatchSemaphore(value: 0)
            Task {
                let result: Result<Int, any Error>
                do { result = .success(try await server.startFirestore()) } catch { result = .failure(error) }
                started.withLock { $0 = result }
                done.signal()
            }
            done.wait()
            switch started.withLock({ $0 })! {
            case .success(let port):
                FileHandle.standardOutput.write(Data("firestore listening on \(host):\(port)\n".utf8))
            case .failure(let error):
                FileHandle.standardError.write(Data("ferry-server: \(error)\n".utf8))
                throw ExitCode(1)
            }
        }
        if server.isEmulator {
            FileHandle.standardOutput.write(Data("emulator mode: 'Bearer owner' is the administrator\n".utf8))
        }
        FileHandle.standardOutput.write(Data("listening on \(host):\(bound)\n".utf8))
        withExtendedLifetime(sources) { dispatchMain() }
    }
}

extension Logger.Level: @retroactive ExpressibleByArgument {}

extension FerryServerCommand {
    /// Connects to the database at `url` and creates its schema when missing (before the server
    /// listens).
    static func startPostgres(_ url: String, leaseSeconds: Int) throws -> PostgresBackend {
        let backend = try PostgresBackend(url: url, leaseSeconds: leaseSeconds, logger: Logger(label: "ferry-server.postgres"))
        let started = Mutex<(any Error)??>(nil)
        let done = DispatchSemaphore(value: 0)
        Task {
            do { try await backend.start(); started.withLock { $0 = .some(nil) } } catch { started.withLock { $0 = .some(error) } }
            done.signal()
        }
        done.wait()
        if case .some(let error?) = started.withLock({ $0 }) { throw error }
        return backend
    }
}

extension FerryServerCommand {
    /// A secret kept in a file (its surrounding whitespace dropped); an empty one is refused.
    static func secret(from path: String) throws -> String {
        let text = try String(contentsOfFile: path, encoding: .utf8).trimmingCharacters(in: .whitespacesAndNewlines)
        guard !text.isEmpty else { throw ValidationError("\(path) is empty") }
        return text
    }
}

/// Each connection holds a file descriptor: the soft limit (often 1,024) goes up to the hard one.
func raiseFileLimit() {
    #if os(Linux)
    let resource = Int32(RLIMIT_NOFILE.rawValue)
    #else
    let resource = RLIMIT_NOFILE
    #endif
    var limit = rlimit()
    guard getrlimit(resource, &limit) == 0, limit.rlim_cur < limit.rlim_max else { return }
    limit.rlim_cur = limit.rlim_max
    if setrlimit(resource, &limit) != 0 {
        FileHandle.standardError.write(Data("ferry-server: cannot raise the open-file limit (errno \(errno))\n".utf8))
    }
}

FerryServerCommand.main()
