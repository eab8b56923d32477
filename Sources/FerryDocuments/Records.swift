import Foundation

/// The kinds of records the document store writes to the log. They start at 32, so that a
/// Realtime Database store (kinds 1–11) and a document store are never taken for each other.
enum DocumentRecordKind: UInt8, CaseIterable {
    /// A batch of local writes (set, patch, delete); its LSN is the batch id.
    case writeBatch = 32
    /// The local indexes' definitions (configured and automatic), replacing the previous set.
    case indexConfiguration = 33
    /// A consistent snapshot from the server: its version, what changed in each target (its
    /// documents, its resume token) and the documents that changed.
    case remoteEvent = 34
    /// The server answered the oldest pending batch: committed at a version, or refused.
    case writeAnswer = 35
    /// A listen target was made for a query (its id is kept for later listens and restarts).
    case target = 36
    /// The app cleared the rejected batches up to an id (`clearRejectedWrites`).
    case rejectionsCleared = 37
}

/// Little-endian writer of record payloads.
package struct PayloadWriter {
    package var bytes: [UInt8] = []
    package init() {}
    package mutating func u8(_ v: UInt8) { bytes.append(v) }
    package mutating func u32(_ v: UInt32) { withUnsafeBytes(of: v.littleEndian) { bytes.append(contentsOf: $0) } }
    package mutating func i64(_ v: Int64) { withUnsafeBytes(of: v.littleEndian) { bytes.append(contentsOf: $0) } }
    package mutating func f64(_ v: Double) { withUnsafeBytes(of: v.bitPattern.littleEndian) { bytes.append(contentsOf: $0) } }
    package mutating func string(_ s: String) { u32(UInt32(s.utf8.count)); bytes.append(contentsOf: s.utf8) }
    package mutating func data(_ d: Data) { u32(UInt32(d.count)); bytes.append(contentsOf: d) }
    package mutating func path(_ p: ResourcePath) { u32(UInt32(p.segments.count)); for s in p.segments { string(s) } }
    package mutating func fieldPath(_ p: FieldPath) { u32(UInt32(p.segments.count)); for s in p.segments { string(s) } }

    /// A value: a tag byte, then its body.
    package mutating func value(_ v: FieldValueData) {
        switch v {
        case .null: u8(0)
        case .bool(let b): u8(b ? 2 : 1)
        case .integer(let i): u8(3); i64(i)
        case .double(let d): u8(4); f64(d)
        case .timestamp(let t): u8(5); i64(t.seconds); u32(UInt32(bitPattern: t.nanoseconds))
        case .pendingServerTimestamp: preconditionFailure("a pending server timestamp is never written to a record")
        case .string(let s): u8(6); string(s)
        case .bytes(let d): u8(7); data(d)
        case .reference(let r): u8(8); string(r)
        case .geoPoint(let g): u8(9); f64(g.latitude); f64(g.longitude)
        case .array(let a): u8(10); u32(UInt32(a.count)); for e in a { value(e) }
        case .map(let m): u8(11); fields(m)
        }
    }

    /// A map's fields, in key order (so equal maps write equal bytes).
    package mutating func fields(_ m: [String: FieldValueData]) {
        u32(UInt32(m.count))
        for k in m.keys.sorted(by: FieldValueData.utf8Less) { string(k); value(m[k]!) }
    }
}

