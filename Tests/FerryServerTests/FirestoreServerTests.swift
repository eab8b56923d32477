import FerryDocuments
import FerryFirestoreWire
import FerryTestSupport
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import SwiftProtobuf
import Synchronization
import Testing

typealias FS = Google_Firestore_V1_Firestore

/// A gRPC client of a test server's Firestore API, raw: the tests build the messages.
struct RawFirestore {
    static let database = "projects/raw/databases/(default)"
    static let root = database + "/documents"

    /// A client on `port` (`window`: the HTTP/2 flow-control window it offers, when not the default).
    static func with<T: Sendable>(_ port: Int, window: Int? = nil, _ body: (FS.Client<HTTP2ClientTransport.Posix>, GRPCClient<HTTP2ClientTransport.Posix>) async throws -> T) async throws -> T {
        let transport = try HTTP2ClientTransport.Posix(target: .ipv4(address: "127.0.0.1", port: port), transportSecurity: .plaintext,
                                                       config: .defaults { if let window { $0.http2.targetWindowSize = window } })
        return try await withGRPCClient(transport: transport) { client in
            try await body(FS.Client(wrapping: client), client)
        }
    }

    static func value(_ v: Any) -> Google_Firestore_V1_Value {
        var out = Google_Firestore_V1_Value()
        switch v {
        case let i as Int: out.integerValue = Int64(i)
        case let s as String: out.stringValue = s
        case let m as [String: Any]:
            var map = Google_Firestore_V1_MapValue()
            map.fields = m.mapValues(value)
            out.mapValue = map
        default: out.nullValue = .nullValue
        }
        return out
    }

    static func set(_ path: String, _ fields: [String: Any]) -> Google_Firestore_V1_Write {
        var w = Google_Firestore_V1_Write()
        var d = Google_Firestore_V1_Document()
        d.name = root + "/" + path
        d.fields = fields.mapValues(value)
        w.update = d
        return w
    }

    static func commit(_ writes: [Google_Firestore_V1_Write]) -> Google_Firestore_V1_CommitRequest {
        var r = Google_Firestore_V1_CommitRequest()
        r.database = database
        r.writes = writes
        return r
    }

    /// A Listen target of `structuredQuery` (a collection's, as ``query(_:limit:offset:)`` makes it) as `id`.
    static func target(_ structuredQuery: Google_Firestore_V1_StructuredQuery, id: Int32) -> Google_Firestore_V1_Target {
        var t = Google_Firestore_V1_Target()
        t.targetID = id
        t.query.parent = root
        t.query.structuredQuery = structuredQuery
        return t
    }

    /// The `ListenRequest` that adds `target`.
    static func listenRequest(_ target: Google_Firestore_V1_Target) -> Google_Firestore_V1_ListenRequest {
        var r = Google_Firestore_V1_ListenRequest()
        r.database = database
        r.addTarget = target
        return r
    }

    static func query(_ collection: String, limit: Int32? = nil, offset: Int32 = 0) -> Google_Firestore_V1_RunQueryRequest {
        var r = Google_Firestore_V1_RunQueryRequest()
        r.parent = root
        var q = Google_Firestore_V1_StructuredQuery()
        var from = Google_Firestore_V1_StructuredQuery.CollectionSelector()
        from.collectionID = collection
        q.from = [from]
        if let limit { q.limit = Google_Protobuf_Int32Value(limit) }
        q.offset = offset
        r.structuredQuery = q
        return r
    }
}

final class StreamCounts: Sendable {
    let ready = Atomic<Int>(0)
    let documents = Atomic<Int>(0)
}

/// Any bytes, as a message: for malformed requests.
struct RawBytes: MessageSerializer, MessageDeserializer {
    func serialize<Bytes: GRPCContiguousBytes>(_ message: [UInt8]) throws -> Bytes { Bytes(message) }
    func deserialize<Bytes: GRPCContiguousBytes>(_ bytes: Bytes) throws -> [UInt8] { bytes.withUnsafeBytes { Array($0) } }
}

/// `ferry-server`'s Firestore API on its own: refusals of bad input, durability, resumed listens.
@Suite struct FirestoreServerTests {
    static func code(_ body: () async throws -> Void) async -> RPCError.Code? {
        do {
            try await body()
            return nil
        } catch let e as RPCError {
            return e.code
        } catch {
            return .unknown
        }
    }

