import FerryLog
#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
/// The kinds of records the database writes to the log (the log's kind byte).
enum RecordKind: UInt8, CaseIterable {
    /// A local set (overwrite) at a path; its LSN is its write id.
    case localSet = 1
    /// A local multi-path update (merge) at a path.
    case localUpdate = 2
    /// The server says: this is the whole value at a path.
    case serverPut = 3
    /// The server says: these children of a path now have these values.
    case serverMerge = 4
    /// The server acknowledged (or rejected) a local write.
    case ack = 5
    /// Server-cache entries carried forward by compaction from segments it deletes: each puts
    /// back the entry at one path exactly (a value, or an empty marker), leaving the entries
    /// below it alone. A restatement, never a change: the data read is the same before and after.
    case serverRestate = 6
    /// The sync cursor moved: the server acknowledged, in write order, every pending write up
    /// to an id. One record per batch of acknowledgements.
    case ackCursor = 7
    /// The server rejected a local write: it is reverted and kept, with the server's answer
    /// and a copy of its record, in the list of rejected writes until the app clears it.
    case rejection = 8
    /// The app cleared rejected writes from the list.
    case clearRejected = 9
    /// The cache size limit evicted server data: every server-cache entry whose value lies in a
    /// record below an LSN (the first record kept) is dropped, the data becoming "not cached".
    /// What was kept was restated (kind 6) before it.
    case serverEvict = 10
    /// A `keepSynced` pin set or cleared at a path (pinned data is never evicted).
    case pin = 11
}

/// Where a value sits inside a record's payload.
struct ValueRef: Sendable, Hashable {
    var lsn: UInt64
    var offset: UInt32
    var length: UInt32
}

/// A decoded record: paths and the positions of its values, not the values themselves (replay
/// indexes records without decoding values).
struct RecordSummary {
    var kind: RecordKind
    var path: Path
    /// Relative paths and value positions: one, at the root, for sets and puts.
    var values: [(path: Path, range: Range<Int>)]
    var hidden = false
    var time: Int64 = 0
    var ackedWrite: Int64 = 0
    var revert = false
    /// For an ack: the write's value was copied into the server cache.
    var appliedToServerCache = false
    /// For a cursor: the acknowledged writes whose values were *not* copied into the server
    /// cache (a listen kept the data current there, or the write was hidden). For a clearing:
    /// the ids cleared.
    var ids: [Int64] = []
    /// For an eviction: the first LSN whose records' server data was kept.
    var cutoff: UInt64 = 0
    /// For a pin: set (true) or cleared.
    var pinned = false
    /// For a rejection: the server's status, message and when (ms since 1970), and where the
    /// rejected write's own record (kind and payload) sits in this one.
    var status = 0
    var message = ""
    var embeddedKind: RecordKind?
    var embedded: Range<Int> = 0..<0
}

enum RecordCodec {
    /// A local set. The value is stored as given (server values unresolved, to be sent as
    /// such); when it holds server values, the locally resolved form follows, and that is the
    /// one the local view uses — so replay does not depend on the clock or on data at replay time.
    static func localSet(path: Path, value: Node, resolved: Node?, time: Int64, hidden: Bool) -> (bytes: [UInt8], range: Range<Int>) {
        var w = ByteWriter()
        w.u8((hidden ? 1 : 0) | (resolved != nil ? 2 : 0))
        w.signed(time)
        w.path(path)
        let range = encodeWithResolved(value, resolved, into: &w)
        return (w.bytes, range)
    }

