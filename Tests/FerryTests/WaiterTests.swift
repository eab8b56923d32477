import FerryLog
import FerryTestSupport
import Foundation
import Synchronization
import Testing

@testable @_spi(Server) import Ferry

/// Every wait the database offers ends: on its answer, on close, on failure, on cancellation —
/// and a failed open leaves the store free for the next opener.
@Suite struct WaiterTests {
    /// `/posts` is not complete offline (nothing cached, no whole write), so a value listener
    /// there waits for data that never comes: only close, failure or cancellation end it.
    @Test func aValueSequenceOnIncompleteDataEndsWhenTheDatabaseCloses() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        try await db.reference("posts/p1").setValue(1)  // a child, not the whole of /posts
        let posts = try db.reference("posts")
        let iterated = FerryMutex(0)
        let reader = Task {
            for try await _ in posts.values() { iterated.withLock { $0 += 1 } }
        }
        let single = Task { try await posts.observeSingleEvent() }
        // Both are waiting (observing) when the database closes: a wait begun after the close
        // ends at once whatever the close does (the next test).
        try #require(await eventually { db.engine.withLock { $0.registrations.count } == 2 }, "the sequence and the single-event wait observe")
        try await db.close()
        await #expect(throws: DatabaseError.self) { try await reader.value }
        do {
            _ = try await single.value
            Issue.record("observeSingleEvent must end when the database closes")
        } catch let e as DatabaseError {
            #expect(e.code == .closed)
        }
        #expect(iterated.withLock { $0 } == 0)
        #expect(db.engine.withLock { $0.registrations.isEmpty }, "the observers went away with their sequences")
    }

    @Test func waitsStartedAfterCloseEndAtOnce() async throws {
        let db = Database.inMemory(options: quietOptions())
        let ref = try db.reference("absent")
        let receipt = try await ref.setValue(1)
        try await db.close()
        await #expect(throws: DatabaseError.self) { try await ref.observeSingleEvent() }
        await #expect(throws: DatabaseError.self) { for try await _ in ref.values() {} }
        await #expect(throws: DatabaseError.self) { try await receipt.serverAcknowledgement() }
    }

    @Test func cancellingTheTaskEndsSingleEventAndSequenceWaits() async throws {
        let db = Database.inMemory(options: quietOptions())
        let ref = try db.reference("never")
        let single = Task { try await ref.observeSingleEvent() }
        let sequence = Task { for try await _ in ref.values() {}; return true }
        // (Cancelled while they observe, not before they begin.)
        try #require(await eventually { db.engine.withLock { $0.registrations.count } == 2 }, "both waits observe")
        single.cancel()
        sequence.cancel()
        await #expect(throws: CancellationError.self) { try await single.value }
        #expect(try await sequence.value, "a cancelled sequence ends")
        #expect(await eventually { db.engine.withLock { $0.registrations.isEmpty } }, "their observers went away")
        try await db.close()
    }

    @Test func removingTheObserversEndsTheirSequencesAndSingleEventWaits() async throws {
        let db = Database.inMemory(options: quietOptions())
        let ref = try db.reference("never")
        let sequence = Task { for try await _ in ref.values() {}; return true }
        let single = Task { try await ref.observeSingleEvent() }
        try #require(await eventually { db.engine.withLock { $0.registrations.count } == 2 }, "both waits observe")
        ref.removeAllObservers()
        #expect(try await sequence.value, "the sequence ends")
        await #expect(throws: DatabaseError.self) { try await single.value }
        #expect(db.engine.withLock { $0.registrations.isEmpty })
        try await db.close()
    }

    @Test func aFailedOpenReleasesTheStoreBeforeItThrows() async throws {
        let dir = try TemporaryDirectory()
        do {
            let log = try WriteAheadLog.open(at: dir.path)
            var batch = LogBatch()
            batch.append(kind: 0, payload: Array("not a database record".utf8))
            try await log.append(batch)
            try await log.close()
        }
        for attempt in 0..<10 {
            do {
                _ = try Database.open(at: dir.path, options: quietOptions())
                Issue.record("a log-only store must not open as a database")
            } catch let e as DatabaseError {
                #expect(e.code == .storage)
                #expect(e.message.contains("not written by a Ferry database"), "attempt \(attempt): \(e)")
                #expect(!e.message.contains("newer Ferry"), "attempt \(attempt): \(e)")
                #expect(e.lsn == 1)
                #expect(e.file?.hasSuffix(".wal") == true, "the error names the segment: \(e)")
                #expect(e.offset != nil, "and the frame's offset: \(e)")
                #expect(e.store == dir.path)
            }
        }
        // The store is free: a good store put at the same path opens at once, every time.
        for attempt in 0..<20 {
            _ = try? Database.open(at: dir.path, options: quietOptions())  // the log-only store: refused
            for name in try FileManager.default.contentsOfDirectory(atPath: dir.path) {
                try FileManager.default.removeItem(atPath: dir.path + "/" + name)
            }
            let db = try Database.open(at: dir.path, options: quietOptions())
            try await db.reference("n").setValue(.int(Int64(attempt)))
            try await db.close()
            for name in try FileManager.default.contentsOfDirectory(atPath: dir.path) {
                try FileManager.default.removeItem(atPath: dir.path + "/" + name)
            }
            let log = try WriteAheadLog.open(at: dir.path)
            var batch = LogBatch()
            batch.append(kind: 0, payload: [1])
            try await log.append(batch)
            try await log.close()
        }
    }

    @Test func anUnreadableValueIsAnErrorNamingItsRecordNotNull() async throws {
        let dir = try TemporaryDirectory()
        var options = quietOptions()
        options.checkpointOnClose = false
        var lsn: UInt64 = 0
        do {
            let db = try Database.open(at: dir.path, options: options)
            lsn = UInt64(try await db.reference("a").setValue(["big": .string(String(repeating: "x", count: 100))]).writeID!)
            try await db.close()
        }
        // Take the frames away under the open database (it indexed them on open and reads values
        // from them on demand), so that reading the value fails.
        let db = try Database.open(at: dir.path, options: options)
        let segment = try #require(try FileManager.default.contentsOfDirectory(atPath: dir.path).first { $0.hasSuffix(".wal") })
        let url = URL(fileURLWithPath: dir.path).appendingPathComponent(segment)
        let handle = try FileHandle(forWritingTo: url)
        try handle.truncate(atOffset: 40)  // keeps the segment header, drops the frames
        try handle.close()
        do {
            let snapshot = try await db.reference("a").getData()
            Issue.record("an unreadable value must be an error, got \(snapshot.value)")
        } catch let e as DatabaseError {
            #expect(e.code == .storage)
            #expect(e.lsn == lsn, "\(e)")
            #expect(e.file?.hasSuffix(segment) == true, "\(e)")
        }
        // The database stopped: later calls say why.
        await #expect(throws: DatabaseError.self) { try await db.reference("b").setValue(1) }
        try? await db.close()
    }
}
