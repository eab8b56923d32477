import FerryStore
import Foundation

/// A listen target: a query the server is asked to keep current, and what it said of it.
struct TargetData: Sendable {
    var id: Int
    var query: QueryCore
    var resumeToken = ""
    /// A newer token than the recorded one, kept in memory only (the five-minute rule): used
    /// to listen again in this process, lost at a restart.
    var liveResumeToken: String?
    /// The token a listen is sent with.
    var tokenToSend: String { liveResumeToken ?? resumeToken }
    /// The version of the last consistent snapshot that included this target (µs).
    var snapshotVersion: Int64 = 0
    /// The documents the server says the query matches.
    var remoteKeys: Set<ResourcePath> = []
    /// A limbo target: one document the view holds and the server has not confirmed.
    var limbo = false
}

/// What the server has said of a target since the last consistent snapshot (Firestore's
/// watch change aggregation).
struct WatchTargetState: Sendable {
    /// Requests (listen or unlisten) the server has not answered yet: changes for the target
    /// are ignored until it has.
    var pendingResponses = 0
    var current = false
    var resumeToken = ""
    var hasPendingChanges = true
    var changes: [ResourcePath: ChangeKind] = [:]

    mutating func clearChanges() {
        hasPendingChanges = false
        changes = [:]
    }
}

/// The change of one target in a consistent snapshot.
struct TargetChangeData: Sendable {
    var current: Bool
    var resumeToken: String
    var added: Set<ResourcePath> = []
    var modified: Set<ResourcePath> = []
    var removed: Set<ResourcePath> = []
}

/// Whether the store believes it can reach the server (Firestore's online state).
enum OnlineState: Sendable { case unknown, online, offline }

/// What the document model asks of a server connection.
package enum RemoteRequest: Sendable, Equatable {
    case listen(targetID: Int, query: QueryCore, resumeToken: String)
    case unlisten(targetID: Int)
}

/// A document as the server sends it.
package struct WatchDocument: Sendable {
    package var key: ResourcePath
    /// nil: the document does not exist.
    package var fields: [String: FieldValueData]?
    package var version: Int64
    package var createTime: Int64 = 0

    package init(key: ResourcePath, fields: [String: FieldValueData]?, version: Int64, createTime: Int64 = 0) {
        self.key = key
        self.fields = fields
        self.version = version
        self.createTime = createTime
    }
}

extension DocumentEngine {
    // MARK: Targets

    /// The target a query listens through: shared with other listeners of the same query,
    /// reused (with its resume token) after an unlisten, else new (query targets even, from 2).
    mutating func allocateTarget(_ q: QueryCore, cacheOnly: Bool = false) -> Int {
        // Without a server connection nothing is listened to there: no target is kept.
        if cacheOnly || !remoteAttached { return 0 }
        let key = Self.targetKey(q)
        if let active = targets.values.first(where: { !$0.limbo && Self.targetKey($0.query) == key }) { return active.id }
        var t: TargetData
        if let saved = savedTargets[key] {
            t = saved
        } else {
            t = TargetData(id: takeTargetID(), query: q)
            recordNow(.target, DocumentRecords.encodeTarget(id: t.id, query: q))
        }
        t.query = q
        targets[t.id] = t
        sendListen(t)
        return t.id
    }

    /// What the server sees of a query: a limit-to-last query is its limit-to-first mirror
    /// (orders reversed), so both share one target.
    static func targetKey(_ q: QueryCore) -> QueryCore {
        var m = q
        guard q.limitType == .last, q.limit != nil else {
            m.explicitOrders = q.orders
            return m
        }
        m.limitType = .first
        m.explicitOrders = q.orders.map { OrderBy(field: $0.field, descending: !$0.descending) }
        (m.start, m.end) = (q.end, q.start)
        return m
    }

    mutating func takeTargetID() -> Int {
        defer { nextTargetID += 2 }
        return nextTargetID
    }

