import ArgumentParser
import FerryDocuments
import FerryLog
import Foundation

/// `ferry-bench documents`: the document model's local queries with and without indexes, its
/// writes beside LevelDB and SQLite holding the same bytes, and its reopen.
struct DocumentsBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "documents",
        abstract: "Document queries without an index, with a configured one and an auto-created one; building an index; the first query after a reopen; setData beside LevelDB and SQLite; reopen.",
        discussion: """
            queries: --documents documents of ~200 bytes in one collection; four queries that each return 50 \
            (equality; range + order + limit; array-contains; an OR of two equalities), each run --repeats times per run \
            without an index (a scan), with setIndexConfiguration's index, and with the index auto-creation made. \
            build: setIndexConfiguration of one index over the documents. reopen-query: open the store (indexes rebuilt) \
            and the first snapshot of the range query, against one full scan. writes: --writes setDataNow of ~200-byte \
            documents and one sync, beside LevelDB and SQLite writing the same posts (compare's bulk). reopen: open and \
            count every document, beside LevelDB's and SQLite's open and scan (each in a process of its own, for its \
            peak memory). Goals: indexed ≥ 100× faster than a scan; a build ≤ 1 s; the first query after a reopen \
            ≤ 0.25× a scan; writes ≥ 1× LevelDB and SQLite; reopen time and peak memory ≤ LevelDB's. \
            sync (ferry-server's Firestore API, a child process on loopback): drain: --drain setDataNow written \
            offline, then the time until FirestoreConnection has every one committed (goal ≥ 20,000 documents/s); \
            fan-out: --streams Listen streams on one query (one gRPC connection), one writer committing \
            --fan-out-documents documents in commits of 100; changes delivered per second to all streams, and \
            each change's latency from its commit's send (goal ≥ 100,000 changes/s).
            """)
    @OptionGroup var common: CommonOptions
    @Option(help: "Documents of the query workloads.") var documents = 100_000
    @Option(help: "Times each query runs per measurement.") var repeats = 20
    @Option(help: "Documents of the write and reopen workloads.") var writes = 1_000_000
    @Option(help: "Documents of the sync drain.") var drain = 100_000
    @Option(help: "Listen streams of the sync fan-out.") var streams = 100
    @Option(help: "Documents the fan-out's writer commits (each delivered to every stream).") var fanOutDocuments = 10_000
    @Option(help: "Run only these parts (comma-separated: queries, writes, sync).") var only: String?

    func wants(_ part: String) -> Bool { only.map { $0.split(separator: ",").contains(Substring(part)) } ?? true }

    func run() async throws {
        var report = Report(json: common.json)
        var goals: [String] = []
        if wants("queries") { try await queries(&report, &goals) }
        if wants("writes") { try await writesAndReopen(&report, &goals) }
        if wants("sync") { try await sync(&report, &goals) }
        say("\ngoals:", json: common.json)
        for g in goals { say("  " + g, json: common.json) }
    }

    /// The document i of the query data set: 50 per author, 50 per tag, 25 per category.
    static func document(_ i: Int, of n: Int) -> [String: Any] {
        [
            "author": "a\(i % (n / 50))",
            "score": i,
            "category": "c\(i % (n / 25))",
            "tags": ["t\(i % (n / 50))", "common"],
            "title": "Post number \(i) of the query bench",
            "body": "offline ferry river sync cache write listen query crossing harbor tide dock north",
        ]
    }

    static let indexConfiguration = """
        {"indexes": [{"collectionGroup": "posts", "queryScope": "COLLECTION", "fields": [{"fieldPath": "score", "order": "ASCENDING"}]}],
         "fieldOverrides": [
           {"collectionGroup": "posts", "fieldPath": "author", "indexes": [{"order": "ASCENDING", "queryScope": "COLLECTION"}]},
           {"collectionGroup": "posts", "fieldPath": "category", "indexes": [{"order": "ASCENDING", "queryScope": "COLLECTION"}]},
           {"collectionGroup": "posts", "fieldPath": "tags", "indexes": [{"arrayConfig": "CONTAINS", "queryScope": "COLLECTION"}]}]}
        """

    func queries(_ report: inout Report, _ goals: inout [String]) async throws {
        let n = documents
        let dir = try common.scratch("documents")
        defer { remove(dir) }
        var settings = FirestoreSettings()
        settings.durability = .none
        var db = try Firestore.open(at: dir + "/store", settings: settings)
        let posts = db.collection("posts")
        for i in 0..<n { try posts.document("p\(i)").setDataNow(Self.document(i, of: n)) }
        try await db.sync()
        func named(_ db: Firestore) -> [(String, Query)] {
            let p = db.collection("posts")
            return [
                ("equality", p.whereField("author", isEqualTo: "a7")),
                ("range-order", p.whereField("score", isGreaterThanOrEqualTo: n / 2).order(by: "score").limit(to: 50)),
                ("array-contains", p.whereField("tags", arrayContains: "t7")),
                ("or", p.whereFilter(.orFilter([.whereField("category", isEqualTo: "c7"), .whereField("category", isEqualTo: "c8")]))),
            ]
        }
        let repeats = self.repeats
        func time(_ q: Query) async throws -> [Double] {
            try await measure(runs: common.runs, prepare: {}) { _ in
                for _ in 0..<repeats {
                    let s = try await q.getDocuments(source: .cache)
                    guard s.count == 50 else { throw BenchError("a query returned \(s.count) documents, not 50") }
                }
            }
        }
        var scanSeconds: [String: Double] = [:]
        for (name, q) in named(db) {
            let m = Measurement(area: "documents", workload: "query-\(name)", engine: "scan", operations: repeats, bytes: 0, runs: try await time(q))
            scanSeconds[name] = m.median / Double(repeats)
            report.add(m)
        }
        // One index, built at once (then the four the queries use).
        var builds: [Double] = []
        for _ in 0..<common.runs {
            try await db.persistentCacheIndexManager?.deleteAllIndexes()
            let buildStart = ContinuousClock.now
            try await db.setIndexConfiguration(#"{"indexes": [{"collectionGroup": "posts", "queryScope": "COLLECTION", "fields": [{"fieldPath": "author", "order": "ASCENDING"}]}]}"#)
            builds.append(seconds(buildStart.duration(to: .now)))
        }
        let build = builds.sorted()[builds.count / 2]
        report.add(Measurement(area: "documents", workload: "index-build", engine: "ferry", operations: n, bytes: 0, runs: builds,
                               note: "one index (author) over \(n) documents"))
        try await db.setIndexConfiguration(Self.indexConfiguration)
        var indexedSeconds: [String: Double] = [:]
        for (name, q) in named(db) {
            let m = Measurement(area: "documents", workload: "query-\(name)", engine: "indexed", operations: repeats, bytes: 0, runs: try await time(q))
            indexedSeconds[name] = m.median / Double(repeats)
            report.add(m)
        }
        // Auto-created: no configured index; the first run of each query makes one.
        try await db.persistentCacheIndexManager?.deleteAllIndexes()
        db.persistentCacheIndexManager?.enableIndexAutoCreation()
        var autoSeconds: [String: Double] = [:]
        for (name, q) in named(db) {
            _ = try await q.getDocuments(source: .cache)
            let m = Measurement(area: "documents", workload: "query-\(name)", engine: "auto-index", operations: repeats, bytes: 0, runs: try await time(q))
            autoSeconds[name] = m.median / Double(repeats)
            report.add(m)
        }
        // The first snapshot of the range query after a reopen, with the configured indexes.
        try await db.persistentCacheIndexManager?.deleteAllIndexes()
        try await db.setIndexConfiguration(Self.indexConfiguration)
        try await db.terminate()
        var reopenRuns: [Double] = [], firstQueryRuns: [Double] = []
        for _ in 0..<common.runs {
            let start = ContinuousClock.now
            db = try Firestore.open(at: dir + "/store", settings: settings)
            let opened = ContinuousClock.now
            let range = named(db)[1].1
            let snaps = range.snapshots()
            var it = snaps.makeAsyncIterator()
            guard let first = try await it.next(), first.count == 50 else { throw BenchError("the first snapshot after a reopen is not 50 documents") }
            firstQueryRuns.append(seconds(opened.duration(to: .now)))
            reopenRuns.append(seconds(start.duration(to: opened)))
            try await db.terminate()
        }
        report.add(Measurement(area: "documents", workload: "reopen-open", engine: "ferry", operations: n, bytes: 0, runs: reopenRuns, note: "open: replay and index builds"))
        report.add(Measurement(area: "documents", workload: "reopen-first-query", engine: "ferry", operations: 1, bytes: 0, runs: firstQueryRuns))
        let firstQuery = firstQueryRuns.sorted()[firstQueryRuns.count / 2]

        for (name, _) in named(db) {
            let s = scanSeconds[name]!, ix = indexedSeconds[name]!, au = autoSeconds[name]!
            goals.append(String(format: "%@: indexed %.0fx, auto-indexed %.0fx faster than a scan (goal ≥ 100x): %@", name, s / ix, s / au,
                                s / ix >= 100 && s / au >= 100 ? "met" : "not met"))
        }
        goals.append(String(format: "building an index over %d documents: %.3f s (goal ≤ 1 s): %@", n, build, build <= 1 ? "met" : "not met"))
        let scan = scanSeconds["range-order"]!
        goals.append(String(format: "first range query after a reopen: %.4f s = %.3fx a scan (%.4f s) (goal ≤ 0.25x): %@", firstQuery, firstQuery / scan, scan,
                            firstQuery / scan <= 0.25 ? "met" : "not met"))
    }

    func writesAndReopen(_ report: inout Report, _ goals: inout [String]) async throws {
        var write: [String: [RunResult]] = [:], reopen: [String: [RunResult]] = [:]
        for _ in 0..<common.runs {
            for engine in ["ferry-docs", "leveldb", "sqlite"] {
                let dir = try common.scratch("docs-\(engine)")
                defer { remove(dir) }
                let sizes = ["--records", String(writes)]
                let w = engine == "ferry-docs" ? ["documents-run", "write", dir, "--writes", String(writes)] : ["compare-run", "bulk", engine, dir] + sizes
                write[engine, default: []].append(try JSONDecoder().decode(RunResult.self, from: Data(runChild(w).utf8)))
                let r = engine == "ferry-docs" ? ["documents-run", "reopen", dir, "--writes", String(writes)] : ["compare-run", "reopen", engine, dir] + sizes
                reopen[engine, default: []].append(try JSONDecoder().decode(RunResult.self, from: Data(runChild(r).utf8)))
            }
        }
        func median(_ rs: [RunResult], _ f: (RunResult) -> Double) -> Double { let v = rs.map(f).sorted(); return v[v.count / 2] }
        for engine in ["ferry-docs", "leveldb", "sqlite"] {
            report.add(Measurement(area: "documents", workload: "writes", engine: engine, operations: writes, bytes: write[engine]![0].payloadBytes,
                                   runs: write[engine]!.map(\.seconds), bytesOnDisk: write[engine]!.last!.bytesOnDisk))
            report.add(Measurement(area: "documents", workload: "reopen", engine: engine, operations: writes, bytes: 0,
                                   runs: reopen[engine]!.map(\.seconds), peakRSS: Int(median(reopen[engine]!) { Double($0.peakRSS) }),
                                   note: "peak memory " + humanBytes(Int(median(reopen[engine]!) { Double($0.peakRSS) }))))
        }
        let fw = median(write["ferry-docs"]!, \.seconds)
        for peer in ["leveldb", "sqlite"] {
            let r = median(write[peer]!, \.seconds) / fw
            goals.append(String(format: "writes: %.2fx %@ (goal ≥ 1x): %@", r, peer, r >= 1 ? "met" : "not met"))
        }
        let ft = median(reopen["ferry-docs"]!, \.seconds), lt = median(reopen["leveldb"]!, \.seconds)
        let fm = median(reopen["ferry-docs"]!) { Double($0.peakRSS) }, lm = median(reopen["leveldb"]!) { Double($0.peakRSS) }
        goals.append(String(format: "reopen with %d documents: time %.2fx, peak memory %.2fx LevelDB's open and scan (goal ≤ 1x each): %@", writes, ft / lt, fm / lm,
                            ft <= lt && fm <= lm ? "met" : "not met"))
    }
}

