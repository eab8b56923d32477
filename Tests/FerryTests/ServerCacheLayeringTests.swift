import FerryLog
import FerryTestSupport
import Foundation
import Synchronization
import Testing

@testable @_spi(Server) import Ferry

/// The server cache keeps each server write as an entry over the ones before it instead of one
/// tree. Whatever the writes, reading it must give the tree that applying them one at a time
/// gives (Firebase's cache is that tree), priorities included: leaves that values written
/// below turn into objects, priorities written at `.priority` paths, locations emptied and
/// written again.
@Suite struct ServerCacheLayeringTests {
    typealias Rng = BulkLayeringTests.Rng

    /// A new database over `dir`, or in memory.
    static func fresh(stored: Bool, _ dir: TemporaryDirectory) throws -> Database {
        stored ? try Database.open(at: dir.path, options: quietOptions(.none)) : Database.inMemory(options: quietOptions(.none))
    }

    static let keys = ["a", "b", "c"]

    static func path(_ g: inout Rng, maxDepth: Int) -> Path {
        Path(keys: (0..<g.next(maxDepth + 1)).map { _ in keys[g.next(keys.count)] })
    }

    static func priority(_ g: inout Rng) -> Value {
        g.next(2) == 0 ? .int(Int64(g.next(5))) : .string("p\(g.next(3))")
    }

    static func value(_ g: inout Rng, depth: Int) -> Value {
        switch g.next(depth > 1 ? 4 : 6) {
        case 0: return .null
        case 1: return .int(Int64(g.next(9)))
        case 2: return [".value": .int(Int64(g.next(9))), ".priority": priority(&g)]
        case 3: return .string("s\(g.next(4))")
        default:
            var object: [String: Value] = [:]
            for _ in 0..<(1 + g.next(3)) { object[keys[g.next(keys.count)]] = value(&g, depth: depth + 1) }
            if g.next(3) == 0 { object[".priority"] = priority(&g) }
            return .object(object)
        }
    }

    /// Every path of up to three keys, and the root.
    static let allPaths: [Path] = {
        var paths = [Path.root]
        var level = [Path.root]
        for _ in 0..<3 {
            level = level.flatMap { p in keys.map { p.child($0) } }
            paths += level
        }
        return paths
    }()

    static func expectSame(_ db: Database, _ model: Node, _ what: String, _ history: [String] = [], root: Bool = true) async throws {
        for p in allPaths where root || !p.isEmpty {
            let got = try await db.reference(p.description).getData()
            let want = model.getChild(p)
            #expect(got.exportValue == want.value(export: true), "\(what): \(p)\n\(history.joined(separator: "\n"))")
            if got.exportValue != want.value(export: true) { return }
        }
    }

    /// Applies `rounds` random writes to `db` and to the model — the server's, or local ones
    /// over a local write at the root (which the later ones fold into, in Firebase as here);
    /// checks every path after each when `checkEach`.
    static func play(_ db: Database, seed: UInt64, rounds: Int, local: Bool = false, checkEach: Bool,
                     midway: ((Database) async throws -> Void)? = nil) async throws -> Node {
        var g = Rng(s: seed)
        var model = Node.empty
        var history: [String] = []
        try await db.applyServerPut(at: "", [:])
        if local { try await db.reference("").setValue([:]) }
        for round in 0..<rounds {
            if round == rounds / 2 { try await midway?(db) }
            let at = path(&g, maxDepth: 2)
            let ref = try db.reference(at.description)
            switch g.next(6) {
            case 0, 1:
                let v = value(&g, depth: at.count)
                if local { try await ref.setValue(v) } else { try await db.applyServerPut(at: at.description, v) }
                history.append("put \(at) \(v)")
                model = model.updatingChild(at, try Node(v))
            case 2, 3:
                var children: [String: Value] = [:]
                for _ in 0..<(1 + g.next(3)) {
                    let first = keys[g.next(keys.count)]
                    let rest = g.next(2) == 0 ? "" : "/" + keys[g.next(keys.count)]
                    if children.keys.contains(where: { $0.hasPrefix(first) }) { continue }
                    children[first + rest] = value(&g, depth: at.count + 1)
                }
                if local { try await ref.updateChildValues(children) } else { try await db.applyServerMerge(at: at.description, children) }
                history.append("merge \(at) \(children)")
                for k in children.keys.sorted() { model = model.updatingChild(at.child(Path(k)), try Node(children[k]!)) }
            default:
                let p: Value = g.next(4) == 0 ? .null : priority(&g)
                if local { try await ref.setPriority(p) } else { try await db.applyServerPut(at: at.child(".priority").description, p) }
                history.append("priority \(at) \(p)")
                model = model.updatingChild(at.child(".priority"), try Node(p))
            }
            if checkEach { try await expectSame(db, model, "seed \(seed) round \(round)", history) }
        }
        return model
    }