    mutating func sendListen(_ t: TargetData) {
        guard remoteAttached, networkEnabled else { return }
        var w = watch[t.id] ?? WatchTargetState()
        w.pendingResponses += 1
        watch[t.id] = w
        sentTargets[t.id] = t.tokenToSend
        outbox.append(.listen(targetID: t.id, query: t.query, resumeToken: t.tokenToSend))
    }

    mutating func sendUnlisten(_ id: Int) {
        guard remoteAttached, networkEnabled else { return }
        var w = watch[id] ?? WatchTargetState()
        w.pendingResponses += 1
        watch[id] = w
        sentTargets[id] = nil
        outbox.append(.unlisten(targetID: id))
    }

    /// The connection stopped (network disabled, stream closed): nothing is listened to on
    /// the server until the targets are sent again.
    mutating func connectionStopped() {
        watch = [:]
        sentTargets = [:]
        pendingDocumentUpdates = [:]
        pendingDocumentTargets = [:]
        pendingTargetResets = []
    }

    /// Sends every target again (a new connection).
    mutating func resendTargets() {
        for t in targets.values.sorted(by: { $0.id < $1.id }) { sendListen(t) }
    }

    /// A listener stopped: its target goes when no other listener uses it.
    mutating func releaseTarget(_ id: Int) {
        guard id != 0, let t = targets[id], !listeners.values.contains(where: { $0.targetID == id }) else { return }
        savedTargets[Self.targetKey(t.query)] = t
        targets[id] = nil
        sendUnlisten(id)
        // With nothing to listen to, the connection's health cannot be confirmed.
        if !targets.values.contains(where: { !$0.limbo }), networkEnabled, remoteAttached { onlineState = .unknown }
        for key in limboDocuments(of: id) { releaseLimbo(key) }
        if eagerGarbageCollection { collectGarbage() }
    }

    /// Whether a target is listened to (changes for others are ignored).
    func isActive(_ id: Int) -> Bool { targets[id] != nil }

    // MARK: Watch changes

    mutating func markOnline() {
        if onlineState != .online { onlineState = .online }
    }

    mutating func watchAck(_ ids: [Int]) {
        markOnline()
        for id in ids {
            guard var w = watch[id] else { continue }
            w.pendingResponses = max(0, w.pendingResponses - 1)
            if w.pendingResponses == 0 { w.clearChanges() }
            watch[id] = w
        }
    }

    mutating func watchCurrent(_ ids: [Int], resumeToken: String) {
        markOnline()
        for id in ids where isActive(id) && watch[id]?.pendingResponses == 0 {
            watch[id]!.current = true
            watch[id]!.hasPendingChanges = true
            if !resumeToken.isEmpty { watch[id]!.resumeToken = resumeToken }
        }
    }

    mutating func watchNoChange(_ ids: [Int], resumeToken: String) {
        markOnline()
        // No target named: the token is the whole stream's, for every target.
        let all = ids.isEmpty ? Array(watch.keys) : ids
        for id in all where isActive(id) && watch[id]?.pendingResponses == 0 {
            if !resumeToken.isEmpty {
                watch[id]!.resumeToken = resumeToken
                watch[id]!.hasPendingChanges = true
            }
        }
    }

    /// A document changed (or was deleted: `fields` nil) in `updated` targets, or left `removed` ones.
    mutating func watchDocument(_ doc: WatchDocument?, key: ResourcePath, updated: [Int], removed: [Int]) {
        markOnline()
        for id in updated {
            if let doc, doc.fields != nil { addToTarget(id, doc) } else { removeFromTarget(id, key, doc) }
        }
        for id in removed { removeFromTarget(id, key, doc) }
    }

    private func targetListening(_ id: Int) -> Bool { isActive(id) && (watch[id]?.pendingResponses ?? 0) == 0 }

    mutating func addToTarget(_ id: Int, _ doc: WatchDocument) {
        guard targetListening(id) else { return }
        let kind: ChangeKind = targets[id]!.remoteKeys.contains(doc.key) ? .modified : .added
        watch[id]!.changes[doc.key] = kind
        watch[id]!.hasPendingChanges = true
        pendingDocumentUpdates[doc.key] = doc
        pendingDocumentTargets[doc.key, default: []].insert(id)
    }

