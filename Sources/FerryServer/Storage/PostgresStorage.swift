@_spi(Server) import Ferry
import FerryLog
import FerryWire
import Foundation
import Logging
import NIOCore
import PostgresNIO

/// A PostgreSQL database that several `ferry-server` processes share (`--postgres URL`).
///
/// The schema (created at start when missing; see `FORMAT.md`):
/// - `ferry_namespaces`: one row per namespace: its creation time (the epoch), its last commit
///   number and its version (one more per stored group, whatever the group wrote);
/// - `ferry_data`: one row per leaf of each namespace's data, keyed by its path (keys joined by
///   `/`, compared bytewise), so a write at a location and a read of a subtree touch the rows at
///   and below it only;
/// - `ferry_meta`: the clients' marks, the rules, the `onDisconnect` registrations and their
///   owners, one row each, with the version of the group that last wrote it (a removed one stays as null);
/// - `ferry_processes`: each server process's lease;
/// - `ferry_commits`: the numbered commit log, each commit's locations and new values, which
///   other processes read to follow (the newest are kept; a process further behind reads the
///   data whole).
///
/// Each group of writes is one transaction that first locks the namespace's row, so groups of
/// all processes are applied one after another, each decided against every commit before it.
/// The transaction ends with a notification on ``channel`` naming the namespace: the other
/// processes read what they missed (a notification lost costs latency only: every group, read
/// and new stream first reads what the namespace's version says is missing).
///
/// Each process holds a lease (`ferry_processes`), renewed a few times per lease; the
/// `onDisconnect` registrations of a client name the process that took them
/// (`meta/owners/STORE`). When a lease expires (its process died), another process runs those
/// registrations: once, since each run is a write decided under the namespace's lock against
/// every commit before it, and a run leaves nothing to run again.
public final class PostgresBackend: Sendable {
    let client: PostgresClient
    let logger: Logger
    /// The notification channel of commits: its payload is the namespace's name, its version
    /// and its last commit number, separated by spaces.
    static let channel = "ferry_commits"
    /// The schema's version (`ferry_schema`).
    static let schemaVersion = 1
    private let tasks = FerryMutex<[Task<Void, Never>]>([])
    /// The namespaces this process serves, told when another process commits to them.
    private let watchers = FerryMutex<[String: @Sendable (_ version: Int64?) -> Void]>([:])
    /// This process's name in `ferry_processes`.
    public let processID = UUID().uuidString.lowercased()
    /// How long a lease lasts without being renewed.
    let leaseSeconds: Int
    /// Told the clients (by namespace) whose registrations' process is gone.
    private let orphans = FerryMutex<(@Sendable (_ namespace: String, _ clients: [String]) -> Void)?>(nil)

    /// A backend for the database at `url`: `postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE`,
    /// optionally with `?sslmode=disable|prefer|require` (default: prefer).
    ///
    /// `leaseSeconds`: how long after this process stops renewing its lease (it died) another
    /// process runs the `onDisconnect` registrations of its clients (the presence timeout).
    public init(url: String, leaseSeconds: Int = 60, logger: Logger) throws {
        guard let u = URLComponents(string: url), u.scheme == "postgres" || u.scheme == "postgresql",
              let host = u.host, !host.isEmpty, let user = u.user, !user.isEmpty else {
            throw PostgresBackendError("the PostgreSQL address must read postgres://USER[:PASSWORD]@HOST[:PORT]/DATABASE")
        }
        let database = u.path.hasPrefix("/") ? String(u.path.dropFirst()) : u.path
        let tls: PostgresClient.Configuration.TLS
        switch u.queryItems?.first(where: { $0.name == "sslmode" })?.value ?? "prefer" {
        case "disable": tls = .disable
        case "prefer": tls = .prefer(.makeClientConfiguration())
        case "require": tls = .require(.makeClientConfiguration())
        case let other: throw PostgresBackendError("sslmode \(other) is not one of disable, prefer, require")
        }
        var config = PostgresClient.Configuration(host: host, port: u.port ?? 5432, username: user, password: u.password,
                                                  database: database.isEmpty ? user : database, tls: tls)
        config.options.connectTimeout = .seconds(5)
        config.options.maximumConnections = 16
        self.logger = logger
        self.leaseSeconds = max(1, leaseSeconds)
        client = PostgresClient(configuration: config, backgroundLogger: logger)
    }

