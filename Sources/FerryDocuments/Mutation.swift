import Foundation

/// A document as the local view holds it: its fields (nil: known not to exist), and whether
/// pending local writes made it so.
package struct LocalDocument: Sendable, Equatable {
    package var key: ResourcePath
    /// The fields; nil when the document is known not to exist (deleted).
    package var fields: [String: FieldValueData]?
    /// Local writes not yet acknowledged by the server touch it.
    var hasLocalMutations: Bool
    /// When the server last changed it (nil: not from the server).
    var updateTime: Timestamp?
    var createTime: Timestamp?
    /// The server's version of it, in microseconds (0: not from the server, or changed by a
    /// pending write).
    var version: Int64 = 0
    /// Its state comes from a write the server acknowledged, which no listen has confirmed yet.
    var hasCommittedMutations = false
    /// The server acknowledged an update of it without the cache holding it: its version is
    /// known, its fields are not (it reads as not cached).
    var unknown = false

    package var exists: Bool { fields != nil }
    /// Local or acknowledged-but-unconfirmed writes make it what it is.
    var hasPendingWrites: Bool { hasLocalMutations || hasCommittedMutations }
}

extension LocalDocument {
    /// A document as a server holds it: no local writes.
    package static func stored(_ key: ResourcePath, _ fields: [String: FieldValueData]?, createTime: Timestamp? = nil, updateTime: Timestamp? = nil) -> LocalDocument {
        LocalDocument(key: key, fields: fields, hasLocalMutations: false, updateTime: updateTime, createTime: createTime)
    }
}

/// One write of a batch (Firestore's mutations): set, patch (update or merge) or delete.
package struct Mutation: Sendable, Equatable {
    package enum Operation: UInt8, Sendable {
        case set = 1, patch = 2, delete = 3
    }
    package var operation: Operation
    package var key: ResourcePath
    package var fields: [String: FieldValueData] = [:]
    /// Patch: the fields written (absent from `fields`: deleted).
    package var mask: [FieldPath] = []
    package var transforms: [(FieldPath, FieldTransform)] = []
    /// Patch from `updateData`: the document must exist.
    package var mustExist = false

    package static func == (a: Mutation, b: Mutation) -> Bool {
        a.operation == b.operation && a.key == b.key && a.fields == b.fields && a.mask == b.mask && a.mustExist == b.mustExist
            && a.transforms.map(\.0) == b.transforms.map(\.0) && a.transforms.map(\.1) == b.transforms.map(\.1)
    }

    /// The document after this mutation, applied locally at `writeTime` over `doc` (nil: not
    /// cached, which is not the same as known not to exist).
    func applied(to doc: LocalDocument?, writeTime: Timestamp) -> LocalDocument? {
        let before = doc?.fields
        switch operation {
        case .delete:
            return LocalDocument(key: key, fields: nil, hasLocalMutations: true, updateTime: doc?.updateTime, createTime: doc?.createTime)
        case .set:
            var out = fields
            applyTransforms(&out, before: before, writeTime: writeTime)
            return LocalDocument(key: key, fields: out, hasLocalMutations: true, updateTime: doc?.updateTime, createTime: doc?.createTime)
        case .patch:
            if mustExist && before == nil {
                // An update of a document the cache does not show: nothing changes locally (the
                // server will answer NOT_FOUND).
                return doc
            }
            var out = before ?? [:]
            let source = FieldValueData.map(fields)
            for path in mask {
                setField(&out, path.segments[...], source.value(at: path))
            }
            applyTransforms(&out, before: before, writeTime: writeTime)
            return LocalDocument(key: key, fields: out, hasLocalMutations: true, updateTime: doc?.updateTime, createTime: doc?.createTime)
        }
    }

    private func applyTransforms(_ out: inout [String: FieldValueData], before: [String: FieldValueData]?, writeTime: Timestamp) {
        for (path, t) in transforms {
            let previous = before.flatMap { FieldValueData.map($0).value(at: path) }
            setField(&out, path.segments[...], Self.localResult(t, previous: previous, writeTime: writeTime))
        }
    }

    /// What a transform shows locally over the field's `previous` value.
    package static func localResult(_ t: FieldTransform, previous: FieldValueData?, writeTime: Timestamp) -> FieldValueData {
        switch t {
        case .serverTimestamp:
            // A pending timestamp over another keeps the first one's previous value.
            if case .pendingServerTimestamp(_, let p)? = previous { return .pendingServerTimestamp(local: writeTime, previous: p) }
            return .pendingServerTimestamp(local: writeTime, previous: previous)
        case .increment(let n):
            let base: FieldValueData = previous.flatMap { $0.isNumber ? $0 : nil } ?? .integer(0)
            switch (base, n) {
            case (.integer(let a), .integer(let b)):
                let (r, o) = a.addingReportingOverflow(b)
                return .integer(o ? (b > 0 ? .max : .min) : r)
            case (.integer(let a), .double(let b)): return .double(Double(a) + b)
            case (.double(let a), .integer(let b)): return .double(a + Double(b))
            case (.double(let a), .double(let b)): return .double(a + b)
            default: return n
            }
        case .arrayUnion(let elements):
            var arr: [FieldValueData] = if case .array(let a)? = previous { a } else { [] }
            for e in elements where !arr.contains(e) { arr.append(e) }
            return .array(arr)
        case .arrayRemove(let elements):
            guard case .array(let a)? = previous else { return .array([]) }
            return .array(a.filter { !elements.contains($0) })
        }
    }
}

/// A batch of mutations written together (one record: its LSN is the batch id).
package struct MutationBatch: Sendable, Equatable {
    package var id: Int64
    /// The local time of the write: pending server timestamps show it.
    var localWriteTime: Timestamp
    package var mutations: [Mutation]
}

/// The pending batches, oldest first. Ids increase (they are LSNs), so a batch is found by
/// binary search, and the oldest — the one the server answers — leaves in O(1).
struct PendingBatches: RandomAccessCollection {
    private var items: [MutationBatch] = []
    private var head = 0

    var startIndex: Int { head }
    var endIndex: Int { items.count }
    subscript(i: Int) -> MutationBatch { items[i] }

    mutating func append(_ b: MutationBatch) { items.append(b) }

    /// Where batch `id` is, if pending.
    func index(of id: Int64) -> Int? {
        var lo = head, hi = items.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if items[mid].id < id { lo = mid + 1 } else { hi = mid }
        }
        return lo < items.count && items[lo].id == id ? lo : nil
    }

    func batch(_ id: Int64) -> MutationBatch? { index(of: id).map { items[$0] } }
    func contains(_ id: Int64) -> Bool { index(of: id) != nil }

    /// Removes batch `id` (answers come oldest first: then O(1), amortized).
    mutating func remove(_ id: Int64) -> MutationBatch? {
        guard let i = index(of: id) else { return nil }
        let b = items[i]
        if i == head {
            head += 1
            if head > 1024 && head * 2 > items.count {
                items.removeFirst(head)
                head = 0
            }
        } else {
            items.remove(at: i)
        }
        return b
    }
}
