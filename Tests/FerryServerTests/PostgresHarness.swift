import FerryLog
import FerryTestSupport
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Where the `ferry-server`s a test starts keep their namespaces: in Ferry stores under their
/// data directory (nil, the default), or in this PostgreSQL database (``ServerProcess`` passes
/// it as `--postgres`), so a test written for the first runs as is in the second.
enum ServerBackend {
    @TaskLocal static var postgres: String?
}

/// A throw-away PostgreSQL cluster (`scripts/postgres.sh`) on loopback, stopped and removed when
/// the object goes.
final class TestPostgresCluster: Sendable {
    let directory: TemporaryDirectory
    /// The cluster's address (its database `postgres`).
    let url: String

    init(_ label: String) throws {
        directory = try TemporaryDirectory(label)
        let r = try run("/bin/bash", [TestPostgresCluster.script, "start", directory.sub("pg")])
        guard r.status == 0 else { throw HTTPTestError(message: "scripts/postgres.sh start failed: \(r.stderr)") }
        url = r.stdout.trimmingCharacters(in: .whitespacesAndNewlines)
    }

    static let script = Locations.packageRoot + "/scripts/postgres.sh"

    /// Stops the server (fast: open transactions are rolled back, connections cut).
    func stop() throws {
        let r = try run("/bin/bash", [TestPostgresCluster.script, "stop", directory.sub("pg")])
        guard r.status == 0 else { throw HTTPTestError(message: "scripts/postgres.sh stop failed: \(r.stderr)") }
    }

    /// Starts the stopped server again on its port.
    func restart() throws {
        let r = try run("/bin/bash", [TestPostgresCluster.script, "restart", directory.sub("pg")])
        guard r.status == 0 else { throw HTTPTestError(message: "scripts/postgres.sh restart failed: \(r.stderr)") }
    }

    /// Stops (SIGSTOP) or resumes (SIGCONT) every process of the server: a database that
    /// keeps its connections open and answers nothing.
    func signalAll(_ signal: String) throws {
        let pidFile = directory.sub("pg") + "/data/postmaster.pid"
        let r = try run("/bin/sh", ["-c", "p=$(head -1 '\(pidFile)'); kill -\(signal) $p $(pgrep -P $p)"])
        guard r.status == 0 else { throw HTTPTestError(message: "kill -\(signal) failed: \(r.stderr)") }
    }

    /// A new, empty database in the cluster: its address.
    func newDatabase() throws -> String { try TestPostgresCluster.newDatabase(in: url) }

    /// A new, empty database in the cluster at `url`: its address.
    static func newDatabase(in url: String) throws -> String {
        let name = "ferry_" + String(UInt64.random(in: 0...UInt64.max), radix: 36)
        _ = try query(url, "CREATE DATABASE \(name)")
        return url.replacingOccurrences(of: "/postgres?", with: "/\(name)?")
    }

    /// Runs one SQL statement; its rows, one per line, columns separated by `|`.
    static func query(_ url: String, _ sql: String) throws -> [String] {
        let r = try run("/usr/bin/env", ["psql", url, "-v", "ON_ERROR_STOP=1", "-Atc", sql])
        guard r.status == 0 else { throw HTTPTestError(message: "psql failed: \(r.stderr)") }
        return r.stdout.split(separator: "\n").map(String.init)
    }

    deinit { try? stop() }
}

/// The cluster the PostgreSQL tests share: the one `scripts/test.sh` started
/// (`FERRY_TEST_POSTGRES`), or one this test process starts, and stops when it exits.
enum TestPostgres {
    private static let shared: Result<String, HTTPTestError> = {
        if let url = ProcessInfo.processInfo.environment["FERRY_TEST_POSTGRES"], !url.isEmpty { return .success(url) }
        do {
            let cluster = try TestPostgresCluster("postgres-shared")
            own.withLock { $0 = cluster }
            atexit { TestPostgres.own.withLock { $0 = nil } }
            return .success(cluster.url)
        } catch {
            return .failure(HTTPTestError(message: "no PostgreSQL for the tests: \(error)"))
        }
    }()
    private static let own = FerryMutex<TestPostgresCluster?>(nil)

    /// A new, empty database in the shared cluster: its address.
    static func newDatabase() throws -> String { try TestPostgresCluster.newDatabase(in: try shared.get()) }
}
