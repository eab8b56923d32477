// The demo behind the README's second command (scripts/demo.sh): an app's offline run of the database.
// Eight tasks write posts at once (each write durable before it returns), a listener on the
// three most-liked posts fires as they land, an update and a transaction change them; then the
// store is closed, reopened from its checkpoint, and everything — including the writes no
// server has acknowledged yet — is there. The store is left for `ferry-dump` to show.
//
//   ferry-demo [DIRECTORY] [--posts N]     (DIRECTORY defaults to $FERRY_DEMO_STORE)
//
// The directory must be absent, empty, or a Ferry store (whose files the demo replaces); a
// directory that holds anything else is refused untouched (exit 65).
import Ferry
import FerryLog
import Foundation
import Synchronization

let arguments = CommandLine.arguments
let given = arguments.count >= 2 && !arguments[1].hasPrefix("--") ? arguments[1] : nil
guard let path = given ?? ProcessInfo.processInfo.environment["FERRY_DEMO_STORE"], !path.isEmpty else {
    print("usage: ferry-demo DIRECTORY [--posts N]   (or set FERRY_DEMO_STORE)")
    exit(64)
}
let count = arguments.firstIndex(of: "--posts").flatMap { $0 + 1 < arguments.count ? Int(arguments[$0 + 1]) : nil } ?? 2000

/// The names a Ferry store's directory holds: the log's files and the database's checkpoints.
func isStoreFile(_ name: String) -> Bool {
    name == "LOCK" || name == "log-start" || name == "damaged" || name.hasSuffix(".tmp") || name.hasSuffix(".wal")
        || (name.hasPrefix("checkpoint-") && name.hasSuffix(".ckp"))
}

/// Makes `path` ready for a fresh store: absent or empty is fine; a Ferry store's own files are
/// removed (anything else beside them is left alone); any other directory or file is refused.
func prepareStoreDirectory(_ path: String) throws {
    var isDirectory: ObjCBool = false
    guard FileManager.default.fileExists(atPath: path, isDirectory: &isDirectory) else { return }
    guard isDirectory.boolValue else {
        refuse("\(path) is a file, not a directory")
    }
    let names = try FileManager.default.contentsOfDirectory(atPath: path)
    if names.isEmpty { return }
    guard try LogInspection.containsStore(at: path) else {
        refuse("\(path) is not empty and is not a Ferry store (it holds \(names.sorted().prefix(3).joined(separator: ", "))\(names.count > 3 ? ", …" : ""))")
    }
    for name in names where isStoreFile(name) {
        try FileManager.default.removeItem(atPath: path + "/" + name)
    }
}

func refuse(_ why: String) -> Never {
    FileHandle.standardError.write(Data("ferry-demo: \(why); nothing was changed. Give an empty or new directory, or a Ferry store to replace.\n".utf8))
    exit(65)
}

struct Post: Codable {
    var author: String
    var title: String
    var likes: Int
}

func seconds(_ d: Duration) -> String { String(format: "%.3f s", Double(d.components.attoseconds) / 1e18 + Double(d.components.seconds)) }

nonisolated func main() async throws {
    try prepareStoreDirectory(path)
    var options = DatabaseOptions(durability: .fsync)
    options.segmentSize = 256 << 10
    let db = try Database.open(at: path, options: options)
    let posts = try db.reference("posts")
    // With no server yet, a location's data is complete (and value events fire) once it was
    // written in full locally: start both lists out empty.
    try await db.root.updateChildValues(["posts": .null, "stats": ["posts": 0, "visits": 0]])

    // A listener on the three most-liked posts: it fires from local writes, with no server.
    let top = try posts.queryOrdered(byChild: "likes").queryLimited(toLast: 3)
    let events = FerryMutex(0)
    @Sendable func describe(_ snapshot: DataSnapshot) -> String {
        snapshot.children.map { "\($0.key!) (\($0.childSnapshot(forPath: "likes").value) likes)" }.joined(separator: ", ")
    }
    let topHandle = top.observe(.value) { snapshot in
        if events.withLock({ $0 += 1; return $0 }) == 1 { print("  the listener's first event: [\(describe(snapshot))]") }
    }

    print("ferry-demo: \(count) posts from 8 tasks into \(path), each setValue durable (fdatasync) before it returns")
    let start = ContinuousClock.now
    try await withThrowingTaskGroup(of: Void.self) { group in
        for task in 0..<8 {
            group.addTask {
                for i in stride(from: task, to: count, by: 8) {
                    try await posts.childByAutoId().setValue(Post(author: "user\(i % 211)", title: "Crossing number \(i)", likes: (i * 7919) % 1000))
                }
            }
        }
        try await group.waitForAll()
    }
    print("ferry-demo: wrote \(count) posts in \(seconds(start.duration(to: .now))); the top-3 listener fired \(events.withLock { $0 }) times, "
          + "once per change of the top 3, and shows [\(describe(try await top.getData()))]")

    // A multi-path update (all or nothing), a server-value increment and a transaction.
    let first = try require(try await top.getData().children.last)
    try await db.root.updateChildValues(["posts/\(first.key!)/likes": 5000, "stats/posts": .int(Int64(count))])
    try await db.reference("stats/visits").setValue(ServerValue.increment(1))
    let result = try await db.reference("stats/visits").runTransaction { data in
        data.value = .int((data.value.number.map { Int64($0) } ?? 0) + 10)
        return .commit
    }
    print("ferry-demo: transaction committed: \(result.committed), visits = \(result.snapshot.value)")
    top.removeObserver(withHandle: topHandle)
    let before = [try await posts.getData().value, try await db.reference("stats").getData().value]
    try await db.close()

    // Reopen: the checkpoint written by close bounds the replay.
    let reopenStart = ContinuousClock.now
    let reopened = try Database.open(at: path)
    let after = [try await reopened.reference("posts").getData().value, try await reopened.reference("stats").getData().value]
    print("ferry-demo: reopened in \(seconds(reopenStart.duration(to: .now))): \(try await reopened.reference("posts").getData().childrenCount) posts, "
          + "same data as before close: \(after == before), writes waiting for a server: \(reopened.pendingWriteCount)")
    let best = try await reopened.reference("posts").queryOrdered(byChild: "likes").queryLimited(toLast: 1).getData().children.first!
    print("ferry-demo: most liked: \(try best.decode(Post.self)) — hasPendingWrites: \(best.metadata.hasPendingWrites)")
    try await reopened.close()
}

struct Missing: Error {}
func require<T>(_ value: T?) throws -> T { guard let value else { throw Missing() }; return value }

try await main()
