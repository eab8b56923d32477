import ArgumentParser
import Foundation

/// `ferry-bench compare`: the shared workloads on Ferry, LevelDB, SQLite and the raw ceiling,
/// each run in a child process of its own, engines alternating run by run; one table.
struct CompareBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "compare",
        abstract: "sync1, sync64, concurrent16, bulk, reopen, limited and overwrite on Ferry, LevelDB, SQLite and a raw ceiling, and Ferry's multi-path update, in one run.",
        discussion: """
            Every engine gets the same pre-generated records (key /posts/pNNNNNNNN, a ~200-byte JSON post) and the \
            same durability: sync1 one durable commit per write; sync64 one per 64 writes; concurrent16 16 writers each \
            waiting for its own write to be durable; bulk one durable commit after all writes; reopen opens the bulk \
            store and reads every value; limited opens it and asks for the 10 posts with the most likes (Ferry: the \
            first event of queryOrdered(byChild: "likes").queryLimited(toLast: 10); LevelDB a scan keeping the top 10; \
            SQLite ORDER BY json_extract(v, '$.likes') LIMIT 10); overwrite writes each key 10 times (Ferry: each write \
            acknowledged through the sync cursor, with no cache limit so that every post is kept, checked after), \
            reopens, and compacts; update (Ferry alone) writes bulk's posts as multi-path updates of 1,000 posts each \
            (`updateChildValuesNow`, durable at the end), compared per post with bulk's single writes. The goals are \
            ratios in the same run, printed after the table (and as JSON lines with --json).
            """)

    @OptionGroup var common: CommonOptions
    @OptionGroup var sizes: CompareSizes
    @Option(help: "Run only these workloads (comma-separated: sync1, sync64, concurrent16, bulk, reopen, limited, overwrite, update).")
    var only: String?
    @Option(help: "Draw the comparison as an SVG bar chart in this file.") var svg: String?
    @Flag(help: "Print the table as Markdown too (as the README shows it).") var markdown = false

    static let workloads = ["sync1", "sync64", "concurrent16", "bulk", "reopen", "limited", "overwrite", "update"]
    static let engines = ["ferry", "ferry-now", "leveldb", "sqlite", "raw"]
    /// The workloads where Ferry's non-awaiting write form (`setValueNow`, as Firebase apps
    /// write) gets a row of its own beside the awaited `setValue`.
    static let nowWorkloads: Set<String> = ["sync64", "bulk", "overwrite"]

    /// The engines a workload runs on: every one, with `ferry-now` where it has a row; update
    /// is Ferry's alone.
    static func engines(of workload: String) -> [String] {
        if workload == "update" { return ["ferry"] }
        return engines.filter { $0 != "ferry-now" || nowWorkloads.contains(workload) }
    }

    func wants(_ w: String) -> Bool { only.map { $0.split(separator: ",").contains(Substring(w)) } ?? true }

    func run() async throws {
        var results: [String: [String: [RunResult]]] = [:]
        func child(_ workload: String, _ engine: String, _ dir: String) throws -> RunResult {
            let out = try runChild(["compare-run", workload, engine, dir] + sizes.arguments)
            guard let line = out.split(separator: "\n").last, let r = try? JSONDecoder().decode(RunResult.self, from: Data(line.utf8)) else {
                throw BenchError("bad output of compare-run \(workload) \(engine): \(out)")
            }
            return r
        }
        // update's goal compares it with bulk's single writes: bulk runs with it.
        let readsBulk = wants("reopen") || wants("limited") || wants("update")
        for workload in Self.workloads where workload != "reopen" && workload != "limited" && (wants(workload) || (workload == "bulk" && readsBulk)) {
            say("\(workload): \(sizes.operations(workload)) operations × \(common.runs) runs per engine…", json: common.json)
            for _ in 0..<common.runs {
                for engine in Self.engines(of: workload) {
                    let dir = try common.scratch("cmp-\(workload)-\(engine)")
                    results[workload, default: [:]][engine, default: []].append(try child(workload, engine, dir))
                    if workload == "bulk" && wants("limited") && ["ferry", "leveldb", "sqlite"].contains(engine) {
                        var r = try child("limited", engine, dir)
                        r.payloadBytes = results["bulk"]![engine]!.last!.payloadBytes
                        results["limited", default: [:]][engine, default: []].append(r)
                    }
                    if workload == "bulk" && wants("reopen") && engine != "ferry-now" {
                        var r = try child("reopen", engine, dir)
                        r.payloadBytes = results["bulk"]![engine]!.last!.payloadBytes
                        results["reopen", default: [:]][engine, default: []].append(r)
                        if engine == "ferry" {
                            // The same walk building each child's whole value (`value`), as an
                            // app that reads every field does.
                            var values = try child("reopen", "ferry-values", dir)
                            values.payloadBytes = r.payloadBytes
                            results["reopen", default: [:]]["ferry-values", default: []].append(values)
                            for f in try FileManager.default.contentsOfDirectory(atPath: dir) where f.hasPrefix("checkpoint-") {
                                try FileManager.default.removeItem(atPath: dir + "/" + f)
                            }
                            var replay = try child("reopen", "ferry-replay", dir)
                            replay.payloadBytes = r.payloadBytes
                            results["reopen", default: [:]]["ferry-replay", default: []].append(replay)
                        }
                    }
                    if workload == "bulk" && wants("limited") && engine == "ferry" {
                        // With a child-value index on likes, built and checkpointed in an earlier run
                        // of the app (not timed), as an app that declares it would have (after the
                        // reopen runs, which this checkpoint would otherwise serve).
                        _ = try child("limited-prepare", "ferry-indexed", dir)
                        var indexed = try child("limited", "ferry-indexed", dir)
                        indexed.payloadBytes = results["bulk"]![engine]!.last!.payloadBytes
                        results["limited", default: [:]]["ferry-indexed", default: []].append(indexed)
                        // The same query as a listener (`observe`), the open included.
                        var listener = try child("limited-observe", "ferry-indexed", dir)
                        listener.payloadBytes = indexed.payloadBytes
                        results["limited", default: [:]]["ferry-listener", default: []].append(listener)
                        // And without a declared index: the listener gets one made for it
                        // (DatabaseOptions.automaticIndexes), built from every post at the open.
                        var plain = try child("limited-observe", "ferry", dir)
                        plain.payloadBytes = indexed.payloadBytes
                        results["limited", default: [:]]["ferry-listener-plain", default: []].append(plain)
                    }
                    remove(dir)
                }
            }
        }

        var report = Report(json: common.json)
        // (bulk is reported with update, whose goal is a ratio to it)
        for workload in Self.workloads where wants(workload) || (workload == "bulk" && wants("update")) {
            for engine in Self.engines + ["ferry-values", "ferry-replay", "ferry-indexed", "ferry-listener", "ferry-listener-plain"] {
                guard let runs = results[workload]?[engine] else { continue }
                report.add(measurement(workload, engine, runs))
            }
        }
        let summary = Summary(report: report)
        if common.json {
            for line in summary.jsonLines { print(line) }
        } else {
            print("")
            for line in summary.ratioLines { print("  " + line) }
        }
        if markdown { print(""); print(summary.markdown) }
        if let svg { try Chart(report: report).svg.write(toFile: svg, atomically: true, encoding: .utf8) }
    }

    func measurement(_ workload: String, _ engine: String, _ runs: [RunResult]) -> Measurement {
        func median<T: Comparable>(_ xs: [T]) -> T { xs.sorted()[xs.count / 2] }
        var m = Measurement(area: "compare", workload: workload, engine: engine, operations: sizes.operations(workload),
                            bytes: runs[0].payloadBytes, runs: runs.map(\.seconds),
                            bytesOnDisk: median(runs.map(\.bytesOnDisk)), peakRSS: median(runs.map(\.peakRSS)))
        var notes = ["peak RSS " + humanBytes(m.peakRSS!)]
        if let after = runs.compactMap(\.bytesAfterCompaction).sorted().dropFirst(runs.count / 2).first {
            m.bytesAfterCompaction = after
            notes.append("after compaction " + humanBytes(after))
            if let c = runs.compactMap(\.compactionSeconds).sorted().dropFirst(runs.count / 2).first {
                notes.append(String(format: "(%.2f s)", c))
            }
        }
        if workload == "reopen" || workload == "limited" { notes.append(String(format: "%.3f s", m.median)) }
        if workload == "limited", let top = runs.last?.note { notes.append("top: \(top)") }
        if workload == "limited", let q = runs.compactMap(\.querySeconds).sorted().dropFirst(runs.count / 2).first {
            notes.append(String(format: "(open %.3f s + query %.4f s)", m.median - q, q))
        }
        if workload == "reopen", let q = runs.compactMap(\.querySeconds).sorted().dropFirst(runs.count / 2).first {
            notes.append(String(format: "(open + getData %.3f s, then the walk)", q))
        }
        if engine == "ferry-replay" { notes.append("no checkpoint") }
        if engine == "ferry-values" { notes.append("each child's value built") }
        if engine == "ferry-indexed" { notes.append("child-value index") }
        if engine == "ferry-listener", let note = runs.last?.note { notes.append("observe, child-value index; " + note) }
        if engine == "ferry-listener-plain", let note = runs.last?.note { notes.append("observe, no declared index (one made for it); " + note) }
        m.note = notes.joined(separator: " ")
        return m
    }
}

