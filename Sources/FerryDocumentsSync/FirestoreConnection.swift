import FerryDocuments
import FerryFirestoreWire
@_spi(Testing) import FerryLog
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import Logging
import Synchronization

/// A document store connected to `ferry-server`'s Cloud Firestore gRPC API
/// (`ferry-server --firestore-port`): pending writes are sent in order and committed exactly
/// once, and every listener's query is listened to on the server. (The commits use Ferry's
/// batch extension, which other Firestore servers do not answer.)
///
/// ```swift
/// let db = try Firestore.open(at: path)
/// let connection = try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: 8080, project: "my-app"))
/// // … use db as before: listeners now hear the server, writes reach it.
/// await connection.close()
/// ```
///
/// **Exactly once.** Each commit carries the store's id and its batches' ids (Ferry's
/// `x-ferry-client` / `x-ferry-batches` headers). The server records the last batch it
/// committed for each store with the data, so a batch sent again — after a lost answer, a
/// crash of the app or of the server — is answered without being applied twice. The answer
/// moves the store's durable cursor, as the Realtime Database side's does.
///
/// **Listens.** One Listen stream carries every target (each listener's query, and the
/// documents the store checks on, "limbo"); resume tokens are kept in the store, so a
/// listener reopened after a restart gets only what changed. When the stream fails, the
/// store goes offline by Firestore's rule and the stream is opened again with backoff.
public final class FirestoreConnection: Sendable {
    /// Where the server is and who the store speaks as.
    public struct Server: Sendable {
        public var host: String
        public var port: Int
        public var project: String
        public var database: String
        /// Sent as `Authorization: Bearer TOKEN` (the emulator's administrator is `owner`); nil
        /// sends none. Ignored when there is a ``tokenProvider``.
        public var token: String?
        /// Gives the token to send (an ID token, which expires): asked before the first call,
        /// and again with `forceRefresh` true after the server refuses one
        /// (`UNAUTHENTICATED`), as Firebase's SDKs ask their auth provider. nil from it sends none.
        public var tokenProvider: (@Sendable (_ forceRefresh: Bool) async throws -> String?)?
        /// TLS: the certificate authorities (PEM text) whose certificates are trusted, or
        /// `.system` for the system's; nil: plaintext. The server's certificate is checked.
        public var tls: TrustedCertificates?

        public init(host: String, port: Int, project: String, database: String = "(default)", token: String? = "owner", tls: TrustedCertificates? = nil) {
            self.host = host
            self.port = port
            self.project = project
            self.database = database
            self.token = token
            self.tls = tls
        }
    }

    /// The certificate authorities a TLS connection trusts.
    public enum TrustedCertificates: Sendable {
        /// The system's.
        case system
        /// These (PEM text): a company's own CA, or a test's.
        case pem(String)
    }

    /// Pending batches sent in one commit at most (and at most `maxWritesPerCommit` writes).
    static let maxBatchesPerCommit = 1_000
    static let maxWritesPerCommit = 5_000
    static let maxBytesPerCommit = 8 << 20
    /// A commit not answered within this is abandoned and sent again (the server's marks make
    /// that safe): a connection that stalls cannot stall the writes.
    static let commitTimeout = Duration.seconds(60)

    let db: Firestore
    let database: DatabaseName
    let credentials: Credentials
    private let client: GRPCClient<HTTP2ClientTransport.Posix>
    private let stub: Google_Firestore_V1_Firestore.Client<HTTP2ClientTransport.Posix>
    private let writeSignal = WakeSignal()
    private let listenSignal = WakeSignal()
    private let tasks = Mutex<[Task<Void, Never>]>([])
    private let counters = Counters()

    /// What the connection has done so far.
    public struct Statistics: Sendable {
        /// Documents the server sent on listens (added or changed): a listen resumed from its
        /// token gets only what changed since.
        public var documentsReceived: Int
        /// Batches the server answered (committed, or committed before and answered again).
        public var batchesCommitted: Int
        public var batchesRejected: Int
        /// Listen streams opened (the first and each reconnection).
        public var streamsOpened: Int
    }

    public var statistics: Statistics {
        Statistics(documentsReceived: counters.documents.load(ordering: .relaxed), batchesCommitted: counters.committed.load(ordering: .relaxed),
                   batchesRejected: counters.rejected.load(ordering: .relaxed), streamsOpened: counters.streams.load(ordering: .relaxed))
    }
    private let logger: Logger

