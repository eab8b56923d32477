import FerryLog
import Foundation

/// What a server connection answers directly (reads from the server, transactions): the
/// connection implements it over the network.
package protocol DocumentServer: Sendable {
    /// The documents as the server holds them, in the order asked (fields nil: missing).
    func documents(_ keys: [ResourcePath], transaction: Data?) async throws -> [WatchDocument]
    /// The query's results on the server, in its order.
    func query(_ q: QueryCore, transaction: Data?) async throws -> [WatchDocument]
    /// A read-write transaction (`retrying`: the one that aborted before it).
    func beginTransaction(retrying: Data?) async throws -> Data
    /// Commits `mutations` in the transaction: `aborted` when what it read changed.
    func commit(_ mutations: [Mutation], transaction: Data) async throws
    func rollback(_ transaction: Data) async
}

/// The store's side of a server connection (`FerryDocumentsSync`): what it asks of the server
/// (listens, pending batches) and what it is told (watch changes, write answers). Each report
/// is one sync step: applied under the store's lock, recorded, and delivered to listeners.
extension Firestore {
    /// The store's id in the server's exactly-once marks: its log's id, which a restart keeps.
    package var clientID: String {
        String(medium.storeID.high, radix: 16) + String(medium.storeID.low, radix: 16)
    }

    /// Attaches a server connection: listeners get targets (those made before too), and
    /// `wake` is called, outside the store's lock, whenever there may be something to send.
    package func attachRemote(server: any DocumentServer, wake: @escaping @Sendable () -> Void) throws {
        let attached = remoteServer.withLock { current -> Bool in
            if current != nil { return true }
            current = server
            return false
        }
        if attached { throw FirestoreErrorCode(.failedPrecondition, "this store already has a server connection: close it first") }
        remoteWake.withLock { $0 = wake }
        syncStep { e in
            guard !e.remoteAttached else { return [] }
            e.remoteAttached = true
            for id in e.listeners.keys.sorted() where e.listeners[id]!.targetID == 0 && !e.listeners[id]!.cacheOnly {
                e.listeners[id]!.targetID = e.allocateTarget(e.listeners[id]!.query)
            }
            return e.networkEnabled ? e.setOnline(.unknown) : []
        }
        wakeRemote()
    }

    /// Detaches the connection: the store is offline until one is attached again.
    package func detachRemote() {
        remoteWake.withLock { $0 = nil }
        remoteServer.withLock { $0 = nil }
        syncStep { e in
            e.connectionStopped()
            e.remoteAttached = false
            e.outbox = []
            return e.setOnline(.offline)
        }
    }

    func wakeRemote() { remoteWake.withLock { $0 }?() }

    /// The server to read from, when one is connected and the network is enabled.
    var reachableServer: (any DocumentServer)? {
        networkEnabled ? remoteServer.withLock { $0 } : nil
    }

    /// Whether the app allows the network (``disableNetwork()``).
    package var networkEnabled: Bool { state.withLock { $0.networkEnabled && !$0.closed } }

    /// The listen requests made since the last call, in order.
    package func takeRemoteRequests() -> [RemoteRequest] {
        state.withLock { e in defer { e.outbox = [] }; return e.outbox }
    }

    /// The batches not yet answered and durable here, oldest first (the server answers them in
    /// this order), and whether more are pending that are not durable yet. A batch leaves the
    /// device only once durable: its id is its record's LSN, which a crash could give to
    /// another batch, and the server's exactly-once marks go by that id.
    package func pendingBatches(limit: Int) -> (durable: [MutationBatch], more: Bool) {
        let durable = log.map { Int64($0.durableLSN.rawValue) } ?? .max
        return state.withLock { e in
            let ready = Array(e.pending.prefix(limit).prefix { $0.id < durable })
            return (ready, e.pending.count > ready.count && ready.count < limit)
        }
    }

    private func remote(_ body: (inout DocumentEngine) -> [(Int, ListenerEvent)]) {
        syncStep(body)
        // Only what may have made listen requests wakes the connection.
        if state.withLock({ !$0.outbox.isEmpty }) { wakeRemote() }
    }

    // MARK: What the server said

    /// The stream is open: every target is listened to again, from its resume token.
    package func remoteStreamStarted() {
        remote { e in
            // Requests made for the last stream are void: every target is sent afresh.
            e.outbox = []
            e.connectionStopped()
            e.resendTargets()
            return []
        }
    }

    /// The stream failed or closed: nothing is listened to until it opens again; the store is
    /// offline once a connection fails twice (Firestore's online-state rule).
    package func remoteStreamStopped() {
        remote { e in
            let events = e.onlineState == .online ? e.setOnline(.unknown) : e.setOnline(.offline)
            e.connectionStopped()
            return events
        }
    }

    package func remoteTargetAdded(_ ids: [Int]) { remote { $0.watchAck(ids); return [] } }
    package func remoteTargetCurrent(_ ids: [Int], resumeToken: String) { remote { $0.watchCurrent(ids, resumeToken: resumeToken); return [] } }
    package func remoteTargetReset(_ ids: [Int]) { remote { $0.watchReset(ids); return [] } }
    package func remoteTargetRemoved(_ ids: [Int], error: FirestoreErrorCode?) { remote { $0.watchRemove(ids, error: error) } }
    package func remoteExistenceFilter(_ id: Int, count: Int) { remote { $0.watchFilter([id], count: count); return [] } }

    /// NO_CHANGE: for no target in particular with a read time, a consistent snapshot at it.
    package func remoteNoChange(_ ids: [Int], resumeToken: String, readTime: Int64?) {
        remote { e in
            e.watchNoChange(ids, resumeToken: resumeToken)
            guard ids.isEmpty, let readTime else { return [] }
            return e.watchSnapshot(version: readTime)
        }
    }

    /// A document changed (`doc` with fields), was deleted (`doc` without), or left targets.
    package func remoteDocument(_ doc: WatchDocument?, key: ResourcePath, updated: [Int], removed: [Int]) {
        remote { $0.watchDocument(doc, key: key, updated: updated, removed: removed); return [] }
    }

    /// The oldest pending batches were answered, in order: committed at a version (µs), or
    /// refused (reverted; their waiters get the error). One step for them all: one sync of
    /// the answers' records.
    package func remoteWritesAnswered(_ answers: [Result<Int64, FirestoreErrorCode>]) {
        remote { e in
            var events: [(Int, ListenerEvent)] = []
            for a in answers {
                switch a {
                case .success(let version): events += e.acknowledgeOldest(version: version).events
                case .failure(let error): events += e.rejectOldest(error).events
                }
            }
            return events
        }
    }
}
