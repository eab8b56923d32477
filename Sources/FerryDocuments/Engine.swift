import FerryLog
import FerryStore
import Foundation

/// One listener's standing query: every document it matches, in order (the limit is applied
/// when a snapshot is made), and what its last snapshot showed.
struct StandingQuery {
    var query: QueryCore
    var orders: [OrderBy]
    var includeMetadataChanges: Bool
    /// Every matching document, in the query's order.
    var matching: [LocalDocument] = []
    /// The documents of the last snapshot (after the limit), and its metadata.
    var shown: [LocalDocument] = []
    var shownHasPendingWrites = false
    /// The target the query listens through.
    var targetID = 0
    /// The server said the target is current (and the store is online).
    var current = false
    /// Documents shown that the server has not confirmed (while current).
    var limbo: Set<ResourcePath> = []
    /// The last snapshot was consistent with the server (not from the cache).
    var synced = false
    /// The first snapshot was raised (an online listener waits for the server or for a
    /// cached document first).
    var raisedInitial = false
    /// The target had results from the server before (it has a resume token).
    var hasCachedResults = false
    /// A listener of the cache alone (no target on the server).
    var cacheOnly = false
    /// The shown documents with pending writes: local ones, or acknowledged ones this view
    /// showed as pending and no listen has confirmed yet.
    var mutatedKeys: Set<ResourcePath> = []

    func isPending(_ d: LocalDocument) -> Bool { d.hasLocalMutations || (mutatedKeys.contains(d.key) && d.hasCommittedMutations) }

    func index(of doc: LocalDocument, in list: [LocalDocument]) -> (found: Bool, at: Int) {
        var lo = 0, hi = list.count
        while lo < hi {
            let mid = (lo + hi) / 2
            let c = QueryCore.compare(list[mid], doc, orders)
            if c < 0 { lo = mid + 1 } else if c > 0 { hi = mid } else { return list[mid].key == doc.key ? (true, mid) : (false, mid) }
        }
        return (false, lo)
    }

    /// Whether a document's change can change a limited query's window: it was in it, or it
    /// now matches and sorts inside the window's edge (or the window is not full).
    func reaches(old: LocalDocument?, new: LocalDocument?, limit: Int) -> Bool {
        let key = (new ?? old)!.key
        if matching.contains(where: { $0.key == key }) { return true }
        guard let new, query.matches(new, orders: orders) else { return false }
        guard matching.count >= limit, let first = matching.first, let last = matching.last else { return true }
        return query.limitType == .first ? QueryCore.compare(new, last, orders) < 0 : QueryCore.compare(new, first, orders) > 0
    }

    /// Replaces `old` (the document's previous state) by `new` in ``matching``.
    mutating func update(old: LocalDocument?, new: LocalDocument?) {
        if let old, query.matches(old, orders: orders) {
            let (found, i) = index(of: old, in: matching)
            if found { matching.remove(at: i) } else if let j = matching.firstIndex(where: { $0.key == old.key }) { matching.remove(at: j) }
        }
        if let new, query.matches(new, orders: orders) {
            matching.insert(new, at: index(of: new, in: matching).at)
        }
    }
}

/// What a listener gets: a query snapshot's parts, or a document's.
enum ListenerEvent: Sendable {
    case query(docs: [LocalDocument], changes: [ChangeData], fromCache: Bool, hasPendingWrites: Bool)
    case failure(FirestoreErrorCode)
}

struct ChangeData: Sendable {
    var type: ChangeKind
    var doc: LocalDocument
    var oldIndex: Int?
    var newIndex: Int?
}

