import FerryDocuments
import FerryFirestoreWire
import Foundation
import GRPCCore
import Logging
import Synchronization
import SwiftProtobuf

typealias V1 = Google_Firestore_V1_Firestore

extension FirestoreErrorCode: RPCErrorConvertible {
    public var rpcErrorCode: RPCError.Code {
        switch code {
        case .ok, .unknown: .unknown
        case .cancelled: .cancelled
        case .invalidArgument: .invalidArgument
        case .deadlineExceeded: .deadlineExceeded
        case .notFound: .notFound
        case .alreadyExists: .alreadyExists
        case .permissionDenied: .permissionDenied
        case .resourceExhausted: .resourceExhausted
        case .failedPrecondition: .failedPrecondition
        case .aborted: .aborted
        case .outOfRange: .outOfRange
        case .unimplemented: .unimplemented
        case .internal: .internalError
        case .unavailable: .unavailable
        case .dataLoss: .dataLoss
        case .unauthenticated: .unauthenticated
        }
    }
    public var rpcErrorMessage: String { message }
}

/// The Firestore databases a server holds, each opened by the first request that names it
/// (`DATA/firestore/PROJECT/DATABASE`).
final class FirestoreDatabases: Sendable {
    let directory: String
    let checkpointBytes: Int
    let logger: Logger
    private let open = Mutex<[DatabaseName: Task<DocumentStore, any Error>]>([:])

    init(directory: String, checkpointBytes: Int, logger: Logger) {
        self.directory = directory
        self.checkpointBytes = checkpointBytes
        self.logger = logger
    }

    func store(_ name: DatabaseName) async throws -> DocumentStore {
        let task = open.withLock { all in
            if let t = all[name] { return t }
            let path = "\(directory)/\(name.project)/\(name.database)"
            var log = logger
            log[metadataKey: "database"] = "\(name)"
            let t = Task { [log, checkpointBytes] in try DocumentStore.open(at: path, name: name, checkpointBytes: checkpointBytes, logger: log) }
            all[name] = t
            return t
        }
        do {
            return try await task.value
        } catch {
            open.withLock { all in
                // A failed open is tried again by the next request.
                if all[name].map({ $0 == task }) == true { all[name] = nil }
            }
            logger.error("cannot open \(name): \(error)")
            throw FirestoreErrorCode(.unavailable, "the database's store cannot be opened: \(error)")
        }
    }

    /// The stores opened so far (for the emulator's clear and for shutdown).
    func opened() async -> [DocumentStore] {
        var out: [DocumentStore] = []
        for t in open.withLock({ Array($0.values) }) { if let s = try? await t.value { out.append(s) } }
        return out
    }

    func closeAll() async {
        for s in await opened() { await s.close() }
    }
}

/// `google.firestore.v1.Firestore` over the server's document stores: the RPCs the Python
/// client (`google-cloud-firestore`) and Ferry's client use.
struct FirestoreService: V1.ServiceProtocol {
    let databases: FirestoreDatabases
    /// Whom a bearer token speaks for (the REST API's rules of identity).
    let authenticator: Authenticator
    /// Whether callers other than the administrator may use the API (there are no Firestore
    /// rules yet): in emulator mode, or when the server was told to be insecure in public.
    let openToEveryone: Bool
    let maxWrites: Int
    /// The most bytes a Listen stream may have waiting for a client that does not read.
    let maxStreamBufferBytes: Int

    /// Refuses a bearer token that does not verify (`UNAUTHENTICATED`), and, outside emulator
    /// mode, any caller but the administrator (`PERMISSION_DENIED`: with no Firestore rules,
    /// a user could otherwise read and write every document).
    private func authorize(_ metadata: Metadata) async throws {
        var token: String?
        if let header = metadata[stringValues: "authorization"].first(where: { _ in true }) {
            guard let t = FerryServer.bearerToken(header) else { throw FirestoreErrorCode(.unauthenticated, "the authorization header must be 'Bearer TOKEN'") }
            token = t
        }
        switch await authenticator.caller(token: token) {
        case .failure: throw FirestoreErrorCode(.unauthenticated, "the token is not one this server accepts")
        case .success(.owner): return
        case .success:
            guard openToEveryone else {
                throw FirestoreErrorCode(.permissionDenied, "outside emulator mode only the administrator may use this server's Firestore API (it has no security rules)")
            }
        }
    }

