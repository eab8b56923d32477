import FerryTestSupport
import Testing

@testable import Ferry

@Suite struct ValueEncodingTests {
    /// Random values of every shape — nulls and empty objects inside objects and arrays,
    /// integer-like and unicode keys, priorities, wrapped leaves, server values — encode to the
    /// same bytes straight from the value as through a node, and decode to that node.
    @Test func encodingAValueDirectlyGivesTheSameBytesAsThroughANode() throws {
        var g = SplitMix(seed: 99)
        let keys = ["a", "b", "7", "007", "-3", "-5", "-0", "00", "10", "12", "34", "abcdefghij", "abcdefghik", "abcdefgh", "2147483648", "z", "é", "\u{E000}", "😀", "Zeta", ".priority"]
        func pick<T>(_ xs: [T]) -> T { xs[Int(g.next() % UInt64(xs.count))] }
        func leaf() -> Value {
            switch g.next() % 7 {
            case 0: return .null
            case 1: return .bool(g.next() % 2 == 0)
            case 2: return .int(Int64(bitPattern: g.next()) >> Int64(g.next() % 64))
            case 3: return .double(Double(Int64(g.next() % 1000)) / 7)
            case 4: return .string(pick(["", "x", "héllo", "😀"]))
            case 5: return .object([".sv": "timestamp"])
            default: return .object([".value": .int(1), ".priority": .string("p")])
            }
        }
        func value(_ depth: Int) -> Value {
            guard depth < 4 else { return leaf() }
            switch g.next() % 4 {
            case 0: return leaf()
            case 1: return .array((0..<Int(g.next() % 4)).map { _ in value(depth + 1) })
            default:
                var o: [String: Value] = [:]
                for _ in 0..<Int(g.next() % 5) {
                    let k = pick(keys)
                    o[k] = k == ".priority" ? pick([.null, .int(3), .string("p"), .double(1.5)]) : value(depth + 1)
                }
                return .object(o)
            }
        }
        var nonEmpty = 0, withServerValues = 0
        for _ in 0..<5_000 {
            let v = value(0)
            let node = try Node(v, path: "x/y")
            let encoded = try EncodedValue(v, path: "x/y")
            #expect(encoded.bytes == ValueCodec.encode(node), "\(v)")
            #expect(try encoded.node() == node)
            #expect(try encoded.bytes.withUnsafeBytes { try ValueCodec.value($0) } == node.value(), "\(v)")  // (straight from the bytes)
            #expect(encoded.isEmpty == node.isEmpty)
            #expect(encoded.hasServerValues == ServerValueResolver.containsDeferred(node))
            if !node.isEmpty { nonEmpty += 1 }
            if encoded.hasServerValues { withServerValues += 1 }
        }
        #expect(nonEmpty > 1_000 && withServerValues > 100)
    }

    /// Reading a value's priority alone refuses damaged bytes as decoding the whole value does:
    /// an unknown tag, a priority that is not a number or a string, a priority with no value.
    @Test func aPriorityReadAloneRefusesWhatTheWholeDecodingRefuses() throws {
        let priority = Path(keys: [".priority"])
        for bad: [UInt8] in [[200], [10, 6, 0, 1], [10, 2, 1], [10, 3, 4], [10, 3, 4, 0], [10, 3, 4, 10, 3, 2, 1], [10]] {
            #expect(throws: DatabaseError.self, "\(bad)") { try bad.withUnsafeBytes { try ValueCodec.decode($0, at: priority) } }
            #expect(throws: DatabaseError.self, "\(bad)") { try bad.withUnsafeBytes { try ValueCodec.decode($0) } }
        }
        let good: [UInt8] = [10, 3, 4, 1]  // priority 2 on false
        let whole = try good.withUnsafeBytes { try ValueCodec.decode($0) }
        #expect(try good.withUnsafeBytes { try ValueCodec.decode($0, at: priority) } == whole.priority)
        #expect(whole.priority == Node.leaf(.int(2), priority: .empty))
    }

    /// Decoding the node at a path alone (an index reads one field of each child so) gives
    /// what decoding the whole value and taking that child gives, on random values with
    /// priorities, arrays and leaves, for paths that exist and paths that do not; so does the
    /// count of its children read from its header.
    @Test func decodingOneChildAloneGivesThatChildOfTheWholeValue() throws {
        var g = SplitMix(seed: 4242)
        for _ in 0..<2_000 {
            let node = try Node(LazySnapshotTests.value(&g))
            let bytes = ValueCodec.encode(node)
            for keys in [[], ["x"], ["likes"], ["1"], ["x", "y"], ["likes", "x"], ["y", "1", "x"], ["nothing"], ["0"], [".priority"], ["x", ".priority"]] {
                let path = Path(keys: keys)
                let alone = try bytes.withUnsafeBytes { try ValueCodec.decode($0, at: path) }
                #expect(alone == node.getChild(path), "\(node) at \(path)")
                let count = try bytes.withUnsafeBytes { try ValueCodec.childCount($0, at: path) }
                #expect(count == node.getChild(path).numChildren, "\(node) at \(path)")
            }
        }
    }

