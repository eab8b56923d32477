import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable @_spi(Server) import Ferry

/// The Realtime Database's limits, enforced at every call that writes: depth (a path's keys plus
/// the value's nesting ≤ 32), RFC 8259 JSON numbers, UTF-8, integers that fit 64 bits.
@Suite struct DataModelLimitsTests {
    /// `n` keys: `p0/p1/…`.
    static func path(_ n: Int) -> String { (0..<n).map { "p\($0)" }.joined(separator: "/") }
    /// A value whose leaf lies `levels` keys below its top (0: the leaf itself).
    static func nested(_ levels: Int) -> Value { (0..<levels).reduce(Value.int(1)) { v, _ in .object(["k": v]) } }
    static func nestedJSON(_ levels: Int) -> String { String(repeating: #"{"k":"#, count: levels) + "1" + String(repeating: "}", count: levels) }
    static func nestedArrayJSON(_ levels: Int) -> String { String(repeating: "[", count: levels) + "1" + String(repeating: "]", count: levels) }

    struct Post: Codable { var n: UInt64 }
    struct Wide: Codable { var items: [UInt] }

    /// A call that must be refused, and the code it must be refused with.
    struct Refused: Sendable, CustomTestStringConvertible {
        var testDescription: String
        var code: DatabaseError.Code = .invalidData
        var call: @Sendable (Database) async throws -> Void

        static func json(_ name: String, _ bytes: [UInt8]) -> [Refused] {
            [Refused(testDescription: "setValue(jsonBytes:) \(name)") { db in try await db.reference("x").setValue(jsonBytes: bytes) },
             Refused(testDescription: "Value(jsonBytes:) \(name)") { db in try await db.reference("x").setValue(try Value(jsonBytes: bytes)) }]
        }
        static func number(_ text: String) -> [Refused] {
            json("number \(text)", Array(#"{"n":\#(text)}"#.utf8)) + json("bare number \(text)", Array(text.utf8))
                + [Refused(testDescription: "setValue(json:) number \(text) in an array") { db in try await db.reference("x").setValue(json: "[1,\(text)]") }]
        }
        static func utf8(_ name: String, _ bad: [UInt8]) -> [Refused] {
            json("invalid UTF-8 in a string: \(name)", Array(#"{"s":""#.utf8) + bad + Array(#""}"#.utf8))
                + json("invalid UTF-8 in a key: \(name)", Array(#"{"a"#.utf8) + bad + Array(#"":1}"#.utf8))
        }
    }

    static let refused: [Refused] = {
        var cases: [Refused] = []
        for text in ["01", "1.", "+1", ".5", "-01", "1.e5", "-", "1e", "1e+", "--1", "1-2", "0x10", "00", "-.5", "1.5.2", "Infinity", "NaN"] {
            cases += Refused.number(text)
        }
        let utf8: [(String, [UInt8])] = [
            ("FF", [0xFF]), ("lone continuation 80", [0x80]), ("overlong C0 80", [0xC0, 0x80]), ("overlong E0 80 80", [0xE0, 0x80, 0x80]),
            ("surrogate ED A0 80", [0xED, 0xA0, 0x80]), ("above U+10FFFF F4 90 80 80", [0xF4, 0x90, 0x80, 0x80]),
            ("cut short E2 82", [0xE2, 0x82]), ("F5", [0xF5, 0x80, 0x80, 0x80]),
        ]
        for (name, bytes) in utf8 { cases += Refused.utf8(name, bytes) }

        let p31 = path(31), p30 = path(30)
        cases += [
            Refused(testDescription: "setValue: path 31 deep, value 2 deep") { db in try await db.reference(p31).setValue(nested(2)) },
            Refused(testDescription: "setValueNow: path 31 deep, value 2 deep") { db in try db.reference(p31).setValueNow(nested(2)) },
            Refused(testDescription: "setValue(json:): path 31 deep, value 2 deep") { db in try await db.reference(p31).setValue(json: nestedJSON(2)) },
            Refused(testDescription: "setValue(json:): path 31 deep, array 2 deep") { db in try await db.reference(p31).setValue(json: nestedArrayJSON(2)) },
            Refused(testDescription: "setValue(andPriority:): path 31 deep, value 2 deep") { db in try await db.reference(p31).setValue(nested(2), andPriority: 1) },
            Refused(testDescription: "setValue: value 40 deep at the root") { db in try await db.root.setValue(nested(40)) },
            Refused(testDescription: "setValue(json:): value 40 deep at the root") { db in try await db.root.setValue(json: nestedJSON(40)) },
            Refused(testDescription: "setValue: value 33 deep at the root") { db in try await db.root.setValue(nested(33)) },
            Refused(testDescription: "setValue(json:): value 33 deep at the root, a null leaf") { db in
                try await db.root.setValue(json: String(repeating: #"{"k":"#, count: 33) + "null" + String(repeating: "}", count: 33))
            },
            Refused(testDescription: "setValue: a .value wrapper 33 deep") { db in try await db.reference(p31).setValue(["a": ["b": [".value": 1, ".priority": 2]]]) },
            Refused(testDescription: "updateChildValues at the root: path 31 deep, value 2 deep") { db in try await db.root.updateChildValues([p31: nested(2)]) },
            Refused(testDescription: "updateChildValues below a path 30 deep: child 1 deep, value 2 deep") { db in
                try await db.reference(p30).updateChildValues(["a": 1, "b": nested(2)])
            },
            Refused(testDescription: "updateChildValuesNow: value 40 deep") { db in try db.root.updateChildValuesNow(["a": nested(40)]) },
            Refused(testDescription: "runTransaction: path 31 deep, value 2 deep") { db in
                _ = try await db.reference(p31).runTransaction { d in d.value = nested(2); return .commit }
            },
            Refused(testDescription: "applyServerPut: path 31 deep, value 2 deep") { db in try await db.applyServerPut(at: p31, nested(2)) },
            Refused(testDescription: "applyServerMerge: path 30 deep, child 2 deep, value 1 deep") { db in
                try await db.applyServerMerge(at: p30, ["a/b": nested(1)])
            },
            Refused(testDescription: "applyServerMerge: path 31 deep, a leaf child 2 deep", code: .invalidPath) { db in
                try await db.applyServerMerge(at: p31, ["a/b": 1])
            },
            Refused(testDescription: "updateChildValues: path 31 deep, a leaf child 2 deep", code: .invalidPath) { db in
                try await db.reference(p31).updateChildValues(["a/b": 1])
            },
            Refused(testDescription: "path 33 deep", code: .invalidPath) { db in try await db.reference(path(33)).setValue(1) },
            Refused(testDescription: "Codable UInt64.max") { db in try await db.reference("x").setValue(Post(n: .max)) },
            Refused(testDescription: "Codable UInt64 2^63") { db in try await db.reference("x").setValue(Post(n: UInt64(Int64.max) + 1)) },
            Refused(testDescription: "Codable [UInt] with UInt.max") { db in try await db.reference("x").setValue(Wide(items: [1, .max])) },
            Refused(testDescription: "Codable bare UInt64.max") { db in try await db.reference("x").setValue(UInt64.max) },
            // An increment that is not a finite number, or whose sum is not (`big` holds 1.5e308):
            // stored, it would be a record no read could decode.
            Refused(testDescription: "setValue: an increment of NaN") { db in try await db.reference("x").setValue(ServerValue.increment(Double.nan)) },
            Refused(testDescription: "setValue: an increment of infinity") { db in try await db.reference("x").setValue(ServerValue.increment(Double.infinity)) },
            Refused(testDescription: "updateChildValues: an increment of NaN") { db in try await db.root.updateChildValues(["x": ServerValue.increment(Double.nan)]) },
            Refused(testDescription: "setValue: an increment past a double's range") { db in try await db.reference("big").setValue(ServerValue.increment(1.5e308)) },
            Refused(testDescription: "setValueNow: an increment past a double's range") { db in try db.reference("big").setValueNow(ServerValue.increment(1.5e308)) },
            Refused(testDescription: "setValue: an increment past a double's range, below") { db in try await db.root.setValue(["big": ServerValue.increment(1.5e308), "base": 2]) },
            Refused(testDescription: "updateChildValues: an increment past a double's range") { db in
                try await db.root.updateChildValues(["base": 3, "big": ServerValue.increment(1.5e308)])
            },
        ]
        // Keys Swift holds equal though their bytes differ ("é" as one code point, and "e" with a
        // combining accent) are one key of a `Value`'s dictionary: JSON giving both is refused by
        // both paths, as a key given twice.
        cases += Refused.json("keys that differ only in Unicode normalization", Array(#"{"\#u{E9}":1,"e\#u{301}":2}"#.utf8))
        cases += Refused.json("keys that differ only in Unicode normalization, escaped", Array(#"{"\u00e9":1,"a":0,"e\u0301":2}"#.utf8))
        cases += Refused.json("an ASCII key and the Kelvin sign, equal under normalization", Array(#"{"K":1,"\u212A":2}"#.utf8))
        return cases
    }()

    @Test(arguments: refused)
    func aRefusedInputIsAnErrorAtTheCallAndWritesNothing(_ input: Refused) async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        try await db.applyServerPut(at: "", ["base": 1, "big": 1.5e308])
        try await db.reference("w").setValue("pending")
        let recorder = Recorder()
        recorder.listen(db.root.query)
        try await db.sync()
        recorder.reset()
        let pending = db.pendingWriteCount
        let next = try #require(db.log).nextLSN
        let before = try await db.root.getData().value

        do {
            try await input.call(db)
            Issue.record("accepted")
        } catch let e as DatabaseError {
            #expect(e.code == input.code, "\(e)")
            #expect(!e.message.isEmpty)
        }
        #expect(db.pendingWriteCount == pending)
        #expect(db.log?.nextLSN == next, "no record was appended")
        #expect(recorder.all.isEmpty, "no listener fired: \(recorder.all)")
        #expect(try await db.root.getData().value == before)
        try await db.close()
    }

    /// An input at the edge that must be accepted, and the value it must read back as.
    struct Accepted: Sendable, CustomTestStringConvertible {
        var testDescription: String
        var at: String
        var expected: Value
        var call: @Sendable (Database) async throws -> Void
    }

    static let accepted: [Accepted] = {
        var cases: [Accepted] = []
        for (text, value) in [("-0", Value.int(0)), ("0", .int(0)), ("1e5", .double(1e5)), ("1E+5", .double(1e5)), ("0.5", .double(0.5)),
                              ("-0.5e-3", .double(-0.0005)), ("-9223372036854775808", .int(.min)), ("9223372036854775807", .int(.max)),
                              ("123456789012345678901234567890", .double(1.2345678901234568e29))] {
            cases.append(Accepted(testDescription: "setValue(json:) \(text)", at: "x/n", expected: value) { db in try await db.reference("x").setValue(json: #"{"n": \#(text) }"#) })
            cases.append(Accepted(testDescription: "Value(json:) \(text)", at: "x/n", expected: value) { db in try await db.reference("x").setValue(try Value(json: #"{"n":\#(text)}"#)) })
        }
        cases.append(Accepted(testDescription: "UTF-8 of every length", at: "x/s", expected: "aé€😀") { db in
            try await db.reference("x").setValue(jsonBytes: Array(#"{"s":"aé€😀"}"#.utf8))
        })
        let p30 = path(30), p31 = path(31), p32 = path(32)
        cases += [
            Accepted(testDescription: "setValue: 32 deep at the root", at: path(0), expected: nested(32)) { db in try await db.root.setValue(nested(32)) },
            Accepted(testDescription: "setValue(json:): 32 deep at the root", at: "", expected: nested(32)) { db in try await db.root.setValue(json: nestedJSON(32)) },
            Accepted(testDescription: "setValue: path 30 deep, value 2 deep", at: p30, expected: nested(2)) { db in try await db.reference(p30).setValue(nested(2)) },
            Accepted(testDescription: "setValue(json:): path 30 deep, value 2 deep", at: p30, expected: nested(2)) { db in try await db.reference(p30).setValue(json: nestedJSON(2)) },
            Accepted(testDescription: "setValue: path 32 deep, a leaf", at: p32, expected: 1) { db in try await db.reference(p32).setValue(1) },
            Accepted(testDescription: "setValue: path 31 deep, .value and .priority add no level", at: p31, expected: ["k": 1]) { db in
                try await db.reference(p31).setValue(["k": [".value": 1, ".priority": 2], ".priority": 3])
            },
            Accepted(testDescription: "setValue(json:): path 32 deep, .sv adds no level", at: p32, expected: 1) { db in
                try await db.reference(p32).setValue(json: #"{".sv":{"increment":1}}"#)
            },
            Accepted(testDescription: "updateChildValues: path 31 deep, value 1 deep", at: p31, expected: nested(1)) { db in try await db.root.updateChildValues([p31: nested(1)]) },
            Accepted(testDescription: "runTransaction: path 30 deep, value 2 deep", at: p30, expected: nested(2)) { db in
                _ = try await db.reference(p30).runTransaction { d in d.value = nested(2); return .commit }
            },
            Accepted(testDescription: "applyServerPut: path 30 deep, value 2 deep", at: p30, expected: nested(2)) { db in try await db.applyServerPut(at: p30, nested(2)) },
            Accepted(testDescription: "Codable Int64.max as UInt64", at: "x/n", expected: .int(.max)) { db in try await db.reference("x").setValue(Post(n: UInt64(Int64.max))) },
            Accepted(testDescription: "Codable Double 1e300", at: "x", expected: .double(1e300)) { db in try await db.reference("x").setValue(Double(1e300)) },
        ]
        return cases
    }()

    @Test(arguments: accepted)
    func anInputAtTheEdgeOfTheLimitsIsStoredAndSurvivesAReopen(_ input: Accepted) async throws {
        let dir = try TemporaryDirectory()
        do {
            let db = try Database.open(at: dir.path, options: quietOptions(.none))
            try await db.applyServerPut(at: "", [:])
            try await input.call(db)
            #expect(try await db.reference(input.at).getData().value == input.expected)
            try await db.close()
        }
        var options = quietOptions(.none)
        options.checkpointOnClose = false
        for withCheckpoint in [true, false] {
            if !withCheckpoint {
                for name in try Files.list(dir.path) where name.hasPrefix("checkpoint-") { try Files.remove(dir.sub(name)) }
            }
            let db = try Database.open(at: dir.path, options: options)
            #expect(try await db.reference(input.at).getData().value == input.expected, "reopened, checkpoint: \(withCheckpoint)")
            try await db.close()
        }
    }

    // MARK: The stored form

    /// A stored value nested `levels` deep: objects of one child `k`, an integer leaf.
    static func storedNested(_ levels: Int) -> [UInt8] {
        var bytes: [UInt8] = []
        for _ in 0..<levels { bytes += [ValueCodec.Tag.children.rawValue, 1, 1, UInt8(ascii: "k")] }
        return bytes + [ValueCodec.Tag.int.rawValue, 2]
    }

    @Test func theDecoderReadsWhatTheDataModelAllowsAndRefusesDeeperNesting() throws {
        let deepest = try Self.storedNested(32).withUnsafeBytes { try ValueCodec.decode($0) }
        #expect(deepest.value() == Self.nested(32))
        #expect(ValueCodec.encode(try Node(Self.nested(32))) == Self.storedNested(32), "the writer's bytes, byte for byte")
        for levels in [33, 40, 600, 5000] {
            #expect(throws: DatabaseError.self, "\(levels) levels") { try Self.storedNested(levels).withUnsafeBytes { try ValueCodec.decode($0) } }
        }
        // Priorities cannot be used to nest: a priority is a number or string leaf, and a value
        // has one priority.
        let priority = ValueCodec.Tag.withPriority.rawValue, int = ValueCodec.Tag.int.rawValue
        #expect(try [priority, int, 2, int, 4].withUnsafeBytes { try ValueCodec.decode($0) } == .leaf(.int(2), priority: .leaf(.int(1), priority: .empty)))
        for bad: [UInt8] in [Array(repeating: priority, count: 5000) + [int, 2], [priority, priority, int, 2, int, 4, int, 6], [priority, int, 2, priority, int, 4, int, 6],
                             [priority, int, 2, ValueCodec.Tag.empty.rawValue], [priority, ValueCodec.Tag.children.rawValue, 1, 1, UInt8(ascii: "k"), int, 2, int, 2]] {
            #expect(throws: DatabaseError.self, "\(bad.prefix(12))") { try bad.withUnsafeBytes { try ValueCodec.decode($0) } }
        }
    }

    // MARK: Checkpoints

    @Test func aCheckpointHoldingTheLongestLegalPathIsUsedByTheNextOpen() async throws {
        let dir = try TemporaryDirectory()
        let key = String(repeating: "k", count: 768)
        let longest = Array(repeating: key, count: Path.maxDepth).joined(separator: "/")
        let written: UInt64
        do {
            let db = try Database.open(at: dir.path, options: quietOptions(.none))
            try await db.applyServerPut(at: longest, "server")  // a server-cache entry: 32 keys deep
            try await db.reference(longest).setValue(1, andPriority: "p")   // a pending write and its overlay, with a priority
            try await db.reference("short").setValue(2)
            written = try #require(db.log).nextLSN.rawValue
            try await db.close()
        }
        var options = quietOptions(.none)
        options.checkpointOnClose = false
        let db = try Database.open(at: dir.path, options: options)
        #expect(db.engine.withLock { $0.checkpointLSN } == written, "the open loaded the checkpoint instead of replaying the log")
        let snapshot = try await db.reference(longest).getData()
        #expect(snapshot.value == 1)
        #expect(snapshot.priority == "p")
        #expect(db.pendingWriteCount == 2)
        #expect(try await db.reference("short").getData().value == 2)
        try await db.close()
    }
}