    /// The database a `parent` (`projects/P/databases/D/documents[/…]`) is in.
    private func database(ofParent parent: String) throws -> DatabaseName {
        let parts = parent.split(separator: "/", maxSplits: 4, omittingEmptySubsequences: false)
        guard parts.count >= 4 else { throw FirestoreErrorCode(.invalidArgument, "\"\(parent.prefix(200))\" is not below a database") }
        return try DatabaseName(parsing: parts[0..<4].joined(separator: "/"))
    }

    private func rpc<T>(_ body: () async throws -> T) async throws -> T {
        do {
            return try await body()
        } catch let e as FirestoreErrorCode {
            throw RPCError(e)
        }
    }

    // MARK: Reads

    func batchGetDocuments(request: ServerRequest<Google_Firestore_V1_BatchGetDocumentsRequest>, context: ServerContext) async throws -> StreamingServerResponse<Google_Firestore_V1_BatchGetDocumentsResponse> {
        try await rpc {
            try await authorize(request.metadata)
            let m = request.message
            let db = try DatabaseName(parsing: m.database)
            let keys = try m.documents.map { try db.documentPath($0) }
            let mask = m.hasMask ? try m.mask.fieldPaths.map { try FieldPath.parseServer($0) } : nil
            let store = try await databases.store(db)
            var transaction: Data?
            var newTransaction: Data?
            switch m.consistencySelector {
            case .transaction(let t)?: transaction = t
            case .newTransaction(let o)?:
                newTransaction = try store.beginTransaction(readOnly: Self.isReadOnly(o))
                transaction = newTransaction
            case .readTime?, nil: break
            }
            let (docs, readTime) = try store.documents(keys, transaction: transaction)
            var responses: [Google_Firestore_V1_BatchGetDocumentsResponse] = []
            for (k, d) in zip(keys, docs) {
                var r = Google_Firestore_V1_BatchGetDocumentsResponse()
                if let d { r.found = Self.document(k, d, db, mask: mask) } else { r.missing = db.name(of: k) }
                r.readTime = wireTimestamp(micros: readTime)
                if let t = newTransaction, responses.isEmpty { r.transaction = t }
                responses.append(r)
            }
            return StreamingServerResponse { [responses] writer in
                try await writer.write(contentsOf: responses)
                return [:]
            }
        }
    }

    static func document(_ key: ResourcePath, _ d: StoredDocument, _ db: DatabaseName, mask: [FieldPath]?) -> Google_Firestore_V1_Document {
        var doc = DocumentStore.wireDocument(key, d, db)
        if let mask {
            var kept: [String: FieldValueData] = [:]
            let all = FieldValueData.map(d.fields)
            for p in mask where !p.isDocumentID {
                if let v = all.value(at: p) { setField(&kept, p.segments[...], v) }
            }
            doc.fields = FieldValueData.wire(fields: kept, in: db)
        }
        return doc
    }

    static func isReadOnly(_ o: Google_Firestore_V1_TransactionOptions) -> Bool {
        if case .readOnly? = o.mode { true } else { false }
    }

    /// Runs `q` in `transaction`, or in one begun with `newTransaction`'s options (returned,
    /// for the first response), or in none.
    private func run(_ q: WireQuery, in store: DocumentStore, transaction: Data?, newTransaction: Google_Firestore_V1_TransactionOptions?) throws
        -> (docs: [(ResourcePath, StoredDocument)], readTime: Int64, began: Data?) {
        let began = try newTransaction.map { try store.beginTransaction(readOnly: Self.isReadOnly($0)) }
        let (docs, readTime) = try store.run(q, transaction: transaction ?? began)
        return (docs, readTime, began)
    }

