import ArgumentParser
@_spi(Server) import Ferry
import FerrySync
import Foundation
import Logging
import Synchronization

/// `ferry-bench sync`: FerrySync against a real `ferry-server` child process on loopback —
/// draining pending writes, fanning one writer's writes out to many streaming listeners, and a
/// cached client's resync on reconnect.
struct SyncBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "sync",
        abstract: "Sync against ferry-server on loopback: drain pending writes, fan-out to streaming listeners, resync of a cached client.",
        discussion: """
            Starts ferry-server (from the same build products directory) on a free port with a temporary data directory, \
            and stops it at the end. Build both with -c release.
            drain: --writes writes (at posts/pN) made offline (setValueNow, default .fsync durability, then db.sync()), then goOnline(), \
            timed until the server has acknowledged the last one (its receipt's serverAcknowledgement()); with batches, \
            and with one request per write (--single-writes writes, rate extrapolated).
            fan-out: --listeners raw streaming GETs (plain sockets in this process, one thread each) on one location; one \
            writer (a SyncClient on an in-memory database, batches on) writes --fanout-writes values as fast as it can, \
            each carrying its monotonic write time; events/s = events received by all listeners / (last arrival − first \
            write). Latency (write → arrival on a listener) is reported under that load and unloaded (--pings writes, \
            each waiting until every listener has it).
            resync: the server holds --children children; a client on a stored database caches them through a listen \
            and closes; --changed of them change on the server; the client reopens its database (listeners see the \
            cache, fromCache == true) and goes online: seconds until the value listener reports fromCache == false, \
            and the bytes the server sent, counted by a TCP proxy in this process between client and server (HTTP \
            heads, chunk framing and event data). Resumed: the stream resumes after the last commit the client \
            applied; whole: the same with the client's positions removed (sync-state.json), so the server sends the \
            whole location. Goals: resumed ≤ 2% of the whole's bytes and ≤ 0.1× its time.
            """
    )

    @Option(help: "Runs per measurement; the median is reported.") var runs = 3
    /// 20,000 by default, so that the whole bench stays short; 100,000 is a bigger drain.
    @Option(help: "Pending writes drained with batches.") var writes = 20_000
    @Option(help: "Parent locations the drained writes are spread over (posts/gK/pN); 1: all under posts.") var parents = 1
    @Option(help: "Pending writes drained with one request per write.") var singleWrites = 5_000
    @Option(help: "Streaming listeners in the fan-out.") var listeners = 100
    @Option(help: "Writes in the fan-out's loaded phase.") var fanoutWrites = 2_000
    @Option(help: "Writes in the fan-out's unloaded latency phase.") var pings = 200
    @Option(help: "Children of the location a client resyncs.") var children = 100_000
    @Option(help: "Children changed on the server while the resyncing client is away.") var changed = 100
    @Option(help: "Only these workloads (drain, single, fanout, resync), comma-separated.") var only: String?
    @Option(help: "ferry: the workloads against one server on Ferry stores. postgres: drain and fan-out against one, two and three servers over one PostgreSQL database (--servers), beside one server on Ferry stores, in the same run.")
    var backend = "ferry"
    @Option(help: "With --backend postgres: the database's cluster (postgres://USER@HOST:PORT/DATABASE?sslmode=disable; each setup gets a new database in it). Default: a throw-away cluster made with scripts/postgres.sh (run from the package root).")
    var postgres: String?
    @Option(help: "With --backend postgres: the numbers of server processes, comma-separated.") var servers = "1,2,3"
    @Option(help: "Where stores are written (a fresh directory inside it, removed afterwards).")
    var directory = ProcessInfo.processInfo.environment["TMPDIR"] ?? "/tmp"

    static let firebaseWritesPerSecond = 1_000.0
    static let drainGoal = 50_000.0
    static let fanoutGoal = 100_000.0

    var quiet: Logger { Logger(label: "bench", factory: { _ in SwiftLogNoOpLogHandler() }) }

    func options(batches: Bool) -> SyncOptions {
        var o = SyncOptions()
        o.usesBatches = batches
        o.retryDelay = .milliseconds(20)
        o.maxRetryDelay = .milliseconds(500)
        o.logger = quiet
        return o
    }

    func wants(_ w: String) -> Bool { only.map { $0.split(separator: ",").contains(Substring(w)) } ?? true }

    func run() async throws {
        let root = directory + "/ferry-bench-sync-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: root, withIntermediateDirectories: true)
        defer { remove(root) }
        if backend == "postgres" { return try await postgresComparison(root) }
        guard backend == "ferry" else { throw ValidationError("--backend is ferry or postgres") }
        let server = try ServerChild(data: root + "/server")
        defer { server.stop() }
        print("ferry-bench sync: ferry-server pid \(server.process.processIdentifier) on 127.0.0.1:\(server.port), \(ProcessInfo.processInfo.activeProcessorCount) cores, runs \(runs) (medians, [min–max])")

        if wants("drain") {
            var secs: [Double] = []
            for r in 0..<runs { secs.append(try await drain([server.port], root, run: r, count: writes, batches: true)) }
            let rate = Double(writes) / median(secs)
            print(String(format: "drain, batches:            %@ writes/s  [%@–%@]  (%d writes under %d parent(s), %.2f s)  goal ≥ 50k: %.2f×, Firebase's 1,000/s: %.0f×",
                         human(rate) as NSString, human(Double(writes) / secs.max()!) as NSString, human(Double(writes) / secs.min()!) as NSString,
                         writes, parents, median(secs), rate / Self.drainGoal, rate / Self.firebaseWritesPerSecond))
        }
        if wants("single") {
            var secs: [Double] = []
            for r in 0..<runs { secs.append(try await drain([server.port], root, run: r, count: singleWrites, batches: false)) }
            let rate = Double(singleWrites) / median(secs)
            print(String(format: "drain, one request/write:  %@ writes/s  [%@–%@]  (%d writes, %.2f s; 100k would take %.1f s)  Firebase's 1,000/s: %.1f×",
                         human(rate) as NSString, human(Double(singleWrites) / secs.max()!) as NSString, human(Double(singleWrites) / secs.min()!) as NSString,
                         singleWrites, median(secs), 100_000 / rate, rate / Self.firebaseWritesPerSecond))
        }
        if wants("fanout") {
            var results: [FanOut] = []
            for r in 0..<runs { results.append(try await fanOut([server.port], run: r)) }
            let rates = results.map(\.eventsPerSecond).sorted()
            let m = results.sorted { $0.eventsPerSecond < $1.eventsPerSecond }[results.count / 2]
            print(String(format: "fan-out, %d raw SSE listeners, 1 SyncClient writer: %@ events/s  [%@–%@]  (%d writes → %d events, %.2f s)  goal ≥ 100k: %.2f×",
                         listeners, human(m.eventsPerSecond) as NSString, human(rates.first!) as NSString, human(rates.last!) as NSString,
                         fanoutWrites, m.events, m.seconds, m.eventsPerSecond / Self.fanoutGoal))
            print(String(format: "  latency write → listener, under that load: p50 %.1f ms, p99 %.1f ms; unloaded (%d writes one at a time): p50 %.2f ms, p99 %.2f ms",
                         median(results.map(\.loadedP50)), median(results.map(\.loadedP99)), pings,
                         median(results.map(\.unloadedP50)), median(results.map(\.unloadedP99))))
        }
        if wants("resync") {
            var results: [Resync] = []
            for r in 0..<runs { results.append(try await resync(server, root, run: r)) }
            let m = results.sorted { $0.seconds < $1.seconds }[results.count / 2]
            let secs = results.map(\.seconds).sorted()
            let timeRatio = median(results.map { $0.seconds / $0.wholeSeconds })
            let byteRatio = median(results.map { Double($0.bytes) / Double($0.wholeBytes) })
            print(String(format: "resync of %d cached children, %d changed meanwhile, resumed: %.3f s until fromCache == false  [%.3f–%.3f]; server sent %@ (counting proxy)",
                         children, changed, m.seconds, secs.first!, secs.last!, humanBytes(m.bytes) as NSString))
            print(String(format: "  whole (positions removed): %.2f s, %@ sent (the data is %@ of JSON); resumed / whole: time %.3f× (goal ≤ 0.1×: %@), bytes %.4f× (goal ≤ 0.02×: %@)",
                         median(results.map(\.wholeSeconds)), humanBytes(m.wholeBytes) as NSString, humanBytes(m.dataBytes) as NSString,
                         timeRatio, (timeRatio <= 0.1 ? "met" : "not met") as NSString, byteRatio, (byteRatio <= 0.02 ? "met" : "not met") as NSString))
            print(String(format: "  first load of the same (empty cache): %.2f s, %@ sent",
                         median(results.map(\.firstLoadSeconds)), humanBytes(m.firstLoadBytes) as NSString))
        }
    }

    func median(_ xs: [Double]) -> Double { xs.sorted()[xs.count / 2] }

    // MARK: PostgreSQL

    /// Drain and fan-out with one server on Ferry stores, then with each number of servers over
    /// one PostgreSQL database (a new database per setup).
    func postgresComparison(_ root: String) async throws {
        let counts = servers.split(separator: ",").compactMap { Int($0) }.filter { $0 > 0 }
        guard !counts.isEmpty else { throw ValidationError("--servers names no number of servers") }
        var cluster: String?
        let url: String
        if let postgres { url = postgres } else {
            cluster = root + "/postgres"
            url = try shell(["scripts/postgres.sh", "start", cluster!])
        }
        defer { if let cluster { _ = try? shell(["scripts/postgres.sh", "stop", cluster]) } }
        print("ferry-bench sync --backend postgres: \(ProcessInfo.processInfo.activeProcessorCount) cores, runs \(runs) (medians, [min–max]); " +
              "drain: \(writes) pending writes, one client per server, batches; fan-out: \(listeners) raw SSE listeners spread over the servers, " +
              "1 writer (\(fanoutWrites) writes) on the first")
        var setups: [(name: String, count: Int, database: String?)] = [("Ferry store", 1, nil)]
        for n in counts { setups.append(("PostgreSQL", n, try newDatabase(url))) }
        var ferryDrain = 0.0, ferryEvents = 0.0
        for setup in setups {
            var children: [ServerChild] = []
            for k in 0..<setup.count {
                children.append(try ServerChild(data: root + "/\(setup.name.prefix(4))-\(setup.count)-\(k)", setup.database.map { ["--postgres", $0] } ?? []))
            }
            defer { for c in children { c.stop() } }
            let ports = children.map(\.port)
            var secs: [Double] = []
            for r in 0..<runs { secs.append(try await drain(ports, root, run: r, count: writes, batches: true)) }
            var fans: [FanOut] = []
            for r in 0..<runs { fans.append(try await fanOut(ports, run: r)) }
            let rate = Double(writes) / median(secs)
            let events = median(fans.map(\.eventsPerSecond))
            if setup.database == nil { (ferryDrain, ferryEvents) = (rate, events) }
            let label = "\(setup.name), \(setup.count) server\(setup.count == 1 ? "" : "s"):"
            print(String(format: "%@ drain %@ writes/s [%@–%@] (%.2f× the Ferry store's); fan-out %@ events/s (%.2f×), latency loaded p50 %.1f ms p99 %.1f ms, unloaded p50 %.2f ms p99 %.2f ms",
                         label.padding(toLength: 26, withPad: " ", startingAt: 0) as NSString,
                         human(rate) as NSString, human(Double(writes) / secs.max()!) as NSString, human(Double(writes) / secs.min()!) as NSString,
                         rate / ferryDrain, human(events) as NSString, events / ferryEvents,
                         median(fans.map(\.loadedP50)), median(fans.map(\.loadedP99)), median(fans.map(\.unloadedP50)), median(fans.map(\.unloadedP99))))
        }
    }

    /// A new database in the cluster at `url`: its address.
    func newDatabase(_ url: String) throws -> String {
        let name = "bench_" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
        _ = try shell(["psql", url, "-v", "ON_ERROR_STOP=1", "-qc", "CREATE DATABASE \(name)"])
        guard var address = URLComponents(string: url) else { throw BenchNetError("\(url) is not a postgres:// address") }
        address.path = "/" + name
        return address.string ?? url
    }

    /// Runs a command (found on PATH); its standard output, trimmed. (Spawned and reaped
    /// directly, its output in a file: a server the command starts keeps whatever it inherits.)
    func shell(_ arguments: [String]) throws -> String {
        let file = NSTemporaryDirectory() + "/ferry-bench-shell-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        defer { try? FileManager.default.removeItem(atPath: file) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 1, file, O_WRONLY | O_CREAT | O_TRUNC, 0o600)
        let argv: [UnsafeMutablePointer<CChar>?] = arguments.map { strdup($0) } + [nil]
        defer { for a in argv { free(a) } }
        var pid: pid_t = 0
        let spawned = posix_spawnp(&pid, arguments[0], &actions, nil, argv, environ)
        guard spawned == 0 else { throw BenchNetError("\(arguments[0]) could not start (\(spawned))") }
        var status: Int32 = 0
        while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
        let output = String(decoding: FileManager.default.contents(atPath: file) ?? Data(), as: UTF8.self)
        guard status == 0 else { throw BenchNetError("\(arguments.joined(separator: " ")) failed (wait status \(status))") }
        return output.trimmingCharacters(in: .whitespacesAndNewlines)
    }


    // MARK: Drain

    /// Seconds from goOnline() until the servers acknowledged the last of `count` pending
    /// writes: made by one client per port (`count / ports.count` each, under posts/cK), sent
    /// at once.
    func drain(_ ports: [Int], _ root: String, run: Int, count: Int, batches: Bool) async throws -> Double {
        var clients: [(db: Database, last: WriteReceipt, path: String)] = []
        for (k, _) in ports.enumerated() {
            let path = root + "/drain-\(batches)-\(run)-\(k)"
            var o = DatabaseOptions()
            o.logger = quiet
            let db = try Database.open(at: path, options: o)
            let posts = ports.count > 1 ? try db.reference("posts/c\(k)") : try db.reference("posts")
            var last: WriteReceipt?
            for i in stride(from: k, to: count, by: ports.count) {
                let parent = parents > 1 ? try posts.child("g\(i % parents)") : posts
                last = try parent.child("p\(i)").setValueNow(["title": .string("post number \(i)"), "likes": .int(Int64(i % 100)), "n": .int(Int64(i))])
            }
            try await db.sync()
            clients.append((db, last!, path))
        }
        var syncs: [SyncClient] = []
        for (k, port) in ports.enumerated() {
            syncs.append(try SyncClient(database: clients[k].db, url: "http://127.0.0.1:\(port)?ns=drain\(batches ? "b" : "s")\(run)", options: options(batches: batches)))
        }
        let start = ContinuousClock.now
        for sync in syncs { await sync.goOnline() }
        for c in clients { try await c.last.serverAcknowledgement() }
        let d = ContinuousClock.now - start
        for (k, c) in clients.enumerated() {
            guard c.db.acknowledgedThrough >= c.last.writeID!, c.db.pendingWriteCount == 0 else {
                throw BenchNetError("drain: the cursor is at \(c.db.acknowledgedThrough), the last write is \(c.last.writeID!)")
            }
            await syncs[k].close()
            try await c.db.close()
            remove(c.path)
        }
        return seconds(d)
    }

    // MARK: Fan-out

    struct FanOut {
        var events: Int
        var seconds: Double
        var eventsPerSecond: Double
        var loadedP50, loadedP99, unloadedP50, unloadedP99: Double
    }

    /// The fan-out with the listeners spread over `ports` (the writer on the first).
    func fanOut(_ ports: [Int], run: Int) async throws -> FanOut {
        let ns = "fan\(run)"
        _ = try rawRequest(ports[0], "PUT", "/fan/v.json?ns=\(ns)", body: Array("{\"n\":-1}".utf8))
        let raw = try RawListenerGroup(ports.enumerated().map { k, port in
            try RawListeners(count: listeners / ports.count + (k < listeners % ports.count ? 1 : 0), port: port, target: "/fan/v.json?ns=\(ns)")
        })
        defer { raw.stop() }
        guard await waitFor(seconds: 30, { raw.ready >= listeners }) else {
            throw BenchNetError("fan-out: only \(raw.ready) of \(listeners) listeners got their first event")
        }
        var o = DatabaseOptions()
        o.logger = quiet
        let db = Database.inMemory(options: o)
        let sync = try SyncClient(database: db, url: "http://127.0.0.1:\(ports[0])?ns=\(ns)", options: options(batches: true))
        await sync.goOnline()
        let v = try db.reference("fan/v")
        // Loaded: every write at once.
        raw.record(true)
        let t0 = monotonicNanos()
        for i in 0..<fanoutWrites {
            try v.setValueNow(["n": .int(Int64(i)), "t": .int(monotonicNanos())])
        }
        let expected = fanoutWrites * listeners
        guard await waitFor(seconds: 300, { raw.received >= expected }) else {
            throw BenchNetError("fan-out: \(raw.received) of \(expected) events arrived")
        }
        let elapsed = Double(raw.lastArrivalNanos - t0) / 1e9
        var loaded = raw.takeLatencies().sorted()
        // Unloaded: one write at a time, each waiting until every listener has it.
        for i in 0..<pings {
            let base = raw.received
            try v.setValueNow(["n": .int(Int64(fanoutWrites + i)), "t": .int(monotonicNanos())])
            guard await waitFor(seconds: 30, { raw.received >= base + listeners }) else {
                throw BenchNetError("fan-out: ping \(i) did not reach every listener")
            }
        }
        raw.record(false)
        let unloaded = raw.takeLatencies().sorted()
        await sync.close()
        try await db.close()
        if loaded.isEmpty { loaded = [0] }
        func pct(_ xs: [Int64], _ q: Double) -> Double { xs.isEmpty ? 0 : Double(xs[min(xs.count - 1, Int(Double(xs.count) * q))]) / 1e6 }
        return FanOut(events: expected, seconds: elapsed, eventsPerSecond: Double(expected) / elapsed,
                      loadedP50: pct(loaded, 0.5), loadedP99: pct(loaded, 0.99), unloadedP50: pct(unloaded, 0.5), unloadedP99: pct(unloaded, 0.99))
    }

    // MARK: Resync

    struct Resync {
        var seconds: Double
        var bytes: Int
        var wholeSeconds: Double
        var wholeBytes: Int
        var dataBytes: Int
        var firstLoadSeconds: Double
        var firstLoadBytes: Int
    }

    /// The latest value event of a listener: (fromCache, children).
    final class Latest: Sendable {
        let state = Mutex<(fromCache: Bool, children: Int, events: Int)?>(nil)
        func note(_ s: DataSnapshot) { state.withLock { $0 = (s.metadata.fromCache, s.childrenCount, ($0?.events ?? 0) + 1) } }
        func isLive(_ children: Int) -> Bool { state.withLock { $0.map { !$0.fromCache && $0.children == children } ?? false } }
        func isCached(_ children: Int) -> Bool { state.withLock { $0.map { $0.fromCache && $0.children == children } ?? false } }
    }

    func resync(_ server: ServerChild, _ root: String, run: Int) async throws -> Resync {
        let ns = "resync\(run)"
        var json = "{"
        json.reserveCapacity(children * 48)
        for i in 0..<children {
            if i > 0 { json += "," }
            json += "\"c\(i)\":{\"n\":\(i),\"title\":\"child number \(i)\"}"
        }
        json += "}"
        let seeded = try rawRequest(server.port, "PUT", "/items.json?ns=\(ns)&print=silent", body: Array(json.utf8))
        guard (200..<300).contains(seeded.status) else { throw BenchNetError("resync: seeding answered \(seeded.status) \(seeded.body.prefix(200))") }
        let proxy = try CountingProxy(to: server.port)
        defer { proxy.stop() }
        let url = "http://127.0.0.1:\(proxy.port)?ns=\(ns)"
        let path = root + "/resync-\(run)"
        var o = DatabaseOptions()
        o.logger = quiet

        // First load: an empty cache.
        let db = try Database.open(at: path, options: o)
        let latest = Latest()
        let handle = try db.reference("items").observe(.value, includeMetadataChanges: true) { [latest] in latest.note($0) }
        let sync = try SyncClient(database: db, url: url, options: options(batches: true))
        let start = ContinuousClock.now
        await sync.goOnline()
        guard await waitFor(seconds: 300, { [latest] in latest.isLive(children) }) else { throw BenchNetError("resync: the first load never completed") }
        let firstLoad = seconds(ContinuousClock.now - start)
        let firstBytes = proxy.serverBytes
        try db.reference("items").removeObserver(withHandle: handle)
        await sync.close()
        try await db.close()

        // Away: some children change on the server.
        func change(_ round: Int) throws {
            for i in 0..<changed {
                let r = try rawRequest(server.port, "PUT", "/items/c\(i * (children / max(changed, 1))).json?ns=\(ns)&print=silent",
                                       body: Array(#"{"n":-\#(round),"title":"changed"}"#.utf8))
                guard (200..<300).contains(r.status) else { throw BenchNetError("resync: a change answered \(r.status)") }
            }
        }
        /// Reopens the database and goes online: the seconds until current, the bytes sent.
        func reconnect() async throws -> (Double, Int) {
            let db = try Database.open(at: path, options: o)
            let latest = Latest()
            let handle = try db.reference("items").observe(.value, includeMetadataChanges: true) { [latest] in latest.note($0) }
            guard await waitFor(seconds: 60, { [latest] in latest.isCached(children) }) else {
                throw BenchNetError("resync: the reopened cache does not show the \(children) children (\(String(describing: latest.state.withLock { $0 })))")
            }
            let sync = try SyncClient(database: db, url: url, options: options(batches: true))
            proxy.reset()
            let start = ContinuousClock.now
            await sync.goOnline()
            guard await waitFor(seconds: 300, { [latest] in latest.isLive(children) }) else { throw BenchNetError("resync: the listener never became current") }
            let secs = seconds(ContinuousClock.now - start)
            let bytes = proxy.serverBytes
            try db.reference("items").removeObserver(withHandle: handle)
            await sync.close()
            try await db.close()
            return (secs, bytes)
        }
        // Resumed, then whole (the positions removed).
        try change(1)
        let (resumed, resumedBytes) = try await reconnect()
        try change(2)
        try? FileManager.default.removeItem(atPath: path + "/sync-state.json")
        let (whole, wholeBytes) = try await reconnect()
        remove(path)
        return Resync(seconds: resumed, bytes: resumedBytes, wholeSeconds: whole, wholeBytes: wholeBytes, dataBytes: json.utf8.count,
                      firstLoadSeconds: firstLoad, firstLoadBytes: firstBytes)
    }

    // MARK: Helpers

    func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }

    /// Polls `condition` every 100 µs up to `seconds`; whether it held.
    func waitFor(seconds: Double, _ condition: () -> Bool) async -> Bool {
        let deadline = ContinuousClock.now + .milliseconds(Int(seconds * 1000))
        while ContinuousClock.now < deadline {
            if condition() { return true }
            try? await Task.sleep(for: .microseconds(100))
        }
        return condition()
    }
}
