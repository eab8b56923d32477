import FerryDocuments
import FerryDocumentsSync
import FerryTestSupport
import Foundation
import Synchronization
import Testing

/// Firestore's spec cases (the seam harness's `FerryDocumentsTests/Conformance`, and every file
/// in the directory `FERRY_FIRESTORE_SPEC` names) run end to end: the user's steps through the
/// public API of a store connected to a real `ferry-server`, the server's documents made real
/// by a second client, and every listener compared with what the case expects once it has
/// heard the server.
///
/// A case's watch messages describe the server's view; here a second client writes each new
/// document version the case streams (a version the case already showed, or a document the
/// client itself is still writing, is not a server change), and the real server sends whatever
/// messages it sends. So what is compared is what the user sees when it settles, not each
/// scripted step's events: at a step whose expected event is settled (from the server, no
/// pending writes), or any step while the network is off, each listener's latest snapshot must
/// come to hold exactly the documents the expected events add up to, with the same
/// `fromCache` and pending writes only where the case has them. Versions are the server's own.
/// (Online with pending writes, what a listener shows depends on when it heard the server,
/// which a real server decides.) Calls of `waitForPendingWrites` must have returned at least as
/// often as the case expects, when it expects it. At the end, online, once every write has its
/// answer, each listener must show what the server answers a second client for its query.
/// A case fails if it compared fewer states than it has. A stream failure cuts the client's
/// connection (it goes through a proxy), once the client has connected again after the last.
///
/// Cases whose point is a server misbehaving or a message a real server chooses (existence
/// filter mismatches, resets, rejected writes, errors), a cache-only listener,
/// the SDK's own collector or users, or nothing that settles (the SDK's timers and counters),
/// are not end to end: ``EndToEndSpecCase/notApplicable(_:)`` says why for each, and the seam
/// harness runs all of them.
@Suite(.serialized) struct FirestoreSpecEndToEndTests {
    static let directory = ProcessInfo.processInfo.environment["FERRY_FIRESTORE_SPEC"]
        ?? (URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().path + "/FerryDocumentsTests/Conformance")

    static func cases() throws -> [(file: String, name: String, body: [String: Any])] {
        var out: [(String, String, [String: Any])] = []
        for file in try FileManager.default.contentsOfDirectory(atPath: directory).sorted() where file.hasSuffix(".json") {
            let all = try JSONSerialization.jsonObject(with: Data(contentsOf: URL(fileURLWithPath: directory + "/" + file))) as! [String: Any]
            for name in all.keys.sorted() { out.append((file, name, all[name] as! [String: Any])) }
        }
        return out
    }

    @Test func firestoreSpecCasesHoldEndToEndThroughFerryServer() async throws {
        let dir = try TemporaryDirectory("firestore-spec-e2e")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        var ran = 0, compared = 0
        var failed: [String] = []
        var notApplicable: [String: Int] = [:]
        for (i, c) in try Self.cases().enumerated() {
            if let reason = EndToEndSpecCase.notApplicable(c.body) {
                notApplicable[reason, default: 0] += 1
                continue
            }
            let runner = EndToEndSpecCase(c.body, dir: try TemporaryDirectory("spec-e2e-\(i)"), server: server, project: "spec-\(i)")
            var problem: String?
            do { problem = try await runner.run() } catch { problem = "threw \(error)" }
            await runner.close()
            ran += 1
            compared += runner.compared
            if let problem { failed.append("\(c.file)\t\(c.name): \(problem)") }
        }
        print("Firestore spec cases end to end: \(ran) run (\(compared) settled states compared), \(failed.count) failed; not end to end: "
              + notApplicable.sorted { $0.key < $1.key }.map { "\($0.value) \($0.key)" }.joined(separator: ", "))
        for f in failed { print("  FAIL \(f)") }
        #expect(failed.isEmpty, "\(failed.count) spec cases failed end to end")
        // The shipped files hold 137 cases; the rules above leave 60 of them end to end (and
        // each case checks that it compared every state it has).
        #expect(ran >= (ProcessInfo.processInfo.environment["FERRY_FIRESTORE_SPEC"] == nil ? 60 : 1))
        #expect(server.terminate() == 0)
    }
}