    /// A set whose value is already encoded and holds no server values.
    /// The same bytes as the form above (flags 0), sized first and written in place.
    static func localSet(path: Path, encoded value: [UInt8], time: Int64) -> (bytes: [UInt8], range: Range<Int>) {
        func varintLength(_ v: UInt64) -> Int { max(1, (64 - v.leadingZeroBitCount + 6) / 7) }
        func put(_ v: UInt64, _ p: inout UnsafeMutablePointer<UInt8>) {
            var v = v
            while v >= 0x80 {
                p.pointee = UInt8(truncatingIfNeeded: v) | 0x80
                p += 1
                v >>= 7
            }
            p.pointee = UInt8(v)
            p += 1
        }
        let zigzag = UInt64(bitPattern: (time << 1) ^ (time >> 63))
        var header = 1 + varintLength(zigzag) + varintLength(UInt64(path.count))
        for k in path.keys { header += varintLength(UInt64(k.utf8.count)) + k.utf8.count }
        let bytes = [UInt8](unsafeUninitializedCapacity: header + value.count) { buffer, count in
            var p = buffer.baseAddress!
            p.pointee = 0
            p += 1
            put(zigzag, &p)
            put(UInt64(path.count), &p)
            for var k in path.keys {
                k.withUTF8 { utf8 in
                    put(UInt64(utf8.count), &p)
                    if let from = utf8.baseAddress { p.initialize(from: from, count: utf8.count) }
                    p += utf8.count
                }
            }
            value.withUnsafeBufferPointer { if let from = $0.baseAddress { p.initialize(from: from, count: $0.count) } }
            count = header + value.count
        }
        return (bytes, header..<bytes.count)
    }

    static func localUpdate(path: Path, children: [(Path, Node, Node?)], time: Int64) -> (bytes: [UInt8], ranges: [(Path, Range<Int>)]) {
        var w = ByteWriter()
        w.u8(0)
        w.signed(time)
        w.path(path)
        w.varint(UInt64(children.count))
        var ranges: [(Path, Range<Int>)] = []
        for (p, value, resolved) in children {
            w.path(p)
            w.u8(resolved != nil ? 2 : 0)
            ranges.append((p, encodeWithResolved(value, resolved, into: &w)))
        }
        return (w.bytes, ranges)
    }

    /// An update whose values are already encoded and hold no server values: the same bytes as
    /// the form above (each child's flags 0).
    static func localUpdate(path: Path, encoded children: [(Path, EncodedValue)], time: Int64) -> (bytes: [UInt8], ranges: [Range<Int>]) {
        var w = ByteWriter()
        w.bytes.reserveCapacity(children.reduce(16) { $0 + $1.1.bytes.count + 24 })
        w.u8(0)
        w.signed(time)
        w.path(path)
        w.varint(UInt64(children.count))
        var ranges: [Range<Int>] = []
        ranges.reserveCapacity(children.count)
        for (p, value) in children {
            w.path(p)
            w.u8(0)
            let start = w.count
            w.bytes.append(contentsOf: value.bytes)
            ranges.append(start..<w.count)
        }
        return (w.bytes, ranges)
    }

    static func serverPut(path: Path, value: Node) -> (bytes: [UInt8], range: Range<Int>) {
        var w = ByteWriter()
        w.path(path)
        let start = w.count
        ValueCodec.encode(value, into: &w)
        return (w.bytes, start..<w.count)
    }

    static func serverMerge(path: Path, children: [(Path, Node)]) -> (bytes: [UInt8], ranges: [(Path, Range<Int>)]) {
        var w = ByteWriter()
        w.path(path)
        w.varint(UInt64(children.count))
        var ranges: [(Path, Range<Int>)] = []
        for (p, value) in children {
            w.path(p)
            let start = w.count
            ValueCodec.encode(value, into: &w)
            ranges.append((p, start..<w.count))
        }
        return (w.bytes, ranges)
    }

    /// Appends one entry of a ``RecordKind/serverRestate`` record: the path, then 0 and the
    /// encoded value, or 1 for a marker (an empty entry with no value).
    static func appendRestated(path: Path, value: UnsafeRawBufferPointer?, to w: inout ByteWriter) {
        w.path(path)
        w.u8(value == nil ? 1 : 0)
        if let value { w.bytes.append(contentsOf: value) }
    }

    /// An acknowledgement (or, with `revert`, a rejection) of a local write. `applied`: the
    /// write's value was copied into the server cache (decided when it happened, so that replay
    /// does the same).
    static func ack(writeID: Int64, revert: Bool, applied: Bool) -> [UInt8] {
        var w = ByteWriter(capacity: 12)
        w.signed(writeID)
        w.u8((revert ? 1 : 0) | (applied ? 2 : 0))
        return w.bytes
    }

