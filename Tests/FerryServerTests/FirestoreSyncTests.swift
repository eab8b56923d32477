import FerryDocuments
import FerryDocumentsSync
import FerryTestSupport
import Foundation
import Synchronization
import Testing

/// Ferry's document store connected to `ferry-server`'s Firestore API.
@Suite struct FirestoreSyncTests {
    /// A store in `dir`, connected to the server.
    static func connected(_ dir: TemporaryDirectory, _ name: String, _ server: ServerProcess, project: String = "sync-test") throws -> (Firestore, FirestoreConnection) {
        let db = try Firestore.open(at: dir.sub(name))
        let c = try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: server.firestorePort!, project: project))
        return (db, c)
    }

    @Test func oneStoresWritesReachAnotherStoresListenerThroughTheServer() async throws {
        let dir = try TemporaryDirectory("firestore-sync")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let (a, ca) = try Self.connected(dir, "a", server)
        let (b, cb) = try Self.connected(dir, "b", server)
        let seen = Mutex<[(names: [String], fromCache: Bool)]>([])
        let reg = b.collection("cities").addSnapshotListener { snap, _ in
            guard let snap else { return }
            seen.withLock { $0.append((snap.documents.map(\.documentID).sorted(), snap.metadata.isFromCache)) }
        }
        // B's listener hears the server: an empty, current result first.
        #expect(await eventually { seen.withLock { $0.contains { $0.names.isEmpty && !$0.fromCache } } })
        try await a.collection("cities").document("SF").setData(["name": "San Francisco", "population": 860_000])
        try await a.collection("cities").document("LA").setData(["name": "Los Angeles"])
        try await a.waitForPendingWrites()
        #expect(await eventually { seen.withLock { $0.last.map { $0.names == ["LA", "SF"] && !$0.fromCache } ?? false } })
        let doc = try await b.collection("cities").document("SF").getDocument(source: .cache)
        #expect(doc.data()?["population"] as? Int == 860_000)

        // A's updates with transforms, applied by the server once.
        try await a.collection("cities").document("SF").updateData(["population": FieldValue.increment(Int64(5))])
        try await a.waitForPendingWrites()
        #expect(await eventually { (try? await b.collection("cities").document("SF").getDocument(source: .cache).data()?["population"] as? Int) == 860_005 })
        reg.remove()
        await ca.close()
        await cb.close()
        try await a.terminate()
        try await b.terminate()
        #expect(server.terminate() == 0)
    }
}
