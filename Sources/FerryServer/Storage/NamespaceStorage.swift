@_spi(Server) import Ferry
import FerryWire
import Logging

/// What a namespace's storage holds when it is opened.
struct StoredNamespace {
    /// The data (below `data`).
    var data: Value
    /// Each client's de-duplication mark (`meta/clients/STORE`).
    var clients: [String: Value]
    /// The rules' text, when the namespace set its own (`meta/rules`).
    var rulesText: String?
    /// The number of the last commit.
    var commit: Int64
    /// Names the namespace's data and commits: see ``Namespace/epoch``.
    var epoch: String
    /// Each client's `onDisconnect` registrations, in order (`meta/presence/STORE`).
    var presence: [String: [Value]]
    /// The latest commits, for streams that resume.
    var history: CommitHistory
}

/// What other processes committed to a shared storage since this process last read it.
struct MissedCommits {
    /// The commits, oldest first: each with its new values (the values before are not known).
    var changes: [Change]
    /// The other locations written (`meta/clients/STORE`, `meta/rules`, `meta/presence/STORE`)
    /// and their values now (null: gone).
    var meta: [String: Value]
    /// The last commit: the storage's now.
    var commit: Int64
}

/// Where a group of writes goes while the writer decides it.
protocol GroupWriter: AnyObject {
    /// Stores a run of the group's writes: each location's value at the end of the run
    /// (`data`, `data/…`, `meta/…`, as ``FoldedMerge/entries(tree:)`` gives them), and the
    /// commits the run made, in order. May return before the bytes are stored; the group is
    /// durable only when ``NamespaceStorage/group(_:)`` returns.
    func store(_ entries: [String: Value], commits: ArraySlice<Change>) async throws
}

/// Where a namespace's data, commit numbers, clients' marks, rules and `onDisconnect`
/// registrations are kept: a Ferry store on this machine (``FerryStoreStorage``, the default), or
/// a PostgreSQL database that several `ferry-server` processes share (``PostgresStorage``).
///
/// The namespace keeps its tree in memory either way and its one writer decides each group of
/// writes against it; the storage makes a group durable as a whole, and — when it is shared —
/// hands the writer, before each group and whenever asked, what other processes committed since.
protocol NamespaceStorage: Sendable {
    /// Whether other processes write to the same storage: reads then ask for what they missed
    /// first (``catchUp()``).
    var isShared: Bool { get }

    /// This process, as a shared storage names it (the owner of the `onDisconnect`
    /// registrations of the clients it serves: see ``PostgresBackend``); nil when not shared.
    var processID: String? { get }

    /// Reads (creating, when new) what the namespace holds.
    func open(historyLimits: (changes: Int, bytes: Int), logger: Logger) async throws -> StoredNamespace

    /// Runs one group of writes: `decide` gets what other processes committed since this one last
    /// read (nil when nothing; to be applied before deciding) and a writer for the group's runs.
    /// Returns once the whole group is durable; throws when it is not (then none of it is, or —
    /// the storage's answer lost — all of it, which the next ``catchUp()`` hands back).
    func group(_ decide: (MissedCommits?, any GroupWriter) async throws -> Void) async throws

    /// What other processes committed since this one last read (nil when nothing).
    func catchUp() async throws -> MissedCommits?

    /// `othersCommitted` runs when another process may have committed something this one has
    /// not read (never, when the storage is not shared).
    func watch(_ othersCommitted: @escaping @Sendable () -> Void)

    /// Closes the storage (the namespace's writer has stopped).
    func close() async
}

extension StoredNamespace {
    /// What a namespace's stored locations (`data`, `meta/…`, the store's paths) hold: the
    /// clients' marks, rules and registrations read from the `meta` part of `tree`.
    init(tree: Value, commit: Int64, epoch: String, history: CommitHistory) {
        data = ValueTree.child(tree, ["data"])
        clients = [:]
        if case .object(let c) = ValueTree.child(tree, ["meta", "clients"]) { clients = c }
        rulesText = nil
        if case .string(let text) = ValueTree.child(tree, ["meta", "rules"]) { rulesText = text }
        presence = [:]
        if case .object(let p) = ValueTree.child(tree, ["meta", "presence"]) {
            for (client, list) in p {
                if let ops = StoredNamespace.presenceList(list) { presence[client] = ops }
            }
        }
        self.commit = commit
        self.epoch = epoch
        self.history = history
    }

    /// A client's registrations as stored (their JSON text; see ``Namespace/storedPresence(_:)``).
    static func presenceList(_ stored: Value) -> [Value]? {
        if case .string(let text) = stored, case .array(let ops)? = try? Value(json: text) { return ops }
        return nil
    }
}

/// A storage used when it is not open.
struct NamespaceStorageClosed: Error, CustomStringConvertible {
    var description: String { "the namespace's storage is not open" }
}
