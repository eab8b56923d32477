/// Encodes JSON text straight into ``ValueCodec``'s form, in one pass and without a ``Value``
/// tree: the bytes are those `ValueCodec.encode(Node(Value(jsonBytes: text)))` gives —
/// children in key order, null children dropped, empty objects null, arrays as objects with integer keys, priorities — with the same
/// validation. Objects with `.sv` or `.value` (server values, wrapped leaves) are rare and go
/// through a ``Value``.
///
/// The common case costs no allocation per string or key: a string without escapes is copied
/// from the text to the output in one piece, keys are validated, ranked and compared where
/// they were written in the output (no `String` is made for them), and an object whose keys
/// come in key order already is left where it was written. Only an object given out of order
/// is rearranged, at the end of the output. The keys on the way down and the children of the
/// open objects are kept in memory on the stack (on the heap only past 16 children, or 1 KiB of
/// output: a temporary allocation of over 1 KiB is made on the heap on Linux, and perf showed
/// that malloc and free per write).
struct JSONValueEncoder {
    private let text: [UInt8]
    private let input: UnsafeBufferPointer<UInt8>
    private var i = 0
    private var w: Output
    private let base: Path
    /// Where the keys from `base` down to the value being encoded are in `w` (their bytes),
    /// for the depth limit and error messages: at most ``Path/maxDepth``.
    private let keyStack: UnsafeMutableBufferPointer<Range<Int>>
    private var keyCount = 0
    private(set) var hasServerValues = false
    /// The children of the objects being encoded, innermost last: `spanCount` of them.
    private var spans: UnsafeMutableBufferPointer<Span>
    private var spanCount = 0
    /// Whether `spans` was allocated here (grown past the stack's room), to be freed.
    private var spansOnHeap = false
    /// The last string scanned: bytes `stringStart..<stringEnd` of the text, or, when it held
    /// escapes, its decoded bytes in `scratch`.
    private var stringStart = 0
    private var stringEnd = 0
    private var stringEscaped = false
    private var scratch: [UInt8] = []

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
        try withUnsafeTemporaryAllocation(of: Range<Int>.self, capacity: Path.maxDepth) { keyStack in
            try withUnsafeTemporaryAllocation(of: Span.self, capacity: 1024 / MemoryLayout<Span>.stride) { spans in
                try withUnsafeTemporaryAllocation(of: UInt8.self, capacity: 1024) { output in
                    try text.withUnsafeBufferPointer { input in
                        var e = JSONValueEncoder(text: text, input: input, base: path, keyStack: keyStack, spans: spans, output: output)
                        defer {
                            if e.spansOnHeap { e.spans.deallocate() }
                            e.w.free()
                        }
                        e.skipSpace()
                        if try !e.value(depth: 0) { e.w.u8(ValueCodec.Tag.empty.rawValue) }
                        e.skipSpace()
                        guard e.i == input.count else { throw e.syntax("unexpected text after the JSON value") }
                        return (Array(e.w.written), e.hasServerValues)
                    }
                }
            }
        }
    }

    /// The output: bytes at `base`, on the stack until they outgrow it, then on the heap.
    private struct Output {
        private(set) var base: UnsafeMutablePointer<UInt8>
        private var capacity: Int
        private var onHeap = false
        private(set) var count = 0

        init(_ room: UnsafeMutableBufferPointer<UInt8>) {
            base = room.baseAddress!
            capacity = room.count
        }

        /// The bytes written so far (valid until the next write).
        var written: UnsafeMutableBufferPointer<UInt8> { UnsafeMutableBufferPointer(start: base, count: count) }

        @inline(__always)
        mutating func reserve(_ n: Int) {
            if count + n > capacity { grow(to: count + n) }
        }

        private mutating func grow(to needed: Int) {
            let bigger = UnsafeMutablePointer<UInt8>.allocate(capacity: max(2 * capacity, needed))
            bigger.initialize(from: base, count: count)
            if onHeap { base.deallocate() }
            base = bigger
            capacity = max(2 * capacity, needed)
            onHeap = true
        }

        func free() { if onHeap { base.deallocate() } }

        mutating func u8(_ v: UInt8) {
            reserve(1)
            base[count] = v
            count += 1
        }

        mutating func varint(_ value: UInt64) {
            reserve(10)
            var v = value
            while v >= 0x80 {
                base[count] = UInt8(truncatingIfNeeded: v) | 0x80
                count += 1
                v >>= 7
            }
            base[count] = UInt8(v)
            count += 1
        }

        mutating func signed(_ value: Int64) { varint(UInt64(bitPattern: (value << 1) ^ (value >> 63))) }

        mutating func double(_ d: Double) {
            reserve(8)
            UnsafeMutableRawPointer(base + count).storeBytes(of: d.bitPattern.littleEndian, as: UInt64.self)
            count += 8
        }

        mutating func append(_ bytes: UnsafeBufferPointer<UInt8>) {
            guard let from = bytes.baseAddress, bytes.count > 0 else { return }
            reserve(bytes.count)
            (base + count).initialize(from: from, count: bytes.count)
            count += bytes.count
        }

        /// Takes the bytes from `offset` on back off.
        mutating func truncate(to offset: Int) { count = offset }

        /// Puts `bytes` at `offset`, moving what follows.
        mutating func insert(_ bytes: [UInt8], at offset: Int) {
            reserve(bytes.count)
            (base + offset + bytes.count).update(from: base + offset, count: count - offset)  // (memmove)
            bytes.withUnsafeBufferPointer { (base + offset).update(from: $0.baseAddress!, count: $0.count) }
            count += bytes.count
        }

        /// Puts the varint of `n` in place of the one-byte placeholder at `offset`.
        mutating func patchVarint(_ n: Int, at offset: Int) {
            if n < 0x80 {
                base[offset] = UInt8(n)
            } else {
                var count = ByteWriter(capacity: 10)
                count.varint(UInt64(n))
                base[offset] = count.bytes[0]
                insert(Array(count.bytes.dropFirst()), at: offset + 1)
            }
        }
    }

    private init(text: [UInt8], input: UnsafeBufferPointer<UInt8>, base: Path,
                 keyStack: UnsafeMutableBufferPointer<Range<Int>>, spans: UnsafeMutableBufferPointer<Span>,
                 output: UnsafeMutableBufferPointer<UInt8>) {
        self.text = text
        self.input = input
        self.base = base
        self.keyStack = keyStack
        self.spans = spans
        w = Output(output)
    }

    /// The key whose bytes are at `range` of the output.
    private func key(at range: Range<Int>) -> String {
        String(decoding: UnsafeBufferPointer(rebasing: w.written[range]), as: UTF8.self)
    }

    private var location: Path { keyCount == 0 ? base : base.child(Path(keys: keyStack[0..<keyCount].map { key(at: $0) })) }

    /// Enters the child whose key's bytes are at `keyRange` of the output, refusing it if it
    /// would lie deeper than ``Path/maxDepth`` below the root.
    private mutating func pushKey(_ keyRange: Range<Int>) throws {
        let depth = base.count + keyCount + 1
        if depth > Path.maxDepth { throw Path.valueTooDeep(at: location.child(key(at: keyRange)).description, depth: depth) }
        keyStack[keyCount] = keyRange
        keyCount += 1
    }

    private mutating func appendSpan(_ span: Span) {
        if spanCount == spans.count {
            let bigger = UnsafeMutableBufferPointer<Span>.allocate(capacity: 2 * spans.count)
            _ = bigger.initialize(fromContentsOf: spans)
            if spansOnHeap { spans.deallocate() }
            spans = bigger
            spansOnHeap = true
        }
        spans[spanCount] = span
        spanCount += 1
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
            w.varint(UInt64(stringCount))
            appendString()
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
                if index < 10 {
                    w.u8(1)
                    w.u8(UInt8(ascii: "0") + UInt8(index))
                } else {
                    var digits = String(index)
                    digits.withUTF8 { d in
                        w.varint(UInt64(d.count))
                        w.append(d)
                    }
                }
                let keyRange = (childStart + 1)..<w.count
                try pushKey(keyRange)
                if try value(depth: depth + 1) { n += 1 } else { w.truncate(to: childStart) }
                keyCount -= 1
                index += 1
                skipSpace()
                guard i < input.count else { throw syntax("unterminated array") }
                if input[i] == UInt8(ascii: ",") { i += 1; continue }
                if input[i] == UInt8(ascii: "]") { i += 1; break }
                throw syntax("expected , or ] in an array")
            }
        }
        guard n > 0 else {
            w.truncate(to: start)
            return false
        }
        w.patchVarint(n, at: countAt)
        return true
    }

    private mutating func object(depth: Int) throws -> Bool {
        let objectStart = i
        i += 1
        let spanBase = spanCount
        defer { spanCount = spanBase }
        var priority: Value?
        skipSpace()
        if i < input.count && input[i] == UInt8(ascii: "}") {
            i += 1
            return false
        }
        // The children's tag and a one-byte count, patched at the end.
        let start = w.count
        w.u8(ValueCodec.Tag.children.rawValue)
        let countAt = w.count
        w.u8(0)
        var hasNonASCIIKey = false
        while true {
            skipSpace()
            guard i < input.count, input[i] == UInt8(ascii: "\"") else { throw syntax("expected a key") }
            try string()
            // The key goes to the output at once; it is checked there.
            let childStart = w.count
            w.varint(UInt64(stringCount))
            let keyStart = w.count
            appendString()
            let keyRange = keyStart..<w.count
            let plain = Path.isPlainKey(UnsafeBufferPointer(rebasing: w.written[keyRange]))
            if !hasNonASCIIKey && w.written[keyRange].contains(where: { $0 >= 0x80 }) { hasNonASCIIKey = true }
            var isPriority = false
            if !plain {
                let key = key(at: keyRange)
                if key == ".sv" || key == ".value" {
                    // Server values and wrapped leaves: rare, built from a Value.
                    w.truncate(to: start)
                    return try special(from: objectStart, depth: depth)
                }
                if key == ".priority" {
                    isPriority = true
                    w.truncate(to: childStart)
                } else {
                    do { try Path.validate(key: key) } catch let e as DatabaseError {
                        throw DatabaseError(.invalidData, "at \(location): \(e.message)")
                    }
                }
            }
            skipSpace()
            guard i < input.count, input[i] == UInt8(ascii: ":") else { throw syntax("expected :") }
            i += 1
            skipSpace()
            if isPriority {
                guard priority == nil else { throw syntax("the key \".priority\" appears twice in an object") }
                var parser = JSON.Parser(bytes: text)
                parser.i = i
                priority = try parser.value(depth: depth + 1)
                i = parser.i
            } else {
                let rank = KeyRank(UnsafeBufferPointer(rebasing: w.written[keyRange]))
                try pushKey(keyRange)
                let nonEmpty = try value(depth: depth + 1)
                keyCount -= 1
                appendSpan(Span(rank: rank, keyStart: keyStart, keyLength: keyRange.count, start: childStart, end: w.count, empty: !nonEmpty))
            }
            skipSpace()
            guard i < input.count else { throw syntax("unterminated object") }
            if input[i] == UInt8(ascii: ",") { i += 1; continue }
            if input[i] == UInt8(ascii: "}") { i += 1; break }
            throw syntax("expected , or } in an object")
        }
        let priorityNode = try priority.map { try Node.priorityNode($0, at: location) } ?? .empty
        let childrenStart = countAt + 1
        var children = UnsafeMutableBufferPointer(rebasing: spans[spanBase..<spanCount])
        if hasNonASCIIKey && children.count > 1 {
            // Keys Swift holds equal though their bytes differ ("é" as one code point, and "e"
            // with a combining accent; "K" and the Kelvin sign U+212A) are one key of a `Value`'s
            // dictionary, so `Value(json:)` refuses them as a key given twice: so does this.
            // (At least one of two such keys is not ASCII; either may be.)
            var seen = Set<String>()
            for c in children {
                let range = c.keyStart..<(c.keyStart + c.keyLength)
                if !seen.insert(key(at: range)).inserted {
                    throw syntax("the key \"\(key(at: range))\" appears twice in an object")
                }
            }
        }
        var kept = 0
        var inOrder = true
        let duplicate: Int? = { (out: UnsafeBufferPointer<UInt8>) -> Int? in
            func key(_ s: Span) -> UnsafeBufferPointer<UInt8> { UnsafeBufferPointer(rebasing: out[s.keyStart..<(s.keyStart + s.keyLength)]) }
            func precedes(_ a: Span, _ b: Span) -> Bool { a.rank.precedes(b.rank) { KeyOrder.utf16Order(key(a), key(b)) < 0 } }
            // Keys given in order (strictly: then none is given twice) are left as written.
            for j in children.indices {
                if children[j].empty { inOrder = false } else { kept += 1 }
                if j > 0 && inOrder && !precedes(children[j - 1], children[j]) { inOrder = false }
            }
            if inOrder { return nil }
            children.sort(by: precedes)
            // Sorted, a key given twice sits next to itself.
            for j in children.indices.dropLast() {
                let a = children[j], b = children[j + 1]
                if a.keyLength == b.keyLength && a.rank.bytes == b.rank.bytes && key(a).elementsEqual(key(b)) { return j }
            }
            return nil
        }(UnsafeBufferPointer(w.written))
        if let j = duplicate {
            let s = children[j]
            throw syntax("the key \"\(key(at: s.keyStart..<(s.keyStart + s.keyLength)))\" appears twice in an object")
        }
        guard kept > 0 else {
            w.truncate(to: start)
            return false
        }
        if !inOrder {
            // The kept children, in order, after the output, then moved over the ones as written.
            let end = w.count
            w.reserve(end - childrenStart)
            let out = w.base
            var to = end
            for c in children where !c.empty {
                (out + to).initialize(from: out + c.start, count: c.end - c.start)
                to += c.end - c.start
            }
            (out + childrenStart).update(from: out + end, count: to - end)
            w.truncate(to: childrenStart + to - end)
        }
        w.patchVarint(kept, at: countAt)
        if !priorityNode.isEmpty {
            var header = ByteWriter(capacity: 16)
            header.u8(ValueCodec.Tag.withPriority.rawValue)
            ValueCodec.encode(priorityNode, into: &header)
            w.insert(header.bytes, at: start)
        }
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
        var encoded = ByteWriter(capacity: 64)
        ValueCodec.encode(node, into: &encoded)
        encoded.bytes.withUnsafeBufferPointer { w.append($0) }
        if ServerValueResolver.containsDeferred(node) { hasServerValues = true }
        return true
    }

    /// The length of the last string scanned, in UTF-8 bytes.
    private var stringCount: Int { stringEscaped ? scratch.count : stringEnd - stringStart }

    /// Appends the last string scanned to the output (its bytes, without a length).
    private mutating func appendString() {
        if stringEscaped {
            scratch.withUnsafeBufferPointer { w.append($0) }
        } else {
            w.append(UnsafeBufferPointer(rebasing: input[stringStart..<stringEnd]))
        }
    }

    /// Scans the string at `i`: without escapes it stays where it is in the text (nothing is
    /// copied); with them, it is decoded into `scratch`. Invalid UTF-8 is an error naming its byte.
    private mutating func string() throws {
        i += 1  // opening quote
        let start = i
        // Eight bytes at a time while none is a quote, a backslash, a control character or
        // non-ASCII (exact tests on the whole word); the loop below looks at the rest.
        let ones: UInt64 = 0x0101_0101_0101_0101, high: UInt64 = 0x8080_8080_8080_8080
        while i + 8 <= input.count {
            let word = UnsafeRawPointer(input.baseAddress! + i).loadUnaligned(as: UInt64.self)
            let quote = word ^ (0x22 &* ones), backslash = word ^ (0x5C &* ones)
            let stop = word | ((word &- 0x20 &* ones) & ~word) | ((quote &- ones) & ~quote) | ((backslash &- ones) & ~backslash)
            if stop & high != 0 { break }
            i += 8
        }
        while i < input.count {
            let c = input[i]
            if c == UInt8(ascii: "\"") {
                stringStart = start
                stringEnd = i
                stringEscaped = false
                i += 1
                return
            }
            if c == UInt8(ascii: "\\") {
                scratch.removeAll(keepingCapacity: true)
                scratch.append(contentsOf: UnsafeBufferPointer(rebasing: input[start..<i]))
                stringEscaped = true
                return try escapedString()
            }
            if c < 0x20 { throw syntax("control character in a string") }
            if c >= 0x80 {
                guard let n = UTF8Validation.sequenceLength(input, at: i) else { throw UTF8Validation.error(at: i, byte: c) }
                i += n
                continue
            }
            i += 1
        }
        throw syntax("unterminated string")
    }

    /// The rest of a string with escapes, from the first backslash, decoded into `scratch`.
    private mutating func escapedString() throws {
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
