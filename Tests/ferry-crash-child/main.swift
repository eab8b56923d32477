// A child process for the crash tests. It is killed with SIGKILL at random moments by the
// test, which then reopens the store and checks that everything acknowledged survived.
//
//   ferry-crash-child append DIR WRITERS SEGMENT_SIZE
//       Appends batches from WRITERS concurrent tasks with Durability.fsync, forever. After each
//       append returns it prints "ack FIRST LAST WRITER BATCH" (one write(2) per line).
//   ferry-crash-child hold DIR
//       Opens the store, prints "locked", and sleeps until killed.
#if canImport(Glibc)
import Glibc
#endif
import FerryLog
import FerryTestSupport

func say(_ line: String) {
    let bytes = Array((line + "\n").utf8)
    _ = bytes.withUnsafeBytes { write(1, $0.baseAddress, $0.count) }
}

let args = CommandLine.arguments
guard args.count >= 3 else {
    say("usage: ferry-crash-child append DIR WRITERS SEGMENT_SIZE | hold DIR")
    exit(2)
}

switch args[1] {
case "hold":
    let log = try WriteAheadLog.open(at: args[2])
    say("locked")
    while true { sleep(60) }
    _ = log
case "append":
    let writers = Int(args[3]) ?? 1
    var options = LogOptions(durability: .fsync, segmentSize: Int(args[4]) ?? 32768)
    options.frameTargetSize = 4096
    let log = try WriteAheadLog.open(at: args[2], options: options)
    say("open \(log.nextLSN)")
    // A run number keeps batch tags unique across the restarts of one test.
    let run = Int(log.nextLSN.rawValue)
    await withTaskGroup(of: Void.self) { group in
        for w in 0..<writers {
            group.addTask {
                var n = 0
                while true {
                    var batch = LogBatch()
                    let size = 1 + (w + n) % 4
                    for k in 0..<size { batch.append(kind: 7, payload: Payloads.tagged(writer: run * 100 + w, batch: n, record: k)) }
                    do {
                        let r = try await log.append(batch)
                        say("ack \(r.lowerBound) \(r.upperBound) \(run * 100 + w) \(n)")
                    } catch {
                        say("error \(error)")
                        exit(1)
                    }
                    n += 1
                }
            }
        }
    }
default:
    say("unknown mode \(args[1])")
    exit(2)
}
