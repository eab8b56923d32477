@_spi(Server) import Ferry
import FerryLog
import FerrySync
import FerryTestSupport
import FerryWire
import Foundation
import Testing

/// A listen whose stream is lost resumes from the last commit it applied (`Last-Event-ID`)
/// and gets only what changed since, not the whole location again.
@Suite struct ResumeTests {
    /// The stream is cut (the client lives on) in the middle of a burst of another client's
    /// writes: it resumes from its last id, and ends with exactly the server's data.
    @Test func aStreamCutMidBurstResumesFromItsLastCommitAndEndsWithTheServersData() async throws {
        let dir = try TemporaryDirectory("resume-burst")
        let server = try ServerProcess(data: dir.sub("server"))
        let proxy = try CuttingProxy(to: server.port)
        let a = try await Client(dir.sub("a"), port: proxy.port)
        let shown = FerryMutex<Value>(.null)
        let handle = try a.db.reference("feed").observe(.value) { s in shown.withLock { $0 = s.value } }
        await a.sync.goOnline()
        func count() -> Int { if case .object(let o) = shown.withLock({ $0 }) { o.count } else { 0 } }

        // Four bursts of another client's writes; after each of the first three, once the
        // listener has shown some of it, its stream is cut while the rest is on its way.
        var cuts = 0
        for burst in 0..<4 {
            for i in (burst * 100)..<(burst * 100 + 100) {
                _ = try TestHTTP.request(server.port, "PUT", "/feed/k\(i).json?ns=t", json: #"{"n": \#(i)}"#)
                if i % 7 == 0 { _ = try TestHTTP.request(server.port, "DELETE", "/feed/k\(i / 2).json?ns=t") }
            }
            guard burst < 3 else { break }
            #expect(await eventually { count() >= burst * 80 + 10 })
            #expect(await eventually {
                // A stream whose answer has begun (one cut before its first byte would resume
                // from the same commit again, and say nothing of resuming).
                let n = proxy.cut(answered: true) { $0.contains("accept: text/event-stream") }
                cuts += n
                return n > 0
            }, "a stream to cut")
        }
        let truth = try #require(try serverValue(server.port, "/feed"))
        #expect(await eventually { shown.withLock { $0 } == truth }, "the listener ends with the server's data")
        #expect(cuts == 3)
        // The streams after the first asked to resume, and the server resumed them.
        let streams = { proxy.streams }
        let resumed = { streams().filter { $0.request.contains("last-event-id:") && $0.answer.contains(WireHeader.resumedThrough) } }
        #expect(await eventually { streams().count == 4 && resumed().count == 3 }, "\(streams().map(\.request))")
        try a.db.reference("feed").removeObserver(withHandle: handle)
        try await a.close()
        proxy.stop()
        #expect(server.terminate() == 0)
    }

    /// Offline and online again, a listener of a big location gets only what changed while it
    /// was away; its snapshots say `fromCache` until the stream has caught up, and it shows the
    /// changes all at once, live — never a state part way through them.
    @Test func aListenerBackOnlineGetsOnlyWhatChangedAndIsCurrentOnceCaughtUp() async throws {
        let dir = try TemporaryDirectory("resume-offline")
        let server = try ServerProcess(data: dir.sub("server"))
        let proxy = try CuttingProxy(to: server.port)
        var all: [String: Value] = [:]
        for i in 0..<2_000 { all["c\(i)"] = .string(String(repeating: "x", count: 100)) }
        #expect(try TestHTTP.request(server.port, "PUT", "/big.json?ns=t", json: Value.object(all).json).status == 200)
        let a = try await Client(dir.sub("a"), port: proxy.port)
        let last = FerryMutex<DataSnapshot?>(nil)
        let shown = FerryMutex<[DataSnapshot]>([])
        let handle = try a.db.reference("big").observe(.value, includeMetadataChanges: true) { s in
            last.withLock { $0 = s }
            shown.withLock { $0.append(s) }
        }
        await a.sync.goOnline()
        #expect(await eventually { last.withLock { $0?.metadata.fromCache == false && $0?.childrenCount == 2_000 } })
        await a.sync.goOffline()
        #expect(await eventually { last.withLock { $0?.metadata.fromCache == true } })
        for i in 0..<10 { _ = try TestHTTP.request(server.port, "PUT", "/big/c\(i).json?ns=t", json: #""changed""#) }
        _ = try TestHTTP.request(server.port, "DELETE", "/big/c1999.json?ns=t")
        shown.withLock { $0 = [] }
        await a.sync.goOnline()
        #expect(await eventually { last.withLock { $0?.metadata.fromCache == false } })
        let truth = try #require(try serverValue(server.port, "/big"))
        #expect(last.withLock { $0?.value } == truth, "current once caught up")
        let states = shown.withLock { $0 }.map { ($0.value == truth ? "caught up" : $0.value == .object(all) ? "as left" : "part way", $0.metadata.fromCache) }
        #expect(states.allSatisfy { $0 == ("as left", true) || $0 == ("caught up", false) }, "\(states)")
        // The second stream resumed: its answer was a few events, not the location again.
        let streams = proxy.streams
        let resumed = streams.filter { $0.request.contains("last-event-id: 1\r\n") && $0.answer.contains("\(WireHeader.resumedThrough): 12") }
        #expect(streams.count == 2 && resumed.count == 1, "\(streams)")
        try a.db.reference("big").removeObserver(withHandle: handle)
        try await a.close()
        proxy.stop()
        #expect(server.terminate() == 0)
    }

    /// The positions outlive the app: reopened after a restart, with some of a big location
    /// changed meanwhile, a listener's stream resumes from where the stream before the restart stopped.
    @Test func aListenerResumesWhereItStoppedAfterTheAppRestarts() async throws {
        let dir = try TemporaryDirectory("resume-restart")
        let server = try ServerProcess(data: dir.sub("server"))
        let proxy = try CuttingProxy(to: server.port)
        var all: [String: Value] = [:]
        for i in 0..<2_000 { all["c\(i)"] = ["n": .int(Int64(i))] }
        #expect(try TestHTTP.request(server.port, "PUT", "/items.json?ns=t", json: Value.object(all).json).status == 200)
        do {
            let a = try await Client(dir.sub("a"), port: proxy.port)
            let live = FerryMutex(false)
            let handle = try a.db.reference("items").observe(.value, includeMetadataChanges: true) { s in
                live.withLock { $0 = !s.metadata.fromCache && s.childrenCount == 2_000 }
            }
            await a.sync.goOnline()
            #expect(await eventually { live.withLock { $0 } })
            try a.db.reference("items").removeObserver(withHandle: handle)
            try await a.close()
        }
        for i in 0..<10 { _ = try TestHTTP.request(server.port, "PUT", "/items/c\(i)/n.json?ns=t", json: "-1") }
        _ = try TestHTTP.request(server.port, "DELETE", "/items/c1999.json?ns=t")
        // The app starts again.
        let a = try await Client(dir.sub("a"), port: proxy.port)
        let last = FerryMutex<DataSnapshot?>(nil)
        let handle = try a.db.reference("items").observe(.value, includeMetadataChanges: true) { s in last.withLock { $0 = s } }
        await a.sync.goOnline()
        #expect(await eventually { last.withLock { $0?.metadata.fromCache == false } })
        #expect(last.withLock { $0?.value } == (try serverValue(server.port, "/items")))
        let streams = proxy.streams
        #expect(streams.count == 2 && streams.filter { $0.request.contains("last-event-id: 1\r\n") && $0.answer.contains("\(WireHeader.resumedThrough): 12") }.count == 1,
                "\(streams)")
        try a.db.reference("items").removeObserver(withHandle: handle)
        try await a.close()
        proxy.stop()
        #expect(server.terminate() == 0)
    }

    /// The history comes from the server's own log: a server killed with kill -9 and started
    /// again still resumes a stream from a commit before the restart, with what changed while
    /// the client was away (before the kill and after the start), not the whole location.
    @Test func aStreamResumesAcrossAServerKilledAndStartedAgain() async throws {
        let dir = try TemporaryDirectory("resume-server-restart")
        var server = try ServerProcess(data: dir.sub("server"))
        let port = server.port
        let proxy = try CuttingProxy(to: port)
        let (a, last, handle) = try await Self.itemsListenedThenOffline(dir, port: port, proxy: proxy)
        // Away: changes, a kill -9 of the server, a start, more changes.
        for i in 0..<5 { _ = try TestHTTP.request(port, "PUT", "/items/c\(i)/n.json?ns=t", json: "-1") }
        _ = try TestHTTP.request(port, "PATCH", "/items.json?ns=t", json: #"{"c10/n": -2, "c11": null, "new": {"n": 1000}}"#)
        server.kill9()
        server = try ServerProcess(data: dir.sub("server"), port: port)
        _ = try TestHTTP.request(port, "DELETE", "/items/c199.json?ns=t")
        let truth = try #require(try serverValue(port, "/items"))
        await a.sync.goOnline()
        #expect(await eventually { last.value?.metadata.fromCache == false })
        #expect(last.value?.value == truth, "current once caught up")
        // The stream after the restart resumed (a few events), it did not get the location again.
        let streams = proxy.streams
        #expect(streams.count == 2 && proxy.resumedStream(after: 200, through: 207), "\(streams.map { ($0.request, $0.answer) })")
        try a.db.reference("items").removeObserver(withHandle: handle)
        try await a.close()
        proxy.stop()
        #expect(server.terminate() == 0)
    }

    /// A location replaced whole while the client was away comes back as a put of it when its
    /// listen resumes: the listener shows it once, live, not first from the cache.
    @Test func aLocationReplacedWholeWhileAwayShowsOnceAndLiveWhenTheListenResumes() async throws {
        let dir = try TemporaryDirectory("resume-replaced")
        let server = try ServerProcess(data: dir.sub("server"))
        let proxy = try CuttingProxy(to: server.port)
        _ = try TestHTTP.request(server.port, "PUT", "/room.json?ns=t", json: #"{"a": 1, "b": 2}"#)
        let a = try await Client(dir.sub("a"), port: proxy.port)
        let shown = FerryMutex<[DataSnapshot]>([])
        let handle = try a.db.reference("room").observe(.value, includeMetadataChanges: true) { s in shown.withLock { $0.append(s) } }
        await a.sync.goOnline()
        #expect(await eventually { shown.withLock { $0.last?.metadata.fromCache == false } })
        await a.sync.goOffline()
        #expect(await eventually { shown.withLock { $0.last?.metadata.fromCache == true } })
        _ = try TestHTTP.request(server.port, "PUT", "/room.json?ns=t", json: #"{"z": 26}"#)
        shown.withLock { $0 = [] }
        await a.sync.goOnline()
        #expect(await eventually { shown.withLock { $0.last?.metadata.fromCache == false } })
        let states = shown.withLock { $0 }.map { ($0.value.json, $0.metadata.fromCache) }
        #expect(states.allSatisfy { $0 == (#"{"a":1,"b":2}"#, true) || $0 == (#"{"z":26}"#, false) } && states.last?.0 == #"{"z":26}"#, "\(states)")
        let streams = proxy.streams
        #expect(streams.count == 2 && proxy.resumedStream(after: 1, through: 2), "\(streams.map { ($0.request, $0.answer) })")
        try a.db.reference("room").removeObserver(withHandle: handle)
        try await a.close()
        proxy.stop()
        #expect(server.terminate() == 0)
    }
}

extension ResumeTests {
    /// The latest snapshot a listener was given.
    final class LatestSnapshot: Sendable {
        private let snapshot = FerryMutex<DataSnapshot?>(nil)
        var value: DataSnapshot? { snapshot.withLock { $0 } }
        func note(_ s: DataSnapshot) { snapshot.withLock { $0 = s } }
    }

    /// A client (through `proxy`) whose listener of `/items` (200 children written through
    /// `port` first) was live, and which then went offline: its listener shows the cache.
    static func itemsListenedThenOffline(_ dir: TemporaryDirectory, port: Int, proxy: CuttingProxy) async throws
        -> (Client, LatestSnapshot, ObserverHandle) {
        for i in 0..<200 { _ = try TestHTTP.request(port, "PUT", "/items/c\(i).json?ns=t", json: #"{"n": \#(i)}"#) }
        let a = try await Client(dir.sub("a"), port: proxy.port)
        let last = LatestSnapshot()
        let handle = try a.db.reference("items").observe(.value, includeMetadataChanges: true) { s in last.note(s) }
        await a.sync.goOnline()
        #expect(await eventually { last.value?.metadata.fromCache == false && last.value?.childrenCount == 200 })
        await a.sync.goOffline()
        #expect(await eventually { last.value?.metadata.fromCache == true })
        return (a, last, handle)
    }
}
