@_spi(Server) import Ferry
import FerryLog
import FerrySync
import FerryTestSupport
import FerryWire
import Foundation
import Testing

/// `onDisconnect`: writes `ferry-server` makes when a client's connection ends. A, a client
/// process, marks itself online with an onDisconnect removal; B, another client, watches.
@Suite struct PresenceTests {
    /// A client process that marks `/status/A` online and removes it on disconnect.
    static func presentClient(_ dir: TemporaryDirectory, port: Int) throws -> ChildProcess {
        let a = try ChildProcess(Locations.executable("ferry-sync-child"), ["presence", dir.sub("a"), "http://127.0.0.1:\(port)?ns=t", "status/A"])
        guard a.waitForLine({ $0 == "present 1" }) else {
            a.kill9()
            throw HTTPTestError(message: "the client never said it was present: \(a.outputLines)")
        }
        return a
    }

    /// B's view of `/status/A`, as its listener shows it.
    final class Watcher: Sendable {
        final class Values: Sendable { let list = FerryMutex<[Value]>([]) }
        let client: Client
        private let values = Values()
        init(_ dir: TemporaryDirectory, port: Int) async throws {
            client = try await Client(dir.sub("b"), port: port)
            let values = self.values
            _ = try client.db.reference("status/A").observe(.value) { s in values.list.withLock { $0.append(s.value) } }
            await client.sync.goOnline()
        }
        var shown: [Value] { values.list.withLock { $0 } }
        var last: Value? { shown.last }
    }

    @Test func aClientKilledWithKill9HasItsOnDisconnectWritesRun() async throws {
        let dir = try TemporaryDirectory("presence-kill")
        let server = try ServerProcess(data: dir.sub("server"))
        let a = try Self.presentClient(dir, port: server.port)
        let b = try await Watcher(dir, port: server.port)
        #expect(await eventually { b.last == "online" })
        a.kill9()
        #expect(await eventually { b.last == .null }, "B saw \(b.shown)")
        #expect(try serverValue(server.port, "/status/A") == .null)
        try await b.client.close()
        #expect(server.terminate() == 0)
    }

    /// The server restarts while A lives: A connects again (and, as a Firebase app does,
    /// registers again); killed afterwards, its removal runs.
    @Test func aClientKilledAfterTheServerRestartedHasItsOnDisconnectWritesRun() async throws {
        let dir = try TemporaryDirectory("presence-restart")
        var server = try ServerProcess(data: dir.sub("server"))
        let port = server.port
        let a = try Self.presentClient(dir, port: port)
        #expect(server.terminate() == 0)
        server = try ServerProcess(data: dir.sub("server"), port: port)
        #expect(a.waitForLine { $0 == "present 2" }, "A connected again: \(a.outputLines)")
        let b = try await Watcher(dir, port: port)
        #expect(await eventually { b.last == "online" })
        a.kill9()
        #expect(await eventually { b.last == .null }, "B saw \(b.shown)")
        try await b.client.close()
        #expect(server.terminate() == 0)
    }

    /// A is killed while the server is down: the registration, kept in the server's store,
    /// runs once A has not connected again within the presence timeout.
    @Test func registrationsOutliveARestartAndRunWhenTheirClientDoesNotComeBack() async throws {
        let dir = try TemporaryDirectory("presence-durable")
        var server = try ServerProcess(data: dir.sub("server"))
        let port = server.port
        let a = try Self.presentClient(dir, port: port)
        #expect(try serverValue(port, "/status/A") == "online")
        #expect(server.terminate() == 0)
        a.kill9()
        #expect(FileManager.default.fileExists(atPath: dir.sub("server") + "/ns/t.presence"), "the namespace is marked as keeping registrations")
        server = try ServerProcess(data: dir.sub("server"), port: port, ["--presence-timeout", "2"])
        // The server opens the namespace itself: the registration runs with no request to it.
        #expect(await eventually { !FileManager.default.fileExists(atPath: dir.sub("server") + "/ns/t.presence") })
        let b = try await Watcher(dir, port: port)
        #expect(await eventually { b.last == .null && (try? serverValue(port, "/status/A")) == .null }, "B saw \(b.shown)")
        #expect(try serverValue(server.port, "/status/A") == .null)
        // Run once: nothing is kept for A any more, after another restart too.
        func kept() throws -> Value? { try TestHTTP.request(port, "GET", "/.ferry/presence.json?ns=t", headers: ["Authorization": "Bearer owner"]).json }
        #expect(await eventually { (try? kept()) == [:] })
        #expect(server.terminate() == 0)
        server = try ServerProcess(data: dir.sub("server"), port: port, ["--presence-timeout", "1"])
        #expect(try kept() == [:])
        #expect(!FileManager.default.fileExists(atPath: dir.sub("server") + "/ns/t.presence"), "no namespace is marked as keeping registrations")
        try await b.client.close()
        #expect(server.terminate() == 0)
    }

    /// Registrations take every write form, run in order as one write, and can be cancelled;
    /// a registration the rules refuse is refused at once.
    @Test func registrationsRunInOrderAsOneWriteAndCanBeCancelled() async throws {
        let dir = try TemporaryDirectory("presence-forms")
        let server = try ServerProcess(data: dir.sub("server"))
        #expect(try setRules(server.port, #"{"rules": {".read": true, "users": {".write": true}, "rooms": {".write": true}}}"#))
        let a = try await Client(dir.sub("a"), port: server.port)
        await a.sync.goOnline()
        let me = try a.db.reference("users/a")
        _ = try await me.setValue(["state": "online", "seen": 0, "typing": true]).serverAcknowledgement()
        try await a.sync.onDisconnect(me.child("state")).setValue("offline")
        try await a.sync.onDisconnect(me).updateChildValues(["seen": ServerValue.timestamp, "devices/phone": .null])
        try await a.sync.onDisconnect(me.child("typing")).removeValue()
        try await a.sync.onDisconnect(try a.db.reference("rooms/r/a")).setValue(true)
        try await a.sync.onDisconnect(try a.db.reference("rooms")).cancel()
        await #expect(throws: SyncError.self) { try await a.sync.onDisconnect(try a.db.reference("locked/x")).setValue(1) }
        guard case .object(let kept)? = try TestHTTP.request(server.port, "GET", "/.ferry/presence.json?ns=t", headers: ["Authorization": "Bearer owner"]).json,
              case .array(let mine)? = kept[a.db.storeIdentifier] else { Issue.record("no registrations kept"); return }
        #expect(mine.count == 3, "the cancelled one is gone: \(mine)")
        await a.sync.goOffline()  // (the connection ends)
        #expect(await eventually { (try? serverValue(server.port, "/users/a/state")) == "offline" })
        guard case .object(let user)? = try serverValue(server.port, "/users/a") else { Issue.record("no user"); return }
        #expect(user["typing"] == nil)
        if case .int(let seen)? = user["seen"] { #expect(seen > 0) } else { Issue.record("seen is \(String(describing: user["seen"]))") }
        #expect(try serverValue(server.port, "/rooms") == .null, "the cancelled registration did not run")
        try await a.close()
        #expect(server.terminate() == 0)
    }
}
