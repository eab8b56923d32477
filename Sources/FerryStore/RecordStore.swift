import FerryLog

/// Where a data model's records live: the write-ahead log, or memory (a memory-only database,
/// or a tool replaying a log into an engine of its own). A model writes and reads the same
/// records either way; only their durability and how space comes back differ.
///
/// - **With a log**: records are enqueued in it; until the log has written one, its payload
///   is kept here too (a read cannot go to the log's files before), and forgotten once the log
///   has written it (``pruneWritten()``). Space comes back by compaction and eviction, which
///   delete the log's segments.
/// - **In memory**: every record is kept here, numbered from 1 as the log would number it;
///   space comes back by ``sweep(keeping:)``, which forgets the records the model no longer
///   refers to, once ``sweepIsDue``.
///
/// A value type: it lives inside the engine, under the engine's lock.
package struct RecordStore {
    /// The log, or nil for a store in memory.
    package let log: WriteAheadLog?
    /// Payloads of records the log has not written yet (in memory: every record kept), in LSN
    /// order.
    package private(set) var kept = RecordList()
    /// The batch ``append(kind:_:)`` fills, kept to reuse its buffer.
    private var batch = LogBatch(capacity: 1024)
    /// Records and payload bytes appended since ``pruneWritten()`` last looked at the log.
    private var appendedSincePrune = (records: 0, bytes: 0)
    /// In memory: the next record's LSN, and the bytes kept now and after the last sweep.
    private var nextMemoryLSN: UInt64 = 1
    private var memoryBytes = 0
    private var memoryBytesAfterSweep = 0
    /// Records and payload bytes appended since the last checkpoint (the checkpoint policy).
    package var sinceCheckpoint: (records: Int, bytes: Int) = (0, 0)

    package init(log: WriteAheadLog?) { self.log = log }

    /// Appends a record; returns its LSN. Throws the log's error (``FerryLog/LogError``).
    package mutating func append(kind: UInt8, _ payload: [UInt8]) throws -> UInt64 {
        guard let log else {
            let lsn = nextMemoryLSN
            nextMemoryLSN += 1
            kept.append((lsn, kind, payload))
            memoryBytes += payload.count + 32
            return lsn
        }
        // One batch reused (the log copies it), filled without a generic call.
        batch.removeAll(keepingCapacity: true)
        payload.withUnsafeBytes { batch.append(kind: kind, payload: $0) }
        let lsn = try log.enqueue(batch).lowerBound.rawValue
        kept.append((lsn, kind, payload))
        appendedSincePrune.records += 1
        appendedSincePrune.bytes += payload.count
        sinceCheckpoint.records += 1
        sinceCheckpoint.bytes += payload.count
        return lsn
    }

    /// Keeps a record read elsewhere (a tool replaying a log), so that values can refer to it.
    package mutating func keep(lsn: UInt64, kind: UInt8, payload: [UInt8]) {
        kept.append((lsn, kind, payload))
    }

    /// Calls `body` with record `lsn` read from the log (valid during the call only); a model
    /// looks in ``kept`` first (``RecordList/find(_:)``), then here.
    package func withLogRecord<R>(_ lsn: UInt64, _ body: (UInt8, UnsafeRawBufferPointer) throws -> R) throws -> R {
        guard let log else { throw RecordUnavailable(lsn: lsn) }
        return try log.withRecord(at: LSN(lsn)) { try body($0.kind, $0.payload) }
    }

    /// With a log: forgets the payloads it has written. It looks (the log's position is behind
    /// the log's lock) once per 64 records or 1 MiB appended, or at once with `now`: a written
    /// payload kept a little longer is read from here instead of from the log, the same bytes.
    package mutating func pruneWritten(now: Bool = false) {
        guard now || appendedSincePrune.records >= 64 || appendedSincePrune.bytes >= 1 << 20 else { return }
        appendedSincePrune = (0, 0)
        guard let log, let first = kept.first, first.lsn < log.writtenLSN.rawValue else { return }
        kept.removeAll(below: log.writtenLSN.rawValue)
    }

    /// In memory: whether the records kept have doubled since the last sweep (and hold at
    /// least 1 MiB), so that a sweep costs, amortized, O(1) per byte appended.
    package var sweepIsDue: Bool { log == nil && memoryBytes >= max(1 << 20, 2 * memoryBytesAfterSweep) }

    /// In memory: forgets every record not in `live` (what the model still refers to).
    package mutating func sweep(keeping live: Set<UInt64>) {
        guard log == nil else { return }
        kept.removeAll(keeping: { live.contains($0) })
        memoryBytes = kept.payloadBytes + 32 * kept.count
        memoryBytesAfterSweep = memoryBytes
    }

    /// In memory: the records kept and their payload bytes.
    package var memoryRecords: (count: Int, bytes: Int) { log == nil ? (kept.count, kept.payloadBytes) : (0, 0) }
}

/// A record a memory store no longer keeps (it was swept): the model referred to a record it
/// had let go of, which is a bug in the model, never a state of the data.
package struct RecordUnavailable: Error, Sendable, CustomStringConvertible {
    package var lsn: UInt64
    package var description: String { "record \(lsn) is not available" }
}