    mutating func removeFromTarget(_ id: Int, _ key: ResourcePath, _ doc: WatchDocument?) {
        guard targetListening(id) else { return }
        if targets[id]!.remoteKeys.contains(key) {
            watch[id]!.changes[key] = .removed
        } else {
            watch[id]!.changes[key] = nil
        }
        watch[id]!.hasPendingChanges = true
        pendingDocumentTargets[key, default: []].insert(id)
        if let doc { pendingDocumentUpdates[key] = doc }
    }

    /// The server removed targets (with `error`: the listeners fail).
    mutating func watchRemove(_ ids: [Int], error: FirestoreErrorCode?) -> [(Int, ListenerEvent)] {
        markOnline()
        var events: [(Int, ListenerEvent)] = []
        for id in ids {
            if let error {
                guard isActive(id) else { continue }
                for (lid, s) in listeners.sorted(by: { $0.key < $1.key }) where s.targetID == id {
                    listeners[lid] = nil
                    events.append((lid, .failure(error)))
                }
                let t = targets[id]
                targets[id] = nil
                watch[id] = nil
                sentTargets[id] = nil
                if let t {
                    if t.limbo, let key = t.query.documentKey {
                        // A limbo target refused: the document is taken as deleted.
                        limboTargetByKey[key] = nil
                        let r = RemoteEventRecord(version: lastRemoteVersion, documents: [.init(key: key, state: .forgotten, version: 0)])
                        if recordNow(.remoteEvent, DocumentRecords.encode(r)) { events += emit(applyRemoteEvent(r), targetChanges: [:]) }
                        pumpLimbo()
                    } else {
                        savedTargets[Self.targetKey(t.query)] = t
                    }
                }
                continue
            }
            guard var w = watch[id] else { continue }
            w.pendingResponses = max(0, w.pendingResponses - 1)
            watch[id] = w.pendingResponses == 0 && !isActive(id) ? nil : w
            if w.pendingResponses == 0, isActive(id) {
                // The server dropped a target the app still listens to: ask again.
                watch[id] = nil
                sendListen(targets[id]!)
            }
        }
        return events
    }

    /// The server resets targets: their documents are to be sent again.
    mutating func watchReset(_ ids: [Int], resumeToken: String = "") {
        markOnline()
        for id in ids where targetListening(id) {
            resetTarget(id)
            if !resumeToken.isEmpty { watch[id]!.resumeToken = resumeToken }
        }
    }

    /// Forgets what the server said of a target (it is no longer current) and removes its
    /// documents, which the server sends again before its next consistent snapshot.
    mutating func resetTarget(_ id: Int) {
        watch[id] = WatchTargetState()
        for key in targets[id]!.remoteKeys { removeFromTarget(id, key, nil) }
    }

    /// An existence filter: the server holds `count` documents for the target. On a mismatch
    /// the target is reset and listened to again from scratch.
    mutating func watchFilter(_ ids: [Int], count: Int, bloom: BloomFilter? = nil) {
        markOnline()
        for id in ids where targetListening(id) {
            let t = targets[id]!
            if let key = t.query.documentKey {
                if count == 0 {
                    // A document target with nothing: the document does not exist.
                    removeFromTarget(id, key, WatchDocument(key: key, fields: nil, version: 0))
                }
                continue
            }
            var keys = t.remoteKeys
            for (k, c) in watch[id]!.changes {
                if c == .added { keys.insert(k) } else if c == .removed { keys.remove(k) }
            }
            if keys.count != count {
                // A bloom filter of the names still matching lets the client drop the others
                // instead of listening again from scratch (when it accounts for every one).
                if let bloom, bloom.bitCount > 0 {
                    var removed = 0
                    for key in targets[id]!.remoteKeys.sorted() where !bloom.mightContain(databaseName + "/documents/" + key.description) {
                        removeFromTarget(id, key, nil)
                        removed += 1
                    }
                    if keys.count - removed == count { continue }
                }
                resetTarget(id)
                pendingTargetResets.insert(id)
            }
        }
    }