    /// The sync cursor moved to `through`; `notApplied` (ascending) are the acknowledged writes
    /// whose values were not copied into the server cache.
    static func ackCursor(through: Int64, notApplied: [Int64]) -> [UInt8] {
        var w = ByteWriter(capacity: 12 + notApplied.count * 3)
        w.signed(through)
        appendIDs(notApplied, to: &w)
        return w.bytes
    }

    /// A rejection of write `writeID`, whose own record is `kind` + `payload`.
    static func rejection(writeID: Int64, status: Int, message: String, time: Int64, kind: UInt8, payload: UnsafeRawBufferPointer) -> [UInt8] {
        var w = ByteWriter(capacity: payload.count + message.utf8.count + 32)
        w.signed(writeID)
        w.varint(UInt64(max(0, status)))
        w.string(message)
        w.signed(time)
        w.u8(kind)
        w.bytes.append(contentsOf: payload)
        return w.bytes
    }

    static func clearRejected(_ ids: [Int64]) -> [UInt8] {
        var w = ByteWriter()
        appendIDs(ids, to: &w)
        return w.bytes
    }

    /// Ascending ids as a count and the differences from the previous one (the first from 0).
    private static func appendIDs(_ ids: [Int64], to w: inout ByteWriter) {
        w.varint(UInt64(ids.count))
        var previous: Int64 = 0
        for id in ids {
            w.signed(id &- previous)
            previous = id
        }
    }

    private static func readIDs(_ r: inout ByteReader) throws -> [Int64] {
        let n = try r.varintCount()
        guard n <= r.bytes.count - r.offset else { throw ByteReader.damaged("more ids than bytes") }
        var ids: [Int64] = []
        ids.reserveCapacity(n)
        var previous: Int64 = 0
        for _ in 0..<n {
            let id = previous &+ (try r.signed())
            guard id > previous else { throw ByteReader.damaged("ids out of order") }
            ids.append(id)
            previous = id
        }
        return ids
    }

    /// Writes a local write's value and, when it holds server values, the locally resolved form
    /// after it (flag bit 1); returns the range of the one the local view uses.
    private static func encodeWithResolved(_ value: Node, _ resolved: Node?, into w: inout ByteWriter) -> Range<Int> {
        var start = w.count
        ValueCodec.encode(value, into: &w)
        if let resolved {
            start = w.count
            ValueCodec.encode(resolved, into: &w)
        }
        return start..<w.count
    }

    /// The ``ValueNote`` of a record read ahead by the log (``LogReadSnapshot/Inspector``): the
    /// value of a local set or a server put checked, on the log's thread, as a walk would
    /// check it on reading it; 0 for other records, or one that does not check (the walk
    /// then checks it itself, and reports the damage).
    static let inspector: LogReadSnapshot.Inspector = { kind, payload in
        var r = ByteReader(payload)
        do {
            var flags: UInt8 = 0
            switch RecordKind(rawValue: kind) {
            case .localSet:
                flags = try r.u8()
                _ = try r.signed()
            case .serverPut:
                break
            default:
                return 0
            }
            let keys = try r.varintCount()
            for _ in 0..<keys { _ = try r.stringBytes() }
            if flags & 2 != 0 { try ValueCodec.skip(&r) }
            let value = UnsafeRawBufferPointer(rebasing: payload[r.offset...])
            return ValueNote.make(offset: r.offset, length: value.count, empty: try ValueCodec.validate(value))
        } catch {
            return 0
        }
    }

    /// Skips what ``encodeWithResolved(_:_:into:)`` wrote; returns the range the view uses.
    private static func skipWithResolved(_ r: inout ByteReader, flags: UInt8) throws -> Range<Int> {
        var start = r.offset
        try ValueCodec.skip(&r)
        if flags & 2 != 0 {
            start = r.offset
            try ValueCodec.skip(&r)
        }
        return start..<r.offset
    }