    /// Connects, creates the schema when missing, takes this process's lease, and listens for
    /// other processes' commits.
    public func start() async throws {
        let client = self.client
        tasks.withLock { $0.append(Task { await client.run() }) }
        try await prepareSchema()
        try await renewLease()  // (before any registration names this process)
        tasks.withLock { $0.append(Task { [self] in await listen() }) }
        tasks.withLock { $0.append(Task { [self] in await keepLease() }) }
    }

    /// Takes or renews this process's lease.
    private func renewLease() async throws {
        try await client.query("""
            INSERT INTO ferry_processes (id, expires) VALUES (\(processID), now() + make_interval(secs => \(Double(leaseSeconds))))
            ON CONFLICT (id) DO UPDATE SET expires = excluded.expires
            """, logger: logger)
    }

    /// `found` is told, by namespace, the clients whose registrations' process is gone.
    func onOrphans(_ found: @escaping @Sendable (_ namespace: String, _ clients: [String]) -> Void) {
        orphans.withLock { $0 = found }
    }

    /// Renews this process's lease a few times per lease; each time, finds the registrations
    /// of processes whose lease expired.
    private func keepLease() async {
        let seconds = Double(leaseSeconds)
        while !Task.isCancelled {
            do {
                try await renewLease()
                var found: [String: [String]] = [:]
                // (A process whose row is gone counts as gone too.)
                for try await (ns, client) in try await client.query("""
                    SELECT m.ns, substr(m.path, 13) FROM ferry_meta m LEFT JOIN ferry_processes p ON m.value = '"' || p.id || '"'
                    WHERE m.path LIKE 'meta/owners/%' AND m.value <> 'null' AND (p.id IS NULL OR p.expires < now())
                    """, logger: logger).decode((String, String).self) {
                    found[ns, default: []].append(client)
                }
                if !found.isEmpty, let tell = orphans.withLock({ $0 }) {
                    for (ns, clients) in found { tell(ns, clients) }
                }
                // (A process gone a day has no registrations left: each was run or taken over.)
                try await client.query("DELETE FROM ferry_processes WHERE expires < now() - interval '1 day'", logger: logger)
            } catch {
                if Task.isCancelled { return }
                logger.warning("renewing this process's lease failed (\(error)); trying again")
            }
            try? await Task.sleep(for: .seconds(max(0.5, seconds / 3)))
        }
    }

    /// Stops listening and closes the connections.
    public func shutdown() async {
        for t in tasks.withLock({ t in defer { t = [] }; return t }) { t.cancel() }
    }

    /// Creates the tables when missing (one process at a time: an advisory lock), and refuses a
    /// schema newer than this build's.
    private func prepareSchema() async throws {
        try await client.withConnection { conn in
            try await conn.query("BEGIN", logger: logger)
            do {
                try await conn.query("SELECT pg_advisory_xact_lock(7386411)", logger: logger)
                try await conn.query("CREATE TABLE IF NOT EXISTS ferry_schema (version integer NOT NULL)", logger: logger)
                var found: Int?
                for try await v in try await conn.query("SELECT version FROM ferry_schema", logger: logger).decode(Int.self) { found = v }
                if let found, found > Self.schemaVersion {
                    throw PostgresBackendError("the database's Ferry schema is version \(found); this ferry-server knows up to \(Self.schemaVersion)")
                }
                if found == nil {
                    try await conn.query("""
                        CREATE TABLE ferry_namespaces (
                            ns text COLLATE "C" PRIMARY KEY, created bigint NOT NULL,
                            commit bigint NOT NULL, version bigint NOT NULL)
                        """, logger: logger)
                    try await conn.query("""
                        CREATE TABLE ferry_data (
                            ns text COLLATE "C" NOT NULL, path text COLLATE "C" NOT NULL, value text NOT NULL,
                            PRIMARY KEY (ns, path))
                        """, logger: logger)
                    try await conn.query("""
                        CREATE TABLE ferry_meta (
                            ns text COLLATE "C" NOT NULL, path text COLLATE "C" NOT NULL, value text NOT NULL,
                            version bigint NOT NULL, PRIMARY KEY (ns, path))
                        """, logger: logger)
                    try await conn.query("CREATE INDEX ferry_meta_version ON ferry_meta (ns, version)", logger: logger)
                    try await conn.query("CREATE TABLE ferry_processes (id text PRIMARY KEY, expires timestamptz NOT NULL)", logger: logger)
                    try await conn.query("""
                        CREATE TABLE ferry_commits (
                            ns text COLLATE "C" NOT NULL, commit bigint NOT NULL, change text NOT NULL,
                            PRIMARY KEY (ns, commit))
                        """, logger: logger)
                    try await conn.query("INSERT INTO ferry_schema (version) VALUES (\(Self.schemaVersion))", logger: logger)
                }
                try await conn.query("COMMIT", logger: logger)
            } catch {
                _ = try? await conn.query("ROLLBACK", logger: logger)
                throw error
            }
        }
    }

