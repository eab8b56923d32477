// The client side of the README's first command (scripts/sync-story.sh): an app that writes
// while offline, is restarted, goes online, and watches its writes reach a ferry-server.
//
//   ferry-sync-demo offline STORE URL   writes 3 posts and 3 increments with no connection, then exits
//   ferry-sync-demo online STORE URL    reopens STORE, listens, goes online, waits until the server
//                                       has answered every write; a second client reads the server
//
// URL is a server address such as http://127.0.0.1:9000?ns=story. Exit status: 0 when the step
// did what it says, 1 when it failed (the reason is printed), 64 for bad arguments. The online
// step gives up after --timeout seconds (default 60) instead of hanging.
@_spi(Server) import Ferry  // the SPI only for the sync cursor (acknowledgedThrough) and pendingWriteIDs
import FerrySync
import Foundation

/// Prints a line at once (one `write`), so the listener tasks' lines appear as they happen.
func say(_ line: String) { FileHandle.standardOutput.write(Data((line + "\n").utf8)) }

let arguments = Array(CommandLine.arguments.dropFirst())
let timeoutSeconds = arguments.firstIndex(of: "--timeout").flatMap { $0 + 1 < arguments.count ? Int(arguments[$0 + 1]) : nil } ?? 60
let positional = arguments.enumerated().filter { i, a in !a.hasPrefix("--") && (i == 0 || arguments[i - 1] != "--timeout") }.map(\.element)
guard positional.count == 3, ["offline", "online"].contains(positional[0]) else {
    say("usage: ferry-sync-demo offline|online STORE URL [--timeout SECONDS]")
    exit(64)
}
let (step, store, url) = (positional[0], positional[1], positional[2])

/// The posts the story writes (push ids are made on the device: no server needed).
let titles = ["Offline first", "Written on a plane", "Sent exactly once"]

/// `3 posts`, `1 post`, `nothing`.
func count(_ snapshot: DataSnapshot) -> String {
    snapshot.exists ? "\(snapshot.childrenCount) post\(snapshot.childrenCount == 1 ? "" : "s")" : "nothing"
}

func flags(_ m: SnapshotMetadata) -> String { "fromCache: \(m.fromCache ? "true " : "false"), hasPendingWrites: \(m.hasPendingWrites ? "true " : "false")" }

func pad(_ s: String, _ n: Int) -> String { s.count >= n ? s : s + String(repeating: " ", count: n - s.count) }

func ids(_ list: [Int64]) -> String { list.isEmpty ? "none" : list.count == 1 ? "\(list[0])" : "\(list.first!)…\(list.last!)" }

/// Step 1: the app writes with no connection. Every write is durable in the local log when its
/// `await` returns, and listeners see it at once; nothing is sent.
func offline() async throws {
    let db = try Database.open(at: store)
    // A sync client exists, but goOnline() is not called: the database works as without one.
    let sync = try SyncClient(database: db, url: url, options: syncOptions())
    say("opened \(store), a sync client for \(sync.address), not online")
    let posts = try db.reference("posts")
    let counter = try db.reference("stats/posts")
    for (i, title) in titles.enumerated() {
        let post = posts.childByAutoId()
        let written = try await post.setValue(["author": "ada", "title": .string(title), "likes": .int(Int64(i))])
        say("  write \(written.writeID!)  set  /posts/\(post.key!)  {\"title\": \"\(title)\", …}")
        let counted = try await counter.setValue(ServerValue.increment(1))
        let local = try await counter.getData().value
        say("  write \(counted.writeID!)  set  /stats/posts  increment(1)  → reads \(local.json) locally")
    }
    say("pending writes: \(db.pendingWriteCount) (ids \(ids(db.pendingWriteIDs))), cursor (acknowledgedThrough): \(db.acknowledgedThrough), connected: \(await sync.isConnected)")
    await sync.close()
    try await db.close()
    say("closed: the writes are in the log; the process exits (the app is \"restarted\")")
}

/// The sync clients' options: sync logs only its warnings here (a refused write, a failure).
func syncOptions(maxBatchWrites: Int = SyncOptions().maxBatchWrites) -> SyncOptions {
    var options = SyncOptions()
    options.logger.logLevel = .warning
    options.maxBatchWrites = maxBatchWrites
    return options
}

/// Whether a snapshot is the server's data with no local write pending over it.
@Sendable func confirmed(_ s: DataSnapshot) -> Bool { !s.metadata.fromCache && !s.metadata.hasPendingWrites }