    @Test func badInputGetsTheRightStatusAndTheServerGoesOn() async throws {
        let dir = try TemporaryDirectory("firestore-bad-input")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0", "--token", "user"])
        try await RawFirestore.with(server.firestorePort!) { fs, client in
            func commitCode(_ writes: [Google_Firestore_V1_Write], database: String = RawFirestore.database) async -> RPCError.Code? {
                var r = RawFirestore.commit(writes)
                r.database = database
                return await Self.code { _ = try await fs.commit(r) }
            }
            // Names.
            #expect(await commitCode([RawFirestore.set("onlyACollection", [:])]) == .invalidArgument)
            var outside = RawFirestore.set("a/b", [:])
            outside.update.name = "projects/other/databases/(default)/documents/a/b"
            #expect(await commitCode([outside]) == .invalidArgument)
            #expect(await commitCode([RawFirestore.set("a/__reserved__", [:])]) == .invalidArgument)
            #expect(await commitCode([RawFirestore.set("a/b", [:])], database: "not a database") == .invalidArgument)
            #expect(await commitCode([Google_Firestore_V1_Write()]) == .invalidArgument)
            // Sizes and depth.
            #expect(await commitCode([RawFirestore.set("a/big", ["s": String(repeating: "x", count: 1_048_600)])]) == .invalidArgument)
            var deep: [String: Any] = ["v": 1]
            for _ in 0..<25 { deep = ["d": deep] }
            #expect(await commitCode([RawFirestore.set("a/deep", deep)]) == .invalidArgument)
            // Preconditions.
            var create = RawFirestore.set("a/b", ["n": 1])
            create.currentDocument.exists = false
            #expect(await commitCode([create]) == nil)
            #expect(await commitCode([create]) == .alreadyExists)
            var update = RawFirestore.set("a/missing", ["n": 1])
            update.currentDocument.exists = true
            #expect(await commitCode([update]) == .notFound)
            var stale = RawFirestore.set("a/b", ["n": 2])
            stale.currentDocument.updateTime = Google_Protobuf_Timestamp(seconds: 1, nanos: 0)
            #expect(await commitCode([stale]) == .failedPrecondition)
            // Queries.
            func queryCode(_ r: Google_Firestore_V1_RunQueryRequest) async -> RPCError.Code? {
                await Self.code { _ = try await fs.runQuery(request: ClientRequest(message: r)) { response in for try await _ in response.messages {} } }
            }
            #expect(await queryCode(RawFirestore.query("a", limit: -1)) == .invalidArgument)
            #expect(await queryCode(RawFirestore.query("a", offset: -5)) == .invalidArgument)
            #expect(await queryCode(RawFirestore.query("a", limit: .max)) == nil)
            var cursor = RawFirestore.query("a")
            cursor.structuredQuery.startAt.values = [RawFirestore.value(1), RawFirestore.value(2)]
            #expect(await queryCode(cursor) == .invalidArgument)
            var tooMany = RawFirestore.query("a")
            var filter = Google_Firestore_V1_StructuredQuery.FieldFilter()
            filter.field.fieldPath = "n"
            filter.op = .in
            var values = Google_Firestore_V1_ArrayValue()
            values.values = (0..<31).map { RawFirestore.value($0) }
            filter.value.arrayValue = values
            tooMany.structuredQuery.where.fieldFilter = filter
            #expect(await queryCode(tooMany) == .invalidArgument)
            var noFrom = RawFirestore.query("a")
            noFrom.structuredQuery.from = []
            #expect(await queryCode(noFrom) == .invalidArgument)
            // Tokens: the owner, a known one, none; an unknown one is refused.
            var unknown = Metadata()
            unknown.addString("Bearer nobody", forKey: "authorization")
            #expect(await Self.code { _ = try await fs.commit(request: ClientRequest(message: RawFirestore.commit([]), metadata: unknown)) } == .unauthenticated)
            var known = Metadata()
            known.addString("Bearer user", forKey: "authorization")
            #expect(await Self.code { _ = try await fs.commit(request: ClientRequest(message: RawFirestore.commit([]), metadata: known)) } == nil)
            // Malformed bytes and an unknown method.
            let garbage: [UInt8] = [0xFF, 0xFF, 0xFF, 0xFF, 0x0F, 0x12, 0x99]
            let malformed = await Self.code {
                _ = try await client.unary(request: ClientRequest(message: garbage), descriptor: FS.Method.Commit.descriptor,
                                           serializer: RawBytes(), deserializer: RawBytes(), options: .defaults) { try $0.message }
            }
            #expect(malformed == .invalidArgument, "malformed bytes are the caller's error: \(String(describing: malformed))")
            let write = MethodDescriptor(fullyQualifiedService: "google.firestore.v1.Firestore", method: "Write")
            let unknownMethod = await Self.code {
                _ = try await client.unary(request: ClientRequest(message: [UInt8]()), descriptor: write,
                                           serializer: RawBytes(), deserializer: RawBytes(), options: .defaults) { try $0.message }
            }
            #expect(unknownMethod == .unimplemented)
            // A listen that never sends its request holds nothing up.
            let silent = Task {
                try await fs.listen(requestProducer: { _ in try await Task.sleep(for: .seconds(3600)) }, onResponse: { r in for try await _ in r.messages {} })
            }
            #expect(await commitCode([RawFirestore.set("a/after", ["n": 1])]) == nil)
            silent.cancel()
            _ = await silent.result
            // Still serving, and what was refused left nothing.
            var get = Google_Firestore_V1_BatchGetDocumentsRequest()
            get.database = RawFirestore.database
            get.documents = ["big", "deep", "missing", "b", "after"].map { RawFirestore.root + "/a/" + $0 }
            let found = try await fs.batchGetDocuments(request: ClientRequest(message: get)) { r in
                var names: [String] = []
                for try await m in r.messages { if case .found(let d)? = m.result { names.append(String(d.name.split(separator: "/").last!)) } }
                return names.sorted()
            }
            #expect(found == ["after", "b"])
        }
        #expect(server.terminate() == 0)
    }

