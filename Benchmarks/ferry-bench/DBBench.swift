import ArgumentParser
@_spi(Server) import Ferry
import FerryLog
import Foundation

/// `ferry-bench db`: the database, beside LevelDB on the same data.
struct DBBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "db",
        abstract: "1,000,000 setValues beside LevelDB puts; reopen until reads are answered (with and without a checkpoint) beside LevelDB's open and full scan; peak memory of each open; a memory-only database's writes, reads and memory.")

    @OptionGroup var common: CommonOptions
    @Option(help: "Records (setValues at distinct paths).") var records = 1_000_000
    @Option(help: ArgumentHelp("Keep the store the JSON run wrote (with its checkpoint) here, for profiling the open.", visibility: .hidden)) var keep: String?

    func run() async throws {
        say("generating \(records) posts (not timed)…", json: common.json)
        let data = Dataset(count: records)
        let avg = data.payloadBytes / data.count
        say("dataset: \(data.count) JSON posts, \(avg) bytes average, \(humanBytes(data.payloadBytes)) in all", json: common.json)
        var report = Report(json: common.json)
        let keys = (0..<records).map { Dataset.key($0) }

        // Writes: the JSON text as it is (LevelDB stores the same bytes), and as Values parsed
        // beforehand (what a Swift app that builds its data holds). Inputs are prepared a chunk
        // at a time before the clock runs.
        var ferryDir = "", levelDir = ""
        var jsonTimes: [Double] = [], valueTimes: [Double] = [], levelTimes: [Double] = [], closeTimes: [Double] = []
        let chunk = 50_000
        for run in 0..<common.runs {
            for asJSON in [true, false] {
                let dir = try common.scratch("db")
                let db = try Database.open(at: dir, options: DatabaseOptions(durability: .none))
                var elapsed = Duration.zero
                var i = 0
                while i < records {
                    let n = min(chunk, records - i)
                    let refs = try (i..<(i + n)).map { try db.reference(String(keys[$0].dropFirst())) }
                    if asJSON {
                        let texts = (i..<(i + n)).map { j in data.withRecord(j) { Array($0) } }
                        let start = ContinuousClock.now
                        for k in 0..<n { try await refs[k].setValue(jsonBytes: texts[k]) }
                        elapsed += start.duration(to: .now)
                    } else {
                        let values = try (i..<(i + n)).map { j in try data.withRecord(j) { try Value(jsonBytes: Array($0)) } }
                        let start = ContinuousClock.now
                        for k in 0..<n { try await refs[k].setValue(values[k]) }
                        elapsed += start.duration(to: .now)
                    }
                    i += n
                }
                if asJSON {
                    jsonTimes.append(seconds(elapsed))
                    let closeStart = ContinuousClock.now
                    try await db.close()
                    closeTimes.append(seconds(closeStart.duration(to: .now)))
                    if run == 0 { ferryDir = dir } else { remove(dir) }
                } else {
                    valueTimes.append(seconds(elapsed))
                    try await db.close()
                    remove(dir)
                }
            }

            let ldir = try common.scratch("leveldb")
            let level = try LevelDB(path: ldir)
            let start = ContinuousClock.now
            for j in 0..<records {
                try keys[j].utf8CString.withUnsafeBytes { k in
                    try data.withRecord(j) { v in try level.put(UnsafeRawBufferPointer(rebasing: k.dropLast()), v) }
                }
            }
            levelTimes.append(seconds(start.duration(to: .now)))
            if run == 0 { levelDir = ldir } else { remove(ldir) }
        }
        report.add(Measurement(area: "db", workload: "setValue x\(records)", engine: "ferry", operations: records, bytes: data.payloadBytes,
                               runs: jsonTimes, bytesOnDisk: directorySize(ferryDir), note: "setValue(jsonBytes:), durability .none, distinct paths"))
        report.add(Measurement(area: "db", workload: "setValue x\(records)", engine: "ferry-value", operations: records, bytes: data.payloadBytes,
                               runs: valueTimes, note: "setValue(Value), Values parsed beforehand"))
        report.add(Measurement(area: "db", workload: "setValue x\(records)", engine: "leveldb", operations: records, bytes: data.payloadBytes,
                               runs: levelTimes, bytesOnDisk: directorySize(levelDir), note: "put of the same JSON bytes, sync=false"))
        report.add(Measurement(area: "db", workload: "close (checkpoint)", engine: "ferry", operations: 1, bytes: 0, runs: closeTimes))

        // Reopen until reads are answered, each in a fresh process (for its peak memory).
        func open(_ engine: String, _ dir: String) throws -> Measurement {
            var times: [Double] = [], rss: [Int] = []
            for _ in 0..<common.runs {
                let out = try runChild(["db-open", engine, dir, "--records", String(records)])
                let fields = out.split(whereSeparator: \.isWhitespace)
                guard fields.count == 2, let t = Double(fields[0]), let peak = Int(fields[1]) else { throw BenchError("bad child output: \(out)") }
                times.append(t)
                rss.append(peak)
            }
            return Measurement(area: "db", workload: "reopen until reads answered", engine: engine, operations: records, bytes: data.payloadBytes,
                               runs: times, peakRSS: rss.sorted()[rss.count / 2],
                               note: "peak RSS \(humanBytes(rss.sorted()[rss.count / 2])) = \(String(format: "%.2f", Double(rss.sorted()[rss.count / 2]) / Double(data.payloadBytes)))× the payload")
        }
        if let keep {
            remove(keep)
            try FileManager.default.copyItem(atPath: ferryDir, toPath: keep)
        }
        report.add(try open("ferry", ferryDir))
        for f in try FileManager.default.contentsOfDirectory(atPath: ferryDir) where f.hasPrefix("checkpoint-") {
            try FileManager.default.removeItem(atPath: ferryDir + "/" + f)
        }
        var noCheckpoint = try open("ferry", ferryDir)
        noCheckpoint.engine = "ferry-replay"
        noCheckpoint.note = "no checkpoint: replays every record; " + (noCheckpoint.note ?? "")
        report.add(noCheckpoint)
        var level = try open("leveldb", levelDir)
        level.note = "open + full scan; " + (level.note ?? "")
        report.add(level)
        remove(ferryDir)
        remove(levelDir)

        // A memory-only database (Database.inMemory): the same posts written, read one by one,
        // and walked whole, each run in a fresh process (for its peak memory).
        var memory: [String: [Double]] = [:]
        var memoryRSS: [Int] = []
        for _ in 0..<common.runs {
            let out = try runChild(["db-memory", "--records", String(records)])
            guard let line = out.split(separator: "\n").last,
                  let r = try? JSONDecoder().decode([String: Double].self, from: Data(line.utf8)) else { throw BenchError("bad child output: \(out)") }
            for k in ["write", "read", "walk"] { memory[k, default: []].append(r[k] ?? 0) }
            memoryRSS.append(Int(r["peakRSS"] ?? 0))
        }
        let reads = min(records, DBMemory.pointReads)
        report.add(Measurement(area: "db", workload: "memory-only: setValueNow x\(records)", engine: "ferry-memory", operations: records,
                               bytes: data.payloadBytes, runs: memory["write"]!, peakRSS: memoryRSS.sorted()[memoryRSS.count / 2],
                               note: "setValueNow(jsonBytes:); peak RSS of the process \(humanBytes(memoryRSS.sorted()[memoryRSS.count / 2]))"))
        report.add(Measurement(area: "db", workload: "memory-only: getData of one post x\(reads)", engine: "ferry-memory", operations: reads,
                               bytes: 0, runs: memory["read"]!, note: "random posts"))
        report.add(Measurement(area: "db", workload: "memory-only: walk of every post's value", engine: "ferry-memory", operations: records,
                               bytes: data.payloadBytes, runs: memory["walk"]!, note: "getData() of /posts, then each child's value"))

        if !common.json {
            print("")
            if let r = report.ratio("setValue x\(records)", "ferry", "leveldb") { print("  setValue(jsonBytes:) / LevelDB put          \(String(format: "%.2f", r))×") }
            if let r = report.ratio("setValue x\(records)", "ferry-value", "leveldb") { print("  setValue(Value) / LevelDB put               \(String(format: "%.2f", r))×") }
            let f = report.all.first { $0.engine == "ferry" && $0.workload.hasPrefix("reopen") }!
            let l = report.all.first { $0.engine == "leveldb" && $0.workload.hasPrefix("reopen") }!
            print("  reopen with checkpoint / LevelDB open+scan   \(String(format: "%.2f", f.median / l.median))× the time")
            print("  peak memory of the open / payload            \(String(format: "%.2f", Double(f.peakRSS!) / Double(data.payloadBytes)))×")
        }
    }

    func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }
}

