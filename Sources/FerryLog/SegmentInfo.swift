/// One segment file as the log (or an inspection) sees it.
public struct SegmentInfo: Sendable, Equatable {
    /// The file name, relative to the store directory.
    public var name: String
    /// The segment's sequence number (names sort by it).
    public var seq: UInt64
    /// The LSN of the segment's first record.
    public var firstLSN: LSN
    /// The LSN after its last record (for the segment being written: after the last one written).
    public var nextLSN: LSN
    /// Bytes of the file that hold whole frames.
    public var size: Int64
    /// Whether the segment was closed for writing with a seal frame.
    public var sealed: Bool
    /// LSN → offset entries, one per ~64 KiB, for seeking.
    var index: [IndexEntry]

    init(scan: SegmentScan) {
        name = scan.name
        seq = scan.seq
        firstLSN = scan.firstLSN
        nextLSN = scan.nextLSN
        size = scan.validEnd
        sealed = scan.sealed
        index = scan.index
    }

    init(name: String, seq: UInt64, firstLSN: LSN, nextLSN: LSN, size: Int64, sealed: Bool, index: [IndexEntry]) {
        self.name = name
        self.seq = seq
        self.firstLSN = firstLSN
        self.nextLSN = nextLSN
        self.size = size
        self.sealed = sealed
        self.index = index
    }

    /// The offset of the frame to start at for `lsn`, and that frame's first LSN.
    func seek(to lsn: LSN) -> (offset: Int64, lsn: LSN) {
        var lo = 0, hi = index.count
        while lo < hi {
            let mid = (lo + hi) / 2
            if index[mid].lsn <= lsn { lo = mid + 1 } else { hi = mid }
        }
        if lo == 0 { return (Int64(LogFormat.segmentHeaderSize), firstLSN) }
        return (index[lo - 1].offset, index[lo - 1].lsn)
    }
}