    /// Listens for commits, on a connection of its own; when it was lost, every namespace
    /// reads what it missed once listening again.
    private func listen() async {
        var delay = Duration.milliseconds(50)
        while !Task.isCancelled {
            do {
                try await client.withConnection { conn in
                    try await conn.listen(on: Self.channel) { notes in
                        for watcher in watchers.withLock({ Array($0.values) }) { watcher(nil) }
                        for try await note in notes {
                            let words = note.payload.split(separator: " ")
                            guard let name = words.first else { continue }
                            watchers.withLock { $0[String(name)] }?(words.count > 1 ? Int64(words[1]) : nil)
                        }
                    }
                }
            } catch {
                if Task.isCancelled { return }
                logger.warning("listening for other processes' commits failed (\(error)); trying again")
            }
            try? await Task.sleep(for: delay)
            delay = min(delay * 2, .seconds(2))
        }
    }

    /// `onCommit` runs with the namespace's version when a process commits to the namespace
    /// `name`, and with nil when this one listens again after a lost connection.
    func watch(_ name: String, onCommit: @escaping @Sendable (_ version: Int64?) -> Void) {
        watchers.withLock { $0[name] = onCommit }
    }

    func unwatch(_ name: String) {
        _ = watchers.withLock { $0.removeValue(forKey: name) }
    }
}

/// What the PostgreSQL backend refuses (a bad address, a schema from a newer server).
public struct PostgresBackendError: Error, CustomStringConvertible {
    public var description: String
    init(_ description: String) { self.description = description }
}

/// One namespace in a ``PostgresBackend``.
final class PostgresStorage: NamespaceStorage {
    let name: String
    let backend: PostgresBackend
    /// How many of the newest commits the log keeps (at least a few thousand, so that a process
    /// a little behind reads commits, not the whole data).
    let keptCommits: Int64
    /// The last commit and version this process has read or written.
    private let known = FerryMutex<(commit: Int64, version: Int64)>((0, 0))

    init(name: String, backend: PostgresBackend, keptCommits: Int) {
        self.name = name
        self.backend = backend
        self.keptCommits = Int64(max(keptCommits, 4096))
    }

    var isShared: Bool { true }
    var processID: String? { backend.processID }
    private var logger: Logger { backend.logger }

    func open(historyLimits: (changes: Int, bytes: Int), logger: Logger) async throws -> StoredNamespace {
        let name = self.name
        let micros = Int64(Date().timeIntervalSince1970 * 1_000_000)
        return try await backend.client.withConnection { conn in
            try await conn.query("""
                INSERT INTO ferry_namespaces (ns, created, commit, version) VALUES (\(name), \(micros), 0, 0)
                ON CONFLICT (ns) DO NOTHING
                """, logger: logger)
            return try await Self.inSnapshot(conn, logger) {
                let (created, commit, version) = try await Self.head(conn, name, logger)
                var tree: Value = .null
                Self.insert(&tree, ["data"], try await Self.data(conn, name, logger))
                for try await (path, json) in try await conn.query("SELECT path, value FROM ferry_meta WHERE ns = \(name)", logger: logger)
                    .decode((String, String).self) {
                    let value = try Value(json: json)
                    if value != .null { Self.insert(&tree, Self.keys(path)[...], value) }
                }
                var history = CommitHistory(after: commit, maxChanges: historyLimits.changes, maxBytes: historyLimits.bytes)
                if historyLimits.changes > 0 {
                    let limit = Int64(historyLimits.changes)
                    let changes = try await Self.commits(conn, name, after: max(0, commit - limit), logger)
                    if let first = changes.first, first.commit == max(0, commit - limit) + 1, changes.last?.commit == commit {
                        history = CommitHistory(after: first.commit - 1, maxChanges: historyLimits.changes, maxBytes: historyLimits.bytes)
                        for c in changes { history.append(c, size: c.approximateBytes) }
                    }
                }
                known.withLock { $0 = (commit, version) }
                return StoredNamespace(tree: ValueTree.normalized(tree), commit: commit, epoch: String(created), history: history)
            }
        }
    }