/// One spec case, run against a real server (see ``FirestoreSpecEndToEndTests``).
final class EndToEndSpecCase: @unchecked Sendable {
    /// What a listener has shown last.
    struct Shown: Sendable {
        var docs: [String: String] = [:]
        var fromCache = true
        var hasPendingWrites = false
        var error: String?
        var any = false
    }

    final class ShownBox: Sendable {
        let value = Mutex(Shown())
        func withLock<R>(_ body: (inout Shown) -> R) -> R { value.withLock { body(&$0) } }
    }

    let body: [String: Any]
    let dir: TemporaryDirectory
    let server: ServerProcess
    let project: String
    var client: (db: Firestore, connection: FirestoreConnection)?
    /// Between the client and the server: a stream failure cuts its connections.
    var proxy: CuttingProxy?
    /// The second client that makes the server's own changes.
    var writer: (db: Firestore, connection: FirestoreConnection)?
    var listeners: [String: (registration: ListenerRegistration, shown: ShownBox, query: [String: Any])] = [:]
    /// Per listened query, the documents its expected events add up to.
    var expected: [String: [String: String]] = [:]
    /// What each streamed document of the case is to the server (see ``serverChange(of:)``).
    let serverChanges: [String: ServerChange]
    /// By step, the documents the case's server held before the client's write at that step
    /// reached it.
    let seeds: [Int: [(key: String, value: [String: Any]?)]]
    var networkOn = true
    /// How many settled states were compared.
    var compared = 0
    /// The calls of `waitForPendingWrites` that returned.
    let waitsResolved = Mutex(0)

    init(_ body: [String: Any], dir: TemporaryDirectory, server: ServerProcess, project: String) {
        self.body = body
        self.dir = dir
        self.server = server
        self.project = project
        (serverChanges, seeds) = Self.plan(body["steps"] as! [[String: Any]])
    }

    /// What a document version the case streams is to its server.
    enum ServerChange {
        /// A version the case showed already: the stream repeating itself.
        case replay
        /// The state the client's pending write to it was made on: put there just before that write.
        case before
        /// Another client's change, after any of the client's own writes to it.
        case after(clientWrote: Bool)
    }

    /// Reads the case's script as the history of one server: by the versions the client's
    /// writes were acknowledged at, each streamed document version (by step and key) is a
    /// change another client made after them, the state they were made on, or a replay.
    static func plan(_ steps: [[String: Any]]) -> (changes: [String: ServerChange], seeds: [Int: [(key: String, value: [String: Any]?)]]) {
        func written(_ step: [String: Any]) -> String? {
            ((step["userSet"] ?? step["userPatch"]) as? [Any])?.first as? String ?? step["userDelete"] as? String
        }
        // The client's writes in order, with their step and the version each was acknowledged at.
        var writes: [(key: String, step: Int, acknowledged: Int?)] = []
        var pending: [Int] = []
        for (i, step) in steps.enumerated() {
            if let key = written(step) {
                writes.append((key, i, nil))
                pending.append(writes.count - 1)
            } else if let ack = step["writeAck"] as? [String: Any], !pending.isEmpty {
                writes[pending.removeFirst()].acknowledged = ack["version"] as? Int ?? 0
            }
        }
        var changes: [String: ServerChange] = [:]
        var seeds: [Int: [(key: String, value: [String: Any]?)]] = [:]
        var newest: [String: Int] = [:]
        var next = 0
        for (i, step) in steps.enumerated() {
            if written(step) != nil { next += 1 }
            for d in (step["watchEntity"] as? [String: Any])?["docs"] as? [[String: Any]] ?? [] {
                let key = d["key"] as! String, version = d["version"] as? Int ?? 0
                let id = "\(i)/\(key)"
                guard version > newest[key, default: -1] else { changes[id] = .replay; continue }
                newest[key] = version
                // The client's writes so far that the case's server applied after this version.
                let later = writes[..<next].filter { $0.key == key && ($0.acknowledged.map { $0 > version } ?? true) }
                if let write = later.first {
                    changes[id] = .before
                    seeds[write.step, default: []].append((key, d["value"] as? [String: Any]))
                } else {
                    changes[id] = .after(clientWrote: writes[..<next].contains { $0.key == key })
                }
            }
        }
        return (changes, seeds)
    }

