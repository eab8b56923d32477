import FerryDocuments
import FerryFirestoreWire
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2

/// The running gRPC server of Cloud Firestore's API.
struct FirestoreEndpoint: Sendable {
    let server: GRPCServer<HTTP2ServerTransport.Posix>
    let serving: Task<Void, any Error>
}

extension FerryServer {
    /// The most RPCs (Listen streams included) one connection may have open at once.
    static let maxStreamsPerConnection = 4_096

    /// Starts serving Cloud Firestore's gRPC API on the configuration's `firestorePort`;
    /// returns the bound port.
    ///
    /// - Throws: ``ServerError``: `cannotListen` when the port cannot be bound, `insecure` as
    ///   ``start()``.
    public func startFirestore() async throws -> Int {
        let port = configuration.firestorePort ?? 0
        if let securityProblem { throw ServerError(code: .insecure, message: securityProblem, address: "\(configuration.host):\(port)") }
        let security: HTTP2ServerTransport.Posix.TransportSecurity = if let tls = configuration.tls {
            .tls(certificateChain: [.file(path: tls.certificateChain, format: .pem)], privateKey: .file(path: tls.privateKey, format: .pem))
        } else {
            .plaintext
        }
        let transport = HTTP2ServerTransport.Posix(
            address: .ipv4(host: configuration.host, port: port),
            transportSecurity: security,
            config: .defaults { config in
                // Firestore's own limit on a request is 10 MiB; a commit of big documents needs it.
                config.rpc.maxRequestPayloadSize = 16 * 1024 * 1024
                // A client opens a Listen stream per listener on one connection (google-cloud-firestore
                // does): HTTP/2's default of 100 streams would leave its 101st RPC waiting forever.
                config.http2.maxConcurrentStreams = Self.maxStreamsPerConnection
            }
        )
        let service = FirestoreService(databases: firestore, authenticator: authenticator,
                                       openToEveryone: authenticator.emulator || configuration.allowInsecurePublic, maxWrites: configuration.maxCommitWrites,
                                       maxStreamBufferBytes: configuration.maxStreamBufferBytes)
        let server = GRPCServer(transport: transport, services: [service])
        let serving = Task { try await server.serve() }
        let address: GRPCNIOTransportCore.SocketAddress
        do {
            address = try await transport.listeningAddress
        } catch {
            serving.cancel()
            throw ServerError(code: .cannotListen, message: "cannot listen for Firestore's API: \(error)", address: "\(configuration.host):\(port)")
        }
        firestoreServer.withLock { $0 = FirestoreEndpoint(server: server, serving: serving) }
        return address.ipv4?.port ?? port
    }

    /// Stops the gRPC server (its streams end) and closes the Firestore databases.
    func stopFirestore() async {
        if let endpoint = firestoreServer.withLock({ e in defer { e = nil }; return e }) {
            endpoint.server.beginGracefulShutdown()
            // Listen streams never end by themselves: cancel what is left after a moment's grace.
            let grace = Task {
                try await Task.sleep(for: .seconds(1))
                endpoint.serving.cancel()
            }
            _ = try? await endpoint.serving.value
            grace.cancel()
        }
        await firestore.closeAll()
    }

    /// The emulator's `DELETE /emulator/v1/projects/P/databases/D/documents`: every document of
    /// the database removed (listeners told), as one durable commit.
    func clearFirestore(project: String, database: String) async -> HTTPResponse {
        guard DatabaseName.isID(project), DatabaseName.isID(database) else { return .error(400, "invalid project or database id") }
        do {
            try await firestore.store(DatabaseName(project: project, database: database)).clear()
            return .json(200, "{}")
        } catch {
            return .error(503, "cannot clear: \(error)")
        }
    }
}
