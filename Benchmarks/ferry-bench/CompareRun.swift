import ArgumentParser
@_spi(Server) import Ferry
import FerryLog
import Foundation
import Synchronization

/// What one workload on one engine measured, in a child process of its own (so that its peak
/// memory is its own).
struct RunResult: Codable {
    /// Seconds of the timed part.
    var seconds: Double
    /// Bytes of keys and values the timed part wrote or read.
    var payloadBytes = 0
    /// Bytes the store takes on disk at the end (before compaction for `overwrite`).
    var bytesOnDisk: Int
    /// For `overwrite`: bytes after compaction.
    var bytesAfterCompaction: Int?
    /// For `overwrite`: seconds the compaction took.
    var compactionSeconds: Double?
    var peakRSS: Int
    /// For `limited`: the key with the most likes (the engines must agree).
    var note: String?
    /// For `limited` on Ferry: seconds from the open's return to the first event; for
    /// `reopen`: seconds from the start to `getData()`'s return (before the walk).
    var querySeconds: Double?
}

/// The sizes of the shared workloads (the same for every engine).
struct CompareSizes: ParsableArguments {
    @Option(help: "Writes of the bulk workload (and values read back by reopen).") var records = 1_000_000
    @Option(help: "Writes of sync1 (one durable commit each).") var sync1Records = 2_000
    @Option(help: "Writes of sync64 (a durable commit per 64).") var sync64Records = 64_000
    @Option(help: "Writes of concurrent16, shared by its 16 writers.") var concurrentRecords = 4_000
    @Option(help: "Keys of overwrite.") var overwriteKeys = 100_000
    @Option(help: "Times overwrite writes each key.") var overwriteRounds = 10

    var arguments: [String] {
        ["--records", String(records), "--sync1-records", String(sync1Records), "--sync64-records", String(sync64Records),
         "--concurrent-records", String(concurrentRecords), "--overwrite-keys", String(overwriteKeys),
         "--overwrite-rounds", String(overwriteRounds)]
    }

    func operations(_ workload: String) -> Int {
        switch workload {
        case "sync1": sync1Records
        case "sync64": sync64Records
        case "concurrent16": concurrentRecords
        case "overwrite": overwriteKeys * overwriteRounds
        case "limited": 1  // one query over every post
        default: records
        }
    }
}

/// `ferry-bench compare-run WORKLOAD ENGINE DIR`: one measurement, printed as JSON. The parent
/// (`compare`) runs it once per engine and run.
struct CompareRun: AsyncParsableCommand {
    /// Posts per multi-path update in `update` (also `bulk` on `ferry-batch`).
    static let batchSize = 1_000
    static let configuration = CommandConfiguration(commandName: "compare-run", shouldDisplay: false)
    @Argument var workload: String
    @Argument var engine: String
    @Argument var directory: String
    @OptionGroup var sizes: CompareSizes