    func runQuery(request: ServerRequest<Google_Firestore_V1_RunQueryRequest>, context: ServerContext) async throws -> StreamingServerResponse<Google_Firestore_V1_RunQueryResponse> {
        try await rpc {
            try await authorize(request.metadata)
            let m = request.message
            let db = try database(ofParent: m.parent)
            guard case .structuredQuery(let sq)? = m.queryType else { throw FirestoreErrorCode(.invalidArgument, "RunQuery needs a structured query") }
            let q = try WireQuery(sq, parent: try db.parentPath(m.parent), in: db)
            let transaction: Data? = if case .transaction(let t)? = m.consistencySelector { t } else { nil }
            let options: Google_Firestore_V1_TransactionOptions? = if case .newTransaction(let o)? = m.consistencySelector { o } else { nil }
            let (docs, readTime, new) = try run(q, in: try await databases.store(db), transaction: transaction, newTransaction: options)
            var responses: [Google_Firestore_V1_RunQueryResponse] = docs.map { k, d in
                var r = Google_Firestore_V1_RunQueryResponse()
                r.document = Self.document(k, d, db, mask: q.projection)
                r.readTime = wireTimestamp(micros: readTime)
                return r
            }
            if responses.isEmpty {
                var r = Google_Firestore_V1_RunQueryResponse()
                r.readTime = wireTimestamp(micros: readTime)
                responses.append(r)
            }
            if let new { responses[0].transaction = new }
            responses[responses.count - 1].done = true
            return StreamingServerResponse { [responses] writer in
                try await writer.write(contentsOf: responses)
                return [:]
            }
        }
    }

    func runAggregationQuery(request: ServerRequest<Google_Firestore_V1_RunAggregationQueryRequest>, context: ServerContext) async throws -> StreamingServerResponse<Google_Firestore_V1_RunAggregationQueryResponse> {
        try await rpc {
            try await authorize(request.metadata)
            let m = request.message
            let db = try database(ofParent: m.parent)
            guard case .structuredAggregationQuery(let aq)? = m.queryType, case .structuredQuery(let sq)? = aq.queryType else {
                throw FirestoreErrorCode(.invalidArgument, "RunAggregationQuery needs a structured aggregation query")
            }
            let aggregations = try Aggregation.parse(aq.aggregations)
            let q = try WireQuery(sq, parent: try db.parentPath(m.parent), in: db)
            let transaction: Data? = if case .transaction(let t)? = m.consistencySelector { t } else { nil }
            let options: Google_Firestore_V1_TransactionOptions? = if case .newTransaction(let o)? = m.consistencySelector { o } else { nil }
            let (docs, readTime, new) = try run(q, in: try await databases.store(db), transaction: transaction, newTransaction: options)
            var r = Google_Firestore_V1_RunAggregationQueryResponse()
            var result = Google_Firestore_V1_AggregationResult()
            for a in aggregations { result.aggregateFields[a.alias] = a.compute(docs.map(\.1.fields)).wire(in: db) }
            r.result = result
            r.readTime = wireTimestamp(micros: readTime)
            if let new { r.transaction = new }
            return StreamingServerResponse { [r] writer in
                try await writer.write(r)
                return [:]
            }
        }
    }

    func listCollectionIds(request: ServerRequest<Google_Firestore_V1_ListCollectionIdsRequest>, context: ServerContext) async throws -> ServerResponse<Google_Firestore_V1_ListCollectionIdsResponse> {
        try await rpc {
            try await authorize(request.metadata)
            let m = request.message
            let db = try database(ofParent: m.parent)
            let parent = try db.parentPath(m.parent)
            guard m.pageSize >= 0 else { throw FirestoreErrorCode(.invalidArgument, "page_size must not be negative") }
            var ids = try await databases.store(db).collectionIDs(below: parent)
            if !m.pageToken.isEmpty { ids = ids.filter { FieldValueData.compareSegments([$0], [m.pageToken]) > 0 } }
            var r = Google_Firestore_V1_ListCollectionIdsResponse()
            if m.pageSize > 0, ids.count > Int(m.pageSize) {
                ids = Array(ids.prefix(Int(m.pageSize)))
                r.nextPageToken = ids.last!
            }
            r.collectionIds = ids
            return ServerResponse(message: r)
        }
    }