    private init(db: Firestore, server: Server, logger: Logger) throws {
        self.db = db
        self.logger = logger
        guard DatabaseName.isID(server.project), DatabaseName.isID(server.database) else {
            throw FirestoreErrorCode(.invalidArgument, "invalid project or database id: \(server.project), \(server.database)")
        }
        database = DatabaseName(project: server.project, database: server.database)
        var md = Metadata()
        md.addString(database.description, forKey: "google-cloud-resource-prefix")
        credentials = Credentials(base: md, token: server.token, provider: server.tokenProvider)
        let security: HTTP2ClientTransport.Posix.TransportSecurity = switch server.tls {
        case nil: .plaintext
        case .system?: .tls
        case .pem(let pem)?: .tls { $0.trustRoots = .certificates([.bytes(Array(pem.utf8), format: .pem)]) }
        }
        let transport = try HTTP2ClientTransport.Posix(target: .ipv4(address: server.host, port: server.port), transportSecurity: security)
        client = GRPCClient(transport: transport)
        stub = Google_Firestore_V1_Firestore.Client(wrapping: client)
    }

    /// Connects `db` to `server` and starts syncing; the connection lives until ``close()``.
    public static func connect(_ db: Firestore, to server: Server, logger: Logger = Logger(label: "ferry.documents.sync")) throws -> FirestoreConnection {
        let c = try FirestoreConnection(db: db, server: server, logger: logger)
        let (writes, listens) = (c.writeSignal, c.listenSignal)
        try db.attachRemote(server: GRPCDocumentServer(stub: c.stub, database: c.database, credentials: c.credentials)) {
            writes.signal()
            listens.signal()
        }
        let client = c.client
        c.tasks.withLock { t in
            t.append(Task { try? await client.runConnections() })
            t.append(Task { await c.writeLoop() })
            t.append(Task { await c.listenLoop() })
        }
        return c
    }

    /// Stops syncing: the store goes offline (its pending writes stay pending, for the next
    /// connection).
    public func close() async {
        db.detachRemote()
        let running = tasks.withLock { t in defer { t = [] }; return t }
        client.beginGracefulShutdown()
        for t in running.dropFirst() { t.cancel() }
        for t in running { await t.value }
    }

    // MARK: Writes

    private func writeLoop() async {
        var backoff = Backoff()
        var limit = Self.maxBatchesPerCommit
        while !Task.isCancelled {
            guard db.networkEnabled else {
                await writeSignal.wait()
                continue
            }
            let (ready, more) = db.pendingBatches(limit: limit)
            if ready.isEmpty {
                // Pending batches not on disk yet leave once they are.
                if more { try? await db.sync() } else { await writeSignal.wait() }
                continue
            }
            // At most so many writes and bytes in one commit (the server refuses requests over 16 MiB).
            var batches: [MutationBatch] = []
            var writes: [Google_Firestore_V1_Write] = []
            var bytes = 0
            for batch in ready {
                let wire = batch.mutations.map { $0.wire(in: database) }
                // (An estimate: each document's stored size, which its message's is close to.)
                let size = batch.mutations.reduce(64) { $0 + UserData.documentSize(path: $1.key, fields: $1.fields) }
                if !batches.isEmpty, writes.count + wire.count > Self.maxWritesPerCommit || bytes + size > Self.maxBytesPerCommit { break }
                batches.append(batch)
                writes += wire
                bytes += size
            }
            do {
                let answers = try await commit(batches, writes)
                // (Tests kill the process here: the server committed, the store has not heard.)
                CrashPoint.hit("documents.answered")
                db.remoteWritesAnswered(answers.map { a in
                    switch a {
                    case .committed(let version): .success(version)
                    case .rejected(let error): .failure(error)
                    }
                })
                let refused = answers.filter { if case .rejected = $0 { true } else { false } }.count
                counters.committed.add(answers.count - refused, ordering: .relaxed)
                counters.rejected.add(refused, ordering: .relaxed)
                backoff.reset()
                limit = Self.maxBatchesPerCommit
            } catch {
                if Task.isCancelled { return }
                let code = (error as? RPCError)?.code
                if [.invalidArgument, .failedPrecondition, .outOfRange, .resourceExhausted].contains(code) {
                    // The whole commit was refused: send one batch at a time; one refused alone is rejected.
                    if batches.count == 1 {
                        let e = error as? RPCError
                        db.remoteWritesAnswered([.failure(FirestoreErrorCode(FirestoreErrorCode.Code(rawValue: e?.code.rawValue ?? 3) ?? .invalidArgument, e?.message ?? "\(error)"))])
                        counters.rejected.add(1, ordering: .relaxed)
                    }
                    limit = 1
                    continue
                }
                logger.debug("commit failed (\(error)); retrying")
                await backoff.pause()
            }
        }
    }