    @Test func readingTheCacheEqualsApplyingItsWritesInOrder() async throws {
        for seed in UInt64(1)...40 {
            let db = Database.inMemory(options: quietOptions(.none))
            _ = try await Self.play(db, seed: seed, rounds: 60, checkEach: true)
        }
    }

    @Test func localWritesFoldedIntoOneAtTheRootReadAsApplyingThemInOrder() async throws {
        for seed in UInt64(200)...240 {
            let db = Database.inMemory(options: quietOptions(.none))
            _ = try await Self.play(db, seed: seed, rounds: 60, local: true, checkEach: true)
        }
        for seed in UInt64(300)...308 {
            let dir = try TemporaryDirectory()
            var db = try Database.open(at: dir.path, options: quietOptions(.none))
            let model = try await Self.play(db, seed: seed, rounds: 60, local: true, checkEach: seed == 300)
            try await Self.expectSame(db, model, "seed \(seed) stored")
            try await db.close()
            db = try Database.open(at: dir.path, options: quietOptions(.none))
            try await Self.expectSame(db, model, "seed \(seed) replayed")
            try await db.close()
        }
    }

    /// A removal that empties a node with a priority stands for that node as a whole while
    /// an older write folds it in; once that write is acknowledged, it is a removal at its own
    /// path again, and once it is acknowledged too, nothing is left of it.
    @Test func aRemovalThatEmptiedAPrioritizedNodeShadowsOnlyItsPathOnceTheOlderWriteIsAcknowledged() async throws {
        for stored in [false, true] {
            let dir = try TemporaryDirectory()
            let db = try Self.fresh(stored: stored, dir)
            try await db.applyServerPut(at: "", [:])
            let first = try await db.reference("c").setValue([".priority": 5, "q": 1])
            let second = try await db.reference("c/q").removeValue()
            #expect(try await db.reference("c").getData().exportValue == .null)
            try await db.reference("c/z").setValue(2)
            #expect(try await db.reference("c").getData().exportValue == ["z": 2], "the priority went with the last child")
            try await db.reference("c/z").removeValue()

            // The server acknowledges the first write (its value is now the server's), then
            // another client adds a child.
            try await db.acknowledgeWrites(through: first.writeID!)
            try await db.applyServerPut(at: "c/y", 3)
            let afterFirst = try await db.reference("c").getData().exportValue
            #expect(afterFirst == [".priority": 5, "y": 3])
            try await db.applyServerPut(at: "c/q", .null)
            try await db.acknowledgeWrites(through: second.writeID!)
            let afterBoth = try await db.reference("c").getData().exportValue
            #expect(afterBoth == [".priority": 5, "y": 3])
            try await db.close()
        }
    }

    /// A write below a location that another client then set to a leaf: once the write is
    /// acknowledged, a listener shows the leaf (the server's data), not the location removed —
    /// the acknowledgement re-applies the server's data at the write's path, where below a
    /// leaf there is none, and folding that into the listener's old value emptied it.
    @Test func aListenerShowsTheServersLeafOnceAWriteBelowItIsAcknowledged() async throws {
        for stored in [false, true] {
            let dir = try TemporaryDirectory()
            let db = try Self.fresh(stored: stored, dir)
            let shown = FerryMutex<[Value]>([])
            let handle = try db.reference("r").observe(.value) { s in shown.withLock { $0.append(s.value) } }
            try await db.applyServerPut(at: "r", ["b": ["a": 0], "z": 1], completingListenAt: "r")
            let write = try await db.reference("r/b/a").setValue(1)
            try await db.applyServerPut(at: "r/b/a", 1)  // the write, applied by the server
            try await db.applyServerPut(at: "r/b", false)  // then another client's
            #expect(shown.withLock { $0.last } == ["b": ["a": 1], "z": 1], "the pending write over the leaf")
            try await db.acknowledgeWrites(through: write.writeID!)
            #expect(shown.withLock { $0.last } == ["b": false, "z": 1], "\(stored ? "stored" : "in memory"): \(shown.withLock { $0 })")
            #expect(try await db.reference("r").getData().value == ["b": false, "z": 1])
            try db.reference("r").removeObserver(withHandle: handle)
            try await db.close()
        }
    }

