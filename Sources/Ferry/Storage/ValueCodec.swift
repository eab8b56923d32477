/// The compact binary form of a node, as stored in log records. Children are stored in key
/// order, so decoding builds sorted child maps without sorting; replay never parses JSON.
///
/// See FORMAT.md ("Database records") for the tags.
enum ValueCodec {
    enum Tag: UInt8 {
        case empty = 0, `false` = 1, `true` = 2, int = 3, double = 4, string = 5, children = 6
        case timestamp = 7, incrementInt = 8, incrementDouble = 9, withPriority = 10
    }

    static func encode(_ node: Node, into w: inout ByteWriter) {
        switch node {
        case .empty, .max:
            w.u8(Tag.empty.rawValue)
        case .plainLeaf(let v), .prioritizedLeaf(let v, _):
            let p = node.priority
            if !p.isEmpty {
                w.u8(Tag.withPriority.rawValue)
                encode(p, into: &w)
            }
            switch v {
            case .bool(let b): w.u8(b ? Tag.true.rawValue : Tag.false.rawValue)
            case .int(let i):
                w.u8(Tag.int.rawValue)
                w.signed(i)
            case .double(let d):
                w.u8(Tag.double.rawValue)
                w.double(d)
            case .string(let s):
                w.u8(Tag.string.rawValue)
                w.string(s)
            case .deferred(let sv):
                encodeServerValue(sv, into: &w)
            case .post:
                w.u8(Tag.empty.rawValue)
            }
        case .plainChildren(let c), .prioritizedChildren(let c, _):
            let p = node.priority
            if !p.isEmpty {
                w.u8(Tag.withPriority.rawValue)
                encode(p, into: &w)
            }
            w.u8(Tag.children.rawValue)
            w.varint(UInt64(c.count))
            for e in c.entries {
                w.string(e.name)
                encode(e.node, into: &w)
            }
        }
    }

    private static func encodeServerValue(_ sv: Value, into w: inout ByteWriter) {
        if case .object(let o) = sv, case .object(let inner)? = o[".sv"], let n = inner["increment"] {
            switch n {
            case .int(let i):
                w.u8(Tag.incrementInt.rawValue)
                w.signed(i)
            default:
                w.u8(Tag.incrementDouble.rawValue)
                w.double(n.number ?? 0)
            }
        } else {
            w.u8(Tag.timestamp.rawValue)
        }
    }

    /// An upper bound of the encoded size, computed without encoding (UTF-8 counts are O(1)).
    static func sizeBound(_ node: Node) -> Int {
        switch node {
        case .empty, .max: return 1
        case .plainLeaf(let v), .prioritizedLeaf(let v, _):
            let p = node.priority
            let own: Int
            switch v {
            case .string(let s): own = 11 + s.utf8.count
            default: own = 11
            }
            return own + (p.isEmpty ? 0 : 1 + sizeBound(p))
        case .plainChildren(let c), .prioritizedChildren(let c, _):
            let p = node.priority
            var total = 11 + (p.isEmpty ? 0 : 1 + sizeBound(p))
            for e in c.entries { total += 10 + e.name.utf8.count + sizeBound(e.node) }
            return total
        }
    }

    static func encode(_ node: Node) -> [UInt8] {
        var w = ByteWriter()
        encode(node, into: &w)
        return w.bytes
    }

    static func decode(_ bytes: UnsafeRawBufferPointer) throws -> Node {
        var r = ByteReader(bytes)
        let node = try decode(&r, depth: 0)
        guard r.atEnd else { throw ByteReader.damaged("trailing bytes after a value") }
        return node
    }