/// The goals of the comparison, as ratios measured in one run.
struct Summary {
    let report: Report

    func find(_ w: String, _ e: String) -> Measurement? { report.all.first { $0.workload == w && $0.engine == e } }

    /// Ferry's ops/s over the peer's (for reopen, the peer's time over Ferry's is the same number).
    func ratio(_ w: String, _ peer: String, ferry: String = "ferry") -> Double? {
        guard let f = find(w, ferry), let p = find(w, peer) else { return nil }
        return f.opsPerSecond / p.opsPerSecond
    }

    struct Goal {
        var workload: String
        var text: String
        var value: Double?
        var met: Bool?
        /// How the value is printed: a ratio, or seconds.
        var unit = "×"
    }

    /// The goals, each a ratio of Ferry's figure over a peer's in this run (absolute times are
    /// not goals: machines differ from one day to the next). Where Ferry has two write forms
    /// (`setValue` awaited, `setValueNow` with durability awaited later), the better counts.
    var goals: [Goal] {
        /// Ferry's best form's ops/s over the peer's.
        func best(_ w: String, _ peer: String) -> Double? {
            [ratio(w, peer), ratio(w, peer, ferry: "ferry-now")].compactMap { $0 }.max()
        }
        func atLeast(_ w: String, _ peer: String, _ name: String, _ goal: Double, _ what: String = "Ferry") -> Goal {
            let r = best(w, peer)
            return Goal(workload: w, text: String(format: "%@ / %@ ≥ %.2f×", what, name, goal), value: r, met: r.map { $0 >= goal })
        }
        func atMost(_ w: String, _ text: String, _ value: Double?, _ goal: Double) -> Goal {
            Goal(workload: w, text: text + String(format: " ≤ %.2f×", goal), value: value, met: value.map { $0 <= goal })
        }
        // Reopen and limited: times (LevelDB's ops/s over Ferry's is Ferry's time over LevelDB's).
        let reopenTime = ratio("reopen", "leveldb").map { 1 / $0 }
        let reopenMemory = find("reopen", "ferry")?.peakRSS.flatMap { f in find("reopen", "leveldb")?.peakRSS.map { Double(f) / Double($0) } }
        let limitedTime = ratio("limited", "leveldb", ferry: "ferry-indexed").map { 1 / $0 }
        let f = find("overwrite", "ferry")?.bytesAfterCompaction, l = find("overwrite", "leveldb")?.bytesAfterCompaction
        let overwriteBytes = f.flatMap { f in l.map { Double(f) / Double($0) } }
        // update: per post, against bulk's best single-write form in the same run.
        let single = [find("bulk", "ferry"), find("bulk", "ferry-now")].compactMap { $0?.opsPerSecond }.max()
        let update = find("update", "ferry").flatMap { u in single.map { u.opsPerSecond / $0 } }
        let out = [
            atLeast("bulk", "leveldb", "LevelDB", 1), atLeast("bulk", "sqlite", "SQLite", 1),
            atLeast("sync64", "leveldb", "LevelDB", 1.2), atLeast("sync64", "sqlite", "SQLite", 1),
            atLeast("sync1", "raw", "the raw ceiling", 0.95),
            atLeast("concurrent16", "leveldb", "LevelDB", 1.5), atLeast("concurrent16", "sqlite", "SQLite", 5),
            atLeast("overwrite", "leveldb", "LevelDB", 0.75, "Ferry, each write acknowledged,"),
            atMost("overwrite", "Ferry's bytes after compaction / LevelDB's", overwriteBytes, 1),
            atMost("reopen", "with a checkpoint, Ferry's time / LevelDB's", reopenTime, 1),
            atMost("reopen", "with a checkpoint, Ferry's peak memory / LevelDB's", reopenMemory, 1),
            atMost("limited", "top-10 query after a reopen with an index on likes, Ferry's time / LevelDB's scan's", limitedTime, 0.25),
            Goal(workload: "update", text: "multi-path updates of 1,000 posts, per post / bulk's single writes ≥ 1.00×",
                 value: update, met: update.map { $0 >= 1 }),
        ]
        return out.filter { $0.value != nil }
    }

