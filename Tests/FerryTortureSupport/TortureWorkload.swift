import FerryLog
import Foundation
@_spi(Server) import Ferry
import FerryTestSupport
import Synchronization

/// The torture harness's random database workload: durable local writes (sets, updates,
/// removes) from several tasks, server puts and merges, in-order acknowledgements with
/// rejections (the server echoes each write it accepts before acknowledging it), cleared
/// rejections, checkpoints and compactions — on a store with small segments, so that rolls,
/// checkpoints and compactions happen every few hundred milliseconds.
///
/// It reports through `say`, one line per event, so that whoever watches (a parent process
/// over a pipe, or the same process) knows what must survive a crash:
///
///     i TASK set|update PATH JSON   a task is about to write (PATH "" is the root)
///     w TASK ID                     that write's await returned: it is durable, with this id
///     s put|merge PATH JSON         the server is about to apply data
///     s ack THROUGH R1,R2,…         the server is about to answer writes through THROUGH, rejecting R…
///     s clear                       the app is about to clear the rejected writes
///     S                             the server operation announced last returned (an answer or a
///                                   clear is durable then; a put or merge is not waited for)
///     c / k N                       a checkpoint / a compaction (deleting N segments) finished
///     e MESSAGE                     an operation failed; the task that saw it stops
///
/// Fields are separated by tabs. Every line is announced before its operation starts and
/// confirmed after it returned, so at most one operation per task is in doubt after a crash.
public struct TortureWorkload: Sendable {
    /// The seed of every random choice.
    public var seed: UInt64
    /// How many tasks write.
    public var writers: Int

    /// A workload whose every choice follows from `seed`, with `writers` writing tasks.
    public init(seed: UInt64, writers: Int = 4) {
        self.seed = seed
        self.writers = writers
    }

    /// Options for a tortured store: durable writes, 4 KiB segments, compaction after every two
    /// acknowledged segments.
    public static var databaseOptions: DatabaseOptions {
        var o = DatabaseOptions(durability: .fsync)
        o.segmentSize = 4096
        o.compactionSegments = 2
        o.checkpointOnClose = false
        o.logger.logLevel = .critical
        return o
    }

    public static let keys = ["a", "b", "c", "d"]

    /// A path of `min` to 3 keys from ``keys``.
    public static func randomPath<G: RandomNumberGenerator>(_ g: inout G, min: Int = 0) -> [String] {
        (0..<(min + Int(g.next() % UInt64(3 - min + 1)))).map { _ in keys[Int(g.next() % 4)] }
    }

    /// A null, leaf or small object of ``keys`` (objects only in the first two levels).
    public static func randomValue<G: RandomNumberGenerator>(_ g: inout G, _ depth: Int = 0) -> Value {
        switch g.next() % (depth > 1 ? 4 : 6) {
        case 0: return .null
        case 1: return .int(Int64(g.next() % 100))
        case 2: return .string(["x", "y", "zz"][Int(g.next() % 3)])
        case 3: return .bool(g.next() % 2 == 0)
        default:
            var o: [String: Value] = [:]
            for _ in 0..<(1 + Int(g.next() % 3)) { o[keys[Int(g.next() % 4)]] = randomValue(&g, depth + 1) }
            return .object(o)
        }
    }

    /// A write the server task may echo: its kind, path and value (an object of children for
    /// an update); nil for a write made before this run, whose content this run does not know.
    struct Known: Sendable {
        var update: Bool
        var path: [String]
        var value: Value
    }

    final class KnownWrites: Sendable {
        let writes: FerryMutex<[Int64: Known?]>
        init(_ ids: [Int64]) { writes = FerryMutex(Dictionary(uniqueKeysWithValues: ids.map { ($0, nil) })) }
    }