    /// Decodes the value at `r`, whose keys lie `depth` levels below the value's top. A value
    /// nests at most ``Path/maxDepth`` levels (the data model's limit for a value written at
    /// the root; one written lower nests less); a priority is a number or string leaf and a
    /// wrapped value is neither empty nor wrapped again, so nothing else can nest.
    static func decode(_ r: inout ByteReader, depth: Int) throws -> Node {
        switch try tag(&r, depth: depth) {
        case .empty: return .empty
        case .false: return .leaf(.bool(false), priority: .empty)
        case .true: return .leaf(.bool(true), priority: .empty)
        case .int: return .leaf(.int(try r.signed()), priority: .empty)
        case .double: return .leaf(.double(try finite(r.double())), priority: .empty)
        case .string: return .leaf(.string(try r.string()), priority: .empty)
        case .timestamp: return .leaf(.deferred(ServerValue.timestamp), priority: .empty)
        case .incrementInt: return .leaf(.deferred(ServerValue.increment(try r.signed())), priority: .empty)
        case .incrementDouble: return .leaf(.deferred(ServerValue.increment(try finite(r.double()))), priority: .empty)
        case .withPriority:
            let p = try priority(&r, depth: depth)
            return try decode(&r, depth: depth).updatingPriority(p)
        case .children:
            let n = try r.varintCount()
            guard n <= r.bytes.count - r.offset else { throw ByteReader.damaged("more children than bytes") }
            var entries: [NamedNode] = []
            entries.reserveCapacity(n)
            var previous = UnsafeBufferPointer<UInt8>(start: nil, count: 0)
            for i in 0..<n {
                let key = try childKey(&r, index: i, after: &previous)
                let child = try decode(&r, depth: depth + 1)
                guard !child.isEmpty else { throw ByteReader.damaged("an empty child") }
                entries.append(NamedNode(name: String(decoding: key, as: UTF8.self), node: child))
            }
            return entries.isEmpty ? .empty : .children(ChildMap(sorted: entries), priority: .empty)
        }
    }
}

extension ValueCodec {
    /// The tag of the value at `r`, `depth` levels below the value's top (see
    /// ``decode(_:depth:)`` for the limit).
    @inline(__always)
    private static func tag(_ r: inout ByteReader, depth: Int) throws -> Tag {
        guard depth <= Path.maxDepth else {
            throw ByteReader.damaged("a value nested deeper than the data model's \(Path.maxDepth) levels")
        }
        guard let tag = Tag(rawValue: try r.u8()) else { throw ByteReader.damaged("unknown value tag") }
        return tag
    }

    /// The key of an object's child `index` at `r`, checked: after `previous` (the key before,
    /// which becomes this one) in key order, compared as the stored bytes (making strings of
    /// them to compare took ~5% of a walk that decodes every child), and UTF-8 — a key that is
    /// not would be repaired into a name that may equal another's (bytes that differ, the same
    /// U+FFFD), which the order check does not see. (Valid UTF-8 keeps its bytes; ASCII needs
    /// no look.)
    @inline(__always)
    private static func childKey(_ r: inout ByteReader, index: Int,
                                 after previous: inout UnsafeBufferPointer<UInt8>) throws -> UnsafeBufferPointer<UInt8> {
        let key = try r.stringBytes()
        if index > 0, KeyOrder.compare(utf8: previous, key) >= 0 { throw ByteReader.damaged("children out of order") }
        previous = key
        if key.contains(where: { $0 >= 0x80 }), !String(decoding: key, as: UTF8.self).utf8.elementsEqual(key) {
            throw ByteReader.damaged("a key that is not UTF-8")
        }
        return key
    }

    /// The priority after a `withPriority` tag, checked: a number or a string, followed by a
    /// value (where `r` is left).
    static func priority(_ r: inout ByteReader, depth: Int) throws -> Node {
        try priority(&r) { try decode(&$0, depth: depth) }
    }

    /// A priority read by `read`, with ``priority(_:depth:)``'s checks around it.
    private static func priority<T>(_ r: inout ByteReader, _ read: (inout ByteReader) throws -> T) throws -> T {
        guard r.offset < r.bytes.count, [Tag.int, .double, .string].contains(Tag(rawValue: r.bytes[r.offset])) else {
            throw ByteReader.damaged("a priority that is not a number or a string")
        }
        let p = try read(&r)
        guard r.offset < r.bytes.count, let inner = Tag(rawValue: r.bytes[r.offset]), inner != .withPriority, inner != .empty else {
            throw ByteReader.damaged("a priority without a value")
        }
        return p
    }

    /// Checks the encoded value as ``decode(_:)`` does, building nothing: it throws for exactly
    /// the bytes `decode` refuses (the value fuzzer holds the two to that). Returns whether the
    /// value is empty (null). A walk over a big location checks each child so, keeping its
    /// bytes to decode when read.
    static func validate(_ bytes: UnsafeRawBufferPointer) throws -> Bool {
        var r = ByteReader(bytes)
        let empty = try validate(&r, depth: 0)
        guard r.atEnd else { throw ByteReader.damaged("trailing bytes after a value") }
        return empty
    }

