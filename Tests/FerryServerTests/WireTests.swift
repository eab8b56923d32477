@testable @_spi(Server) import Ferry
@testable import FerryServer
import FerryTestSupport
@testable import FerryWire
import Testing

/// The pieces client and server share: hashes, ETags, event parsing, queries.
@Suite struct WireTests {
    @Test func sha256MatchesTheStandardVectors() {
        func hex(_ s: String) -> String { SHA256.hash(Array(s.utf8)).map { String($0, radix: 16).leftPad() }.joined() }
        #expect(hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad")
        #expect(hex("") == "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855")
        #expect(hex(String(repeating: "a", count: 1000)) == "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3")
    }

    @Test func eventsSplitAcrossPiecesAreParsedWhole() throws {
        var parser = StreamEventParser()
        let text = StreamEvent.put("/a", ["b": 1]).encoded + ": comment\n" + StreamEvent.keepAlive.encoded
        var events: [StreamEvent] = []
        for byte in Array(text.utf8) { events += try parser.feed([byte]) }
        #expect(events == [.put("/a", ["b": 1]), .keepAlive])
        #expect(throws: WireError.self) { _ = try parser.feed(Array("event: put\ndata: {nope\n\n".utf8)) }
    }

    /// An event carries the `id:` of its block; an `id:` alone is a progress mark; the id does
    /// not carry over to the next event.
    @Test func idsAndProgressMarksAreParsed() throws {
        var parser = StreamEventParser()
        let text = StreamEvent.put("/a", 1, id: "7").encoded + StreamEvent.progress("8").encoded + StreamEvent.keepAlive.encoded
        #expect(text.hasPrefix("id: 7\nevent: put\n") && text.contains("\nid: 8\n\nevent: keep-alive"))
        let events = try parser.feed(Array(text.utf8))
        #expect(events == [.put("/a", 1, id: "7"), .progress("8"), .keepAlive])
        #expect(events.map(\.isProgress) == [false, true, false])
    }

    /// A long event fed in small pieces and many events fed at once, with either line end,
    /// parse as each event was sent (the parser looks at each byte once).
    @Test func aLongEventInSmallPiecesAndManyEventsAtOnceParseWhole() throws {
        let big = Value.object(Dictionary(uniqueKeysWithValues: (0..<20_000).map { ("k\($0)", Value.string("v\($0)")) }))
        var parser = StreamEventParser()
        let bytes = Array(StreamEvent.put("/", big).encoded.utf8)
        var events: [StreamEvent] = []
        for start in stride(from: 0, to: bytes.count, by: 97) {
            events += try parser.feed(bytes[start..<min(start + 97, bytes.count)])
        }
        #expect(events == [.put("/", big)])
        let many = (0..<5_000).map { StreamEvent.put("/n\($0)", .int(Int64($0))) }
        let text = many.enumerated().map { i, e in i % 2 == 0 ? e.encoded : e.encoded.split(separator: "\n", omittingEmptySubsequences: false).joined(separator: "\r\n") }.joined()
        #expect(try parser.feed(Array(text.utf8)) == many)
        #expect(try parser.feed(Array("event: patch\r\ndata: {\"path\": \"/\",\r\ndata: \"data\": {}}\r\n".utf8)) == [])
        #expect(try parser.feed(Array("\r\n".utf8)) == [.patch("/", [:])], "data lines join with a line end")
    }

