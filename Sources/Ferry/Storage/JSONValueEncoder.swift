/// Encodes JSON text straight into ``ValueCodec``'s form, in one pass and without a ``Value``
/// tree: the bytes are those `ValueCodec.encode(Node(Value(jsonBytes: text)))` gives —
/// children in key order, null children dropped, empty objects null, arrays as objects with integer keys, priorities — with the same
/// validation. Objects with `.sv` or `.value` (server values, wrapped leaves) are rare and go
/// through a ``Value``.
struct JSONValueEncoder {
    private let text: [UInt8]
    private let input: UnsafeBufferPointer<UInt8>
    private var i = 0
    var w = ByteWriter(capacity: 256)
    private let base: Path
    /// Keys from `base` down to the value being encoded, for error messages.
    private var keys: [String] = []
    private(set) var hasServerValues = false
    /// The children of the objects being encoded, innermost last.
    private var spans: [Span] = []
    /// A string's decoded bytes.
    private var scratch: [UInt8] = []
    private var assembly: [UInt8] = []

    private struct Span {
        var rank: KeyRank
        /// Where the key's bytes are in the output, and the child (key and value).
        var keyStart: Int
        var keyLength: Int
        var start: Int
        var end: Int
        var empty: Bool
    }

    /// Encodes `text`, to be written at `path`; returns the bytes and whether they hold
    /// server values.
    static func encode(_ text: [UInt8], path: Path) throws -> (bytes: [UInt8], hasServerValues: Bool) {
        try text.withUnsafeBufferPointer { input in
            var e = JSONValueEncoder(text: text, input: input, base: path)
            e.skipSpace()
            if try !e.value(depth: 0) { e.w.u8(ValueCodec.Tag.empty.rawValue) }
            e.skipSpace()
            guard e.i == input.count else { throw e.syntax("unexpected text after the JSON value") }
            return (e.w.bytes, e.hasServerValues)
        }
    }

    private init(text: [UInt8], input: UnsafeBufferPointer<UInt8>, base: Path) {
        self.text = text
        self.input = input
        self.base = base
    }

    private var location: Path { keys.isEmpty ? base : base.child(Path(keys: keys)) }

    /// Refuses a child `key` of the value being encoded that would lie deeper than
    /// ``Path/maxDepth`` below the root.
    private func checkDepth(below key: String) throws {
        let depth = base.count + keys.count + 1
        if depth > Path.maxDepth { throw Path.valueTooDeep(at: location.child(key).description, depth: depth) }
    }

    private func syntax(_ why: String) -> DatabaseError {
        DatabaseError(.invalidData, "invalid JSON at byte \(i): \(why)")
    }

    private mutating func skipSpace() {
        while i < input.count {
            switch input[i] {
            case 0x20, 0x0A, 0x0D, 0x09: i += 1
            default: return
            }
        }
    }

    private mutating func expect(_ word: StaticString) throws {
        let p = word.utf8Start
        for j in 0..<word.utf8CodeUnitCount {
            guard i < input.count, input[i] == p[j] else { throw syntax("expected \(word)") }
            i += 1
        }
    }

    /// Appends the value at `i`; returns false, having appended nothing, when it is empty.
    private mutating func value(depth: Int) throws -> Bool {
        guard depth < JSON.maxDepth else { throw syntax("nested deeper than \(JSON.maxDepth)") }
        guard i < input.count else { throw syntax("unexpected end of input") }
        switch input[i] {
        case UInt8(ascii: "n"):
            try expect("null")
            return false
        case UInt8(ascii: "t"):
            try expect("true")
            w.u8(ValueCodec.Tag.true.rawValue)
        case UInt8(ascii: "f"):
            try expect("false")
            w.u8(ValueCodec.Tag.false.rawValue)
        case UInt8(ascii: "\""):
            try string()
            w.u8(ValueCodec.Tag.string.rawValue)
            w.varint(UInt64(scratch.count))
            w.bytes.append(contentsOf: scratch)
        case UInt8(ascii: "["):
            return try array(depth: depth)
        case UInt8(ascii: "{"):
            return try object(depth: depth)
        default:
            try number()
        }
        return true
    }

