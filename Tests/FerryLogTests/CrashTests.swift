import Foundation
@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

@Suite struct CrashTests {
    /// How many kills: a few dozen normally; set FERRY_CRASH_ITERATIONS for a soak.
    static let iterations = Int(ProcessInfo.processInfo.environment["FERRY_CRASH_ITERATIONS"] ?? "") ?? 30

    struct Ack {
        var first: UInt64, last: UInt64, writer: Int, batch: Int
    }

    /// A child appends with Durability.fsync from four tasks (small segments, so rolls happen
    /// often) and prints each acknowledged batch; it is killed with SIGKILL at a random moment.
    /// After every kill the store opens, and every acknowledged record is there, intact, with
    /// contiguous LSNs.
    @Test func everyAcknowledgedRecordSurvivesKillDashNine() async throws {
        let dir = try TemporaryDirectory("crash")
        var rng = SplitMix(seed: UInt64(Date().timeIntervalSince1970 * 1000))
        let seed = rng.next()
        rng = SplitMix(seed: seed)
        var acks: [Ack] = []
        var tornTails = 0
        for iteration in 0..<Self.iterations {
            let child = try ChildProcess(Locations.executable("ferry-crash-child"), ["append", dir.path, "4", "16384"])
            #expect(child.waitForLine { $0.hasPrefix("open ") }, "iteration \(iteration): the child did not open the store")
            usleep(UInt32(2_000 + rng.next() % 150_000))
            for line in child.kill9() where line.hasPrefix("ack ") {
                let f = line.split(separator: " ")
                guard f.count == 5, let a = UInt64(f[1]), let b = UInt64(f[2]), let w = Int(f[3]), let n = Int(f[4]) else { continue }
                acks.append(Ack(first: a, last: b, writer: w, batch: n))
            }
            #expect(!child.outputLines.contains { $0.hasPrefix("error") }, "the child reported an error")

            let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
            if log.recovery.tornTail != nil { tornTails += 1 }
            var records: [UInt64: [UInt8]] = [:]
            var expected: UInt64 = 1
            try log.forEachRecord { r in
                #expect(r.lsn.rawValue == expected, "LSNs are not contiguous at \(r.lsn)")
                expected = r.lsn.rawValue + 1
                records[r.lsn.rawValue] = Array(r.payload)
            }
            for ack in acks {
                for (k, lsn) in (ack.first...ack.last).enumerated()
                where records[lsn] != Payloads.tagged(writer: ack.writer, batch: ack.batch, record: k) {
                    Issue.record("iteration \(iteration) (seed \(seed)): acknowledged LSN \(lsn) is missing or wrong")
                    break
                }
            }
            try await log.close()
        }
        #expect(acks.count > Self.iterations, "the children acknowledged too little to test anything")
        print("kill -9 loop: \(Self.iterations) kills, \(acks.count) acknowledged batches checked, \(tornTails) torn tails truncated (seed \(seed))")
    }
}
