@_spi(Server) import Ferry
@_spi(Testing) import FerryLog
import FerryWire
import NIOHTTP1

/// Sending pending writes: in write order, batched when the server offers it, each carrying its
/// idempotency key; the cursor moves once per answer.
extension SyncClient {
    /// Sends until nothing is pending, then waits for a wake-up (a new local write); retries
    /// failures with backoff. Ends when cancelled (offline) or when the database is closed.
    func runWriter(_ wakeups: AsyncStream<Void>) async {
        guard await drain() else { return }
        for await _ in wakeups {
            guard await drain() else { return }
        }
    }

    /// Sends every pending write. Returns false when the writer should stop.
    private func drain() async -> Bool {
        var failures = 0
        // The next batch, read and encoded while the server works on the one sent: the two
        // are otherwise done one after the other. Used only if it starts where the answer left
        // the writes and has the same limits; dropped otherwise.
        var next: NextBatch?
        defer { next?.task.cancel() }
        while !Task.isCancelled {
            do {
                let caps = try await serverCapabilities()
                let request = NextBatch.Request(after: max(database.acknowledgedThrough, recording?.through ?? -1),
                                                // (At least one: a server offering batches of 0 writes
                                                // left every write unsent, silently.)
                                                limit: caps.batch ? max(1, min(options.maxBatchWrites, caps.maxWrites, batchWriteLimit)) : 1,
                                                maxBytes: min(options.maxBatchBytes, caps.maxBytes))
                var batch: Batch?
                if let n = next {
                    if n.request == request { batch = try? await n.task.value } else { n.task.cancel() }
                    next = nil
                }
                if batch == nil || batch!.writes.isEmpty {
                    batch = try await Self.read(request, from: database)
                }
                let writes = batch!.writes
                if writes.isEmpty {
                    try await finishRecording()
                    return true
                }
                let answered: Answered
                if caps.batch && writes.count > 1 && writes[0].id > alonePast {
                    let following = NextBatch.Request(after: writes[writes.count - 1].id, limit: request.limit, maxBytes: request.maxBytes)
                    let database = database
                    next = NextBatch(request: following, task: Task { try await Self.read(following, from: database) })
                    answered = try await sendBatch(batch!)
                } else {
                    answered = try await sendAlone(writes[0])
                }
                CrashPoint.hit("sync.answered")
                try await finishRecording()
                // (The cursor now is durable: synced before this request was built.)
                recording = (answered.through, database.acknowledgedThrough, Task { try await self.record(answered) })
                failures = 0
            } catch is CancellationError {
                try? await finishRecording()
                return false
            } catch let e as DatabaseError {
                try? await finishRecording()
                if e.code == .closed { logger.info("sync stops sending: the database is closed") } else { logger.error("sync stops sending: \(e)") }
                return false
            } catch let e as SyncError {
                failures += 1
                do { try await finishRecording() } catch {
                    logger.error("sync stops sending: \(error)")
                    return false
                }
                if e.code == .unauthenticated {
                    logger.warning("\(address) refused the token (\(e.message)); sending waits for a new one")
                    if await refreshToken(after: token) { failures = 1 }  // (still a pause: a provider may keep giving bad ones)
                } else if e.code == .badAnswer, let status = e.status, (400..<500).contains(status), status != 413 {
                    // The server refused a batch as a whole: send its writes one by one, so
                    // that each gets its own answer (a bad one is then rejected alone).
                    logger.warning("\(address) refused a batch (\(e)); sending its writes one at a time")
                    alonePast = (try? database.outgoingWrites(after: database.acknowledgedThrough, limit: min(options.maxBatchWrites, batchWriteLimit)).last?.id) ?? alonePast
                    failures = 0
                    continue
                } else if e.status == 413 && batchWriteLimit > 1 {
                    batchWriteLimit = max(1, min(batchWriteLimit, options.maxBatchWrites) / 2)
                    logger.warning("\(address) refused a batch as too large; sending at most \(batchWriteLimit) writes per batch")
                    failures = 0
                    continue
                } else {
                    logger.warning("sending to \(address) failed (\(e)); retrying")
                }
                do { try await Self.backoff(failures, options) } catch { return false }
            } catch {
                failures += 1
                do { try await finishRecording() } catch {
                    logger.error("sync stops sending: \(error)")
                    return false
                }
                logger.warning("sending to \(address) failed (\(error)); retrying")
                do { try await Self.backoff(failures, options) } catch { return false }
            }
        }
        try? await finishRecording()
        return false
    }

    /// Pending writes read to be sent together, with the JSON of their list.
    struct Batch: Sendable {
        var writes: [OutgoingWrite]
        var json: [UInt8]
    }

    /// A batch being read ahead, and what it was asked for.
    struct NextBatch {
        struct Request: Equatable {
            var after: Int64
            var limit: Int
            var maxBytes: Int
        }
        var request: Request
        var task: Task<Batch, any Error>
    }

    /// Reads the durable pending writes after `request.after` (up to its limits) and encodes
    /// them as a batch's list. A write leaves the device only once durable here: a write the
    /// server applied must never come back after a crash under another write's id.
    static func read(_ request: NextBatch.Request, from database: Database) async throws -> Batch {
        try await database.sync()
        let writes = try database.outgoingWrites(after: request.after, limit: request.limit, maxBytes: request.maxBytes)
        var list: [Value] = []
        list.reserveCapacity(writes.count)
        for w in writes {
            list.append(.object(["id": .int(w.id), "op": .string(w.operation == .set ? "set" : "update"),
                                 "path": .string(w.path), "data": w.data]))
        }
        return Batch(writes: writes, json: Value.array(list).jsonBytes)
    }

