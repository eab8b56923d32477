@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

@Suite struct RandomAccessTests {
    @Test func anyWrittenRecordCanBeReadByItsLSN() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 8192))
        try await appendPosts(log, 0..<500, batchSize: 3)
        var g = SplitMix(seed: 5)
        for _ in 0..<300 {
            let lsn = LSN(1 + g.next() % 500)
            let (kind, payload) = try log.withRecord(at: lsn) { ($0.kind, Array($0.payload)) }
            #expect(kind == UInt8((Int(lsn.rawValue) - 1) % 5))
            #expect(payload == Payloads.post(Int(lsn.rawValue) - 1))
        }
        #expect(throws: LogError.self) { try log.withRecord(at: 501) { _ in () } }
        #expect(throws: LogError.self) { try log.withRecord(at: 0) { _ in () } }
        try await log.close()
    }

    @Test func enqueueAssignsLSNsAtOnceAndAwaitDurabilityWaitsPerMode() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync))
        var batch = LogBatch()
        batch.append(kind: 1, payload: Payloads.post(0))
        let a = try log.enqueue(batch)
        let b = try log.enqueue(batch)
        #expect(a == LSN(1)...LSN(1))
        #expect(b == LSN(2)...LSN(2))
        try await log.awaitDurability(of: b)
        #expect(log.durableLSN >= 3)
        #expect(try log.records().count == 2)
        try await log.close()
    }
}