    func listDocuments(request: ServerRequest<Google_Firestore_V1_ListDocumentsRequest>, context: ServerContext) async throws -> ServerResponse<Google_Firestore_V1_ListDocumentsResponse> {
        try await rpc {
            try await authorize(request.metadata)
            let m = request.message
            let db = try database(ofParent: m.parent)
            let parent = try db.parentPath(m.parent)
            guard !m.collectionID.isEmpty else { throw FirestoreErrorCode(.invalidArgument, "ListDocuments needs a collection id") }
            try ResourcePath.checkSegment(m.collectionID, what: "collection id")
            guard m.pageSize >= 0 else { throw FirestoreErrorCode(.invalidArgument, "page_size must not be negative") }
            let mask = m.hasMask ? try m.mask.fieldPaths.map { try FieldPath.parseServer($0) } : nil
            var (docs, _) = try await databases.store(db).list(parent.appending(m.collectionID), showMissing: m.showMissing)
            if !m.pageToken.isEmpty {
                let after = try db.documentPath(m.pageToken)
                docs = docs.filter { after < $0.0 }
            }
            var r = Google_Firestore_V1_ListDocumentsResponse()
            if m.pageSize > 0, docs.count > Int(m.pageSize) {
                docs = Array(docs.prefix(Int(m.pageSize)))
                r.nextPageToken = db.name(of: docs.last!.0)
            }
            r.documents = docs.map { k, d in
                if let d { return Self.document(k, d, db, mask: mask) }
                var missing = Google_Firestore_V1_Document()
                missing.name = db.name(of: k)
                return missing
            }
            return ServerResponse(message: r)
        }
    }

    // MARK: Writes and transactions

    func beginTransaction(request: ServerRequest<Google_Firestore_V1_BeginTransactionRequest>, context: ServerContext) async throws -> ServerResponse<Google_Firestore_V1_BeginTransactionResponse> {
        try await rpc {
            try await authorize(request.metadata)
            let m = request.message
            let db = try DatabaseName(parsing: m.database)
            let readOnly = m.hasOptions && Self.isReadOnly(m.options)
            var r = Google_Firestore_V1_BeginTransactionResponse()
            r.transaction = try await databases.store(db).beginTransaction(readOnly: readOnly)
            return ServerResponse(message: r)
        }
    }

    func rollback(request: ServerRequest<Google_Firestore_V1_RollbackRequest>, context: ServerContext) async throws -> ServerResponse<Google_Protobuf_Empty> {
        try await rpc {
            try await authorize(request.metadata)
            let db = try DatabaseName(parsing: request.message.database)
            try await databases.store(db).rollback(request.message.transaction)
            return ServerResponse(message: Google_Protobuf_Empty())
        }
    }

    func commit(request: ServerRequest<Google_Firestore_V1_CommitRequest>, context: ServerContext) async throws -> ServerResponse<Google_Firestore_V1_CommitResponse> {
        try await rpc {
            try await authorize(request.metadata)
            let m = request.message
            let db = try DatabaseName(parsing: m.database)
            guard m.writes.count <= maxWrites else {
                throw FirestoreErrorCode(.invalidArgument, "a commit holds at most \(maxWrites) writes (\(m.writes.count) given)")
            }
            if let client = request.metadata[stringValues: BatchAnswers.clientHeader].first(where: { _ in true }) {
                return try await commitBatches(m, db, client: client, request.metadata)
            }
            let writes = try m.writes.map { try ParsedWrite(wire: $0, in: db) }
            let store = try await databases.store(db)
            if !m.transaction.isEmpty, !writes.isEmpty, store.state.withLock({ $0.transactions[m.transaction]?.readOnly == true }) {
                throw FirestoreErrorCode(.invalidArgument, "a read-only transaction cannot write")
            }
            let result = try await store.commit(writes, transaction: m.transaction.isEmpty ? nil : m.transaction)
            var r = Google_Firestore_V1_CommitResponse()
            r.commitTime = wireTimestamp(micros: result.commitTime)
            r.writeResults = result.results.map { w in
                var out = Google_Firestore_V1_WriteResult()
                out.updateTime = wireTimestamp(micros: w.updateTime)
                out.transformResults = w.transformResults.map { $0.wire(in: db) }
                return out
            }
            return ServerResponse(message: r)
        }
    }

