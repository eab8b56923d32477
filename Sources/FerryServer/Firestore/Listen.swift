import FerryDocuments
import FerryFirestoreWire
import Foundation
import Synchronization

typealias ListenResponse = Google_Firestore_V1_ListenResponse

/// Where one Listen stream's messages go: an unbounded queue the stream's writer drains, with
/// bounds on what may wait, in messages and in bytes (`--max-stream-buffer`). A client that
/// stops reading is cut off (`RESOURCE_EXHAUSTED`, after which a client listens again with its
/// resume token) instead of growing the server.
final class ListenSink: Sendable {
    static let maxWaiting = 50_000
    /// The messages, a group at a time (one element per group: one hand-over per commit, and
    /// the writer writes a group before it flushes), with their estimated bytes.
    let stream: AsyncStream<(messages: [ListenResponse], bytes: Int)>
    private let continuation: AsyncStream<(messages: [ListenResponse], bytes: Int)>.Continuation
    private let waiting = Atomic<Int>(0)
    private let waitingBytes = Atomic<Int>(0)
    let maxWaitingBytes: Int
    let overflowed = Atomic<Bool>(false)

    init(maxWaitingBytes: Int) {
        self.maxWaitingBytes = maxWaitingBytes
        (stream, continuation) = AsyncStream<(messages: [ListenResponse], bytes: Int)>.makeStream()
    }

    /// Queues `messages` (`bytes`: their estimated size, when the caller knows it; see
    /// ``estimatedBytes(_:)``); past either bound of what is already waiting, ends the stream
    /// instead (one group of messages — a target's first snapshot, however big — always goes).
    func send(_ messages: [ListenResponse], bytes: Int? = nil) {
        guard !messages.isEmpty else { return }
        let size = bytes ?? messages.reduce(0) { $0 + Self.estimatedBytes($1) }
        let before = (waiting.add(messages.count, ordering: .relaxed).newValue - messages.count,
                      waitingBytes.add(size, ordering: .relaxed).newValue - size)
        if before.0 > Self.maxWaiting || before.1 > maxWaitingBytes {
            overflowed.store(true, ordering: .relaxed)
            continuation.finish()
            return
        }
        continuation.yield((messages, size))
    }

    /// A group of `count` messages and `bytes` written to the client.
    func sent(_ count: Int, bytes: Int) {
        waiting.subtract(count, ordering: .relaxed)
        waitingBytes.subtract(bytes, ordering: .relaxed)
    }

    /// About the bytes `message` takes on the wire: a document's name and values, and a
    /// constant for the rest.
    static func estimatedBytes(_ message: ListenResponse) -> Int {
        switch message.responseType {
        case .documentChange(let c)?: return estimatedBytes(c.document)
        case .documentDelete(let d)?: return 48 + d.document.utf8.count
        case .documentRemove(let d)?: return 48 + d.document.utf8.count
        default: return 48
        }
    }

    static func estimatedBytes(_ doc: Google_Firestore_V1_Document) -> Int {
        doc.fields.reduce(64 + doc.name.utf8.count) { $0 + $1.key.utf8.count + 2 + estimatedBytes($1.value) }
    }

    static func estimatedBytes(_ v: Google_Firestore_V1_Value) -> Int {
        switch v.valueType {
        case .stringValue(let s)?: return s.utf8.count + 2
        case .bytesValue(let b)?: return b.count + 2
        case .referenceValue(let r)?: return r.utf8.count + 2
        case .arrayValue(let a)?: return a.values.reduce(2) { $0 + estimatedBytes($1) }
        case .mapValue(let m)?: return m.fields.reduce(2) { $0 + $1.key.utf8.count + 2 + estimatedBytes($1.value) }
        case .geoPointValue?: return 20
        default: return 10
        }
    }

    func finish() { continuation.finish() }
}

/// What a target watches, and what its client holds.
struct ListenTarget: Sendable {
    /// A query target (nil: a documents target).
    var query: WireQuery?
    var documents: Set<ResourcePath> = []
    /// The documents the client holds for it, with the update time it was sent.
    var sent: [ResourcePath: Int64] = [:]