    /// Reads a record's structure. For values stored twice (unresolved, then resolved) the
    /// range is the resolved one.
    static func summarize(kind raw: UInt8, _ payload: UnsafeRawBufferPointer) throws -> RecordSummary {
        guard let kind = RecordKind(rawValue: raw) else {
            if raw == 0 {
                throw DatabaseError(.storage, "the log holds a record of kind 0, which Ferry's database never writes: "
                    + "this store was not written by a Ferry database (a log written with FerryLog directly?)")
            }
            throw DatabaseError(.storage, "the log holds a record of unknown kind \(raw): it was written by a newer Ferry "
                + "(this build knows kinds 1–\(RecordKind.allCases.count)), or the store is not a Ferry database")
        }
        var r = ByteReader(payload)
        switch kind {
        case .localSet:
            let flags = try r.u8()
            let time = try r.signed()
            let path = try r.path()
            let range = try skipWithResolved(&r, flags: flags)
            return RecordSummary(kind: kind, path: path, values: [(.root, range)], hidden: flags & 1 != 0, time: time)
        case .localUpdate:
            _ = try r.u8()
            let time = try r.signed()
            let path = try r.path()
            let n = try r.varintCount()
            var values: [(path: Path, range: Range<Int>)] = []
            for _ in 0..<n {
                let p = try r.path()
                let flags = try r.u8()
                values.append((p, try skipWithResolved(&r, flags: flags)))
            }
            return RecordSummary(kind: kind, path: path, values: values, time: time)
        case .serverPut:
            let path = try r.path()
            let start = r.offset
            try ValueCodec.skip(&r)
            return RecordSummary(kind: kind, path: path, values: [(.root, start..<r.offset)])
        case .serverMerge:
            let path = try r.path()
            let n = try r.varintCount()
            var values: [(path: Path, range: Range<Int>)] = []
            for _ in 0..<n {
                let p = try r.path()
                let start = r.offset
                try ValueCodec.skip(&r)
                values.append((p, start..<r.offset))
            }
            return RecordSummary(kind: kind, path: path, values: values)
        case .ack:
            let id = try r.signed()
            let flags = try r.u8()
            return RecordSummary(kind: kind, path: .root, values: [], ackedWrite: id, revert: flags & 1 != 0,
                                 appliedToServerCache: flags & 2 != 0)
        case .ackCursor:
            let through = try r.signed()
            let ids = try readIDs(&r)
            guard r.atEnd, ids.last.map({ $0 <= through }) ?? true else { throw ByteReader.damaged("a cursor record that does not add up") }
            return RecordSummary(kind: kind, path: .root, values: [], ackedWrite: through, ids: ids)
        case .rejection:
            let id = try r.signed()
            let status = try r.varintCount()
            let message = try r.string()
            let time = try r.signed()
            guard let inner = RecordKind(rawValue: try r.u8()), inner == .localSet || inner == .localUpdate else {
                throw ByteReader.damaged("a rejection of something that is not a local write")
            }
            let start = r.offset
            let innerSummary = try summarize(kind: inner.rawValue, UnsafeRawBufferPointer(rebasing: payload[start...]))
            return RecordSummary(kind: kind, path: innerSummary.path, values: innerSummary.values.map { ($0.path, ($0.range.lowerBound + start)..<($0.range.upperBound + start)) },
                                 time: time, ackedWrite: id, revert: true, status: status, message: message,
                                 embeddedKind: inner, embedded: start..<payload.count)
        case .clearRejected:
            let ids = try readIDs(&r)
            guard r.atEnd else { throw ByteReader.damaged("trailing bytes after the cleared ids") }
            return RecordSummary(kind: kind, path: .root, values: [], ids: ids)
        case .serverRestate:
            // Absolute paths; an empty range is a marker.
            var values: [(path: Path, range: Range<Int>)] = []
            while !r.atEnd {
                let p = try r.path()
                let marker = try r.u8()
                guard marker <= 1 else { throw ByteReader.damaged("a restated entry has flag \(marker)") }
                let start = r.offset
                if marker == 0 { try ValueCodec.skip(&r) }
                values.append((p, start..<r.offset))
            }
            return RecordSummary(kind: kind, path: .root, values: values)
        case .serverEvict:
            let cutoff = try r.varint()
            guard r.atEnd else { throw ByteReader.damaged("trailing bytes after an eviction's cutoff") }
            return RecordSummary(kind: kind, path: .root, values: [], cutoff: cutoff)
        case .pin:
            let flag = try r.u8()
            let path = try r.path()
            guard flag <= 1, r.atEnd else { throw ByteReader.damaged("a pin record that does not add up") }
            return RecordSummary(kind: kind, path: path, values: [], pinned: flag == 1)
        }
    }