/// Reader of record payloads: every read checks that the bytes are there.
package struct PayloadReader {
    package let bytes: UnsafeRawBufferPointer
    package var offset = 0
    package init(_ bytes: UnsafeRawBufferPointer) { self.bytes = bytes }

    package var atEnd: Bool { offset == bytes.count }
    private mutating func take(_ n: Int) throws -> UnsafeRawBufferPointer {
        guard n >= 0, bytes.count - offset >= n else {
            throw FirestoreErrorCode(.dataLoss, "a document record ends early (needs \(n) bytes at offset \(offset) of \(bytes.count))")
        }
        defer { offset += n }
        return UnsafeRawBufferPointer(rebasing: bytes[offset..<offset + n])
    }
    package mutating func u8() throws -> UInt8 { try take(1)[0] }
    /// The next `n` bytes as they are.
    package mutating func raw(_ n: Int) throws -> UnsafeRawBufferPointer { try take(n) }
    package mutating func u32() throws -> UInt32 { UInt32(littleEndian: try take(4).loadUnaligned(as: UInt32.self)) }
    package mutating func i64() throws -> Int64 { Int64(littleEndian: try take(8).loadUnaligned(as: Int64.self)) }
    package mutating func f64() throws -> Double { Double(bitPattern: UInt64(littleEndian: try take(8).loadUnaligned(as: UInt64.self))) }
    package mutating func string() throws -> String {
        let b = try take(Int(try u32())).assumingMemoryBound(to: UInt8.self)
        // ASCII (field names, most values) is valid UTF-8 as it is: checked byte by byte, then
        // made a String without a second check (the generic validation was half of decoding
        // a reopen's documents in `perf`).
        if b.allSatisfy({ $0 < 0x80 }) { return String(decoding: b, as: UTF8.self) }
        guard let s = String(validating: b, as: UTF8.self) else { throw FirestoreErrorCode(.dataLoss, "a document record holds a string that is not UTF-8 (offset \(offset))") }
        return s
    }
    package mutating func data() throws -> Data { Data(try take(Int(try u32()))) }
    package mutating func count(max: Int = 1 << 24) throws -> Int {
        let n = Int(try u32())
        guard n <= max, n <= bytes.count - offset else { throw FirestoreErrorCode(.dataLoss, "a document record holds an impossible count \(n) (offset \(offset))") }
        return n
    }
    package mutating func path() throws -> ResourcePath { ResourcePath(try (0..<count()).map { _ in try string() }) }
    package mutating func fieldPath() throws -> FieldPath { FieldPath(try (0..<count()).map { _ in try string() }) }

    package mutating func value(depth: Int = 0) throws -> FieldValueData {
        guard depth <= 64 else { throw FirestoreErrorCode(.dataLoss, "a document record nests values too deep (offset \(offset))") }
        switch try u8() {
        case 0: return .null
        case 1: return .bool(false)
        case 2: return .bool(true)
        case 3: return .integer(try i64())
        case 4: return .double(try f64())
        case 5: return .timestamp(Timestamp(seconds: try i64(), nanoseconds: Int32(bitPattern: try u32())))
        case 6: return .string(try string())
        case 7: return .bytes(try data())
        case 8: return .reference(try string())
        case 9: return .geoPoint(GeoPoint(latitude: try f64(), longitude: try f64()))
        case 10: return .array(try (0..<count()).map { _ in try value(depth: depth + 1) })
        case 11: return .map(try fields(depth: depth + 1))
        case let t: throw FirestoreErrorCode(.dataLoss, "a document record holds a value of unknown type \(t) (offset \(offset - 1))")
        }
    }

    package mutating func fields(depth: Int = 0) throws -> [String: FieldValueData] {
        let n = try count()
        var m: [String: FieldValueData] = [:]
        m.reserveCapacity(n)
        for _ in 0..<n { let k = try string(); m[k] = try value(depth: depth) }
        return m
    }
}

/// The payloads of document records (FORMAT.md, *Document records*).
enum DocumentRecords {
    static let version: UInt8 = 1

    static func encode(_ batch: MutationBatch) -> [UInt8] {
        var w = PayloadWriter()
        w.u8(version)
        w.i64(batch.localWriteTime.micros)
        w.u32(UInt32(batch.mutations.count))
        for m in batch.mutations {
            w.u8(m.operation.rawValue)
            w.path(m.key)
            guard m.operation != .delete else { continue }
            w.u8(m.mustExist ? 1 : 0)
            w.fields(m.fields)
            w.u32(UInt32(m.mask.count))
            for p in m.mask { w.fieldPath(p) }
            w.u32(UInt32(m.transforms.count))
            for (p, t) in m.transforms {
                w.fieldPath(p)
                switch t {
                case .serverTimestamp: w.u8(1)
                case .increment(let n): w.u8(2); w.value(n)
                case .arrayUnion(let e): w.u8(3); w.value(.array(e))
                case .arrayRemove(let e): w.u8(4); w.value(.array(e))
                }
            }
        }
        return w.bytes
    }