    /// Runs until the task is cancelled or every task stopped on an error.
    public func run(_ db: Database, say: @escaping @Sendable (String) -> Void) async {
        // Writes the server may answer: those confirmed durable (and those from earlier runs).
        let known = KnownWrites(db.pendingWriteIDs)
        @Sendable func ref(_ p: [String]) throws -> DatabaseReference { p.isEmpty ? db.root : try db.reference(p.joined(separator: "/")) }
        let writers = self.writers, seed = self.seed

        await withTaskGroup(of: Void.self) { group in
            for t in 0..<writers {
                group.addTask {
                    var g = SplitMix(seed: seed &+ UInt64(t + 1) &* 0x51_7CC1_B727_220A)
                    while !Task.isCancelled {
                        let p = Self.randomPath(&g)
                        let roll = g.next() % 100
                        do {
                            let receipt: WriteReceipt
                            let write: Known
                            if roll < 55 {
                                let v = Self.randomValue(&g)
                                write = Known(update: false, path: p, value: v)
                                say("i\t\(t)\tset\t\(p.joined(separator: "/"))\t\(v.json)")
                                receipt = try await ref(p).setValue(v)
                            } else if roll < 70 {
                                write = Known(update: false, path: p, value: .null)
                                say("i\t\(t)\tset\t\(p.joined(separator: "/"))\tnull")
                                receipt = try await ref(p).removeValue()
                            } else {
                                var children: [String: Value] = [:]
                                for k in Self.keys.shuffled(using: &g).prefix(1 + Int(g.next() % 3)) { children[k] = Self.randomValue(&g, 1) }
                                let v = Value.object(children)
                                write = Known(update: true, path: p, value: v)
                                say("i\t\(t)\tupdate\t\(p.joined(separator: "/"))\t\(v.json)")
                                receipt = try await ref(p).updateChildValues(children)
                            }
                            guard let id = receipt.writeID else { say("e\twriter \(t): a write without an id"); return }
                            say("w\t\(t)\t\(id)")
                            known.writes.withLock { $0[id] = write }
                            if g.next() % 2 == 0 { try await Task.sleep(for: .microseconds(Int(g.next() % 3000))) }
                        } catch is CancellationError {
                            return
                        } catch {
                            say("e\twriter \(t): \(error)")
                            return
                        }
                    }
                }
            }

            group.addTask {
                var g = SplitMix(seed: seed ^ 0x5E_4F3D)
                func put(_ p: [String], _ v: Value) async throws {
                    say("s\tput\t\(p.joined(separator: "/"))\t\(v.json)")
                    try await db.applyServerPut(at: p.joined(separator: "/"), v)
                    say("S")
                }
                func merge(_ p: [String], _ children: [String: Value]) async throws {
                    say("s\tmerge\t\(p.joined(separator: "/"))\t\(Value.object(children).json)")
                    try await db.applyServerMerge(at: p.joined(separator: "/"), children)
                    say("S")
                }
                while !Task.isCancelled {
                    do {
                        let roll = g.next() % 100
                        if roll < 25 {
                            try await put(Self.randomPath(&g), Self.randomValue(&g))
                        } else if roll < 40 {
                            let k = Self.keys[Int(g.next() % 4)]
                            try await merge(Self.randomPath(&g), [k: Self.randomValue(&g, 1)])
                        } else if roll < 90 {
                            // Answer the oldest writes whose content the server has (in order).
                            let (answerable, contents) = known.writes.withLock { k in
                                let ids = Array(db.pendingWriteIDs.prefix { k.keys.contains($0) })
                                return (ids, ids.map { k[$0]! })
                            }
                            guard !answerable.isEmpty else {
                                try await Task.sleep(for: .milliseconds(1))
                                continue
                            }
                            let n = 1 + Int(g.next() % UInt64(min(8, answerable.count)))
                            var rejections: [WriteRejection] = []
                            for (id, content) in zip(answerable.prefix(n), contents.prefix(n)) {
                                if g.next() % 4 == 0 || content == nil && g.next() % 2 == 0 {
                                    rejections.append(WriteRejection(writeID: id, status: 401, message: "Permission denied"))
                                } else if let content, g.next() % 2 == 0 {
                                    // (Otherwise the server's echo never comes: no listener asked for it.)
                                    if content.update, case .object(let children) = content.value {
                                        try await merge(content.path, children)
                                    } else {
                                        try await put(content.path, content.value)
                                    }
                                }
                            }
                            let through = answerable[n - 1]
                            say("s\tack\t\(through)\t\(rejections.map { String($0.writeID) }.joined(separator: ","))")
                            try await db.acknowledgeWrites(through: through, rejecting: rejections)
                            say("S")
                            known.writes.withLock { k in for id in answerable.prefix(n) { k.removeValue(forKey: id) } }
                        } else if roll < 93 {
                            say("s\tclear")
                            try await db.clearRejectedWrites()
                            say("S")
                        } else {
                            try await Task.sleep(for: .milliseconds(Int(g.next() % 3)))
                        }
                    } catch is CancellationError {
                        return
                    } catch {
                        say("e\tserver: \(error)")
                        return
                    }
                }
            }

            group.addTask {
                var g = SplitMix(seed: seed ^ 0xC0_FFEE)
                while !Task.isCancelled {
                    do {
                        try await Task.sleep(for: .milliseconds(5 + Int(g.next() % 40)))
                        if g.next() % 2 == 0 {
                            try await db.checkpoint()
                            say("c")
                        } else {
                            let report = try await db.compact()
                            say("k\t\(report.deletedSegments.count)")
                        }
                    } catch is CancellationError {
                        return
                    } catch {
                        say("e\tmaintenance: \(error)")
                        return
                    }
                }
            }
        }
    }
}
