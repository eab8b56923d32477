/// JSON text in and out, for the edges of the API. The log never holds JSON (values are
/// stored in the binary form of ValueCodec).
enum JSON {
    static let maxDepth = 512

    static func parse(_ bytes: [UInt8], integersMustFit: Bool = false) throws -> Value {
        var p = Parser(bytes: bytes)
        p.integersMustFit = integersMustFit
        p.skipSpace()
        let v = try p.value(depth: 0)
        p.skipSpace()
        guard p.i == bytes.count else { throw p.error("unexpected text after the JSON value") }
        return v
    }

    /// Scans the number at `start`, which must have RFC 8259's syntax — `-`? then `0` or a
    /// digit 1–9 and more digits, then optionally `.` and digits, then optionally `e` or `E`, a
    /// sign and digits — and be followed by whitespace, `,`, `]`, `}` or the end (so `01`, `1.`,
    /// `+1`, `.5`, `-01`, `1.e5` are refused). Returns where it ends, whether it has neither a
    /// fraction nor an exponent, and why it is not a number (nil when it is).
    @inline(__always)
    static func scanNumber(_ b: UnsafeBufferPointer<UInt8>, at start: Int) -> (end: Int, integral: Bool, problem: String?) {
        var i = start
        let n = b.count
        @inline(__always) func digit(_ at: Int) -> Bool { at < n && b[at] &- UInt8(ascii: "0") < 10 }
        if i < n && b[i] == UInt8(ascii: "-") { i += 1 }
        guard digit(i) else {
            if i < n && b[i] == UInt8(ascii: "+") { return (i, false, "a number may not start with +") }
            if i < n && b[i] == UInt8(ascii: ".") { return (i, false, "a digit must come before the decimal point") }
            return (i, false, i == start ? "" : "a digit must follow -")
        }
        if b[i] == UInt8(ascii: "0") {
            i += 1
            if digit(i) { return (i, false, "a number may not have leading zeros") }
        } else {
            while digit(i) { i += 1 }
        }
        var integral = true
        if i < n && b[i] == UInt8(ascii: ".") {
            integral = false
            i += 1
            guard digit(i) else { return (i, false, "a digit must follow the decimal point") }
            while digit(i) { i += 1 }
        }
        if i < n && (b[i] == UInt8(ascii: "e") || b[i] == UInt8(ascii: "E")) {
            integral = false
            i += 1
            if i < n && (b[i] == UInt8(ascii: "+") || b[i] == UInt8(ascii: "-")) { i += 1 }
            guard digit(i) else { return (i, false, "a digit must follow the exponent's e") }
            while digit(i) { i += 1 }
        }
        if i < n && !Parser.isDelimiter(b[i]) { return (i, false, "unexpected character after the number") }
        return (i, integral, nil)
    }

    /// The error for the text at `start` that is not a JSON number (`why` empty: not a value).
    static func numberError<C: RandomAccessCollection<UInt8>>(_ bytes: C, start: Int, why: String) -> DatabaseError where C.Index == Int {
        if why.isEmpty { return DatabaseError(.invalidData, "invalid JSON at byte \(start): unexpected character") }
        var end = start
        while end < bytes.endIndex, end - start < 40, !Parser.isDelimiter(bytes[end]) { end += 1 }
        let token = String(decoding: bytes[start..<max(end, start + 1)], as: UTF8.self)
        return DatabaseError(.invalidData, "invalid JSON at byte \(start): \"\(token)\" is not a JSON number (\(why))")
    }

    struct Parser {
        let bytes: [UInt8]
        var i = 0
        /// Refuse integers beyond 64 bits instead of reading them as doubles.
        var integersMustFit = false

        func error(_ why: String) -> DatabaseError {
            DatabaseError(.invalidData, "invalid JSON at byte \(i): \(why)")
        }

        mutating func skipSpace() {
            while i < bytes.count, bytes[i] == 0x20 || bytes[i] == 0x0A || bytes[i] == 0x0D || bytes[i] == 0x09 { i += 1 }
        }