    /// The index definitions (all of them: a record replaces the previous set).
    static func encode(_ indexes: [IndexDefinition]) -> [UInt8] {
        var w = PayloadWriter()
        w.u8(version)
        w.u32(UInt32(indexes.count))
        for d in indexes {
            w.string(d.collectionGroup)
            w.u8(d.automatic ? 1 : 0)
            w.u32(UInt32(d.segments.count))
            for s in d.segments {
                w.fieldPath(s.field)
                w.u8(s.kind == .ascending ? 1 : s.kind == .descending ? 2 : 3)
            }
        }
        return w.bytes
    }

    static func decodeIndexes(_ payload: UnsafeRawBufferPointer) throws -> [IndexDefinition] {
        var r = PayloadReader(payload)
        let v = try r.u8()
        guard v == version else { throw FirestoreErrorCode(.dataLoss, "an index configuration record of version \(v), which this build does not read") }
        var out: [IndexDefinition] = []
        for _ in 0..<(try r.count()) {
            let group = try r.string()
            let automatic = try r.u8() == 1
            var segments: [IndexSegment] = []
            for _ in 0..<(try r.count()) {
                let p = try r.fieldPath()
                let k: IndexSegment.Kind
                switch try r.u8() {
                case 1: k = .ascending
                case 2: k = .descending
                case 3: k = .contains
                case let x: throw FirestoreErrorCode(.dataLoss, "an index configuration record holds an unknown segment kind \(x)")
                }
                segments.append(IndexSegment(field: p, kind: k))
            }
            out.append(IndexDefinition(collectionGroup: group, segments: segments, automatic: automatic))
        }
        guard r.atEnd else { throw FirestoreErrorCode(.dataLoss, "an index configuration record has bytes after its end") }
        return out
    }

    static func decodeBatch(id: Int64, _ payload: UnsafeRawBufferPointer) throws -> MutationBatch {
        var r = PayloadReader(payload)
        let v = try r.u8()
        guard v == version else { throw FirestoreErrorCode(.dataLoss, "a write batch record of version \(v), which this build does not read (it reads \(version))") }
        let time = Timestamp(micros: try r.i64())
        var mutations: [Mutation] = []
        for _ in 0..<(try r.count()) {
            guard let op = Mutation.Operation(rawValue: try r.u8()) else { throw FirestoreErrorCode(.dataLoss, "a write batch record holds an unknown operation") }
            var m = Mutation(operation: op, key: try r.path())
            if op != .delete {
                m.mustExist = try r.u8() == 1
                m.fields = try r.fields()
                m.mask = try (0..<r.count()).map { _ in try r.fieldPath() }
                for _ in 0..<(try r.count()) {
                    let p = try r.fieldPath()
                    let t: FieldTransform
                    switch try r.u8() {
                    case 1: t = .serverTimestamp
                    case 2: t = .increment(try r.value())
                    case 3: guard case .array(let e) = try r.value() else { throw FirestoreErrorCode(.dataLoss, "an array union without an array") }; t = .arrayUnion(e)
                    case 4: guard case .array(let e) = try r.value() else { throw FirestoreErrorCode(.dataLoss, "an array removal without an array") }; t = .arrayRemove(e)
                    case let k: throw FirestoreErrorCode(.dataLoss, "a write batch record holds an unknown transform \(k)")
                    }
                    m.transforms.append((p, t))
                }
            }
            mutations.append(m)
        }
        guard r.atEnd else { throw FirestoreErrorCode(.dataLoss, "a write batch record has \(payload.count - r.offset) bytes after its end") }
        return MutationBatch(id: id, localWriteTime: time, mutations: mutations)
    }
}

