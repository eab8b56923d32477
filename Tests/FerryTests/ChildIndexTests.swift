import FerryLog
import Foundation
import FerryTestSupport
import Synchronization
import Testing

@testable @_spi(Server) import Ferry

/// Child-value indexes (`DatabaseOptions.indexes`): a limited query they order reads its
/// window from the index, and must show what the filter over every child shows.
@Suite struct ChildIndexTests {
    /// A sort key holds each UTF-16 unit of the child's key, plus one, in three bytes, then
    /// three zeros — the bytes checkpoints keep — whether the key is ASCII (read from its
    /// bytes) or not; and it says how many of its bytes encode the value.
    @Test func sortKeysHoldEachUnitOfTheKeyInThreeBytes() throws {
        for key in ["p00012345", "a", "~", "\u{7F}x", "é", "😀k", "k\u{E000}", "-0", "007", "12"] {
            var out: [UInt8] = [], valueLength = 0
            #expect(SortKey.encode(value: try Node(.int(5)), key: key, into: &out, valueLength: &valueLength))
            #expect(valueLength == 9, "a number: its tag and 8 bytes")
            var units: [UInt8] = []
            for u in key.utf16 {
                let v = UInt32(u) + 1
                units += [UInt8(v >> 16), UInt8(v >> 8 & 0xff), UInt8(v & 0xff)]
            }
            units += [0, 0, 0]
            #expect(Array(out.suffix(units.count)) == units, "\(key)")
            #expect(SortKey.keyStart(out) == out.count - units.count, "\(key)")
        }
    }

    /// Sort keys order (value, key) pairs exactly as the Realtime Database orders children by
    /// a child's value: random values of every type, random keys (integers, leading zeros,
    /// negative numbers, strings with characters beyond the BMP).
    @Test func sortKeysOrderAsFirebaseOrdersChildrenByValue() throws {
        var g = SplitMix(seed: 7)
        let index = QueryIndex.child(Path("v"))
        func randomKey() -> String {
            switch Int.random(in: 0..<8, using: &g) {
            case 0: return String(Int.random(in: -30...30, using: &g))
            case 1: return "00" + String(Int.random(in: 0...9, using: &g))
            case 2: return String(Int64(Int32.max) + Int64.random(in: 0...2, using: &g))
            case 3: return "😀" + String(Int.random(in: 0...3, using: &g))
            case 4: return "\u{E000}" + String(Int.random(in: 0...3, using: &g))
            default: return ["a", "b", "ab", "-", "-a", "A", "é", "z9"].randomElement(using: &g)!
            }
        }
        func randomValue() -> Node {
            switch Int.random(in: 0..<9, using: &g) {
            case 0: return .empty
            case 1: return .leaf(.bool(Bool.random(using: &g)), priority: .empty)
            case 2: return .leaf(.int(Int64.random(in: -3...3, using: &g)), priority: .empty)
            case 3: return .leaf(.double([-0.0, 0.0, 1.5, -2.25, 3.0, 1e300, -1e-300].randomElement(using: &g)!), priority: .empty)
            case 4: return .leaf(.int([Int64(1 << 53), -(1 << 53), Int64(Int32.max)].randomElement(using: &g)!), priority: .empty)
            case 5: return .leaf(.string(["", "a", "ab", "b", "😀", "\u{E000}", "é", "\u{0}"].randomElement(using: &g)!), priority: .empty)
            case 6: return .leaf(.deferred(ServerValue.timestamp), priority: .empty)
            case 7: return .children(ChildMap(sorted: [NamedNode(name: "q", node: .leaf(.int(1), priority: .empty))]), priority: .empty)
            default: return .leaf(.int(Int64.random(in: -3...3, using: &g)), priority: .leaf(.int(1), priority: .empty))
            }
        }
        var items: [(NamedNode, [UInt8])] = []
        for _ in 0..<400 {
            let key = randomKey()
            let node = Node.empty.updatingChild(Path("v"), randomValue()).updatingChild(Path("w"), .leaf(.int(1), priority: .empty))
            var bytes: [UInt8] = []
            #expect(SortKey.encode(value: node.getChild(Path("v")), key: key, into: &bytes))
            #expect(SortKey.key(of: bytes) == key)
            items.append((NamedNode(name: key, node: node), bytes))
        }
        for _ in 0..<20_000 {
            let (a, ab) = items.randomElement(using: &g)!, (b, bb) = items.randomElement(using: &g)!
            let firebase = index.compare(a, b)
            let bytes = ab == bb ? 0 : (ab.lexicographicallyPrecedes(bb) ? -1 : 1)
            #expect(firebase == bytes, "\(a.name)=\(a.node.getChild(Path("v"))) vs \(b.name)=\(b.node.getChild(Path("v")))")
        }
        // Integers beyond ±2^53 cannot be ordered by bytes exactly: the index is then not used.
        var bytes: [UInt8] = []
        #expect(!SortKey.encode(value: .leaf(.int(1 << 60), priority: .empty), key: "k", into: &bytes))
    }