    /// An eviction of every server-cache entry whose value lies below `cutoff`.
    static func serverEvict(cutoff: UInt64) -> [UInt8] {
        var w = ByteWriter(capacity: 10)
        w.varint(cutoff)
        return w.bytes
    }

    /// A `keepSynced` pin set (`pinned`) or cleared at `path`.
    static func pin(_ path: Path, pinned: Bool) -> [UInt8] {
        var w = ByteWriter()
        w.u8(pinned ? 1 : 0)
        w.path(path)
        return w.bytes
    }

    /// The unresolved values of a local write (what the server must receive).
    static func unresolvedValues(kind: RecordKind, _ payload: UnsafeRawBufferPointer) throws -> [(Path, Node)] {
        var r = ByteReader(payload)
        switch kind {
        case .localSet:
            let flags = try r.u8()
            _ = try r.signed()
            _ = try r.path()
            _ = flags
            return [(.root, try ValueCodec.decode(&r, depth: 0))]
        case .localUpdate:
            _ = try r.u8()
            _ = try r.signed()
            _ = try r.path()
            let n = try r.varintCount()
            var out: [(Path, Node)] = []
            for _ in 0..<n {
                let p = try r.path()
                let flags = try r.u8()
                out.append((p, try ValueCodec.decode(&r, depth: 0)))
                if flags & 2 != 0 { try ValueCodec.skip(&r) }
            }
            return out
        default:
            return []
        }
    }
}

extension ValueCodec {
    /// The node at `path` below the encoded value (empty where there is none), decoding that
    /// node alone: the values beside it on the way are stepped over, not built (an index of a
    /// child's value reads one field of each child this way).
    static func decode(_ bytes: UnsafeRawBufferPointer, at path: Path) throws -> Node {
        if path.keys == [".priority"] {  // (a value's own priority: its first tag says whether it has one)
            var r = ByteReader(bytes)
            guard let tag = Tag(rawValue: try r.u8()) else { throw ByteReader.damaged("unknown value tag") }
            guard tag == .withPriority else { return .empty }
            return try priority(&r, depth: 1)
        }
        // (A priority is not a child: a path through one is read the long way.)
        if path.keys.contains(".priority") { return try decode(bytes).getChild(path) }
        var r = ByteReader(bytes)
        guard try seek(&r, to: path) else { return .empty }
        return try decode(&r, depth: path.count)
    }

    /// Whether the node at `path` below the encoded value is empty (none is there, or null).
    static func isEmpty(_ bytes: UnsafeRawBufferPointer, at path: Path) throws -> Bool {
        if path.keys.contains(".priority") { return try decode(bytes, at: path).isEmpty }
        var r = ByteReader(bytes)
        guard try seek(&r, to: path) else { return true }
        return try r.u8() == Tag.empty.rawValue
    }

    /// Where the priority of the node at `path` below the encoded value lies in `bytes` (itself
    /// an encoded value: a number or string leaf), or nil when that node has none.
    static func priorityRange(_ bytes: UnsafeRawBufferPointer, at path: Path) throws -> Range<Int>? {
        if path.keys.contains(".priority") { return nil }  // (a priority has none)
        var r = ByteReader(bytes)
        guard try seek(&r, to: path), try r.u8() == Tag.withPriority.rawValue else { return nil }
        let start = r.offset
        _ = try priority(&r, depth: path.count)
        return start..<r.offset
    }