/// `ferry-bench documents-run write|reopen DIR`: one document measurement in a process of its own.
struct DocumentsRun: AsyncParsableCommand {
    static let configuration = CommandConfiguration(commandName: "documents-run", shouldDisplay: false)
    @Argument var workload: String
    @Argument var directory: String
    @Option var writes = 1_000_000

    func run() async throws {
        var settings = FirestoreSettings()
        settings.durability = .none
        settings.cacheSettings = .persistent(sizeBytes: FirestoreSettings.cacheSizeUnlimited)
        var result = RunResult(seconds: 0, bytesOnDisk: 0, peakRSS: 0)
        let clock = ContinuousClock()
        switch workload {
        case "write":
            // The posts of compare's bulk, as documents: the same fields and about the same bytes.
            let data = Dataset(count: writes)
            var docs: [[String: Any]] = []
            docs.reserveCapacity(writes)
            for i in 0..<writes {
                let object = try data.withRecord(i) { try JSONSerialization.jsonObject(with: Data($0)) }
                docs.append(object as! [String: Any])
            }
            result.payloadBytes = data.payloadBytes
            let db = try Firestore.open(at: directory, settings: settings)
            let posts = db.collection("posts")
            let start = clock.now
            for i in 0..<writes {
                let id = String(Dataset.key(i).dropFirst("/posts/".count))
                try posts.document(id).setDataNow(docs[i])
            }
            try await db.sync()
            result.seconds = seconds(start.duration(to: clock.now))
            try await db.terminate()
        case "reopen":
            let start = clock.now
            let db = try Firestore.open(at: directory, settings: settings)
            let all = try await db.collection("posts").count.getAggregation(source: .cache)
            guard all.count.intValue == writes else { throw BenchError("reopen found \(all.count) documents, not \(writes)") }
            result.seconds = seconds(start.duration(to: clock.now))
            try await db.terminate()
        default:
            throw BenchError("unknown documents workload \(workload)")
        }
        result.bytesOnDisk = directorySize(directory)
        result.peakRSS = peakResidentBytes()
        let e = JSONEncoder()
        print(String(decoding: try e.encode(result), as: UTF8.self))
    }
}
