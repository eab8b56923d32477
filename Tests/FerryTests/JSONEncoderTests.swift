import FerryTestSupport
import Testing

@testable import Ferry

/// The one-pass JSON encoder (``JSONValueEncoder``): the same bytes as through a ``Value`` on
/// the shapes its fast paths take (plain strings and keys copied straight from the text, keys
/// given in order or not), and the same error, word for word, for every kind of bad input.
@Suite struct JSONEncoderTests {
    /// The messages the encoder gave before its fast paths were added (taken from that build):
    /// bad input must still be refused with exactly these words.
    static let refusals: [(json: String, message: String)] = [
        (#"{"a":{"b/c":1}}"#,
         #"at /x/y/a: the key "b/c" contains "/"; keys may not contain . $ # [ ] or /"#),
        (#"{"a":1,"a":2}"#,
         #"invalid JSON at byte 13: the key "a" appears twice in an object"#),
        (#"{"b":1,"a":{"c":1,"c":2}}"#,
         #"invalid JSON at byte 24: the key "c" appears twice in an object"#),
        (#"{"z":1,"a\u0061":2,"aa":3}"#,
         #"invalid JSON at byte 26: the key "aa" appears twice in an object"#),
        (#"{"a\u0007":1}"#,
         #"at /x/y: the key "a\u{7}" contains an ASCII control character"#),
        (#"{"":1}"#,
         #"at /x/y: a key may not be empty"#),
        (#"{".x":1}"#,
         #"at /x/y: the key ".x" contains "."; keys may not contain . $ # [ ] or /"#),
        (#"{"a":1,".priority":true}"#,
         #"the priority at /x/y is true; a priority must be a string, a number or null"#),
        (#"{".priority":1,".priority":2,"a":1}"#,
         #"invalid JSON at byte 27: the key ".priority" appears twice in an object"#),
        (#"{"a":"\ud800"}"#,
         #"invalid JSON at byte 12: invalid \u escape"#),
        (#"{"a":01}"#,
         #"invalid JSON at byte 5: "01" is not a JSON number (a number may not have leading zeros)"#),
        (#"{"a" 1}"#,
         #"invalid JSON at byte 5: expected :"#),
        (#"{"a":1"#,
         #"invalid JSON at byte 6: unterminated object"#),
        (#"["a",]"#,
         #"invalid JSON at byte 5: unexpected character"#),
        (#"{"a":"x\q"}"#,
         #"invalid JSON at byte 9: invalid escape"#),
        (#"{"a":"x"#,
         #"invalid JSON at byte 7: unterminated string"#),
        ("{\"a\":\"x\u{01}\"}",
         #"invalid JSON at byte 7: control character in a string"#),
        (#"{"a":[1,2,{"b":{"c/d":1}}]}"#,
         #"at /x/y/a/2/b: the key "c/d" contains "/"; keys may not contain . $ # [ ] or /"#),
        (#"{"é/":1}"#,
         #"at /x/y: the key "é/" contains "/"; keys may not contain . $ # [ ] or /"#),
        (#"{"a":{".sv":"nonsense"}}"#,
         #"the server value at /x/y/a is "nonsense"; only "timestamp" and {"increment": n} with n a finite number exist"#),
        (#"{"a":1}x"#,
         #"invalid JSON at byte 7: unexpected text after the JSON value"#),
        (#"{"[":1}"#,
         #"at /x/y: the key "[" contains "["; keys may not contain . $ # [ ] or /"#),
        (#"{"a":1e999}"#,
         #"invalid JSON at byte 10: invalid number 1e999"#),
        (#"{"a":NaN}"#,
         #"invalid JSON at byte 5: unexpected character"#),
        (#"{"a":{"b":[{"c":{"d\u002fe":true}}]}}"#,
         #"at /x/y/a/b/0/c: the key "d/e" contains "/"; keys may not contain . $ # [ ] or /"#),
        (#"{1:2}"#,
         #"invalid JSON at byte 1: expected a key"#),
        (#"{"k":[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[[1]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]]}"#,
         #"the value at /x/y/k/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0/0 lies 33 keys below the root (the path's keys plus the value's nesting); the limit is 32"#),
        (String(repeating: #"{"k":"#, count: 31) + "1" + String(repeating: "}", count: 31),
         #"the value at /x/y/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k/k lies 33 keys below the root (the path's keys plus the value's nesting); the limit is 32"#),
        ("{\"" + String(repeating: "x", count: 769) + "\":1}",
         #"at /x/y: the key "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx…" is 769 bytes of UTF-8; the limit is 768"#),
    ]

    @Test func badJSONIsRefusedWithTheSameMessageAsBefore() {
        for (json, message) in Self.refusals {
            let error = #expect(throws: DatabaseError.self) { try EncodedValue(jsonBytes: Array(json.utf8), path: "x/y") }
            #expect(error?.message == message, "\(json)")
        }
        // Invalid UTF-8 names its byte.
        let invalid = Array(#"{"a":"caf"#.utf8) + [0xC3, 0x22, 0x7D]
        let error = #expect(throws: DatabaseError.self) { try EncodedValue(jsonBytes: invalid, path: "x/y") }
        #expect(error?.message.contains("byte 9") == true, "\(String(describing: error))")
    }
}

extension JSONEncoderTests {
    /// Objects whose keys come in key order (left where written) and out of it (rearranged),
    /// with null children, long arrays (indices of two and three digits), more than 127
    /// children, priorities, escaped and non-ASCII keys and strings: the same bytes as through
    /// a ``Value`` and a ``Node``.
    @Test func plainAndEscapedStringsAndOrderedAndUnorderedKeysEncodeAsThroughAValue() throws {
        var g = SplitMix(seed: 99)
        func pick<T>(_ xs: [T]) -> T { xs[Int(g.next() % UInt64(xs.count))] }
        let keyPool = ["a", "b", "c", "aa", "ab", "z", "0", "1", "2", "9", "10", "-3", "007", "2147483648", "é", "😀",
                       "\u{E000}", "key with spaces", "k\\u0041", "\\u00e9t\\u00e9", "A", "\\\"q\\\""]
        func string() -> String {
            pick([#""plain text""#, #""""#, #""caf\u00e9 \"q\" \\ \/ \n""#, #""naïve 😀""#, #""\ud83d\ude00""#, #""tab\there""#])
        }
        func value(_ depth: Int) -> String {
            guard depth < 3 else { return pick(["1", "-7", "2.5", "true", "null", string()]) }
            switch g.next() % 6 {
            case 0: return string()
            case 1: return "[" + (0..<Int(g.next() % 14)).map { _ in value(depth + 1) }.joined(separator: ",") + "]"
            case 2: return pick(["0", "null", "false", "1e2"])
            default:
                var keys = Array(Set((0..<Int(g.next() % 7)).map { _ in pick(keyPool) }))
                if g.next() % 2 == 0 { keys.sort { KeyOrder.compare(decoded($0), decoded($1)) < 0 } }
                var members = keys.map { #"""# + $0 + #"":"# + value(depth + 1) }
                if g.next() % 5 == 0 { members.insert(#"".priority":"# + pick(["3", #""p""#]), at: members.count / 2) }
                return "{" + members.joined(separator: ",") + "}"
            }
        }
        // The key a JSON key literal stands for (its escapes decoded).
        func decoded(_ k: String) -> String {
            if case .string(let s)? = try? Value(json: #"""# + k + #"""#) { return s }
            return k
        }
        var texts = (0..<3_000).map { _ in value(0) }
        let many = (0..<300).map { #""k\#($0)":\#($0)"# }
        texts += ["{" + many.joined(separator: ",") + "}", "{" + many.reversed().joined(separator: ",") + "}",
                  "[" + (0..<130).map { String($0) }.joined(separator: ",") + "]",
                  #"{"b":{"y":null},"a":{},"c":[null,null]}"#, #"{"b":1,"a":null}"#,
                  // Children of the open objects beyond the 16 kept on the stack, and output beyond its 1 KiB.
                  "{" + (0..<50).map { #""o\#($0)":{"# + many.prefix(50).reversed().joined(separator: ",") + "}" }.joined(separator: ",") + "}"]
        for text in texts {
            let bytes = Array(text.utf8)
            let expected = try ValueCodec.encode(Node(Value(jsonBytes: bytes), path: "x/y"))
            #expect(try EncodedValue(jsonBytes: bytes, path: "x/y").bytes == expected, "\(text)")
        }
    }
}

extension JSONEncoderTests {
    /// `Path(validating:)` splits and checks in one pass: the same keys as splitting, and the
    /// same error, word for word, as checking the split path — for slashes doubled or at the
    /// ends, forbidden and control characters, non-ASCII keys, `.priority`, keys over 768
    /// bytes and paths deeper than 32 keys.
    @Test func parsingAPathGivesTheSameKeysAndErrorsAsSplittingThenValidating() {
        var g = SplitMix(seed: 7)
        func pick<T>(_ xs: [T]) -> T { xs[Int(g.next() % UInt64(xs.count))] }
        let pieces = ["a", "posts", "p00000001", "/", "/", "//", "é", "😀", ".", "$", "#", "[", "]", "\u{7}", "\u{7F}",
                      ".priority", "x y", String(repeating: "k", count: 700), "-1", "0"]
        var refused = 0
        for n in 0..<4_000 {
            let text = n % 100 == 0
                ? (0..<(30 + Int(g.next() % 5))).map { _ in "k" }.joined(separator: "/")
                : (0..<Int(g.next() % 8)).map { _ in pick(pieces) }.joined()
            let oneStep = Result { try Path(validating: text) }
            let twoSteps = Result { () throws -> Path in
                let p = Path(text)
                try p.validate()
                return p
            }
            switch (oneStep, twoSteps) {
            case let (.success(a), .success(b)): #expect(a == b, "\(text)")
            case let (.failure(a as DatabaseError), .failure(b as DatabaseError)):
                #expect(a.message == b.message && a.code == b.code, "\(text)")
                refused += 1
            default: Issue.record("\(text): \(oneStep) / \(twoSteps)")
            }
        }
        #expect(refused > 500)
    }
}

extension JSONEncoderTests {
    /// Strings are scanned eight bytes at a time until one of them needs a closer look: a
    /// quote, an escape, a control character, a byte of a multi-byte character or one that is
    /// not UTF-8 — at every position of the word, in keys and values, the result (bytes, or
    /// the error and the byte it names) is the one the Value route gives.
    @Test func everyByteThatEndsTheWordAtATimeScanIsFoundAtEveryPosition() throws {
        let specials: [[UInt8]] = [Array(#"\""#.utf8), Array(#"\\"#.utf8), Array(#"\u0041"#.utf8), [0x01], [0x1F], [0x20], [0x7F],
                                   Array("é".utf8), Array("😀".utf8), [0xFF], [0xC3], [0x22]]
        for special in specials {
            for position in 0..<20 {
                let plain = Array("abcdefghijklmnopqrstuvwx".utf8)
                let content = Array(plain[0..<position]) + special + Array(plain[position...])
                for (isKey, text) in [(false, [0x22] + content + [0x22]), (true, Array(#"{""#.utf8) + content + Array(#"":1,"z":true}"#.utf8))] {
                    let direct = Result { try EncodedValue(jsonBytes: text, path: "x") }
                    let viaValue = Result { try Node(Value(jsonBytes: text), path: "x") }
                    switch (direct, viaValue) {
                    case let (.success(e), .success(n)): #expect(e.bytes == ValueCodec.encode(n))
                    case let (.failure(a as DatabaseError), .failure(b as DatabaseError)):
                        // (A bad key is named before the text after it is read: only a value's
                        // errors are word for word the Value route's.)
                        if !isKey { #expect(a.message == b.message) }
                    default: Issue.record("\(special) at \(position): \(direct) / \(viaValue)")
                    }
                }
            }
        }
    }
}