    // MARK: Consistent snapshots

    /// The server's snapshot at `version` is consistent: apply what it said since the last one.
    mutating func watchSnapshot(version: Int64) -> [(Int, ListenerEvent)] {
        markOnline()
        guard version >= lastRemoteVersion else { return [] }
        var changes: [Int: TargetChangeData] = [:]
        for id in watch.keys.sorted() where targetListening(id) {
            let t = targets[id]!
            if watch[id]!.current, let key = t.query.documentKey, pendingDocumentUpdates[key] == nil, !t.remoteKeys.contains(key) {
                // A current document target without its document: it does not exist.
                removeFromTarget(id, key, WatchDocument(key: key, fields: nil, version: version))
            }
            let w = watch[id]!
            guard w.hasPendingChanges else { continue }
            var c = TargetChangeData(current: w.current, resumeToken: w.resumeToken)
            for (k, kind) in w.changes {
                switch kind {
                case .added: c.added.insert(k)
                case .modified, .metadata: c.modified.insert(k)
                case .removed: c.removed.insert(k)
                }
            }
            changes[id] = c
            watch[id]!.clearChanges()
        }
        // Documents whose only targets are limbo targets are resolved by this snapshot.
        var resolvedLimbo: Set<ResourcePath> = []
        for (key, ids) in pendingDocumentTargets where ids.allSatisfy({ targets[$0]?.limbo ?? true }) { resolvedLimbo.insert(key) }
        let updates = pendingDocumentUpdates
        pendingDocumentUpdates = [:]
        pendingDocumentTargets = [:]
        let resets = pendingTargetResets
        pendingTargetResets = []

        // What the snapshot changes, recorded, then applied by the function replay uses.
        var record = RemoteEventRecord(version: version)
        var memoryOnlyTokens: [Int: String] = [:]
        for (id, c) in changes.sorted(by: { $0.key < $1.key }) {
            // A new token is recorded when the target had none, when documents changed, or
            // when the recorded one is five minutes old (the SDK's rule: a restart resumes a
            // little earlier rather than writing at every snapshot).
            var token: String? = c.resumeToken.isEmpty ? nil : c.resumeToken
            if let t = token, let old = targets[id], !old.resumeToken.isEmpty, c.added.isEmpty, c.removed.isEmpty, c.modified.isEmpty,
               version - old.snapshotVersion < 300_000_000 {
                memoryOnlyTokens[id] = t
                token = nil
            }
            record.targets.append(.init(id: id, resumeToken: token, added: c.added.sorted(), removed: c.removed.sorted()))
        }
        for id in resets.sorted() where isActive(id) {
            if let i = record.targets.firstIndex(where: { $0.id == id }) { record.targets[i].resumeToken = "" } else { record.targets.append(.init(id: id, resumeToken: "")) }
        }
        for (key, doc) in updates.sorted(by: { $0.key < $1.key }) {
            if doc.fields == nil && doc.version == 0 && !resolvedLimbo.contains(key) {
                // A removal from a target, not a deletion: the cache keeps what it had.
                continue
            }
            let incomingVersion = doc.version == 0 ? version : doc.version
            if let existing = remote[key], !(incomingVersion > existing.version || (incomingVersion == existing.version && existing.hasCommittedMutations)) { continue }
            record.documents.append(.init(key: key, state: doc.fields == nil ? .deleted : .found, version: incomingVersion, fields: doc.fields))
        }
        guard recordNow(.remoteEvent, DocumentRecords.encode(record)) else { return [] }
        let changed = applyRemoteEvent(record)
        for (id, token) in memoryOnlyTokens { targets[id]?.liveResumeToken = token }
        var events = emit(changed, targetChanges: changes, resets: resets)
        // Existence-filter mismatches: listen again from scratch.
        for id in resets where isActive(id) {
            outbox.append(.unlisten(targetID: id))
            // Two requests, two answers to wait for (the unlisten's and the listen's).
            watch[id] = WatchTargetState(pendingResponses: 2)
            sentTargets[id] = ""
            outbox.append(.listen(targetID: id, query: targets[id]!.query, resumeToken: ""))
        }
        events += resolveLimbos(resolvedLimbo)
        return events
    }