        mutating func expect(_ word: String) throws {
            for c in word.utf8 {
                guard i < bytes.count, bytes[i] == c else { throw error("expected \(word)") }
                i += 1
            }
        }

        mutating func value(depth: Int) throws -> Value {
            guard depth < JSON.maxDepth else { throw error("nested deeper than \(JSON.maxDepth)") }
            guard i < bytes.count else { throw error("unexpected end of input") }
            switch bytes[i] {
            case UInt8(ascii: "n"): try expect("null"); return .null
            case UInt8(ascii: "t"): try expect("true"); return .bool(true)
            case UInt8(ascii: "f"): try expect("false"); return .bool(false)
            case UInt8(ascii: "\""): return .string(try string())
            case UInt8(ascii: "["):
                i += 1
                var items: [Value] = []
                skipSpace()
                if i < bytes.count, bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
                while true {
                    skipSpace()
                    items.append(try value(depth: depth + 1))
                    skipSpace()
                    guard i < bytes.count else { throw error("unterminated array") }
                    if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
                    if bytes[i] == UInt8(ascii: "]") { i += 1; return .array(items) }
                    throw error("expected , or ] in an array")
                }
            case UInt8(ascii: "{"):
                i += 1
                var object: [String: Value] = [:]
                skipSpace()
                if i < bytes.count, bytes[i] == UInt8(ascii: "}") { i += 1; return .object(object) }
                while true {
                    skipSpace()
                    guard i < bytes.count, bytes[i] == UInt8(ascii: "\"") else { throw error("expected a key") }
                    let key = try string()
                    skipSpace()
                    guard i < bytes.count, bytes[i] == UInt8(ascii: ":") else { throw error("expected :") }
                    i += 1
                    skipSpace()
                    let keyAt = i
                    let child = try value(depth: depth + 1)
                    guard object.updateValue(child, forKey: key) == nil else {
                        i = keyAt
                        throw error("the key \"\(key)\" appears twice in an object")
                    }
                    skipSpace()
                    guard i < bytes.count else { throw error("unterminated object") }
                    if bytes[i] == UInt8(ascii: ",") { i += 1; continue }
                    if bytes[i] == UInt8(ascii: "}") { i += 1; return .object(object) }
                    throw error("expected , or } in an object")
                }
            default:
                return try number()
            }
        }

        /// Moves past the number at `i`, which must have RFC 8259's syntax (see
        /// ``JSON/scanNumber(_:at:)``); returns where it started and whether it has neither a
        /// fraction nor an exponent.
        /// - Throws: ``DatabaseError/Code/invalidData`` naming the byte offset and the number.
        mutating func scanNumber() throws -> (start: Int, integral: Bool) {
            let start = i
            let scan = bytes.withUnsafeBufferPointer { JSON.scanNumber($0, at: start) }
            if let problem = scan.problem { throw JSON.numberError(bytes, start: start, why: problem) }
            i = scan.end
            return (start, scan.integral)
        }

        /// Whitespace or a character that may follow a value: `,` `]` `}`.
        static func isDelimiter(_ c: UInt8) -> Bool {
            switch c {
            case 0x20, 0x0A, 0x0D, 0x09, UInt8(ascii: ","), UInt8(ascii: "]"), UInt8(ascii: "}"): true
            default: false
            }
        }

        /// Converts the number at `i`: integers that fit 64 bits exactly, the rest as doubles.
        /// With `integersMustFit`, an integer beyond 64 bits is an error instead of a double
        /// (what an `Encodable` integer type wrote cannot be kept exactly otherwise).
        mutating func number() throws -> Value {
            let (start, integral) = try scanNumber()
            let text = String(decoding: bytes[start..<i], as: UTF8.self)
            if integral {
                if let v = Int64(text) { return .int(v) }
                if integersMustFit {
                    throw DatabaseError(.invalidData, "the integer \(text) at byte \(start) does not fit in 64 bits (\(Int64.min) to \(Int64.max)); the database keeps integers exactly only within that range")
                }
            }
            guard let d = Double(text), d.isFinite else { throw DatabaseError(.invalidData, "invalid JSON at byte \(start): the number \(text.prefix(40)) is out of a double's range") }
            return .double(d)
        }

