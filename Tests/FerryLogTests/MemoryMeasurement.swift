#if canImport(Glibc)
import Glibc
#endif
import CCRC32C

func crc32c(_ bytes: [UInt8]) -> UInt32 { ferry_crc32c(0, bytes, bytes.count) }

/// Runs a program to completion and returns its exit status and peak resident memory in bytes
/// (from `wait4`'s resource usage, for that child alone).
func runMeasuringMemory(_ executable: String, _ arguments: [String]) throws -> (status: Int32, maxRSS: Int) {
    var pid: pid_t = 0
    var fileActions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&fileActions)
    defer { posix_spawn_file_actions_destroy(&fileActions) }
    posix_spawn_file_actions_addopen(&fileActions, 1, "/dev/null", O_WRONLY, 0)
    posix_spawn_file_actions_addopen(&fileActions, 2, "/dev/null", O_WRONLY, 0)
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for a in argv { free(a) } }
    let rc = posix_spawn(&pid, executable, &fileActions, nil, argv, environ)
    guard rc == 0 else { throw SpawnError(code: rc) }
    var status: Int32 = 0
    var usage = rusage()
    while wait4(pid, &status, 0, &usage) < 0 && errno == EINTR {}
    let exitStatus = (status & 0x7f) == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
    return (exitStatus, Int(usage.ru_maxrss) * 1024)
}

struct SpawnError: Error { var code: Int32 }
