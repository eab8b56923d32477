// Ferry's document store as a child process, for the tests that kill a client of ferry-server's
// Firestore API (kill -9, or at a crash point: FERRY_CRASH_AT=documents.answered kills it after
// the server answered a commit and before the store recorded the answers).
//
//   ferry-documents-child write DIR PORT FIRST N
//       Connected: N write batches I = FIRST ..< FIRST+N, each setting log/I = {"i": I} and
//       incrementing counters/c.n, printing "durable I" once each is durable locally; then
//       waits until the server has answered every one and prints "drained".
//   ferry-documents-child refuse DIR PORT
//       Before connecting: a batch the server refuses (an update of missing/x, which no one
//       writes) and a batch as `write` makes (I = 0); then as `drain`.
//   ferry-documents-child drain DIR PORT
//       Connected until no write is pending; prints "drained", then "rejected CODE…" (the
//       codes of the refused batches listed).
#if canImport(Glibc)
import Glibc
#endif
import FerryDocuments
import FerryDocumentsSync
import Foundation
import Logging

func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

let args = CommandLine.arguments
guard args.count >= 4, let port = Int(args[3]) else {
    say("usage: ferry-documents-child write DIR PORT FIRST N | drain DIR PORT")
    exit(2)
}
do {
    let db = try Firestore.open(at: args[2])
    if args[1] == "refuse" {
        let refused = db.batch()
        refused.updateData(["n": 1], forDocument: db.collection("missing").document("x"))
        try await refused.commit()
        let batch = db.batch()
        batch.setData(["i": 0], forDocument: db.collection("log").document("0"))
        batch.setData(["n": FieldValue.increment(Int64(1))], forDocument: db.collection("counters").document("c"), merge: true)
        try await batch.commit()
        say("durable 0")
    }
    let quiet = Logger(label: "child", factory: { _ in SwiftLogNoOpLogHandler() })
    let connection = try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: port, project: "exactly-once"), logger: quiet)
    if args[1] == "write", args.count >= 6, let first = Int(args[4]), let n = Int(args[5]) {
        for i in first..<(first + n) {
            let batch = db.batch()
            batch.setData(["i": i], forDocument: db.collection("log").document("\(i)"))
            batch.setData(["n": FieldValue.increment(Int64(1))], forDocument: db.collection("counters").document("c"), merge: true)
            try await batch.commit()
            say("durable \(i)")
        }
    }
    while true {
        do {
            try await db.waitForPendingWrites()
            break
        } catch let e as FirestoreErrorCode where e.code != .failedPrecondition {
            continue  // the last batch was refused: its answer is in; wait for the rest
        }
    }
    say("drained")
    say("rejected" + (try db.rejectedWrites()).map { " \($0.error.code.rawValue)" }.joined())
    await connection.close()
    try await db.terminate()
    exit(0)
} catch {
    say("error \(error)")
    exit(1)
}
