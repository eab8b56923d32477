import Foundation
import FerryTestSupport
import Testing

@testable @_spi(Server) import Ferry

/// Snapshots of big locations read from the cache are read lazily (children decoded as they
/// are asked for, outside the engine's lock): they must show exactly what the materialized
/// node shows.
@Suite struct LazySnapshotTests {
    /// A random key: mostly push-id-like, sometimes an integer (which sorts first), a key with
    /// characters whose UTF-8 and UTF-16 orders differ, or punctuation that sorts before digits.
    static func key(_ g: inout SplitMix, _ n: Int, plain: Bool = false) -> String {
        switch Int.random(in: plain ? 3..<20 : 0..<20, using: &g) {
        case 0: return String(Int.random(in: 0..<40, using: &g))
        case 1: return "\u{E000}k\(Int.random(in: 0..<5, using: &g))"
        case 2: return "😀\(Int.random(in: 0..<5, using: &g))"
        case 3: return "!\(Int.random(in: 0..<5, using: &g))"
        default: return "k" + String(Int.random(in: 0..<n, using: &g))
        }
    }

    static func leaf(_ g: inout SplitMix) -> Value {
        switch Int.random(in: 0..<5, using: &g) {
        case 0: return .bool(Bool.random(using: &g))
        case 1: return .int(Int64.random(in: -5...5, using: &g))
        case 2: return .double(Double(Int.random(in: -20...20, using: &g)) / 4)
        case 3: return .string(["a", "b", "zz", "é", ""].randomElement(using: &g)!)
        default: return .string("s\(Int.random(in: 0..<9, using: &g))")
        }
    }

    static func priority(_ g: inout SplitMix) -> Value {
        switch Int.random(in: 0..<3, using: &g) {
        case 0: return .int(Int64.random(in: 0...3, using: &g))
        case 1: return .string(["p", "q"].randomElement(using: &g)!)
        default: return .double(1.5)
        }
    }

    /// A random value: leaves, objects (some with priorities), arrays, nulls.
    static func value(_ g: inout SplitMix, depth: Int = 0) -> Value {
        let r = Int.random(in: 0..<10, using: &g)
        if depth >= 2 || r < 4 {
            let v = leaf(&g)
            if Int.random(in: 0..<8, using: &g) == 0 { return .object([".value": v, ".priority": priority(&g)]) }
            return v
        }
        if r == 4 { return .null }
        if r == 5 { return .array((0..<Int.random(in: 1...3, using: &g)).map { _ in value(&g, depth: depth + 1) }) }
        var o: [String: Value] = [:]
        for _ in 0..<Int.random(in: 1...3, using: &g) { o[["x", "y", "likes", "1"].randomElement(using: &g)!] = value(&g, depth: depth + 1) }
        if Int.random(in: 0..<6, using: &g) == 0 { o[".priority"] = priority(&g) }
        return .object(o)
    }

    /// Builds a random store under /data: server data, then pending writes over it (sets,
    /// updates, removals, priorities, leaves turned objects, server puts below), with a
    /// reopen half-way through sometimes (values then come from the log's files).
    static func build(seed: UInt64, in dir: TemporaryDirectory, indexes: [ChildIndex] = []) async throws -> Database {
        var g = SplitMix(seed: seed)
        var options = quietOptions(.none)
        options.segmentSize = 32 << 10
        options.indexes = indexes
        // Every other seed has only keys whose byte order is their key order (walked off the
        // indexes directly); the others mix in integers and characters where orders differ.
        let plain = seed % 2 == 1
        func key(_ g: inout SplitMix, _ n: Int) -> String { Self.key(&g, n, plain: plain) }
        var db = try Database.open(at: dir.path, options: options)
        let n = 700
        var initial: [String: Value] = [:]
        for _ in 0..<Int.random(in: 0..<300, using: &g) { initial[key(&g, n)] = value(&g) }
        try await db.applyServerPut(at: "data", .object(initial))
        let steps = 900
        for step in 0..<steps {
            let k = key(&g, n)
            let data = try db.reference("data")
            switch Int.random(in: 0..<12, using: &g) {
            case 0: _ = try await data.child(k).setValue(.null)
            case 1: _ = try await data.child(k).setPriority(priority(&g))
            case 2: _ = try await data.child(k).child(["x", "y", "z"].randomElement(using: &g)!).setValue(value(&g))
            case 3:
                let other = key(&g, n)
                _ = try await data.updateChildValues(other == k ? [k: value(&g)] : [k: value(&g), other + "/x": leaf(&g)])
            case 4: try await db.applyServerPut(at: "data/" + k, value(&g))
            case 5: _ = try await data.child(k).setValue(leaf(&g))  // a leaf a later write below turns into an object
            default: _ = try await data.child(k).setValue(value(&g))
            }
            if step == steps / 2 && seed % 4 < 2 {  // (plain and mixed keys both reopen: values then come from the checkpoint's entries)
                try await db.close()
                db = try Database.open(at: dir.path, options: options)
            }
        }
        return db
    }

