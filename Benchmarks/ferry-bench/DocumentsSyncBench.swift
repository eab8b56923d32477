import FerryDocuments
import FerryDocumentsSync
import FerryFirestoreWire
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import Logging
import Synchronization

extension DocumentsBench {
    /// The sync rows: a drain of pending writes through FirestoreConnection, and a fan-out of
    /// one writer's commits to many Listen streams.
    func sync(_ report: inout Report, _ goals: inout [String]) async throws {
        var drains: [Double] = [], fanOuts: [Double] = [], latencies: [[Double]] = []
        for _ in 0..<common.runs {
            let dir = try common.scratch("docs-sync")
            defer { remove(dir) }
            let server = try ServerChild(data: dir + "/server", firestore: true)
            defer { server.stop() }
            guard let port = server.firestorePort else { throw BenchNetError("ferry-server did not print its Firestore port") }
            drains.append(try await drainRun(dir: dir, port: port))
            let (seconds, lat) = try await fanOutRun(port: port)
            fanOuts.append(seconds)
            latencies.append(lat)
        }
        report.add(Measurement(area: "documents", workload: "sync-drain", engine: "ferry-docs", operations: drain, bytes: 0, runs: drains,
                               note: "\(drain) pending setData committed through ferry-server"))
        let lat = latencies.max { $0.count < $1.count } ?? []
        func pct(_ p: Double) -> Double { lat.isEmpty ? 0 : lat[min(lat.count - 1, Int(Double(lat.count) * p))] * 1000 }
        let delivered = streams * fanOutDocuments
        report.add(Measurement(area: "documents", workload: "sync-fan-out", engine: "ferry-server", operations: delivered, bytes: 0, runs: fanOuts,
                               note: String(format: "%d streams × %d documents; latency p50 %.1f ms, p99 %.1f ms", streams, fanOutDocuments, pct(0.5), pct(0.99))))
        let drainRate = Double(drain) / drains.sorted()[drains.count / 2]
        let fanRate = Double(delivered) / fanOuts.sorted()[fanOuts.count / 2]
        goals.append(String(format: "sync drain: %.0f documents/s (goal ≥ 20,000): %@", drainRate, drainRate >= 20_000 ? "met" : "not met"))
        goals.append(String(format: "sync fan-out: %.0f changes/s to %d streams, p50 %.1f ms, p99 %.1f ms (goal ≥ 100,000/s): %@", fanRate, streams, pct(0.5), pct(0.99),
                            fanRate >= 100_000 ? "met" : "not met"))
    }

    /// Writes `drain` documents offline, then times their commit through a connection.
    private func drainRun(dir: String, port: Int) async throws -> Double {
        var settings = FirestoreSettings()
        settings.durability = .none
        let db = try Firestore.open(at: dir + "/client", settings: settings)
        let posts = db.collection("drain")
        for i in 0..<drain { try posts.document("p\(i)").setDataNow(Self.document(i, of: max(drain, 50))) }
        try await db.sync()
        let start = ContinuousClock.now
        let connection = try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: port, project: "bench"),
                                                          logger: Logger(label: "bench", factory: { _ in SwiftLogNoOpLogHandler() }))
        try await db.waitForPendingWrites()
        let seconds = (ContinuousClock.now - start).seconds
        await connection.close()
        try await db.terminate()
        return seconds
    }

    /// `streams` Listen streams on one query; one writer commits the documents in commits of
    /// 100, each stamped with its send time; returns the time until every stream had every
    /// document, and the latencies (s, sorted).
    private func fanOutRun(port: Int) async throws -> (Double, [Double]) {
        let database = "projects/bench/databases/(default)"
        let transport = try HTTP2ClientTransport.Posix(target: .ipv4(address: "127.0.0.1", port: port), transportSecurity: .plaintext)
        let (streams, total) = (self.streams, self.fanOutDocuments)
        return try await withGRPCClient(transport: transport) { client in
            let fs = Google_Firestore_V1_Firestore.Client(wrapping: client)
            let state = FanOutState()
            let origin = ContinuousClock.now
            @Sendable func now() -> Double { (ContinuousClock.now - origin).seconds }
            var listen = Google_Firestore_V1_ListenRequest()
            listen.database = database
            var target = Google_Firestore_V1_Target()
            target.targetID = 1
            target.query.parent = database + "/documents"
            var from = Google_Firestore_V1_StructuredQuery.CollectionSelector()
            from.collectionID = "fan"
            target.query.structuredQuery.from = [from]
            listen.addTarget = target
            let request = listen
            return try await withThrowingTaskGroup(of: Void.self) { group in
                for s in 0..<streams {
                    group.addTask {
                        try await fs.listen(requestProducer: { writer in
                            try await writer.write(request)
                            try await Task.sleep(for: .seconds(3600))
                        }, onResponse: { response in
                            var mine = 0
                            var lat: [Double] = []
                            for try await m in response.messages {
                                switch m.responseType {
                                case .targetChange(let c)? where c.targetChangeType == .current:
                                    state.ready.add(1, ordering: .relaxed)
                                case .documentChange(let c)?:
                                    mine += 1
                                    if s % 10 == 0, case .doubleValue(let t)? = c.document.fields["t"]?.valueType { lat.append(now() - t) }
                                    if mine == total {
                                        state.samples.withLock { $0 += lat }
                                        state.received.add(1, ordering: .relaxed)
                                        return
                                    }
                                default: break
                                }
                            }
                        })
                    }
                }
                while state.ready.load(ordering: .relaxed) < streams { try await Task.sleep(for: .milliseconds(5)) }
                let start = now()
                var i = 0
                while i < total {
                    var commit = Google_Firestore_V1_CommitRequest()
                    commit.database = database
                    let t = now()
                    for j in i..<min(total, i + 100) {
                        var w = Google_Firestore_V1_Write()
                        w.update.name = database + "/documents/fan/d\(j)"
                        var tv = Google_Firestore_V1_Value()
                        tv.doubleValue = t
                        var nv = Google_Firestore_V1_Value()
                        nv.integerValue = Int64(j)
                        w.update.fields = ["t": tv, "n": nv]
                        commit.writes.append(w)
                    }
                    _ = try await fs.commit(commit)
                    i += 100
                }
                while state.received.load(ordering: .relaxed) < streams { try await Task.sleep(for: .milliseconds(2)) }
                let seconds = now() - start
                group.cancelAll()
                return (seconds, state.samples.withLock { $0 }.sorted())
            }
        }
    }
}

/// What the fan-out's streams report.
final class FanOutState: Sendable {
    let ready = Atomic<Int>(0)
    let received = Atomic<Int>(0)
    let samples = Mutex<[Double]>([])
}

extension Duration {
    var seconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
