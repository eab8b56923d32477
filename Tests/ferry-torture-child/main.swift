// A child process for the torture tests: it runs the random database workload on a store until
// it is killed (SIGKILL from the test, or a crash point armed with FERRY_CRASH_AT).
//
//   ferry-torture-child DIR SEED WRITERS
//       Opens the store, prints "open", then runs TortureWorkload(seed: SEED, writers: WRITERS),
//       printing its lines (one write(2) each, so a kill never leaves half a line that parses).
//       On any error it prints "e MESSAGE" and exits with status 1.
#if canImport(Glibc)
import Glibc
#endif
import Ferry
import FerryTortureSupport

@Sendable func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
    if line.hasPrefix("e\t") { exit(1) }
}

let args = CommandLine.arguments
guard args.count == 4, let seed = UInt64(args[2]), let writers = Int(args[3]) else {
    say("usage: ferry-torture-child DIR SEED WRITERS")
    exit(2)
}
do {
    let db = try Database.open(at: args[1], options: TortureWorkload.databaseOptions)
    say("open")
    await TortureWorkload(seed: seed, writers: writers).run(db, say: say)
} catch {
    say("e\topen: \(error)")
}