/// The document model's state, under the store's lock: the local view, the pending batches,
/// the ledger, the records and the standing queries.
struct DocumentEngine {
    var records: RecordStore
    let ledger = WriteLedger<FirestoreErrorCode>()
    /// Pending write batches, oldest first (their ids are their records' LSNs).
    var pending = PendingBatches()
    /// The local view: collection path → document id → document (server data with pending
    /// writes applied; a deleted document is kept as known-missing).
    var collections: [ResourcePath: [String: LocalDocument]] = [:]
    var listeners: [Int: StandingQuery] = [:]
    var nextListenerID = 1
    /// Open or terminated (the shared ``LifeCycle``, which the tree's `Database` keeps too).
    var life = LifeCycle<FirestoreErrorCode>()
    var closed: Bool { life.closed }
    var networkEnabled = true
    /// The local indexes (configured and automatic), kept current with the view; while
    /// ``indexesStale`` (during replay) they are built once at the end instead.
    var indexes: [LocalIndex] = []
    var indexesStale = false
    /// Whether a query that scans many more documents than it returns creates an index.
    var autoIndexCreation = false
    /// How the last query ran (tests and statistics).
    var lastRun = QueryRun()

    // Sync (Sync.swift): the server's documents, the targets, what the server said since the
    // last consistent snapshot, the online state and the requests for the server.
    /// The server's documents (no pending writes applied; nil fields: deleted).
    var remote: [ResourcePath: LocalDocument] = [:]
    /// Pending batch ids per document, oldest first.
    var batchesByKey: [ResourcePath: [Int64]] = [:]
    var targets: [Int: TargetData] = [:]
    /// Targets no listener uses now, kept (with their resume tokens) for a later listen.
    var savedTargets: [QueryCore: TargetData] = [:]
    var watch: [Int: WatchTargetState] = [:]
    var pendingDocumentUpdates: [ResourcePath: WatchDocument] = [:]
    var pendingDocumentTargets: [ResourcePath: Set<Int>] = [:]
    var pendingTargetResets: Set<Int> = []
    var nextTargetID = 2
    var nextLimboTargetID = 1
    var limboTargetByKey: [ResourcePath: Int] = [:]
    /// Without a server connection the store is offline: listeners raise what the cache holds at once.
    var onlineState: OnlineState = .offline
    var lastRemoteVersion: Int64 = 0
    /// A server connection (or the spec harness) listens to ``outbox``.
    var remoteAttached = false
    var outbox: [RemoteRequest] = []
    /// Batches the server refused, until the app clears them (batch id → what and why).
    var rejectedWrites: [Int64: RejectedWriteData] = [:]
    /// The targets the server is asked to listen to now, with the resume token each was sent with.
    var sentTargets: [Int: String] = [:]
    /// A memory cache with eager collection (documents nothing needs are dropped at once).
    var eagerGarbageCollection = false
    /// At most this many limbo documents are resolved at once; the others wait in order.
    var maxConcurrentLimboResolutions = 100
    var enqueuedLimbo: [ResourcePath] = []
    /// Documents the last eviction dropped (statistics and tests).
    var evictedLastRun = 0
    /// Since the last eviction the server's documents grew or a target or listener went: an
    /// eviction may free something (without this, a store over its limit with nothing to drop
    /// would look for victims at every write).
    var evictionMayFree = true
    /// The database's full name, which bloom filters hash document names under.
    var databaseName = "projects/test-project/databases/(default)"

    init(records: RecordStore) { self.records = records }

    func document(_ key: ResourcePath) -> LocalDocument? { collections[key.parent]?[key.last] }