    func watches(_ key: ResourcePath) -> Bool {
        if let query { return query.core.holds(key) }
        return documents.contains(key)
    }
}

/// Every Listen stream of one database and its targets.
struct ListenRegistry: Sendable {
    struct Stream: Sendable {
        var sink: ListenSink
        var targets: [Int32: ListenTarget] = [:]
    }
    var streams: [Int: Stream] = [:]
    var nextID = 1
}

extension DocumentStore {
    /// A new Listen stream, whose messages go to `sink`.
    func openListen(_ sink: ListenSink) -> Int {
        state.withLock { s in
            let id = s.listens.nextID
            s.listens.nextID += 1
            s.listens.streams[id] = ListenRegistry.Stream(sink: sink)
            return id
        }
    }

    func closeListen(_ id: Int) {
        let sink = state.withLock { s in s.listens.streams.removeValue(forKey: id)?.sink }
        sink?.finish()
    }

    /// A `ListenRequest` of stream `id`: a target added (answered with its documents as of now,
    /// or the changes since its resume token), or removed.
    func listenRequest(_ id: Int, _ request: Google_Firestore_V1_ListenRequest) {
        state.withLock { s in
            guard let stream = s.listens.streams[id] else { return }
            switch request.targetChange {
            case nil: break
            case .removeTarget(let tid):
                // Answered even for a target not listened to: the client counts its answers.
                s.listens.streams[id]?.targets[tid] = nil
                stream.sink.send([Self.targetChange(.remove, [tid])])
            case .addTarget(let target):
                var tid = target.targetID
                if tid == 0 { tid = (stream.targets.keys.max() ?? 0) + 2 }
                // A target listened to again (a client that reset it, or listens again after a
                // reconnection raced with this stream) starts over: it replaces the old one.
                s.listens.streams[id]?.targets[tid] = nil
                do {
                    let (listen, messages, bytes) = try Self.startTarget(target, id: tid, s, database: name, epoch: epoch)
                    if !target.once { s.listens.streams[id]?.targets[tid] = listen }
                    stream.sink.send(messages + (target.once ? [Self.targetChange(.remove, [tid])] : []), bytes: bytes + 48)
                } catch {
                    let e = error as? FirestoreErrorCode ?? FirestoreErrorCode(.internal, "\(error)")
                    stream.sink.send([Self.targetChange(.remove, [tid], cause: e)])
                }
            }
        }
    }

    static func targetChange(_ type: Google_Firestore_V1_TargetChange.TargetChangeType, _ ids: [Int32], cause: FirestoreErrorCode? = nil, readTime: Int64? = nil, token: Data? = nil) -> ListenResponse {
        var c = Google_Firestore_V1_TargetChange()
        c.targetChangeType = type
        c.targetIds = ids
        if let cause {
            var status = Google_Firestore_V1_Status()
            status.code = Int32(cause.code.rawValue)
            status.message = cause.message
            c.cause = status
        }
        if let readTime { c.readTime = wireTimestamp(micros: readTime) }
        if let token { c.resumeToken = token }
        var r = ListenResponse()
        r.targetChange = c
        return r
    }

    static func wireDocument(_ key: ResourcePath, _ d: StoredDocument, _ database: DatabaseName) -> Google_Firestore_V1_Document {
        var doc = Google_Firestore_V1_Document()
        doc.name = database.name(of: key)
        doc.fields = FieldValueData.wire(fields: d.fields, in: database)
        doc.createTime = wireTimestamp(micros: d.createTime)
        doc.updateTime = wireTimestamp(micros: d.updateTime)
        return doc
    }

    private static func changed(_ key: ResourcePath, _ d: StoredDocument, _ tid: Int32, _ database: DatabaseName,
                                _ converted: inout [ResourcePath: (doc: Google_Firestore_V1_Document, bytes: Int)], _ bytes: inout Int) -> ListenResponse {
        var c = Google_Firestore_V1_DocumentChange()
        // One conversion (and size) per document and publication, however many streams get it.
        if let w = converted[key] {
            c.document = w.doc
            bytes += w.bytes
        } else {
            let w = wireDocument(key, d, database)
            let size = ListenSink.estimatedBytes(w)
            converted[key] = (w, size)
            c.document = w
            bytes += size
        }
        c.targetIds = [tid]
        var r = ListenResponse()
        r.documentChange = c
        return r
    }