/// The child process of `db` for a memory-only database: writes the posts, reads some at
/// random one by one, walks them all; prints the seconds of each and the peak resident memory,
/// as one JSON object.
struct DBMemory: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "db-memory", shouldDisplay: false)
    /// Posts read one by one.
    static let pointReads = 100_000
    @Option var records = 1_000_000

    func run() async throws {
        let data = Dataset(count: records)
        let db = Database.inMemory(options: DatabaseOptions(durability: .none))
        try await db.applyServerPut(at: "posts", [:])  // (as after a sync: /posts reads complete)
        let texts = (0..<records).map { j in data.withRecord(j) { Array($0) } }
        let refs = try (0..<records).map { try db.reference(String(Dataset.key($0).dropFirst())) }
        var start = ContinuousClock.now
        for k in 0..<records { try refs[k].setValueNow(jsonBytes: texts[k]) }
        let write = seconds(start.duration(to: .now))
        var g = SystemRandomNumberGenerator()
        let picks = (0..<min(records, Self.pointReads)).map { _ in Int(g.next() % UInt64(records)) }
        start = ContinuousClock.now
        for i in picks {
            guard try await refs[i].getData().exists else { throw BenchError("post \(i) missing") }
        }
        let read = seconds(start.duration(to: .now))
        start = ContinuousClock.now
        var n = 0
        try await db.reference("posts").getData().forEachChild { child in
            if case .object = child.value { n += 1 }
        }
        let walk = seconds(start.duration(to: .now))
        guard n == records else { throw BenchError("walked \(n) of \(records) posts") }
        print("{\"write\": \(write), \"read\": \(read), \"walk\": \(walk), \"peakRSS\": \(peakResidentBytes())}")
        try await db.close()
    }

    func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }
}