    private mutating func array(depth: Int) throws -> Bool {
        i += 1
        let start = w.count
        w.u8(ValueCodec.Tag.children.rawValue)
        let countAt = w.count
        w.u8(0)
        var n = 0, index = 0
        skipSpace()
        if i < input.count && input[i] == UInt8(ascii: "]") {
            i += 1
        } else {
            while true {
                skipSpace()
                // Array indices are in key order already (integer keys sort numerically).
                let childStart = w.count
                let key = String(index)
                try checkDepth(below: key)
                w.string(key)
                keys.append(key)
                if try value(depth: depth + 1) { n += 1 } else { w.bytes.removeLast(w.count - childStart) }
                keys.removeLast()
                index += 1
                skipSpace()
                guard i < input.count else { throw syntax("unterminated array") }
                if input[i] == UInt8(ascii: ",") { i += 1; continue }
                if input[i] == UInt8(ascii: "]") { i += 1; break }
                throw syntax("expected , or ] in an array")
            }
        }
        guard n > 0 else {
            w.bytes.removeLast(w.count - start)
            return false
        }
        w.patchVarint(n, at: countAt)
        return true
    }

    private mutating func object(depth: Int) throws -> Bool {
        let objectStart = i
        i += 1
        let start = w.count
        let spanBase = spans.count
        defer { spans.removeSubrange(spanBase...) }
        var priority: Value?
        skipSpace()
        if i < input.count && input[i] == UInt8(ascii: "}") {
            i += 1
            return false
        }
        while true {
            skipSpace()
            guard i < input.count, input[i] == UInt8(ascii: "\"") else { throw syntax("expected a key") }
            try string()
            let plain = scratch.withUnsafeBufferPointer { ValueEncoder.isPlainKey($0) }
            var keyText: String?
            if !plain {
                let key = String(decoding: scratch, as: UTF8.self)
                if key == ".sv" || key == ".value" {
                    // Server values and wrapped leaves: rare, built from a Value.
                    w.bytes.removeLast(w.count - start)
                    return try special(from: objectStart, depth: depth)
                }
                if key != ".priority" {
                    do { try Path.validate(key: key) } catch let e as DatabaseError {
                        throw DatabaseError(.invalidData, "at \(location): \(e.message)")
                    }
                }
                keyText = key
            }
            skipSpace()
            guard i < input.count, input[i] == UInt8(ascii: ":") else { throw syntax("expected :") }
            i += 1
            skipSpace()
            if keyText == ".priority" {
                guard priority == nil else { throw syntax("the key \".priority\" appears twice in an object") }
                var parser = JSON.Parser(bytes: text)
                parser.i = i
                priority = try parser.value(depth: depth + 1)
                i = parser.i
            } else {
                let childStart = w.count
                let keyLength = scratch.count
                w.varint(UInt64(keyLength))
                let keyStart = w.count
                w.bytes.append(contentsOf: scratch)
                let rank = scratch.withUnsafeBufferPointer { KeyRank($0) }
                let childKey = keyText ?? String(decoding: scratch, as: UTF8.self)
                try checkDepth(below: childKey)
                keys.append(childKey)
                let nonEmpty = try value(depth: depth + 1)
                keys.removeLast()
                spans.append(Span(rank: rank, keyStart: keyStart, keyLength: keyLength, start: childStart, end: w.count, empty: !nonEmpty))
            }
            skipSpace()
            guard i < input.count else { throw syntax("unterminated object") }
            if input[i] == UInt8(ascii: ",") { i += 1; continue }
            if input[i] == UInt8(ascii: "}") { i += 1; break }
            throw syntax("expected , or } in an object")
        }
        let priorityNode = try priority.map { try Node.priorityNode($0, at: location) } ?? .empty
        let bytes = w.bytes
        let duplicate: Int? = bytes.withUnsafeBufferPointer { out in
            func key(_ s: Span) -> UnsafeBufferPointer<UInt8> { UnsafeBufferPointer(rebasing: out[s.keyStart..<(s.keyStart + s.keyLength)]) }
            spans[spanBase...].sort { a, b in a.rank.precedes(b.rank) { KeyOrder.utf16Order(key(a), key(b)) < 0 } }
            // Sorted, a key given twice sits next to itself.
            for j in spanBase..<max(spanBase, spans.count - 1) {
                let a = spans[j], b = spans[j + 1]
                if a.keyLength == b.keyLength && a.rank.bytes == b.rank.bytes && key(a).elementsEqual(key(b)) { return j }
            }
            return nil
        }
        if let j = duplicate {
            let s = spans[j]
            throw syntax("the key \"\(String(decoding: bytes[s.keyStart..<(s.keyStart + s.keyLength)], as: UTF8.self))\" appears twice in an object")
        }
        var kept = 0
        for j in spanBase..<spans.count where !spans[j].empty { kept += 1 }
        guard kept > 0 else {
            w.bytes.removeLast(w.count - start)
            return false
        }
        assembly.removeAll(keepingCapacity: true)
        var header = ByteWriter(capacity: 32)
        if !priorityNode.isEmpty {
            header.u8(ValueCodec.Tag.withPriority.rawValue)
            ValueCodec.encode(priorityNode, into: &header)
        }
        header.u8(ValueCodec.Tag.children.rawValue)
        header.varint(UInt64(kept))
        assembly.append(contentsOf: header.bytes)
        for j in spanBase..<spans.count where !spans[j].empty {
            assembly.append(contentsOf: bytes[spans[j].start..<spans[j].end])
        }
        w.bytes.replaceSubrange(start..<w.count, with: assembly)
        return true
    }