    /// The value ``Node/value(export:)`` gives for the decoded node (priorities dropped, an
    /// array where the keys make one), built straight from the bytes: a walked child's
    /// ``DataSnapshot/value`` (building the node first, then the value, took ~25% longer).
    /// Only for bytes ``validate(_:)`` has accepted: it checks what it reads, not the order of
    /// keys, their UTF-8 or an empty child (so damage it does not see gives some value).
    static func value(_ bytes: UnsafeRawBufferPointer) throws -> Value {
        var r = ByteReader(bytes)
        let v = try value(&r, depth: 0)
        guard r.atEnd else { throw ByteReader.damaged("trailing bytes after a value") }
        return v
    }

    private static func value(_ r: inout ByteReader, depth: Int) throws -> Value {
        switch try tag(&r, depth: depth) {
        case .empty: return .null
        case .false: return .bool(false)
        case .true: return .bool(true)
        case .int: return .int(try r.signed())
        case .double: return .double(try finite(r.double()))
        case .string: return .string(try r.string())
        case .timestamp: return ServerValue.timestamp
        case .incrementInt: return ServerValue.increment(try r.signed())
        case .incrementDouble: return ServerValue.increment(try finite(r.double()))
        case .withPriority:
            try skip(&r, depth: depth + 1)
            return try value(&r, depth: depth)
        case .children:
            let n = try r.varintCount()
            guard n <= r.bytes.count - r.offset else { throw ByteReader.damaged("more children than bytes") }
            // As array items while every key so far is an index, else an object.
            var items: [(index: Int, name: String, value: Value)] = []
            var object: [String: Value]?
            var maxIndex = 0
            for _ in 0..<n {
                let name = try r.string()
                let v = try value(&r, depth: depth + 1)
                if object == nil, let i = arrayIndex(name) {
                    if items.isEmpty { items.reserveCapacity(n) }
                    items.append((i, name, v))
                    maxIndex = max(maxIndex, i)
                    continue
                }
                if object == nil {
                    object = [String: Value](minimumCapacity: n)
                    for item in items { object![item.name] = item.value }
                    items = []
                }
                object![name] = v
            }
            if let object { return .object(object) }
            guard n > 0 else { return .null }
            if let count = arrayLength(maxIndex: maxIndex, count: n) {
                var array = [Value](repeating: .null, count: count)
                for item in items { array[item.index] = item.value }
                return .array(array)
            }
            return .object(Dictionary(items.map { ($0.name, $0.value) }, uniquingKeysWith: { $1 }))
        }
    }

    /// ``decode(_:depth:)``'s checks, in its order; whether the value is empty.
    private static func validate(_ r: inout ByteReader, depth: Int) throws -> Bool {
        switch try tag(&r, depth: depth) {
        case .empty: return true
        case .false, .true, .timestamp: return false
        case .int, .incrementInt: _ = try r.signed()
        case .double, .incrementDouble: _ = try finite(r.double())
        case .string: _ = try r.stringBytes()  // (decoding repairs a string value; never refused)
        case .withPriority:
            _ = try priority(&r) { try validate(&$0, depth: depth) }
            return try validate(&r, depth: depth)
        case .children:
            let n = try r.varintCount()
            guard n <= r.bytes.count - r.offset else { throw ByteReader.damaged("more children than bytes") }
            var previous = UnsafeBufferPointer<UInt8>(start: nil, count: 0)
            for i in 0..<n {
                _ = try childKey(&r, index: i, after: &previous)
                guard try !validate(&r, depth: depth + 1) else { throw ByteReader.damaged("an empty child") }
            }
            return n == 0
        }
        return false
    }

    /// A stored number: only finite ones are ever written (NaN and infinities are refused on
    /// the way in), so any other is damage — and would not equal itself in a node.
    private static func finite(_ d: Double) throws -> Double {
        guard d.isFinite else { throw ByteReader.damaged("a number that is not finite (\(d))") }
        return d
    }
}

/// A value already in its stored form: what a write puts in its record, encoded straight from
/// the user's ``Value`` (validated on the way) without building a ``Node`` tree first. The node
/// is decoded from these bytes only where a listener or a server value needs it.
struct EncodedValue: Sendable {
    /// The value in ``ValueCodec``'s form (the empty tag alone for null).
    var bytes: [UInt8]
    /// The value holds server values (timestamps, increments) to resolve before it is shown.
    var hasServerValues: Bool