    /// A server merge of many children is applied to a listener's view in one pass; what it
    /// shows — values and child events — is what the same changes one merge per child show,
    /// with local writes pending over some of them.
    @Test func aMergeOfManyChildrenShowsWhatOneMergePerChildShows() async throws {
        final class Seen: Sendable {
            let values = FerryMutex<[Value]>([])
            let children = FerryMutex<[String: Value]>([:])
        }
        var rng = SplitMix(seed: 0x6D3)
        for round in 0..<20 {
            var dbs: [Database] = []
            var seen: [Seen] = []
            for _ in 0..<2 {
                let db = Database.inMemory(options: quietOptions(.none))
                let s = Seen()
                _ = try db.reference("r").observe(.value) { snap in s.values.withLock { $0.append(snap.value) } }
                for type in [DataEventType.childAdded, .childChanged] {
                    _ = try db.reference("r").observe(type) { snap in s.children.withLock { $0[snap.key ?? ""] = snap.value } }
                }
                _ = try db.reference("r").observe(.childRemoved) { snap in s.children.withLock { $0[snap.key ?? ""] = .null } }
                var start: [String: Value] = [:]
                for i in 0..<40 where i % 3 != 0 { start["k\(i)"] = ["n": .int(Int64(i))] }
                try await db.applyServerPut(at: "r", .object(start), completingListenAt: "r")
                dbs.append(db)
                seen.append(s)
            }
            let local = "k\(rng.next() % 40)"
            for db in dbs { _ = try await db.reference("r/\(local)/mine").setValue(true) }
            var merge: [String: Value] = [:]
            for _ in 0..<Int(8 + rng.next() % 20) {
                let k = "k\(rng.next() % 40)"
                merge[rng.next() % 4 == 0 ? k + "/n" : k] = rng.next() % 5 == 0 ? .null : ["n": .int(Int64(rng.next() % 100)), "round": .int(Int64(round))]
            }
            try await dbs[0].applyServerMerge(at: "r", merge)
            for (k, v) in merge.sorted(by: { $0.key < $1.key }) { try await dbs[1].applyServerMerge(at: "r", [k: v]) }
            #expect(seen[0].values.withLock { $0.last } == seen[1].values.withLock { $0.last }, "round \(round): \(merge)")
            #expect(seen[0].children.withLock { $0 } == seen[1].children.withLock { $0 }, "round \(round)")
            #expect(try await dbs[0].reference("r").getData().value == (try await dbs[1].reference("r").getData().value))
            for db in dbs { try await db.close() }
        }
    }

    /// The other ways a write's effect can lie outside its own entry: a removal moved up and
    /// then shadowed by a newer write at its own path, reverted; a priority left out because
    /// the node was empty, which stands on its own once the write below it is acknowledged.
    @Test func writesFoldedIntoOtherEntriesComeBackWhenTheWriteTheyFoldedIntoGoes() async throws {
        for stored in [false, true] {
            let dir = try TemporaryDirectory()
            let db = try Self.fresh(stored: stored, dir)
            try await db.applyServerPut(at: "", [:])
            _ = try await db.reference("c").setValue([".priority": 5, "q": 1])
            let removal = try await db.reference("c/q").removeValue()
            try await db.reference("c/q").setValue(7)
            #expect(try await db.reference("c").getData().exportValue == ["q": 7])
            try await db.acknowledgeWrite(removal.writeID!, rejected: true)
            #expect(try await db.reference("c").getData().exportValue == [".priority": 5, "q": 7], "stored: \(stored)")

            try await db.acknowledgeWrites(through: try await db.reference("c/q").setValue(7).writeID!)
            let x = try await db.reference("x").removeValue()
            try await db.reference("x").setPriority(5)
            #expect(try await db.reference("x").getData().exportValue == .null)
            try await db.acknowledgeWrites(through: x.writeID!)
            try await db.applyServerPut(at: "x", ["b": 1])  // (another client's)
            #expect(try await db.reference("x").getData().exportValue == [".priority": 5, "b": 1], "stored: \(stored)")
            try await db.close()
        }
    }

    /// Where no write covers a location, a listener's events and a read agree on what the
    /// writes below it folded into: a child written whole, then changed below, its priority set
    /// and its first child removed.
    @Test func eventsAndReadsAgreeOnWritesFoldedBelowAnUnwrittenLocation() async throws {
        let db = Database.inMemory(options: quietOptions(.none))
        try await db.applyServerPut(at: "p", ["m": 1])
        let p = try db.reference("p")
        try await db.reference("p/n").setValue(["a": 1])
        try await db.reference("p/n/b").setValue(2)
        try await db.reference("p/n").setPriority(5)
        try await db.reference("p/n/a").removeValue()
        let read = try await p.getData()
        #expect(read.exportValue == ["m": 1, "n": [".priority": 5, "b": 2]])
        let shown = FerryMutex<[Value]>([])
        p.observe(.value) { s in shown.withLock { $0.append(s.exportValue) } }
        try await db.applyServerPut(at: "p/m", 2)
        try await db.applyServerPut(at: "p", ["m": 3, "n": ["a": 9]])  // (the writes still shadow n)
        #expect(shown.withLock { $0 } == [read.exportValue, ["m": 2, "n": [".priority": 5, "b": 2]], ["m": 3, "n": [".priority": 5, "b": 2]]])
    }