    /// A commit from one of Ferry's client stores: its writes are the client's batches
    /// (`x-ferry-batches`), each committed atomically and once; each batch's answer goes in
    /// the response's `ferry_batch_answers`.
    private func commitBatches(_ m: Google_Firestore_V1_CommitRequest, _ db: DatabaseName, client: String, _ metadata: Metadata) async throws -> ServerResponse<Google_Firestore_V1_CommitResponse> {
        guard !client.isEmpty, client.utf8.count <= 128, client.utf8.allSatisfy({ $0 > 0x20 && $0 < 0x7F }) else {
            throw FirestoreErrorCode(.invalidArgument, "x-ferry-client must be 1 to 128 printable characters")
        }
        guard m.transaction.isEmpty else { throw FirestoreErrorCode(.invalidArgument, "a client's batches are not a transaction") }
        guard let spec = metadata[stringValues: BatchAnswers.batchesHeader].first(where: { _ in true }),
              let batches = BatchAnswers.parseHeader(spec), batches.reduce(0, { $0 + $1.count }) == m.writes.count,
              zip(batches, batches.dropFirst()).allSatisfy({ $0.id < $1.id }) else {
            throw FirestoreErrorCode(.invalidArgument, "x-ferry-client needs x-ferry-batches: ID:COUNT,… with increasing ids and counts adding up to the commit's writes")
        }
        var items: [(id: Int64, writes: Result<[ParsedWrite], FirestoreErrorCode>)] = []
        var offset = 0
        for b in batches {
            let slice = m.writes[offset..<offset + b.count]
            offset += b.count
            do {
                items.append((b.id, .success(try slice.map { try ParsedWrite(wire: $0, in: db) })))
            } catch let e as FirestoreErrorCode {
                items.append((b.id, .failure(e)))
            }
        }
        let results = await (try await databases.store(db)).commitBatches(client: client, items)
        var r = Google_Firestore_V1_CommitResponse()
        var answers: [BatchAnswers.Answer] = []
        var latest: Int64 = 0
        for (b, result) in zip(batches, results) {
            switch result {
            case .success(let c):
                answers.append(.committed(c.commitTime))
                latest = max(latest, c.commitTime)
                r.writeResults += (0..<b.count).map { i in
                    var w = Google_Firestore_V1_WriteResult()
                    w.updateTime = wireTimestamp(micros: c.commitTime)
                    if i < c.results.count { w.transformResults = c.results[i].transformResults.map { $0.wire(in: db) } }
                    return w
                }
            case .failure(let e):
                if e.code == .unavailable { throw e }  // the store failed: the client sends them again
                answers.append(.rejected(e))
                r.writeResults += Array(repeating: Google_Firestore_V1_WriteResult(), count: b.count)
            }
        }
        r.commitTime = wireTimestamp(micros: latest)
        r.ferryBatchAnswers = answers.map(BatchAnswers.wire)
        return ServerResponse(message: r)
    }

    // MARK: Listen

