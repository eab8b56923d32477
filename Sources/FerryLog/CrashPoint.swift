#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import Synchronization

/// Named places inside multi-step file operations (segment roll, checkpoint, compaction,
/// eviction) where a crash test can kill the process, to prove that a crash at that exact step
/// loses nothing.
///
/// Unarmed — the normal case — ``hit(_:)`` is one load of a constant. A test arms one point by
/// starting a child process with `FERRY_CRASH_AT=NAME` (the first hit kills) or
/// `FERRY_CRASH_AT=NAME:N` (the N-th hit kills); the process then sends itself `SIGKILL` there,
/// as a power-independent crash would stop it: nothing after the point runs, no buffers are
/// flushed by the process.
@_spi(Testing) public enum CrashPoint {
    private static let armed: (name: String, count: Int)? = {
        guard let raw = getenv("FERRY_CRASH_AT") else { return nil }
        let spec = String(cString: raw)
        guard !spec.isEmpty else { return nil }
        let parts = spec.split(separator: ":", maxSplits: 1)
        return (String(parts[0]), parts.count > 1 ? max(1, Int(parts[1]) ?? 1) : 1)
    }()
    private static let hits = Atomic<Int>(0)

    /// Kills the process here if this point is the armed one and its count is reached.
    @inline(__always)
    public static func hit(_ name: StaticString) {
        guard let armed else { return }
        check(name.description, armed)
    }

    private static func check(_ name: String, _ armed: (name: String, count: Int)) {
        guard name == armed.name else { return }
        let n = hits.add(1, ordering: .relaxed).newValue
        if n >= armed.count { kill(getpid(), SIGKILL) }
    }
}
