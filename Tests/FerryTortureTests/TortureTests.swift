import Foundation
@_spi(Testing) import FerryLog
@_spi(Testing) import FerryTestSupport
import FerryTortureSupport
import Synchronization
import Testing

@_spi(Server) @_spi(Testing) import Ferry

/// The torture harness: a random database workload (``TortureWorkload``) is killed with
/// SIGKILL at random moments and at named crash points, and loses its power at random calls;
/// after each, the store is reopened (strict recovery) and checked against a model rebuilt from
/// what the workload reported (``TortureChecker``); the next round continues on the same store.
///
/// The normal suite runs a few rounds of each. The long mode runs rounds until
/// `FERRY_TORTURE_SECONDS` have passed (or `FERRY_TORTURE_ROUNDS` rounds) and prints a summary;
/// `FERRY_TORTURE_SEED` replays a seed (the cut and kill points; thread timing still varies),
/// `FERRY_TORTURE_KEEP=DIR` keeps a failing round's store and lines, `FERRY_TORTURE_TRACE`
/// prints each power cut's calls.
@Suite(.serialized) struct TortureTests {
    static let environment = ProcessInfo.processInfo.environment
    static let seconds = Double(environment["FERRY_TORTURE_SECONDS"] ?? "")
    static let rounds = Int(environment["FERRY_TORTURE_ROUNDS"] ?? "")
    static let isLong = seconds != nil || rounds != nil

    /// Every named crash point in roll, checkpoint and compaction.
    static let crashPoints = [
        "roll.afterSeal", "roll.afterSealSync", "roll.afterCreate",
        "checkpoint.afterTempWrite", "checkpoint.afterRename", "checkpoint.afterRemoveOld",
        "compaction.afterRestate", "compaction.afterCheckpoint", "compaction.afterLogStart", "compaction.betweenDeletions",
    ]

    enum Round: String, CaseIterable {
        case randomKill = "random kill", pointKill = "named-point kill", powerCut = "power cut"
    }

    /// Counts over a run, for the summary line.
    struct Tally {
        var kills = 0, pointKills = 0, powerCuts = 0, failures = 0, lostWrites = 0, differingViews = 0, differingServerData = 0
        var confirmedWrites = 0, serverOperations = 0, checkpoints = 0, compactions = 0, deletedSegments = 0
        var tornTails = 0, undoneDirectoryChanges = 0, droppedBytes: Int64 = 0
        var pointHits: [String: Int] = [:]
    }

    /// A store and the journal of everything done to it.
    final class Harness {
        let dir: TemporaryDirectory
        var store: String { dir.sub("store") }
        var journal = Journal()
        var tally = Tally()
        var rng: SplitMix
        let seed: UInt64
        var round = 0
        var lastLines: [String] = []

        init(seed: UInt64) async throws {
            self.seed = seed
            rng = SplitMix(seed: seed)
            dir = try TemporaryDirectory("torture")
            // The server's data starts empty and complete, so the whole view can be read.
            let db = try Database.open(at: store, options: TortureWorkload.databaseOptions)
            try await db.applyServerPut(at: "", [:])
            try await db.close()
        }

        func random(_ n: Int) -> Int { Int(rng.next() % UInt64(n)) }