    /// The goals as JSON lines (`{"goal": …, "workload": …, "value": …, "met": …}`), after the
    /// measurements' lines.
    var jsonLines: [String] {
        struct Line: Encodable { var goal: String; var workload: String; var value: Double; var met: Bool }
        let e = JSONEncoder()
        e.outputFormatting = [.sortedKeys]
        return goals.map { g in String(decoding: try! e.encode(Line(goal: g.text, workload: g.workload, value: g.value!, met: g.met!)), as: UTF8.self) }
    }

    var ratioLines: [String] {
        goals.map { g in
            g.workload.padding(toLength: 14, withPad: " ", startingAt: 0) + String(format: "%6.2f", g.value!) + g.unit + "   " + g.text
                + (g.met! ? "   met" : "   NOT met")
        }
    }

    var markdown: String {
        let engines = ["ferry", "leveldb", "sqlite", "raw"]
        var lines = ["| workload | Ferry | LevelDB | SQLite | raw ceiling | Ferry / LevelDB | Ferry / SQLite | Ferry / raw |",
                     "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
        for w in CompareBench.workloads {
            guard find(w, "ferry") != nil else { continue }
            var cells = [w + (w == "reopen" ? " (values read/s)" : w == "limited" ? " (queries/s)" : w == "update" ? " (posts/s, 1,000 an update)" : " (writes/s)")]
            for e in engines { cells.append(find(w, e).map { human($0.opsPerSecond) } ?? "–") }
            for e in ["leveldb", "sqlite", "raw"] { cells.append(ratio(w, e).map { String(format: "%.2f×", $0) } ?? "–") }
            lines.append("| " + cells.joined(separator: " | ") + " |")
            // Ferry's other forms of the workload, each a row of its own.
            let variants: [(engine: String, label: String)] = [
                ("ferry-now", w + ", not awaiting each write (`setValueNow`)"),
                ("ferry-indexed", "limited, with a child-value index on likes"),
                ("ferry-listener", "limited, a listener (`observe`) with the index"),
                ("ferry-listener-plain", "limited, a listener without a declared index (one made for it)"),
                ("ferry-values", "reopen, each child's whole value built (`value`)"),
                ("ferry-replay", "reopen without checkpoint"),
            ]
            for (engine, label) in variants {
                guard let m = find(w, engine) else { continue }
                var cells = [label, human(m.opsPerSecond), "", "", ""]
                for e in ["leveldb", "sqlite", "raw"] { cells.append(ratio(w, e, ferry: engine).map { String(format: "%.2f×", $0) } ?? "–") }
                lines.append("| " + cells.joined(separator: " | ") + " |")
            }
        }
        if find("overwrite", "ferry") != nil {
            var before = ["overwrite: disk before compaction"], after = ["overwrite: disk after compaction"]
            for e in engines {
                before.append(find("overwrite", e)?.bytesOnDisk.map(humanBytes) ?? "–")
                after.append(find("overwrite", e)?.bytesAfterCompaction.map(humanBytes) ?? "–")
            }
            lines.append("| " + before.joined(separator: " | ") + " | | | |")
            lines.append("| " + after.joined(separator: " | ") + " | | | |")
        }
        var rss = ["peak RSS, bulk / reopen"]
        for e in engines {
            let b = find("bulk", e)?.peakRSS.map(humanBytes) ?? "–", r = find("reopen", e)?.peakRSS.map(humanBytes) ?? "–"
            rss.append(b + " / " + r)
        }
        lines.append("| " + rss.joined(separator: " | ") + " | | | |")
        lines.append("")
        lines.append("| goal | measured | |")
        lines.append("| --- | ---: | --- |")
        for g in goals { lines.append("| \(g.workload): \(g.text) | " + String(format: "%.2f", g.value!) + g.unit + " | " + (g.met! ? "met" : "**not met**") + " |") }
        return lines.joined(separator: "\n")
    }
}

/// The comparison as a bar chart: per workload, one bar per engine, as long as its ops/s
/// against the fastest engine of that workload; for overwrite, also the bytes left after
/// compaction (shorter is better).
struct Chart {
    let report: Report