    @Test func anAnsweredCommitSurvivesKill9() async throws {
        let dir = try TemporaryDirectory("firestore-durable")
        var server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (http, port) = (server.port, server.firestorePort!)
        try await RawFirestore.with(port) { fs, _ in
            for i in 0..<50 { _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("d/\(i)", ["i": i])])) }
        }
        server.kill9()
        server = try ServerProcess(data: dir.path, port: http, ["--firestore-port", String(port)])
        let count = try await RawFirestore.with(port) { fs, _ in
            try await fs.runQuery(request: ClientRequest(message: RawFirestore.query("d"))) { r in
                var n = 0
                for try await m in r.messages where m.hasDocument { n += 1 }
                return n
            }
        }
        #expect(count == 50)
        #expect(server.terminate() == 0)
    }

    /// The messages of one listen until its `n`-th global NO_CHANGE; `onSnapshot` is told the
    /// number of each as it comes.
    static func listen(_ fs: FS.Client<HTTP2ClientTransport.Posix>, _ target: Google_Firestore_V1_Target, snapshots n: Int = 1,
                       onSnapshot: @escaping @Sendable (Int) -> Void = { _ in }) async throws -> [Google_Firestore_V1_ListenResponse] {
        let request = RawFirestore.listenRequest(target)
        return try await fs.listen(requestProducer: { writer in
            try await writer.write(request)
            try await Task.sleep(for: .seconds(3600))
        }, onResponse: { response in
            var out: [Google_Firestore_V1_ListenResponse] = []
            var seen = 0
            for try await m in response.messages {
                out.append(m)
                if case .targetChange(let c)? = m.responseType, c.targetChangeType == .noChange, c.targetIds.isEmpty {
                    seen += 1
                    onSnapshot(seen)
                    if seen == n { return out }
                }
            }
            return out
        })
    }

    @Test func aConnectionWithMoreListensThanHTTP2sDefaultStillCommitsAndHearsEveryOne() async throws {
        let dir = try TemporaryDirectory("firestore-many-streams")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        try await RawFirestore.with(server.firestorePort!) { fs, _ in
            let request = RawFirestore.listenRequest(RawFirestore.target(RawFirestore.query("many").structuredQuery, id: 1))
            let counts = StreamCounts()
            try await withThrowingTaskGroup(of: Void.self) { group in
                for _ in 0..<150 {
                    group.addTask {
                        try await fs.listen(requestProducer: { writer in
                            try await writer.write(request)
                            try await Task.sleep(for: .seconds(3600))
                        }, onResponse: { response in
                            var snapshots = 0
                            for try await m in response.messages {
                                if case .documentChange? = m.responseType { counts.documents.add(1, ordering: .relaxed) }
                                if case .targetChange(let c)? = m.responseType, c.targetChangeType == .noChange, c.targetIds.isEmpty {
                                    snapshots += 1
                                    if snapshots == 1 { counts.ready.add(1, ordering: .relaxed) } else { return }
                                }
                            }
                        })
                    }
                }
                let ready = await eventually { counts.ready.load(ordering: .relaxed) == 150 }
                #expect(ready, "every listen gets its first snapshot (\(counts.ready.load(ordering: .relaxed)) of 150)")
                guard ready else { return group.cancelAll() }
                _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("many/one", ["n": 1])]))
                try await group.waitForAll()
            }
            #expect(counts.documents.load(ordering: .relaxed) == 150)
        }
        #expect(server.terminate() == 0)
    }

    @Test func aListenResumedFromItsTokenGetsOnlyWhatChangedSince() async throws {
        let dir = try TemporaryDirectory("firestore-resume")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        try await RawFirestore.with(server.firestorePort!) { fs, _ in
            _ = try await fs.commit(RawFirestore.commit(["a", "b", "d"].map { RawFirestore.set("c/\($0)", ["v": 1]) }))
            let target = RawFirestore.target(RawFirestore.query("c").structuredQuery, id: 7)
            let first = try await Self.listen(fs, target)
            #expect(first.filter { if case .documentChange = $0.responseType { true } else { false } }.count == 3)
            let token = try #require(first.last?.targetChange.resumeToken)

            var delete = Google_Firestore_V1_Write()
            delete.delete = RawFirestore.root + "/c/b"
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("c/a", ["v": 2]), delete, RawFirestore.set("c/e", ["v": 1])]))

            var resumed = target
            resumed.resumeToken = token
            let again = try await Self.listen(fs, resumed)
            let changed = again.compactMap { m -> String? in
                if case .documentChange(let c)? = m.responseType { String(c.document.name.split(separator: "/").last!) } else { nil }
            }
            let deleted = again.compactMap { m -> String? in
                if case .documentDelete(let d)? = m.responseType { String(d.document.split(separator: "/").last!) } else { nil }
            }
            #expect(changed.sorted() == ["a", "e"], "only what changed since the token is sent again")
            #expect(deleted == ["b"])
            let count = again.compactMap { m -> Int32? in if case .filter(let f)? = m.responseType { f.count } else { nil } }
            #expect(count == [3])
            #expect(!again.contains { $0.targetChange.targetChangeType == .reset })

            // A token of another store (or made up) starts over: RESET, then everything.
            var foreign = target
            foreign.resumeToken = Data([1, 2, 3])
            let reset = try await Self.listen(fs, foreign)
            #expect(reset.contains { $0.targetChange.targetChangeType == .reset })
            #expect(reset.filter { if case .documentChange = $0.responseType { true } else { false } }.count == 3)
        }
        #expect(server.terminate() == 0)
    }
}