    static func materialized(_ db: Database, _ path: String) throws -> Node {
        try #require(db.engine.withLock { $0.visibleNode(at: Path(path)) })
    }

    /// Compares everything a snapshot shows (recursing into some children) with the node.
    static func expectSame(_ lazy: DataSnapshot, _ node: Node, index: QueryIndex, _ g: inout SplitMix, _ where: String,
                           ofAChild: Bool = false) throws {
        let eager = DataSnapshot(ref: lazy.ref, node: node, index: index, metadata: lazy.metadata)
        #expect(lazy.exists == eager.exists, "\(`where`): exists")
        #expect(lazy.childrenCount == eager.childrenCount, "\(`where`): childrenCount")
        #expect(lazy.hasChildren == eager.hasChildren, "\(`where`): hasChildren")
        #expect(lazy.priority == eager.priority, "\(`where`): priority")
        #expect(lazy.value == eager.value, "\(`where`): value")
        #expect(lazy.exportValue == eager.exportValue, "\(`where`): exportValue")
        let lazyChildren = lazy.children, eagerChildren = eager.children
        #expect(lazyChildren.map(\.key) == eagerChildren.map(\.key), "\(`where`): children's order")
        #expect(lazyChildren.map(\.ref) == eagerChildren.map(\.ref), "\(`where`): children's refs")
        #expect(eagerChildren.allSatisfy { $0.ref.path.parent == lazy.ref.path }, "\(`where`): children's refs below it")
        for (a, b) in zip(lazyChildren, eagerChildren) where Int.random(in: 0..<4, using: &g) == 0 {
            #expect(a.exportValue == b.exportValue, "\(`where`): child \(b.key!)")
        }
        var walked: [(String, Value)] = []
        var sampled: [DataSnapshot] = []
        try lazy.forEachChild { child in
            walked.append((child.key!, child.exportValue))
            if Int.random(in: 0..<4, using: &g) == 0 { sampled.append(child) }
            // A child's reference (made when asked) is its parent's and its key, and so are its children's.
            #expect(child.ref == lazy.ref.childUnchecked(Path(keys: [child.key!])), "\(`where`): forEachChild's ref")
            if let grandchild = child.children.first {
                #expect(grandchild.ref.path == lazy.ref.path.child(Path(keys: [child.key!, grandchild.key!])), "\(`where`): a grandchild's ref")
            }
        }
        #expect(walked.map(\.0) == eagerChildren.map { $0.key! }, "\(`where`): forEachChild's order")
        #expect(walked.map(\.1) == eagerChildren.map(\.exportValue), "\(`where`): forEachChild's values")
        // A walked child (one stored value is given as its bytes, decoded as far as it is read)
        // shows what the materialized child shows, every accessor.
        for child in sampled where child.content.isStored || Int.random(in: 0..<4, using: &g) == 0 {
            try expectSame(child, eager.childSnapshot(forPath: child.key!).node, index: .priority, &g, "\(`where`), walked child \(child.key!)",
                           ofAChild: true)
        }
        for _ in 0..<40 {
            // Below a location, its children's keys; below a child (a value of \(value(_:))), its
            // fields' (read from its stored bytes when the walk gave them).
            let fields = ["x", "y", "z", "likes", "0", "1", "2", ".priority"]
            var path = [ofAChild ? fields.randomElement(using: &g)! : key(&g, 700)]
            if Bool.random(using: &g) { path.append(fields.randomElement(using: &g)!) }
            let p = path.joined(separator: "/")
            #expect(lazy.hasChild(p) == eager.hasChild(p), "\(`where`): hasChild(\(p))")
            #expect(lazy.childSnapshot(forPath: p).exportValue == eager.childSnapshot(forPath: p).exportValue, "\(`where`): childSnapshot(\(p))")
        }
    }

