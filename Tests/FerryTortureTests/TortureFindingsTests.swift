import FerryTestSupport
import Testing
@testable @_spi(Server) import Ferry

/// What the torture harness found, reduced to a few steps.
@Suite struct TortureFindingsTests {
    /// Found by the long run (seed 1795488204320, round 2521, a random kill; the kill only made
    /// the check look): the server's removal of a location below a leaf changes nothing, so it
    /// must not change how later acknowledged writes land there. Without the removal, the
    /// acknowledged `set c/b/d` then `set c/b = null` replace the leaf `c` and leave nothing
    /// (as the Realtime Database's client does); after it, the server cache keeps `c = false`.
    /// Live and replayed state agreed: a server-cache bug, not a durability one. Fixed in
    /// `LayeredIndex.set`: an empty entry below a leaf no longer hides the leaf from a write below it.
    @Test(arguments: [false, true])
    func aServerRemovalBelowALeafDoesNotChangeHowLaterAcknowledgedWritesApply(removalFirst: Bool) async throws {
        let dir = try TemporaryDirectory()
        var options = DatabaseOptions()
        options.checkpointOnClose = false
        var db = try Database.open(at: dir.path, options: options)
        try await db.applyServerPut(at: "", ["c": false])
        _ = try await db.reference("c/b/d").setValue(false)
        let last = try await db.reference("c/b").setValue(.null)
        if removalFirst { try await db.applyServerPut(at: "c/b", .null) }
        try await db.acknowledgeWrites(through: last.writeID!)
        func serverCache() -> Value? { db.engine.withLock { $0.server.completeNode(at: .root)?.value(export: true) } }
        let check = {
            #expect(serverCache() == .null, "live")
            try await db.close()
            db = try Database.open(at: dir.path, options: options)
            #expect(serverCache() == .null, "replayed")
        }
        try await check()
        try await db.close()
    }
}
