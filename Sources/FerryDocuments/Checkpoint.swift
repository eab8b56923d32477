import CCRC32C
import CLZ4
import FerryLog
import FerryStore
import Foundation

/// A document store's checkpoint: its whole state below an LSN, in one side file, so that an
/// open replays only the records after it and the segments below it can be deleted.
///
/// The state is what the records built: the server's documents, the targets (with their
/// documents and resume tokens), the pending batches, the ledger's cursor and the index
/// definitions. The local view and the indexes are derived from them on load.
struct DocumentCheckpoint {
    static let fileName = DocumentTools.checkpointFileName
    static let magic: [UInt8] = Array("FDCK".utf8)
    static let version: UInt8 = 3

    /// Records below this LSN are in the checkpoint.
    var throughLSN: UInt64
    var lastRemoteVersion: Int64
    var nextTargetID: Int
    var ackedThrough: Int64
    var remote: [LocalDocument]
    var targets: [TargetData]
    var pending: [MutationBatch]
    var indexes: [IndexDefinition]
    /// Refused batches the app has not cleared (version 3 on).
    var rejected: [Int64: RejectedWriteData] = [:]

    /// The checkpoint of an engine's state (the caller holds the store's lock).
    init(_ e: DocumentEngine, throughLSN: UInt64) {
        self.throughLSN = throughLSN
        lastRemoteVersion = e.lastRemoteVersion
        nextTargetID = e.nextTargetID
        ackedThrough = e.ledger.ackedThrough
        remote = Array(e.remote.values)
        // Targets listened to now and those kept for later, without limbo targets (those are
        // made again from the views).
        targets = Array(e.targets.values.filter { !$0.limbo }) + e.savedTargets.values.filter { t in e.targets[t.id] == nil }
        pending = Array(e.pending)
        indexes = e.indexes.map(\.definition)
        rejected = e.rejectedWrites
    }

    /// The file: magic, version, the body's length u32 and its LZ4 block's length u32, the
    /// block, then the CRC32C of everything before it.
    func encode() -> [UInt8] {
        let body = encodeBody()
        var out = Self.magic
        out.append(Self.version)
        var w = PayloadWriter()
        w.u32(UInt32(body.count))
        let bound = Int(LZ4_compressBound(Int32(body.count)))
        var block = [UInt8](repeating: 0, count: bound)
        let n = body.withUnsafeBytes { src in
            block.withUnsafeMutableBytes { dst in
                LZ4_compress_default(src.baseAddress!.assumingMemoryBound(to: CChar.self), dst.baseAddress!.assumingMemoryBound(to: CChar.self), Int32(body.count), Int32(bound))
            }
        }
        w.u32(UInt32(n))
        out += w.bytes
        out += block.prefix(Int(n))
        let crc = out.withUnsafeBytes { ferry_crc32c(0, $0.baseAddress, $0.count) }
        withUnsafeBytes(of: crc.littleEndian) { out.append(contentsOf: $0) }
        return out
    }

    func encodeBody() -> [UInt8] {
        var w = PayloadWriter()
        w.i64(Int64(throughLSN))
        w.i64(lastRemoteVersion)
        w.u32(UInt32(nextTargetID))
        w.i64(ackedThrough)
        w.u32(UInt32(remote.count))
        for d in remote.sorted(by: { $0.key < $1.key }) {
            w.path(d.key)
            w.i64(d.version)
            w.u8((d.fields != nil ? 1 : 0) | (d.hasCommittedMutations ? 2 : 0) | (d.unknown ? 4 : 0))
            if let f = d.fields { w.fields(f) }
        }
        w.u32(UInt32(targets.count))
        for t in targets.sorted(by: { $0.id < $1.id }) {
            w.u32(UInt32(t.id))
            w.query(t.query)
            w.string(t.resumeToken)
            w.i64(t.snapshotVersion)
            w.u32(UInt32(t.remoteKeys.count))
            for k in t.remoteKeys.sorted() { w.path(k) }
        }
        w.u32(UInt32(pending.count))
        for b in pending {
            w.i64(b.id)
            let payload = DocumentRecords.encode(b)
            w.u32(UInt32(payload.count))
            w.bytes.append(contentsOf: payload)
        }
        let ix = DocumentRecords.encode(indexes)
        w.u32(UInt32(ix.count))
        w.bytes.append(contentsOf: ix)
        w.u32(UInt32(rejected.count))
        for (id, r) in rejected.sorted(by: { $0.key < $1.key }) {
            w.i64(id)
            w.u32(UInt32(r.error.code.rawValue))
            w.string(r.error.message)
            w.u32(UInt32(r.documents.count))
            for p in r.documents { w.path(p) }
        }
        return w.bytes
    }