    // MARK: The local view of a document

    /// Recomputes documents from the server's state and the pending writes; returns those
    /// whose local view changed.
    mutating func recompute(_ keys: [ResourcePath]) -> [(old: LocalDocument?, new: LocalDocument?)] {
        var changed: [(old: LocalDocument?, new: LocalDocument?)] = []
        for key in keys {
            let old = document(key)
            var doc = remote[key]
            for id in batchesByKey[key] ?? [] {
                guard let b = pending.batch(id) else { continue }
                for m in b.mutations where m.key == key { doc = m.applied(to: doc, writeTime: b.localWriteTime) }
            }
            guard doc != old else { continue }
            if let doc {
                setDocument(old: old, new: doc)
            } else if let old {
                collections[old.key.parent]?[old.key.last] = nil
                for i in indexes.indices where indexes[i].definition.collectionGroup == key.parent.last { indexes[i].update(old: old, new: nil) }
            }
            changed.append((old, doc))
        }
        return changed
    }

    // MARK: Writes answered

    /// The server committed the oldest pending batch at `version`.
    mutating func acknowledgeOldest(version: Int64) -> (batch: MutationBatch?, events: [(Int, ListenerEvent)]) {
        answerOldest(WriteAnswerRecord(batchID: 0, version: version))
    }

    /// The server refused the oldest pending batch: it is reverted.
    mutating func rejectOldest(_ error: FirestoreErrorCode) -> (batch: MutationBatch?, events: [(Int, ListenerEvent)]) {
        answerOldest(WriteAnswerRecord(batchID: 0, version: 0, rejection: error))
    }

    private mutating func answerOldest(_ answer: WriteAnswerRecord) -> (batch: MutationBatch?, events: [(Int, ListenerEvent)]) {
        guard let batch = pending.first else { return (nil, []) }
        var a = answer
        a.batchID = batch.id
        guard let lsn = recordLSN(.writeAnswer, DocumentRecords.encode(a)) else { return (nil, []) }
        let changed = applyAnswer(a)
        ledger.settle(batch.id, recordLSN: Int64(lsn), a.rejection)
        let events = emit(changed, targetChanges: [:])
        if eagerGarbageCollection { collectGarbage() }
        return (batch, events)
    }

    /// Applies the server's answer to a batch (live and in replay): committed, its documents
    /// become the server's at the commit version (acknowledged, until a listen confirms them);
    /// refused, it is dropped. Either way the view shows what the remaining batches make of it.
    mutating func applyAnswer(_ a: WriteAnswerRecord) -> [(old: LocalDocument?, new: LocalDocument?)] {
        guard let batch = pending.remove(a.batchID) else { return [] }
        if let rejection = a.rejection {
            var paths: [ResourcePath] = []
            for m in batch.mutations where !paths.contains(m.key) { paths.append(m.key) }
            rejectedWrites[batch.id] = RejectedWriteData(documents: paths, error: rejection)
        }
        var keys: [ResourcePath] = []
        for m in batch.mutations {
            batchesByKey[m.key]?.removeAll { $0 == batch.id }
            if batchesByKey[m.key]?.isEmpty == true { batchesByKey[m.key] = nil }
            keys.append(m.key)
            guard a.rejection == nil else { continue }
            let base = remote[m.key]
            guard base.map({ $0.version < a.version }) ?? true else { continue }
            if m.operation == .patch, m.mustExist, base?.fields == nil {
                // An update the server applied to a document this cache does not hold.
                remote[m.key] = LocalDocument(key: m.key, fields: nil, hasLocalMutations: false, version: a.version, hasCommittedMutations: true, unknown: true)
            } else if var committed = m.applied(to: base, writeTime: Timestamp(micros: a.version)) {
                committed.fields = committed.fields.map { Self.resolvingServerTimestamps($0, at: Timestamp(micros: a.version)) }
                committed.hasLocalMutations = false
                committed.hasCommittedMutations = true
                committed.version = a.version
                remote[m.key] = committed
            }
        }
        ledger.advanceCursor(through: batch.id)
        if let r = a.rejection { ledger.noteRejection(batch.id, r) }
        return recompute(keys)
    }

