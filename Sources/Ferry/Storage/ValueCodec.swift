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
        case .leaf(let v, let p):
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
        case .children(let c, let p):
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
        case .leaf(let v, let p):
            let own: Int
            switch v {
            case .string(let s): own = 11 + s.utf8.count
            default: own = 11
            }
            return own + (p.isEmpty ? 0 : 1 + sizeBound(p))
        case .children(let c, let p):
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

    static func decode(_ r: inout ByteReader, depth: Int) throws -> Node {
        guard depth < 600 else { throw ByteReader.damaged("a value nested too deeply") }
        guard let tag = Tag(rawValue: try r.u8()) else { throw ByteReader.damaged("unknown value tag") }
        switch tag {
        case .empty: return .empty
        case .false: return .leaf(.bool(false), priority: .empty)
        case .true: return .leaf(.bool(true), priority: .empty)
        case .int: return .leaf(.int(try r.signed()), priority: .empty)
        case .double: return .leaf(.double(try r.double()), priority: .empty)
        case .string: return .leaf(.string(try r.string()), priority: .empty)
        case .timestamp: return .leaf(.deferred(ServerValue.timestamp), priority: .empty)
        case .incrementInt: return .leaf(.deferred(ServerValue.increment(try r.signed())), priority: .empty)
        case .incrementDouble: return .leaf(.deferred(ServerValue.increment(try r.double())), priority: .empty)
        case .withPriority:
            let p = try decode(&r, depth: depth + 1)
            return try decode(&r, depth: depth + 1).updatingPriority(p)
        case .children:
            let n = Int(try r.varint())
            guard n <= r.bytes.count - r.offset else { throw ByteReader.damaged("more children than bytes") }
            var entries: [NamedNode] = []
            entries.reserveCapacity(n)
            for _ in 0..<n {
                let key = try r.string()
                if let last = entries.last, KeyOrder.compare(last.name, key) >= 0 { throw ByteReader.damaged("children out of order") }
                let child = try decode(&r, depth: depth + 1)
                guard !child.isEmpty else { throw ByteReader.damaged("an empty child") }
                entries.append(NamedNode(name: key, node: child))
            }
            return entries.isEmpty ? .empty : .children(ChildMap(sorted: entries), priority: .empty)
        }
    }
}