    /// The validator a walk runs on each child it gives as stored bytes refuses exactly what
    /// decoding refuses, and agrees on emptiness: on random values with priorities, arrays and
    /// leaves, each then damaged many ways (a byte changed, cut short, a byte put in), and on
    /// the damage decoding is known to refuse (children out of order or repeated, an empty
    /// child, a key that is not UTF-8, a number that is not finite, a priority without a value,
    /// nesting past the data model's depth).
    @Test func theValidatorRefusesExactlyWhatDecodingRefuses() throws {
        func agree(_ bytes: [UInt8], _ what: String) {
            let decoded = try? bytes.withUnsafeBytes { try ValueCodec.decode($0) }
            let valid = try? bytes.withUnsafeBytes { try ValueCodec.validate($0) }
            #expect((decoded == nil) == (valid == nil), "\(what): \(bytes)")
            if let decoded, let valid { #expect(valid == decoded.isEmpty, "\(what): \(bytes)") }
        }
        var g = SplitMix(seed: 777)
        var refused = 0, accepted = 0
        for _ in 0..<3_000 {
            let bytes = ValueCodec.encode(try Node(LazySnapshotTests.value(&g)))
            agree(bytes, "as encoded")
            // The value built straight from the bytes is the decoded node's.
            #expect(try bytes.withUnsafeBytes { try ValueCodec.value($0) } == bytes.withUnsafeBytes { try ValueCodec.decode($0) }.value())
            for _ in 0..<12 {
                var damaged = bytes
                let at = Int.random(in: 0..<damaged.count, using: &g)
                switch Int.random(in: 0..<3, using: &g) {
                case 0: damaged[at] = UInt8.random(in: 0...255, using: &g)
                case 1: damaged.removeLast(damaged.count - at)
                default: damaged.insert(UInt8.random(in: 0...12, using: &g), at: at)
                }
                agree(damaged, "damaged")
                if (try? damaged.withUnsafeBytes { try ValueCodec.decode($0) }) == nil { refused += 1 } else { accepted += 1 }
            }
        }
        #expect(refused > 5_000 && accepted > 1_000, "refused \(refused), accepted \(accepted)")
        let t = ValueCodec.Tag.true.rawValue, children = ValueCodec.Tag.children.rawValue
        let infinity = [ValueCodec.Tag.double.rawValue] + withUnsafeBytes(of: Double.infinity.bitPattern.littleEndian) { Array($0) }
        var deep: [UInt8] = []
        for _ in 0...Path.maxDepth + 1 { deep += [children, 1, 1, UInt8(ascii: "a")] }
        deep.append(t)
        for (bytes, what) in [
            ([children, 2, 1, UInt8(ascii: "b"), t, 1, UInt8(ascii: "a"), t], "out of order"),
            ([children, 2, 1, UInt8(ascii: "a"), t, 1, UInt8(ascii: "a"), t], "repeated"),
            ([children, 1, 1, UInt8(ascii: "a"), ValueCodec.Tag.empty.rawValue], "an empty child"),
            ([children, 1, 1, UInt8(ascii: "a"), children, 0], "a child with no children"),
            ([children, 2, 1, 0x80, t, 1, 0x81, t], "keys not UTF-8"),
            (infinity, "infinity"),
            ([ValueCodec.Tag.withPriority.rawValue, ValueCodec.Tag.int.rawValue, 2], "a priority without a value"),
            ([ValueCodec.Tag.withPriority.rawValue, ValueCodec.Tag.int.rawValue, 2, ValueCodec.Tag.empty.rawValue], "a priority over null"),
            ([ValueCodec.Tag.withPriority.rawValue, ValueCodec.Tag.int.rawValue, 2, ValueCodec.Tag.withPriority.rawValue,
              ValueCodec.Tag.int.rawValue, 4, t], "wrapped twice"),
            ([ValueCodec.Tag.withPriority.rawValue, t, t], "a priority that is a boolean"),
            ([ValueCodec.Tag.withPriority.rawValue, ValueCodec.Tag.int.rawValue, 2, children, 0], "a priority over no children: empty"),
            ([200], "an unknown tag"),
            ([t, t], "a trailing byte"),
            (deep, "too deep"),
            ([children, 0], "no children: empty, accepted"),
        ] {
            agree(bytes, what)
        }
        for bad in [deep, [ValueCodec.Tag.withPriority.rawValue, ValueCodec.Tag.int.rawValue, 2, ValueCodec.Tag.empty.rawValue],
                    [ValueCodec.Tag.withPriority.rawValue, ValueCodec.Tag.int.rawValue, 2, ValueCodec.Tag.withPriority.rawValue, ValueCodec.Tag.int.rawValue, 4, t],
                    [ValueCodec.Tag.withPriority.rawValue, t, t], [200], [t, t]] {
            #expect(throws: DatabaseError.self, "\(bad)") { try bad.withUnsafeBytes { try ValueCodec.validate($0) } }
        }
        #expect(try [children, 0].withUnsafeBytes { try ValueCodec.validate($0) } == true)
    }

    /// Random JSON texts — keys in any order, duplicates, escapes, whitespace, nulls inside
    /// arrays and objects, numbers at the edges of 64 bits, priorities, server values — encode
    /// straight from the text to the same bytes as parsing them into a Value and building a
    /// node; a text one route refuses, the other refuses too.
    @Test func encodingJSONTextDirectlyGivesTheSameBytesAsThroughAValue() {
        var g = SplitMix(seed: 1234)
        func pick<T>(_ xs: [T]) -> T { xs[Int(g.next() % UInt64(xs.count))] }
        let keys = [#""a""#, #""b""#, #""7""#, #""007""#, #""-5""#, #""10""#, #""\u0061""#, #""é""#, #""😀""#, #""\uE000""#,
                    #""long key number one""#, #""long key number two""#, #""a/b""#, #""""#, #"".priority""#, #"".x""#]
        let numbers = ["0", "-0", "007", "1e3", "1.5", "-2.25", "9223372036854775807", "-9223372036854775808",
                       "9223372036854775808", "+1", "12345678901234567890", "-", "1e999", "3"]
        func space() -> String { pick(["", "", " ", "\n\t "]) }
        func leaf() -> String {
            pick(["null", "true", "false", pick(numbers), #""text""#, #""q\"\\\/\n\u00e9\ud83d\ude00""#, #""caf\u00e9""#,
                  #"{".sv":"timestamp"}"#, #"{".value":3,".priority":1}"#, #"{".sv":{"increment":2}}"#, "{}", "[]"])
        }
        func value(_ depth: Int) -> String {
            guard depth < 4 else { return leaf() }
            switch g.next() % 4 {
            case 0: return leaf()
            case 1: return "[" + (0..<Int(g.next() % 4)).map { _ in space() + value(depth + 1) + space() }.joined(separator: ",") + "]"
            default:
                let members = (0..<Int(g.next() % 6)).map { _ -> String in
                    let k = pick(keys)
                    let v = k == #"".priority""# ? pick(["1", #""p""#, "null", "true", "2.5"]) : value(depth + 1)
                    return space() + k + space() + ":" + space() + v
                }
                return "{" + members.joined(separator: ",") + "}"
            }
        }
        var agreedValues = 0, agreedErrors = 0
        for _ in 0..<6_000 {
            var text = space() + value(0) + space()
            if g.next() % 20 == 0 { text += pick(["x", ",", "}"]) }
            if g.next() % 20 == 0 { text = String(text.dropLast(Int(g.next() % 3) + 1)) }
            let bytes = Array(text.utf8)
            let direct = Result { try EncodedValue(jsonBytes: bytes, path: "x/y") }
            let viaValue = Result { try Node(Value(jsonBytes: bytes), path: "x/y") }
            switch (direct, viaValue) {
            case let (.success(e), .success(n)):
                #expect(e.bytes == ValueCodec.encode(n), "\(text)")
                #expect(e.hasServerValues == ServerValueResolver.containsDeferred(n))
                agreedValues += 1
            case (.failure, .failure):
                agreedErrors += 1
            default:
                Issue.record("one route refused \(text): \(direct) / \(viaValue)")
            }
        }
        #expect(agreedValues > 2_000 && agreedErrors > 300)
    }

    @Test func invalidValuesAreRefusedAsThroughANodeAndNameWhere() {
        let bad: [Value] = [
            .object(["a": .object(["b/c": .int(1)])]),
            .object(["a": .double(.nan)]),
            .array([.double(.infinity)]),
            .object(["a": .int(1), ".priority": .bool(true)]),
            .object(["a\u{7}": .int(1)]),
            .object([".sv": "nonsense"]),
        ]
        for v in bad {
            #expect(throws: DatabaseError.self) { try Node(v, path: "x") }
            let error = #expect(throws: DatabaseError.self) { try EncodedValue(v, path: "x") }
            #expect(error?.code == .invalidData || error?.code == .invalidPath)
            #expect(error?.message.contains("x") == true, "\(String(describing: error))")
        }
        var deep: Value = .int(1)
        for _ in 0..<600 { deep = .object(["k": deep]) }
        #expect(throws: DatabaseError.self) { try EncodedValue(deep, path: .root) }
    }

    /// Firebase orders non-integer keys by UTF-16 code units: a character beyond U+FFFF (a
    /// surrogate pair, D800–DFFF) sorts before one in U+E000–U+FFFF, unlike UTF-8's order.
    @Test func keysOrderByUTF16CodeUnitsAndIntegerKeysNumerically() {
        let sorted = ["b", "\u{E000}", "😀", "a", "10", "9", "007", "7", "-1", "2147483648", "aa", "A"]
            .sorted { KeyOrder.compare($0, $1) < 0 }
        #expect(sorted == ["-1", "7", "007", "9", "10", "2147483648", "A", "a", "aa", "b", "😀", "\u{E000}"])
        #expect(KeyOrder.compare("😀", "\u{E000}") < 0 && KeyOrder.compare("\u{E000}", "😀") > 0)
        #expect(KeyOrder.compare("é", "é") == 0)
    }

    /// Decoding checks a stored object's children are in key order from their stored bytes:
    /// the bytes sort as the keys do (integers by value, then by length; the rest by UTF-16
    /// code units), and a value whose children are stored out of order (or twice) is refused as
    /// damaged.
    @Test func storedChildrenAreCheckedInKeyOrderFromTheirBytes() throws {
        let keys = ["b", "\u{E000}", "😀", "a", "10", "9", "007", "7", "-1", "-0", "00", "2147483648", "-2147483649", "aa", "A", "é", "k1", "k10", "k9"]
        let sorted = keys.sorted { a, b in
            var x = a, y = b
            return x.withUTF8 { x in y.withUTF8 { y in KeyOrder.compare(utf8: x, y) } } < 0
        }
        #expect(sorted == ["-1", "-0", "00", "7", "007", "9", "10", "-2147483649", "2147483648", "A", "a", "aa", "b",
                           "k1", "k10", "k9", "é", "😀", "\u{E000}"])
        for k in keys {
            var x = k
            #expect(x.withUTF8 { x in KeyOrder.compare(utf8: x, x) } == 0, "\(k)")
        }
        func object(_ keys: [String]) -> [UInt8] {
            var w = ByteWriter(capacity: 64)
            w.u8(ValueCodec.Tag.children.rawValue)
            w.varint(UInt64(keys.count))
            for k in keys {
                w.varint(UInt64(k.utf8.count))
                w.bytes.append(contentsOf: k.utf8)
                w.u8(ValueCodec.Tag.true.rawValue)
            }
            return w.bytes
        }
        #expect(try object(["2", "10", "a"]).withUnsafeBytes { try ValueCodec.decode($0) }.numChildren == 3)
        for bad in [["10", "2"], ["a", "10"], ["b", "a"], ["a", "a"], ["😀", "\u{E000}", "a"].reversed()] {
            #expect(throws: DatabaseError.self, "\(bad)") { try object(Array(bad)).withUnsafeBytes { try ValueCodec.decode($0) } }
        }
        // Two keys of bytes that are not UTF-8, in byte order, both repaired to U+FFFD: refused
        // (they would be two children of one name).
        var notUTF8 = object(["a", "b"])  // tag, count, then (length, key byte, value) twice
        notUTF8[3] = 0x80  // (lone continuation bytes, below the bytes that are compared as UTF-16)
        notUTF8[6] = 0x81
        #expect(throws: DatabaseError.self) { try notUTF8.withUnsafeBytes { try ValueCodec.decode($0) } }
    }

    @Test func objectsWithManyChildrenCountThemBeyondOneByte() throws {
        let v = Value.object(Dictionary(uniqueKeysWithValues: (0..<300).map { ("k\($0)", Value.int(Int64($0))) }))
        let encoded = try EncodedValue(v, path: .root)
        #expect(encoded.bytes == ValueCodec.encode(try Node(v)))
        #expect(try encoded.node().value(export: false) == v)
    }
}