    /// How many children the node at `path` below the encoded value has, read from its header
    /// (nothing is decoded).
    static func childCount(_ bytes: UnsafeRawBufferPointer, at path: Path) throws -> Int {
        if path.keys.contains(".priority") { return 0 }  // (a priority has no children)
        var r = ByteReader(bytes)
        guard try seek(&r, to: path), let tag = try childrenTag(&r, depth: path.count), tag == .children else { return 0 }
        return try r.varintCount()
    }

    /// Reads a value's tag, stepping over a priority before it.
    private static func childrenTag(_ r: inout ByteReader, depth: Int) throws -> Tag? {
        guard var tag = Tag(rawValue: try r.u8()) else { throw ByteReader.damaged("unknown value tag") }
        if tag == .withPriority {
            try skip(&r, depth: depth + 1)
            guard let inner = Tag(rawValue: try r.u8()) else { throw ByteReader.damaged("unknown value tag") }
            tag = inner
        }
        return tag
    }

    /// Moves `r` from the start of a value to the start of the value at `path` below it; false
    /// when there is none.
    private static func seek(_ r: inout ByteReader, to path: Path) throws -> Bool {
        for (depth, key) in path.keys.enumerated() {
            guard try childrenTag(&r, depth: depth) == .children, try seekChild(&r, key, depth: depth) else { return false }
        }
        return true
    }

    /// Moves `r` from just after a children tag at `depth` to the start of the child `key`'s
    /// value; false when there is none.
    private static func seekChild(_ r: inout ByteReader, _ key: String, depth: Int) throws -> Bool {
        let n = try r.varintCount()
        guard n <= r.bytes.count - r.offset else { throw ByteReader.damaged("more children than bytes") }
        var found = false
        var wanted = key
        try wanted.withUTF8 { wanted in
            for _ in 0..<n {
                let k = try r.varintCount()
                guard k <= r.bytes.count - r.offset else { throw ByteReader.damaged("key longer than the record") }
                let name = UnsafeRawBufferPointer(rebasing: r.bytes[r.offset..<(r.offset + k)])
                r.offset += k
                if k == wanted.count && (k == 0 || memcmp(name.baseAddress!, wanted.baseAddress!, k) == 0) {
                    found = true
                    return
                }
                try skip(&r, depth: depth + 1)
            }
        }
        return found
    }

    /// Along `keys` from the top of the encoded value, the first node that is a leaf or empty
    /// (the value itself, or the one after some of the keys, never after all of them — nor
    /// past a `.priority` key), with how many keys lead to it; nil when objects lead all the
    /// way. Decodes that node alone.
    static func leafOnTheWay(_ bytes: UnsafeRawBufferPointer, _ keys: [String]) throws -> (depth: Int, node: Node)? {
        var r = ByteReader(bytes)
        for (depth, key) in keys.enumerated() {
            let start = r.offset
            if try childrenTag(&r, depth: depth) != .children {
                r.offset = start
                return (depth, try decode(&r, depth: depth))
            }
            if key == ".priority" { return nil }
            // (Only the nodes above the location count: the last key is not looked for — a
            // search through a big object's children for nothing.)
            if depth + 1 == keys.count { return nil }
            guard try seekChild(&r, key, depth: depth) else { return (depth + 1, .empty) }
        }
        return nil
    }

    /// Steps over one encoded value without building it.
    static func skip(_ r: inout ByteReader, depth: Int = 0) throws {
        guard depth < 600 else { throw ByteReader.damaged("a value nested too deeply") }
        guard let tag = Tag(rawValue: try r.u8()) else { throw ByteReader.damaged("unknown value tag") }
        switch tag {
        case .empty, .false, .true, .timestamp: return
        case .int, .incrementInt: _ = try r.varint()
        case .double, .incrementDouble: _ = try r.double()
        case .string:
            let n = try r.varintCount()
            guard n <= r.bytes.count - r.offset else { throw ByteReader.damaged("string longer than the record") }
            r.offset += n
        case .withPriority:
            try skip(&r, depth: depth + 1)
            try skip(&r, depth: depth + 1)
        case .children:
            let n = try r.varintCount()
            guard n <= r.bytes.count - r.offset else { throw ByteReader.damaged("more children than bytes") }
            for _ in 0..<n {
                let k = try r.varintCount()
                guard k <= r.bytes.count - r.offset else { throw ByteReader.damaged("key longer than the record") }
                r.offset += k
                try skip(&r, depth: depth + 1)
            }
        }
    }
}

