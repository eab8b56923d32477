import AsyncHTTPClient
@_spi(Server) import Ferry
import FerryWire
import NIOCore
import NIOHTTP1

/// Writes the server makes when this client's connection ends — Firebase's `onDisconnect()`,
/// for presence (`/status/me = "online"`, removed when the app goes away). Registered on
/// `ferry-server` (an extension: Firebase's REST API has none), kept durably there, and run
/// when the client's presence stream ends: the app was killed or went offline (at once), its
/// network went silent (once the server's keep-alives stay unacknowledged past its presence
/// timeout), or it did not connect again within that timeout after a server restart. Then
/// they are gone: register them again on each connection, as Firebase apps do in their
/// `.info/connected` handler (``SyncClient/connectionStates()``).
///
/// ```swift
/// let status = try db.reference("status/\(uid)")
/// try await sync.onDisconnect(status).removeValue()
/// try await status.setValue("online")
/// ```
public struct OnDisconnect: Sendable {
    let client: SyncClient
    let ref: DatabaseReference

    /// Sets the data here to `value` when the connection ends (server values allowed).
    public func setValue(_ value: Value) async throws {
        try await client.registerDisconnect("set", ref, value)
    }

    /// Sets these children (paths relative to here, none inside another; null removes) when
    /// the connection ends.
    public func updateChildValues(_ values: [String: Value]) async throws {
        try await client.registerDisconnect("update", ref, .object(values))
    }

    /// Removes the data here when the connection ends.
    public func removeValue() async throws {
        try await client.registerDisconnect("set", ref, .null)
    }

    /// Forgets the writes registered here and below.
    public func cancel() async throws {
        try await client.registerDisconnect("cancel", ref, nil)
    }
}

extension SyncClient {
    /// The writes to make at `ref` when this client's connection to the server ends (see
    /// ``OnDisconnect``).
    public nonisolated func onDisconnect(_ ref: DatabaseReference) -> OnDisconnect {
        OnDisconnect(client: self, ref: ref)
    }

    /// Milliseconds to add to this device's clock to get the server's (Firebase's
    /// `.info/serverTimeOffset`), as last measured from an answer; 0 before one.
    public nonisolated var serverTimeOffset: Int64 { database.serverTimeOffset }

    /// Sends a registration, once the presence stream is open (a registration made while the
    /// client is not connected would wait for the server's presence timeout).
    ///
    /// - Throws: ``SyncError`` — `unavailable` offline, when the server cannot be reached or
    ///   offers no presence (a foreign server); `rejected` (with the status) when it refuses
    ///   the write (rules, invalid data).
    func registerDisconnect(_ op: String, _ ref: DatabaseReference, _ data: Value?) async throws {
        guard online else { throw SyncError(.unavailable, "onDisconnect at \(ref.path) needs the client online") }
        guard try await serverCapabilities().presence else {
            throw SyncError(.unavailable, "\(address) offers no onDisconnect (a Firebase server's REST API has none)")
        }
        startPresence()
        guard await awaitPresence() else {
            throw SyncError(.unavailable, "onDisconnect at \(ref.path): the presence stream to \(address) did not open")
        }
        var body: [String: Value] = ["client": .string(database.storeIdentifier), "op": .string(op), "path": .string(ref.path.description)]
        if let data { body["data"] = data }
        let answer = try await send(.POST, "/.ferry/presence", body: Value.object(body).jsonBytes)
        guard answer.isSuccess else {
            throw SyncError(.rejected, "onDisconnect at \(ref.path): \(answer.errorMessage)", status: answer.status)
        }
    }

    /// Holds the presence stream while online (with a server that offers presence).
    func startPresence() {
        guard online, presenceTask == nil else { return }
        presenceTask = Task { await self.runPresence() }
    }

    /// Waits until the presence stream is open; false when the client goes offline or the
    /// request timeout passes first.
    private func awaitPresence() async -> Bool {
        let deadline = ContinuousClock.now + options.requestTimeout
        let timer = Task { [weak self] in
            try? await Task.sleep(until: deadline)
            await self?.noteProgress()
        }
        defer { timer.cancel() }
        while online && !presenceOpen && ContinuousClock.now < deadline && !Task.isCancelled {
            await withCheckedContinuation { progressWaiters.append($0) }
        }
        return online && presenceOpen
    }

    private func runPresence() async {
        var failures = 0
        while !Task.isCancelled {
            do {
                let t = try await currentToken()
                let request = transport.request(.GET, "/.ferry/presence", headers: [("Accept", "text/event-stream"), (WireHeader.client, database.storeIdentifier)], token: t)
                let response = try await transport.client(for: .GET).execute(request, deadline: .distantFuture)
                guard response.status == .ok else {
                    throw SyncError(.unavailable, "the presence stream was answered \(response.status.code)")
                }
                presenceOpen = true
                failures = 0
                noteProgress()
                setConnected(true)
                // Nothing to read but keep-alives; a server gone silent is a lost connection.
                let silence = Silence()
                let limit = options.streamSilenceLimit
                try await withThrowingTaskGroup(of: Void.self) { group in
                    group.addTask { for try await _ in response.body { silence.reset() } }
                    group.addTask {
                        while true {
                            try await Task.sleep(for: limit / 4)
                            if silence.exceeded(limit) { throw SyncError(.unavailable, "the presence stream went silent") }
                        }
                    }
                    defer { group.cancelAll() }
                    try await group.next()
                }
            } catch {
                if Task.isCancelled { break }
                logger.info("the presence stream ended (\(error)); reconnecting")
            }
            if Task.isCancelled { break }
            setConnected(false)  // (the server has run this client's onDisconnect writes)
            presenceOpen = false
            failures += 1
            do { try await Self.backoff(failures, options) } catch { break }
        }
        presenceOpen = false
    }
}