    var isEmpty: Bool { bytes.count == 1 && bytes[0] == ValueCodec.Tag.empty.rawValue }

    /// Validates and encodes `value`, to be written at `path`; the bytes are those
    /// `ValueCodec.encode(Node(value, path: path))` gives.
    /// - Throws: ``DatabaseError`` with code ``DatabaseError/Code/invalidData`` naming where, as
    ///   ``Node/init(_:path:)`` does.
    init(_ value: Value, path: Path) throws {
        var encoder = ValueEncoder(base: path)
        if try !encoder.encode(value, depth: 0) { encoder.w.u8(ValueCodec.Tag.empty.rawValue) }
        bytes = encoder.w.bytes
        hasServerValues = encoder.hasServerValues
    }

    /// Validates and encodes JSON text, to be written at `path`, without building a ``Value``.
    init(jsonBytes: [UInt8], path: Path) throws {
        (bytes, hasServerValues) = try JSONValueEncoder.encode(jsonBytes, path: path)
    }

    init(node: Node) {
        bytes = ValueCodec.encode(node)
        hasServerValues = ServerValueResolver.containsDeferred(node)
    }

    /// The value as a node (decoding the bytes).
    func node() throws -> Node { try bytes.withUnsafeBytes { try ValueCodec.decode($0) } }
}

/// A key's place in key order, as plain integers: integer keys by value then length, other
/// keys by their first 8 bytes. Where those do not decide, the keys themselves are compared.
struct KeyRank {
    /// 0 for an integer key, 1 for any other.
    var kind: UInt8
    var integer: Int64
    /// An integer key's length, or another key's first 8 bytes, big-endian (zeros pad a short
    /// key: no key holds a zero byte, so a key sorts before the longer keys it begins).
    var bytes: UInt64

    init(_ key: UnsafeBufferPointer<UInt8>) {
        if let n = KeyOrder.integerValue(utf8: key) {
            kind = 0
            integer = n
            bytes = UInt64(key.count)
            return
        }
        kind = 1
        integer = 0
        var b: UInt64 = 0
        let taken = min(8, key.count)
        for j in 0..<taken { b = b << 8 | UInt64(key[j]) }
        bytes = taken == 8 ? b : b << (8 * UInt64(8 - taken))
    }

    /// Whether this key sorts before `other`'s; `compareKeys` decides when the ranks cannot.
    @inline(__always)
    func precedes(_ other: KeyRank, compareKeys: () -> Bool) -> Bool {
        if kind != other.kind { return kind < other.kind }
        if kind == 0 {
            if integer != other.integer { return integer < other.integer }
            return bytes != other.bytes ? bytes < other.bytes : compareKeys()
        }
        if bytes == other.bytes { return compareKeys() }
        // The first differing byte decides, unless UTF-16 orders it differently (EE–F4).
        let shift = UInt64(56 - 8 * ((bytes ^ other.bytes).leadingZeroBitCount / 8))
        if (bytes >> shift) & 0xff >= 0xEE || (other.bytes >> shift) & 0xff >= 0xEE { return compareKeys() }
        return bytes < other.bytes
    }
}

/// A child of an object being encoded: its key's rank and where it is in the object.
struct ChildRank {
    var rank: KeyRank
    var index: Dictionary<String, Value>.Index

    init(_ key: UnsafeBufferPointer<UInt8>, _ index: Dictionary<String, Value>.Index) {
        rank = KeyRank(key)
        self.index = index
    }
}

/// Encodes values straight into ``ValueCodec``'s form, with ``Node``'s validation and
/// normalization: children in key order, null children dropped, empty objects null, arrays as
/// objects with integer keys, priorities.
struct ValueEncoder {
    var w = ByteWriter(capacity: 256)
    let base: Path
    /// Keys from `base` down to the value being encoded, for error messages.
    var keys: [String] = []
    var hasServerValues = false
    /// The ranks of the children of the objects being encoded, innermost last.
    var ranks: [ChildRank] = []

    init(base: Path) { self.base = base }

    var location: Path { keys.isEmpty ? base : base.child(Path(keys: keys)) }