    /// Applies one record, live or in replay (the one apply function). Returns the documents
    /// it changed, with their states before.
    mutating func apply(kind: UInt8, lsn: Int64, payload: UnsafeRawBufferPointer) throws -> [(old: LocalDocument?, new: LocalDocument?)] {
        guard let k = DocumentRecordKind(rawValue: kind) else {
            throw FirestoreErrorCode(.dataLoss, kind < 32
                ? "the store holds a record of kind \(kind), which is a Realtime Database record: open it with Ferry's Database, not Firestore"
                : "the store holds a document record of unknown kind \(kind): it was written by a newer Ferry")
        }
        switch k {
        case .writeBatch:
            return apply(try DocumentRecords.decodeBatch(id: lsn, payload))
        case .indexConfiguration:
            let definitions = try DocumentRecords.decodeIndexes(payload)
            installIndexes(definitions)
            return []
        case .remoteEvent:
            return applyRemoteEvent(try DocumentRecords.decodeRemoteEvent(payload))
        case .writeAnswer:
            return applyAnswer(try DocumentRecords.decodeWriteAnswer(payload))
        case .rejectionsCleared:
            var r = PayloadReader(payload)
            let through = try r.i64()
            rejectedWrites = rejectedWrites.filter { $0.key > through }
            return []
        case .target:
            let (id, q) = try DocumentRecords.decodeTarget(payload)
            installTarget(id: id, query: q)
            return []
        }
    }

    /// Applies a write batch (decoded from its record in replay; as written, live).
    mutating func apply(_ batch: MutationBatch) -> [(old: LocalDocument?, new: LocalDocument?)] {
        pending.append(batch)
        var changed: [(LocalDocument?, LocalDocument?)] = []
        for m in batch.mutations {
            if batchesByKey[m.key]?.last != batch.id { batchesByKey[m.key, default: []].append(batch.id) }
            let old = document(m.key)
            let new = m.applied(to: old, writeTime: batch.localWriteTime)
            guard let new, new != old else { continue }  // an update of a document not cached
            setDocument(old: old, new: new)
            changed.append((old, new))
        }
        return changed
    }

    /// Puts a document's new state in the view and the indexes.
    mutating func setDocument(old: LocalDocument?, new: LocalDocument) {
        collections[new.key.parent, default: [:]][new.key.last] = new
        guard !indexesStale else { return }
        for i in indexes.indices where indexes[i].definition.collectionGroup == new.key.parent.last {
            indexes[i].update(old: old, new: new)
        }
    }

    /// Replaces the indexes by `definitions`, keeping those already built.
    mutating func installIndexes(_ definitions: [IndexDefinition]) {
        var kept: [LocalIndex] = []
        for d in definitions {
            if let existing = indexes.first(where: { $0.definition.collectionGroup == d.collectionGroup && $0.definition.segments == d.segments }) {
                kept.append(existing)
            } else {
                var ix = LocalIndex(d)
                if !indexesStale { ix.build(documents(inGroup: d.collectionGroup)) }
                kept.append(ix)
            }
        }
        indexes = kept
    }

    /// Builds every index from the view (after a replay).
    mutating func buildIndexes() {
        indexesStale = false
        for i in indexes.indices { indexes[i].build(documents(inGroup: indexes[i].definition.collectionGroup)) }
    }

    /// Every document (existing) of collections named `group`.
    func documents(inGroup group: String) -> [LocalDocument] {
        var out: [LocalDocument] = []
        for (path, docs) in collections where path.last == group { out += docs.values.filter(\.exists) }
        return out
    }

    /// Every document of the local view the query's collection (or group) holds.
    func candidates(_ q: QueryCore) -> [LocalDocument] {
        if let key = q.documentKey { return document(key).map { [$0] } ?? [] }
        if q.collectionGroup == nil { return Array(collections[q.path]?.values ?? [:].values) }
        var out: [LocalDocument] = []
        for (path, docs) in collections where path.last == q.collectionGroup && q.path.isPrefix(of: path) { out += docs.values }
        return out
    }

    /// A server's results for `q` with this store's pending writes applied: each document they
    /// touch is the local view's (as listeners show it), the rest the server's, matched and
    /// ordered again.
    func overlayPending(_ server: [LocalDocument], _ q: QueryCore) -> [LocalDocument] {
        guard !batchesByKey.isEmpty else { return server }
        var byKey = Dictionary(server.map { ($0.key, $0) }, uniquingKeysWith: { a, _ in a })
        for key in batchesByKey.keys where q.holds(key) { byKey[key] = document(key) }
        let orders = q.orders
        let matching = byKey.values.filter { q.matches($0, orders: orders) }.sorted { QueryCore.compare($0, $1, orders) < 0 }
        return Array(q.window(matching[...]))
    }

