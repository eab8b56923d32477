import FerryLog
import FerryTestSupport
import Foundation
import Logging
import Testing

@testable @_spi(Server) import Ferry

/// Kill -9 at each step of an eviction and of a compaction (a child process armed with
/// FERRY_CRASH_AT), then reopen: the store opens, every acknowledged pending write is there,
/// the pinned and listened data are at least as new as acknowledged, and every other value is
/// either the one written or "not cached" — the view before or after the step, never a mix.
@Suite struct SpaceCrashTests {
    /// bulk/b<i> as the child writes it.
    static func bulkValue(_ i: Int) -> Value {
        var x = UInt64(i) &* 0x9E37_79B9_7F4A_7C15 | 1
        var s = ""
        for _ in 0..<160 {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17
            s += String(x, radix: 36)
        }
        return ["i": .int(Int64(i)), "text": .string(s)]
    }

    static let points = [
        "eviction.start", "eviction.afterRestate", "eviction.afterEvictRecord", "eviction.afterCheckpoint",
        "eviction.afterDelete", "eviction.afterRestate:4", "eviction.afterCheckpoint:6",
        "compaction.afterRestate", "compaction.afterSync", "compaction.afterCheckpoint", "compaction.afterDelete",
    ]

    @Test(arguments: points)
    func aKillAtAnyStepOfAnEvictionOrCompactionOpensToTheViewBeforeOrAfter(_ point: String) async throws {
        let dir = try TemporaryDirectory("space-crash")
        let child = try ChildProcess("/usr/bin/env", ["FERRY_CRASH_AT=\(point)", Locations.executable("ferry-space-child"), "run", dir.path, "4000"])
        _ = child.wait()  // (and its output read to the end)
        let lines = child.outputLines
        #expect(!lines.contains { $0.hasPrefix("error") }, "\(point): the child failed: \(lines.filter { $0.hasPrefix("error") })")
        #expect(!lines.contains("done"), "\(point): the crash point was never reached")
        var lastAck = -1
        var wrote: [Int64: Int] = [:]
        var acked = Set<Int64>()  // acknowledgements sent (their record may or may not be durable)
        for line in lines {
            let f = line.split(separator: " ")
            if f.first == "ack", f.count == 2, let i = Int(f[1]) { lastAck = max(lastAck, i) }
            if f.first == "wrote", f.count == 3, let i = Int(f[1]), let id = Int64(f[2]) { wrote[id] = i }
            if f.first == "acking", f.count == 2, let id = Int64(f[1]) { acked.insert(id) }
        }
        #expect(lastAck > 0, "\(point): the child acknowledged nothing")

        var o = DatabaseOptions(durability: .none)
        o.cacheSizeBytes = .bytes(CacheSize.minimumBytes)
        o.logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
        let db = try Database.open(at: dir.path, options: o)
        let pending = Set(db.pendingWriteIDs)
        for (id, i) in wrote {
            if !acked.contains(id) {
                #expect(pending.contains(id), "\(point): pending write \(id) was lost")
                #expect(try await db.reference("mine/m\(i)").getData().value == .int(Int64(i)), "\(point): pending write \(id)")
            } else if let v = try? await db.reference("mine/m\(i)").getData().value {
                #expect(v == .int(Int64(i)), "\(point): acknowledged write \(id) reads \(v)")
            }
        }
        let floor = Int64(lastAck / 10 * 10)
        for p in ["pinned/count", "listened/count"] {
            let v = try await db.reference(p).getData().value
            guard case .int(let n) = v else {
                Issue.record("\(point): \(p) is \(v)")
                continue
            }
            #expect(n >= floor, "\(point): \(p) went back to \(n)")
        }
        var notCached = 0
        for j in 0...lastAck {
            do {
                let v = try await db.reference("bulk/b\(j)").getData().value
                #expect(v == Self.bulkValue(j), "\(point): bulk/b\(j) holds something else")
            } catch let e as DatabaseError where e.code == .notCached {
                notCached += 1
            }
        }
        if point.hasPrefix("eviction.") && !["eviction.start", "eviction.afterRestate"].contains(point) {
            #expect(notCached > 0, "\(point): nothing was evicted")
        }
        try await db.close()
    }
}
