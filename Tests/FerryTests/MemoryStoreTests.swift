import FerryLog
import Testing

@testable @_spi(Server) import Ferry

/// A memory-only database writes the same records as a stored one, into memory, and reads its
/// values from them; records nothing refers to any more are swept, so that memory follows
/// what the database holds, not how often it was written.
@Suite struct MemoryStoreTests {
    func memoryRecords(_ db: Database) -> (count: Int, bytes: Int) { db.engine.withLock { $0.memoryRecords } }

    @Test func overwrittenServerDataIsSweptAndWhatIsReadStays() async throws {
        let db = Database.inMemory(options: quietOptions())
        let payload = String(repeating: "x", count: 1_000)
        // 4,000 puts of ~1 KB over 10 locations: ~4 MB written, 10 values live.
        for i in 0..<4_000 {
            try await db.applyServerPut(at: "rooms/r\(i % 10)", ["text": .string(payload), "n": .int(Int64(i))])
        }
        let kept = memoryRecords(db)
        #expect(kept.bytes < 2_200_000, "the records of overwritten values are swept (\(kept.bytes) bytes kept)")
        for r in 0..<10 {
            let snapshot = try await db.reference("rooms/r\(r)/n").getData()
            #expect(snapshot.value == .int(Int64(3_990 + r)), "each location reads its last value")
        }
    }

    @Test func pendingWritesAndRejectedWritesKeepTheirRecords() async throws {
        let db = Database.inMemory(options: quietOptions())
        let payload = String(repeating: "y", count: 1_000)
        let first = try await db.reference("drafts/a").setValue(["text": .string(payload), "v": ServerValue.increment(1)])
        let second = try await db.reference("drafts/b").setValue(.string("kept"))
        // Enough server data over the same place to sweep several times.
        for i in 0..<6_000 { try await db.applyServerPut(at: "feed", ["text": .string(payload), "n": .int(Int64(i))]) }
        try await db.acknowledgeWrites(through: second.writeID!, rejecting: [WriteRejection(writeID: first.writeID!, status: 401, message: "no")])
        let rejected = try db.rejectedWrites()
        #expect(rejected.map(\.writeID) == [first.writeID!])
        // The rejected write comes back as the app wrote it, its server value unresolved.
        #expect(rejected.first?.value == .object(["text": .string(payload), "v": ServerValue.increment(1)]))
        #expect(try await db.reference("drafts/b").getData().value == .string("kept"), "the acknowledged write stays as server data")
        let pending = try await db.reference("drafts/c").setValue(.int(7))
        for i in 0..<6_000 { try await db.applyServerPut(at: "feed", ["text": .string(payload), "n": .int(Int64(i))]) }
        #expect(try db.outgoingWrites(after: 0, limit: 10).map(\.id) == [pending.writeID!], "a pending write's record stays, to be sent")
        #expect(memoryRecords(db).bytes < 2_000_000)
    }
}