    /// Runs a query over the local view (through indexes where they serve it): matching
    /// documents in order, the limit applied. A scan that read many more documents than it
    /// returned creates an index when auto-creation is on (the SDK's rule: at least 100 read
    /// and more than 3.4 times the results). `inOrder` false: a query without a limit gives its
    /// documents in no particular order (for counts).
    mutating func run(_ q: QueryCore, inOrder: Bool = true) -> [LocalDocument] {
        let (docs, run) = execute(q, inOrder: inOrder)
        lastRun = run
        if autoIndexCreation, run.indexes.isEmpty, run.documentsRead >= 100, Double(run.documentsRead) > 3.4 * Double(docs.count) {
            let made = Self.automaticIndexes(for: q).filter { d in
                !indexes.contains(where: { $0.definition.collectionGroup == d.collectionGroup && $0.definition.segments == d.segments })
            }
            guard !made.isEmpty else { return docs }
            let all = documents(inGroup: made[0].collectionGroup)
            for d in made {
                var ix = LocalIndex(d)
                ix.build(all)
                indexes.append(ix)
            }
            // Kept with the others, so that a reopen builds it again (an index is derived
            // state: losing this record costs a rebuild, never data).
            _ = try? records.append(kind: DocumentRecordKind.indexConfiguration.rawValue, DocumentRecords.encode(indexes.map(\.definition)))
        }
        return docs
    }

    /// Registers a standing query; returns its id and first event (none when an online
    /// listener has nothing cached yet: it waits for the server).
    mutating func listen(_ q: QueryCore, includeMetadataChanges: Bool, cacheOnly: Bool = false) -> (Int, [(Int, ListenerEvent)]) {
        let id = nextListenerID
        nextListenerID += 1
        var s = StandingQuery(query: q, orders: q.orders, includeMetadataChanges: includeMetadataChanges)
        s.targetID = allocateTarget(q, cacheOnly: cacheOnly)
        s.cacheOnly = cacheOnly
        s.hasCachedResults = !(targets[s.targetID]?.tokenToSend.isEmpty ?? true)
        // Another listener of the same target lends its sync state.
        if let mirror = listeners.values.first(where: { $0.targetID == s.targetID }) { s.current = mirror.current }
        if q.limit != nil {
            // A limited query keeps its window only, and runs again when a change reaches it.
            s.matching = run(q)
        } else {
            s.matching = execute(q).docs
        }
        s.shown = Array(q.window(s.matching[...]))
        s.mutatedKeys = Set(s.shown.filter(\.hasLocalMutations).map(\.key))
        listeners[id] = s
        let (limboAdded, _) = updateLimbo(id)
        listeners[id]!.synced = listeners[id]!.current && listeners[id]!.limbo.isEmpty
        let changes = s.shown.enumerated().map { ChangeData(type: .added, doc: $1, oldIndex: nil, newIndex: $0) }
        let events = raiseIfDue(id, changes: changes, syncChanged: true)
        for k in limboAdded.sorted() { trackLimbo(k) }
        return (id, events)
    }

    /// A listener stopped.
    mutating func removeListener(_ id: Int) {
        guard let s = listeners.removeValue(forKey: id) else { return }
        evictionMayFree = true
        for k in s.limbo { releaseLimbo(k) }
        releaseTarget(s.targetID)
    }

    /// Recomputes a view's limbo documents (only while current); returns those added and removed.
    mutating func updateLimbo(_ id: Int) -> (added: Set<ResourcePath>, removed: Set<ResourcePath>) {
        var s = listeners[id]!
        guard s.current else { return ([], []) }
        let remoteKeys = targets[s.targetID]?.remoteKeys ?? []
        // A document our own writes explain (pending, or acknowledged and not yet seen on the
        // listen) is not in limbo.
        let limbo = Set(s.shown.filter { !remoteKeys.contains($0.key) && !$0.hasPendingWrites }.map(\.key))
        let added = limbo.subtracting(s.limbo), removed = s.limbo.subtracting(limbo)
        s.limbo = limbo
        listeners[id] = s
        return (added, removed)
    }