    func run() async throws {
        // Read once: an @Argument's getter in a loop looks up generic metadata on every
        // iteration (3% of a bulk write's thread in the profile, paid by every engine).
        let workload = self.workload, engine = self.engine
        let n = sizes.operations(workload)
        // Overwrite writes each key `rounds` times with a different post each time.
        // Reopen generates nothing: its peak memory is the open's and the reads'.
        let reads = workload == "reopen" || workload == "limited-observe"
        let data = Dataset(count: reads ? 0 : n)
        let keys = (0..<(reads ? 0 : workload == "overwrite" ? sizes.overwriteKeys : n)).map { Dataset.key($0) }
        var result = RunResult(seconds: 0, bytesOnDisk: 0, peakRSS: 0)
        if !reads { result.payloadBytes = data.payloadBytes + (0..<n).reduce(0) { $0 + keys[$1 % keys.count].utf8.count } }
        let clock = ContinuousClock()
        @Sendable func key(_ i: Int) -> String { keys[i % keys.count] }

        switch (workload, engine) {
        case ("observe-stall", _):
            // Not a compare workload: how long writes from another task wait while a listener
            // of every post is added (`ferry-bench compare-run observe-stall ferry DIR` on a bulk store).
            var options = DatabaseOptions(durability: .none)
            options.checkpointOnClose = false
            let db = try Database.open(at: directory, options: options)
            let stop = Mutex(false)
            let worst = Mutex(0.0)
            let writer = Task {
                var i = 0
                while !stop.withLock({ $0 }) {
                    let t = clock.now
                    _ = try await db.reference("other/w\(i % 100)").setValue(.int(Int64(i)))
                    let waited = seconds(t.duration(to: clock.now))
                    worst.withLock { $0 = max($0, waited) }
                    i += 1
                    try await Task.sleep(for: .milliseconds(1))
                }
            }
            try await Task.sleep(for: .milliseconds(200))
            let start = clock.now
            let first = Mutex<Double?>(nil)
            _ = try db.reference("posts").observe(.value) { _ in first.withLock { if $0 == nil { $0 = seconds(start.duration(to: clock.now)) } } }
            while first.withLock({ $0 }) == nil { try await Task.sleep(for: .milliseconds(5)) }
            try await Task.sleep(for: .milliseconds(200))
            stop.withLock { $0 = true }
            try await writer.value
            result.seconds = first.withLock { $0 } ?? 0
            result.note = String(format: "a write waited at most %.1f ms", worst.withLock { $0 } * 1000)
            try await db.close()

        case ("limited-observe", _):
            // Not a compare workload: a listener of the top 10 by likes on a bulk store (`engine`
            // ferry-indexed declares the index), the time to its first event, then the time of
            // writes that move a child out of the window (each pulls in the next child). Engine
            // ferry-priority: the last 10 in Firebase's default order (by priority; the posts have
            // none, so by key), and the writes remove a post of the window.
            var options = DatabaseOptions(durability: .none)
            options.checkpointOnClose = false
            if engine == "ferry-indexed" { options.indexes = [ChildIndex(location: "posts", child: "likes")] }
            let start = clock.now  // (the open counts: a new user's first event after a reopen)
            let db = try Database.open(at: directory, options: options)
            let window = Mutex<(first: Double?, keys: [String])>((nil, []))
            let byPriority = engine == "ferry-priority"
            let query = byPriority ? try db.reference("posts").queryLimited(toLast: 10)
                : try db.reference("posts").queryOrdered(byChild: "likes").queryLimited(toLast: 10)
            _ = query.observe(.value) { s in
                window.withLock { w in
                    if w.first == nil { w.first = seconds(start.duration(to: clock.now)) }
                    w.keys = s.children.map { $0.key! }
                }
            }
            while window.withLock({ $0.first }) == nil { try await Task.sleep(for: .milliseconds(5)) }
            var worst = 0.0
            for _ in 0..<5 {
                let top = window.withLock { $0.keys.last! }
                let t = clock.now
                if byPriority {
                    try await db.reference("posts").child(top).removeValue()
                } else {
                    try await db.reference("posts").child(top).child("likes").setValue(.int(-1))
                }
                worst = max(worst, seconds(t.duration(to: clock.now)))
            }
            result.seconds = window.withLock { $0.first } ?? 0
            result.note = String(format: "a write moving a child out of the window took at most %.1f ms", worst * 1000)
            try await db.close()

        case ("limited-prepare", _):
            // An earlier run of the app that declared the index: it is built at the first query and
            // kept in the checkpoint written on close.
            var options = DatabaseOptions(durability: .none)
            options.indexes = [ChildIndex(location: "posts", child: "likes")]
            let db = try Database.open(at: directory, options: options)
            _ = try await db.reference("posts").queryOrdered(byChild: "likes").queryLimited(toLast: 10).getData()
            try await db.close()

        case ("limited", _):
            // A new user's first query after a reopen: the 10 posts with the most likes.
            let start = clock.now
            var top: [String]
            var opened: Database?
            switch engine {
            case "ferry", "ferry-indexed":
                var options = DatabaseOptions(durability: .none)
                options.checkpointOnClose = false
                if engine == "ferry-indexed" { options.indexes = [ChildIndex(location: "posts", child: "likes")] }
                let db = try Database.open(at: directory, options: options)
                opened = db
                let asked = clock.now
                let query = try db.reference("posts").queryOrdered(byChild: "likes").queryLimited(toLast: 10)
                top = try await query.observeSingleEvent().children.map { "/posts/" + $0.key! }
                result.querySeconds = seconds(asked.duration(to: clock.now))
            case "leveldb":
                top = try LevelDB(path: directory).topByLikes(10)
            case "sqlite":
                top = try SQLite(path: directory + "/kv.sqlite").topByLikes(10)
            default: throw BenchError("limited has no \(engine) engine")
            }
            result.seconds = seconds(start.duration(to: clock.now))
            try await opened?.close()
            guard top.count == 10 else { throw BenchError("\(engine) found \(top.count) of the top 10") }
            result.note = top.last

        case ("reopen", _):
            let start = clock.now
            let count: Int
            var opened: Database?  // closed after the clock stops
            switch engine {
            case "ferry", "ferry-replay", "ferry-values":
                var options = DatabaseOptions(durability: .none)
                options.checkpointOnClose = false
                let db = try Database.open(at: directory, options: options)
                opened = db
                // Every value: the snapshot of /posts is read lazily, and walked a child at a
                // time (memory stays what the open needs), each child's stored bytes read and
                // checked, as LevelDB's and SQLite's scans read each value's bytes; decoded as far
                // as asked — here one byte, or (ferry-values) the whole value built.
                let posts = try await db.reference("posts").getData()
                result.querySeconds = seconds(start.duration(to: clock.now))  // open + getData
                var n = 0
                if engine == "ferry-values" {
                    try posts.forEachChild { if case .object = $0.value { n += 1 } }
                } else {
                    try posts.forEachChild { if $0.hasChildren { n += 1 } }
                }
                count = n
            case "leveldb": count = try LevelDB(path: directory).scan().count
            case "sqlite": count = try SQLite(path: directory + "/kv.sqlite").scan()
            case "raw": count = RawCeiling.replay(path: directory + "/raw.log")
            default: throw BenchError("unknown engine \(engine) for reopen")
            }
            result.seconds = seconds(start.duration(to: clock.now))
            try await opened?.close()
            guard count == sizes.records else { throw BenchError("\(engine) read \(count) of \(sizes.records) values") }

        case ("update", "ferry"), ("bulk", "ferry-batch"):
            // Firebase's multi-path update: the posts a thousand at a time, each batch one write
            // (one record, one pass over the pending writes), not awaited (`updateChildValuesNow`).
            let db = try Database.open(at: directory, options: DatabaseOptions(durability: .none))
            try await db.applyServerPut(at: "posts", [:])
            let posts = try db.reference("posts")
            // The updates are made before the clock runs, as every workload's inputs are (an
            // app has its values at hand; parsing JSON into them is not the update's work).
            var batches: [[String: Value]] = []
            batches.reserveCapacity(n / CompareRun.batchSize + 1)
            for first in stride(from: 0, to: n, by: CompareRun.batchSize) {
                var batch: [String: Value] = [:]
                batch.reserveCapacity(CompareRun.batchSize)
                for j in first..<min(n, first + CompareRun.batchSize) {
                    batch[String(key(j).dropFirst("/posts/".count))] = try data.withRecord(j) { try Value(jsonBytes: Array($0)) }
                }
                batches.append(batch)
            }
            let start = clock.now
            for batch in batches { try posts.updateChildValuesNow(batch) }
            try await db.sync()
            result.seconds = seconds(start.duration(to: clock.now))
            try await db.close()

        case (_, "ferry"), (_, "ferry-now"):
            let now = engine == "ferry-now"
            var options = DatabaseOptions(durability: workload == "sync1" || workload == "concurrent16" ? .fsync : .none)
            options.compactionSegments = nil  // overwrite compacts when asked, after measuring the bytes before
            // Overwrite's live data (100,000 posts, ~21 MB) is over the default cache limit: with
            // it, eviction would drop acknowledged posts, and the bytes compared would not hold
            // them all. The peers keep everything; so does Ferry here (checked below). (With no
            // limit, segments are the default 8 MiB, not an eighth of a limit.)
            if workload == "overwrite" { options.cacheSizeBytes = .unlimited }
            let db = try Database.open(at: directory, options: options)
            // As in an app that has synced: the server said /posts was empty, so that /posts,
            // with the local writes on top, reads complete (reopen reads it whole).
            if workload == "bulk" { try await db.applyServerPut(at: "posts", [:]) }
            let start = clock.now
            switch workload {
            case "concurrent16":
                try await withThrowingTaskGroup(of: Void.self) { group in
                    for w in 0..<16 {
                        group.addTask {
                            for i in stride(from: w, to: n, by: 16) {
                                _ = try await db.reference(String(key(i).dropFirst())).setValue(jsonBytes: data.withRecord(i) { Array($0) })
                            }
                        }
                    }
                    try await group.waitForAll()
                }
            case _ where now:
                // Firebase's usual form: apply and order each write at once, observe durability
                // at the commit points; acknowledgements arrive a batch at a time (the cursor).
                for i in 0..<n {
                    let receipt = try db.reference(String(key(i).dropFirst())).setValueNow(jsonBytes: data.withRecord(i) { Array($0) })
                    if workload == "sync64" && i % 64 == 63 { try await db.sync() }
                    if workload == "overwrite" && i % 64 == 63 { try await db.acknowledgeWrites(through: receipt.writeID!) }
                }
                if workload == "overwrite", let last = db.pendingWriteIDs.last { try await db.acknowledgeWrites(through: last) }
                try await db.sync()
            default:
                for i in 0..<n {
                    let receipt = try await db.reference(String(key(i).dropFirst())).setValue(jsonBytes: data.withRecord(i) { Array($0) })
                    if workload == "sync64" && i % 64 == 63 { try await db.sync() }
                    // The server's acknowledgement, as the sync layer applies it (in write
                    // order: the cursor), here one per write.
                    if workload == "overwrite" { try await db.acknowledgeWrites(through: receipt.writeID!) }
                }
                try await db.sync()
            }
            result.seconds = seconds(start.duration(to: clock.now))
            try await db.close()
            if workload == "overwrite" {
                var options = DatabaseOptions(durability: .none)
                options.compactionSegments = nil
                options.cacheSizeBytes = .unlimited
                let db = try Database.open(at: directory, options: options)
                result.bytesOnDisk = directorySize(directory)
                let c = clock.now
                try await db.compact()
                result.compactionSeconds = seconds(c.duration(to: clock.now))
                // Every key still reads its last post (every 7th key checked, after the timing).
                for k in stride(from: 0, to: n >= keys.count ? keys.count : 0, by: 7) {
                    let last = n - keys.count + k
                    let want = try data.withRecord(last) { try Value(jsonBytes: Array($0)) }
                    guard try await db.reference(String(keys[k].dropFirst())).getData().value == want else {
                        throw BenchError("overwrite: \(keys[k]) does not read its last value after compaction")
                    }
                }
                try await db.close()
                result.bytesAfterCompaction = directorySize(directory)
            }

        case (_, "leveldb"):
            let db = try LevelDB(path: directory, sync: workload == "sync1" || workload == "concurrent16")
            let start = clock.now
            @Sendable func put(_ i: Int, sync: Bool = false) throws {
                try key(i).utf8CString.withUnsafeBytes { k in
                    try data.withRecord(i) { v in try db.put(UnsafeRawBufferPointer(rebasing: k.dropLast()), v, sync: sync) }
                }
            }
            switch workload {
            case "concurrent16":
                try onThreads(16) { w in for i in stride(from: w, to: n, by: 16) { try put(i) } }
            default:
                for i in 0..<n {
                    try put(i, sync: (workload == "sync64" && i % 64 == 63) || i == n - 1)
                }
            }
            result.seconds = seconds(start.duration(to: clock.now))
        case (_, "sqlite"):
            let db = try SQLite(path: directory + "/kv.sqlite")
            let lock = NSLock()
            @Sendable func put(_ i: Int) throws {
                try key(i).utf8CString.withUnsafeBytes { k in
                    try data.withRecord(i) { v in try db.put(UnsafeRawBufferPointer(rebasing: k.dropLast()), v) }
                }
            }
            let start = clock.now
            switch workload {
            case "sync1":
                for i in 0..<n { try put(i) }
            case "concurrent16":
                // One connection, as an app shares it; SQLite commits one writer at a time.
                try onThreads(16) { w in
                    for i in stride(from: w, to: n, by: 16) {
                        lock.lock()
                        defer { lock.unlock() }
                        try put(i)
                    }
                }
            case "sync64":
                for i in 0..<n {
                    if i % 64 == 0 { try db.exec("BEGIN") }
                    try put(i)
                    if i % 64 == 63 || i == n - 1 { try db.exec("COMMIT") }
                }
            default:
                try db.exec("BEGIN")
                for i in 0..<n { try put(i) }
                try db.exec("COMMIT")
            }
            result.seconds = seconds(start.duration(to: clock.now))
        case (_, "raw"):
            var raw = RawCeiling(path: directory + "/raw.log")
            let start = clock.now
            let every = workload == "sync1" ? 1 : workload == "concurrent16" ? 16 : workload == "sync64" ? 64 : n
            for i in 0..<n {
                key(i).utf8CString.withUnsafeBytes { k in data.withRecord(i) { v in raw.add(UnsafeRawBufferPointer(rebasing: k.dropLast()), v) } }
                if i % every == every - 1 { raw.commit() }
            }
            raw.commit()
            result.seconds = seconds(start.duration(to: clock.now))
            raw.close()
        default:
            throw BenchError("unknown engine \(engine) for \(workload)")
        }

        // Overwrite: reopen, bytes before, compact, bytes after (LevelDB and SQLite; Ferry did its own above).
        if workload == "overwrite" && engine == "leveldb" {
            let db = try LevelDB(path: directory)
            result.bytesOnDisk = directorySize(directory)
            let c = clock.now
            db.compactAll()
            result.compactionSeconds = seconds(c.duration(to: clock.now))
            result.bytesAfterCompaction = directorySize(directory)
        } else if workload == "overwrite" && engine == "sqlite" {
            let db = try SQLite(path: directory + "/kv.sqlite")
            result.bytesOnDisk = directorySize(directory)
            let c = clock.now
            try db.exec("PRAGMA wal_checkpoint(TRUNCATE)")
            try db.exec("VACUUM")
            try db.exec("PRAGMA wal_checkpoint(TRUNCATE)")
            result.compactionSeconds = seconds(c.duration(to: clock.now))
            result.bytesAfterCompaction = directorySize(directory)
        } else if workload == "overwrite" && engine == "raw" {
            result.bytesOnDisk = directorySize(directory)
            result.bytesAfterCompaction = result.bytesOnDisk  // an append-only file has no compaction
        } else if workload != "overwrite" {
            result.bytesOnDisk = directorySize(directory)
        }
        result.peakRSS = peakResidentBytes()
        let e = JSONEncoder()
        print(String(decoding: try e.encode(result), as: UTF8.self))
    }
}

func seconds(_ d: Duration) -> Double { Double(d.components.seconds) + Double(d.components.attoseconds) / 1e18 }

/// Runs `body(i)` on `count` threads of their own at once and waits for all of them.
func onThreads(_ count: Int, _ body: @escaping @Sendable (Int) throws -> Void) throws {
    let group = DispatchGroup()
    let firstError = Mutex<(any Error)?>(nil)
    for i in 0..<count {
        group.enter()
        let t = Thread {
            do { try body(i) } catch { firstError.withLock { if $0 == nil { $0 = error } } }
            group.leave()
        }
        t.start()
    }
    group.wait()
    if let error = firstError.withLock({ $0 }) { throw error }
}