        /// One round of the given kind; returns a failure description, or nil.
        func run(_ kind: Round) async throws -> String? {
            round += 1
            let childSeed = seed &+ UInt64(round) &* 0x9E37_79B9
            var context = "seed \(seed) round \(round) (\(kind.rawValue)"
            let errorsBefore = journal.errors.count
            switch kind {
            case .randomKill, .pointKill:
                var env: [String: String] = [:]
                if kind == .pointKill {
                    let point = TortureTests.crashPoints[random(TortureTests.crashPoints.count)]
                    env["FERRY_CRASH_AT"] = "\(point):\(1 + random(3))"
                    context += " at \(env["FERRY_CRASH_AT"]!)"
                }
                let child = try ChildProcess(Locations.executable("ferry-torture-child"), [store, "\(childSeed)", "4"], environment: env)
                guard child.waitForLine(timeout: 60, { $0 == "open" || $0.hasPrefix("e\t") }) else {
                    child.kill9()
                    return "\(context)): the child did not open the store"
                }
                if kind == .pointKill {
                    if child.waitForExit(timeout: 3), child.wasKilled {
                        tally.pointHits[env["FERRY_CRASH_AT"]!.split(separator: ":")[0].description, default: 0] += 1
                        tally.pointKills += 1
                    } else {
                        tally.kills += 1  // not reached in time: a random kill after all
                    }
                } else {
                    usleep(UInt32(10_000 + random(250_000)))
                    tally.kills += 1
                }
                lastLines = child.kill9()
                for line in lastLines { journal.take(line) }
            case .powerCut:
                let disk = try PowerCutDisk(directory: store, shadow: dir.sub("shadow-\(round)"), callsBeforeCut: 1 + random(2_000))
                var options = TortureWorkload.databaseOptions
                options.system = disk.calls
                let lines = FerryMutex<[String]>([])
                let unexpected = FerryMutex<[String]>([])
                let ended = FerryMutex(false)
                do {
                    let db = try Database.open(at: store, options: options)
                    let workload = Task {
                        await TortureWorkload(seed: childSeed, writers: 4).run(db) { line in
                            // An error before the cut is a failure; after it, every call fails.
                            if line.hasPrefix("e\t"), !disk.isCut { unexpected.withLock { $0.append(line) } }
                            lines.withLock { $0.append(line) }
                        }
                        ended.withLock { $0 = true }
                    }
                    // The cut comes at a random call, or at a random moment once the workload
                    // has begun writing (its first line): under load its task can start after
                    // a moment counted from here, and a cut before any write tests nothing.
                    while !disk.isCut && lines.withLock({ $0.isEmpty }) && !ended.withLock({ $0 }) { try await Task.sleep(for: .milliseconds(1)) }
                    let deadline = ContinuousClock.now + .milliseconds(20 + random(300))
                    while !disk.isCut && ContinuousClock.now < deadline { try await Task.sleep(for: .milliseconds(1)) }
                    disk.cut()
                    workload.cancel()
                    await workload.value
                    try? await db.close()
                } catch where disk.isCut {
                    // The power went out while the store was opening.
                }
                let restore = try disk.restoreDurableState(keepUnsynced: random(2) == 0, using: &rng)
                tally.powerCuts += 1
                tally.undoneDirectoryChanges += restore.undoneEntries
                tally.droppedBytes += restore.droppedBytes
                context += " after \(disk.mutatingCalls) calls, \(restore)"
                for p in disk.problems { journal.errors.append("power-cut model: \(p)") }
                if environment["FERRY_TORTURE_TRACE"] != nil {
                    print("round \(round) disk calls:\n  " + disk.trace.joined(separator: "\n  "))
                    print("round \(round) lines:\n  " + lines.withLock { $0 }.joined(separator: "\n  "))
                    print("round \(round) files after the cut: \(try Files.list(store).map { "\($0) \((try? Files.size(store + "/" + $0)) ?? -1)" })")
                }
                lastLines = lines.withLock { $0 }
                for line in lastLines where !line.hasPrefix("e\t") { journal.take(line) }
                journal.errors += unexpected.withLock { $0 }
            }
            context += ")"

            var failure: String?
            if journal.errors.count > errorsBefore {
                failure = "\(context): the workload failed: \(journal.errors[errorsBefore...].joined(separator: "; "))"
            }
            var options = TortureWorkload.databaseOptions
            options.checkpointOnClose = random(2) == 0
            let db = try Database.open(at: store, options: options)
            if db.recovery?.tornTail != nil { tally.tornTails += 1 }
            do {
                journal.settle(try await TortureChecker.check(db, against: journal))
            } catch let m as TortureChecker.Mismatch {
                tally.failures += 1
                tally.lostWrites += m.lostWrites
                if m.viewDiffers { tally.differingViews += 1 }
                if m.serverDiffers { tally.differingServerData += 1 }
                failure = (failure.map { $0 + "\n" } ?? "") + "\(context): the store differs from the model:\n    \(m)"
                keep()
                // Go on from what the store holds, so one failure does not hide the next.
                try await resynchronize(db)
            }
            try await db.close()
            tally.confirmedWrites = journal.confirmedWrites
            tally.serverOperations = journal.serverOperations
            tally.checkpoints = journal.checkpoints
            tally.compactions = journal.compactions
            tally.deletedSegments = journal.deletedSegments
            return failure
        }

        /// With FERRY_TORTURE_KEEP=DIR: keeps a failing round's store and the workload's lines.
        func keep() {
            guard let keep = environment["FERRY_TORTURE_KEEP"] else { return }
            try? Files.copyTree(store, to: keep + "/\(seed)-round-\(round)")
            try? (lastLines.joined(separator: "\n") + "\n").write(toFile: keep + "/\(seed)-round-\(round).lines", atomically: false, encoding: .utf8)
        }

        /// After a failure: adopt the store's state as the model's (answering every pending
        /// write and clearing rejections, so that nothing unknown remains).
        func resynchronize(_ db: Database) async throws {
            if let last = db.pendingWriteIDs.last { try await db.acknowledgeWrites(through: last, rejecting: []) }
            try await db.clearRejectedWrites()
            var m = TortureModel()
            m.server = try await db.root.getData().value
            journal.settle(m)
        }

        var summary: String {
            let t = tally
            return "\(t.kills) kills, \(t.pointKills) named-point kills, \(t.powerCuts) power cuts; \(t.lostWrites) acknowledged writes lost; \(t.differingViews) views and \(t.differingServerData) server caches differing from the model"
        }