    /// Raises a listener's snapshot if Firestore would: its first when it is consistent with
    /// the server, holds documents or earlier results, or the store is offline; later ones
    /// when documents changed (metadata alone, and the sync state, with
    /// `includeMetadataChanges`).
    mutating func raiseIfDue(_ id: Int, changes: [ChangeData], syncChanged: Bool) -> [(Int, ListenerEvent)] {
        var s = listeners[id]!
        let fromCache = !s.synced
        let hasPending = !s.mutatedKeys.isEmpty
        defer {
            s.shownHasPendingWrites = hasPending
            listeners[id] = s
        }
        if !s.raisedInitial {
            guard !fromCache || !s.shown.isEmpty || s.hasCachedResults || onlineState == .offline || s.cacheOnly else { return [] }
            s.raisedInitial = true
            let all = s.shown.enumerated().map { ChangeData(type: .added, doc: $1, oldIndex: nil, newIndex: $0) }
            return [(id, .query(docs: s.shown, changes: all, fromCache: fromCache, hasPendingWrites: hasPending))]
        }
        let visible = s.includeMetadataChanges ? changes : changes.filter { $0.type != .metadata }
        let pendingChanged = hasPending != s.shownHasPendingWrites
        guard !visible.isEmpty || ((syncChanged || pendingChanged) && s.includeMetadataChanges) else { return [] }
        return [(id, .query(docs: s.shown, changes: visible, fromCache: fromCache, hasPendingWrites: hasPending))]
    }

    /// Updates every standing query for changed documents and target changes; returns the
    /// events to deliver, in the order the listeners were added.
    mutating func emit(_ changed: [(old: LocalDocument?, new: LocalDocument?)], targetChanges: [Int: TargetChangeData],
                       resets: Set<Int> = []) -> [(Int, ListenerEvent)] {
        guard !listeners.isEmpty, !changed.isEmpty || !targetChanges.isEmpty else { return [] }
        var events: [(Int, ListenerEvent)] = []
        for id in listeners.keys.sorted() {
            guard var s = listeners[id] else { continue }
            let relevant = changed.filter { c in s.query.holds((c.new ?? c.old)!.key) }
            let targetChange = targetChanges[s.targetID]
            guard !relevant.isEmpty || targetChange != nil else { continue }
            if !relevant.isEmpty {
                if let limit = s.query.limit {
                    if relevant.contains(where: { s.reaches(old: $0.old, new: $0.new, limit: limit) }) { s.matching = run(s.query) }
                } else {
                    for c in relevant { s.update(old: c.old, new: c.new) }
                }
            }
            if let targetChange { s.current = targetChange.current }
            let newShown = Array(s.query.window(s.matching[...]))
            let oldMutated = s.mutatedKeys
            let newMutated = Set(newShown.filter { s.isPending($0) }.map(\.key))
            let (changes, _) = Self.diff(old: s.shown, new: newShown, orders: s.orders,
                                         wasPending: { oldMutated.contains($0) }, isPending: { newMutated.contains($0) })
            s.shown = newShown
            s.mutatedKeys = newMutated
            listeners[id] = s
            // A target about to be listened to again from scratch (an existence filter
            // mismatch) decides nothing about limbo, and is not consistent.
            let pendingReset = resets.contains(s.targetID)
            let (limboAdded, limboRemoved) = pendingReset ? ([], []) : updateLimbo(id)
            let synced = listeners[id]!.current && listeners[id]!.limbo.isEmpty && !pendingReset
            let syncChanged = synced != listeners[id]!.synced
            listeners[id]!.synced = synced
            if !changes.isEmpty || syncChanged {
                events += raiseIfDue(id, changes: changes, syncChanged: syncChanged)
            }
            for k in limboAdded.sorted() { trackLimbo(k) }
            for k in limboRemoved.sorted() { releaseLimbo(k) }
        }
        return events
    }

