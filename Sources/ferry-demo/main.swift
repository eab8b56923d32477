// The demo behind the README's first command: writes a store of a few thousand mutations the
// way an app would (durable appends from several tasks at once), closes it, reopens it, and
// leaves it for `ferry-dump` to show.
//
//   ferry-demo DIRECTORY [--mutations N]
import FerryLog
import Foundation

let arguments = CommandLine.arguments
guard arguments.count >= 2 else {
    print("usage: ferry-demo DIRECTORY [--mutations N]")
    exit(64)
}
let path = arguments[1]
let count = arguments.firstIndex(of: "--mutations").flatMap { Int(arguments[$0 + 1]) } ?? 5000

/// Record kinds the demo writes (the database layer will define the real ones).
enum Kind: UInt8 { case set = 1, update = 2, remove = 3 }

func mutation(_ i: Int) -> (Kind, [UInt8]) {
    switch i % 10 {
    case 9: return (.remove, Array("/posts/p\(String(format: "%08d", i - 9))".utf8))
    case 5: return (.update, Array(#"{"/posts/p\#(String(format: "%08d", i - 5))/likes":\#(i % 97),"/stats/posts":\#(i)}"#.utf8))
    default:
        let key = String(format: "%08d", i)
        return (.set, Array(#"{"path":"/posts/p\#(key)","value":{"author":"user\#(i % 211)","title":"Crossing number \#(i)","body":"written offline, synced later","likes":0}}"#.utf8))
    }
}

nonisolated func main() async throws {
    try? FileManager.default.removeItem(atPath: path)
    let log = try WriteAheadLog.open(at: path, options: LogOptions(durability: .fsync, segmentSize: 64 << 10))
    print("ferry-demo: writing \(count) mutations to \(path) from 8 tasks, each append durable (fdatasync) before it returns")
    let start = ContinuousClock.now
    try await withThrowingTaskGroup(of: Void.self) { group in
        for task in 0..<8 {
            group.addTask {
                var batch = LogBatch()
                var i = task
                while i < count {
                    batch.removeAll()
                    let (kind, payload) = mutation(i)
                    batch.append(kind: kind.rawValue, payload: payload)
                    try await log.append(batch)
                    i += 8
                }
            }
        }
        try await group.waitForAll()
    }
    let elapsed = start.duration(to: .now)
    let stats = log.statistics
    print("ferry-demo: \(stats.records) records in \(elapsed.formatted(.units(allowed: [.seconds, .milliseconds], width: .narrow))); "
          + "\(stats.syncs) fdatasync calls (group commit: \(String(format: "%.1f", Double(stats.records) / Double(max(1, stats.syncs)))) records per sync), "
          + "\(log.segments.count) segments")
    try await log.close()

    let reopened = try WriteAheadLog.open(at: path)
    var kinds: [UInt8: Int] = [:]
    try reopened.forEachRecord { kinds[$0.kind, default: 0] += 1 }
    print("ferry-demo: reopened: LSN \(reopened.firstLSN)..<\(reopened.nextLSN), \(kinds[1] ?? 0) sets, \(kinds[2] ?? 0) updates, \(kinds[3] ?? 0) removes; recovery: \(reopened.recovery.isClean ? "clean" : "\(reopened.recovery)")")
    try await reopened.close()
}

try await main()