        mutating func string() throws -> String {
            i += 1  // opening quote
            var out: [UInt8] = []
            while i < bytes.count {
                let c = bytes[i]
                if c == UInt8(ascii: "\"") { i += 1; return String(decoding: out, as: UTF8.self) }
                if c == UInt8(ascii: "\\") {
                    i += 1
                    _ = try escape(into: &out)
                    continue
                }
                if c < 0x20 { throw error("control character in a string") }
                if c >= 0x80 {
                    let n = try utf8Sequence()
                    out.append(contentsOf: bytes[i..<(i + n)])
                    i += n
                    continue
                }
                out.append(c)
                i += 1
            }
            throw error("unterminated string")
        }

        /// The length of the well-formed UTF-8 sequence at `i` (Unicode's table 3-7: no overlong
        /// forms, no surrogates, nothing above U+10FFFF).
        /// - Throws: ``DatabaseError/Code/invalidData`` naming the byte offset.
        func utf8Sequence() throws -> Int {
            guard let n = UTF8Validation.sequenceLength(bytes, at: i) else { throw UTF8Validation.error(at: i, byte: bytes[i]) }
            return n
        }

        /// Decodes the escape sequence at `i` (just after its backslash) into `out`; returns
        /// whether it decoded to a non-ASCII character.
        mutating func escape(into out: inout [UInt8]) throws -> Bool {
            guard i < bytes.count else { throw error("unterminated string") }
            let e = bytes[i]
            i += 1
            switch e {
            case UInt8(ascii: "\""): out.append(0x22)
            case UInt8(ascii: "\\"): out.append(0x5C)
            case UInt8(ascii: "/"): out.append(0x2F)
            case UInt8(ascii: "b"): out.append(0x08)
            case UInt8(ascii: "f"): out.append(0x0C)
            case UInt8(ascii: "n"): out.append(0x0A)
            case UInt8(ascii: "r"): out.append(0x0D)
            case UInt8(ascii: "t"): out.append(0x09)
            case UInt8(ascii: "u"):
                var scalar = try hex4()
                if (0xD800..<0xDC00).contains(scalar), i + 1 < bytes.count, bytes[i] == UInt8(ascii: "\\"), bytes[i + 1] == UInt8(ascii: "u") {
                    i += 2
                    let low = try hex4()
                    guard (0xDC00..<0xE000).contains(low) else { throw error("invalid surrogate pair") }
                    scalar = 0x10000 + ((scalar - 0xD800) << 10) + (low - 0xDC00)
                }
                guard let u = Unicode.Scalar(scalar) else { throw error("invalid \\u escape") }
                out.append(contentsOf: String(Character(u)).utf8)
                return scalar >= 0x80
            default: throw error("invalid escape")
            }
            return false
        }

        mutating func hex4() throws -> UInt32 {
            guard i + 4 <= bytes.count else { throw error("short \\u escape") }
            var v: UInt32 = 0
            for _ in 0..<4 {
                let c = bytes[i]
                i += 1
                let d: UInt32
                switch c {
                case UInt8(ascii: "0")...UInt8(ascii: "9"): d = UInt32(c - UInt8(ascii: "0"))
                case UInt8(ascii: "a")...UInt8(ascii: "f"): d = UInt32(c - UInt8(ascii: "a") + 10)
                case UInt8(ascii: "A")...UInt8(ascii: "F"): d = UInt32(c - UInt8(ascii: "A") + 10)
                default: throw error("invalid hex digit in \\u escape")
                }
                v = v * 16 + d
            }
            return v
        }
    }

    static func serialize(_ v: Value) -> String {
        var out: [UInt8] = []
        write(v, to: &out)
        return String(decoding: out, as: UTF8.self)
    }

