@_spi(Testing) import FerryLog
import FerryTestSupport
import Logging
import Testing

/// Options for small, fast test stores.
func testOptions(_ durability: Durability = .fsync, segmentSize: Int = 64 << 10) -> LogOptions {
    var o = LogOptions(durability: durability, segmentSize: segmentSize)
    o.frameTargetSize = 4096
    o.logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })  // failures are expected here
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

/// Frame boundaries of a segment file, parsed the way FORMAT.md describes (independently of the
/// log's own reader): (offset, frame type, stored length, first LSN, record count).
struct ParsedFrame {
    var offset: Int
    var type: UInt8
    var storedLength: Int
    var firstLSN: UInt64
    var records: Int
    var end: Int { offset + 32 + storedLength }
}

/// The frames of a segment file, up to its end or to the zeros grown ahead of its frames.
func parseFrames(_ bytes: [UInt8]) -> [ParsedFrame] {
    func u32(_ o: Int) -> Int { Int(bytes[o]) | Int(bytes[o + 1]) << 8 | Int(bytes[o + 2]) << 16 | Int(bytes[o + 3]) << 24 }
    func u64(_ o: Int) -> UInt64 { (0..<8).reduce(UInt64(0)) { $0 | UInt64(bytes[o + $1]) << (8 * $1) } }
    var frames: [ParsedFrame] = []
    var o = 64
    while o + 32 <= bytes.count {
        if bytes[o...].allSatisfy({ $0 == 0 }) { break }
        let f = ParsedFrame(offset: o, type: bytes[o + 4], storedLength: u32(o + 8), firstLSN: u64(o + 16), records: u32(o + 24))
        guard f.end <= bytes.count else { break }
        frames.append(f)
        o = f.end
    }
    return frames
}

/// A store of `segments`+ sealed segments: posts appended one per batch (one frame each).
func multiSegmentStore(records: Int = 400, segmentSize: Int = 8192) async throws -> TemporaryDirectory {
    try await writeStore(records, batchSize: 1, options: testOptions(.fsync, segmentSize: segmentSize))
}

/// Writes a copy of `files` (name → bytes) into a fresh directory.
func storeWith(_ files: [String: [UInt8]]) throws -> TemporaryDirectory {
    let dir = try TemporaryDirectory()
    for (name, bytes) in files { try Files.write(dir.sub(name), bytes) }
    return dir
}

func readStore(_ dir: TemporaryDirectory) throws -> [String: [UInt8]] {
    var out: [String: [UInt8]] = [:]
    for name in try segmentFiles(dir.path) { out[name] = try Files.read(dir.sub(name)) }
    return out
}