    /// One commit of several batches; each batch's answer in order.
    private func commit(_ batches: [MutationBatch], _ writes: [Google_Firestore_V1_Write]) async throws -> [BatchAnswers.Answer] {
        var request = Google_Firestore_V1_CommitRequest()
        request.database = database.description
        request.writes = writes
        var md = try await credentials.metadata()
        md.addString(db.clientID, forKey: BatchAnswers.clientHeader)
        md.addString(BatchAnswers.header(batches.map { ($0.id, $0.mutations.count) }), forKey: BatchAnswers.batchesHeader)
        var options = CallOptions.defaults
        options.timeout = Self.commitTimeout
        let response = try await credentials.refusing { try await stub.commit(request: ClientRequest(message: request, metadata: md), options: options) }
        guard response.ferryBatchAnswers.count == batches.count else {
            throw RPCError(code: .unavailable, message: "the server did not answer each batch (\(response.ferryBatchAnswers.count) answers for \(batches.count)): is it ferry-server?")
        }
        return response.ferryBatchAnswers.map(BatchAnswers.answer)
    }

    // MARK: Listens

    private func listenLoop() async {
        var backoff = Backoff()
        while !Task.isCancelled {
            guard db.networkEnabled else {
                await listenSignal.wait()
                continue
            }
            let synced = Flag()
            db.remoteStreamStarted()
            counters.streams.add(1, ordering: .relaxed)
            let (db, database, signal, counters) = (self.db, self.database, self.listenSignal, self.counters)
            do {
                let metadata = try await credentials.metadata()
                try await credentials.refusing { try await stub.listen(metadata: metadata, requestProducer: { writer in
                    // The store's listen requests, as they come (sent without waiting for the
                    // server's first message: a server may send its headers only with it).
                    while !Task.isCancelled {
                        guard db.networkEnabled else { throw CancellationError() }
                        for r in db.takeRemoteRequests() { try await writer.write(Self.request(r, database)) }
                        await signal.wait()
                    }
                }, onResponse: { response in
                    for try await m in response.messages {
                        if case .documentChange? = m.responseType { counters.documents.add(1, ordering: .relaxed) }
                        if case .targetChange(let c)? = m.responseType, c.targetChangeType == .noChange, c.targetIds.isEmpty {
                            synced.value.store(true, ordering: .relaxed)
                        }
                        try Self.handle(m, db, database)
                    }
                }) }
            } catch {
                if Task.isCancelled { return }
                logger.debug("listen stream ended (\(error))")
            }
            db.remoteStreamStopped()
            // A stream that brought a consistent snapshot was healthy: the next one starts at once.
            if synced.value.load(ordering: .relaxed) { backoff.reset() }
            if db.networkEnabled { await backoff.pause() }
        }
    }

    static func request(_ r: RemoteRequest, _ database: DatabaseName) -> Google_Firestore_V1_ListenRequest {
        var out = Google_Firestore_V1_ListenRequest()
        out.database = database.description
        switch r {
        case .listen(let id, let query, let token):
            var target = query.wireTarget(in: database)
            target.targetID = Int32(id)
            if let data = Data(base64Encoded: token), !data.isEmpty { target.resumeToken = data }
            out.addTarget = target
        case .unlisten(let id):
            out.removeTarget = Int32(id)
        }
        return out
    }

