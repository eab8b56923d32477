import FerryLog
import Synchronization

/// Where a store's records become durable and its small side files live: the write-ahead log
/// (``LogMedium``) or memory (``MemoryMedium``). A data model asks its medium whether a record
/// is durable, for the store's id, to keep a side file or to close, the same way whichever
/// medium it has; a memory-only store's records are durable as soon as they are appended
/// (there is nothing more to wait for) and its side files last as long as the process.
///
/// What only a log has — segments to compact or evict, checkpoint files — is reached through
/// ``log``, which is nil in memory: a memory store gets its space back by sweeping the
/// records it no longer refers to instead (``RecordStore/sweep(keeping:)``).
package protocol StoreMedium: AnyObject, Sendable {
    /// The store's identity: the log's, or a random one for a store in memory.
    var storeID: StoreID { get }
    /// The log, or nil in memory.
    var log: WriteAheadLog? { get }
    /// The error that stopped the log, if one did (nil in memory); a check without waiting.
    var failure: LogError? { get }
    /// Whether a record is durable as soon as it is appended (in memory): a caller may then
    /// skip starting a task only to wait for it.
    var durableOnAppend: Bool { get }
    /// Waits for record `lsn` as the log's durability mode has writes wait: with `.fsync`,
    /// until it is on disk; with `.none` or `.interval`, not at all unless the log failed (in
    /// memory, never). Throws the log's error if it failed first.
    func awaitDurable(_ lsn: UInt64) async throws
    /// Returns once every record appended so far is durable.
    func sync() async throws
    /// A side file's contents, or nil when there is none.
    func readSideFile(named name: String) throws -> [UInt8]?
    /// Replaces a side file atomically (after a crash: the old contents or these).
    func writeSideFile(named name: String, contents: [UInt8]) throws
    /// Closes the medium once every record appended is durable.
    func close() async throws
}

/// Records kept in a ``FerryLog/WriteAheadLog``: durable once the log has synced them.
package final class LogMedium: StoreMedium {
    private let wal: WriteAheadLog

    package init(_ log: WriteAheadLog) { wal = log }

    package var log: WriteAheadLog? { wal }
    package var storeID: StoreID { wal.storeID }
    package var durableOnAppend: Bool { false }
    package var failure: LogError? { wal.failure }
    package func awaitDurable(_ lsn: UInt64) async throws { try await wal.awaitDurability(of: LSN(lsn)...LSN(lsn)) }
    package func sync() async throws { try await wal.sync() }
    package func readSideFile(named name: String) throws -> [UInt8]? { try wal.readSideFile(named: name) }
    package func writeSideFile(named name: String, contents: [UInt8]) throws { try wal.writeSideFile(named: name, contents: contents) }
    package func close() async throws { try await wal.close() }
}

/// Records kept in memory only: durable as soon as they are appended, side files in a
/// dictionary, and a random store id.
package final class MemoryMedium: StoreMedium {
    package let storeID: StoreID
    private let sideFiles = Mutex<[String: [UInt8]]>([:])

    package init() {
        var g = SystemRandomNumberGenerator()
        storeID = StoreID(high: g.next(), low: g.next())
    }

    package var log: WriteAheadLog? { nil }
    package var durableOnAppend: Bool { true }
    package var failure: LogError? { nil }
    package func awaitDurable(_ lsn: UInt64) async throws {}
    package func sync() async throws {}
    package func readSideFile(named name: String) throws -> [UInt8]? { sideFiles.withLock { $0[name] } }
    package func writeSideFile(named name: String, contents: [UInt8]) throws { sideFiles.withLock { $0[name] = contents } }
    package func close() async throws {}
}