/// Prints the value events at `path` — metadata changes included — until one satisfies
/// `until`. The stream yields each event's snapshot as it is printed.
func watch(_ who: String, _ db: Database, _ path: String, showCursor: Bool, until: @escaping @Sendable (DataSnapshot) -> Bool = confirmed,
           _ describe: @escaping @Sendable (DataSnapshot) -> String) throws -> (Task<Void, any Error>, AsyncStream<DataSnapshot>) {
    let events = try db.reference(path).events(.value, includeMetadataChanges: true)
    let (printed, didPrint) = AsyncStream.makeStream(of: DataSnapshot.self)
    let task = Task {
        defer { didPrint.finish() }
        for try await event in events {
            let s = event.snapshot
            say("  \(who)  \(pad(path, 12)) \(pad(describe(s), 10)) \(flags(s.metadata))" + (showCursor ? "  cursor \(db.acknowledgedThrough)" : ""))
            didPrint.yield(s)
            if until(s) { return }
        }
    }
    return (task, printed)
}

/// Step 2: the app starts again on the same store, listens, and goes online.
func online() async throws {
    let db = try Database.open(at: store)
    let pending = db.pendingWriteIDs
    let last = pending.last ?? db.acknowledgedThrough
    say("reopened \(store): \(pending.count) pending writes (ids \(ids(pending))), cursor \(db.acknowledgedThrough)")

    // B: a second client, memory only and online, that shows what reaches the server.
    say("B, a second client (memory only, online), listens to /posts on the server:")
    let bDatabase = Database.inMemory()
    let b = try SyncClient(database: bDatabase, url: url, options: syncOptions())
    await b.goOnline()
    let (bListener, bEvents) = try watch("B", bDatabase, "/posts", showCursor: false,
                                         until: { confirmed($0) && $0.childrenCount == titles.count }, count)
    for await s in bEvents where !s.metadata.fromCache { break }  // B has heard from the server

    // A's listeners. /stats/posts was written whole offline, so it has an event at once (from
    // the cache); /posts was written one child at a time, so it has none until the server's data.
    say("A listens to /stats/posts and /posts:")
    // Each prints until its data is confirmed by the server, whole: a listener can see an
    // acknowledged write vanish until the server's own update reaches it (the README's
    // *Known limits*).
    let (counterListener, counterEvents) = try watch("A", db, "/stats/posts", showCursor: true,
                                                     until: { confirmed($0) && $0.value == .int(Int64(titles.count)) }) { "= \($0.value.json)" }
    let (postsListener, _) = try watch("A", db, "/posts", showCursor: true,
                                       until: { confirmed($0) && $0.childrenCount == titles.count }, count)
    for await _ in counterEvents { break }

    // Small batches, so that the cursor moves in steps you can see (the default is 5,000).
    let a = try SyncClient(database: db, url: url, options: syncOptions(maxBatchWrites: 2))
    let states = await a.connectionStates()
    let connection = Task { for await up in states.dropFirst() { say("  A  connected: \(up)") } }
    say("A goes online (batches of 2 writes):")
    await a.goOnline()

    // The sync cursor: the highest write id the server has answered. The database has no
    // observer for it; look every millisecond and print each value seen.
    let watcher = Task {
        var seen = db.acknowledgedThrough
        while seen < last {
            try await Task.sleep(for: .milliseconds(1))
            let now = db.acknowledgedThrough
            if now != seen { say("  A  cursor \(seen) → \(now)  (\(db.pendingWriteCount) pending)"); seen = now }
        }
    }
    try await db.waitForPendingWrites()  // returns once the server has answered every write
    for task in [watcher, counterListener, postsListener, bListener] { try await task.value }
    connection.cancel()
    say("every write answered: cursor \(db.acknowledgedThrough) = the last write (\(last)), \(db.pendingWriteCount) pending, \(try db.rejectedWrites().count) rejected")

    // What the server holds, read by B (from the server, since B is online).
    let counter = try await b.getData(try bDatabase.reference("stats/posts"))
    let posts = try await b.getData(try bDatabase.reference("posts"))
    let once = counter.value == .int(Int64(titles.count))
    say("B reads the server: /stats/posts = \(counter.value.json) (\(once ? "one per post: each increment applied once" : "not \(titles.count)!")), /posts has \(count(posts)):")
    for post in posts.children {
        say("    /posts/\(post.key!)  \(post.childSnapshot(forPath: "title").value.json)")
    }
    guard once, posts.childrenCount == titles.count else {
        throw StoryFailure(message: "the server holds \(count(posts)) and a counter of \(counter.value.json), not \(titles.count) of each")
    }
    await a.close()
    await b.close()
    try await db.close()
    try await bDatabase.close()
}

/// The story did not end as it says.
struct StoryFailure: Error, CustomStringConvertible {
    var message: String
    var description: String { message }
}

nonisolated func main() async throws {
    switch step {
    case "offline": try await offline()
    default:
        // The online step must end: give up (exit 1) if the server never answers.
        DispatchQueue.global().asyncAfter(deadline: .now() + .seconds(timeoutSeconds)) {
            say("ferry-sync-demo: gave up after \(timeoutSeconds) s: the server did not answer (is one running at \(url)?)")
            exit(1)
        }
        try await online()
    }
}

do {
    try await main()
} catch {
    say("ferry-sync-demo \(step): \(error)")
    exit(1)
}