    static let indexes = [ChildIndex(location: "data", child: "x"), ChildIndex(location: "data", child: "likes")]

    static let shapes: [(child: String, limit: Int, fromLeft: Bool)] = [
        ("x", 5, false), ("x", 1, true), ("likes", 9, true), ("likes", 50, false), ("x", 2_000, false),
    ]

    /// Every query shape, answered with the index, against the filter over the whole data.
    static func expectIndexedAnswers(_ db: Database, _ label: String) async throws {
        let node = try LazySnapshotTests.materialized(db, "data")
        for shape in shapes {
            let ordered = try db.reference("data").queryOrdered(byChild: shape.child)
            let query = shape.fromLeft ? try ordered.queryLimited(toFirst: shape.limit) : try ordered.queryLimited(toLast: shape.limit)
            let index = query.params.index
            let expected = query.params.nodeFilter.updateFullNode(IndexedNode(.empty, index: index), IndexedNode(node, index: index), accumulator: nil).node
            let s = try await query.getData()
            #expect(s.exportValue == DataSnapshot(ref: s.ref, node: expected, metadata: s.metadata).exportValue, "\(label), \(query.params)")
            #expect(s.children.map(\.key) == IndexedNode(expected, index: index).ordered.map(\.name), "\(label), \(query.params): order")
            let used = db.engine.withLock { e in e.childIndex(for: query.spec).map { $0.isCurrent } }
            #expect(used == true, "\(label), \(query.params): answered from a current index")
        }
    }

    @Test(arguments: [UInt64(1), 2, 3, 4])
    func aLimitedQueryReadFromTheIndexShowsWhatTheWholeDataShows(seed: UInt64) async throws {
        let dir = try TemporaryDirectory()
        var db = try await LazySnapshotTests.build(seed: seed, in: dir, indexes: Self.indexes)
        try await Self.expectIndexedAnswers(db, "seed \(seed), built on first use")
        // Changes after the index is built move its entries: writes below children, removals,
        // server data, acknowledgements, a revert.
        var g = SplitMix(seed: seed &+ 99)
        var ids: [Int64] = []
        for _ in 0..<300 {
            let k = LazySnapshotTests.key(&g, 700, plain: seed % 2 == 1)
            let child = try db.reference("data").child(k)
            switch Int.random(in: 0..<6, using: &g) {
            case 0: ids.append(try await child.child("x").setValue(LazySnapshotTests.leaf(&g)).writeID!)
            case 1: ids.append(try await child.child("likes").setValue(.int(Int64.random(in: -9...9, using: &g))).writeID!)
            case 2: ids.append(try await child.setValue(.null).writeID!)
            case 3: try await db.applyServerPut(at: "data/\(k)", LazySnapshotTests.value(&g))
            case 4: ids.append(try await child.setValue(LazySnapshotTests.value(&g)).writeID!)
            default: try await db.applyServerMerge(at: "data/\(k)", ["likes": .int(Int64.random(in: 0...3, using: &g))])
            }
        }
        try await Self.expectIndexedAnswers(db, "seed \(seed), after changes")
        if let first = ids.first {
            try await db.acknowledgeWrites(through: ids[ids.count / 2], rejecting: [WriteRejection(writeID: first, status: 401, message: "no")])
        }
        try await Self.expectIndexedAnswers(db, "seed \(seed), after answers")
        _ = try await db.compact()
        try await Self.expectIndexedAnswers(db, "seed \(seed), after compaction")
        // Closing keeps the index in the checkpoint; the open restores it (no walk).
        try await db.close()
        var options = quietOptions(.none)
        options.segmentSize = 32 << 10
        options.indexes = Self.indexes
        db = try Database.open(at: dir.path, options: options)
        #expect(db.engine.withLock { $0.childIndexes.allSatisfy(\.isCurrent) }, "restored from the checkpoint: \(db.engine.withLock { $0.childIndexes.map { ($0.needsRebuild, $0.unusable, $0.sorted.count) } })")
        try await Self.expectIndexedAnswers(db, "seed \(seed), reopened")
        // A write at the location itself: the index is rebuilt.
        try await db.applyServerPut(at: "data", ["a": ["x": 1, "likes": 3], "b": ["x": 0]])
        #expect(db.engine.withLock { $0.childIndexes.allSatisfy { $0.needsRebuild } })
        try await Self.expectIndexedAnswers(db, "seed \(seed), replaced")
        try await db.close()
        // Opened without the indexes, the checkpoint's are skipped.
        options.indexes = []
        db = try Database.open(at: dir.path, options: options)
        #expect(try await db.reference("data/a/likes").getData().value == .int(3))
        try await db.close()
    }

