#if canImport(Glibc)
import Glibc
#endif
import CLevelDB
import CSQLite
import Foundation

/// LevelDB through its C API: what Firebase's Apple SDKs persist to. Bench only.
final class LevelDB {
    let db: OpaquePointer
    let options: OpaquePointer
    let writeOptions: OpaquePointer
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
        readOptions = leveldb_readoptions_create()
    }

    func put(_ key: UnsafeRawBufferPointer, _ value: UnsafeRawBufferPointer) throws {
        var err: UnsafeMutablePointer<CChar>?
        leveldb_put(db, writeOptions, key.baseAddress!.assumingMemoryBound(to: CChar.self), key.count,
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
