import FerryDocuments
import FerryDocumentsSync
import FerryTestSupport
import Foundation
import Synchronization
import Testing

/// google-cloud-firestore for Python, from PyPI, drives `ferry-server`'s Firestore API
/// (`Tests/Firestore/test_ferry_firestore.py`): documents and every value type, transforms,
/// preconditions, batches, every query form, aggregations, listings, contended transactions,
/// listeners on a document and a query with another client's changes, the emulator's clear —
/// each result asserted there.
@Suite struct FirestorePythonTests {
    @Test func googleCloudFirestoreGetsWhatItExpectsFromEveryCall() throws {
        let dir = try TemporaryDirectory("firestore-python")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let firestore = try #require(server.firestorePort)
        let r = try run("/bin/bash", [Locations.packageRoot + "/scripts/firestore-python.sh", "127.0.0.1:\(firestore)", "test_ferry_firestore.py", "127.0.0.1:\(server.port)"])
        #expect(r.status == 0, "google-cloud-firestore test failed:\n\(r.stdout.suffix(3000))\n\(r.stderr.suffix(3000))")
        #expect(r.stdout.contains("all firestore checks passed"))
        #expect(server.terminate() == 0)
    }
}

/// google-cloud-firestore and Ferry's client on one project: each one's writes reach the
/// other's listener (`Tests/Firestore/interop.py`).
@Suite struct FirestoreInteropTests {
    @Test func pythonsWritesReachFerrysListenerAndFerrysReachPythons() async throws {
        let dir = try TemporaryDirectory("firestore-interop")
        let server = try ServerProcess(data: dir.path, ["--firestore-port", "0"])
        let port = try #require(server.firestorePort)
        let db = try Firestore.open(at: dir.sub("ferry"))
        let connection = try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: port, project: "interop"))
        let fromPython = Mutex<(by: String, n: Int)?>(nil)
        let reg = db.collection("interop").document("from-python").addSnapshotListener { snap, _ in
            if let data = snap?.data() {
                let seen = (by: data["by"] as? String ?? "", n: data["n"] as? Int ?? 0)
                fromPython.withLock { $0 = seen }
            }
        }
        let python = try ChildProcess("/bin/bash", [Locations.packageRoot + "/scripts/firestore-python.sh", "127.0.0.1:\(port)", "interop.py", "interop"])
        #expect(await eventually(timeout: .seconds(300)) { fromPython.withLock { $0 } != nil })
        #expect(fromPython.withLock { $0?.by } == "python")
        #expect(fromPython.withLock { $0?.n } == 7)
        try await db.collection("interop").document("from-ferry").setData(["by": "ferry", "n": 42])
        #expect(await eventually(timeout: .seconds(300)) { python.outputLines.contains("python saw ferry") })
        #expect(python.wait() == 0)
        reg.remove()
        await connection.close()
        try await db.terminate()
        #expect(server.terminate() == 0)
    }
}
