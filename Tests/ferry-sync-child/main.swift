// A Ferry client as a child process, for the sync tests that kill a client (kill -9, or at a
// crash point: FERRY_CRASH_AT=sync.answered kills it after the server answered a batch and
// before the client recorded the answer).
//
//   ferry-sync-child write DIR N [hold]
//       Offline: N writes, each an increment of /count and a set of /posts/pI = {"n": I}
//       (one multi-path update), printing "wrote ID" once durable, then "written". With
//       `hold`, it then waits to be killed; otherwise it closes the store and exits.
//   ferry-sync-child sync DIR URL
//       Goes online until no write is pending, prints "synced CURSOR", closes, exits.
//   ferry-sync-child presence DIR URL PATH
//       Online; each time it connects, registers an onDisconnect removal of PATH, sets PATH
//       to "online", and prints "present N" once the server has both; waits to be killed.
#if canImport(Glibc)
import Glibc
#endif
@_spi(Server) import Ferry
import FerrySync
import Logging

func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

let args = CommandLine.arguments
guard args.count >= 4 else {
    say("usage: ferry-sync-child write DIR N [hold] | sync DIR URL | presence DIR URL PATH")
    exit(2)
}
var options = DatabaseOptions()
options.logger = Logger(label: "child", factory: { _ in SwiftLogNoOpLogHandler() })
/// Short retry delays, no logging.
var syncOptions = SyncOptions()
syncOptions.retryDelay = .milliseconds(20)
syncOptions.maxRetryDelay = .milliseconds(200)
syncOptions.logger = options.logger
do {
    let db = try Database.open(at: args[2], options: options)
    switch args[1] {
    case "write":
        let n = Int(args[3]) ?? 0
        for i in 0..<n {
            let receipt = try await db.root.updateChildValues([
                "count": [".sv": ["increment": 1]],
                "posts/p\(i)": ["n": .int(Int64(i))],
            ])
            say("wrote \(receipt.writeID.map(String.init) ?? "nothing")")
        }
        say("written")
        if args.count > 4 && args[4] == "hold" {
            while true { try await Task.sleep(for: .seconds(60)) }
        }
    case "sync":
        let sync = try SyncClient(database: db, url: args[3], options: syncOptions)
        await sync.goOnline()
        try await db.waitForPendingWrites()
        say("synced \(db.acknowledgedThrough)")
        await sync.close()
    case "presence":
        let sync = try SyncClient(database: db, url: args[3], options: syncOptions)
        let ref = try db.reference(args[4])
        await sync.goOnline()
        var n = 0
        func register() async throws {
            while true {
                do {
                    try await sync.onDisconnect(ref).removeValue()
                    _ = try await ref.setValue("online").serverAcknowledgement()
                    break
                } catch {
                    try await Task.sleep(for: .milliseconds(50))
                }
            }
            n += 1
            say("present \(n)")
        }
        try await register()
        var wasConnected = true
        for await connected in await sync.connectionStates() {
            if connected && !wasConnected { try await register() }
            wasConnected = connected
        }
    default:
        say("unknown command \(args[1])")
        exit(2)
    }
    try await db.close()
} catch {
    say("error \(error)")
    exit(1)
}
