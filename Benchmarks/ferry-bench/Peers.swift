#if canImport(Glibc)
import Glibc
#endif
import CLevelDB
import CSQLite
import Foundation

/// LevelDB through its C API: what Firebase's Apple SDKs persist to. Bench only.
final class LevelDB: @unchecked Sendable {
    let db: OpaquePointer
    let options: OpaquePointer
    let writeOptions: OpaquePointer
    let syncWriteOptions: OpaquePointer
    let readOptions: OpaquePointer

    init(path: String, sync: Bool = false) throws {
        options = leveldb_options_create()
        leveldb_options_set_create_if_missing(options, 1)
        var err: UnsafeMutablePointer<CChar>?
        guard let db = leveldb_open(options, path, &err) else {
            defer { leveldb_free(err) }
            throw BenchError("leveldb_open: \(err.map { String(cString: $0) } ?? "?")")
        }
        self.db = db
        writeOptions = leveldb_writeoptions_create()
        leveldb_writeoptions_set_sync(writeOptions, sync ? 1 : 0)
        syncWriteOptions = leveldb_writeoptions_create()
        leveldb_writeoptions_set_sync(syncWriteOptions, 1)
        readOptions = leveldb_readoptions_create()
    }

    /// A put; with `sync`, a durable one (it makes every earlier put durable too).
    func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer, sync: Bool = false) throws {
        var err: UnsafeMutablePointer<CChar>?
        leveldb_put(db, sync ? syncWriteOptions : writeOptions, key.baseAddress!.assumingMemoryBound(to: CChar.self), key.count,
                    value.baseAddress!.assumingMemoryBound(to: CChar.self), value.count, &err)
        if let err {
            defer { leveldb_free(err) }
            throw BenchError("leveldb_put: \(String(cString: err))")
        }
    }

    /// Reads every entry; returns the count and a checksum of the values' sizes.
    func scan() -> (count: Int, bytes: Int) {
        let it = leveldb_create_iterator(db, readOptions)!
        defer { leveldb_iter_destroy(it) }
        leveldb_iter_seek_to_first(it)
        var n = 0, bytes = 0
        while leveldb_iter_valid(it) != 0 {
            var klen = 0, vlen = 0
            _ = leveldb_iter_key(it, &klen)
            _ = leveldb_iter_value(it, &vlen)
            n += 1
            bytes += vlen
            leveldb_iter_next(it)
        }
        return (n, bytes)
    }

    func get(_ key: String) -> Int? {
        var len = 0
        var err: UnsafeMutablePointer<CChar>?
        guard let v = leveldb_get(db, readOptions, key, key.utf8.count, &len, &err) else { return nil }
        leveldb_free(v)
        return len
    }

    deinit {
        leveldb_close(db)
        leveldb_options_destroy(options)
        leveldb_writeoptions_destroy(writeOptions)
        leveldb_writeoptions_destroy(syncWriteOptions)
        leveldb_readoptions_destroy(readOptions)
    }
}

struct BenchError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// Runs this executable with `arguments` and returns what it printed.
func runChild(_ arguments: [String]) throws -> String {
    let me = CommandLine.arguments[0].hasPrefix("/") ? CommandLine.arguments[0]
        : FileManager.default.currentDirectoryPath + "/" + CommandLine.arguments[0]
    var pid: pid_t = 0
    var fileActions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&fileActions)
    defer { posix_spawn_file_actions_destroy(&fileActions) }
    let out = "/tmp/ferry-bench-child-\(getpid())-\(UInt32.random(in: 0...UInt32.max)).json"
    posix_spawn_file_actions_addopen(&fileActions, 1, out, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    let argv = ([me] + arguments).map { strdup($0) } + [nil]
    defer { for a in argv { free(a) } }
    guard posix_spawn(&pid, me, &fileActions, nil, argv, environ) == 0 else { throw BenchError("cannot start \(me)") }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    defer { unlink(out) }
    let text = (try? String(contentsOfFile: out, encoding: .utf8)) ?? ""
    guard (status & 0x7f) == 0, (status >> 8) & 0xff == 0 else { throw BenchError("child \(arguments) failed: \(text)") }
    return text
}

/// SQLite through its C API: what GRDB and Core Data store in. Bench only. One table of
/// (key, value), WAL journal; `synchronous=FULL` makes every commit durable (`fsync`).
final class SQLite: @unchecked Sendable {
    let db: OpaquePointer
    private var insert: OpaquePointer?

    init(path: String, durable: Bool = true) throws {
        var handle: OpaquePointer?
        guard sqlite3_open_v2(path, &handle, SQLITE_OPEN_READWRITE | SQLITE_OPEN_CREATE | SQLITE_OPEN_NOMUTEX, nil) == SQLITE_OK, let handle else {
            throw BenchError("sqlite3_open_v2 \(path) failed")
        }
        db = handle
        try exec("PRAGMA journal_mode=WAL")
        try exec("PRAGMA synchronous=\(durable ? "FULL" : "OFF")")
        try exec("CREATE TABLE IF NOT EXISTS kv (k TEXT PRIMARY KEY, v BLOB NOT NULL) WITHOUT ROWID")
        guard sqlite3_prepare_v2(db, "INSERT OR REPLACE INTO kv (k, v) VALUES (?1, ?2)", -1, &insert, nil) == SQLITE_OK else {
            throw BenchError("prepare: \(message)")
        }
    }