    /// A limited listener over an indexed location finds the child after its window from the
    /// index (O(log n)); it must raise exactly the events an unindexed one raises (which works
    /// it out from every child) through writes, removals, server data, answers and reverts —
    /// and all show what the store's data shows (answered writes once showed old values). The
    /// three databases: the index declared; none declared, so the listeners get one made for
    /// them (``DatabaseOptions/automaticIndexes``: the location is big enough); no index at all.
    @Test(arguments: [UInt64(11), 12, 13])
    func aLimitedListenerOverAnIndexRaisesWhatOneWithoutRaises(seed: UInt64) async throws {
        let dirs = [try TemporaryDirectory(), try TemporaryDirectory(), try TemporaryDirectory()]
        var dbs: [Database] = []
        for (i, dir) in dirs.enumerated() {
            var options = quietOptions(.none)
            if i == 0 { options.indexes = [ChildIndex(location: "data", child: "likes")] }
            if i == 2 { options.automaticIndexes = false }
            dbs.append(try Database.open(at: dir.path, options: options))
        }
        var g = SplitMix(seed: seed)
        var children: [String: Value] = [:]
        for i in 0..<600 { children["k\(i)"] = Value.object(["likes": .int(Int64.random(in: 0...40, using: &g)), "n": .int(Int64(i))]) }
        final class Log: Sendable { let lines = FerryMutex<[String]>([]) }
        let logs = [Log(), Log(), Log()]
        for (db, log) in zip(dbs, logs) {
            try await db.applyServerPut(at: "data", .object(children))
            let ordered = try db.reference("data").queryOrdered(byChild: "likes")
            for (name, query) in [("last5", try ordered.queryLimited(toLast: 5)), ("first3", try ordered.queryLimited(toFirst: 3)),
                                  ("byPriority4", try db.reference("data").queryLimited(toLast: 4))] {
                for type in DataEventType.allCases {
                    _ = query.observe(type) { s in
                        let what = type == .value ? s.children.map { $0.key! }.joined(separator: ",") : "\(s.key!)=\(String(describing: s.value))"
                        log.lines.withLock { $0.append("\(name) \(type) \(what)") }
                    }
                }
            }
        }
        for db in dbs.prefix(2) {
            // (by likes, and by priority: always made for the listener)
            #expect(db.engine.withLock { $0.childIndexes.count == 2 && $0.childIndexes.allSatisfy(\.isCurrent) }, "the indexes are built before the changes")
        }
        #expect(dbs[0].engine.withLock { $0.childIndexes.map(\.automatic) } == [false, true])
        #expect(dbs[1].engine.withLock { $0.childIndexes.allSatisfy(\.automatic) })
        #expect(dbs[2].engine.withLock { $0.childIndexes.isEmpty })
        let spec = try dbs[0].reference("data").queryOrdered(byChild: "likes").queryLimited(toLast: 5).spec
        for db in dbs.prefix(2) {
            #expect(db.engine.withLock { $0.syncTree.view(for: spec)?.storeBacked } == true, "the indexed view holds its window only")
        }
        #expect(dbs[2].engine.withLock { $0.syncTree.view(for: spec)?.storeBacked } == false)
        let lookupsBefore = dbs.map { db in db.engine.withLock { $0.indexedChildLookups } }
        var ids: [[Int64]] = [[], [], []]
        for step in 0..<400 {
            let op = Int.random(in: 0..<9, using: &g)
            var k = "k\(Int.random(in: 0..<620, using: &g))"
            if op == 0 || op == 3, let window = logs[2].lines.withLock({ $0.last { $0.hasPrefix("last5 value") } }) {
                // A child of the window leaves it (or drops), and the next one must come in.
                let keys = window.dropFirst("last5 value ".count).split(separator: ",")
                if !keys.isEmpty { k = String(keys[Int.random(in: 0..<keys.count, using: &g)]) }
            }
            let likes = Value.int(Int64.random(in: -5...45, using: &g))
            let through = Int.random(in: 0..<3, using: &g)
            for (i, db) in dbs.enumerated() {
                if step % 10 == 0 {
                    // Each view shows what the filter over the store's whole data shows.
                    let node = try LazySnapshotTests.materialized(db, "data")
                    let ordered = try db.reference("data").queryOrdered(byChild: "likes")
                    for (name, query) in [("last5", try ordered.queryLimited(toLast: 5)), ("first3", try ordered.queryLimited(toFirst: 3)),
                                          ("byPriority4", try db.reference("data").queryLimited(toLast: 4))] {
                        let truth = IndexedNode(query.params.filtered(node), index: query.params.index).ordered.map(\.name).joined(separator: ",")
                        let shown = logs[i].lines.withLock { $0.last { $0.hasPrefix("\(name) value") } }
                        #expect(shown == "\(name) value \(truth)", "seed \(seed), step \(step), database \(i)")
                    }
                }
                let child = try db.reference("data").child(k)
                if step == 150 {
                    // The whole location from the server: the index is built again, and a
                    // store-backed view becomes a view like any other.
                    try await db.applyServerPut(at: "data", .object(children.filter { $0.key.hasSuffix("7") == false }))
                    continue
                }
                if step == 300, i < 2 {
                    #expect(db.engine.withLock { $0.syncTree.view(for: spec)?.storeBacked } == false, "demoted at step 150")
                }
                switch op {
                case 0: ids[i].append(try await child.child("likes").setValue(.int(-9)).writeID!)
                case 1, 2: ids[i].append(try await child.child("likes").setValue(likes).writeID!)
                case 3: ids[i].append(try await child.setValue(.null).writeID!)
                case 4: try await db.applyServerMerge(at: "data/\(k)", ["likes": likes])
                case 5: try await db.applyServerPut(at: "data/\(k)", step % 2 == 0 ? .null : ["likes": likes])
                case 6: ids[i].append(try await child.setValue(["likes": likes, "n": .int(Int64(step))]).writeID!)
                case 7 where step % 3 != 0:
                    // A priority (or none): moves the child in the priority order.
                    let priority: Value = through == 0 ? .null : through == 1 ? likes : .string("p\(likes)")
                    ids[i].append(try await child.setPriority(priority).writeID!)
                default:
                    // The server answers the oldest pending writes, rejecting one now and then.
                    if through == 2, !ids[i].isEmpty {
                        try await db.acknowledgeWrite(ids[i].removeFirst())  // (one answer, outside the cursor)
                    } else if ids[i].count > through {
                        let rejected = through == 0 ? [WriteRejection(writeID: ids[i][0], status: 401, message: "no")] : []
                        try await db.acknowledgeWrites(through: ids[i][through], rejecting: rejected)
                        ids[i].removeFirst(through + 1)
                    }
                }
            }
        }
        let plain = logs[2].lines.withLock { $0 }
        for (i, name) in ["declared", "automatic"].enumerated() {
            let indexed = logs[i].lines.withLock { $0 }
            #expect(indexed.count == plain.count, "\(name)")
            for (n, (a, b)) in zip(indexed, plain).enumerated() where a != b {
                Issue.record("seed \(seed): event \(n) differs: \(name) index \(a), without \(b)")
                break
            }
            #expect(dbs[i].engine.withLock { $0.indexedChildLookups } - lookupsBefore[i] > 20, "the \(name) index's views read their windows from it")
        }
        #expect(plain.filter { $0.contains("child_removed") }.count > 20, "windows changed often enough to pull in next children")
        #expect(dbs[2].engine.withLock { $0.indexedChildLookups } == lookupsBefore[2])
        for db in dbs { try await db.close() }
    }

