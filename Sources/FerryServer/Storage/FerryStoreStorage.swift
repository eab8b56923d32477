@_spi(Server) import Ferry
import FerryLog
import FerryWire
import Foundation
import Logging

/// A namespace kept in a Ferry store on this machine (the default): data under `/data`,
/// per-client marks under `/meta/clients/STORE`, rules under `/meta/rules`, registrations under
/// `/meta/presence/STORE`, the last commit number at `/meta/commit`. Each run of a group's
/// writes is one record, stored while the writes after it are decided; the group shares one
/// `fdatasync`. Only this process writes it.
final class FerryStoreStorage: NamespaceStorage {
    let directory: String
    private let db = FerryMutex<Database?>(nil)

    init(directory: String) { self.directory = directory }

    var isShared: Bool { false }
    var processID: String? { nil }

    private var database: Database {
        get throws {
            guard let db = db.withLock({ $0 }) else { throw NamespaceStorageClosed() }
            return db
        }
    }

    func open(historyLimits: (changes: Int, bytes: Int), logger: Logger) async throws -> StoredNamespace {
        try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
        var options = DatabaseOptions(durability: .none)  // each group is synced by ``group(_:)``
        // The server's store holds the truth, not a cache of it: nothing may be evicted.
        options.cacheSizeBytes = .unlimited
        options.logger = logger
        let db = try Database.open(at: directory, options: options)
        self.db.withLock { $0 = db }
        var stored: Value
        do {
            stored = try await db.root.getData().exportValue
        } catch let e as DatabaseError where e.code == .notCached {
            // A new store: a put at the root makes it complete, so later opens can read it.
            stored = ["meta": ["created": .int(Int64(Date().timeIntervalSince1970 * 1_000_000))]]
            try await db.applyServerPut(at: "", stored)
            try await db.sync()
        }
        let tree = ValueTree.normalized(stored)
        var commit: Int64 = 0
        if case .int(let n) = ValueTree.child(tree, ["meta", "commit"]) { commit = n }
        // The history as the store's log still holds it: streams resume across a restart.
        let recorded: [Database.RecordedServerData]
        do { recorded = try db.recentServerData(maxRecords: historyLimits.changes, maxBytes: historyLimits.bytes) } catch {
            logger.warning("its recent commits cannot be read from its store (\(error)); streams resuming from before this start get the whole data")
            recorded = []
        }
        let history = CommitHistory(recorded, through: commit, maxChanges: historyLimits.changes, maxBytes: historyLimits.bytes)
        return StoredNamespace(tree: tree, commit: commit, epoch: ValueTree.child(tree, ["meta", "created"]).json, history: history)
    }

    func group(_ decide: (MissedCommits?, any GroupWriter) async throws -> Void) async throws {
        let writer = Writer(db: try database)
        try await decide(nil, writer)
        try await writer.storing?.value
        if writer.storing != nil { try await writer.db.sync() }
    }

    func catchUp() async throws -> MissedCommits? { nil }

    func watch(_ othersCommitted: @escaping @Sendable () -> Void) {}

    func close() async {
        guard let db = db.withLock({ d in defer { d = nil }; return d }) else { return }
        do { try await db.close() } catch { Logger(label: "ferry-server").error("closing the store at \(directory) failed: \(error)") }
    }

    /// Stores each run as one merge record at the root, in order, while the next is decided.
    private final class Writer: GroupWriter {
        let db: Database
        var storing: Task<Void, any Error>?
        init(db: Database) { self.db = db }

        func store(_ entries: [String: Value], commits: ArraySlice<Change>) async throws {
            let (previous, db) = (storing, db)
            storing = Task {
                try await previous?.value
                try await db.applyServerMerge(at: "", entries)
            }
        }
    }
}