    /// Waits for the answer being recorded (the previous request's), if any.
    private func finishRecording() async throws {
        guard let r = recording else { return }
        defer { recording = nil }
        try await r.task.value
    }

    /// A server's answer to writes sent: through which write it answered, its rejections,
    /// and what the stream events must have shown before it is recorded.
    struct Answered: Sendable {
        var through: Int64
        var rejections: [WriteRejection]
        var paths: [String]
        var sentSerial: Int
        /// The commit the writes are visible at, from a server that numbers its commits.
        var commit: Int64?
        /// When the answer came (made as it is read).
        var answeredAt = ContinuousClock.now
    }

    /// Records an answer: after the stream events it caused (see ``awaitStreamEvents``), the
    /// rejections and the cursor, durably.
    private func record(_ a: Answered) async throws {
        if let commit = a.commit, capabilities?.commits == true {
            try await awaitCommit(commit, at: a.paths)
        } else {
            await awaitStreamEvents(for: a.paths, sentAfter: a.sentSerial, answeredAt: a.answeredAt)
        }
        try await database.acknowledgeWrites(through: a.through, rejecting: a.rejections)
    }

    /// The locations a write sets.
    static func writtenPaths(_ w: OutgoingWrite) -> [String] {
        guard w.operation == .update, case .object(let children) = w.data else { return [w.path] }
        return children.keys.map { join(w.path, "/" + $0) }
    }

    /// The idempotency headers of a write.
    private func identity(_ id: Int64) -> [(String, String)] {
        [(WireHeader.write, WriteIdentity(store: database.storeIdentifier, id: id).header),
         (WireHeader.acked, String(recordedCursor))]
    }

    /// One write as one REST request: set → PUT (null → DELETE), update → PATCH.
    private func sendAlone(_ w: OutgoingWrite) async throws -> Answered {
        let headers = identity(w.id)
        let sentSerial = eventSerial
        let answer: Answer
        switch w.operation {
        case .set where w.data == .null:
            answer = try await send(.DELETE, w.path, parameters: ["print": "silent"], headers: headers)
        case .set:
            answer = try await send(.PUT, w.path, parameters: ["print": "silent"], headers: headers, body: w.data.jsonBytes)
        case .update:
            answer = try await send(.PATCH, w.path, parameters: ["print": "silent"], headers: headers, body: w.data.jsonBytes)
        }
        if !answer.isSuccess {
            logger.warning("\(address) refused write \(w.id) at \(w.path): \(answer.status) \(answer.errorMessage)")
            return Answered(through: w.id, rejections: [WriteRejection(writeID: w.id, status: answer.status, message: answer.errorMessage)],
                            paths: [], sentSerial: sentSerial)
        }
        return Answered(through: w.id, rejections: [], paths: Self.writtenPaths(w), sentSerial: sentSerial,
                        commit: answer.headers.first(name: WireHeader.commit).flatMap { Int64($0) })
    }

    /// Many writes in one request (`POST /.ferry/batch.json`), answered per write.
    private func sendBatch(_ batch: Batch) async throws -> Answered {
        let writes = batch.writes
        // {"acked":…,"client":…,"writes":[…]}: the writes as read, the cursor as it is now.
        var body = Array(#"{"acked":"#.utf8) + Array(String(recordedCursor).utf8)
        body += #","client":"#.utf8
        body += Value.string(database.storeIdentifier).jsonBytes
        body += #","writes":"#.utf8
        body += batch.json
        body.append(UInt8(ascii: "}"))
        let sentSerial = eventSerial
        let answer = try await send(.POST, "/.ferry/batch", body: body)
        guard answer.status == 200, case .object(let o)? = answer.value, case .array(let results)? = o["results"] else {
            // The request as a whole was refused: none of its writes was applied.
            throw SyncError(.badAnswer, "the batch was answered \(answer.status): \(answer.errorMessage)", status: answer.status)
        }
        var through: Int64?
        var commit: Int64?
        var rejections: [WriteRejection] = []
        var expected = writes.makeIterator()
        for r in results {
            guard case .object(let ro) = r, case .int(let id)? = ro["id"], case .int(let status)? = ro["status"],
                  let w = expected.next(), w.id == id
            else { throw SyncError(.badAnswer, "a batch result does not answer the writes in order: \(r.json.prefix(200))") }
            if status >= 500 { break }  // not processed: sent again
            if !(200..<300).contains(status) {
                let message: String = if case .string(let m)? = ro["error"] { m } else { "HTTP \(status)" }
                logger.warning("\(address) refused write \(id) at \(w.path): \(status) \(message)")
                rejections.append(WriteRejection(writeID: id, status: Int(status), message: message))
            } else if case .int(let c)? = ro["commit"] {
                commit = max(commit ?? c, c)
            }
            through = id
        }
        guard let through else { throw SyncError(.unavailable, "the server processed none of the batch's writes") }
        let rejected = Set(rejections.map(\.writeID))
        return Answered(through: through, rejections: rejections,
                        paths: writes.filter { $0.id <= through && !rejected.contains($0.id) }.flatMap(Self.writtenPaths),
                        sentSerial: sentSerial, commit: commit)
    }

    /// The cursor the server may rely on (`X-Ferry-Acked`): answers recorded durably — not
    /// one still being recorded, whose rejections the server must keep until it is.
    private var recordedCursor: Int64 {
        recording?.cursorBefore ?? database.acknowledgedThrough
    }
}