    /// Small segments, compaction only when asked, no checkpoint on close.
    static var compactingOptions: DatabaseOptions {
        var o = quietOptions(.none)
        o.segmentSize = 16 << 10
        o.compactionSegments = nil
        o.checkpointOnClose = false
        return o
    }

    /// Server records that compress little (the first records' segments fill and close), then
    /// a pending local write at `zz` (its segment and the later ones stay).
    static func fillSegments(_ db: Database, seed: UInt64) async throws {
        var g = Rng(s: seed)
        for i in 0..<48 {
            try await db.applyServerPut(at: "fill/\(i)", .string(String((0..<900).map { _ in Character(UnicodeScalar(UInt8(33 + g.next(90)))) })))
        }
        try await db.reference("zz").setValue(1)
    }

    /// Compaction restates the old server data after the records it keeps; replayed from the
    /// log alone (no checkpoint), the kept records meet a cache without that data. The entries
    /// that a removal and a priority left there must still come out as they were live.
    @Test func aCompactedCacheReplaysToTheSamePrioritiesWithoutACheckpoint() async throws {
        let dir = try TemporaryDirectory()
        let o = Self.compactingOptions
        let db = try Database.open(at: dir.path, options: o)
        try await db.applyServerPut(at: "", ["c": [".priority": 5, "q": 1], "x": ["a": 1]])
        try await Self.fillSegments(db, seed: 9)
        try await db.applyServerPut(at: "c/q", .null)  // (c empties: its priority goes)
        try await db.applyServerPut(at: "x/a", .null)
        try await db.applyServerPut(at: "x/.priority", 3)  // (x is empty: nothing)
        try await db.applyServerPut(at: "c/z", 2)
        try await db.applyServerPut(at: "x/b", 1)
        func expectAsLive(_ db: Database, _ what: String) async throws {
            #expect(try await db.reference("c").getData().exportValue == ["z": 2], "\(what)")
            #expect(try await db.reference("x").getData().exportValue == ["b": 1], "\(what)")
        }
        try await expectAsLive(db, "live")
        try await db.sync()
        let report = try await db.compact()
        #expect(!report.deletedSegments.isEmpty)
        try await expectAsLive(db, "compacted")
        try await db.close()
        try CompactionTests.removeCheckpoints(dir)
        let again = try Database.open(at: dir.path, options: o)
        try await expectAsLive(again, "replayed from the log alone")
        try await again.close()
    }

    /// Random server writes, half of them before a pending local write and records enough to
    /// close segments, half after; then a compaction, and the log replayed without a checkpoint.
    @Test func aCompactedCacheOfRandomWritesReplaysAsItWasLive() async throws {
        var compacted = 0
        for seed in UInt64(500)...530 {
            let dir = try TemporaryDirectory()
            let o = Self.compactingOptions
            let db = try Database.open(at: dir.path, options: o)
            let model = try await Self.play(db, seed: seed, rounds: 60, checkEach: false) { db in
                try await Self.fillSegments(db, seed: seed)
            }
            try await db.sync()
            if try await !db.compact().deletedSegments.isEmpty { compacted += 1 }
            try await Self.expectSame(db, model, "seed \(seed) compacted", root: false)
            try await db.close()
            try CompactionTests.removeCheckpoints(dir)
            let again = try Database.open(at: dir.path, options: o)
            try await Self.expectSame(again, model, "seed \(seed) replayed from the log alone", root: false)
            try await again.close()
        }
        #expect(compacted > 20)
    }

    @Test func theStoredCacheEqualsItAfterAReopenAndACheckpoint() async throws {
        for seed in UInt64(100)...115 {
            let dir = try TemporaryDirectory()
            var db = try Database.open(at: dir.path, options: quietOptions(.none))
            let model = try await Self.play(db, seed: seed, rounds: 60, checkEach: seed == 100)
            try await Self.expectSame(db, model, "seed \(seed) stored")
            try await db.close()
            db = try Database.open(at: dir.path, options: quietOptions(.none))
            try await Self.expectSame(db, model, "seed \(seed) replayed")
            try await db.checkpoint()
            try await db.close()
            db = try Database.open(at: dir.path, options: quietOptions(.none))
            try await Self.expectSame(db, model, "seed \(seed) from a checkpoint")
            try await db.close()
        }
    }
}