    /// A stream that never ends its event (one endless line, or endless data lines) is refused
    /// once the event passes the parser's limit, not held in memory without end, however its
    /// bytes are split; events within the limit parse, and so do those after a refused one.
    @Test func anEventLongerThanTheLimitIsRefusedNotHeld() throws {
        let limit = 1_000
        let fits = StreamEvent.put("/", .string(String(repeating: "x", count: 900)))
        let tooLong = StreamEvent.put("/", .string(String(repeating: "x", count: 1_100)))
        var parser = StreamEventParser(maxEventBytes: limit)
        #expect(try parser.feed(Array(fits.encoded.utf8)) == [fits])
        #expect(throws: WireError.self) { _ = try parser.feed(Array(tooLong.encoded.utf8)) }
        for piece in [1, 50, 600] {
            var split = StreamEventParser(maxEventBytes: limit)
            let bytes = Array(tooLong.encoded.utf8)
            var refused = false
            for start in stride(from: 0, to: bytes.count, by: piece) {
                do { _ = try split.feed(bytes[start..<min(start + piece, bytes.count)]) } catch is WireError { refused = true }
            }
            #expect(refused, "the event fed in pieces of \(piece)")
        }
        // One endless line: refused once past the limit, its bytes dropped, the next line read.
        _ = try parser.feed(Array("event: put\ndata: \"".utf8))
        var refusals = 0
        for _ in 0..<100 {
            do { _ = try parser.feed(Array(repeating: UInt8(ascii: "y"), count: 50)) } catch let e as WireError {
                #expect(e.code == .invalidData)
                refusals += 1
            }
        }
        #expect(refusals == 1, "one endless line is refused once")
        #expect(try parser.feed(Array(("yyy\n\n" + fits.encoded).utf8)) == [fits])
        // Endless data lines, even empty ones.
        var lines = StreamEventParser(maxEventBytes: limit)
        #expect(throws: WireError.self) {
            for _ in 0..<2_000 { _ = try lines.feed(Array("data:\n".utf8)) }
        }
    }

    /// After an event whose data is not JSON, the same parser reads the events after it,
    /// including those fed with it.
    @Test func aParserGoesOnAfterAnEventThatIsNotJSON() throws {
        var parser = StreamEventParser()
        #expect(throws: WireError.self) { _ = try parser.feed(Array("data: x\n\ndata: 1\n\n".utf8)) }
        #expect(try parser.feed(Array("data: 2\n\n".utf8)) == [StreamEvent(name: "message", data: 1), StreamEvent(name: "message", data: 2)])
    }

    @Test func queriesFilterOrderAndLimitAsTheRealtimeDatabaseDoes() throws {
        let data: Value = ["a": ["s": 5], "b": ["s": 1], "c": ["s": 9], "d": ["t": 0], "1": ["s": 1]]
        let q = try #require(try WireQuery(parameters: ["orderBy": "\"s\"", "startAt": "1", "limitToFirst": "2"]))
        #expect(q.apply(to: data) == ["1": ["s": 1], "b": ["s": 1]])
        let byKey = try #require(try WireQuery(parameters: ["orderBy": "\"$key\"", "limitToLast": "2"]))
        #expect(byKey.apply(to: data) == ["c": ["s": 9], "d": ["t": 0]])
        #expect(throws: WireError.self) { try WireQuery(parameters: ["startAt": "1"]) }
        #expect(throws: WireError.self) { try WireQuery(parameters: ["orderBy": "\"$key\"", "startAt": "1"]) }
        #expect(throws: WireError.self) { try WireQuery(parameters: ["orderBy": "\"s\"", "limitToFirst": "0"]) }
        #expect(try WireQuery(parameters: ["print": "silent"]) == nil)
    }

    /// The server answers a query in the order a Ferry client's cache uses (keys by UTF-16 code
    /// units, as the Realtime Database's clients): its own ordering by UTF-8 bytes disagreed.
    @Test func aQueryOrdersAsAFerryClientsCacheDoes() async throws {
        let data: Value = ["\u{E000}": 1, "\u{1F600}": 2, "b": 3, "10": 4, "9": 5]
        let db = Database.inMemory()
        try await db.applyServerPut(at: "d", data)
        for (params, limit) in [(["orderBy": "\"$key\"", "limitToLast": "2"], 2), (["orderBy": "\"$value\"", "limitToFirst": "3"], 3)] {
            let q = try #require(try WireQuery(parameters: params))
            var local = try db.reference("d").query
            local = params["orderBy"] == "\"$key\"" ? try local.queryOrderedByKey() : try local.queryOrderedByValue()
            local = params["limitToLast"] != nil ? try local.queryLimited(toLast: limit) : try local.queryLimited(toFirst: limit)
            #expect(q.apply(to: data) == (try await local.getData()).value, "\(params)")
        }
        let byKey = try #require(try WireQuery(parameters: ["orderBy": "\"$key\"", "limitToLast": "1"]))
        #expect(byKey.apply(to: data) == ["\u{E000}": 1], "U+E000 sorts after U+1F600 in UTF-16")
    }

    @Test func serverValuesResolveAgainstTheCurrentData() throws {
        let now: Int64 = 1_700_000_000_000
        let current: Value = ["n": 5, "f": 1.5]
        #expect(try ValueTree.resolvingServerValues(ServerValue.increment(2), at: ["n"], in: current, now: now) == 7)
        #expect(try ValueTree.resolvingServerValues(ServerValue.increment(2), at: ["f"], in: current, now: now) == 3.5)
        #expect(try ValueTree.resolvingServerValues(ServerValue.increment(2), at: ["none"], in: current, now: now) == 2)
        #expect(try ValueTree.resolvingServerValues(["t": ServerValue.timestamp], at: [], in: current, now: now) == ["t": .int(now)])
        #expect(throws: WireError.self) { try ValueTree.resolvingServerValues([".sv": "later"], at: [], in: current, now: now) }
    }

    /// The server's tree follows the client's rules (`Node.updatingChild`): null below a leaf
    /// changes nothing, a value below a leaf replaces it keeping its priority, a node whose
    /// last child goes is gone with its priority. Random trees and writes, both ways compared.
    @Test func theServersTreeChangesAsAClientsCacheDoesForEveryWrite() throws {
        var rng = SplitMix(seed: 0x5EED)
        let keys = ["a", "b", "c"]
        func leaf() -> Value { [Value.string("x"), .int(Int64(rng.next() % 5)), .bool(true)][Int(rng.next() % 3)] }
        func priority() -> Value? { rng.next() % 4 == 0 ? .int(Int64(rng.next() % 3)) : nil }
        func tree(_ depth: Int) -> Value {
            let r = rng.next() % 10
            if depth == 0 || r < 3 { return r == 0 ? .null : (priority().map { [".value": leaf(), ".priority": $0] } ?? leaf()) }
            var o: [String: Value] = [:]
            for k in keys where rng.next() % 2 == 0 { o[k] = tree(depth - 1) }
            if let p = priority() { o[".priority"] = p }
            return .object(o)
        }
        for round in 0..<3_000 {
            let start = ValueTree.normalized(tree(3))
            let path = (0..<Int(rng.next() % 4)).map { _ in keys[Int(rng.next() % 3)] }
            let written = rng.next() % 3 == 0 ? Value.null : tree(2)
            var server = start
            ValueTree.set(&server, path[...], to: written)
            let client = try Node(start).updatingChild(Path(keys: path), try Node(written))
            #expect(server == ValueTree.normalized(client.value(export: true)),
                    "round \(round): \(start.json) with \(written.json) at /\(path.joined(separator: "/"))")
        }
        // The three cases by name.
        var leafTree: Value = ["k": "x"]
        ValueTree.set(&leafTree, ["k", "a"], to: .null)
        #expect(leafTree == ["k": "x"])
        var prioritized: Value = ["k": [".value": "x", ".priority": 1]]
        ValueTree.set(&prioritized, ["k", "a"], to: 2)
        #expect(prioritized == ["k": ["a": 2, ".priority": 1]])
        var lastChild: Value = ["k": ["a": 1, ".priority": 1], "z": true]
        ValueTree.set(&lastChild, ["k", "a"], to: .null)
        #expect(lastChild == ["z": true])
    }

    /// A group's store writes folded into merges — each stored while the writes after it
    /// are decided — leave the store as storing them one after another does, whatever their
    /// locations (above, below, beside one another, below leaves they replace).
    @Test func foldedMergesStoreWhatTheWritesOneByOneWould() throws {
        var rng = SplitMix(seed: 0xF01D)
        let keys = ["a", "b", "c"]
        func pick() -> String { keys[Int(rng.next() % 3)] }
        let start: Value = ["data": ["a": ["b": 1], "c": "x"], "meta": ["n": 0]]
        for round in 0..<3_000 {
            var oneByOne = start
            var merged = start
            var folded = FoldedMerge()
            var runs = 0
            func store() {
                // (The writer's tree as the run ends: the values stored are read from it.)
                let entries = folded.entries(tree: ValueTree.child(oneByOne, ["data"]))
                folded = FoldedMerge()
                let paths = Array(entries.keys)
                for (i, p) in paths.enumerated() {
                    for q in paths[(i + 1)...] { #expect(!p.hasPrefix(q + "/") && !q.hasPrefix(p + "/"), "round \(round): \(p) and \(q) overlap") }
                }
                for (p, v) in entries { ValueTree.set(&merged, p.split(separator: "/").map(String.init)[...], to: v) }
                runs += 1
            }
            for step in 0..<Int(1 + rng.next() % 8) {
                let keys = (0..<Int(1 + rng.next() % 3)).map { _ in pick() }
                let value: Value = [.null, .int(Int64(rng.next() % 9)), ["c": .string(pick())], "x"][Int(rng.next() % 4)]
                // (What the writer notes for a write: its location, against its tree before it, and meta.)
                var merge = StoreMerge()
                merge.write(at: keys, before: ValueTree.child(oneByOne, ["data"]))
                merge.meta["meta/n"] = .int(Int64(step))
                ValueTree.set(&oneByOne, (["data"] + keys)[...], to: value)
                ValueTree.set(&oneByOne, ["meta", "n"], to: .int(Int64(step)))
                folded.add(merge, size: 16)
                if rng.next() % 3 == 0 { store() }
            }
            store()
            #expect(merged == oneByOne, "round \(round), \(runs) runs")
        }
    }

    /// A batch's answer, written as bytes, is the JSON of its results' values.
    @Test func aBatchAnswerIsTheJSONOfItsResults() throws {
        let results = [BatchResult(id: 1, status: 200, commit: 7), BatchResult(id: 2, status: 400, error: "bad \"data\"\n\u{1}é"),
                       BatchResult(id: 3, status: 200, duplicate: true, commit: 9), BatchResult(id: Int64.max, status: 503)]
        #expect(try Value(jsonBytes: BatchResult.answer(results)) == ["results": .array(results.map(\.value))])
        #expect(try Value(jsonBytes: BatchResult.answer([])) == ["results": []])
    }

    /// Server values resolve without building a node when a value holds none and is in the
    /// export form already; every other value takes the node's way, with its checks and errors.
    @Test func resolvingAValueWithoutServerValuesGivesWhatTheDataModelDoes() throws {
        let deep = (0..<30).reduce(Value.int(1)) { v, _ in .object(["k": v]) }
        let values: [Value] = [
            .null, 1, 1.5, "s", true, ["a": 1, "b": ["c": "d"]], ["a": .null, "b": 1], ["a": [:]], [:], [1, 2, .null, 3],
            ["a": [".value": 1, ".priority": 2]], [".priority": 1, "a": 1], ["a/b": 1], ["a": .double(.nan)], ["$x": 1], ["a": ["b.c": 1]],
            deep, ["a": deep],
        ]
        for v in values {
            for at in ["a", "a/b/c"] {
                let viaNode = Result { try Node(v, path: try Path(validating: at)).value(export: true) }
                let resolved = Result { try ServerValues.resolve(v, at: at, existing: .null, time: 0) }
                switch (viaNode, resolved) {
                case let (.success(a), .success(b)): #expect(a == b, "\(v.json) at \(at)")
                case (.failure, .failure): break
                default: Issue.record("\(v.json) at \(at): the node gives \(viaNode), resolving \(resolved)")
                }
            }
        }
    }

    /// The normal form's check agrees with normalizing: a value is normal exactly when the
    /// tree's rules (no arrays, no nulls inside, no empty objects, no priority alone) rebuild
    /// it as it is.
    @Test func aValueIsNormalExactlyWhenNormalizingLeavesItAsItIs() {
        func rebuilt(_ v: Value) -> Value {
            let children: [(String, Value)]
            switch v {
            case .array(let a): children = a.enumerated().map { (String($0.offset), $0.element) }
            case .object(let o): children = Array(o)
            default: return v
            }
            let kept = Dictionary(uniqueKeysWithValues: children.map { ($0.0, rebuilt($0.1)) }.filter { $0.1 != .null })
            return kept.isEmpty || (kept.count == 1 && kept[".priority"] != nil) ? .null : .object(kept)
        }
        let values: [Value] = [.null, 1, ["a": 1], ["a": .null], [:], ["a": [:]], [1], [".priority": 1], ["a": [".priority": 1]],
                               [".value": 1, ".priority": 2], ["a": ["b": ["c": .null]]], ["a": ["b": ["c": 1]], ".priority": "p"], ["a": [1, 2]]]
        for v in values {
            #expect(ValueTree.isNormal(v) == (rebuilt(v) == v), "\(v.json)")
            #expect(ValueTree.normalized(v) == rebuilt(v), "\(v.json)")
        }
    }

    @Test func aBatchWithWritesOutOfOrderIsRefusedWhole() throws {
        let good = try Value(json: #"{"client": "0123456789abcdef0123456789abcdef", "acked": 3, "writes": [{"id": 4, "op": "set", "path": "/a", "data": 1}]}"#)
        #expect(try BatchRequest(good).writes == [BatchWrite(id: 4, op: .set, path: "/a", data: 1)])
        let bad = try Value(json: #"{"client": "0123456789abcdef0123456789abcdef", "writes": [{"id": 4, "op": "set", "path": "/a"}, {"id": 4, "op": "set", "path": "/b"}]}"#)
        #expect(throws: WireError.self) { try BatchRequest(bad) }
        #expect(WriteIdentity(header: "0123456789abcdef0123456789abcdef/12") == WriteIdentity(store: "0123456789abcdef0123456789abcdef", id: 12))
        #expect(WriteIdentity(header: "XYZ/12") == nil)
    }
}

extension String {
    fileprivate func leftPad() -> String { count == 1 ? "0" + self : self }
}

