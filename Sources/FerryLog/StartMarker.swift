/// The `log-start` file: which segment the log starts at after older ones were deleted.
///
/// Written (atomically) before segments are deleted, so that a segment missing from the front
/// of the log is told apart from one deleted on purpose, and an interrupted deletion is finished
/// on the next open.
struct StartMarker: Equatable, Sendable {
    var storeID: StoreID
    var seq: UInt64
    var firstLSN: LSN

    var bytes: [UInt8] {
        [UInt8](unsafeUninitializedCapacity: LogFormat.startFileSize) { b, n in
            let p = UnsafeMutableRawPointer(b.baseAddress!)
            p.initializeMemory(as: UInt8.self, repeating: 0, count: LogFormat.startFileSize)
            LogFormat.startMagic.withUnsafeBytes { p.copyMemory(from: $0.baseAddress!, byteCount: 8) }
            p.storeLE(LogFormat.version, at: 8)
            p.storeLE(UInt16(LogFormat.startFileSize), at: 10)
            p.storeLE(storeID.high, at: 16)
            p.storeLE(storeID.low, at: 24)
            p.storeLE(seq, at: 32)
            p.storeLE(firstLSN.rawValue, at: 40)
            p.storeLE(CRC32C.checksum(UnsafeRawPointer(p), count: 60), at: 60)
            n = LogFormat.startFileSize
        }
    }

    enum Decoded {
        case valid(StartMarker)
        case unsupported(String)
        /// Damaged: why, and the offset in the file of the byte found wrong.
        case corrupt(String, offset: Int = 0)
    }

    static func decode(_ bytes: [UInt8]) -> Decoded {
        guard bytes.count == LogFormat.startFileSize else { return .corrupt("log-start is \(bytes.count) bytes, not \(LogFormat.startFileSize)") }
        return bytes.withUnsafeBytes { b in
            let p = b.baseAddress!
            guard LogFormat.startMagic.withUnsafeBytes({ memcmpEqual($0.baseAddress!, p, 8) }) else { return .corrupt("bad log-start magic") }
            let version: UInt16 = p.le(8)
            if version > LogFormat.version { return .unsupported("log-start format version \(version); this build reads version \(LogFormat.version)") }
            guard CRC32C.checksum(p, count: 60) == p.le(60, as: UInt32.self) else { return .corrupt("log-start checksum mismatch") }
            guard version == LogFormat.version else { return .corrupt("log-start format version \(version) is not valid", offset: 8) }
            let size: UInt16 = p.le(10)
            guard size == UInt16(LogFormat.startFileSize) else {
                return .unsupported("log-start size \(size) not understood by this build")
            }
            if let at = firstNonZero(p, 12..<16) ?? firstNonZero(p, 48..<60) {
                return .corrupt("reserved byte \(at) of log-start is not zero", offset: at)
            }
            return .valid(StartMarker(storeID: StoreID(high: p.le(16), low: p.le(24)), seq: p.le(32), firstLSN: LSN(p.le(40))))
        }
    }
}