    /// Appends `value`; returns false, having appended nothing, when it is empty (null).
    mutating func encode(_ value: Value, depth: Int) throws -> Bool {
        guard depth <= 512 else { throw DatabaseError(.invalidData, "the value at \(location) is nested too deeply") }
        switch value {
        case .null:
            return false
        case .bool(let b):
            w.u8(b ? ValueCodec.Tag.true.rawValue : ValueCodec.Tag.false.rawValue)
        case .int(let i):
            w.u8(ValueCodec.Tag.int.rawValue)
            w.signed(i)
        case .double(let d):
            guard d.isFinite else { throw DatabaseError(.invalidData, "the number at \(location) is \(d); only finite numbers can be stored") }
            w.u8(ValueCodec.Tag.double.rawValue)
            w.double(d)
        case .string(let s):
            w.u8(ValueCodec.Tag.string.rawValue)
            w.string(s)
        case .array(let items):
            let start = w.count
            w.u8(ValueCodec.Tag.children.rawValue)
            let countAt = w.count
            w.u8(0)
            var n = 0
            for (i, item) in items.enumerated() {
                // Array indices are in key order already (integer keys sort numerically).
                if try child(String(i), item, depth: depth) { n += 1 }
            }
            return finishChildren(n, start: start, countAt: countAt)
        case .object(let object):
            // One pass over the keys' bytes: find the special keys, validate the others and
            // rank them for sorting (plain integers: no strings are copied while sorting).
            let base = ranks.count
            defer { ranks.removeSubrange(base...) }
            var priority: Value?
            var special = false
            var i = object.startIndex
            while i != object.endIndex {
                var key = object[i].key
                let rank = key.withUTF8 { b in Path.isPlainKey(b) ? ChildRank(b, i) : nil }
                if let rank {
                    ranks.append(rank)
                } else if key == ".priority" {
                    priority = object[i].value
                } else if key == ".sv" || key == ".value" {
                    special = true
                } else {
                    do { try Path.validate(key: key) } catch let e as DatabaseError {
                        throw DatabaseError(.invalidData, "at \(location): \(e.message)")
                    }
                    ranks.append(key.withUTF8 { ChildRank($0, i) })
                }
                object.formIndex(after: &i)
            }
            if special {
                // Server values and wrapped leaves: rare, built as a node.
                let node = try Node.build(value, at: location, depth: depth)
                guard !node.isEmpty else { return false }
                ValueCodec.encode(node, into: &w)
                if ServerValueResolver.containsDeferred(node) { hasServerValues = true }
                return true
            }
            let start = w.count
            if let priority {
                let p = try Node.priorityNode(priority, at: location)
                if !p.isEmpty {
                    w.u8(ValueCodec.Tag.withPriority.rawValue)
                    ValueCodec.encode(p, into: &w)
                }
            }
            w.u8(ValueCodec.Tag.children.rawValue)
            let countAt = w.count
            w.u8(0)
            let end = ranks.count
            ranks[base..<end].sort { a, b in a.rank.precedes(b.rank) { KeyOrder.utf16Order(object[a.index].key, object[b.index].key) < 0 } }
            var n = 0
            for j in base..<end {
                let (key, child) = object[ranks[j].index]
                if try self.child(key, child, depth: depth) { n += 1 }
            }
            return finishChildren(n, start: start, countAt: countAt)
        }
        return true
    }

    /// Appends a child's key and value; takes the key back off when the value is empty.
    private mutating func child(_ key: String, _ value: Value, depth: Int) throws -> Bool {
        let start = w.count
        if base.count + keys.count + 1 > Path.maxDepth {
            throw Path.valueTooDeep(at: location.child(key).description, depth: base.count + keys.count + 1)
        }
        w.string(key)
        keys.append(key)
        defer { keys.removeLast() }
        if try encode(value, depth: depth + 1) { return true }
        w.bytes.removeLast(w.count - start)
        return false
    }

    /// Writes the number of children where its placeholder byte is, or, with none, takes the
    /// whole object back off (an empty object is null, its priority dropped).
    private mutating func finishChildren(_ n: Int, start: Int, countAt: Int) -> Bool {
        guard n > 0 else {
            w.bytes.removeLast(w.count - start)
            return false
        }
        w.patchVarint(n, at: countAt)
        return true
    }
}
