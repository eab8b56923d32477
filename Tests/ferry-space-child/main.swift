// A child process for the eviction and compaction crash tests: it runs a database with a small
// cache limit until a crash point (FERRY_CRASH_AT, see FerryLog's CrashPoint) kills it.
//
//   ferry-space-child run DIR ITERATIONS
//       Opens the database in DIR (cache limit 1 MB, durability .none), pins "pinned", listens
//       to "listened", then for i in 0..<ITERATIONS: every 10th, server puts of pinned/count and
//       listened/count = i; every 25th, a local write mine/m<i> = i, printing "wrote i ID" once
//       durable, and the server acknowledges the writes older than the last two, printing
//       "acking ID" before and "acked ID" once durable; then a server put of bulk/b<i> (a 2 KB value that depends on i
//       only). Every 10th, once all is durable (`sync`), it prints "ack i". "done" at the end.
#if canImport(Glibc)
import Glibc
#endif
@_spi(Server) import Ferry
import Foundation
import Logging

func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

/// The value of bulk/i: about 2 KB that compresses little, the same in every run.
func bulkValue(_ i: Int) -> Value {
    var x = UInt64(i) &* 0x9E37_79B9_7F4A_7C15 | 1
    var s = ""
    for _ in 0..<160 {
        x ^= x << 13; x ^= x >> 7; x ^= x << 17
        s += String(x, radix: 36)
    }
    return ["i": .int(Int64(i)), "text": .string(s)]
}


let args = CommandLine.arguments
// ferry-space-child read DIR MODE COUNT: opens the database in DIR and reads /posts, which must
// have COUNT children — MODE "open" reads one child, "stream" walks every child (each decoded),
// "keep" walks them keeping every child, "materialize" builds the whole value. Exits 0 when the count is right (the memory tests
// compare the peak resident memory it prints: "peak BYTES").
if args.count == 5, args[1] == "read", let expected = Int(args[4]) {
    var options = DatabaseOptions(durability: .none)
    options.checkpointOnClose = false
    options.logger = Logger(label: "child", factory: { _ in SwiftLogNoOpLogHandler() })
    do {
        let db = try Database.open(at: args[2], options: options)
        let posts = try await db.reference("posts").getData()
        var n = 0
        switch args[3] {
        case "open": n = posts.childSnapshot(forPath: "p\(100_000_000 + expected - 1)").exists ? expected : 0
        case "stream": try posts.forEachChild { if $0.hasChildren { n += 1 } }
        case "keep":
            var all: [DataSnapshot] = []
            try posts.forEachChild { all.append($0) }
            n = all.filter(\.hasChildren).count
        default: if case .object(let o) = posts.value { n = o.count }
        }
        try await db.close()
        // The peak of this program's own memory (VmHWM: not wait4's maxrss, which can count
        // the parent's memory from before the exec).
        let status = (try? String(contentsOfFile: "/proc/self/status", encoding: .utf8)) ?? ""
        let hwm = status.split(separator: "\n").first { $0.hasPrefix("VmHWM:") }.map { $0.split(separator: " ")[1] } ?? "0"
        say("peak \(Int(hwm)! * 1024)")
        exit(n == expected ? 0 : 1)
    } catch {
        say("\(error)")
        exit(3)
    }
}
guard args.count >= 4, args[1] == "run", let iterations = Int(args[3]) else {
    say("usage: ferry-space-child run DIR ITERATIONS")
    exit(2)
}
var options = DatabaseOptions(durability: .none)
options.cacheSizeBytes = .bytes(CacheSize.minimumBytes)
options.compactionSegments = 2
options.logger = Logger(label: "child", factory: { _ in SwiftLogNoOpLogHandler() })
do {
    let db = try Database.open(at: args[2], options: options)
    try await db.reference("pinned").keepSynced(true)
    let listened = try db.reference("listened")
    listened.observe(.value) { _ in }
    say("open")
    var written: [Int64] = []
    for i in 0..<iterations {
        if i % 10 == 0 {
            try await db.applyServerPut(at: "pinned/count", .int(Int64(i)))
            try await db.applyServerPut(at: "listened/count", .int(Int64(i)))
        }
        if i % 25 == 0 {
            let receipt = try await db.reference("mine/m\(i)").setValue(.int(Int64(i)))
            written.append(receipt.writeID!)
            try await db.sync()
            say("wrote \(i) \(receipt.writeID!)")
            if written.count > 2 {
                let id = written.removeFirst()
                say("acking \(id)")
                try await db.acknowledgeWrites(through: id)
                try await db.sync()
                say("acked \(id)")
            }
        }
        try await db.applyServerPut(at: "bulk/b\(i)", bulkValue(i))
        if i % 10 == 9 {
            try await db.sync()
            say("ack \(i)")
        }
    }
    say("done")
    try await db.close()
} catch {
    say("error \(error)")
    exit(1)
}