    /// Applies a consistent snapshot (live and in replay): the targets' documents and resume
    /// tokens, and the server's documents.
    mutating func applyRemoteEvent(_ r: RemoteEventRecord) -> [(old: LocalDocument?, new: LocalDocument?)] {
        for t in r.targets {
            updateTarget(t.id) { d in
                d.remoteKeys.subtract(t.removed)
                d.remoteKeys.formUnion(t.added)
                if let token = t.resumeToken {
                    d.resumeToken = token
                    d.liveResumeToken = nil
                    if !token.isEmpty { d.snapshotVersion = r.version }
                }
            }
        }
        var changed: [(old: LocalDocument?, new: LocalDocument?)] = []
        for d in r.documents {
            switch d.state {
            case .forgotten: remote[d.key] = nil
            case .deleted: remote[d.key] = LocalDocument(key: d.key, fields: nil, hasLocalMutations: false, version: d.version)
            case .found: remote[d.key] = LocalDocument(key: d.key, fields: d.fields, hasLocalMutations: false, version: d.version)
            }
            changed += recompute([d.key])
        }
        lastRemoteVersion = max(lastRemoteVersion, r.version)
        if !r.documents.isEmpty { evictionMayFree = true }
        return changed
    }

    /// Changes a target, listened to or kept for later.
    mutating func updateTarget(_ id: Int, _ body: (inout TargetData) -> Void) {
        if targets[id] != nil { body(&targets[id]!); return }
        if let k = savedTargets.first(where: { $0.value.id == id })?.key {
            body(&savedTargets[k]!)
        }
    }

    /// A target recorded earlier (replay): kept for the next listen of its query.
    mutating func installTarget(id: Int, query: QueryCore) {
        let key = Self.targetKey(query)
        if savedTargets[key] == nil, !targets.values.contains(where: { $0.id == id }) { savedTargets[key] = TargetData(id: id, query: query) }
        nextTargetID = max(nextTargetID, id + 2 - id % 2)
    }

    /// Appends a record of the sync seam (its durability follows with the next sync of the
    /// log); false when the log refused it (the change is then not applied).
    @discardableResult
    mutating func recordNow(_ kind: DocumentRecordKind, _ payload: [UInt8]) -> Bool {
        recordLSN(kind, payload) != nil
    }

    /// ``recordNow(_:_:)`` returning the record's LSN.
    mutating func recordLSN(_ kind: DocumentRecordKind, _ payload: [UInt8]) -> UInt64? {
        let lsn: UInt64
        do { lsn = try records.append(kind: kind.rawValue, payload) } catch { return nil }
        if records.sweepIsDue { records.sweep(keeping: []) }
        return lsn
    }

    static func resolvingServerTimestamps(_ fields: [String: FieldValueData], at t: Timestamp) -> [String: FieldValueData] {
        fields.mapValues { v in
            switch v {
            case .pendingServerTimestamp: .timestamp(t)
            case .map(let m): .map(resolvingServerTimestamps(m, at: t))
            default: v
            }
        }
    }

    // MARK: Online state

    /// The store goes offline (the network disabled, or the server unreachable): views lose
    /// their `current` state; a listener that raised nothing yet raises what the cache holds.
    mutating func setOnline(_ state: OnlineState) -> [(Int, ListenerEvent)] {
        guard onlineState != state else { return [] }
        onlineState = state
        guard state == .offline else { return [] }
        var events: [(Int, ListenerEvent)] = []
        for id in listeners.keys.sorted() {
            var s = listeners[id]!
            let wasSynced = s.synced
            s.current = false
            s.synced = false
            listeners[id] = s
            if !s.raisedInitial {
                events += raiseIfDue(id, changes: s.shown.enumerated().map { ChangeData(type: .added, doc: $1, oldIndex: nil, newIndex: $0) }, syncChanged: true)
            } else if wasSynced && s.includeMetadataChanges {
                events.append((id, .query(docs: s.shown, changes: [], fromCache: true, hasPendingWrites: s.shownHasPendingWrites)))
            }
        }
        for id in watch.keys { watch[id]!.current = false }
        return events
    }