    /// How many children a walk of `s` gives as their stored bytes.
    static func storedChildren(_ s: DataSnapshot) throws -> Int {
        var n = 0
        try s.forEachChild { if $0.content.isStored { n += 1 } }
        return n
    }

    static func isLazy(_ s: DataSnapshot) -> Bool {
        if case .lazy(let l) = s.content { return l.plan != nil }
        return false
    }

    @Test(arguments: Array(UInt64(1)...UInt64(12)))
    func aLazySnapshotShowsWhatTheMaterializedNodeShows(seed: UInt64) async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.build(seed: seed, in: dir)
        if seed % 3 == 0 {
            // As after a checkpoint older than format 5: entries do not say whether their value
            // carries a priority, and walks read the values' first bytes.
            db.engine.withLock { e in
                e.server.knowsPriorities = false
                e.writeTree.overlay.knowsPriorities = false
            }
        }
        var g = SplitMix(seed: seed &* 31)
        let node = try Self.materialized(db, "data")
        let snapshot = try await db.reference("data").getData()
        #expect(Self.isLazy(snapshot), "a location with hundreds of entries below it is read lazily")
        if seed % 2 == 1, case .lazy(let l) = snapshot.content {
            #expect(l.plainKeys)
            #expect(try Self.storedChildren(snapshot) > 0, "children written whole are walked as their stored bytes")
        }
        try Self.expectSame(snapshot, node, index: .priority, &g, "seed \(seed)")
        // Every index type orders the same children the same way.
        let data = try db.reference("data")
        let queries: [(DatabaseQuery, QueryIndex)] = [
            (try data.queryOrderedByKey(), .key), (try data.queryOrderedByValue(), .value),
            (try data.queryOrderedByPriority(), .priority), (try data.queryOrdered(byChild: "x"), .child(Path("x"))),
        ]
        for (query, index) in queries {
            let s = try await query.getData()
            try Self.expectSame(s, node, index: index, &g, "seed \(seed), \(index)")
            var streamed: [String] = []
            for try await child in s.childStream(batchSize: 7) { streamed.append(child.key!) }
            #expect(streamed == IndexedNode(node, index: index).ordered.map(\.name), "seed \(seed), \(index): childStream's order")
        }
        // Ranged and limited queries choose their children walking the cache a child at a time.
        let filtered: [DatabaseQuery] = [
            try data.queryOrdered(byChild: "x").queryLimited(toLast: 5),
            try data.queryOrdered(byChild: "likes").queryLimited(toFirst: 9),
            try data.queryOrderedByKey().queryStarting(atValue: "k3").queryLimited(toFirst: 7),
            try data.queryOrderedByValue().queryEnding(atValue: 2),
            try data.queryOrderedByPriority().queryLimited(toFirst: 3),
            try data.queryOrdered(byChild: "x").queryStarting(atValue: 0).queryEnding(atValue: 3),
            try data.queryOrdered(byChild: "x").queryStarting(afterValue: "a", childKey: "k5").queryLimited(toLast: 4),
        ]
        for query in filtered {
            let index = query.params.index
            let expected = query.params.nodeFilter.updateFullNode(IndexedNode(.empty, index: index), IndexedNode(node, index: index), accumulator: nil).node
            let s = try await query.getData()
            #expect(!Self.isLazy(s))
            #expect(s.exportValue == DataSnapshot(ref: s.ref, node: expected, metadata: s.metadata).exportValue, "seed \(seed), \(query.params)")
            #expect(s.children.map(\.key) == IndexedNode(expected, index: index).ordered.map(\.name), "seed \(seed), \(query.params): order")
        }
        try await db.close()
    }

    /// A walk of a big location after a reopen reads the log's frames ahead of it on another
    /// thread, where the stored values are checked: it shows what the materialized node shows,
    /// for values of every shape — leaves, objects, arrays, priorities, server timestamps
    /// (stored twice, resolved after), children the server put — with children removed.
    @Test func aBigLocationWalkedAfterAReopenShowsWhatTheMaterializedNodeShows() async throws {
        let dir = try TemporaryDirectory()
        var options = quietOptions(.none)
        options.segmentSize = 256 << 10
        options.cacheSizeBytes = .unlimited
        var g = SplitMix(seed: 99)
        do {
            let db = try Database.open(at: dir.path, options: options)
            try await db.applyServerPut(at: "data", [:])
            let data = try db.reference("data")
            for i in 0..<6_000 {
                let k = "k\(10_000 + i)"
                switch Int.random(in: 0..<10, using: &g) {
                case 0: try await db.applyServerPut(at: "data/" + k, Self.value(&g))
                case 1: _ = try data.child(k).setValueNow(["at": ServerValue.timestamp, "v": Self.leaf(&g)])
                case 2: _ = try data.child("k\(10_000 + Int.random(in: 0...i, using: &g))").setValueNow(.null)
                default: _ = try data.child(k).setValueNow(Self.value(&g))
                }
            }
            try await db.close()  // (with a checkpoint: the walk reads every value from the log's frames)
        }
        let db = try Database.open(at: dir.path, options: options)
        let node = try Self.materialized(db, "data")
        let snapshot = try await db.reference("data").getData()
        #expect(Self.isLazy(snapshot))
        #expect(try Self.storedChildren(snapshot) > 1_000, "children written whole are walked as their stored bytes")
        try Self.expectSame(snapshot, node, index: .priority, &g, "after a reopen")
        try await db.close()
    }

    /// A limited query ordered by a child's value, over a big location read lazily, chooses its
    /// window from each child's value alone: the same children, in the same order, as the query
    /// over the whole node, at every kind of range end — inclusive or not, with a key or not, at
    /// values many children share — in both directions, with children that have no value there
    /// or one of another type.
    @Test func aLimitedQueryByAChildOverABigLocationChoosesTheWindowTheWholeNodeGives() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        try await db.applyServerPut(at: "data", [:])
        let data = try db.reference("data")
        for i in 0..<3_000 {
            let x: Value? = switch i % 8 {
            case 0: nil
            case 1: .bool(i % 16 == 1)
            case 2, 3, 4: .int(Int64(i % 5))
            case 5: .string(["a", "b"][i % 2])
            case 6: .double(2.5)
            default: ["y": 1]
            }
            let post: Value = x.map { ["x": $0, "n": .int(Int64(i))] } ?? ["n": .int(Int64(i))]
            _ = try data.child("k\(1_000 + i)").setValueNow(post)
        }
        #expect(Self.isLazy(try await data.getData()))
        let node = try Self.materialized(db, "data")
        let byX = try data.queryOrdered(byChild: "x")
        var queries: [DatabaseQuery] = [try byX.queryLimited(toFirst: 9), try byX.queryLimited(toLast: 9)]
        for bound in [Value.int(2), .double(2.5), .string("a"), .bool(true), .null] {
            for key in [nil, "k1500", "k2000"] as [String?] {
                queries += [
                    try byX.queryStarting(atValue: bound, childKey: key).queryLimited(toFirst: 7),
                    try byX.queryStarting(afterValue: bound, childKey: key).queryLimited(toFirst: 7),
                    try byX.queryStarting(afterValue: bound, childKey: key).queryLimited(toLast: 7),
                    try byX.queryEnding(atValue: bound, childKey: key).queryLimited(toLast: 7),
                    try byX.queryEnding(beforeValue: bound, childKey: key).queryLimited(toLast: 7),
                    try byX.queryEnding(beforeValue: bound, childKey: key).queryLimited(toFirst: 7),
                    try byX.queryStarting(atValue: .bool(false)).queryEnding(atValue: bound, childKey: key).queryLimited(toLast: 5),
                ]
            }
        }
        for query in queries {
            let index = query.params.index
            let expected = query.params.nodeFilter.updateFullNode(IndexedNode(.empty, index: index), IndexedNode(node, index: index), accumulator: nil).node
            let s = try await query.getData()
            #expect(s.children.map(\.key) == IndexedNode(expected, index: index).ordered.map(\.name), "\(query.params)")
            #expect(s.exportValue == DataSnapshot(ref: s.ref, node: expected, metadata: s.metadata).exportValue, "\(query.params)")
        }
        try await db.close()
    }

    /// A big location's view is built outside the lock: its events are those of the view the
    /// lock would have built — the first value, and what later changes raise.
    @Test(arguments: [UInt64(2), 3])
    func aViewBuiltOutsideTheLockRaisesWhatTheLockedOneWould(seed: UInt64) async throws {
        let dir = try TemporaryDirectory()
        let db = try await Self.build(seed: seed, in: dir)
        let data = try db.reference("data")
        let queries: [DatabaseQuery] = [data.query, try data.queryOrdered(byChild: "x").queryLimited(toLast: 7),
                                        try data.queryOrderedByKey().queryStarting(atValue: "k5")]
        func expected(_ q: DatabaseQuery) throws -> Value {
            let node = try Self.materialized(db, "data")
            return DataSnapshot(ref: q.ref, node: q.params.nodeFilter.updateFullNode(IndexedNode(.empty, index: q.params.index),
                                IndexedNode(node, index: q.params.index), accumulator: nil).node, metadata: SnapshotMetadata(fromCache: true, hasPendingWrites: false)).value
        }
        var recorders: [Recorder] = []
        for q in queries {
            let r = Recorder()
            _ = q.observe(.value) { r.record(.value, $0) }
            recorders.append(r)
            #expect(r.values.last == (try expected(q)), "seed \(seed), \(q.params): the first value")
        }
        #expect(db.engine.withLock { e in queries.allSatisfy { e.syncTree.view(for: $0.spec) != nil } })
        var g = SplitMix(seed: seed &+ 7)
        for _ in 0..<40 {
            let k = Self.key(&g, 700)
            switch Int.random(in: 0..<3, using: &g) {
            case 0: _ = try await data.child(k).setValue(Self.value(&g))
            case 1: _ = try await data.child(k).child("x").setValue(Self.leaf(&g))
            default: try await db.applyServerPut(at: "data/\(k)", Self.value(&g))
            }
            for (q, r) in zip(queries, recorders) {
                #expect(r.values.last == (try expected(q)), "seed \(seed), \(q.params): after a change")
            }
        }
        try await db.close()
    }

    @Test func aLazySnapshotKeepsShowingItsMomentWhileTheDatabaseChangesAndCompacts() async throws {
        let dir = try TemporaryDirectory()
        var options = quietOptions(.none)
        options.segmentSize = 16 << 10
        let db = try Database.open(at: dir.path, options: options)
        try await db.applyServerPut(at: "posts", [:])
        for i in 0..<2_000 { _ = try await db.reference("posts/p\(10_000 + i)").setValue(["n": .int(Int64(i)), "text": .string("post \(i)")]) }
        let snapshot = try await db.reference("posts").getData()
        #expect(Self.isLazy(snapshot))
        // Everything changes after it: the writes are answered (acknowledged), rewritten, the
        // log compacted (its old segments deleted), the database closed.
        var last: Int64 = 0
        for i in 0..<2_000 { last = try await db.reference("posts/p\(10_000 + i)").setValue(["n": .int(-1)]).writeID ?? 0 }
        try await db.acknowledgeWrites(through: last)
        _ = try await db.compact()
        #expect(try await db.reference("posts/p10000/n").getData().value == .int(-1))
        try await db.close()
        var n = 0
        try snapshot.forEachChild { child in
            #expect(child.childSnapshot(forPath: "n").value == .int(Int64(n)))
            #expect(child.childSnapshot(forPath: "text").value == .string("post \(n)"))
            n += 1
        }
        #expect(n == 2_000)
        #expect(snapshot.childrenCount == 2_000)
        #expect(snapshot.childSnapshot(forPath: "p11999/n").value == .int(1_999))
    }

    @Test func aMemoryOnlyDatabaseReadsBigLocationsLazilyToo() async throws {
        var options = quietOptions(.none)
        options.indexes = [ChildIndex(location: "posts", child: "n")]
        let db = Database.inMemory(options: options)
        try await db.applyServerPut(at: "posts", ["p0": ["n": 0]])
        for i in 1..<800 { _ = try db.reference("posts/p\(i)").setValueNow(["n": .int(Int64(i % 13)), "t": .string("\(i)")]) }
        _ = try await db.reference("posts/p5/n").setValue(-1)
        let node = try Self.materialized(db, "posts")
        let snapshot = try await db.reference("posts").getData()
        #expect(Self.isLazy(snapshot))
        var g = SplitMix(seed: 5)
        try Self.expectSame(snapshot, node, index: .priority, &g, "memory-only")
        let top = try await db.reference("posts").queryOrdered(byChild: "n").queryLimited(toFirst: 1).getData()
        #expect(top.children.map(\.key) == ["p5"])
        try await db.close()
    }

    /// A small read decodes outside the lock from the live log; a record compaction deleted
    /// meanwhile sends it back under the lock — no failure, the right value.
    @Test func aSmallReadWhoseRecordWasCompactedAwayIsReadAgainUnderTheLock() async throws {
        let dir = try TemporaryDirectory()
        var options = quietOptions(.none)
        options.segmentSize = 16 << 10
        options.compactionSegments = nil
        let db = try Database.open(at: dir.path, options: options)
        try await db.applyServerPut(at: "a", ["text": "first"])
        for i in 0..<200 { try await db.applyServerPut(at: "bulk/b\(i)", .string(String(repeating: "x\(i)", count: 60))) }
        try await db.sync()
        // Every record is written now: none is kept as a copy. (Copies are dropped every 64
        // records; under load the writer can lag behind all 200, and /a was then read from its
        // copy — seen once in CI.)
        #expect(db.engine.withLock { $0.pruneRecentNow() } == 0)
        let frozen = db.engine.withLock { $0.freezeForOneRead { _ in } }
        let report = try await db.compact()
        #expect(!report.deletedSegments.isEmpty)
        #expect(frozen.visibleNode(at: Path("a")) != nil)
        #expect(frozen.reader.stale, "the record of /a was in a deleted segment")
        #expect(frozen.reader.error == nil && db.engine.withLock { $0.failure } == nil, "a stale read is no failure")
        #expect(try await db.reference("a").getData().value == ["text": "first"])
        try await db.close()
    }

    @Test func aSmallLocationIsReadAtOnce() async throws {
        let db = try Database.open(at: try TemporaryDirectory().path, options: quietOptions(.none))
        try await db.applyServerPut(at: "posts", ["a": 1, "b": 2])
        let s = try await db.reference("posts").getData()
        #expect(!Self.isLazy(s))
        #expect(s.value == ["a": 1, "b": 2])
        try await db.close()
    }
}