    func group(_ decide: (MissedCommits?, any GroupWriter) async throws -> Void) async throws {
        let name = self.name, logger = self.logger, kept = keptCommits
        try await connection { conn in
            try await conn.query("BEGIN", logger: logger)
            do {
                var commit: Int64 = 0, version: Int64 = 0
                for try await (c, v) in try await conn.query("SELECT commit, version FROM ferry_namespaces WHERE ns = \(name) FOR UPDATE", logger: logger)
                    .decode((Int64, Int64).self) { (commit, version) = (c, v) }
                let was = known.withLock { $0 }
                let missed = version == was.version ? nil : try await Self.missed(conn, name, after: was, now: (commit, version), logger)
                let writer = Writer(conn: conn, name: name, version: version + 1, commit: commit, logger: logger)
                try await decide(missed, writer)
                if writer.wrote {
                    try await conn.query("UPDATE ferry_namespaces SET commit = \(writer.commit), version = \(version + 1) WHERE ns = \(name)", logger: logger)
                    // The oldest commits go now and then (not every group: that would be a delete each).
                    if writer.commit / 1024 != commit / 1024 {
                        try await conn.query("DELETE FROM ferry_commits WHERE ns = \(name) AND commit <= \(writer.commit - kept)", logger: logger)
                    }
                    try await conn.query("SELECT pg_notify(\(PostgresBackend.channel), \("\(name) \(version + 1) \(writer.commit)"))", logger: logger)
                }
                try await conn.query("COMMIT", logger: logger)
                known.withLock { $0 = writer.wrote ? (writer.commit, version + 1) : (commit, version) }
            } catch {
                _ = try? await conn.query("ROLLBACK", logger: logger)
                throw error
            }
        }
    }

    func catchUp() async throws -> MissedCommits? {
        let name = self.name, logger = self.logger
        return try await connection { conn in
            let was = known.withLock { $0 }
            guard try await Self.head(conn, name, logger).2 != was.version else { return nil }
            let (missed, version) = try await Self.inSnapshot(conn, logger) {
                let (_, commit, version) = try await Self.head(conn, name, logger)
                return (try await Self.missed(conn, name, after: was, now: (commit, version), logger), version)
            }
            // (Only once the snapshot ended well: a failed catch-up leaves nothing marked read.)
            known.withLock { $0 = (missed.commit, version) }
            return missed
        }
    }

    func watch(_ othersCommitted: @escaping @Sendable () -> Void) {
        backend.watch(name) { [self] version in
            // (Not for this process's own commits, nor what it read already.)
            if let version, version <= known.withLock({ $0.version }) { return }
            othersCommitted()
        }
    }

    func close() async {
        backend.unwatch(name)
    }

    /// Runs `body` on a connection of the pool. Cancelled (see `Namespace.withinStorageWait`),
    /// it stops waiting for a connection, or closes the one it has: a query the database does
    /// not answer then fails instead of waiting on.
    private func connection<T: Sendable>(_ body: (PostgresConnection) async throws -> T) async throws -> T {
        try await backend.client.withConnection { conn in
            try await withTaskCancellationHandler {
                try await body(conn)
            } onCancel: {
                let closing: EventLoopFuture<Void> = conn.close()
                _ = closing
            }
        }
    }

    // MARK: Reading

    /// Runs `body` in a read-only transaction that sees one snapshot.
    private static func inSnapshot<T>(_ conn: PostgresConnection, _ logger: Logger, _ body: () async throws -> T) async throws -> T {
        try await conn.query("BEGIN ISOLATION LEVEL REPEATABLE READ READ ONLY", logger: logger)
        do {
            let result = try await body()
            try await conn.query("COMMIT", logger: logger)
            return result
        } catch {
            _ = try? await conn.query("ROLLBACK", logger: logger)
            throw error
        }
    }

