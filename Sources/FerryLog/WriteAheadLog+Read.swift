extension WriteAheadLog {
    /// Calls `body` for every record from `start` through `end` (inclusive), in LSN order,
    /// including records appended while the iteration runs, up to the end written when it
    /// reaches it. Every frame's checksums are verified as it is read.
    ///
    /// - Parameters:
    ///   - start: the first LSN wanted; nil for the oldest kept (``firstLSN``).
    ///   - end: the last LSN wanted; nil for everything written.
    ///   - body: receives each record; its payload is valid only during the call.
    /// - Throws: ``LogError`` — ``LogError/Code/recordsUnavailable`` when `start` is below
    ///   ``firstLSN`` or a segment is deleted while being read, ``LogError/Code/corruption``
    ///   naming file and offset, or whatever `body` throws.
    public func forEachRecord(from start: LSN? = nil, through end: LSN? = nil, _ body: (RecordView) throws -> Void) throws {
        var next = start ?? firstLSN
        let last = end ?? LSN(UInt64.max - 1)
        while next <= last {
            let (segments, first, written) = shared.withLock { s in (s.segments, s.firstLSN, s.writtenLSN) }
            guard next >= first else {
                throw LogError(.recordsUnavailable, "records before LSN \(first) were deleted (asked for \(next))", file: path)
            }
            guard next < written else { return }
            let reached = try SegmentReading.read(directory, segments: segments, from: next, through: min(last, written - 1), body)
            guard reached > next else { return }
            next = reached
        }
    }

    /// Owned copies of the records from `start` through `end` (see ``forEachRecord(from:through:_:)``).
    public func records(from start: LSN? = nil, through end: LSN? = nil) throws -> [LogRecord] {
        var out: [LogRecord] = []
        try forEachRecord(from: start, through: end) { out.append($0.record) }
        return out
    }
}
