#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// One measured workload on one engine: the median of its runs, with min and max.
struct Measurement: Encodable {
    var area: String
    var workload: String
    var engine: String
    var operations: Int
    var bytes: Int
    /// Seconds of each run.
    var runs: [Double]
    var bytesOnDisk: Int?
    var bytesAfterCompaction: Int?
    var peakRSS: Int?
    var note: String?

    var median: Double { runs.sorted()[runs.count / 2] }
    var opsPerSecond: Double { Double(operations) / median }
    var mbPerSecond: Double { Double(bytes) / median / 1e6 }
    var minOps: Double { Double(operations) / (runs.max() ?? 1) }
    var maxOps: Double { Double(operations) / (runs.min() ?? 1) }

    enum CodingKeys: String, CodingKey {
        case area, workload, engine, operations, bytes, runs, bytesOnDisk, bytesAfterCompaction, peakRSS, note
        case medianSeconds, opsPerSecond, mbPerSecond, minOpsPerSecond, maxOpsPerSecond
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(area, forKey: .area)
        try c.encode(workload, forKey: .workload)
        try c.encode(engine, forKey: .engine)
        try c.encode(operations, forKey: .operations)
        try c.encode(bytes, forKey: .bytes)
        try c.encode(runs, forKey: .runs)
        try c.encodeIfPresent(bytesOnDisk, forKey: .bytesOnDisk)
        try c.encodeIfPresent(bytesAfterCompaction, forKey: .bytesAfterCompaction)
        try c.encodeIfPresent(peakRSS, forKey: .peakRSS)
        try c.encodeIfPresent(note, forKey: .note)
        try c.encode(median, forKey: .medianSeconds)
        try c.encode(opsPerSecond, forKey: .opsPerSecond)
        try c.encode(mbPerSecond, forKey: .mbPerSecond)
        try c.encode(minOps, forKey: .minOpsPerSecond)
        try c.encode(maxOps, forKey: .maxOpsPerSecond)
    }
}

/// One engine's part in an interleaved measurement.
struct Contender {
    var engine: String
    var prepare: () async throws -> String
    var body: (String) async throws -> Void
    var cleanup: (String) async throws -> Void = { remove($0) }
}

/// Runs every contender `runs` times, alternating engines run by run (A B A B …), so that a
/// disk whose fsync latency drifts during the run affects them alike. Returns seconds per run.
func measureInterleaved(runs: Int, _ contenders: [Contender]) async throws -> [String: [Double]] {
    var out: [String: [Double]] = [:]
    for _ in 0..<runs {
        for c in contenders {
            let state = try await c.prepare()
            let start = ContinuousClock.now
            try await c.body(state)
            let d = start.duration(to: .now)
            out[c.engine, default: []].append(Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18)
            try await c.cleanup(state)
        }
    }
    return out
}

/// Runs `body` `runs` times; each run gets a fresh setup from `prepare` (not timed).
func measure<State>(runs: Int, prepare: () async throws -> State, _ body: (State) async throws -> Void, cleanup: (State) async throws -> Void = { _ in }) async throws -> [Double] {
    var times: [Double] = []
    for _ in 0..<runs {
        let state = try await prepare()
        let start = ContinuousClock.now
        try await body(state)
        let d = start.duration(to: .now)
        times.append(Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18)
        try await cleanup(state)
    }
    return times
}

/// This process's peak resident memory: `VmHWM` of /proc/self/status, which belongs to the
/// process's own address space (`ru_maxrss` would include the parent's, inherited across
/// `posix_spawn`'s shared-memory start and `exec`).
func peakResidentBytes() -> Int {
    if let status = try? String(contentsOfFile: "/proc/self/status", encoding: .utf8),
       let line = status.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
       let kb = Int(line.split(separator: " ", omittingEmptySubsequences: true).dropFirst().first ?? "") {
        return kb * 1024
    }
    var u = rusage()
    getrusage(RUSAGE_SELF.rawValue, &u)
    return Int(u.ru_maxrss) * 1024
}

func directorySize(_ path: String) -> Int {
    var total = 0
    let e = FileManager.default.enumerator(atPath: path)
    while let rel = e?.nextObject() as? String {
        if let s = try? FileManager.default.attributesOfItem(atPath: path + "/" + rel)[.size] as? NSNumber { total += s.intValue }
    }
    return total
}

func human(_ v: Double) -> String {
    if v >= 1e6 { return String(format: "%.2fM", v / 1e6) }
    if v >= 1e3 { return String(format: "%.1fk", v / 1e3) }
    return String(format: "%.0f", v)
}

func humanBytes(_ v: Int) -> String {
    let d = Double(v)
    if d >= 1_073_741_824 { return String(format: "%.2f GiB", d / 1_073_741_824) }
    if d >= 1_048_576 { return String(format: "%.1f MiB", d / 1_048_576) }
    if d >= 1024 { return String(format: "%.1f KiB", d / 1024) }
    return "\(v) B"
}

/// Prints measurements as a table (or JSON lines).
struct Report {
    var json: Bool
    private(set) var all: [Measurement] = []

    mutating func add(_ m: Measurement) {
        all.append(m)
        if json {
            let e = JSONEncoder()
            e.outputFormatting = [.sortedKeys]
            print(String(decoding: try! e.encode(m), as: UTF8.self))
        } else {
            let cols = [
                m.workload.padding(toLength: 22, withPad: " ", startingAt: 0),
                m.engine.padding(toLength: 12, withPad: " ", startingAt: 0),
                (human(m.opsPerSecond) + " ops/s").padding(toLength: 14, withPad: " ", startingAt: 0),
                String(format: "%8.1f MB/s", m.mbPerSecond),
                ("  [" + human(m.minOps) + "–" + human(m.maxOps) + "]").padding(toLength: 20, withPad: " ", startingAt: 0),
                m.bytesOnDisk.map { "disk " + humanBytes($0) } ?? "",
                m.note.map { "  " + $0 } ?? "",
            ]
            print(cols.joined(separator: " "))
        }
    }

    func ratio(_ workload: String, _ a: String, _ b: String) -> Double? {
        guard let x = all.first(where: { $0.workload == workload && $0.engine == a }),
              let y = all.first(where: { $0.workload == workload && $0.engine == b }) else { return nil }
        return x.opsPerSecond / y.opsPerSecond
    }
}