    /// The namespace's creation time, last commit and version.
    private static func head(_ conn: PostgresConnection, _ name: String, _ logger: Logger) async throws -> (Int64, Int64, Int64) {
        for try await row in try await conn.query("SELECT created, commit, version FROM ferry_namespaces WHERE ns = \(name)", logger: logger)
            .decode((Int64, Int64, Int64).self) { return row }
        throw PostgresBackendError("the namespace \(name) is not in the database")
    }

    /// The namespace's whole data.
    private static func data(_ conn: PostgresConnection, _ name: String, _ logger: Logger) async throws -> Value {
        var data: Value = .null
        for try await (path, json) in try await conn.query("SELECT path, value FROM ferry_data WHERE ns = \(name)", logger: logger)
            .decode((String, String).self) {
            insert(&data, keys(path)[...], try Value(json: json))
        }
        return ValueTree.normalized(data)
    }

    /// The commits after `after`, oldest first.
    private static func commits(_ conn: PostgresConnection, _ name: String, after: Int64, _ logger: Logger) async throws -> [Change] {
        var out: [Change] = []
        for try await (commit, text) in try await conn.query(
            "SELECT commit, change FROM ferry_commits WHERE ns = \(name) AND commit > \(after) ORDER BY commit", logger: logger)
            .decode((Int64, String).self) {
            out.append(try decode(text, commit: commit))
        }
        return out
    }

    /// What was committed after `was` up to `now`: the commits (or, when the log no longer holds
    /// them all, the data whole as one commit), and the other locations written since.
    private static func missed(_ conn: PostgresConnection, _ name: String, after was: (commit: Int64, version: Int64),
                               now: (commit: Int64, version: Int64), _ logger: Logger) async throws -> MissedCommits {
        var changes: [Change] = []
        if now.commit > was.commit {
            changes = try await commits(conn, name, after: was.commit, logger)
            if changes.first?.commit != was.commit + 1 || changes.last?.commit != now.commit {
                let data = try await self.data(conn, name, logger)
                changes = [Change(keys: [], parts: [.init(keys: [], old: nil, new: data)], isUpdate: false, commit: now.commit)]
            }
        }
        var meta: [String: Value] = [:]
        for try await (path, json) in try await conn.query(
            "SELECT path, value FROM ferry_meta WHERE ns = \(name) AND version > \(was.version)", logger: logger)
            .decode((String, String).self) {
            meta[path] = try Value(json: json)
        }
        return MissedCommits(changes: changes, meta: meta, commit: now.commit)
    }

    // MARK: Writing

    /// Writes each run of a group in the group's transaction: a few statements per run,
    /// whatever its size.
    private final class Writer: GroupWriter {
        let conn: PostgresConnection
        let name: String
        let version: Int64
        let logger: Logger
        /// The last commit written.
        private(set) var commit: Int64
        private(set) var wrote = false

        init(conn: PostgresConnection, name: String, version: Int64, commit: Int64, logger: Logger) {
            self.conn = conn
            self.name = name
            self.version = version
            self.commit = commit
            self.logger = logger
        }