    static func handle(_ m: Google_Firestore_V1_ListenResponse, _ db: Firestore, _ database: DatabaseName) throws {
        switch m.responseType {
        case nil: break
        case .targetChange(let c):
            let ids = c.targetIds.map(Int.init)
            let token = c.resumeToken.isEmpty ? "" : c.resumeToken.base64EncodedString()
            switch c.targetChangeType {
            case .noChange: db.remoteNoChange(ids, resumeToken: token, readTime: c.hasReadTime ? try Timestamp(wire: c.readTime).micros : nil)
            case .add: db.remoteTargetAdded(ids)
            case .current: db.remoteTargetCurrent(ids, resumeToken: token)
            case .reset: db.remoteTargetReset(ids)
            case .remove:
                let cause = c.hasCause ? FirestoreErrorCode(FirestoreErrorCode.Code(rawValue: Int(c.cause.code)) ?? .unknown, c.cause.message) : nil
                db.remoteTargetRemoved(ids, error: cause)
            case .UNRECOGNIZED: break
            }
        case .documentChange(let change):
            let doc = try WatchDocument(wire: change.document, in: database)
            db.remoteDocument(doc, key: doc.key, updated: change.targetIds.map(Int.init), removed: change.removedTargetIds.map(Int.init))
        case .documentDelete(let d):
            let key = try database.documentPath(d.document)
            let version = d.hasReadTime ? try Timestamp(wire: d.readTime).micros : 0
            db.remoteDocument(WatchDocument(key: key, fields: nil, version: version), key: key, updated: [], removed: d.removedTargetIds.map(Int.init))
        case .documentRemove(let d):
            let key = try database.documentPath(d.document)
            db.remoteDocument(nil, key: key, updated: [], removed: d.removedTargetIds.map(Int.init))
        case .filter(let f):
            db.remoteExistenceFilter(Int(f.targetID), count: Int(f.count))
        }
    }
}

/// A wake-up that is never lost: a signal before the wait ends the next wait at once.
final class WakeSignal: Sendable {
    private struct State {
        var signalled = false
        var waiter: CheckedContinuation<Void, Never>?
    }
    private let state = Mutex(State())

    func signal() {
        let w: CheckedContinuation<Void, Never>? = state.withLock { s in
            if let w = s.waiter {
                s.waiter = nil
                return w
            }
            s.signalled = true
            return nil
        }
        w?.resume()
    }

    /// Waits for a signal (or the task's cancellation).
    func wait() async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (c: CheckedContinuation<Void, Never>) in
                let now: Bool = state.withLock { s in
                    if s.signalled || Task.isCancelled {
                        s.signalled = false
                        return true
                    }
                    s.waiter = c
                    return false
                }
                if now { c.resume() }
            }
        } onCancel: {
            signal()
        }
    }
}

final class Counters: Sendable {
    let documents = Atomic<Int>(0)
    let committed = Atomic<Int>(0)
    let rejected = Atomic<Int>(0)
    let streams = Atomic<Int>(0)
}

final class Flag: Sendable {
    let value = Atomic<Bool>(false)
}

/// Exponential backoff with jitter: 0.1 s doubling to 10 s.
struct Backoff {
    private var next: Double = 0.1
    mutating func reset() { next = 0.1 }
    mutating func pause() async {
        let delay = next * Double.random(in: 0.75...1.25)
        next = min(next * 2, 10)
        try? await Task.sleep(for: .seconds(delay))
    }
}

/// The bearer token a connection sends: a fixed one, or its provider's, asked again when the
/// server refuses the one it gave.
final class Credentials: Sendable {
    private let base: Metadata
    private let fixed: String?
    private let provider: (@Sendable (Bool) async throws -> String?)?
    /// The provider's last token (nil: ask it), and whether the server refused the one before.
    private let current = Mutex<(token: String??, refused: Bool)>((nil, false))

    init(base: Metadata, token: String?, provider: (@Sendable (Bool) async throws -> String?)?) {
        self.base = base
        fixed = token
        self.provider = provider
    }

    /// The calls' metadata: the resource prefix and the token's `authorization`.
    func metadata() async throws -> Metadata {
        var md = base
        if let token = try await token() { md.addString("Bearer \(token)", forKey: "authorization") }
        return md
    }

    private func token() async throws -> String? {
        guard let provider else { return fixed }
        let (cached, refused) = current.withLock { ($0.token, $0.refused) }
        if let cached { return cached }
        let token = try await provider(refused)
        current.withLock { $0 = (token, false) }
        return token
    }