    var message: String { String(cString: sqlite3_errmsg(db)) }

    func exec(_ sql: String) throws {
        var err: UnsafeMutablePointer<CChar>?
        guard sqlite3_exec(db, sql, nil, nil, &err) == SQLITE_OK else {
            defer { sqlite3_free(err) }
            throw BenchError("\(sql): \(err.map { String(cString: $0) } ?? message)")
        }
    }

    /// One INSERT OR REPLACE (a commit of its own outside a transaction).
    func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) throws {
        sqlite3_bind_text(insert, 1, key.baseAddress!.assumingMemoryBound(to: CChar.self), Int32(key.count), nil)
        sqlite3_bind_blob(insert, 2, value.baseAddress!, Int32(value.count), nil)
        let rc = sqlite3_step(insert)
        sqlite3_reset(insert)
        guard rc == SQLITE_DONE else { throw BenchError("insert: \(message)") }
    }

    /// Reads every row; returns the count.
    func scan() throws -> Int {
        var stmt: OpaquePointer?
        guard sqlite3_prepare_v2(db, "SELECT k, v FROM kv", -1, &stmt, nil) == SQLITE_OK else { throw BenchError("select: \(message)") }
        defer { sqlite3_finalize(stmt) }
        var n = 0, bytes = 0
        while sqlite3_step(stmt) == SQLITE_ROW {
            _ = sqlite3_column_blob(stmt, 1)
            bytes += Int(sqlite3_column_bytes(stmt, 1))
            n += 1
        }
        precondition(bytes > 0 || n == 0)
        return n
    }

    deinit {
        sqlite3_finalize(insert)
        sqlite3_close_v2(db)
    }
}

extension LevelDB {
    /// Compacts the whole key range (what LevelDB's background compaction converges to).
    func compactAll() { leveldb_compact_range(db, nil, 0, nil, 0) }
}

/// The keys of the `n` values with the most likes (ties: the greater key), from JSON posts,
/// highest last — what a query `orderBy likes, limitToLast n` returns, for the peers.
struct TopByLikes {
    let n: Int
    private(set) var items: [(likes: Int64, key: String)] = []

    init(_ n: Int) { self.n = n }

    mutating func offer(key: String, json: UnsafeRawBufferPointer) {
        guard let likes = Self.likes(json) else { return }
        if items.count == n, let lowest = items.first, (likes, key) < (lowest.likes, lowest.key) { return }
        items.append((likes, key))
        items.sort { ($0.likes, $0.key) < ($1.likes, $1.key) }
        if items.count > n { items.removeFirst() }
    }

    var keys: [String] { items.map(\.key) }

    /// The integer after `"likes":` in a JSON object's text.
    static func likes(_ json: UnsafeRawBufferPointer) -> Int64? {
        let pattern = Array(#""likes":"#.utf8)
        guard json.count > pattern.count else { return nil }
        var i = 0
        while i + pattern.count <= json.count {
            if json[i] == pattern[0] && (0..<pattern.count).allSatisfy({ json[i + $0] == pattern[$0] }) {
                var j = i + pattern.count, v: Int64 = 0
                while j < json.count, json[j] >= 0x30, json[j] <= 0x39 { v = v * 10 + Int64(json[j] - 0x30); j += 1 }
                return v
            }
            i += 1
        }
        return nil
    }
}

extension LevelDB {
    /// A full scan keeping the top `n` posts by likes.
    func topByLikes(_ n: Int) -> [String] {
        let it = leveldb_create_iterator(db, readOptions)!
        defer { leveldb_iter_destroy(it) }
        leveldb_iter_seek_to_first(it)
        var top = TopByLikes(n)
        while leveldb_iter_valid(it) != 0 {
            var klen = 0, vlen = 0
            let k = leveldb_iter_key(it, &klen)!
            let v = leveldb_iter_value(it, &vlen)!
            top.offer(key: String(decoding: UnsafeRawBufferPointer(start: k, count: klen), as: UTF8.self),
                      json: UnsafeRawBufferPointer(start: v, count: vlen))
            leveldb_iter_next(it)
        }
        return top.keys
    }
}

extension SQLite {
    /// The top `n` posts by likes, as SQL asks for it (no index on likes: a full scan).
    func topByLikes(_ n: Int) throws -> [String] {
        var stmt: OpaquePointer?
        let sql = "SELECT k FROM kv ORDER BY json_extract(CAST(v AS TEXT), '$.likes') DESC, k DESC LIMIT \(n)"
        guard sqlite3_prepare_v2(db, sql, -1, &stmt, nil) == SQLITE_OK else { throw BenchError("select: \(message)") }
        defer { sqlite3_finalize(stmt) }
        var keys: [String] = []
        while sqlite3_step(stmt) == SQLITE_ROW {
            keys.append(String(cString: sqlite3_column_text(stmt, 0)))
        }
        return keys.reversed()
    }
}