    static func decode(_ bytes: [UInt8]) throws -> DocumentCheckpoint {
        guard bytes.count >= 17, Array(bytes.prefix(4)) == magic else {
            throw FirestoreErrorCode(.dataLoss, "\(fileName) is not a document checkpoint (its first bytes are not \"FDCK\")")
        }
        let body = bytes.count - 4
        let stored = bytes.withUnsafeBytes { UInt32(littleEndian: $0.loadUnaligned(fromByteOffset: body, as: UInt32.self)) }
        let crc = bytes.withUnsafeBytes { ferry_crc32c(0, $0.baseAddress, body) }
        guard crc == stored else { throw FirestoreErrorCode(.dataLoss, "\(fileName) fails its checksum (CRC32C \(String(crc, radix: 16)), stored \(String(stored, radix: 16))): it is damaged") }
        let fileVersion = bytes[4]
        guard fileVersion == 2 || fileVersion == version else { throw FirestoreErrorCode(.dataLoss, "\(fileName) is of version \(fileVersion), which this build does not read") }
        let (rawCount, blockCount) = bytes.withUnsafeBytes { ($0.loadUnaligned(fromByteOffset: 5, as: UInt32.self), $0.loadUnaligned(fromByteOffset: 9, as: UInt32.self)) }
        guard 13 + Int(blockCount) == body else { throw FirestoreErrorCode(.dataLoss, "\(fileName) has a block of the wrong length") }
        var raw = [UInt8](repeating: 0, count: Int(rawCount))
        let n = bytes.withUnsafeBytes { src in
            raw.withUnsafeMutableBytes { dst in
                LZ4_decompress_safe(src.baseAddress!.advanced(by: 13).assumingMemoryBound(to: CChar.self), dst.baseAddress!.assumingMemoryBound(to: CChar.self), Int32(blockCount), Int32(rawCount))
            }
        }
        guard n == Int32(rawCount) else { throw FirestoreErrorCode(.dataLoss, "\(fileName) does not decompress") }
        return try raw.withUnsafeBytes { all in
            var r = PayloadReader(all)
            let through = UInt64(try r.i64())
            let lastRemote = try r.i64()
            let nextTarget = Int(try r.u32())
            let acked = try r.i64()
            var remote: [LocalDocument] = []
            for _ in 0..<(try r.count()) {
                let key = try r.path()
                let version = try r.i64()
                let flags = try r.u8()
                let fields = flags & 1 != 0 ? try r.fields() : nil
                remote.append(LocalDocument(key: key, fields: fields, hasLocalMutations: false, version: version,
                                            hasCommittedMutations: flags & 2 != 0, unknown: flags & 4 != 0))
            }
            var targets: [TargetData] = []
            for _ in 0..<(try r.count()) {
                var t = TargetData(id: Int(try r.u32()), query: try r.query())
                t.resumeToken = try r.string()
                t.snapshotVersion = try r.i64()
                t.remoteKeys = Set(try (0..<r.count()).map { _ in try r.path() })
                targets.append(t)
            }
            var pending: [MutationBatch] = []
            for _ in 0..<(try r.count()) {
                let id = try r.i64()
                pending.append(try DocumentRecords.decodeBatch(id: id, try r.raw(try r.count())))
            }
            let indexes = try DocumentRecords.decodeIndexes(try r.raw(try r.count()))
            var rejected: [Int64: RejectedWriteData] = [:]
            if fileVersion >= 3 {
                for _ in 0..<(try r.count()) {
                    let id = try r.i64()
                    let code = FirestoreErrorCode.Code(rawValue: Int(try r.u32())) ?? .unknown
                    let message = try r.string()
                    let paths = try (0..<r.count()).map { _ in try r.path() }
                    rejected[id] = RejectedWriteData(documents: paths, error: FirestoreErrorCode(code, message))
                }
            }
            guard r.atEnd else { throw FirestoreErrorCode(.dataLoss, "\(fileName) has bytes after its end") }
            var c = DocumentCheckpoint(throughLSN: through, lastRemoteVersion: lastRemote, nextTargetID: nextTarget, ackedThrough: acked,
                                       remote: remote, targets: targets, pending: pending, indexes: indexes)
            c.throughLSN = through
            c.rejected = rejected
            return c
        }
    }

    init(throughLSN: UInt64, lastRemoteVersion: Int64, nextTargetID: Int, ackedThrough: Int64, remote: [LocalDocument],
         targets: [TargetData], pending: [MutationBatch], indexes: [IndexDefinition]) {
        self.throughLSN = throughLSN
        self.lastRemoteVersion = lastRemoteVersion
        self.nextTargetID = nextTargetID
        self.ackedThrough = ackedThrough
        self.remote = remote
        self.targets = targets
        self.pending = pending
        self.indexes = indexes
    }
}