extension FirestoreServerTests {
    @Test func aListenWhoseClientStopsReadingIsCutOffByTheBytesWaitingNotOnlyByTheirCount() async throws {
        let dir = try TemporaryDirectory("firestore-listen-bytes")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0", "--max-stream-buffer", String(1 << 20)])
        let port = server.firestorePort!
        let target = RawFirestore.target(RawFirestore.query("big").structuredQuery, id: 2)
        let request = RawFirestore.listenRequest(target)
        let synced = AsyncStream<Void>.makeStream()
        let resume = AsyncStream<Void>.makeStream()
        let outcome = Task {
            // A small window, so that what waits for the client is in the server, not in transit.
            try await RawFirestore.with(port, window: 1 << 16) { fs, _ in
                try await fs.listen(requestProducer: { [request] writer in
                    try await writer.write(request)
                    try await Task.sleep(for: .seconds(3600))
                }, onResponse: { response -> (documents: Int, error: RPCError.Code?) in
                    var documents = 0
                    var resumed = false
                    do {
                        for try await m in response.messages {
                            if case .documentChange? = m.responseType { documents += 1 }
                            if case .targetChange(let c)? = m.responseType, c.targetChangeType == .noChange, c.targetIds.isEmpty {
                                if !resumed {
                                    // Synced: stop reading until the writer is done.
                                    synced.continuation.yield()
                                    for await _ in resume.stream { break }
                                    resumed = true
                                } else if documents == 40 {
                                    return (documents, nil)
                                }
                            }
                        }
                    } catch let e as RPCError {
                        return (documents, e.code)
                    }
                    return (documents, nil)
                })
            }
        }
        for await _ in synced.stream { break }
        // 40 commits of 400 KB: 40 messages (far below the count bound), 16 MB (more than the
        // sockets' buffers on loopback hold).
        try await RawFirestore.with(port) { fs, _ in
            let big = String(repeating: "x", count: 400_000)
            for i in 0..<40 { _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("big/d\(i)", ["s": big])])) }
        }
        resume.continuation.yield()
        let (documents, error) = try await outcome.value
        #expect(error == .resourceExhausted, "the stream must end once 1 MiB waits, not go on to 16 MB (it delivered \(documents) documents)")
        #expect(documents < 40)
        // The server goes on.
        try await RawFirestore.with(port) { fs, _ in
            _ = try await fs.commit(RawFirestore.commit([RawFirestore.set("small/a", ["n": 1])]))
            var small = target
            small.query.structuredQuery = RawFirestore.query("small").structuredQuery
            let messages = try await Self.listen(fs, small)
            #expect(messages.filter { if case .documentChange? = $0.responseType { true } else { false } }.count == 1)
        }
        #expect(server.terminate() == 0)
    }
}