    static func action(_ step: [String: Any]) -> String {
        step.keys.first { !["expectedSnapshotEvents", "expectedState", "clientIndex", "expectedSnapshotsInSyncEvents", "expectedWaitForPendingWritesEvents"].contains($0) } ?? "?"
    }

    /// Why a case is not run end to end, or nil when it is.
    static func notApplicable(_ body: [String: Any]) -> String? {
        // Per target, the listen and unlisten requests the case's server has not answered.
        var unanswered: [Int: Int] = [:]
        var active = Set<Int>()
        for step in body["steps"] as? [[String: Any]] ?? [] {
            let action = Self.action(step)
            switch action {
            case "userListen":
                let t = (step[action] as! [String: Any])["targetId"] as! Int
                unanswered[t, default: 0] += 1
                active.insert(t)
            case "userUnlisten":
                let t = (step[action] as! [Any])[0] as! Int
                unanswered[t, default: 0] += 1
                active.remove(t)
            case "watchAck":
                for t in step[action] as! [Int] { unanswered[t, default: 0] -= 1 }
            case "watchRemove":
                for t in (step[action] as! [String: Any])["targetIds"] as! [Int] { unanswered[t, default: 0] -= 1 }
            case "enableNetwork":
                // A new stream: the active targets are asked for once more.
                unanswered = step[action] as! Bool ? Dictionary(uniqueKeysWithValues: active.map { ($0, 1) }) : [:]
            case "restart":
                unanswered = [:]
                active = []
            case "watchEntity":
                if ((step[action] as! [String: Any])["targets"] as? [Int] ?? []).contains(where: { unanswered[$0, default: 0] > 1 }) {
                    return "messages for a target asked for again since (the SDK drops them)"
                }
            default: break
            }
            switch action {
            case "watchFilter": return "existence filter (a server whose count disagrees)"
            case "watchReset": return "target reset"
            case "failWrite": return "rejected write"
            case "triggerLruGC": return "the SDK's collector"
            case "changeUser": return "users"
            case "addSnapshotsInSyncListener", "removeSnapshotsInSyncListener": return "snapshots-in-sync listeners"
            case "watchRemove" where (step[action] as? [String: Any])?["cause"] != nil: return "target removed with an error"
            case "watchEntity" where (step[action] as? [String: Any])?["docs"] == nil: return "a document leaving a target without its new value"
            case "userListen" where (((step[action] as? [String: Any])?["options"] as? [String: Any])?["source"] as? String) == "cache":
                return "cache-only listener"
            default: continue
            }
        }
        if comparisons(body) == 0 { return "nothing a real server settles (the SDK's own state: timers, counters)" }
        return nil
    }