    /// A listener of a limited query ordered by a child over a big location that no declared
    /// index orders gets an index made for it: built before its first event, used to find the
    /// child after its window when a write moves one out (no walk of every child under the
    /// lock), built again in the background when the server replaces the location, never
    /// written into a checkpoint, kept while a listener of that location and child remains,
    /// then dropped. A small location, or a database that turned the option off, gets none.
    @Test func aListenerOfALimitedQueryOverABigLocationGetsAnIndexWhileItListens() async throws {
        for automatic in [true, false] {
            let dir = try TemporaryDirectory()
            var options = quietOptions(.none)
            options.automaticIndexes = automatic
            let db = try Database.open(at: dir.path, options: options)
            var children: [String: Value] = [:]
            for i in 0..<1_000 { children["k\(i)"] = ["likes": .int(Int64(i))] }
            // (One stored value above both: the children are counted inside it.)
            try await db.applyServerPut(at: "", ["big": .object(children), "small": ["a": ["likes": 1], "b": ["likes": 2]]])
            let top = try db.reference("big").queryOrdered(byChild: "likes").queryLimited(toLast: 3)
            let bottom = try db.reference("big").queryOrdered(byChild: "likes").queryLimited(toFirst: 2)
            let shown = FerryMutex<[String]>([])
            let first = top.observe(.value) { s in shown.withLock { $0 = s.children.map { $0.key! } } }
            let second = bottom.observe(.value) { _ in }
            let small = try db.reference("small").queryOrdered(byChild: "likes").queryLimited(toLast: 1).observe(.value) { _ in }
            #expect(db.engine.withLock { $0.childIndexes.map(\.location) } == (automatic ? [Path("big")] : []), "automatic: \(automatic)")
            #expect(db.engine.withLock { $0.childIndexes.allSatisfy { $0.automatic && $0.isCurrent } })
            #expect(db.engine.withLock { $0.checkpointImage.childIndexes.isEmpty }, "never in a checkpoint")
            #expect(shown.withLock { $0 } == ["k997", "k998", "k999"])
            let lookups = db.engine.withLock { $0.indexedChildLookups }
            try await db.reference("big/k999/likes").setValue(.int(-1))  // out of the window: k996 comes in
            #expect(shown.withLock { $0 } == ["k996", "k997", "k998"])
            #expect(db.engine.withLock { $0.indexedChildLookups } > lookups || !automatic, "the next child came from the index")
            // The server replaces the whole location: the index is built again in the
            // background (no query asks for it), and the window's changes use it again.
            var replaced: [String: Value] = [:]
            for i in 0..<1_000 { replaced["n\(i)"] = ["likes": .int(Int64(i))] }
            try await db.applyServerPut(at: "big", .object(replaced))
            #expect(shown.withLock { $0 } == ["n997", "n998", "n999"])
            #expect(await eventually { db.engine.withLock { $0.childIndexes.allSatisfy(\.isCurrent) } }, "rebuilt while its listeners listen")
            #expect(db.engine.withLock { $0.backgroundIndexRebuilds } == (automatic ? 1 : 0))
            let lookupsAfter = db.engine.withLock { $0.indexedChildLookups }
            try await db.reference("big/n999/likes").setValue(.int(-1))
            #expect(shown.withLock { $0 } == ["n996", "n997", "n998"])
            #expect(db.engine.withLock { $0.indexedChildLookups } > lookupsAfter || !automatic, "the rebuilt index gave the next child")
            try db.reference("big").queryOrdered(byChild: "likes").queryLimited(toLast: 3).removeObserver(withHandle: first)
            #expect(db.engine.withLock { $0.childIndexes.count } == (automatic ? 1 : 0), "another listener still uses it")
            try db.reference("small").removeObserver(withHandle: small)
            bottom.removeObserver(withHandle: second)
            #expect(db.engine.withLock { $0.childIndexes.isEmpty && $0.writeTree.indexedChildren == nil }, "dropped with its last listener")
            try await db.close()
        }
    }