    /// An object with `.sv` or `.value`: parsed again from its start as a Value.
    private mutating func special(from objectStart: Int, depth: Int) throws -> Bool {
        var parser = JSON.Parser(bytes: text)
        parser.i = objectStart
        let value = try parser.value(depth: depth)
        i = parser.i
        let node = try Node.build(value, at: location, depth: depth)
        guard !node.isEmpty else { return false }
        ValueCodec.encode(node, into: &w)
        if ServerValueResolver.containsDeferred(node) { hasServerValues = true }
        return true
    }

    /// Decodes the string at `i` into `scratch`; invalid UTF-8 is an error naming its byte.
    private mutating func string() throws {
        i += 1  // opening quote
        scratch.removeAll(keepingCapacity: true)
        while i < input.count {
            let c = input[i]
            if c == UInt8(ascii: "\"") {
                i += 1
                return
            }
            if c == UInt8(ascii: "\\") {
                var parser = JSON.Parser(bytes: text)
                parser.i = i + 1
                _ = try parser.escape(into: &scratch)
                i = parser.i
                continue
            }
            if c < 0x20 { throw syntax("control character in a string") }
            if c >= 0x80 {
                guard let n = UTF8Validation.sequenceLength(input, at: i) else { throw UTF8Validation.error(at: i, byte: c) }
                scratch.append(contentsOf: UnsafeBufferPointer(rebasing: input[i..<(i + n)]))
                i += n
                continue
            }
            scratch.append(c)
            i += 1
        }
        throw syntax("unterminated string")
    }

    /// Appends the number at `i`: exact integers as integers, the rest as doubles.
    private mutating func number() throws {
        let start = i
        let scan = JSON.scanNumber(input, at: start)
        if let problem = scan.problem { throw JSON.numberError(input, start: start, why: problem) }
        i = scan.end
        let integral = scan.integral
        let negative = start < input.count && input[start] == UInt8(ascii: "-")
        let digits = (negative ? start + 1 : start)..<i
        if integral {
            guard !digits.isEmpty else { throw syntax("unexpected character") }
            // Accumulated negatively, so that Int64.min fits.
            var v: Int64 = 0
            var overflow = false
            for j in digits {
                let (m, o1) = v.multipliedReportingOverflow(by: 10)
                let (s, o2) = m.subtractingReportingOverflow(Int64(input[j] - UInt8(ascii: "0")))
                if o1 || o2 { overflow = true; break }
                v = s
            }
            if !overflow && (negative || v != Int64.min) {
                w.u8(ValueCodec.Tag.int.rawValue)
                w.signed(negative ? v : -v)
                return
            }
        }
        let text = String(decoding: UnsafeBufferPointer(rebasing: input[start..<i]), as: UTF8.self)
        guard !text.isEmpty, text != "-" else { throw syntax("unexpected character") }
        guard let d = Double(text), d.isFinite else { throw syntax("invalid number \(text)") }
        w.u8(ValueCodec.Tag.double.rawValue)
        w.double(d)
    }
}