        func store(_ entries: [String: Value], commits: ArraySlice<Change>) async throws {
            var exact: [String] = []  // (rows to delete: each written location and its ancestors)
            var prefixes: [String] = []  // (rows below these go too)
            var wholeData = false
            var leafPaths: [String] = [], leafValues: [String] = []
            var metaPaths: [String] = [], metaValues: [String] = []
            for (path, value) in entries {
                if path == "data" || path.hasPrefix("data/") {
                    let keys = PostgresStorage.keys(path).dropFirst()
                    if keys.isEmpty { wholeData = true } else {
                        var p = ""
                        for k in keys {
                            p += (p.isEmpty ? "" : "/") + k
                            exact.append(p)
                        }
                        prefixes.append(p)
                    }
                    PostgresStorage.leaves(value, at: keys.joined(separator: "/"), &leafPaths, &leafValues)
                } else if path != "meta/commit" {
                    metaPaths.append(path)
                    metaValues.append(value.json)
                }
            }
            let name = self.name
            if wholeData {
                try await conn.query("DELETE FROM ferry_data WHERE ns = \(name)", logger: logger)
            } else if !exact.isEmpty {
                try await conn.query("DELETE FROM ferry_data WHERE ns = \(name) AND path = ANY(\(exact))", logger: logger)
                // (One index range scan per location, whatever the table's statistics say: a plain
                // join was planned as a scan of the namespace's rows per location when they were
                // stale, 1.7 s instead of 30 ms for 1,000 locations.)
                try await conn.query("""
                    DELETE FROM ferry_data d USING (
                        SELECT below.path FROM unnest(\(prefixes)::text[]) AS p(prefix) CROSS JOIN LATERAL (
                            SELECT path FROM ferry_data WHERE ns = \(name)
                            AND path >= (p.prefix || '/') COLLATE "C" AND path < (p.prefix || '0') COLLATE "C" ORDER BY path) below
                    ) AS gone WHERE d.ns = \(name) AND d.path = gone.path
                    """, logger: logger)
            }
            if !leafPaths.isEmpty {
                try await conn.query("""
                    INSERT INTO ferry_data (ns, path, value) SELECT \(name), * FROM unnest(\(leafPaths)::text[], \(leafValues)::text[])
                    """, logger: logger)
            }
            if !metaPaths.isEmpty {
                try await conn.query("""
                    INSERT INTO ferry_meta (ns, path, value, version) SELECT \(name), p, v, \(version) FROM unnest(\(metaPaths)::text[], \(metaValues)::text[]) AS m(p, v)
                    ON CONFLICT (ns, path) DO UPDATE SET value = excluded.value, version = excluded.version
                    """, logger: logger)
            }
            if !commits.isEmpty {
                let numbers = commits.map(\.commit), texts = commits.map(PostgresStorage.encode)
                try await conn.query("""
                    INSERT INTO ferry_commits (ns, commit, change) SELECT \(name), * FROM unnest(\(numbers)::bigint[], \(texts)::text[])
                    """, logger: logger)
                commit = numbers.last!
            }
            wrote = true
        }
    }

    // MARK: Rows

    /// A stored path's keys (`a/b/c`; the empty path is the root).
    static func keys(_ path: String) -> [String] {
        path.isEmpty ? [] : path.split(separator: "/", omittingEmptySubsequences: false).map(String.init)
    }

    /// The rows of `value` at `path`: one per leaf (a value that is not an object, or a leaf
    /// with a priority, `{".value", ".priority"}`), its JSON keyed by its path.
    static func leaves(_ value: Value, at path: String, _ paths: inout [String], _ values: inout [String]) {
        if case .object(let o) = value, o[".value"] == nil {
            for (k, v) in o { leaves(v, at: path.isEmpty ? k : path + "/" + k, &paths, &values) }
        } else if value != .null {
            paths.append(path)
            values.append(value.json)
        }
    }

    /// Puts `leaf` at `keys` below `tree`, making the objects on the way (rows are read in no
    /// particular order; the tree is normalized once all are in).
    static func insert(_ tree: inout Value, _ keys: ArraySlice<String>, _ leaf: Value) {
        guard let first = keys.first else {
            tree = leaf
            return
        }
        var o: [String: Value] = [:]
        if case .object(let d) = tree { o = d }
        tree = .null  // (o is the only reference: it changes in place)
        var child = o.removeValue(forKey: first) ?? .null
        insert(&child, keys.dropFirst(), leaf)
        o[first] = child
        tree = .object(o)
    }

    /// A commit as the log keeps it: its location, whether it is an update, and each written
    /// location's keys (relative) and new value.
    static func encode(_ change: Change) -> String {
        Value.object([
            "k": .array(change.keys.map(Value.string)),
            "u": .bool(change.isUpdate),
            "p": .array(change.parts.map { .object(["k": .array($0.keys.map(Value.string)), "v": $0.new]) }),
        ]).json
    }

    static func decode(_ text: String, commit: Int64) throws -> Change {
        guard case .object(let o) = try Value(json: text), case .array(let k)? = o["k"], case .array(let parts)? = o["p"] else {
            throw PostgresBackendError("commit \(commit) in the log is not a commit")
        }
        func strings(_ a: [Value]) -> [String] { a.compactMap { if case .string(let s) = $0 { s } else { nil } } }
        return Change(keys: strings(k), parts: try parts.map { p in
            guard case .object(let po) = p, case .array(let pk)? = po["k"] else {
                throw PostgresBackendError("commit \(commit) in the log has a part that is not a location and a value")
            }
            return .init(keys: strings(pk), old: nil, new: po["v"] ?? .null)
        }, isUpdate: o["u"] == .bool(true), commit: commit)
    }
}