    /// A child whose value has no sort key (an integer past 2^53) makes the index made for a
    /// listener unusable, wherever it sorts — also last, after children with values: the
    /// listener still gets the window the data gives (the build read past its buffer there).
    @Test func aValueWithNoSortKeyLastInKeyOrderLeavesTheIndexUnusedNotTheListener() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        var children: [String: Value] = [:]
        for i in 0..<1_000 { children["k\(1_000 + i)"] = ["likes": .int(Int64(i))] }
        children["k9999"] = ["likes": .int(1 << 60)]
        try await db.applyServerPut(at: "big", .object(children))
        let shown = FerryMutex<[String]>([])
        let handle = try db.reference("big").queryOrdered(byChild: "likes").queryLimited(toLast: 3)
            .observe(.value) { s in shown.withLock { $0 = s.children.map { $0.key! } } }
        #expect(shown.withLock { $0 } == ["k1998", "k1999", "k9999"])
        try await db.reference("big/k9999/likes").setValue(.int(-1))
        #expect(shown.withLock { $0 } == ["k1997", "k1998", "k1999"])
        try db.reference("big").removeObserver(withHandle: handle)
        try await db.close()
    }

    /// Firebase's default order is by priority: a listener of `queryLimited(toLast:)` alone
    /// over a big location gets an index by priority made for it (children without one first,
    /// by key), holds its window alone, and finds the next child through the index when a
    /// priority moves one out.
    @Test func aLimitedListenerInPriorityOrderGetsAnIndexByPriority() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        var children: [String: Value] = [:]
        for i in 0..<1_000 { children["m\(i)"] = i < 10 ? ["text": "no priority"] : [".value": ["text": .int(Int64(i))], ".priority": .int(Int64(i))] }
        try await db.applyServerPut(at: "chat", .object(children))
        let query = try db.reference("chat").queryLimited(toLast: 3)
        let shown = FerryMutex<[String]>([])
        let handle = query.observe(.value) { s in shown.withLock { $0 = s.children.map { $0.key! } } }
        #expect(db.engine.withLock { $0.childIndexes.map(\.child) } == [Path(keys: [".priority"])])
        #expect(db.engine.withLock { $0.syncTree.view(for: query.spec)?.storeBacked } == true)
        #expect(shown.withLock { $0 } == ["m997", "m998", "m999"])
        let lookups = db.engine.withLock { $0.indexedChildLookups }
        _ = try await db.reference("chat/m999").setPriority(.null)  // to the front, among the ten without one
        #expect(shown.withLock { $0 } == ["m996", "m997", "m998"])
        #expect(db.engine.withLock { $0.indexedChildLookups } > lookups)
        let first = try await db.reference("chat").queryLimited(toFirst: 11).getData().children.map { $0.key! }
        #expect(first == ["m0", "m1", "m2", "m3", "m4", "m5", "m6", "m7", "m8", "m9", "m999"])
        query.removeObserver(withHandle: handle)
        #expect(db.engine.withLock { $0.childIndexes.isEmpty })
        try await db.close()
    }

    /// A sort key longer than the longest key a checkpoint holds (a string value of 9,000
    /// characters: 27 KB) leaves its index out of the checkpoint, which stays loadable; the
    /// next open builds the index again when a query needs it.
    @Test func anIndexWithAVeryLongSortKeyIsLeftOutOfTheCheckpointNotTheCheckpoint() async throws {
        let dir = try TemporaryDirectory()
        var options = quietOptions(.none)
        options.indexes = [ChildIndex(location: "data", child: "likes")]
        var db = try Database.open(at: dir.path, options: options)
        var children: [String: Value] = [:]
        for i in 0..<50 { children["k\(i)"] = ["likes": .int(Int64(i))] }
        children["long"] = ["likes": .string(String(repeating: "é", count: 9_000))]
        try await db.applyServerPut(at: "data", .object(children))
        let query = try db.reference("data").queryOrdered(byChild: "likes").queryLimited(toLast: 2)
        let before = try await query.getData().children.map { $0.key! }
        #expect(before == ["k49", "long"])
        try await db.close()
        options.checkpointOnClose = false
        db = try Database.open(at: dir.path, options: options)
        #expect(db.engine.withLock { $0.checkpointLSN } > 0, "the checkpoint loads")
        #expect(db.engine.withLock { $0.childIndexes.allSatisfy(\.needsRebuild) }, "without the index")
        let again = try db.reference("data").queryOrdered(byChild: "likes").queryLimited(toLast: 2)
        #expect(try await again.getData().children.map { $0.key! } == before)
        #expect(db.engine.withLock { $0.childIndexes.allSatisfy(\.isCurrent) }, "built again by the query")
        try await db.close()
    }

    static func store(_ dir: TemporaryDirectory) async throws -> Database {
        var options = quietOptions(.none)
        options.indexes = [ChildIndex(location: "data", child: "likes")]
        let db = try Database.open(at: dir.path, options: options)
        var children: [String: Value] = [:]
        for i in 0..<600 { children["k\(1000 + i)"] = ["likes": .int(Int64(i % 37))] }
        try await db.applyServerPut(at: "data", .object(children))
        return db
    }

    static func top(_ db: Database, _ n: Int, fromLeft: Bool = true) async throws -> [String] {
        let q = try db.reference("data").queryOrdered(byChild: "likes")
        return try await (fromLeft ? q.queryLimited(toFirst: n) : q.queryLimited(toLast: n)).getData().children.map { $0.key! }
    }

    static func expected(_ db: Database, _ n: Int, fromLeft: Bool = true) throws -> [String] {
        let node = try LazySnapshotTests.materialized(db, "data")
        let sorted = IndexedNode(node, index: .child(Path("likes"))).ordered.map(\.name)
        return fromLeft ? Array(sorted.prefix(n)) : Array(sorted.suffix(n))
    }

    @Test func integerKeysWithManyLeadingZerosAreIndexedAndKept() async throws {
        let dir = try TemporaryDirectory()
        var db = try await Self.store(dir)
        let long = String(repeating: "0", count: 300) + "1"
        _ = try await db.reference("data").child(long).setValue(["likes": -1])
        #expect(try await Self.top(db, 3) == Self.expected(db, 3))
        #expect(try await Self.top(db, 1) == [long])
        try await db.close()
        var options = quietOptions(.none)
        options.indexes = [ChildIndex(location: "data", child: "likes")]
        db = try Database.open(at: dir.path, options: options)
        #expect(db.engine.withLock { $0.childIndexes.allSatisfy(\.isCurrent) })
        #expect(try await Self.top(db, 1) == [long])
        try await db.close()
    }

    @Test func aPriorityOnTheIndexedLocationIsNotAChild() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.store(dir)
        #expect(try await Self.top(db, 3) == Self.expected(db, 3))
        _ = try await db.reference("data").setPriority(5)
        #expect(try await Self.top(db, 3) == Self.expected(db, 3))
        #expect(try await Self.top(db, 3).count == 3)
        try await db.close()
        withExtendedLifetime(dir) {}
    }

    @Test func aRebuildWhileAnotherRunsReadsWithoutTheIndexAndTheFirstStillLandsRight() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.store(dir)
        let index = try #require(db.engine.withLock { $0.childIndexes.first })
        // A first reader's rebuild, begun by hand on a frozen copy.
        let (token, frozen) = try #require(db.engine.withLock { e -> (UInt64, FrozenData)? in
            let token = index.beginRebuild()
            return e.freeze { _ in }.map { (token, $0) }
        })
        _ = try await db.reference("data/k1500/likes").setValue(-100)
        // A second reader meanwhile answers from a walk, and starts no rebuild of its own.
        #expect(try await Self.top(db, 1) == ["k1500"])
        #expect(index.isRebuilding)
        let built = try #require(ChildValueIndex.build(frozen, location: index.location, child: index.child))
        #expect(db.engine.withLock { _ in index.finishRebuild(built.0, usable: built.usable, frozen: frozen, token: token) })
        #expect(db.engine.withLock { _ in index.isCurrent })
        #expect(try await Self.top(db, 1) == ["k1500"], "the change made during the rebuild moved the child")
        #expect(try await Self.top(db, 5, fromLeft: false) == Self.expected(db, 5, fromLeft: false))
        try await db.close()
        withExtendedLifetime(dir) {}
    }

    /// A rebuild that a reset made stale (the server replaced the location while it ran) is
    /// refused when it finishes, no second rebuild starts while it runs, and, as a listener
    /// uses the index, the index is then built again from the new data in the background.
    @Test func aRebuildMadeStaleByAResetIsRefusedAndTheIndexIsBuiltFromTheNewData() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.store(dir)
        let index = try #require(db.engine.withLock { $0.childIndexes.first })
        let query = try db.reference("data").queryOrdered(byChild: "likes").queryLimited(toLast: 2)
        let handle = query.observe(.value) { _ in }
        #expect(db.engine.withLock { _ in index.isCurrent })
        try await db.applyServerPut(at: "data/k1000", ["likes": 1])  // (a change below: no reset)
        let (token, frozen) = try #require(db.engine.withLock { e -> (UInt64, FrozenData)? in
            e.childIndexes[0].refresh()
            index.willChangeEverything()  // (as a reset would leave it, so that a rebuild may begin)
            let token = index.beginRebuild()
            return e.freeze { _ in }.map { (token, $0) }
        })
        try await db.applyServerPut(at: "data", ["x": ["likes": 1], "y": ["likes": 2], "z": ["likes": 0]])
        #expect(db.engine.withLock { _ in index.isRebuilding }, "no second rebuild begins while the stale one runs")
        let built = try #require(ChildValueIndex.build(frozen, location: index.location, child: index.child))
        #expect(db.engine.withLock { _ in !index.finishRebuild(built.0, usable: built.usable, frozen: frozen, token: token) }, "refused")
        #expect(db.engine.withLock { _ in !index.isCurrent && !index.isRebuilding })
        try await db.reference("elsewhere").setValue(1)  // (any operation: the listener's index is due)
        #expect(await eventually { db.engine.withLock { _ in index.isCurrent } }, "built again in the background")
        #expect(db.engine.withLock { _ in index.keys(first: 10, fromEnd: false) } == ["z", "x", "y"], "the new data's children alone")
        query.removeObserver(withHandle: handle)
        try await db.close()
        withExtendedLifetime(dir) {}
    }

    @Test func anIndexThatCouldNotOrderAValueIsUsedAgainOnceItIsGone() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.store(dir)
        _ = try await db.reference("data/k1001/likes").setValue(.int(1 << 60))
        #expect(try await Self.top(db, 2, fromLeft: false) == Self.expected(db, 2, fromLeft: false))
        // While it cannot order a value, a listener's writes below the location schedule no
        // rebuild in the background (it would walk every child at each write, to no use).
        let handle = try db.reference("data").queryOrdered(byChild: "likes").queryLimited(toLast: 2).observe(.value) { _ in }
        let rebuilds = db.engine.withLock { $0.backgroundIndexRebuilds }
        for i in 0..<5 { _ = try await db.reference("data/k10\(10 + i)/likes").setValue(.int(Int64(i))) }
        // A write decides under the lock, before it returns, whether it schedules a rebuild: one
        // it scheduled is then still due, under way or counted as begun (the three are one step
        // under the lock in `rebuildListenedIndexes`), so there is nothing to wait for.
        #expect(db.engine.withLock { e in e.childIndexes.allSatisfy { !$0.rebuildScheduled && !$0.isRebuilding } })
        #expect(db.engine.withLock { $0.backgroundIndexRebuilds } == rebuilds)
        try db.reference("data").queryOrdered(byChild: "likes").queryLimited(toLast: 2).removeObserver(withHandle: handle)
        _ = try await db.reference("data/k1001/likes").setValue(5)
        #expect(try await Self.top(db, 4) == Self.expected(db, 4))
        #expect(db.engine.withLock { $0.childIndexes.allSatisfy(\.isCurrent) }, "rebuilt and usable again")
        try await db.close()
        withExtendedLifetime(dir) {}
    }

    @Test func aBadIndexDeclarationIsRefusedWithItsReason() throws {
        var options = quietOptions(.none)
        options.indexes = [ChildIndex(location: "posts", child: "a.b")]
        #expect(throws: DatabaseError.self) { _ = try Database.open(at: try TemporaryDirectory().path, options: options) }
        options.indexes = [ChildIndex(location: "posts", child: "likes"), ChildIndex(location: "posts", child: "likes")]
        #expect { _ = try Database.open(at: try TemporaryDirectory().path, options: options) } throws: { e in
            (e as? DatabaseError)?.code == .invalidData && "\(e)".contains("twice")
        }
    }
}