    static func write(_ v: Value, to out: inout [UInt8]) {
        switch v {
        case .null: out.append(contentsOf: "null".utf8)
        case .bool(let b): out.append(contentsOf: (b ? "true" : "false").utf8)
        case .int(let i): out.append(contentsOf: String(i).utf8)
        case .double(let d): out.append(contentsOf: formatDouble(d).utf8)
        case .string(let s): writeString(s, to: &out)
        case .array(let a):
            out.append(UInt8(ascii: "["))
            for (n, item) in a.enumerated() {
                if n > 0 { out.append(UInt8(ascii: ",")) }
                write(item, to: &out)
            }
            out.append(UInt8(ascii: "]"))
        case .object(let o):
            out.append(UInt8(ascii: "{"))
            for (n, key) in o.keys.sorted(by: { KeyOrder.compare($0, $1) < 0 }).enumerated() {
                if n > 0 { out.append(UInt8(ascii: ",")) }
                writeString(key, to: &out)
                out.append(UInt8(ascii: ":"))
                write(o[key]!, to: &out)
            }
            out.append(UInt8(ascii: "}"))
        }
    }

    static func formatDouble(_ d: Double) -> String {
        if d == d.rounded(), d.magnitude < 1e15 { return String(Int64(d)) }
        return "\(d)"
    }

    static func writeString(_ s: String, to out: inout [UInt8]) {
        out.append(UInt8(ascii: "\""))
        for c in s.utf8 {
            switch c {
            case 0x22: out.append(contentsOf: [0x5C, 0x22])
            case 0x5C: out.append(contentsOf: [0x5C, 0x5C])
            case 0x0A: out.append(contentsOf: [0x5C, UInt8(ascii: "n")])
            case 0x0D: out.append(contentsOf: [0x5C, UInt8(ascii: "r")])
            case 0x09: out.append(contentsOf: [0x5C, UInt8(ascii: "t")])
            case 0..<0x20:
                let hex = String(c, radix: 16)
                out.append(contentsOf: Array("\\u00".utf8) + Array((hex.count == 1 ? "0" + hex : hex).utf8))
            default: out.append(c)
            }
        }
        out.append(UInt8(ascii: "\""))
    }
}

/// Checks UTF-8 as Unicode defines it well-formed (table 3-7 of the standard).
enum UTF8Validation {
    /// The error for JSON text whose byte at `offset` does not begin a well-formed sequence.
    static func error(at offset: Int, byte: UInt8) -> DatabaseError {
        DatabaseError(.invalidData,
            "invalid JSON at byte \(offset): invalid UTF-8 (byte 0x\(String(byte, radix: 16, uppercase: true)) does not begin a well-formed sequence); JSON text must be UTF-8")
    }

    /// The length (1–4) of the well-formed sequence starting at `i`, or nil when the bytes
    /// there are not one (a stray continuation byte, an overlong form, a surrogate, a value
    /// above U+10FFFF, or a sequence cut short).
    static func sequenceLength<C: RandomAccessCollection<UInt8>>(_ b: C, at i: C.Index) -> Int? where C.Index == Int {
        let c0 = b[i]
        if c0 < 0x80 { return 1 }
        func cont(_ k: Int, _ range: ClosedRange<UInt8> = 0x80...0xBF) -> Bool { i + k < b.endIndex && range.contains(b[i + k]) }
        switch c0 {
        case 0xC2...0xDF: return cont(1) ? 2 : nil
        case 0xE0: return cont(1, 0xA0...0xBF) && cont(2) ? 3 : nil
        case 0xE1...0xEC, 0xEE...0xEF: return cont(1) && cont(2) ? 3 : nil
        case 0xED: return cont(1, 0x80...0x9F) && cont(2) ? 3 : nil
        case 0xF0: return cont(1, 0x90...0xBF) && cont(2) && cont(3) ? 4 : nil
        case 0xF1...0xF3: return cont(1) && cont(2) && cont(3) ? 4 : nil
        case 0xF4: return cont(1, 0x80...0x8F) && cont(2) && cont(3) ? 4 : nil
        default: return nil
        }
    }
}