    /// The changes from `old` to `new` (both in query order), with Firestore's indexes: removals
    /// first, then additions and modifications, each group in query order, each index counted
    /// as the changes before it leave the list.
    static func diff(old: [LocalDocument], new: [LocalDocument], orders: [OrderBy],
                     wasPending: (ResourcePath) -> Bool = { _ in false }, isPending: (ResourcePath) -> Bool = { _ in false }) -> ([ChangeData], Bool) {
        var oldByKey: [ResourcePath: LocalDocument] = [:]
        for d in old { oldByKey[d.key] = d }
        var newByKey: [ResourcePath: LocalDocument] = [:]
        for d in new { newByKey[d.key] = d }
        var removed: [LocalDocument] = [], added: [LocalDocument] = [], modified: [(LocalDocument, ChangeKind)] = []
        var anyMetadata = false
        for d in old where newByKey[d.key] == nil { removed.append(d) }
        for d in new {
            if let o = oldByKey[d.key] {
                if o.fields != d.fields { modified.append((d, .modified)) } else if wasPending(o.key) != isPending(d.key) {
                    modified.append((d, .metadata))
                    anyMetadata = true
                }
            } else { added.append(d) }
        }
        if removed.isEmpty && added.isEmpty && modified.isEmpty { return ([], false) }
        // Replays the changes on the old list to find each one's indexes.
        var tracker = old
        func position(_ d: LocalDocument) -> Int? {
            var lo = 0, hi = tracker.count
            while lo < hi {
                let mid = (lo + hi) / 2
                let c = QueryCore.compare(tracker[mid], d, orders)
                if c < 0 { lo = mid + 1 } else if c > 0 { hi = mid } else { return tracker[mid].key == d.key ? mid : tracker.firstIndex { $0.key == d.key } }
            }
            return tracker.firstIndex { $0.key == d.key }
        }
        func insertionPoint(_ d: LocalDocument) -> Int {
            var lo = 0, hi = tracker.count
            while lo < hi {
                let mid = (lo + hi) / 2
                if QueryCore.compare(tracker[mid], d, orders) < 0 { lo = mid + 1 } else { hi = mid }
            }
            return lo
        }
        var out: [ChangeData] = []
        for d in removed {
            let i = position(d)!
            tracker.remove(at: i)
            out.append(ChangeData(type: .removed, doc: d, oldIndex: i, newIndex: nil))
        }
        var rest: [(LocalDocument, ChangeKind)] = added.map { ($0, .added) } + modified
        // Additions before modifications, each in query order (the SDK's order).
        rest.sort { a, b in
            if (a.1 == .added) != (b.1 == .added) { return a.1 == .added }
            return QueryCore.compare(a.0, b.0, orders) < 0
        }
        for (d, type) in rest {
            var oldIndex: Int?
            if type != .added, let o = oldByKey[d.key], let i = position(o) {
                oldIndex = i
                tracker.remove(at: i)
            }
            let j = insertionPoint(d)
            tracker.insert(d, at: j)
            out.append(ChangeData(type: type, doc: d, oldIndex: oldIndex, newIndex: j))
        }
        return (out, anyMetadata)
    }
}

/// How a document changed between two snapshots of a standing query.
enum ChangeKind: Sendable {
    case added, modified, removed
    /// Only the document's metadata changed (shown as `modified` to the app).
    case metadata
}

extension DocumentEngine: DataModel {
    /// ``apply(kind:lsn:payload:)``, the same function writes use, in the shared layer's replay.
    mutating func replay(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) throws {
        _ = try apply(kind: kind, lsn: Int64(lsn), payload: payload)
    }
}
