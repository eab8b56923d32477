import FerryLog
import FerryStore

/// What runs the engine, as the upkeep sees it: the engine behind its lock, the log, the one
/// ``Maintenance`` owner and the settings it follows. The `Database` is the host; the protocol
/// is the upkeep's own, so that this folder works on the engine without depending on the
/// public types above it.
protocol EngineHost: AnyObject, Sendable {
    /// Runs `body` with the engine under its lock (see `Database.withEngine(_:)`: observers
    /// of a database that stopped during it are ended once the lock is released).
    func withEngine<R, E: Error>(_ body: (inout sending Engine) throws(E) -> sending R) throws(E) -> sending R
    /// The log, or nil for a memory-only database.
    var log: WriteAheadLog? { get }
    /// The one owner of checkpoints, compaction and eviction.
    var maintenance: Maintenance { get }
    /// What the upkeep follows of the database's options.
    var upkeep: UpkeepSettings { get }
    /// Starts the rebuilds of listened indexes that a change made due, outside the lock.
    func scheduleIndexRebuilds()
}
