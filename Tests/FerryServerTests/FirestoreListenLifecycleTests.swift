import FerryFirestoreWire
import FerryTestSupport
import Foundation
import GRPCCore
import GRPCNIOTransportHTTP2
import Testing

@testable import FerryServer

/// A Listen stream's place in its database is freed however the stream ends: the client
/// cancels the call, its connection goes, or it removes the target. The server runs in this
/// process so that the test can look at the database's registry.
@Suite struct FirestoreListenLifecycleTests {
    @Test func aListenThatEndsInAnyWayIsFreedWithItsTargets() async throws {
        let dir = try TemporaryDirectory("firestore-listen-freed")
        var config = ServerConfiguration(dataDirectory: dir.path)
        config.emulatorMode = true
        let server = FerryServer(configuration: config)
        _ = try server.start()
        let port = try await server.startFirestore()
        let store = try await server.firestore.store(DatabaseName(project: "raw", database: "(default)"))
        let registered = { store.state.withLock { s in (s.listens.streams.count, s.listens.streams.values.reduce(0) { $0 + $1.targets.count }) } }

        let add = RawFirestore.listenRequest(RawFirestore.target(RawFirestore.query("things").structuredQuery, id: 2))

        // Listens that stay open until their tasks are cancelled, on one connection.
        let synced = AsyncStream<Void>.makeStream()
        let open = Task {
            try await RawFirestore.with(port) { fs, _ in
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for _ in 0..<20 {
                        group.addTask {
                            try await fs.listen(requestProducer: { [add] writer in
                                try await writer.write(add)
                                try await Task.sleep(for: .seconds(3600))
                            }, onResponse: { response in
                                for try await m in response.messages {
                                    if case .targetChange(let c)? = m.responseType, c.targetChangeType == .noChange { synced.continuation.yield() }
                                }
                            })
                        }
                    }
                    try await group.waitForAll()
                }
            }
        }
        var heard = 0
        for await _ in synced.stream {
            heard += 1
            if heard == 20 { break }
        }
        #expect(registered() == (20, 20))
        // Cancelled: the calls end, the connection closes.
        open.cancel()
        _ = await open.result
        #expect(await eventually { registered() == (0, 0) }, "cancelled listens are still registered: \(registered())")

        // A target removed by its client is freed while the stream stays.
        let removed = AsyncStream<Void>.makeStream()
        let kept = Task {
            try await RawFirestore.with(port) { fs, _ in
                try await fs.listen(requestProducer: { [add] writer in
                    try await writer.write(add)
                    for await _ in removed.stream { break }
                    var remove = Google_Firestore_V1_ListenRequest()
                    remove.database = RawFirestore.database
                    remove.removeTarget = 2
                    try await writer.write(remove)
                    try await Task.sleep(for: .seconds(3600))
                }, onResponse: { response in
                    for try await m in response.messages {
                        if case .targetChange(let c)? = m.responseType, c.targetChangeType == .noChange { synced.continuation.yield() }
                    }
                })
            }
        }
        for await _ in synced.stream { break }
        #expect(registered() == (1, 1))
        removed.continuation.yield()
        #expect(await eventually { registered() == (1, 0) })
        kept.cancel()
        _ = await kept.result
        #expect(await eventually { registered() == (0, 0) })
        await server.shutdown()
    }
}