    /// Runs an RPC; when the server refuses its token (`UNAUTHENTICATED`), the next call asks
    /// the provider for a new one.
    func refusing<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let e as RPCError where e.code == .unauthenticated {
            if provider != nil { current.withLock { $0 = (nil, true) } }
            throw e
        }
    }
}

/// Reads and transactions straight from the server (``DocumentServer``), for `getDocument`
/// with a server source and `runTransaction`.
struct GRPCDocumentServer: DocumentServer {
    let stub: Google_Firestore_V1_Firestore.Client<HTTP2ClientTransport.Posix>
    let database: DatabaseName
    let credentials: Credentials

    /// The RPC's failure as the document model's error (the codes are gRPC's).
    private func call<T>(_ body: (Metadata) async throws -> T) async throws -> T {
        do {
            let metadata = try await credentials.metadata()
            return try await credentials.refusing { try await body(metadata) }
        } catch let e as RPCError {
            throw FirestoreErrorCode(FirestoreErrorCode.Code(rawValue: e.code.rawValue) ?? .unknown, e.message)
        } catch let e as FirestoreErrorCode {
            throw e
        } catch {
            throw FirestoreErrorCode(.unavailable, "\(error)")
        }
    }

    func documents(_ keys: [ResourcePath], transaction: Data?) async throws -> [WatchDocument] {
        let database = self.database
        return try await call { metadata in
            var request = Google_Firestore_V1_BatchGetDocumentsRequest()
            request.database = database.description
            request.documents = keys.map { database.name(of: $0) }
            if let transaction { request.transaction = transaction }
            let found = try await stub.batchGetDocuments(request: ClientRequest(message: request, metadata: metadata)) { response in
                var out: [ResourcePath: WatchDocument] = [:]
                for try await m in response.messages {
                    switch m.result {
                    case .found(let d)?:
                        let doc = try WatchDocument(wire: d, in: database)
                        out[doc.key] = doc
                    case .missing(let name)?:
                        let key = try database.documentPath(name)
                        out[key] = WatchDocument(key: key, fields: nil, version: 0)
                    case nil: break
                    }
                }
                return out
            }
            return keys.map { found[$0] ?? WatchDocument(key: $0, fields: nil, version: 0) }
        }
    }

    func query(_ q: QueryCore, transaction: Data?) async throws -> [WatchDocument] {
        let database = self.database
        return try await call { metadata in
            let target = q.wireTarget(in: database)
            var request = Google_Firestore_V1_RunQueryRequest()
            if case .documents = target.targetType, let key = q.documentKey {
                return try await documents([key], transaction: transaction).filter { $0.fields != nil }
            }
            request.parent = target.query.parent
            request.structuredQuery = target.query.structuredQuery
            if let transaction { request.transaction = transaction }
            let docs = try await stub.runQuery(request: ClientRequest(message: request, metadata: metadata)) { response in
                var out: [WatchDocument] = []
                for try await m in response.messages where m.hasDocument {
                    out.append(try WatchDocument(wire: m.document, in: database))
                }
                return out
            }
            // A limit-to-last query was asked as its mirror: its results come reversed.
            return q.limitType == .last && q.limit != nil ? docs.reversed() : docs
        }
    }

    func beginTransaction(retrying: Data?) async throws -> Data {
        try await call { metadata in
            var request = Google_Firestore_V1_BeginTransactionRequest()
            request.database = database.description
            var options = Google_Firestore_V1_TransactionOptions()
            var readWrite = Google_Firestore_V1_TransactionOptions.ReadWrite()
            if let retrying { readWrite.retryTransaction = retrying }
            options.readWrite = readWrite
            request.options = options
            return try await stub.beginTransaction(request: ClientRequest(message: request, metadata: metadata)).transaction
        }
    }

    func commit(_ mutations: [Mutation], transaction: Data) async throws {
        try await call { metadata in
            var request = Google_Firestore_V1_CommitRequest()
            request.database = database.description
            request.writes = mutations.map { $0.wire(in: database) }
            request.transaction = transaction
            _ = try await stub.commit(request: ClientRequest(message: request, metadata: metadata))
        }
    }

    func rollback(_ transaction: Data) async {
        var request = Google_Firestore_V1_RollbackRequest()
        request.database = database.description
        request.transaction = transaction
        guard let metadata = try? await credentials.metadata() else { return }
        _ = try? await stub.rollback(request: ClientRequest(message: request, metadata: metadata))
    }
}
