import CCRC32C
import FerryLog

/// A checkpoint: the stored state at an LSN — the server cache, the pending writes and their
/// overlay — as references into the log (values stay in the log's records). Written beside
/// the log as a side file; the newest one that checks out bounds the replay of the next open.
/// See FORMAT.md ("Checkpoints").
enum Checkpoint {
    static let prefix = "checkpoint-"
    static let magic = Array("FERRYCKP".utf8)
    static let version: UInt16 = 1

    static func fileName(_ lsn: UInt64) -> String {
        let h = String(lsn, radix: 16)
        return prefix + String(repeating: "0", count: max(0, 16 - h.count)) + h + ".ckp"
    }

    static func lsn(of name: String) -> UInt64? {
        guard name.hasPrefix(prefix), name.hasSuffix(".ckp") else { return nil }
        return UInt64(name.dropFirst(prefix.count).dropLast(4), radix: 16)
    }
}

extension Engine {
    func checkpointBytes(storeID: StoreID, nextLSN: UInt64) -> [UInt8] {
        var w = ByteWriter(capacity: 64 + (server.count + 2 * writeTree.pendingCount) * 40)
        w.bytes.append(contentsOf: Checkpoint.magic)
        withUnsafeBytes(of: Checkpoint.version.littleEndian) { w.bytes.append(contentsOf: $0) }
        w.bytes.append(contentsOf: [0, 0, 0, 0, 0, 0])
        withUnsafeBytes(of: storeID.high.littleEndian) { w.bytes.append(contentsOf: $0) }
        withUnsafeBytes(of: storeID.low.littleEndian) { w.bytes.append(contentsOf: $0) }
        withUnsafeBytes(of: nextLSN.littleEndian) { w.bytes.append(contentsOf: $0) }
        func entries(_ index: LayeredIndex) {
            w.varint(UInt64(index.count))
            index.forEach { key, e in
                precondition(!e.isInline, "only stored values are checkpointed")
                let ref = e.ref
                w.varint(UInt64(key.count))
                w.bytes.append(contentsOf: key)
                w.u8(e.isEmpty ? 1 : 0)
                w.varint(ref.lsn)
                w.varint(UInt64(ref.offset))
                w.varint(UInt64(ref.length))
            }
        }
        entries(server)
        let pending = writeTree.pending
        w.varint(UInt64(pending.count))
        for i in 0..<pending.count {
            w.signed(pending.ids[i])
            w.u8((pending.isOverwrite(at: i) ? PendingList.overwriteFlag : 0) | (pending.isVisible(at: i) ? PendingList.visibleFlag : 0))
            let key = PathKey.encode(pending.path(at: i))
            w.varint(UInt64(key.count))
            w.bytes.append(contentsOf: key)
        }
        entries(writeTree.overlay)
        let crc = w.bytes.withUnsafeBytes { ferry_crc32c(0, $0.baseAddress, $0.count) }
        withUnsafeBytes(of: crc.littleEndian) { w.bytes.append(contentsOf: $0) }
        return w.bytes
    }

    /// Loads the newest checkpoint that checks out; returns the LSN replay starts at (the
    /// first record after it, or the log's first record without one). A damaged or foreign
    /// checkpoint is skipped with a warning: the log still holds everything.
    func loadLatestCheckpoint() throws -> UInt64 {
        guard let log else { return 1 }
        let names = (try log.sideFiles(withPrefix: Checkpoint.prefix)).compactMap { n in Checkpoint.lsn(of: n).map { (n, $0) } }
        for (name, lsn) in names.sorted(by: { $0.1 > $1.1 }) {
            do {
                guard let bytes = try log.readSideFile(named: name) else { continue }
                try load(bytes, storeID: log.storeID, expectedLSN: lsn, log: log)
                checkpointLSN = lsn
                return lsn
            } catch {
                logger.warning("ignoring checkpoint \(name): \(error); replaying the log instead")
                server.removeAll()
                _ = writeTree.removeAllWrites()
            }
        }
        return log.firstLSN.rawValue
    }

    private func load(_ bytes: [UInt8], storeID: StoreID, expectedLSN: UInt64, log: WriteAheadLog) throws {
        try bytes.withUnsafeBytes { raw in
            guard raw.count >= 52 else { throw ByteReader.damaged("checkpoint too short") }
            let body = UnsafeRawBufferPointer(rebasing: raw[0..<(raw.count - 4)])
            let crc = raw.loadUnaligned(fromByteOffset: raw.count - 4, as: UInt32.self)
            guard ferry_crc32c(0, body.baseAddress, body.count) == UInt32(littleEndian: crc) else { throw ByteReader.damaged("checkpoint checksum mismatch") }
            guard Array(raw[0..<8]) == Checkpoint.magic else { throw ByteReader.damaged("not a checkpoint") }
            let version = UInt16(littleEndian: raw.loadUnaligned(fromByteOffset: 8, as: UInt16.self))
            guard version == Checkpoint.version else {
                throw DatabaseError(.storage, "checkpoint format version \(version) is not understood by this build")
            }
            let high = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 16, as: UInt64.self))
            let low = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 24, as: UInt64.self))
            guard StoreID(high: high, low: low) == storeID else { throw ByteReader.damaged("checkpoint of another store") }
            let next = UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: 32, as: UInt64.self))
            guard next == expectedLSN, next <= log.nextLSN.rawValue else { throw ByteReader.damaged("checkpoint LSN \(next) does not fit the log") }
            var r = ByteReader(body, offset: 40)
            let first = log.firstLSN.rawValue
            func entries(_ index: LayeredIndex) throws {
                let n = try r.varint()
                for _ in 0..<n {
                    let k = Int(try r.varint())
                    guard k <= r.bytes.count - r.offset else { throw ByteReader.damaged("checkpoint key too long") }
                    let key = Array(r.bytes[r.offset..<r.offset + k])
                    r.offset += k
                    let empty = try r.u8() != 0
                    let ref = ValueRef(lsn: try r.varint(), offset: UInt32(try r.varint()), length: UInt32(try r.varint()))
                    guard ref.length == 0 || (ref.lsn >= first && ref.lsn < next) else {
                        throw ByteReader.damaged("checkpoint refers to record \(ref.lsn), outside the log")
                    }
                    index.restore(ref, empty: empty, key: key)
                }
            }
            try entries(server)
            let pendingCount = try r.varint()
            var pending: [(Int64, UInt8, Path)] = []
            for _ in 0..<pendingCount {
                let id = try r.signed()
                let flags = try r.u8()
                let k = Int(try r.varint())
                guard k <= r.bytes.count - r.offset else { throw ByteReader.damaged("checkpoint path too long") }
                pending.append((id, flags, PathKey.decode(r.bytes[r.offset..<r.offset + k])))
                r.offset += k
            }
            let overlay = LayeredIndex()
            try entries(overlay)
            writeTree.restore(pending: pending, overlay: overlay)
            guard r.atEnd else { throw ByteReader.damaged("trailing bytes in a checkpoint") }
        }
    }
}
