import FerryLog

/// What a data model plugs into the shared layer, beside its ``RecordModel`` (how its records
/// read to tools), its ``WriteLedger``, its ``LifeCycle`` and its ``Maintenance`` jobs:
/// the function that applies one of its records to its state in replay — at an open, for the
/// records after its checkpoint, and in tools rebuilding a state at an LSN. The live path
/// appends the same record and applies it through the same code (with listeners' events on
/// top), so that the state is always the replay of the log.
///
/// A model's checkpoint image (what it writes, and installs at an open before the replay) and
/// what its compaction and eviction carry forward are its own: they are written by its
/// maintenance jobs, which the shared ``Maintenance`` schedules.
package protocol DataModel {
    /// Applies one record in replay. Throws when the record cannot be applied (damaged, or
    /// not one of the model's kinds).
    mutating func replay(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) throws
}

/// A record a model could not replay, with where it is in the log.
package struct ReplayFailure: Error {
    /// The record's LSN and kind.
    package var lsn: UInt64
    package var kind: UInt8
    /// Its segment file and the offset of its frame (nil when the log cannot say).
    package var file: String?
    package var offset: Int64?
    /// Why the model refused it.
    package var underlying: any Error

    /// "file, offset N", or "?" when unknown.
    package var place: String { file.map { "\($0), offset \(offset.map(String.init) ?? "?")" } ?? "?" }
}

extension DataModel {
    /// Replays `log`'s records from `start` on into the model; stops at the first record the
    /// model refuses, with a ``ReplayFailure`` naming it, its segment and its offset.
    /// Errors of the log itself (a damaged frame) are thrown as they are.
    package mutating func replay(_ log: WriteAheadLog, from start: LSN) throws {
        try log.forEachRecord(from: max(start, log.firstLSN)) { r in
            do {
                try replay(kind: r.kind, lsn: r.lsn.rawValue, payload: r.payload)
            } catch {
                let place = log.location(of: r.lsn)
                throw ReplayFailure(lsn: r.lsn.rawValue, kind: r.kind, file: place?.file, offset: place?.frameOffset, underlying: error)
            }
        }
    }
}