/// Resolves server values for the local view: a timestamp becomes the (corrected) local time;
/// an increment adds to the number already there (a non-number counts as 0; integer overflow
/// falls back to a double).
enum ServerValueResolver {
    static func containsDeferred(_ node: Node) -> Bool {
        switch node {
        case .plainLeaf(.deferred), .prioritizedLeaf(.deferred, _): return true
        case .plainChildren(let c), .prioritizedChildren(let c, _): return c.entries.contains { containsDeferred($0.node) }
        default: return false
        }
    }

    /// `node` (written at `path`) with its server values made what they stand for, over
    /// `existing` (what the location showed).
    /// - Throws: ``DatabaseError/Code/invalidData`` when an increment's sum is not a finite
    ///   number (a double past ±1.8e308): such a number cannot be stored, and the Realtime
    ///   Database refuses the write too.
    static func resolve(_ node: Node, existing: Node, time: Int64, at path: Path) throws -> Node {
        switch node {
        case .plainLeaf(.deferred(let sv)), .prioritizedLeaf(.deferred(let sv), _):
            return try resolveLeaf(sv, existing: existing, time: time, at: path).updatingPriority(node.priority)
        case .plainChildren(let c), .prioritizedChildren(let c, _):
            let p = node.priority
            var entries = c.entries
            for i in entries.indices where containsDeferred(entries[i].node) {
                let name = entries[i].name
                entries[i].node = try resolve(entries[i].node, existing: existing.getImmediateChild(name), time: time, at: path.child(name))
            }
            let kept = entries.filter { !$0.node.isEmpty }
            return kept.isEmpty ? .empty : .children(ChildMap(sorted: kept), priority: p)
        default:
            return node
        }
    }

    private static func resolveLeaf(_ sv: Value, existing: Node, time: Int64, at path: Path) throws -> Node {
        guard case .object(let o) = sv, let spec = o[".sv"] else { return .empty }
        if case .string("timestamp") = spec { return .leaf(.int(time), priority: .empty) }
        guard case .object(let inc) = spec, let delta = inc["increment"] else { return .empty }
        let base: LeafValue
        if let v = existing.leafValue, v.doubleValue != nil { base = v } else { base = .int(0) }
        switch (base, delta) {
        case let (.int(a), .int(b)):
            let (sum, overflow) = a.addingReportingOverflow(b)
            return .leaf(overflow ? .double(Double(a) + Double(b)) : .int(sum), priority: .empty)
        default:
            let sum = (base.doubleValue ?? 0) + (delta.number ?? 0)
            guard sum.isFinite else {
                throw DatabaseError(.invalidData, "the increment at \(path) makes the number there \(sum); only finite numbers can be stored")
            }
            return .leaf(.double(sum), priority: .empty)
        }
    }
}

/// A note the log's read ahead keeps beside a record (``RecordCodec/inspector``): that the
/// value at `offset` of `length` bytes in it was checked (``ValueCodec/validate(_:)``), and
/// whether it is empty. Bit 63: checked; bit 62: empty; bits 31–61 the offset, 0–30 the length.
enum ValueNote {
    private static let limit = 1 << 31

    static func make(offset: Int, length: Int, empty: Bool) -> UInt64 {
        guard offset < limit, length < limit else { return 0 }
        return 1 << 63 | (empty ? 1 << 62 : 0) | UInt64(offset) << 31 | UInt64(length)
    }

    /// Whether the value of `length` bytes at `offset` is empty, if `note` says it was checked.
    static func isEmpty(_ note: UInt64, offset: UInt32, length: UInt32) -> Bool? {
        guard note >> 63 == 1, (note >> 31) & UInt64(limit - 1) == UInt64(offset), note & UInt64(limit - 1) == UInt64(length) else { return nil }
        return note & (1 << 62) != 0
    }
}
