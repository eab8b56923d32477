@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

/// Options for small, fast test stores.
func testOptions(_ durability: Durability = .fsync, segmentSize: Int = 64 << 10) -> LogOptions {
    var o = LogOptions(durability: durability, segmentSize: segmentSize)
    o.frameTargetSize = 4096
    return o
}

/// Appends `count` records (payload `Payloads.post(i)` for the i-th, kind `i % 5`) in batches.
@discardableResult
func appendPosts(_ log: WriteAheadLog, _ range: Range<Int>, batchSize: Int = 1) async throws -> [ClosedRange<LSN>] {
    var out: [ClosedRange<LSN>] = []
    var i = range.lowerBound
    while i < range.upperBound {
        var batch = LogBatch()
        for j in i..<min(i + batchSize, range.upperBound) { batch.append(kind: UInt8(j % 5), payload: Payloads.post(j)) }
        out.append(try await log.append(batch))
        i += batchSize
    }
    return out
}

/// Checks that `records` are exactly posts `0..<count` at LSNs 1...count.
func expectPosts(_ records: [LogRecord], count: Int, sourceLocation: SourceLocation = #_sourceLocation) {
    #expect(records.count == count, sourceLocation: sourceLocation)
    for (i, r) in records.enumerated() {
        guard r.lsn == LSN(UInt64(i + 1)), r.kind == UInt8(i % 5), r.payload == Payloads.post(i) else {
            Issue.record("record \(i) differs: lsn \(r.lsn) kind \(r.kind) \(r.payload.count) bytes", sourceLocation: sourceLocation)
            return
        }
    }
}

/// Writes a store of `count` posts, closes it, and returns the directory.
func writeStore(_ count: Int, batchSize: Int = 1, options: LogOptions = testOptions(.none)) async throws -> TemporaryDirectory {
    let dir = try TemporaryDirectory()
    let log = try WriteAheadLog.open(at: dir.path, options: options)
    try await appendPosts(log, 0..<count, batchSize: batchSize)
    try await log.close()
    return dir
}

func segmentFiles(_ dir: String) throws -> [String] {
    try Files.list(dir).filter { $0.hasSuffix(".wal") }
}

/// Runs `body` and returns the `LogError` it threw (recording an issue if it threw none).
func logError(sourceLocation: SourceLocation = #_sourceLocation, _ body: () throws -> Void) -> LogError? {
    do {
        try body()
        Issue.record("expected a LogError, nothing was thrown", sourceLocation: sourceLocation)
        return nil
    } catch let e as LogError {
        return e
    } catch {
        Issue.record("expected a LogError, got \(error)", sourceLocation: sourceLocation)
        return nil
    }
}