    private static func gone(_ key: ResourcePath, deleted: Bool, _ tid: Int32, at time: Int64, _ database: DatabaseName) -> ListenResponse {
        var r = ListenResponse()
        if deleted {
            var d = Google_Firestore_V1_DocumentDelete()
            d.document = database.name(of: key)
            d.removedTargetIds = [tid]
            d.readTime = wireTimestamp(micros: time)
            r.documentDelete = d
        } else {
            var d = Google_Firestore_V1_DocumentRemove()
            d.document = database.name(of: key)
            d.removedTargetIds = [tid]
            d.readTime = wireTimestamp(micros: time)
            r.documentRemove = d
        }
        return r
    }

    /// The documents a target shows now.
    private static func results(_ t: ListenTarget, _ s: State) -> [(ResourcePath, StoredDocument)] {
        if let q = t.query {
            var unlimited = q
            unlimited.projection = nil
            return run(unlimited, in: s, overlay: [:])
        }
        return t.documents.sorted().compactMap { k in s.document(k).map { (k, $0) } }
    }

    /// A target's first messages (and about their bytes): ADD, its documents (or, resuming, what changed since its
    /// token: changed, removed, deleted), CURRENT, the count (an existence filter), and a
    /// global NO_CHANGE with the read time and a resume token. A token the store cannot resume
    /// from (another store's, or older than the deletions it remembers) gets RESET first.
    static func startTarget(_ target: Google_Firestore_V1_Target, id tid: Int32, _ s: State, database: DatabaseName, epoch: UInt64) throws -> (ListenTarget, [ListenResponse], bytes: Int) {
        var t = ListenTarget()
        switch target.targetType {
        case nil: throw FirestoreErrorCode(.invalidArgument, "a target must be a query or documents")
        case .documents(let d):
            guard !d.documents.isEmpty else { throw FirestoreErrorCode(.invalidArgument, "a documents target names no document") }
            t.documents = Set(try d.documents.map { try database.documentPath($0) })
        case .query(let q):
            guard case .structuredQuery(let sq)? = q.queryType else { throw FirestoreErrorCode(.invalidArgument, "a query target has no query") }
            t.query = try WireQuery(sq, parent: try database.parentPath(q.parent), in: database)
        }
        var since: Int64?
        var reset = false
        // A window (limit, offset) is sent whole: a document can enter or leave it without
        // changing, which the changes since a token do not show.
        let windowed = t.query.map { $0.core.limit != nil || $0.offset > 0 } ?? false
        switch target.resumeType {
        case _ where windowed && target.resumeType != nil:
            reset = true
        case .resumeToken(let data)?:
            if let token = ResumeToken(data), token.epoch == epoch, token.commit >= s.horizon, token.commit <= s.lastCommit {
                since = token.commit
            } else {
                reset = true
            }
        case .readTime(let time)?:
            let micros = try Timestamp(wire: time).micros
            if micros >= s.horizon, micros <= s.lastCommit { since = micros } else { reset = true }
        case nil: break
        }
        var out = [targetChange(.add, [tid])]
        if reset { out.append(targetChange(.reset, [tid])) }
        let now = results(t, s)
        var converted: [ResourcePath: (doc: Google_Firestore_V1_Document, bytes: Int)] = [:]
        var bytes = 0
        for (k, d) in now {
            t.sent[k] = d.updateTime
            if since.map({ d.updateTime > $0 }) ?? true { out.append(changed(k, d, tid, database, &converted, &bytes)) }
        }
        if let since {
            // What left the target since the token: deleted, or changed so it no longer matches.
            for (k, time) in s.tombstones where time > since && t.watches(k) { out.append(gone(k, deleted: true, tid, at: time, database)) }
            if let q = t.query {
                let shown = Set(now.map(\.0))
                let collections = q.core.collectionGroup == nil
                    ? [(q.core.path, s.collections[q.core.path] ?? [:])]
                    : s.collections.filter { $0.key.last == q.core.collectionGroup && q.core.path.isPrefix(of: $0.key) }.map { ($0.key, $0.value) }
                for (parent, docs) in collections {
                    for (docID, d) in docs where d.updateTime > since {
                        let k = parent.appending(docID)
                        if !shown.contains(k) { out.append(gone(k, deleted: false, tid, at: d.updateTime, database)) }
                    }
                }
            }
        }
        out.append(targetChange(.current, [tid], token: ResumeToken(epoch: epoch, commit: s.lastCommit).data))
        if since != nil {
            var f = Google_Firestore_V1_ExistenceFilter()
            f.targetID = tid
            f.count = Int32(now.count)
            var r = ListenResponse()
            r.filter = f
            out.append(r)
        }
        out.append(targetChange(.noChange, [], readTime: s.lastCommit, token: ResumeToken(epoch: epoch, commit: s.lastCommit).data))
        // The documents' sizes, and a constant per message for the rest.
        return (t, out, bytes + 48 * out.count)
    }

