@_spi(Testing) import FerryLog
import FerryTestSupport
import Synchronization
import Testing

@testable @_spi(Server) @_spi(Testing) import Ferry

/// A checkpoint or compaction whose file step fails stops the log; the database must then
/// stop too, whether or not anyone awaited the maintenance (an automatic compaction only logs).
@Suite struct MaintenanceFailureTests {
    /// Fails the next `rename` or `unlink` of a file whose path contains (for `rename`) or ends
    /// with (for `unlink`) the armed text, once.
    final class OneFault: Sendable {
        private let armed = FerryMutex<(call: String, path: String)?>(nil)
        func arm(_ call: String, pathContaining path: String) { armed.withLock { $0 = (call, path) } }

        private func fires(_ call: String, _ path: String) -> Bool {
            armed.withLock { a in
                guard let f = a, f.call == call, call == "rename" ? path.contains(f.path) : path.hasSuffix(f.path) else { return false }
                a = nil
                return true
            }
        }

        var system: SystemCalls {
            var sys = SystemCalls.live
            let live = SystemCalls.live
            sys.rename = { from, to in self.fires("rename", from) ? .failure(.EIO) : live.rename(from, to) }
            sys.unlink = { path in self.fires("unlink", path) ? .failure(.EIO) : live.unlink(path) }
            return sys
        }
    }

    /// Later writes throw ``DatabaseError/Code/storage`` carrying the log's failure and its cause.
    static func expectDatabaseStopped(_ db: Database, by call: String, sourceLocation: SourceLocation = #_sourceLocation) async {
        do {
            try await db.reference("later").setValue("x")
            Issue.record("a write after the log failed succeeded", sourceLocation: sourceLocation)
        } catch let e as DatabaseError {
            #expect(e.code == .storage, sourceLocation: sourceLocation)
            let log = e.underlying as? LogError
            #expect(log?.code == .failed, "\(e)", sourceLocation: sourceLocation)
            let cause = log?.cause as? LogError
            #expect(cause?.errno == .EIO, sourceLocation: sourceLocation)
            #expect(cause?.message.contains(call) == true, "the cause names \(call): \(e)", sourceLocation: sourceLocation)
        } catch {
            Issue.record("not a DatabaseError: \(error)", sourceLocation: sourceLocation)
        }
    }

    @Test func aCheckpointWhoseRenameFailsStopsTheDatabaseAndLosesNothingDurable() async throws {
        let dir = try TemporaryDirectory()
        let fault = OneFault()
        var options = quietOptions(.fsync)
        options.system = fault.system
        options.checkpointOnClose = false
        let db = try Database.open(at: dir.path, options: options)
        try await db.reference("a").setValue(["n": 1])
        fault.arm("rename", pathContaining: "checkpoint-")
        await #expect(throws: DatabaseError.self) { try await db.checkpoint() }
        await Self.expectDatabaseStopped(db, by: "rename")
        try? await db.close()

        let reopened = try Database.open(at: dir.path, options: quietOptions())
        #expect(try await reopened.reference("a/n").getData().value == 1)
        try await reopened.close()
    }

    @Test func aCompactionWhoseSegmentDeletionFailsStopsTheDatabase() async throws {
        let dir = try TemporaryDirectory()
        let fault = OneFault()
        var options = CompactionTests.options()
        options.system = fault.system
        options.checkpointOnClose = false
        let db = try await CompactionTests.open(dir, options)
        try await CompactionTests.fill(db, rounds: 3)
        try await db.sync()  // (the options write with `.none`: only what is durable must survive)
        let before = try await CompactionTests.everything(db)
        fault.arm("unlink", pathContaining: ".wal")  // a segment, not a temporary file
        await #expect(throws: DatabaseError.self) { try await db.compact() }
        await Self.expectDatabaseStopped(db, by: "unlink")
        try? await db.close()

        let reopened = try Database.open(at: dir.path, options: CompactionTests.options())
        #expect(try await CompactionTests.everything(reopened) == before)
        try await reopened.close()
    }
}