/// The child process of `db`: opens a store and answers reads; prints the seconds it took and
/// its peak resident memory.
struct DBOpen: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "db-open", shouldDisplay: false)
    @Argument var engine: String
    @Argument var directory: String
    @Option var records = 1_000_000

    func run() async throws {
        let start = ContinuousClock.now
        switch engine {
        case "ferry":
            var options = DatabaseOptions(durability: .none)
            options.checkpointOnClose = false  // leave the store as it is for the next run
            let db = try Database.open(at: directory, options: options)
            // Ready: reads are answered (a spread of keys, and the last one written).
            for i in stride(from: 0, to: records, by: max(1, records / 100)) + [records - 1] {
                let s = try await db.reference(String(Dataset.key(i).dropFirst())).getData()
                guard s.exists else { throw BenchError("post \(i) missing after reopen") }
            }
            let t = start.duration(to: .now)
            print(Double(t.components.seconds) + Double(t.components.attoseconds) / 1e18, peakResidentBytes())
            try await db.close()
        case "leveldb":
            let db = try LevelDB(path: directory)
            let (n, _) = db.scan()
            guard n == records else { throw BenchError("leveldb scanned \(n) entries") }
            let t = start.duration(to: .now)
            print(Double(t.components.seconds) + Double(t.components.attoseconds) / 1e18, peakResidentBytes())
        default:
            throw BenchError("unknown engine \(engine)")
        }
    }
}
