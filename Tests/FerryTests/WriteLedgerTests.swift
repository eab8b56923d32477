import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable import Ferry

/// The pending-write ledger on its own: receipts end on their answer (only once the operation
/// that settled it resumes them), on the database's stop, or on cancellation; the cursor never
/// goes back; rejections are remembered for receipts awaited after the fact, within a bound.
@Suite struct WriteLedgerTests {
    /// A ledger behind a lock, as the engine holds it.
    final class Held: Sendable {
        let ledger = FerryMutex(WriteLedger<DatabaseError>())
    }

    /// Registers a receipt of `id` and returns once it is registered, with a task that ends
    /// as the receipt does.
    func waitingReceipt(_ held: Held, _ id: Int64, pending: Bool = true) async -> (Task<Void, any Error>, UInt64) {
        let token = held.ledger.withLock { $0.newToken() }
        let registered = AsyncStream<WriteLedger<DatabaseError>.Wait>.makeStream()
        let task = Task {
            try await withUnsafeThrowingContinuation { (c: UnsafeContinuation<Void, any Error>) in
                let wait = held.ledger.withLock { $0.wait(for: id, token: token, pending: pending, c) }
                registered.continuation.yield(wait)
                switch wait {
                case .waiting: break
                case .answered(let outcome, _): if let outcome { c.resume(throwing: outcome) } else { c.resume() }
                case .failed(let e): c.resume(throwing: e)
                case .cancelled: c.resume(throwing: CancellationError())
                }
            }
        }
        var it = registered.stream.makeAsyncIterator()
        _ = await it.next()
        return (task, token)
    }

    @Test func aReceiptEndsWithItsAnswerOnlyWhenTheSettlingOperationResumesIt() async throws {
        let held = Held()
        let (accepted, _) = await waitingReceipt(held, 7)
        let (refused, _) = await waitingReceipt(held, 9)
        #expect(held.ledger.withLock { $0.waitingCount } == 2)
        held.ledger.withLock {
            $0.advanceCursor(through: 7, recordLSN: 20)
            $0.settle(7, recordLSN: 20, nil)
            $0.settle(9, recordLSN: 21, DatabaseError(.writeRejected, "no"))
        }
        #expect(held.ledger.withLock { $0.waitingCount } == 0, "both answers settled")
        let settled = held.ledger.withLock { $0.takeSettled() }
        #expect(settled.count == 2)
        #expect(held.ledger.withLock { $0.takeSettled() }.isEmpty, "settled receipts are taken once")
        for s in settled {
            if let e = s.outcome { s.waiter.continuation.resume(throwing: e) } else { s.waiter.continuation.resume() }
        }
        try await accepted.value
        await #expect(throws: DatabaseError.self) { try await refused.value }
        #expect(held.ledger.withLock { ($0.ackedThrough, $0.lastAnswerLSN) } == (7, 21))
    }

    @Test func aReceiptOfAnAnsweredWriteIsAnsweredAtOnceWithTheNewestAnswersRecord() async throws {
        let held = Held()
        held.ledger.withLock { ledger in
            ledger.settle(3, recordLSN: 40, DatabaseError(.writeRejected, "refused by rules"))
            ledger.settle(4, recordLSN: 41, nil)
        }
        let (rejected, _) = await waitingReceipt(held, 3, pending: false)
        do {
            try await rejected.value
            Issue.record("the rejection must reach a receipt awaited after it")
        } catch let e as DatabaseError {
            #expect(e.code == .writeRejected && e.message == "refused by rules")
        }
        let token = held.ledger.withLock { $0.newToken() }
        let wait = await withUnsafeContinuation { (outer: UnsafeContinuation<WriteLedger<DatabaseError>.Wait, Never>) in
            Task {
                try? await withUnsafeThrowingContinuation { (c: UnsafeContinuation<Void, any Error>) in
                    let w = held.ledger.withLock { $0.wait(for: 4, token: token, pending: false, c) }
                    outer.resume(returning: w)
                    c.resume()
                }
            }
        }
        guard case .answered(let outcome, let lsn) = wait else { Issue.record("expected an answer, got \(wait)"); return }
        #expect(outcome == nil && lsn == 41, "acknowledged; the newest answer's record (at or after the one that decided it) must be durable first")
    }

    @Test func theStopEndsEveryReceiptAndACancelledOneIsTakenBackOnce() async throws {
        let held = Held()
        let (a, _) = await waitingReceipt(held, 5)
        let (b, tokenB) = await waitingReceipt(held, 5)
        let taken = held.ledger.withLock { $0.cancel(5, token: tokenB) }
        #expect(taken != nil)
        #expect(held.ledger.withLock { $0.cancel(5, token: tokenB) } == nil, "taken back once")
        taken?.resume(throwing: CancellationError())
        await #expect(throws: CancellationError.self) { try await b.value }
        held.ledger.withLock { $0.endAll(DatabaseError(.closed, "closed")) }
        do {
            try await a.value
            Issue.record("the stop must end the receipt")
        } catch let e as DatabaseError {
            #expect(e.code == .closed)
        }
        #expect(held.ledger.withLock { $0.waitingCount } == 0)
    }

    @Test func theCursorNeverGoesBack() {
        let ledger = WriteLedger<DatabaseError>()
        ledger.advanceCursor(through: 10, recordLSN: 12)
        ledger.advanceCursor(through: 4)
        #expect(ledger.ackedThrough == 10)
        #expect(ledger.lastAnswerLSN == 12)
        ledger.restore(ackedThrough: 2, rejected: [1: 3])
        #expect(ledger.ackedThrough == 2 && ledger.rejected == [1: 3], "a checkpoint's values are installed as they are")
    }