    var svg: String {
        let colors = ["ferry": "#1f77b4", "ferry-now": "#6baed6", "ferry-replay": "#9ecae1", "leveldb": "#ff7f0e", "sqlite": "#2ca02c", "raw": "#7f7f7f"]
        let names = ["ferry": "Ferry", "ferry-now": "Ferry, setValueNow", "ferry-replay": "Ferry, no checkpoint", "leveldb": "LevelDB", "sqlite": "SQLite", "raw": "raw ceiling"]
        let order = ["ferry", "ferry-now", "ferry-replay", "leveldb", "sqlite", "raw"]
        let labelWidth = 170.0, barMax = 520.0, barHeight = 16.0, gap = 4.0
        var y = 40.0
        var body: [String] = []
        func esc(_ s: String) -> String { s.replacingOccurrences(of: "&", with: "&amp;").replacingOccurrences(of: "<", with: "&lt;") }
        func group(_ title: String, _ bars: [(String, Double, String)]) {
            body.append(#"<text x="10" y="\#(y + 12)" font-weight="bold">\#(esc(title))</text>"#)
            y += 20
            let top = bars.map(\.1).max() ?? 1
            for (engine, value, label) in bars {
                let w = max(1, barMax * value / top)
                body.append(#"<text x="\#(labelWidth - 6)" y="\#(y + 12)" text-anchor="end">\#(esc(names[engine] ?? engine))</text>"#)
                body.append(#"<rect x="\#(labelWidth)" y="\#(y)" width="\#(String(format: "%.1f", w))" height="\#(barHeight)" fill="\#(colors[engine] ?? "#333")"/>"#)
                body.append(#"<text x="\#(labelWidth + w + 6)" y="\#(y + 12)">\#(esc(label))</text>"#)
                y += barHeight + gap
            }
            y += 12
        }
        for w in CompareBench.workloads {
            let ms = order.compactMap { e in report.all.first { $0.workload == w && $0.engine == e } }
            guard !ms.isEmpty else { continue }
            let unit = w == "reopen" ? "values read/s" : w == "limited" ? "top-10 queries/s after a reopen"
                : w == "update" ? "posts/s in updates of 1,000" : "writes/s"
            group("\(w) — \(unit) (longer is better)", ms.map { ($0.engine, $0.opsPerSecond, human($0.opsPerSecond)) })
            if w == "overwrite" {
                let after = ms.compactMap { m in m.bytesAfterCompaction.map { (m.engine, Double($0), humanBytes($0)) } }
                group("overwrite — bytes on disk after compaction (shorter is better)", after)
            }
        }
        let height = Int(y + 10)
        return """
            <svg xmlns="http://www.w3.org/2000/svg" width="800" height="\(height)" font-family="sans-serif" font-size="12">
            <rect width="800" height="\(height)" fill="white"/>
            <text x="10" y="22" font-size="15" font-weight="bold">ferry-bench compare: medians of each engine's runs, same data and durability</text>
            \(body.joined(separator: "\n"))
            </svg>

            """
    }
}