        var details: String {
            let t = tally
            return "\(round) rounds (seed \(seed)): \(t.confirmedWrites) durable writes and \(t.serverOperations) server operations confirmed, \(t.checkpoints) checkpoints, \(t.compactions) compactions (\(t.deletedSegments) segments deleted), \(t.tornTails) torn tails truncated, \(t.undoneDirectoryChanges) directory changes undone and \(t.droppedBytes) unsynced bytes dropped by power cuts; points hit: \(t.pointHits.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", "))"
        }
    }

    static func seed() -> UInt64 {
        UInt64(environment["FERRY_TORTURE_SEED"] ?? "") ?? UInt64(Date().timeIntervalSince1970 * 1000)
    }

    /// Kill -9 at random moments, in the middle of writes from four tasks, server updates,
    /// acknowledgements, checkpoints and compactions: after every kill the store opens, every
    /// write confirmed durable is there, and the view is the model's.
    @Test func aKilledDatabaseLosesNoAcknowledgedWriteAndShowsTheModelsView() async throws {
        guard !Self.isLong else { return }
        let h = try await Harness(seed: Self.seed())
        for _ in 0..<8 {
            if let failure = try await h.run(.randomKill) { Issue.record(Comment(rawValue: failure)) }
        }
        print("torture: \(h.summary)\n  \(h.details)")
        #expect(h.tally.confirmedWrites > 20, "the workload confirmed too few writes to test anything")
        #expect(h.tally.serverOperations > 20, "the server answered too little to test anything")
    }

    /// Kill -9 at each named point inside segment roll, checkpoint and compaction: the store
    /// opens after each with nothing confirmed lost.
    @Test(arguments: crashPoints)
    func aKillAtANamedPointLosesNothing(point: String) async throws {
        guard !Self.isLong else { return }
        let h = try await Harness(seed: Self.seed())
        var hits = 0
        for n in 1...2 {
            h.round += 1
            let child = try ChildProcess(Locations.executable("ferry-torture-child"),
                                         [h.store, "\(h.seed &+ UInt64(n))", "4"], environment: ["FERRY_CRASH_AT": point])
            #expect(child.waitForLine(timeout: 60) { $0 == "open" }, "the child did not open the store")
            let selfKilled = child.waitForExit(timeout: 10) && child.wasKilled
            if selfKilled { hits += 1 }
            h.lastLines = child.kill9()
            for line in h.lastLines { h.journal.take(line) }
            #expect(h.journal.errors.isEmpty, "seed \(h.seed) at \(point), run \(n): \(h.journal.errors)")
            let db = try Database.open(at: h.store, options: TortureWorkload.databaseOptions)
            do {
                h.journal.settle(try await TortureChecker.check(db, against: h.journal))
            } catch {
                Issue.record("seed \(h.seed) killed at \(point), run \(n): the store differs from the model:\n    \(error)")
                h.keep()
            }
            try await db.close()
        }
        #expect(hits >= 1, "the workload never reached \(point) within 10 s")
    }

    /// Power cuts at random calls: every byte not covered by fdatasync, and every creation,
    /// rename or deletion not covered by a sync of the directory, is dropped (some unsynced
    /// bytes may survive, as a torn tail); the store then opens with everything confirmed.
    @Test func aPowerCutLosesNoAcknowledgedWriteAndShowsTheModelsView() async throws {
        guard !Self.isLong else { return }
        let h = try await Harness(seed: Self.seed())
        // 16 cuts; more (up to 64) while none has lost anything yet — a cut that falls just
        // after a sync loses nothing, and 16 such in a row (rare) would test nothing.
        var rounds = 0
        while rounds < 16 || (h.tally.undoneDirectoryChanges + Int(h.tally.droppedBytes) == 0 && rounds < 64) {
            if let failure = try await h.run(.powerCut) { Issue.record(Comment(rawValue: failure)) }
            rounds += 1
        }
        print("torture: \(h.summary)\n  \(h.details)")
        #expect(h.tally.undoneDirectoryChanges + Int(h.tally.droppedBytes) > 0, "no power cut lost anything: the cuts tested nothing")
        #expect(h.tally.confirmedWrites > 20, "the workload confirmed too few writes to test anything")
    }

    /// The long mode: FERRY_TORTURE_SECONDS=600 (or FERRY_TORTURE_ROUNDS=2000) runs kills at
    /// random moments, at named points and power cuts in turn on one store, and prints the
    /// summary line the README quotes.
    @Test(.enabled(if: TortureTests.isLong)) func longRun() async throws {
        let h = try await Harness(seed: Self.seed())
        let start = ContinuousClock.now
        let limit = Self.seconds.map { Duration.milliseconds(Int($0 * 1000)) }
        var failures: [String] = []
        while true {
            if let r = Self.rounds, h.round >= r { break }
            if let limit, start.duration(to: .now) >= limit { break }
            let kind = Round.allCases[h.round % 3]
            if let failure = try await h.run(kind) {
                failures.append(failure)
                Issue.record(Comment(rawValue: failure))
            }
            if h.round % 50 == 0 { print("torture: \(h.round) rounds, \(h.summary)") }
        }
        print("torture summary: \(h.summary)\n  \(h.details)\n  \(failures.count) failing rounds")
    }
}