    /// Tells every stream what a group of commits changed in its targets, then a global
    /// NO_CHANGE at the group's last commit.
    static func publish(_ changes: [DocumentChangeRecord], at time: Int64, _ s: inout State, database: DatabaseName, epoch: UInt64) {
        guard !s.listens.streams.isEmpty else { return }
        var final: [ResourcePath: StoredDocument?] = [:]
        var changedAt: [ResourcePath: Int64] = [:]
        for c in changes {
            final[c.key] = .some(c.after)
            changedAt[c.key] = c.time
        }
        // The changed names in order once, not per target. The streams are taken out of the
        // state while they change, so that each target's `sent` is changed in place (a shared
        // copy would be copied whole, per target and per commit: perf showed it).
        let changedNames = final.keys.sorted()
        var streams = s.listens.streams
        s.listens.streams = [:]
        var converted: [ResourcePath: (doc: Google_Firestore_V1_Document, bytes: Int)] = [:]
        for sid in Array(streams.keys) {
            guard var stream = streams.removeValue(forKey: sid) else { continue }
            var out: [ListenResponse] = []
            var bytes = 48
            for tid in Array(stream.targets.keys) {
                guard var t = stream.targets.removeValue(forKey: tid) else { continue }
                defer { stream.targets[tid] = t }
                let touched = changedNames.filter { t.watches($0) }
                if touched.isEmpty { continue }
                if let q = t.query, q.core.limit != nil || q.offset > 0 {
                    // A window: what enters it may push another out.
                    let now = results(t, s)
                    var next: [ResourcePath: Int64] = [:]
                    for (k, d) in now {
                        next[k] = d.updateTime
                        if t.sent[k] != d.updateTime { out.append(changed(k, d, tid, database, &converted, &bytes)) }
                    }
                    for (k, _) in t.sent where next[k] == nil {
                        out.append(gone(k, deleted: s.document(k) == nil, tid, at: changedAt[k] ?? time, database))
                        bytes += 48 + k.description.utf8.count
                    }
                    t.sent = next
                } else {
                    let orders = t.query?.core.orders ?? []
                    for k in touched {
                        let after = final[k]!
                        let matches = after.map { d in t.query.map { $0.core.matches(LocalDocument.stored(k, d.fields), orders: orders) } ?? true } ?? false
                        if matches, let d = after {
                            if t.sent[k] != d.updateTime {
                                out.append(changed(k, d, tid, database, &converted, &bytes))
                                t.sent[k] = d.updateTime
                            }
                        } else if t.sent.removeValue(forKey: k) != nil {
                            out.append(gone(k, deleted: after == nil, tid, at: changedAt[k] ?? time, database))
                            bytes += 48 + k.description.utf8.count
                        }
                    }
                }
            }
            if !out.isEmpty {
                out.append(targetChange(.noChange, [], readTime: time, token: ResumeToken(epoch: epoch, commit: time).data))
                stream.sink.send(out, bytes: bytes)
            }
            streams[sid] = stream
        }
        s.listens.streams = streams
    }
}