extension DocumentEngine {
    /// Installs a checkpoint into a fresh engine (before the replay of the records after it).
    mutating func install(_ c: DocumentCheckpoint) {
        lastRemoteVersion = c.lastRemoteVersion
        nextTargetID = max(nextTargetID, c.nextTargetID)
        ledger.advanceCursor(through: c.ackedThrough)
        for d in c.remote {
            remote[d.key] = d
            setDocument(old: nil, new: d)
        }
        for t in c.targets { savedTargets[Self.targetKey(t.query)] = t }
        for b in c.pending { _ = apply(b) }
        rejectedWrites = c.rejected
        installIndexes(c.indexes)
    }

    /// The documents nothing needs: not pending, not in a target listened to, not shown by a
    /// listener. The cache limit drops them.
    func evictableDocuments() -> [ResourcePath] {
        var needed = Set(batchesByKey.keys)
        for t in targets.values {
            needed.formUnion(t.remoteKeys)
            if let k = t.query.documentKey { needed.insert(k) }
        }
        for s in listeners.values { for d in s.shown { needed.insert(d.key) } }
        return remote.keys.filter { !needed.contains($0) }
    }

    /// Drops documents nothing needs (the cache limit), and targets no listener uses; returns
    /// how many documents it dropped.
    mutating func evict() -> Int {
        evictionMayFree = false
        let victims = evictableDocuments()
        for key in victims {
            remote[key] = nil
            _ = recompute([key])
        }
        savedTargets = [:]
        return victims.count
    }
}

extension DocumentEngine {
    /// Which upkeep the last change makes due, if any (the caller holds the store's lock): an
    /// eviction when the store is over `limit` and something may be evictable, else a
    /// checkpoint once the records since the last one outweigh it (at least 50,000 records and
    /// 32 MiB) — writing the whole state then costs, amortized, a constant per byte written.
    func upkeepDue(storeBytes: Int64, checkpointBytes: Int, limit: Int64?) -> Maintenance.Job? {
        if let limit, storeBytes > limit, evictionMayFree { return .eviction }
        let since = records.sinceCheckpoint
        if since.records >= max(Firestore.checkpointRecords, remote.count + pending.count),
           since.bytes >= max(Firestore.checkpointBytesLimit, checkpointBytes) {
            return .checkpoint
        }
        return nil
    }
}

extension Firestore {
    /// Writes a checkpoint of the store's state (with `evicting`: after dropping what nothing
    /// needs; with `closing`: of a terminated store, when anything was written since the last),
    /// then deletes the log segments it covers. Runs under the upkeep's lock.
    func checkpoint(evicting: Bool = false, closing: Bool = false) async throws {
        guard let log else { return }
        try await maintenance.run {
            let snapshot = state.withLock { e -> DocumentCheckpoint? in
                if closing ? e.records.sinceCheckpoint.records == 0 : e.closed { return nil }
                if evicting { e.evictedLastRun = e.evict() }
                e.records.sinceCheckpoint = (0, 0)
                return DocumentCheckpoint(e, throughLSN: log.nextLSN.rawValue)
            }
            guard let snapshot else { return }
            do {
                // Everything the checkpoint holds is on disk first: an open then never finds the
                // log ending below the checkpoint.
                try await log.sync()
                let bytes = snapshot.encode()
                try log.writeSideFile(named: DocumentCheckpoint.fileName, contents: bytes)
                checkpointBytes.withLock { $0 = bytes.count }
                try await log.roll()
                try await log.deleteSegments(before: LSN(snapshot.throughLSN))
            } catch {
                throw FirestoreErrorCode(.dataLoss, "the checkpoint of \(path ?? "the store") failed: \(error)")
            }
        }
    }

    /// What ``DocumentEngine/upkeepDue(storeBytes:checkpointBytes:limit:)`` decides for the
    /// store now (the caller holds the store's lock).
    func upkeepDue(_ e: DocumentEngine) -> Maintenance.Job? {
        guard let log else { return nil }
        var limit: Int64?
        if case .persistent(let size) = settings.cacheSettings, size != FirestoreSettings.cacheSizeUnlimited { limit = size }
        let ckpt = checkpointBytes.withLock { $0 }
        return e.upkeepDue(storeBytes: log.segmentBytes + Int64(ckpt), checkpointBytes: ckpt, limit: limit)
    }

    /// Starts a due upkeep job in the background (a job already scheduled is not doubled).
    func startUpkeep(_ job: Maintenance.Job?) {
        guard let job else { return }
        maintenance.schedule(job) { [self] in
            try? await checkpoint(evicting: job == .eviction)
            return nil
        }
    }

    /// A checkpoint after this many records or bytes of records (at the least).
    static let checkpointRecords = 50_000
    static let checkpointBytesLimit = 32 << 20
}
