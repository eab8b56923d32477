import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable import FerryDocuments

/// Runs Firestore's own spec cases (`Conformance/*_spec_test.json`, and every file in the
/// directory `FERRY_FIRESTORE_SPEC` names) through the document model's sync seam: the
/// server's watch and write messages scripted as each step says, the listeners' snapshots
/// compared with what the step expects.
@Suite struct SpecTests {
    static let directory = ProcessInfo.processInfo.environment["FERRY_FIRESTORE_SPEC"]
        ?? (URL(fileURLWithPath: #filePath).deletingLastPathComponent().path + "/Conformance")

    static func cases() throws -> [(file: String, name: String, body: [String: Any])] {
        var out: [(String, String, [String: Any])] = []
        for file in try FileManager.default.contentsOfDirectory(atPath: directory).sorted() where file.hasSuffix(".json") {
            let data = try Data(contentsOf: URL(fileURLWithPath: directory + "/" + file))
            let all = try JSONSerialization.jsonObject(with: data) as! [String: Any]
            for name in all.keys.sorted() { out.append((file, name, all[name] as! [String: Any])) }
        }
        return out
    }

    /// The cases Ferry does not pass yet, by file and name, with the reason (the README lists them).
    static func loadKnownFailures() throws -> [String: String] {
        let path = URL(fileURLWithPath: #filePath).deletingLastPathComponent().path + "/Conformance/known-failures.txt"
        let text = try String(contentsOfFile: path, encoding: .utf8)
        var out: [String: String] = [:]
        for line in text.split(separator: "\n") where !line.hasPrefix("#") {
            let parts = line.split(separator: "\t", maxSplits: 2).map(String.init)
            if parts.count == 3 { out[parts[0] + "\t" + parts[1]] = parts[2] }
        }
        return out
    }

    @Test func firestoreSpecCasesBehaveAsTheSDKs() async throws {
        var passed = 0, failed: [String] = [], unexpectedPasses: [String] = []
        let knownFailures = try Self.loadKnownFailures()
        for c in try Self.cases() {
            let id = c.file + "\t" + c.name
            let result: String?
            do { result = try await SpecRunner(c.body).run() } catch { result = "threw \(error)" }
            let known = knownFailures[id] != nil
            if let result {
                if !known { failed.append("\(id): \(result)") }
            } else {
                passed += 1
                if known { unexpectedPasses.append(id) }
            }
        }
        print("Firestore spec cases: \(passed) passed, \(failed.count) failed unexpectedly, \(knownFailures.count) known failures")
        for f in failed.prefix(40) { print("  FAIL \(f)") }
        #expect(failed.isEmpty, "\(failed.count) spec cases failed that are not listed as known failures")
        #expect(unexpectedPasses.isEmpty, "these cases pass now; take them off Conformance/known-failures.txt: \(unexpectedPasses)")
    }
}

/// One spec case, run step by step.
final class SpecRunner: @unchecked Sendable {
    let body: [String: Any]
    var db: Firestore
    let dir: TemporaryDirectory
    let persistent: Bool
    let eager: Bool
    /// Listeners by their query's canonical JSON.
    var listeners: [String: (id: Int, registration: ListenerRegistration, query: [String: Any])] = [:]
    let events = Locked<[(listener: Int, event: ListenerEvent)]>([])
    let callbacks = Locked<(acknowledged: [String], rejected: [String])>(([], []))
    var writes: [(batch: Int64, key: String)] = []
    let waitsResolved = Locked(0)
    let inSync = Locked(0)
    var inSyncRegistrations: [ListenerRegistration] = []

    init(_ body: [String: Any]) throws {
        self.body = body
        let tags = body["tags"] as? [String] ?? []
        let config = body["config"] as? [String: Any] ?? [:]
        // A case tagged eager-gc runs on a memory cache that drops what nothing needs at once;
        // every other case on a persistent store (restarts need one).
        eager = tags.contains("eager-gc")
        persistent = !eager
        _ = config
        dir = try TemporaryDirectory("ferry-spec")
        db = Firestore.inMemory()
        db = try open()
    }

    func open() throws -> Firestore {
        var settings = FirestoreSettings()
        settings.durability = .none
        let db = persistent ? try Firestore.open(at: dir.sub("store"), settings: settings) : Firestore.inMemory()
        let maxLimbo = (body["config"] as? [String: Any])?["maxConcurrentLimboResolutions"] as? Int
        db.state.withLock { e in
            e.remoteAttached = true
            e.onlineState = .unknown
            e.eagerGarbageCollection = eager
            if let maxLimbo { e.maxConcurrentLimboResolutions = maxLimbo }
        }
        return db
    }

    /// Runs the case; nil when it passed, else what went wrong first.
    func run() async throws -> String? {
        let steps = body["steps"] as! [[String: Any]]
        for (i, step) in steps.enumerated() {
            if let problem = try await perform(step) { return "step \(i) \(Self.actionName(step)): \(problem)" }
            db.drainDeliveries()
            let got = events.withLock { e in defer { e = [] }; return e }
            let expected = step["expectedSnapshotEvents"] as? [[String: Any]] ?? []
            if let problem = compare(expected, got) { return "step \(i) \(Self.actionName(step)): \(problem)" }
            if let n = step["expectedSnapshotsInSyncEvents"] as? Int {
                let have = inSync.withLock { c in defer { c = 0 }; return c }
                if have != n { return "step \(i) \(Self.actionName(step)): \(have) snapshots-in-sync events, expected \(n)" }
            } else {
                inSync.withLock { $0 = 0 }
            }
            if let n = step["expectedWaitForPendingWritesEvents"] as? Int {
                let ok = await eventually { waitsResolved.withLock { $0 } == n }
                if !ok { return "step \(i): \(waitsResolved.withLock { $0 }) waits for pending writes resolved, expected \(n)" }
                waitsResolved.withLock { $0 = 0 }
            }
            if let state = step["expectedState"] as? [String: Any], let problem = await check(state) {
                return "step \(i) \(Self.actionName(step)): state: \(problem)"
            }
        }
        try? await db.terminate()
        return nil
    }

    static func actionName(_ step: [String: Any]) -> String {
        step.keys.first { !["expectedSnapshotEvents", "expectedState", "clientIndex", "expectedSnapshotsInSyncEvents", "expectedWaitForPendingWritesEvents"].contains($0) } ?? "?"
    }

    // MARK: Steps

    func perform(_ step: [String: Any]) async throws -> String? {
        let action = Self.actionName(step)
        let v = step[action]
        switch action {
        case "userListen":
            let l = v as! [String: Any]
            let q = l["query"] as! [String: Any]
            let core = try Self.query(q)
            let key = Self.canonical(q)
            // The harness is the only caller: the listener gets the engine's next id.
            let id = db.state.withLock { $0.nextListenerID }
            let cacheOnly = ((l["options"] as? [String: Any])?["source"] as? String) == "cache"
            let reg = db.addListener(core, includeMetadataChanges: true, cacheOnly: cacheOnly) { [events] event in
                events.withLock { $0.append((id, event)) }
            }
            listeners[key] = (id, reg, q)
        case "userUnlisten":
            let a = v as! [Any]
            let key = Self.canonical(a[1] as! [String: Any])
            listeners.removeValue(forKey: key)?.registration.remove()
        case "userSet", "userPatch":
            let a = v as! [Any]
            let path = a[0] as! String
            let data = Self.sentinels(a[1]) as! [String: Any]
            let ref = db.document(path)
            if action == "userSet" { try await ref.setData(data) } else { try await ref.updateData(data) }
            trackWrite(path)
        case "userDelete":
            let path = v as! String
            try await db.document(path).delete()
            trackWrite(path)
        case "watchAck":
            let ids = v as! [Int]
            db.syncStep { $0.watchAck(ids); return [] }
        case "watchCurrent":
            let a = v as! [Any]
            let ids = a[0] as! [Int], token = a[1] as? String ?? ""
            db.syncStep { $0.watchCurrent(ids, resumeToken: token); return [] }
        case "watchEntity":
            let w = v as! [String: Any]
            let targets = w["targets"] as? [Int] ?? []
            let removed = w["removedTargets"] as? [Int] ?? []
            if let docs = w["docs"] as? [[String: Any]] {
                for d in docs {
                    let doc = try Self.watchDocument(d)
                    db.syncStep { $0.watchDocument(doc, key: doc.key, updated: targets, removed: removed); return [] }
                }
            } else if let key = w["key"] as? String {
                let k = try ResourcePath.parse(key, what: "key")
                db.syncStep { $0.watchDocument(nil, key: k, updated: targets, removed: removed); return [] }
            }
        case "watchRemove":
            let w = v as! [String: Any]
            let ids = w["targetIds"] as! [Int]
            let cause = (w["cause"] as? [String: Any]).map { FirestoreErrorCode(FirestoreErrorCode.Code(rawValue: $0["code"] as? Int ?? 2) ?? .unknown, $0["message"] as? String ?? "") }
            db.syncStep { $0.watchRemove(ids, error: cause) }
        case "watchFilter":
            let w = v as! [String: Any]
            let ids = w["targetIds"] as! [Int], keys = w["keys"] as? [String] ?? []
            var bloom: BloomFilter?
            if let b = w["bloomFilter"] as? [String: Any] {
                let bits = b["bits"] as? [String: Any] ?? [:]
                let bitmap = [UInt8](Data(base64Encoded: bits["bitmap"] as? String ?? "") ?? Data())
                bloom = BloomFilter(bitmap: bitmap, padding: bits["padding"] as? Int ?? 0, hashCount: b["hashCount"] as? Int ?? 0)
            }
            db.syncStep { $0.watchFilter(ids, count: keys.count, bloom: bloom); return [] }
        case "watchReset":
            let ids = v as! [Int]
            db.syncStep { $0.watchReset(ids); return [] }
        case "watchSnapshot":
            let w = v as! [String: Any]
            let version = Int64(w["version"] as? Int ?? 0)
            let ids = w["targetIds"] as? [Int] ?? []
            let token = w["resumeToken"] as? String ?? ""
            // Only a snapshot for no target in particular is a consistent (global) one.
            db.syncStep { e in
                e.watchNoChange(ids, resumeToken: token)
                return ids.isEmpty ? e.watchSnapshot(version: version) : []
            }
        case "writeAck":
            let w = v as! [String: Any]
            let version = Int64(w["version"] as? Int ?? 0)
            db.syncStep { $0.acknowledgeOldest(version: version).events }
        case "failWrite":
            let w = v as! [String: Any]
            let code = (w["error"] as? [String: Any])?["code"] as? Int ?? 2
            if w["keepInQueue"] as? Bool == true { break }
            db.syncStep { $0.rejectOldest(FirestoreErrorCode(FirestoreErrorCode.Code(rawValue: code) ?? .unknown, "rejected")).events }
        case "enableNetwork":
            if v as! Bool { await db.enableNetwork() } else { await db.disableNetwork() }
        case "runTimer":
            if (v as? String) == "online_state_timeout" || (v as? String) == "all" {
                db.syncStep { e in e.onlineState == .unknown ? e.setOnline(.offline) : [] }
            }
        case "watchStreamClose":
            db.syncStep { e in
                // With nothing listened to, no stream is open to fail.
                guard !e.sentTargets.isEmpty else { return [] }
                let events = e.onlineState == .online ? e.setOnline(.unknown) : e.setOnline(.offline)
                e.connectionStopped()
                e.resendTargets()
                return events
            }
        case "waitForPendingWrites":
            // What waitForPendingWrites waits for, taken now (the task may start after later writes).
            let count = waitsResolved
            let db = self.db
            let last = db.state.withLock { $0.pending.last?.id }
            Task {
                if let last { try? await db.waitForAnswer(last) }
                count.withLock { $0 += 1 }
            }
        case "drainQueue":
            break
        case "addSnapshotsInSyncListener":
            let count = inSync
            inSyncRegistrations.append(db.addSnapshotsInSyncListener { count.withLock { $0 += 1 } })
        case "removeSnapshotsInSyncListener":
            if !inSyncRegistrations.isEmpty { inSyncRegistrations.removeLast().remove() }
        case "restart":
            // Close and open the same store: what was recorded comes back; listeners and
            // waits do not (the app makes them again).
            listeners = [:]
            try await db.terminate()
            db = try open()
        default:
            return "the step \(action) is not supported"
        }
        return nil
    }

    func trackWrite(_ path: String) {
        guard let id = db.state.withLock({ $0.pending.last?.id }) else { return }
        let db = self.db, callbacks = self.callbacks
        Task {
            do {
                try await db.waitForAnswer(id)
                callbacks.withLock { $0.acknowledged.append(path) }
            } catch {
                callbacks.withLock { $0.rejected.append(path) }
            }
        }
    }

    // MARK: Parsing

    /// The spec's stand-ins for special values: "<DELETE>" is `FieldValue.delete()`.
    static func sentinels(_ v: Any) -> Any {
        if let s = v as? String, s == "<DELETE>" { return FieldValue.delete() }
        if let m = v as? [String: Any] { return m.mapValues(sentinels) }
        if let a = v as? [Any] { return a.map(sentinels) }
        return v
    }

    static func canonical(_ q: [String: Any]) -> String {
        String(decoding: (try? JSONSerialization.data(withJSONObject: q, options: [.sortedKeys])) ?? Data(), as: UTF8.self)
    }

    static func query(_ q: [String: Any]) throws -> QueryCore {
        let raw = q["path"] as? String ?? ""
        let path = raw.isEmpty ? [] : try ResourcePath.parse(raw, what: "path").segments
        var core: QueryCore
        if let group = q["collectionGroup"] as? String {
            core = QueryCore(path: ResourcePath(path))
            core.collectionGroup = group
        } else if path.count % 2 == 0 {
            core = QueryCore(path: ResourcePath(Array(path.dropLast())))
            core.documentKey = ResourcePath(path)
        } else {
            core = QueryCore(path: ResourcePath(path))
        }
        var filters: [FilterNode] = []
        for f in q["filters"] as? [[Any]] ?? [] {
            let field = try FieldPath.parse(f[0] as! String)
            guard let op = FilterOperator(rawValue: f[1] as! String) else { throw FirestoreErrorCode(.invalidArgument, "unknown operator \(f[1])") }
            filters.append(.field(field, op, try UserData.plain(f[2], depth: 1)))
        }
        if !filters.isEmpty { core.filter = filters.count == 1 ? filters[0] : .and(filters) }
        for o in q["orderBys"] as? [[String]] ?? [] {
            core.explicitOrders.append(OrderBy(field: try FieldPath.parse(o[0]), descending: o[1] == "desc"))
        }
        if let limit = q["limit"] as? Int {
            core.limit = limit
            core.limitType = (q["limitType"] as? String) == "LimitToLast" ? .last : .first
        }
        return core
    }

    static func watchDocument(_ d: [String: Any]) throws -> WatchDocument {
        let key = try ResourcePath.parse(d["key"] as! String, what: "key")
        let version = Int64(d["version"] as? Int ?? 0)
        guard let value = d["value"] as? [String: Any] else { return WatchDocument(key: key, fields: nil, version: version) }
        return WatchDocument(key: key, fields: try UserData.plain(value, depth: 0).mapFields, version: version, createTime: Int64(d["createTime"] as? Int ?? 0))
    }

    // MARK: Comparing

    func compare(_ expected: [[String: Any]], _ got: [(listener: Int, event: ListenerEvent)]) -> String? {
        if expected.count != got.count {
            return "expected \(expected.count) events, got \(got.count): \(got.map { describe($0.event) })"
        }
        // Each listener's events in order; across listeners the SDK's order is its map's
        // iteration order, which is no promise (the README of the cases says registration
        // order, and one case differs), so they are matched by query.
        var remaining = got
        for e in expected {
            let key = Self.canonical(e["query"] as! [String: Any])
            guard let l = listeners[key] else { return "an event expected for a query not listened to" }
            guard let at = remaining.firstIndex(where: { $0.listener == l.id }) else { return "no event for \(key); got \(remaining.map { describe($0.event) })" }
            let g = remaining.remove(at: at)
            let errorCode = e["errorCode"] as? Int ?? 0
            switch g.event {
            case .failure(let error):
                if error.code.rawValue != errorCode { return "expected error \(errorCode), got \(error)" }
                listeners.removeValue(forKey: key)
            case .query(_, let changes, let fromCache, let pending):
                if errorCode != 0 { return "expected error \(errorCode), got a snapshot" }
                if fromCache != (e["fromCache"] as? Bool ?? false) { return "fromCache \(fromCache), expected \(e["fromCache"] ?? false): \(describe(g.event))" }
                if pending != (e["hasPendingWrites"] as? Bool ?? false) { return "hasPendingWrites \(pending), expected \(e["hasPendingWrites"] ?? false): \(describe(g.event))" }
                for (name, kind) in [("added", ChangeKind.added), ("modified", .modified), ("removed", .removed), ("metadata", .metadata)] {
                    // Compared by key: the SDK's runner and Ferry may list one kind's changes in different orders.
                    let want = (e[name] as? [[String: Any]] ?? []).sorted { ($0["key"] as? String ?? "") < ($1["key"] as? String ?? "") }
                    let have = changes.filter { $0.type == kind }.map(\.doc).sorted { $0.key.description < $1.key.description }
                    if want.count != have.count { return "\(name): expected \(want.map { $0["key"] ?? "?" }), got \(have.map(\.key)) in \(describe(g.event))" }
                    for (w, h) in zip(want, have) {
                        if let problem = Self.compareDoc(w, h) { return "\(name) \(h.key): \(problem)" }
                    }
                }
            }
        }
        return nil
    }

    static func compareDoc(_ w: [String: Any], _ h: LocalDocument) -> String? {
        if (w["key"] as? String) != h.key.description { return "key \(h.key), expected \(w["key"] ?? "?")" }
        let version = Int64(w["version"] as? Int ?? 0)
        if version != h.version { return "version \(h.version), expected \(version)" }
        if let value = w["value"] as? [String: Any] {
            guard let fields = h.fields, (try? UserData.plain(value, depth: 0).mapFields) == fields else { return "value \(String(describing: h.fields)), expected \(value)" }
        }
        let o = w["options"] as? [String: Any] ?? [:]
        if (o["hasLocalMutations"] as? Bool ?? false) != h.hasLocalMutations { return "hasLocalMutations \(h.hasLocalMutations)" }
        if (o["hasCommittedMutations"] as? Bool ?? false) != h.hasCommittedMutations { return "hasCommittedMutations \(h.hasCommittedMutations)" }
        return nil
    }

    func describe(_ e: ListenerEvent) -> String {
        switch e {
        case .failure(let error): return "error \(error)"
        case .query(_, let changes, let fromCache, let pending):
            return "{" + changes.map { "\($0.type) \($0.doc.key)@\($0.doc.version)" }.joined(separator: ", ") + " fromCache: \(fromCache) pending: \(pending)}"
        }
    }

    func check(_ state: [String: Any]) async -> String? {
        let (targets, limbo, pending) = db.state.withLock { e in
            (e.sentTargets, Set(e.limboTargetByKey.keys.map(\.description)), e.pending.count)
        }
        let networkEnabled = db.state.withLock { $0.networkEnabled }
        // While the network is off nothing is listened to on the server (the SDK's runner checks these once it is back).
        if let active = state["activeTargets"] as? [String: Any], networkEnabled {
            let want = Set(active.keys.compactMap(Int.init))
            if want != Set(targets.keys) { return "active targets \(targets.keys.sorted()), expected \(want.sorted())" }
            for (k, v) in active {
                let token = (v as? [String: Any])?["resumeToken"] as? String ?? ""
                if let id = Int(k), targets[id] != token { return "target \(id): resume token \(targets[id] ?? "-"), expected \(token)" }
            }
        }
        if let docs = state["activeLimboDocs"] as? [String], Set(docs) != limbo { return "limbo documents \(limbo.sorted()), expected \(docs.sorted())" }
        let enqueued = db.state.withLock { $0.enqueuedLimbo.map(\.description) }
        if let docs = state["enqueuedLimboDocs"] as? [String], docs.sorted() != enqueued.sorted() { return "enqueued limbo documents \(enqueued), expected \(docs)" }
        // The SDK sends at most 10 writes at a time (its write pipeline); the rest wait in its queue.
        if let n = state["numOutstandingWrites"] as? Int, n != min(pending, 10) { return "\(pending) outstanding writes, expected \(n)" }
        if let cb = state["userCallbacks"] as? [String: Any] {
            // Answers reach the callbacks through the ledger's waiters.
            let want = (cb["acknowledgedDocs"] as? [String] ?? [], cb["rejectedDocs"] as? [String] ?? [])
            // The answers reach the callbacks' tasks on the cooperative pool: wait by yielding.
            let ok = await eventually {
                let have = callbacks.withLock { $0 }
                return have.acknowledged == want.0 && have.rejected == want.1
            }
            if !ok {
                let have = callbacks.withLock { $0 }
                return "callbacks acknowledged \(have.acknowledged) rejected \(have.rejected), expected \(want.0) \(want.1)"
            }
            callbacks.withLock { $0 = ([], []) }
        }
        return nil
    }
}