    func listen(request: StreamingServerRequest<Google_Firestore_V1_ListenRequest>, context: ServerContext) async throws -> StreamingServerResponse<Google_Firestore_V1_ListenResponse> {
        try await rpc { try await authorize(request.metadata) }
        let databases = self.databases
        return StreamingServerResponse { writer in
            let sink = ListenSink(maxWaitingBytes: maxStreamBufferBytes)
            try await withThrowingTaskGroup(of: Void.self) { group in
                // The client's requests: the first names the database; each adds or removes a target.
                group.addTask {
                    var registration: (store: DocumentStore, id: Int)?
                    defer {
                        if let registration { registration.store.closeListen(registration.id) } else { sink.finish() }
                    }
                    for try await r in request.messages {
                        if registration == nil {
                            do {
                                let store = try await databases.store(try DatabaseName(parsing: r.database))
                                registration = (store, store.openListen(sink))
                            } catch let e as FirestoreErrorCode {
                                throw RPCError(e)
                            }
                        }
                        registration!.store.listenRequest(registration!.id, r)
                    }
                }
                // The messages for the client, as the store produces them.
                group.addTask {
                    for await group in sink.stream {
                        try await writer.write(contentsOf: group.messages)
                        sink.sent(group.messages.count, bytes: group.bytes)
                    }
                    if sink.overflowed.load(ordering: .relaxed) {
                        throw RPCError(code: .resourceExhausted, message: "the client did not read its listen's changes fast enough; listen again with the last resume token")
                    }
                }
                try await group.next()
                group.cancelAll()
            }
            return [:]
        }
    }
}

/// One aggregation of `RunAggregationQuery`, with its alias.
struct Aggregation: Sendable {
    enum Kind: Sendable {
        case count(upTo: Int64?)
        case sum(FieldPath)
        case average(FieldPath)
    }
    var kind: Kind
    var alias: String

    /// Firestore's rules: at most 5, aliases unique; an aggregation without one is `field_N`,
    /// numbered among those without.
    static func parse(_ wire: [Google_Firestore_V1_StructuredAggregationQuery.Aggregation]) throws -> [Aggregation] {
        guard !wire.isEmpty, wire.count <= 5 else {
            throw FirestoreErrorCode(.invalidArgument, "an aggregation query needs 1 to 5 aggregations (\(wire.count) given)")
        }
        var out: [Aggregation] = []
        var unnamed = 0
        for a in wire {
            let kind: Kind
            switch a.operator {
            case nil: throw FirestoreErrorCode(.invalidArgument, "an aggregation has no operator")
            case .count(let c):
                if c.hasUpTo, c.upTo.value <= 0 { throw FirestoreErrorCode(.invalidArgument, "count's up_to must be positive") }
                kind = .count(upTo: c.hasUpTo ? c.upTo.value : nil)
            case .sum(let s): kind = .sum(try FieldPath.parseServer(s.field.fieldPath))
            case .avg(let s): kind = .average(try FieldPath.parseServer(s.field.fieldPath))
            }
            var alias = a.alias
            if alias.isEmpty {
                unnamed += 1
                alias = "field_\(unnamed)"
            }
            guard !out.contains(where: { $0.alias == alias }) else { throw FirestoreErrorCode(.invalidArgument, "the alias \(alias) is used twice") }
            out.append(Aggregation(kind: kind, alias: alias))
        }
        return out
    }

    /// The value over the documents' fields: a count (capped), a sum (an integer while every
    /// addend is one and it does not overflow, else a double), an average (a double; null when
    /// no document has a number there).
    func compute(_ docs: [[String: FieldValueData]]) -> FieldValueData {
        switch kind {
        case .count(let upTo):
            return .integer(min(Int64(docs.count), upTo ?? .max))
        case .sum(let path), .average(let path):
            var intSum: Int64 = 0, doubleSum = 0.0, allInts = true, n = 0
            for d in docs {
                switch FieldValueData.map(d).value(at: path) {
                case .integer(let i)?:
                    n += 1
                    doubleSum += Double(i)
                    if allInts {
                        let (r, o) = intSum.addingReportingOverflow(i)
                        if o { allInts = false } else { intSum = r }
                    }
                case .double(let x)?:
                    n += 1
                    doubleSum += x
                    allInts = false
                default: continue
                }
            }
            if case .average = kind { return n == 0 ? .null : .double(doubleSum / Double(n)) }
            return allInts ? .integer(intSum) : .double(doubleSum)
        }
    }
}
