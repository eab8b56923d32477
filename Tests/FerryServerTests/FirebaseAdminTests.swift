import FerryTestSupport
import Foundation
import Testing

/// firebase-admin for Python, from PyPI, drives `ferry-server` (`Tests/FirebaseAdmin/test_ferry_server.py`):
/// get, set, update, push, delete, server values, ETag transactions, queries, shallow reads, a
/// listener, rules with and without a token — each result asserted there.
@Suite struct FirebaseAdminTests {
    @Test func firebaseAdminGetsWhatItExpectsFromEveryCall() throws {
        let dir = try TemporaryDirectory("server-admin")
        let server = try ServerProcess(data: dir.path, ["--token", "user-token"])
        let r = try run("/bin/bash", [Locations.packageRoot + "/scripts/firebase-admin-test.sh", "127.0.0.1:\(server.port)", "user-token"])
        #expect(r.status == 0, "firebase-admin test failed:\n\(r.stdout)\n\(r.stderr.suffix(3000))")
        #expect(r.stdout.contains("all firebase-admin checks passed"))
        #expect(server.terminate() == 0)
    }
}
