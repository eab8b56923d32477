import ArgumentParser
@_spi(Server) import Ferry
import Foundation
import Logging

/// `ferry-bench cache`: server updates into a store with a cache size limit while listeners are
/// active, beside the same workload with no limit: updates/s, bytes on disk over time, and the
/// writer's pauses (each update's `await`).
struct CacheBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "cache",
        abstract: "Server updates under a cache size limit with listeners active, beside the same with no limit.",
        discussion: """
            Each update is a server put of a ~90-byte value (random text, which compresses little) at one of --paths locations (chosen at random, the \
            same sequence for both runs), awaited one at a time, with durability .none (server data can be fetched \
            again; the limit, not fsync, is what is measured). Pauses are the durations of each update's await.
            """
    )

    @Option(help: "Server updates per run.") var updates = 1_000_000
    @Option(help: "Distinct locations updated.") var paths = 100_000
    @Option(help: "The cache size limit in MB.") var capMB = 10
    @Option(help: "Active listeners (on single locations, the first ones).") var listeners = 10
    @Option(help: "Draw bytes on disk over time (both runs) as an SVG line chart in this file.") var svg: String?
    @Option(help: "Where stores are written (a fresh directory inside it, removed afterwards).")
    var directory = ProcessInfo.processInfo.environment["TMPDIR"] ?? "/tmp"
    @Flag(help: "Print the result as JSON.") var json = false

    struct Run: Encodable {
        var label: String
        var updatesPerSecond: Double
        var seconds: Double
        var maxBytesOnDisk: Int64
        var finalBytesOnDisk: Int64
        var medianPauseMicros: Double
        var p99PauseMicros: Double
        var worstPauseMicros: Double
        var pausesOver10ms: Int
        var evictions: Int
        /// (update number, bytes on disk) every updates/200.
        var samples: [[Int64]]
    }

    func runOnce(_ label: String, cap: CacheSize) async throws -> Run {
        let dir = directory + "/ferry-bench-cache-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
        defer { try? FileManager.default.removeItem(atPath: dir) }
        var o = DatabaseOptions(durability: .none)
        o.cacheSizeBytes = cap
        o.logger = Logger(label: "bench", factory: { _ in SwiftLogNoOpLogHandler() })
        let db = try Database.open(at: dir, options: o)
        for i in 0..<listeners { try db.reference("items/p\(i)").observe(.value) { _ in } }
        var rng = UInt64(0x9E37_79B9_7F4A_7C15)
        func next() -> UInt64 {
            rng ^= rng << 13; rng ^= rng >> 7; rng ^= rng << 17
            return rng
        }
        var pauses = [Double]()
        pauses.reserveCapacity(updates)
        var samples: [[Int64]] = []
        var maxBytes: Int64 = 0
        var evictionEnds = Set<Int64>()
        let every = max(1, updates / 200)
        let clock = ContinuousClock()
        let start = clock.now
        for i in 0..<updates {
            let p = Int(next() % UInt64(paths))
            let noise = (0..<5).map { _ in String(next(), radix: 36) }.joined(separator: " ")
            let value: Value = ["n": .int(Int64(i)), "text": .string(noise), "at": .int(Int64(p))]
            let t0 = clock.now
            try await db.applyServerPut(at: "items/p\(p)", value)
            let d = (clock.now - t0).components
            pauses.append(Double(d.seconds) * 1e6 + Double(d.attoseconds) / 1e12)
            if i % 10 == 0 || i == updates - 1 {
                let s = db.statistics
                maxBytes = max(maxBytes, s.bytesOnDisk)
                if let e = s.lastEviction { evictionEnds.insert(e.endedAt &* 1_000_000 &+ Int64(e.entriesEvicted)) }
                if i % every == 0 || i == updates - 1 { samples.append([Int64(i), s.bytesOnDisk]) }
            }
        }
        let seconds = { let c = (clock.now - start).components; return Double(c.seconds) + Double(c.attoseconds) / 1e18 }()
        let final = db.statistics.bytesOnDisk
        try await db.close()
        pauses.sort()
        func pct(_ q: Double) -> Double { pauses.isEmpty ? 0 : pauses[min(pauses.count - 1, Int(Double(pauses.count) * q))] }
        return Run(label: label, updatesPerSecond: Double(updates) / seconds, seconds: seconds, maxBytesOnDisk: maxBytes,
                   finalBytesOnDisk: final, medianPauseMicros: pct(0.5), p99PauseMicros: pct(0.99),
                   worstPauseMicros: pauses.last ?? 0, pausesOver10ms: pauses.count - (pauses.firstIndex { $0 >= 10_000 } ?? pauses.count), evictions: evictionEnds.count, samples: samples)
    }

    func run() async throws {
        let cap = capMB << 20
        let limited = try await runOnce("cap \(capMB) MB", cap: .bytes(cap))
        let unlimited = try await runOnce("unlimited", cap: .unlimited)
        let segment = Int64(min(8 << 20, max(64 << 10, cap / 8)))
        if json {
            struct Report: Encodable { var updates: Int; var paths: Int; var listeners: Int; var capBytes: Int; var segmentBytes: Int64; var runs: [Run] }
            let e = JSONEncoder()
            e.outputFormatting = [.sortedKeys]
            print(String(decoding: try e.encode(Report(updates: updates, paths: paths, listeners: listeners, capBytes: cap, segmentBytes: segment, runs: [limited, unlimited])), as: UTF8.self))
        } else {
            print("ferry-bench cache: \(updates) server updates over \(paths) paths, \(listeners) listeners, cap \(capMB) MB (segments \(segment >> 10) KiB)")
            print("run             updates/s   max on disk   final on disk   pause median   p99      worst     ≥10 ms   evictions≥")
            for r in [limited, unlimited] {
                print(String(format: "%-14@ %10.0f   %8.2f MB   %10.2f MB   %9.1f µs %8.1f µs %8.1f ms %6d   %d",
                             r.label as NSString, r.updatesPerSecond, Double(r.maxBytesOnDisk) / 1048576, Double(r.finalBytesOnDisk) / 1048576,
                             r.medianPauseMicros, r.p99PauseMicros, r.worstPauseMicros / 1000, r.pausesOver10ms, r.evictions))
            }
            let ratio = limited.updatesPerSecond / unlimited.updatesPerSecond
            print(String(format: "capped/unlimited updates/s: %.0f%% (goal ≥ 80%%)", ratio * 100))
            print("max bytes on disk vs cap + one segment: \(limited.maxBytesOnDisk) vs \(Int64(cap) + segment) (goal: never above)")
            print(String(format: "worst writer pause: %.1f ms (goal < 10 ms)", limited.worstPauseMicros / 1000))
        }
        if let svg { try chart([limited, unlimited], cap: Int64(cap), segment: segment).write(toFile: svg, atomically: true, encoding: .utf8) }
    }

    /// Bytes on disk against updates, both runs, with the cap and cap + one segment drawn.
    func chart(_ runs: [Run], cap: Int64, segment: Int64) -> String {
        let w = 800.0, h = 400.0, left = 70.0, bottom = 40.0, top = 30.0, right = 20.0
        let maxY = Double(max(runs.map(\.maxBytesOnDisk).max() ?? 1, cap + segment)) * 1.05
        let maxX = Double(max(1, updates))
        func x(_ v: Double) -> Double { left + v / maxX * (w - left - right) }
        func y(_ v: Double) -> Double { h - bottom - v / maxY * (h - bottom - top) }
        var out = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"\(Int(w))\" height=\"\(Int(h))\" font-family=\"sans-serif\" font-size=\"12\">\n"
        out += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n"
        out += "<text x=\"\(left)\" y=\"18\">Bytes on disk over \(updates) server updates (\(paths) paths, \(listeners) listeners)</text>\n"
        out += "<line x1=\"\(left)\" y1=\"\(y(0))\" x2=\"\(w - right)\" y2=\"\(y(0))\" stroke=\"black\"/>\n"
        out += "<line x1=\"\(left)\" y1=\"\(y(0))\" x2=\"\(left)\" y2=\"\(top)\" stroke=\"black\"/>\n"
        for k in 0...4 {
            let v = maxY * Double(k) / 4
            out += "<text x=\"4\" y=\"\(y(v) + 4)\">\(String(format: "%.0f MB", v / 1048576))</text>\n"
            let u = maxX * Double(k) / 4
            out += "<text x=\"\(x(u) - 20)\" y=\"\(h - 15)\">\(Int(u))</text>\n"
        }
        for (v, label, dash) in [(Double(cap), "cap", "4,4"), (Double(cap + segment), "cap + 1 segment", "2,2")] {
            out += "<line x1=\"\(left)\" y1=\"\(y(v))\" x2=\"\(w - right)\" y2=\"\(y(v))\" stroke=\"gray\" stroke-dasharray=\"\(dash)\"/>\n"
            out += "<text x=\"\(w - right - 110)\" y=\"\(y(v) - 4)\" fill=\"gray\">\(label)</text>\n"
        }
        let colors = ["#d62728", "#1f77b4"]
        for (i, r) in runs.enumerated() {
            let points = r.samples.map { "\(String(format: "%.1f", x(Double($0[0])))),\(String(format: "%.1f", y(Double($0[1]))))" }.joined(separator: " ")
            out += "<polyline fill=\"none\" stroke=\"\(colors[i % 2])\" stroke-width=\"1.5\" points=\"\(points)\"/>\n"
            out += "<text x=\"\(left + 10)\" y=\"\(top + 16 + Double(i) * 16)\" fill=\"\(colors[i % 2])\">\(r.label)</text>\n"
        }
        return out + "</svg>\n"
    }
}
