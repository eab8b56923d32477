import FerryLog
import FerryTestSupport
import Testing

@testable import Ferry

@Suite struct RecordEncodingTests {
    /// The record of a set whose value came encoded (the fast form, sized first and written
    /// in place) has the same bytes, and the value at the same range, as the record built from
    /// the node — for times before 1970 and far ahead, the root, deep paths, keys of one
    /// byte, of 127 and 128 bytes (a one- and a two-byte length) and non-ASCII.
    @Test func aSetOfAnEncodedValueIsRecordedAsTheSetOfItsNode() throws {
        var g = SplitMix(seed: 5)
        func pick<T>(_ xs: [T]) -> T { xs[Int(g.next() % UInt64(xs.count))] }
        let keys = ["a", "posts", "p00000001", "é", "😀", String(repeating: "k", count: 127), String(repeating: "k", count: 128), "-1"]
        let times: [Int64] = [0, 1, -1, 63, 64, -65, 1_763_900_000_000, Int64.max, Int64.min]
        let values: [Value] = [.int(1), .string("text"), .object(["b": .int(2), "a": .array([.bool(true), .double(1.5)])]), .null]
        for _ in 0..<500 {
            let path = Path(keys: (0..<Int(g.next() % 6)).map { _ in pick(keys) })
            let node = try Node(pick(values))
            let time = pick(times)
            let fast = RecordCodec.localSet(path: path, encoded: ValueCodec.encode(node), time: time)
            let built = RecordCodec.localSet(path: path, value: node, resolved: nil, time: time, hidden: false)
            #expect(fast.bytes == built.bytes && fast.range == built.range, "\(path) \(time)")
        }
    }

    /// The record of an update whose values came encoded has the same bytes, and each value at
    /// the same range, as the record built from their nodes.
    @Test func anUpdateOfEncodedValuesIsRecordedAsTheUpdateOfTheirNodes() throws {
        var g = SplitMix(seed: 7)
        func pick<T>(_ xs: [T]) -> T { xs[Int(g.next() % UInt64(xs.count))] }
        let keys = ["a", "posts", "p00000001", "é", "😀", String(repeating: "k", count: 128), "-1"]
        let values: [Value] = [.int(1), .string("text"), .object(["b": .int(2), ".priority": .int(3), "a": .array([.bool(true), .double(1.5)])]), .null]
        for _ in 0..<300 {
            let path = Path(keys: (0..<Int(g.next() % 4)).map { _ in pick(keys) })
            let children = try (0..<Int(1 + g.next() % 5)).map { _ in
                (Path(keys: (0..<Int(1 + g.next() % 3)).map { _ in pick(keys) }), try Node(pick(values)))
            }
            let time = Int64(bitPattern: g.next())
            let fast = RecordCodec.localUpdate(path: path, encoded: children.map { ($0.0, EncodedValue(node: $0.1)) }, time: time)
            let built = RecordCodec.localUpdate(path: path, children: children.map { ($0.0, $0.1, nil) }, time: time)
            #expect(fast.bytes == built.bytes && fast.ranges == built.ranges.map(\.1), "\(path) \(time)")
        }
    }

    /// An update record listing its children in another order than String's (earlier builds
    /// listed them by their keys' bytes, which differs for keys not in NFC form) replays as the
    /// update applied live: here, a removal listed first would empty a node with a priority and
    /// drop the priority before its sibling is written.
    @Test func anUpdateRecordReplaysInTheOrderItsUpdateAppliedLive() async throws {
        let decomposed = "e\u{301}"  // sorts before "f" by bytes, after it as a String ("é")
        #expect(Array(decomposed.utf8).lexicographicallyPrecedes(Array("f".utf8)) && "f" < decomposed)
        let dir = try TemporaryDirectory()
        var options = quietOptions(.none)
        options.checkpointOnClose = false
        let live: Value
        do {
            let db = try Database.open(at: dir.path, options: options)
            try await db.reference("p").setValue(.object([".priority": .int(1), decomposed: .string("v")]))
            let other = Database.inMemory()
            try await other.reference("p").setValue(.object([".priority": .int(1), decomposed: .string("v")]))
            try await other.reference("p").updateChildValues([decomposed: .null, "f": .int(5)])
            live = try await other.reference("p").getData().exportValue
            #expect(live == .object([".priority": .int(1), "f": .int(5)]))
            try await db.close()
        }
        do {
            // The update as an earlier build recorded it: the removal (first by bytes) first.
            let log = try WriteAheadLog.open(at: dir.path, options: LogOptions(durability: .none))
            let children = [(Path(keys: [decomposed]), Node.empty, Node?.none), (Path(keys: ["f"]), try Node(.int(5)), Node?.none)]
            let record = RecordCodec.localUpdate(path: Path(keys: ["p"]), children: children, time: 0)
            var batch = LogBatch()
            batch.append(kind: RecordKind.localUpdate.rawValue, payload: record.bytes)
            try await log.append(batch)
            try await log.close()
        }
        let db = try Database.open(at: dir.path, options: options)
        #expect(try await db.reference("p").getData().exportValue == live)
        try await db.close()
    }
}