/// A consistent snapshot from the server, as recorded (kind 34).
struct RemoteEventRecord: Sendable {
    struct Target: Sendable {
        var id: Int
        /// nil: unchanged; "": cleared (an existence-filter mismatch).
        var resumeToken: String?
        var added: [ResourcePath] = []
        var removed: [ResourcePath] = []
    }
    enum DocumentState: UInt8, Sendable { case deleted = 0, found = 1, forgotten = 2 }
    struct Document: Sendable {
        var key: ResourcePath
        var state: DocumentState
        var version: Int64
        var fields: [String: FieldValueData]?
    }
    var version: Int64
    var targets: [Target] = []
    var documents: [Document] = []
}

/// The server's answer to a batch, as recorded (kind 35).
struct WriteAnswerRecord: Sendable {
    var batchID: Int64
    var version: Int64
    /// nil: committed.
    var rejection: FirestoreErrorCode?
}

extension DocumentRecords {
    static func encode(_ r: RemoteEventRecord) -> [UInt8] {
        var w = PayloadWriter()
        w.u8(version)
        w.i64(r.version)
        w.u32(UInt32(r.targets.count))
        for t in r.targets {
            w.u32(UInt32(t.id))
            if let token = t.resumeToken { w.u8(1); w.string(token) } else { w.u8(0) }
            w.u32(UInt32(t.added.count)); for k in t.added { w.path(k) }
            w.u32(UInt32(t.removed.count)); for k in t.removed { w.path(k) }
        }
        w.u32(UInt32(r.documents.count))
        for d in r.documents {
            w.path(d.key)
            w.u8(d.state.rawValue)
            w.i64(d.version)
            if d.state == .found { w.fields(d.fields ?? [:]) }
        }
        return w.bytes
    }

    static func decodeRemoteEvent(_ payload: UnsafeRawBufferPointer) throws -> RemoteEventRecord {
        var r = PayloadReader(payload)
        guard try r.u8() == version else { throw FirestoreErrorCode(.dataLoss, "a remote event record of a version this build does not read") }
        var e = RemoteEventRecord(version: try r.i64())
        for _ in 0..<(try r.count()) {
            var t = RemoteEventRecord.Target(id: Int(try r.u32()))
            if try r.u8() == 1 { t.resumeToken = try r.string() }
            t.added = try (0..<r.count()).map { _ in try r.path() }
            t.removed = try (0..<r.count()).map { _ in try r.path() }
            e.targets.append(t)
        }
        for _ in 0..<(try r.count()) {
            let key = try r.path()
            guard let state = RemoteEventRecord.DocumentState(rawValue: try r.u8()) else { throw FirestoreErrorCode(.dataLoss, "a remote event record holds an unknown document state") }
            let v = try r.i64()
            e.documents.append(.init(key: key, state: state, version: v, fields: state == .found ? try r.fields() : nil))
        }
        guard r.atEnd else { throw FirestoreErrorCode(.dataLoss, "a remote event record has bytes after its end") }
        return e
    }

    static func encode(_ a: WriteAnswerRecord) -> [UInt8] {
        var w = PayloadWriter()
        w.u8(version)
        w.i64(a.batchID)
        w.i64(a.version)
        if let e = a.rejection { w.u8(1); w.u32(UInt32(e.code.rawValue)); w.string(e.message) } else { w.u8(0) }
        return w.bytes
    }

    static func decodeWriteAnswer(_ payload: UnsafeRawBufferPointer) throws -> WriteAnswerRecord {
        var r = PayloadReader(payload)
        guard try r.u8() == version else { throw FirestoreErrorCode(.dataLoss, "a write answer record of a version this build does not read") }
        var a = WriteAnswerRecord(batchID: try r.i64(), version: try r.i64())
        if try r.u8() == 1 {
            let code = FirestoreErrorCode.Code(rawValue: Int(try r.u32())) ?? .unknown
            a.rejection = FirestoreErrorCode(code, try r.string())
        }
        guard r.atEnd else { throw FirestoreErrorCode(.dataLoss, "a write answer record has bytes after its end") }
        return a
    }

