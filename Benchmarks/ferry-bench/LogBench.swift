import ArgumentParser
import FerryLog
import Foundation

/// `ferry-bench log`: the write-ahead log alone.
struct LogBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "log",
        abstract: "Append (.none, a sync per 64, a sync per record from 1 and 16 appenders) and replay, beside the raw ceiling.")

    @OptionGroup var common: CommonOptions
    @Option(help: "Records for the .none append and the replay.") var records = 1_000_000
    @Option(help: "Records for the sync-every-64 workload.") var sync64Records = 262_144
    @Option(help: "Records for the one-sync-per-record workloads (per run).") var syncRecords = 10_000
    @Option(help: "Run only these workloads (comma-separated: none, sync64, fsync1, fsync16, replay).")
    var only: String?

    func wants(_ w: String) -> Bool { only.map { $0.split(separator: ",").contains(Substring(w)) } ?? true }

    func run() async throws {
        var report = Report(json: common.json)
        say("generating \(records) records of ~200 bytes (not timed)…", json: common.json)
        let data = Dataset(count: max(records, sync64Records, syncRecords))
        say("dataset: \(data.count) records, \(data.payloadBytes / data.count) bytes average", json: common.json)
        let runs = common.runs
        let avg = data.payloadBytes / data.count

        // 1. Append with .none, one durable commit at the end.
        var replayDir: String?
        var rawPath = ""
        if wants("none") || wants("replay") {
            let t = try await measureInterleaved(runs: runs, [
                Contender(engine: "ferry", prepare: { try common.scratch("none") }, body: { dir in
                    let log = try WriteAheadLog.open(at: dir, options: LogOptions(durability: .none))
                    try await appendOneByOne(log, data, 0..<records)
                    try await log.close()
                }, cleanup: { dir in
                    if replayDir == nil { replayDir = dir } else { remove(dir) }
                }),
                Contender(engine: "raw", prepare: { try common.scratch("raw") + "/raw.log" }, body: { path in
                    var raw = RawCeiling(path: path)
                    for i in 0..<records { data.withRecord(i) { raw.add($0) } }
                    raw.commit()
                    raw.close()
                }, cleanup: { path in
                    if rawPath.isEmpty { rawPath = path } else { remove((path as NSString).deletingLastPathComponent) }
                }),
            ])
            report.add(Measurement(area: "log", workload: "append .none", engine: "ferry", operations: records, bytes: records * avg,
                                   runs: t["ferry"]!, bytesOnDisk: replayDir.map(directorySize), note: "1 record per append, sync at close"))
            report.add(Measurement(area: "log", workload: "append .none", engine: "raw", operations: records, bytes: records * avg,
                                   runs: t["raw"]!, bytesOnDisk: try Files.size(rawPath)))
        }

        // 2. A sync every 64 records.
        if wants("sync64") {
            let t = try await measureInterleaved(runs: runs, [
                Contender(engine: "ferry", prepare: { try common.scratch("s64") }) { dir in
                    let log = try WriteAheadLog.open(at: dir, options: LogOptions(durability: .none))
                    try await appendOneByOne(log, data, 0..<sync64Records, syncEvery: 64)
                    try await log.close()
                },
                Contender(engine: "raw", prepare: { try common.scratch("raw64") }) { dir in
                    var raw = RawCeiling(path: dir + "/raw.log")
                    for i in 0..<sync64Records {
                        data.withRecord(i) { raw.add($0) }
                        if i % 64 == 63 { raw.commit() }
                    }
                    raw.commit()
                    raw.close()
                },
            ])
            for e in ["ferry", "raw"] {
                report.add(Measurement(area: "log", workload: "sync every 64", engine: e, operations: sync64Records,
                                       bytes: sync64Records * avg, runs: t[e]!))
            }
        }

        // 3. One fdatasync per record, one appender.
        if wants("fsync1") {
            let t = try await measureInterleaved(runs: runs, [
                Contender(engine: "ferry", prepare: { try common.scratch("f1") }) { dir in
                    let log = try WriteAheadLog.open(at: dir, options: LogOptions(durability: .fsync))
                    try await appendOneByOne(log, data, 0..<syncRecords)
                    try await log.close()
                },
                Contender(engine: "raw", prepare: { try common.scratch("raw1") }) { dir in
                    var raw = RawCeiling(path: dir + "/raw.log")
                    for i in 0..<syncRecords {
                        data.withRecord(i) { raw.add($0) }
                        raw.commit()
                    }
                    raw.close()
                },
            ])
            for e in ["ferry", "raw"] {
                report.add(Measurement(area: "log", workload: "fsync x1 appender", engine: e, operations: syncRecords,
                                       bytes: syncRecords * avg, runs: t[e]!))
            }
        }

        // 4. One fdatasync per record awaited by each of 16 concurrent appenders.
        if wants("fsync16") {
            let perWriter = max(1, syncRecords * 4 / 16)
            let total16 = perWriter * 16
            let t = try await measureInterleaved(runs: runs, [
                Contender(engine: "ferry", prepare: { try common.scratch("f16") }) { dir in
                    let log = try WriteAheadLog.open(at: dir, options: LogOptions(durability: .fsync))
                    try await withThrowingTaskGroup(of: Void.self) { group in
                        for w in 0..<16 {
                            group.addTask { try await appendOneByOne(log, data, (w * perWriter)..<((w + 1) * perWriter)) }
                        }
                        try await group.waitForAll()
                    }
                    let st = log.statistics
                    if ProcessInfo.processInfo.environment["FERRY_BENCH_DEBUG"] != nil {
                        print("  rounds \(st.rounds) syncs \(st.syncs) records/sync \(Double(st.records) / Double(max(1, st.syncs)))")
                    }
                    try await log.close()
                },
                Contender(engine: "raw", prepare: { try common.scratch("raw16") }) { dir in
                    var raw = RawCeiling(path: dir + "/raw.log")
                    for i in 0..<total16 {
                        data.withRecord(i % data.count) { raw.add($0) }
                        if i % 16 == 15 { raw.commit() }
                    }
                    raw.commit()
                    raw.close()
                },
            ])
            report.add(Measurement(area: "log", workload: "fsync x16 appenders", engine: "ferry", operations: total16,
                                   bytes: total16 * avg, runs: t["ferry"]!, note: "each appender awaits its own durability"))
            report.add(Measurement(area: "log", workload: "fsync x16 appenders", engine: "raw", operations: total16,
                                   bytes: total16 * avg, runs: t["raw"]!, note: "perfect batching: 16 records per fdatasync"))
        }

        // 5. Open (recovery scan) and replay everything the first .none run wrote.
        if let dir = replayDir {
            var log: WriteAheadLog?
            let open = try await measure(runs: runs, prepare: { () }) { _ in
                if let l = log { try await l.close() }
                log = try WriteAheadLog.open(at: dir)
            }
            report.add(Measurement(area: "log", workload: "open (scan)", engine: "ferry", operations: records, bytes: records * avg,
                                   runs: open, note: "checks every segment's frames and checksums"))
            let replay = try await measure(runs: runs, prepare: { () }) { _ in
                var n = 0
                var sum: UInt64 = 0
                try log!.forEachRecord { r in
                    n += 1
                    sum &+= UInt64(r.payload.count)
                }
                precondition(n == records && sum > 0, "replay read \(n) records")
            }
            report.add(Measurement(area: "log", workload: "replay", engine: "ferry", operations: records, bytes: records * avg,
                                   runs: replay, peakRSS: peakResidentBytes()))
            try await log?.close()
            remove(dir)
        }
        if !rawPath.isEmpty {
            let rawReplay = try await measure(runs: runs, prepare: { () }) { _ in
                precondition(RawCeiling.replay(path: rawPath) == records)
            }
            report.add(Measurement(area: "log", workload: "replay", engine: "raw", operations: records, bytes: records * avg, runs: rawReplay))
            remove((rawPath as NSString).deletingLastPathComponent)
        }

        if !common.json {
            print("")
            print("Ratios (Ferry / raw ceiling, same run; goals in parentheses):")
            for (w, goal) in [("append .none", "goal ≥ 0.70"), ("sync every 64", "goal ≥ 0.70"), ("fsync x1 appender", "goal ≥ 0.70"),
                              ("fsync x16 appenders", "against a writer that batches 16 per sync for free"), ("replay", "")] {
                if let r = report.ratio(w, "ferry", "raw") { print("  \(w.padding(toLength: 22, withPad: " ", startingAt: 0)) \(String(format: "%.2f", r))×  (\(goal))") }
            }
            if let a = report.all.first(where: { $0.workload == "fsync x16 appenders" && $0.engine == "ferry" }),
               let b = report.all.first(where: { $0.workload == "fsync x1 appender" && $0.engine == "raw" }) {
                print("  fsync x16 vs raw one-sync-per-record  \(String(format: "%.1f", a.opsPerSecond / b.opsPerSecond))×  (the ceiling without group commit; goal ≥ 0.70)")
            }
            if let a = report.all.first(where: { $0.workload == "fsync x16 appenders" && $0.engine == "ferry" }),
               let b = report.all.first(where: { $0.workload == "fsync x1 appender" && $0.engine == "ferry" }) {
                print("  16 appenders / 1 appender      \(String(format: "%.1f", a.opsPerSecond / b.opsPerSecond))×  (goal ≥ 8×)")
            }
            if let r = report.all.first(where: { $0.workload == "replay" && $0.engine == "ferry" }) {
                print("  replay                         \(human(r.opsPerSecond)) records/s  (goal ≥ 5M)")
            }
        }
    }
}

/// Appends records `range` of the dataset one per batch, calling `sync()` after every
/// `syncEvery` records when given.
func appendOneByOne(_ log: WriteAheadLog, _ data: Dataset, _ range: Range<Int>, syncEvery: Int? = nil) async throws {
    var batch = LogBatch(capacity: 512)
    for i in range {
        batch.removeAll()
        data.withRecord(i % data.count) { batch.append(kind: 1, payload: $0) }
        try await log.append(batch)
        if let n = syncEvery, (i - range.lowerBound) % n == n - 1 { try await log.sync() }
    }
}

enum Files {
    static func size(_ path: String) throws -> Int {
        (try FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue ?? 0
    }
}