    // MARK: Limbo

    func limboDocuments(of targetID: Int) -> [ResourcePath] {
        listeners.values.filter { $0.targetID == targetID }.flatMap(\.limbo)
    }

    mutating func trackLimbo(_ key: ResourcePath) {
        guard limboTargetByKey[key] == nil, !enqueuedLimbo.contains(key) else { return }
        enqueuedLimbo.append(key)
        pumpLimbo()
    }

    /// Starts waiting limbo resolutions while fewer than the maximum run.
    mutating func pumpLimbo() {
        while limboTargetByKey.count < maxConcurrentLimboResolutions, !enqueuedLimbo.isEmpty {
            startLimbo(enqueuedLimbo.removeFirst())
        }
    }

    mutating func startLimbo(_ key: ResourcePath) {
        let id = nextLimboTargetID
        nextLimboTargetID += 2
        var q = QueryCore(path: key.parent)
        q.documentKey = key
        let t = TargetData(id: id, query: q, limbo: true)
        targets[id] = t
        limboTargetByKey[key] = id
        sendListen(t)
    }

    mutating func releaseLimbo(_ key: ResourcePath) {
        guard !listeners.values.contains(where: { $0.limbo.contains(key) }) else { return }
        enqueuedLimbo.removeAll { $0 == key }
        guard let id = limboTargetByKey.removeValue(forKey: key) else { return }
        targets[id] = nil
        sendUnlisten(id)
        pumpLimbo()
    }

    /// Limbo documents the last snapshot resolved: their targets are released.
    mutating func resolveLimbos(_ keys: Set<ResourcePath>) -> [(Int, ListenerEvent)] {
        for key in keys {
            guard let id = limboTargetByKey[key], let t = targets[id], t.limbo else { continue }
            limboTargetByKey[key] = nil
            targets[id] = nil
            sendUnlisten(id)
        }
        pumpLimbo()
        return []
    }

    // MARK: Garbage

    /// Memory with eager collection: documents no target, listener or pending write needs
    /// are dropped at once.
    mutating func collectGarbage() {
        var needed = Set(batchesByKey.keys)
        for t in targets.values {
            needed.formUnion(t.remoteKeys)
            if let key = t.query.documentKey { needed.insert(key) }
        }
        for key in Array(remote.keys) where !needed.contains(key) {
            remote[key] = nil
            _ = recompute([key])
        }
        for (k, t) in savedTargets where targets[t.id] == nil { savedTargets[k] = nil }
    }
}

extension Firestore {
    /// Runs a sync step on the engine (what a server connection or the spec harness reports)
    /// and delivers the events it raised.
    func syncStep(_ body: (inout DocumentEngine) -> [(Int, ListenerEvent)]) {
        let (settled, upkeep) = state.withLock { e -> ([(waiter: AckWaiter, outcome: FirestoreErrorCode?)], Maintenance.Job?) in
            guard !e.closed else { return ([], nil) }
            deliver(body(&e))  // queued under the lock: in order with writes' events
            return (e.ledger.takeSettled(), upkeepDue(e))
        }
        startUpkeep(upkeep)
        guard !settled.isEmpty else { return }
        func resume() {
            for (w, outcome) in settled {
                if let outcome { w.continuation.resume(throwing: outcome) } else { w.continuation.resume() }
            }
        }
        // An answer is reported once its record is durable (a crash could otherwise take it
        // back, and the write would be sent again).
        guard !medium.durableOnAppend else { return resume() }
        Task {
            do { try await medium.sync() } catch {
                for (w, _) in settled { w.continuation.resume(throwing: FirestoreErrorCode(.dataLoss, "the answer was not made durable: \(error)")) }
                return
            }
            resume()
        }
    }

    /// Waits until every event raised so far was delivered.
    func drainDeliveries() { queue.sync {} }
}