    static func encodeTarget(id: Int, query: QueryCore) -> [UInt8] {
        var w = PayloadWriter()
        w.u8(version)
        w.u32(UInt32(id))
        w.query(query)
        return w.bytes
    }

    static func decodeTarget(_ payload: UnsafeRawBufferPointer) throws -> (id: Int, query: QueryCore) {
        var r = PayloadReader(payload)
        guard try r.u8() == version else { throw FirestoreErrorCode(.dataLoss, "a target record of a version this build does not read") }
        let id = Int(try r.u32())
        let q = try r.query()
        guard r.atEnd else { throw FirestoreErrorCode(.dataLoss, "a target record has bytes after its end") }
        return (id, q)
    }
}

extension PayloadWriter {
    mutating func query(_ q: QueryCore) {
        path(q.path)
        if let g = q.collectionGroup { u8(1); string(g) } else { u8(0) }
        if let k = q.documentKey { u8(1); path(k) } else { u8(0) }
        if let f = q.filter { u8(1); filter(f) } else { u8(0) }
        u32(UInt32(q.explicitOrders.count))
        for o in q.explicitOrders { orderField(o.field); u8(o.descending ? 1 : 0) }
        if let l = q.limit { u8(q.limitType == .first ? 1 : 2); i64(Int64(l)) } else { u8(0) }
        for b in [q.start, q.end] {
            if let b { u8(1); u8(b.inclusive ? 1 : 0); value(.array(b.position)) } else { u8(0) }
        }
    }

    mutating func orderField(_ p: FieldPath) {
        u8(p.isDocumentID ? 1 : 0)
        if !p.isDocumentID { fieldPath(p) }
    }

    mutating func filter(_ f: FilterNode) {
        switch f {
        case .field(let p, let op, let v): u8(0); orderField(p); string(op.rawValue); value(v)
        case .and(let fs): u8(1); u32(UInt32(fs.count)); for x in fs { filter(x) }
        case .or(let fs): u8(2); u32(UInt32(fs.count)); for x in fs { filter(x) }
        }
    }
}

extension PayloadReader {
    mutating func query() throws -> QueryCore {
        var q = QueryCore(path: try path())
        if try u8() == 1 { q.collectionGroup = try string() }
        if try u8() == 1 { q.documentKey = try path() }
        if try u8() == 1 { q.filter = try filter(depth: 0) }
        for _ in 0..<(try count()) { q.explicitOrders.append(OrderBy(field: try orderField(), descending: try u8() == 1)) }
        switch try u8() {
        case 0: break
        case let t: q.limitType = t == 1 ? .first : .last; q.limit = Int(try i64())
        }
        for i in 0..<2 where try u8() == 1 {
            let inclusive = try u8() == 1
            guard case .array(let position) = try value() else { throw FirestoreErrorCode(.dataLoss, "a target record's cursor is not an array") }
            if i == 0 { q.start = Bound(position: position, inclusive: inclusive) } else { q.end = Bound(position: position, inclusive: inclusive) }
        }
        return q
    }

    mutating func orderField() throws -> FieldPath { try u8() == 1 ? .documentID() : try fieldPath() }

    mutating func filter(depth: Int) throws -> FilterNode {
        guard depth < 64 else { throw FirestoreErrorCode(.dataLoss, "a target record nests filters too deep") }
        switch try u8() {
        case 0:
            let p = try orderField()
            guard let op = FilterOperator(rawValue: try string()) else { throw FirestoreErrorCode(.dataLoss, "a target record holds an unknown operator") }
            return .field(p, op, try value())
        case 1: return .and(try (0..<count()).map { _ in try filter(depth: depth + 1) })
        case 2: return .or(try (0..<count()).map { _ in try filter(depth: depth + 1) })
        case let t: throw FirestoreErrorCode(.dataLoss, "a target record holds an unknown filter \(t)")
        }
    }
}
