import Foundation
import FerryTestSupport
import Testing

@testable @_spi(Server) import Ferry

/// Child-value indexes (`DatabaseOptions.indexes`): a limited query they order reads its
/// window from the index, and must show what the filter over every child shows.
@Suite struct ChildIndexTests {
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
        let frozen = try #require(db.engine.withLock { e -> FrozenData? in
            index.beginRebuild()
            return e.freeze { _ in }
        })
        _ = try await db.reference("data/k1500/likes").setValue(-100)
        // A second reader meanwhile answers from a walk, and starts no rebuild of its own.
        #expect(try await Self.top(db, 1) == ["k1500"])
        #expect(index.isRebuilding)
        let built = try #require(ChildValueIndex.build(frozen, location: index.location, child: index.child))
        #expect(db.engine.withLock { _ in index.finishRebuild(built.0, usable: built.usable, frozen: frozen) })
        #expect(db.engine.withLock { _ in index.isCurrent })
        #expect(try await Self.top(db, 1) == ["k1500"], "the change made during the rebuild moved the child")
        #expect(try await Self.top(db, 5, fromLeft: false) == Self.expected(db, 5, fromLeft: false))
        try await db.close()
        withExtendedLifetime(dir) {}
    }

    @Test func anIndexThatCouldNotOrderAValueIsUsedAgainOnceItIsGone() async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.store(dir)
        _ = try await db.reference("data/k1001/likes").setValue(.int(1 << 60))
        #expect(try await Self.top(db, 2, fromLeft: false) == Self.expected(db, 2, fromLeft: false))
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
