import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable @_spi(Server) import Ferry

/// The sync layer's state beside the log (`sync-state.json`).
@Suite struct SyncStateTests {
    /// Many writers at once (every stream of a sync client saves its position as it ends)
    /// leave one of their states, and the database usable: two racing on the side file's
    /// temporary file once stopped the log.
    @Test func concurrentWritersLeaveOneStateAndTheDatabaseUsable() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        #expect(db.readSyncState() == nil)
        try await withThrowingTaskGroup(of: Void.self) { group in
            for i in 0..<40 {
                group.addTask { try await db.writeSyncState(["n": .int(Int64(i))]) }
            }
            try await group.waitForAll()
        }
        guard case .object(let o)? = db.readSyncState(), case .int(let n)? = o["n"] else { Issue.record("no state"); return }
        #expect((0..<40).contains(n))
        _ = try await db.reference("still").setValue(true)
        try await db.close()
        // Kept across a reopen; a damaged file reads as none.
        let again = try Database.open(at: dir.path, options: quietOptions(.none))
        #expect(again.readSyncState() == ["n": .int(n)])
        try await again.close()
        try Array("{not json".utf8).withUnsafeBytes { try Data($0).write(to: URL(fileURLWithPath: dir.path + "/sync-state.json")) }
        let damaged = try Database.open(at: dir.path, options: quietOptions(.none))
        #expect(damaged.readSyncState() == nil)
        try await damaged.close()
    }
}
