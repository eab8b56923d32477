@_spi(Server) import Ferry
import FerryWire
import NIOHTTP1

/// Reading once and transactions, online.
extension SyncClient {
    /// The data of `query`: the server's when connected (`fromCache == false`; its answer
    /// also goes into the cache), otherwise — or when the server cannot be reached — the
    /// cache's, with local writes.
    ///
    /// - Throws: ``Ferry/DatabaseError/Code/notCached`` when neither has it; ``SyncError``
    ///   (`rejected`) when the server refuses the read (rules).
    public func getData(_ query: DatabaseQuery) async throws -> DataSnapshot {
        guard online else { return try await query.getData() }
        let (path, parameters) = query.restRequest
        let answer: Answer
        do {
            answer = try await send(.GET, path, parameters: parameters ?? [:])
        } catch let e as SyncError where e.code == .unavailable || e.code == .unauthenticated {
            logger.info("getData at \(path): the server cannot answer (\(e)); reading the cache")
            return try await query.getData()
        }
        guard answer.status == 200, let value = answer.value else {
            throw SyncError(.rejected, "reading \(path): \(answer.errorMessage)", status: answer.status)
        }
        if parameters?.isEmpty ?? true && !isListened(path) {
            // All the data at the location: it is the server's, store it. (Where a listen keeps
            // the cache, its stream is the order of truth: this answer may be older than it.
            // See `isListened`.)
            try await database.applyServerPut(at: path, value)
            forgetPositions(overlapping: path, except: nil)
        }
        // The server's data, as it answered (`fromCache == false`).
        return try query.snapshot(serverValue: value)
    }

    /// Whether a listen keeps data at, above or below `path` (filtered or not): its stream, not
    /// an answer read apart from it, is then the order of truth there, since the answer may be
    /// older than what the stream showed. (Only listens at or above were looked for: a
    /// `getData` of `/rooms` stored an answer older than what a listen of `/rooms/1` showed,
    /// and its listener went back to the older value until the next event.)
    func isListened(_ path: String) -> Bool {
        let keys = path.split(separator: "/")
        return listens.keys.contains { listen in
            let at = listen.path.split(separator: "/")
            return keys.starts(with: at) || at.starts(with: keys)
        }
    }

    /// Whether one of `listens` is for all the data at or above `path`.
    static func covers(_ listens: some Sequence<ListenRequest>, _ path: String) -> Bool {
        let keys = path.split(separator: "/")
        return listens.contains { $0.parameters.isEmpty && keys.starts(with: $0.path.split(separator: "/")) }
    }

    /// The data of `ref`, as ``getData(_:)``.
    public func getData(_ ref: DatabaseReference) async throws -> DataSnapshot { try await getData(ref.query) }

    /// Runs a transaction on the server's data when online: reads the value with its ETag,
    /// runs `update`, writes the result only if the ETag still matches (`if-match`), and on
    /// `412` runs `update` again on the value the server returned — at most 25 runs. Offline,
    /// it is the database's local transaction (``Ferry/DatabaseReference/runTransaction(_:)``),
    /// whose write is sent like any other.
    ///
    /// - Throws: ``SyncError`` — `tooManyRetries` after 25 runs, `rejected` (with the status)
    ///   when the server refuses the read or the write (rules, invalid data), `unavailable`
    ///   when the connection fails during the transaction (the write may or may not have been
    ///   applied: read the data again).
    public func runTransaction(at ref: DatabaseReference,
                               _ update: @Sendable (inout MutableData) -> TransactionDecision) async throws -> TransactionResult {
        guard online else { return try await ref.runTransaction(update) }
        let path = ref.query.restRequest.path
        var answer = try await send(.GET, path, headers: [(WireHeader.firebaseETag, "true")])
        for _ in 0..<DatabaseReference.maxTransactionRuns {
            guard answer.status == 200 || answer.status == 412, let etag = answer.headers.first(name: "ETag") else {
                throw SyncError(.rejected, "reading \(path) for a transaction: \(answer.errorMessage)", status: answer.status)
            }
            let current = answer.value ?? .null
            var data = try MutableData(serverValue: current)
            if case .abort = update(&data) {
                return try await result(at: ref, path, serverData: current, committed: false)
            }
            let body = try data.exportValue(at: path)
            let put = try await send(.PUT, path, headers: [("if-match", etag)], body: body.jsonBytes)
            if put.isSuccess {
                // The server's data now; with server values in it, as the server resolved them.
                var written: Value? = put.value ?? body
                if body.json.contains("\".sv\"") {
                    let read = try await send(.GET, path)
                    written = read.status == 200 ? read.value : nil
                }
                return try await result(at: ref, path, serverData: written, committed: true)
            }
            guard put.status == 412 else {
                throw SyncError(.rejected, "writing \(path) in a transaction: \(put.errorMessage)", status: put.status)
            }
            answer = put  // the current value and its ETag
        }
        throw SyncError(.tooManyRetries, "the transaction at \(path) was rerun \(DatabaseReference.maxTransactionRuns) times; the server's data kept changing")
    }

    /// A transaction's result, given `serverData`, the server's data at `path` now (nil when it
    /// could not be read back): stored and read through the cache, unless a listen keeps data
    /// there (see ``isListened(_:)``); then the snapshot is the server's data as it answered,
    /// since the cache may not hold the location whole (a read of it failed after the server
    /// had taken the write).
    private func result(at ref: DatabaseReference, _ path: String, serverData: Value?, committed: Bool) async throws -> TransactionResult {
        if let serverData {
            if isListened(path) {
                return TransactionResult(serverCommitted: committed, snapshot: try ref.query.snapshot(serverValue: serverData))
            }
            try await database.applyServerPut(at: path, serverData)
            forgetPositions(overlapping: path, except: nil)
        }
        return TransactionResult(serverCommitted: committed, snapshot: try await ref.getData())
    }
}
