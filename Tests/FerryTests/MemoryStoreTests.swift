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
        let statistics = db.statistics
        #expect(statistics.memoryRecords == kept.count && statistics.memoryRecordBytes == Int64(kept.bytes), "statistics say what memory holds")
        #expect(statistics.memoryRecordBytes > 10 * 1_000 && statistics.bytesOnDisk == 0)
        for r in 0..<10 {
            let snapshot = try await db.reference("rooms/r\(r)/n").getData()
            #expect(snapshot.value == .int(Int64(3_990 + r)), "each location reads its last value")
        }
    }

    @Test func pendingAcknowledgedAndRejectedWritesKeepTheirRecordsThroughSweeps() async throws {
        var options = quietOptions()
        options.cacheSizeBytes = .unlimited  // (no eviction: only sweeps free memory here)
        let db = Database.inMemory(options: options)
        let payload = String(repeating: "y", count: 1_000)
        func churn() async throws {
            // ~6 MB of server data over one location: several sweeps.
            for i in 0..<6_000 { try await db.applyServerPut(at: "feed", ["text": .string(payload), "n": .int(Int64(i))]) }
        }
        let first = try await db.reference("drafts/a").setValue(["text": .string(payload), "v": ServerValue.increment(1)])
        let second = try await db.reference("drafts/b").setValue(.string("kept"))
        try await db.acknowledgeWrites(through: second.writeID!, rejecting: [WriteRejection(writeID: first.writeID!, status: 401, message: "no")])
        // A pending write whose place in the overlay a later write took: only its being pending keeps its record.
        let shadowed = try await db.reference("drafts/c").setValue(.int(7))
        let shadowing = try await db.reference("drafts/c").setValue(.int(8))
        try await churn()
        let rejected = try db.rejectedWrites()
        #expect(rejected.map(\.writeID) == [first.writeID!])
        // The rejected write comes back as the app wrote it, its server value unresolved.
        #expect(rejected.first?.value == .object(["text": .string(payload), "v": ServerValue.increment(1)]))
        #expect(try await db.reference("drafts/b").getData().value == .string("kept"), "the acknowledged write stays as server data")
        let outgoing = try db.outgoingWrites(after: 0, limit: 10)
        #expect(outgoing.map(\.id) == [shadowed.writeID!, shadowing.writeID!], "both pending writes are still sent, in order")
        #expect(outgoing.map(\.data) == [.int(7), .int(8)])
        #expect(memoryRecords(db).bytes < 2_500_000, "the overwritten server data was swept")
    }

    @Test func aRecordListSharesItsChunksAndFindsEveryRecord() {
        var list = RecordList()
        let n = RecordList.chunkCapacity * 3 + 5
        for i in 1...n { list.append((UInt64(i * 2), 1, [UInt8(truncatingIfNeeded: i)])) }
        let copy = list  // (a snapshot's)
        #expect(list.count == n && list.first?.lsn == 2)
        for i in [1, RecordList.chunkCapacity, RecordList.chunkCapacity + 1, n] {
            #expect(list.find(UInt64(i * 2))?.payload.first == UInt8(truncatingIfNeeded: i))
            #expect(list.find(UInt64(i * 2 + 1)) == nil, "an LSN between two records is not found")
        }
        list.removeAll(below: UInt64(RecordList.chunkCapacity * 2 + 10))
        #expect(list.first?.lsn == UInt64(RecordList.chunkCapacity * 2 + 10) && list.count == n - RecordList.chunkCapacity - 4)
        list.removeAll(keeping: { $0 % 4 == 0 })
        #expect((list.find(UInt64(n * 2)) != nil) == (n % 2 == 0))
        #expect(copy.count == n && copy.find(2)?.payload.first == 1, "the copy kept every record")
    }

    /// A log's records have consecutive LSNs: their place follows from the LSN, also once the
    /// first chunk lost records from its front.
    @Test func aRecordListOfConsecutiveLSNsFindsEachByItsPlace() {
        var list = RecordList()
        let n = RecordList.chunkCapacity * 3 + 7
        for i in 1...n { list.append((UInt64(100 + i), UInt8(i % 7), [UInt8(truncatingIfNeeded: i)])) }
        list.removeAll(below: 100 + 1 + 1000)  // the first chunk now starts at its 1,001st record
        for lsn in [101, 1100, 1101, 1102, 100 + RecordList.chunkCapacity, 101 + RecordList.chunkCapacity, 100 + n, 101 + n].map(UInt64.init) {
            let expected: Int? = lsn >= 1101 && lsn <= 100 + UInt64(n) ? Int(lsn - 100) : nil
            #expect(list.find(lsn).map { Int($0.lsn - 100) } == expected, "lsn \(lsn)")
            #expect((list.computedPlace(of: lsn) != nil) == (expected != nil), "lsn \(lsn) is found by its place, without a search")
            if let e = expected { #expect(list.find(lsn)?.payload == [UInt8(truncatingIfNeeded: e)] && list.find(lsn)?.kind == UInt8(e % 7)) }
        }
    }
}