/// Walking the children of a big location holds one child at a time: measured as the peak
/// resident memory of a child process that opens the store and reads it.
@Suite struct LazySnapshotMemoryTests {
    @Test func streamingAMillionChildrenNeedsTheMemoryOfTheOpenNotOfTheData() async throws {
        let dir = try TemporaryDirectory()
        let count = 1_000_000
        var options = quietOptions(.none)
        options.segmentSize = 8 << 20
        options.cacheSizeBytes = .unlimited  // (server data beyond the limit would be evicted)
        let db = try Database.open(at: dir.path, options: options)
        let clock = ContinuousClock(), started = clock.now
        try await db.applyServerPut(at: "posts", [:])
        // Local writes over an empty /posts from the server (the fastest way in: JSON bytes).
        let posts = try db.reference("posts")
        for i in 0..<count {
            _ = try posts.child("p\(100_000_000 + i)").setValueNow(jsonBytes: Array(#"{"likes":\#(i % 997),"text":"post number \#(i) of a million"}"#.utf8))
        }
        try await db.close()  // (with a checkpoint)
        print("wrote \(count) children in \(started.duration(to: clock.now))")
        let child = Locations.executable("ferry-space-child")
        func peak(_ mode: String) throws -> Int {
            let result = try run(child, ["read", dir.path, mode, String(count)])
            #expect(result.status == 0, "\(mode) read every child: \(result.stdout)")
            let line = result.stdout.split(separator: "\n").first { $0.hasPrefix("peak ") }
            return try #require(line.flatMap { Int($0.dropFirst(5)) })
        }
        let opened = try peak("open"), streamed = try peak("stream"), kept = try peak("keep")
        let mib = { (b: Int) in String(format: "%.1f MiB", Double(b) / 1_048_576) }
        print("peak RSS over \(count) children: open \(mib(opened)), stream \(mib(streamed)), stream keeping every child \(mib(kept))")
        // A walk adds a frame cache, two segment readers and a child at a time: a few MiB.
        #expect(streamed < opened + 24 << 20, "streaming \(mib(streamed)) against the open's \(mib(opened))")
        // The measurement can tell: a walk whose caller keeps every child takes far more.
        #expect(kept > streamed + 64 << 20, "keeping every child \(mib(kept)) against streaming \(mib(streamed))")
    }
}
