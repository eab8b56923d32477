/// A read-only look at a store, for tools such as `ferry-dump`: it takes no lock and changes
/// nothing, so it works while another process has the store open (the newest segment's last
/// frame may then be reported as a torn tail until it is completely written).
public struct LogInspection: Sendable {
    /// One segment's figures.
    public struct Segment: Sendable {
        /// Name, sequence number, LSN range, readable size, sealed or not.
        public var info: SegmentInfo
        /// The file's size, including any torn tail and any zeros after the last frame.
        public var fileSize: Int64
        /// Bytes of zeros after the last frame: space the writer grew the file by ahead of its
        /// frames, which a seal or a close cuts off (a crash leaves it; it is not a problem).
        public var zeroTail: Int64
        /// Data frames read.
        public var dataFrames: Int
        /// Records in those frames.
        public var records: UInt64
        /// Bytes of frame bodies as stored (compressed) and before compression.
        public var storedBodyBytes: Int64
        public var rawBodyBytes: Int64
    }

    /// The store directory.
    public let path: String
    /// The store's id, from its headers (nil if none could be read).
    public let storeID: StoreID?
    /// Segments from the start of the log, oldest first.
    public let segments: [Segment]
    /// Every problem found, in log order.
    public let problems: [StoreProblem]
    /// Files that are not part of the log proper (temporary files, segments before the start).
    public let leftovers: [String]
    let directory: StoreDirectory

    /// Scans the store at `path`.
    /// - Parameter deep: also decompress every frame and check its records.
    public static func inspect(_ path: String, deep: Bool = true) throws -> LogInspection {
        let dir = StoreDirectory(path: path, system: .live)
        let scan = try StoreScan.scan(dir, deep: deep, resync: false)
        return LogInspection(
            path: path, storeID: scan.storeID,
            segments: scan.segments.map {
                Segment(info: SegmentInfo(scan: $0), fileSize: $0.fileSize, zeroTail: $0.zeroTail, dataFrames: $0.dataFrames, records: $0.records,
                        storedBodyBytes: $0.storedBodyBytes, rawBodyBytes: $0.rawBodyBytes)
            },
            problems: scan.problems, leftovers: scan.temporaryFiles + scan.obsolete, directory: dir)
    }

    /// Whether the directory at `path` holds a Ferry store: a `LOCK` file (every open creates
    /// one first), a segment or `log-start`. An empty directory, or one of unrelated files,
    /// does not — a tool should say so rather than report an empty log as sound.
    /// - Throws: ``LogError/Code/io`` when the directory cannot be listed.
    public static func containsStore(at path: String) throws -> Bool {
        try StoreDirectory(path: path, system: .live).list().contains { name in
            name == LogFormat.lockFileName || name == LogFormat.startFileName || LogFormat.parseSegmentName(name) != nil
        }
    }

    /// The first problem: what `ferry-dump verify` reports. Nil when the store is sound.
    public var firstProblem: StoreProblem? { problems.first }

    /// The LSN of the oldest record kept.
    public var firstLSN: LSN? { segments.first?.info.firstLSN }
    /// The LSN after the last readable record.
    public var nextLSN: LSN? { segments.last?.info.nextLSN }

    /// Calls `body` for each readable record from `start` through `end`.
    public func forEachRecord(from start: LSN = .first, through end: LSN? = nil, _ body: (RecordView) throws -> Void) throws {
        let infos = segments.map(\.info)
        guard let first = infos.first?.firstLSN else { return }
        _ = try SegmentReading.read(directory, segments: infos, from: max(start, first), through: end ?? LSN(UInt64.max - 1), body)
    }
}