    @Test func aRejectedWriteStaysRejectedUntilTheAppClearsIt() {
        let ledger = WriteLedger<DatabaseError>()
        ledger.noteRejected(3, recordLSN: 7)
        ledger.noteRejected(5, recordLSN: 9)
        #expect(ledger.rejected == [3: 7, 5: 9])
        ledger.clearRejected([3, 4])
        #expect(ledger.rejected == [5: 9], "only the cleared write goes; clearing one never rejected changes nothing")
    }

    @Test func rejectionsAreRememberedWithinTheirBoundThenAnsweredGenerically() async throws {
        let n = Int64(WriteLedger<DatabaseError>.recentRejectionLimit) + 2  // (1 and 2 are forgotten)
        let held = Held()
        held.ledger.withLock { ledger in
            for id in 1...n { ledger.noteRejection(id, DatabaseError(.writeRejected, "write \(id)")) }
            ledger.noteRejected(1, recordLSN: 99)  // still kept for the app
        }
        for (id, message) in [(Int64(1), "the server refused write 1; it was reverted locally and kept in the database's rejected writes"),
                              (n, "write \(n)")] {
            let (receipt, _) = await waitingReceipt(held, id, pending: false)
            do {
                try await receipt.value
                Issue.record("write \(id) was rejected")
            } catch let e as DatabaseError {
                #expect(e.message == message)
            }
        }
        let (forgotten, _) = await waitingReceipt(held, 2, pending: false)
        try await forgotten.value  // (neither remembered nor kept: nothing to report)
    }

}

/// The life cycle on its own: the first failure is kept, ending (by failure or close) ends
/// every waiting receipt at once and asks once for the observers to be ended.
@Suite struct LifeCycleTests {
    @Test func theFirstFailureIsKeptAndEndsEveryWaitingReceiptOnce() async throws {
        let held = WriteLedgerTests.Held()
        let (waiting, _) = await WriteLedgerTests().waitingReceipt(held, 3)
        var life = LifeCycle<DatabaseError>()
        #expect(life.isOpen && !life.observersToEnd)
        let first = DatabaseError(.storage, "the disk failed")
        let stopped = held.ledger.withLock { life.fail(first, ledger: $0) }
        #expect(stopped && !life.isOpen && life.failure?.message == "the disk failed")
        await #expect { try await waiting.value } throws: { ($0 as? DatabaseError)?.message == "the disk failed" }
        let due = life.takeObserversToEnd(), dueAgain = life.takeObserversToEnd()
        #expect(due && !dueAgain, "the observers are to be ended once")
        let again = held.ledger.withLock { life.fail(DatabaseError(.storage, "a second failure"), ledger: $0) }
        #expect(!again && life.failure?.message == "the disk failed")
        let dueAfterSecond = life.takeObserversToEnd()
        #expect(!dueAfterSecond, "a second failure asks for nothing more")
        // A close after a failure: the store is closed too, and its observers were ended already.
        let closing = held.ledger.withLock { life.close(ledger: $0, reason: DatabaseError(.closed, "closed")) }
        #expect(closing && life.closed && life.failure?.message == "the disk failed")
    }

    @Test func closingEndsWaitingReceiptsWithItsReasonAndHappensOnce() async throws {
        let held = WriteLedgerTests.Held()
        let (waiting, _) = await WriteLedgerTests().waitingReceipt(held, 5)
        var life = LifeCycle<DatabaseError>()
        let reason = DatabaseError(.closed, "closed before the answer")
        let closing = held.ledger.withLock { life.close(ledger: $0, reason: reason) }
        #expect(closing)
        await #expect { try await waiting.value } throws: { ($0 as? DatabaseError)?.code == .closed }
        #expect(life.closed && life.failure == nil && !life.isOpen)
        let due = life.takeObserversToEnd()
        #expect(due)
        let closingAgain = held.ledger.withLock { life.close(ledger: $0, reason: reason) }
        let dueAgain = life.takeObserversToEnd()
        #expect(!closingAgain && !dueAgain, "a second close changes nothing and asks for nothing")
    }
}

/// The two media a store's records live on answer the same questions.
@Suite struct StoreMediumTests {
    @Test func aMemoryMediumIsDurableAtOnceAndKeepsSideFilesForTheProcess() async throws {
        let m = MemoryMedium()
        #expect(m.durableOnAppend && m.log == nil && m.failure == nil)
        try await m.awaitDurable(42)
        try m.writeSideFile(named: "sync-state.json", contents: Array("{}".utf8))
        #expect(try m.readSideFile(named: "sync-state.json") == Array("{}".utf8))
        #expect(try m.readSideFile(named: "other") == nil)
        #expect(MemoryMedium().storeID != m.storeID)
    }

    @Test func aLogMediumWaitsForTheLogAndKeepsSideFilesBesideIt() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: LogOptions(durability: .fsync))
        let m = LogMedium(log)
        #expect(!m.durableOnAppend && m.log === log && m.storeID == log.storeID)
        var batch = LogBatch(capacity: 16)
        batch.append(kind: 1, payload: [1, 2, 3])
        let lsn = try log.enqueue(batch).lowerBound.rawValue
        try await m.awaitDurable(lsn)
        #expect(log.durableLSN.rawValue > lsn, "durableLSN is the first LSN not yet durable")
        try m.writeSideFile(named: "state.json", contents: [7])
        #expect(FileManager.default.fileExists(atPath: dir.path + "/state.json"))
        #expect(try m.readSideFile(named: "state.json") == [7])
        try await m.close()
    }
}