    /// A store connected to the server: the client through a proxy whose connections a
    /// stream failure cuts, the second client directly.
    func connect(_ name: String) throws -> (Firestore, FirestoreConnection) {
        // A case tagged eager-gc is the SDK's memory cache with eager collection.
        var eager = FirestoreSettings()
        eager.cacheSettings = .memoryEager
        let db = name == "client" && (body["tags"] as? [String] ?? []).contains("eager-gc")
            ? Firestore.inMemory(settings: eager) : try Firestore.open(at: dir.sub(name))
        var port = server.firestorePort!
        if name == "client" {
            if proxy == nil { proxy = try CuttingProxy(to: port) }
            port = proxy!.port
        }
        let c = try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: port, project: project))
        return (db, c)
    }

    func close() async {
        for l in listeners.values { l.registration.remove() }
        listeners = [:]
        for c in [client, writer].compactMap({ $0 }) {
            await c.connection.close()
            try? await c.db.terminate()
        }
        client = nil
        writer = nil
        proxy?.stop()
    }

    /// Runs the case; nil when it held, else what went wrong first.
    func run() async throws -> String? {
        client = try connect("client")
        var waitsExpected = 0
        for (i, step) in (body["steps"] as! [[String: Any]]).enumerated() {
            let action = Self.action(step)
            for seed in seeds[i] ?? [] { try await makeServerHold(seed.key, seed.value) }
            try await perform(action, step[action] as Any, step: i)
            let events = step["expectedSnapshotEvents"] as? [[String: Any]] ?? []
            for e in events { add(e) }
            for e in events {
                if let problem = await settle(e) { return "step \(i) \(action): \(problem)" }
            }
            if let n = step["expectedWaitForPendingWritesEvents"] as? Int {
                // A real server may answer sooner than the case's script: at least as many.
                waitsExpected += n
                compared += 1
                if !(await eventually { waitsResolved.withLock { $0 } >= waitsExpected }) {
                    return "step \(i) \(action): \(waitsResolved.withLock { $0 }) waits for pending writes resolved, expected \(waitsExpected)"
                }
            }
        }
        // The end: online, once every write has its answer, each listener shows what the
        // server answers another client for its query.
        if networkOn {
            try await client!.db.waitForPendingWrites()
            if writer == nil { writer = try connect("writer") }
            for key in listeners.keys.sorted() {
                let q = listeners[key]!.query
                let raw = q["path"] as? String ?? ""
                var truth: [String: String] = [:]
                if q["collectionGroup"] == nil && raw.split(separator: "/").count % 2 == 0 && !raw.isEmpty {
                    let d = try await writer!.db.document(raw).getDocument(source: .server)
                    if let data = d.data() { truth[raw] = Self.canonical(data) }
                } else {
                    for d in try await Self.query(q, in: writer!.db).getDocuments(source: .server).documents {
                        truth[d.reference.path] = Self.canonical(d.data())
                    }
                }
                expected[key] = truth
                if let problem = await settle(["query": q, "fromCache": false, "hasPendingWrites": false]) {
                    return "at the end, against the server's answer: \(problem)"
                }
            }
        }
        let planned = Self.comparisons(body)
        if compared != planned { return "compared \(compared) settled states where the case has \(planned)" }
        return nil
    }

    /// How many settled states the case has to compare (see ``settle(_:)``), and waits for
    /// pending writes to count.
    static func comparisons(_ body: [String: Any]) -> Int {
        var networkOn = true, n = 0
        var listened = Set<String>()
        for step in body["steps"] as? [[String: Any]] ?? [] {
            if let on = step["enableNetwork"] as? Bool { networkOn = on }
            if let l = step["userListen"] as? [String: Any] { listened.insert(canonical(l["query"] as Any)) }
            if let u = step["userUnlisten"] as? [Any] { listened.remove(canonical(u[1])) }
            if step["restart"] != nil { listened = [] }
            for e in step["expectedSnapshotEvents"] as? [[String: Any]] ?? [] {
                if !networkOn || (!(e["fromCache"] as? Bool ?? false) && !(e["hasPendingWrites"] as? Bool ?? false)) { n += 1 }
            }
            if step["expectedWaitForPendingWritesEvents"] != nil { n += 1 }
        }
        return n + (networkOn ? listened.count : 0)
    }

    func perform(_ action: String, _ v: Any, step: Int) async throws {
        let db = client!.db
        switch action {
        case "userListen":
            let q = (v as! [String: Any])["query"] as! [String: Any]
            listen(q)
        case "userUnlisten":
            let key = Self.canonical((v as! [Any])[1])
            listeners.removeValue(forKey: key)?.registration.remove()
            expected[key] = nil
        case "userSet", "userPatch":
            let a = v as! [Any]
            let path = a[0] as! String
            let data = Self.sentinels(a[1]) as! [String: Any]
            if action == "userSet" { try await db.document(path).setData(data) } else { try await db.document(path).updateData(data) }
        case "userDelete":
            let path = v as! String
            try await db.document(path).delete()
        case "watchEntity":
            for d in (v as! [String: Any])["docs"] as? [[String: Any]] ?? [] {
                let key = d["key"] as! String
                switch serverChanges["\(step)/\(key)"] {
                case nil, .replay?, .before?: continue
                case .after(let clientWrote)?:
                    // The case's server took the client's writes to this document first.
                    if clientWrote && networkOn { try await db.waitForPendingWrites() }
                    try await makeServerHold(key, d["value"] as? [String: Any])
                }
            }
        case "enableNetwork":
            networkOn = v as! Bool
            if networkOn { await db.enableNetwork() } else { await db.disableNetwork() }
        case "watchStreamClose":
            // The connection fails under the stream (once the client has connected again after
            // the last failure): the client reconnects and listens again.
            if networkOn && !listeners.isEmpty, let proxy {
                guard await eventually({ proxy.live > 0 }), proxy.cut({ _ in true }) > 0 else {
                    throw FirestoreErrorCode(.internal, "a stream failure found no connection to cut while the client listens")
                }
            }
        case "waitForPendingWrites":
            Task { [self] in
                try await db.waitForPendingWrites()
                waitsResolved.withLock { $0 += 1 }
            }
        case "restart":
            for l in listeners.values { l.registration.remove() }
            listeners = [:]
            expected = [:]
            await client!.connection.close()
            try await db.terminate()
            client = try connect("client")
            if !networkOn { await client!.db.disableNetwork() }
        default:
            // The server's own messages (acks, CURRENT, snapshots, removals after an
            // unlisten), timers and waits: the real server and client do these themselves.
            break
        }
    }

    /// Has the second client write `value` (nil: delete) unless the server holds it already.
    func makeServerHold(_ key: String, _ value: [String: Any]?) async throws {
        if writer == nil { writer = try connect("writer") }
        let ref = writer!.db.document(key)
        let current = try await ref.getDocument(source: .server)
        let want = value.map { Self.canonical($0) }
        guard current.data().map({ Self.canonical($0) }) != want else { return }
        if let value { try await ref.setData(value) } else { try await ref.delete() }
        try await writer!.db.waitForPendingWrites()
    }

    func listen(_ q: [String: Any]) {
        let key = Self.canonical(q)
        let shown = ShownBox()
        let raw = q["path"] as? String ?? ""
        let segments = raw.split(separator: "/")
        let registration: ListenerRegistration
        if q["collectionGroup"] == nil && !segments.isEmpty && segments.count % 2 == 0 {
            registration = client!.db.document(raw).addSnapshotListener(includeMetadataChanges: true) { snap, error in
                shown.withLock { s in
                    s.any = true
                    if let error { s.error = "\(error)"; return }
                    guard let snap else { return }
                    s.docs = snap.data().map { [snap.reference.path: Self.canonical($0)] } ?? [:]
                    s.fromCache = snap.metadata.isFromCache
                    s.hasPendingWrites = snap.metadata.hasPendingWrites
                }
            }
        } else {
            registration = Self.query(q, in: client!.db).addSnapshotListener(includeMetadataChanges: true) { snap, error in
                shown.withLock { s in
                    s.any = true
                    if let error { s.error = "\(error)"; return }
                    guard let snap else { return }
                    s.docs = Dictionary(uniqueKeysWithValues: snap.documents.map { ($0.reference.path, Self.canonical($0.data())) })
                    s.fromCache = snap.metadata.isFromCache
                    s.hasPendingWrites = snap.metadata.hasPendingWrites
                }
            }
        }
        listeners[key] = (registration, shown, q)
        expected[key] = [:]
    }

    /// Adds one expected event to its query's expected documents.
    func add(_ e: [String: Any]) {
        let key = Self.canonical(e["query"] as Any)
        var docs = expected[key] ?? [:]
        for kind in ["added", "modified"] {
            for d in e[kind] as? [[String: Any]] ?? [] { docs[d["key"] as! String] = Self.canonical(d["value"] as Any) }
        }
        for d in e["removed"] as? [[String: Any]] ?? [] { docs[d["key"] as! String] = nil }
        expected[key] = docs
    }

    /// Waits until the listener of event `e`'s query shows what the case expects, when the
    /// event is one a real server must come to (see the type's comment); nil when it does.
    func settle(_ e: [String: Any]) async -> String? {
        let key = Self.canonical(e["query"] as Any)
        let fromCache = e["fromCache"] as? Bool ?? false
        let pending = e["hasPendingWrites"] as? Bool ?? false
        guard !networkOn || (!fromCache && !pending), let l = listeners[key], let want = expected[key] else { return nil }
        compared += 1
        let ok = await eventually {
            l.shown.withLock { s in
                s.any && s.error == nil && s.docs == want && s.fromCache == fromCache && (pending || !s.hasPendingWrites)
            }
        }
        if ok { return nil }
        let s = l.shown.withLock { $0 }
        return "\(key) shows \(s.docs.sorted { $0.key < $1.key }) fromCache \(s.fromCache) pending \(s.hasPendingWrites)\(s.error.map { " error \($0)" } ?? ""); expected \(want.sorted { $0.key < $1.key }) fromCache \(fromCache)\(pending ? "" : " pending false")"
    }

    // MARK: The case's notation in the public API

    static func query(_ q: [String: Any], in db: Firestore) -> Query {
        var query: Query
        if let group = q["collectionGroup"] as? String {
            query = db.collectionGroup(group)
        } else {
            query = db.collection(q["path"] as! String)
        }
        for f in q["filters"] as? [[Any]] ?? [] {
            let field = f[0] as! String, value = f[2]
            switch f[1] as! String {
            case "==": query = query.whereField(field, isEqualTo: value)
            case "!=": query = query.whereField(field, isNotEqualTo: value)
            case "<": query = query.whereField(field, isLessThan: value)
            case "<=": query = query.whereField(field, isLessThanOrEqualTo: value)
            case ">": query = query.whereField(field, isGreaterThan: value)
            case ">=": query = query.whereField(field, isGreaterThanOrEqualTo: value)
            case "array-contains": query = query.whereField(field, arrayContains: value)
            case "array-contains-any": query = query.whereField(field, arrayContainsAny: value as! [Any])
            case "in": query = query.whereField(field, in: value as! [Any])
            case "not-in": query = query.whereField(field, notIn: value as! [Any])
            case let op: fatalError("a spec query with the operator \(op)")
            }
        }
        for o in q["orderBys"] as? [[String]] ?? [] { query = query.order(by: o[0], descending: o[1] == "desc") }
        if let limit = q["limit"] as? Int {
            query = (q["limitType"] as? String) == "LimitToLast" ? query.limit(toLast: limit) : query.limit(to: limit)
        }
        return query
    }

    /// The spec's stand-ins for special values: "<DELETE>" is `FieldValue.delete()`.
    static func sentinels(_ v: Any) -> Any {
        if let s = v as? String, s == "<DELETE>" { return FieldValue.delete() }
        if let m = v as? [String: Any] { return m.mapValues(sentinels) }
        if let a = v as? [Any] { return a.map(sentinels) }
        return v
    }

    static func canonical(_ v: Any) -> String {
        String(decoding: (try? JSONSerialization.data(withJSONObject: v, options: [.sortedKeys, .fragmentsAllowed])) ?? Data(), as: UTF8.self)
    }
}
