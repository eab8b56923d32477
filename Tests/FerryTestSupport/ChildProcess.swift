import FerryLog
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// Starting processes with `posix_spawn`. Foundation's `Process.run()` on Linux can crash the
/// process that calls it (an over-read in its scan of `/proc/self/fd`,
/// swift-corelibs-foundation#5472): a suite that starts hundreds of children in parallel met it.
enum Spawn {
    struct Failure: Error, CustomStringConvertible {
        var description: String
    }

    /// A pipe whose ends are closed in every child (a child's own end is duplicated onto its
    /// standard output or error, which is not).
    static func pipe() throws -> (read: Int32, write: Int32) {
        var fds: [Int32] = [0, 0]
        if let pipe2 {
            guard pipe2(&fds, O_CLOEXEC) == 0 else { throw Failure(description: "pipe2 failed: errno \(errno)") }
        } else {
            guard Glibc.pipe(&fds) == 0 else { throw Failure(description: "pipe failed: errno \(errno)") }
            for fd in fds { _ = fcntl(fd, F_SETFD, FD_CLOEXEC) }
        }
        return (fds[0], fds[1])
    }

    typealias Pipe2 = @convention(c) (UnsafeMutablePointer<Int32>, Int32) -> Int32
    /// glibc's `pipe2` (a GNU extension, not in Swift's Glibc module): the pipe is made with its
    /// ends closed on exec at once, so that no child started meanwhile inherits them.
    nonisolated(unsafe) static let pipe2: Pipe2? = {
        guard let symbol = dlsym(nil, "pipe2") else { return nil }
        return unsafeBitCast(symbol, to: Pipe2.self)
    }()

    typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    /// glibc's `posix_spawn_file_actions_addclosefrom_np` (2.34 and later; not in Swift's Glibc
    /// module), so that a child holds no descriptor of the tests but its three.
    nonisolated(unsafe) static let closeFrom: CloseFrom? = {
        guard let symbol = dlsym(nil, "posix_spawn_file_actions_addclosefrom_np") else { return nil }
        return unsafeBitCast(symbol, to: CloseFrom.self)
    }()

    /// Starts `executable` with `arguments` and `environment` (nil: this process's), its
    /// standard output on `stdout` and its standard error on `stderr` (nil: this process's).
    static func start(_ executable: String, _ arguments: [String], environment: [String: String]?,
                      stdout: Int32, stderr: Int32?) throws -> pid_t {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_adddup2(&actions, stdout, 1)
        if let stderr { posix_spawn_file_actions_adddup2(&actions, stderr, 2) }
        if let closeFrom { _ = closeFrom(&actions, 3) }
        let argv: [UnsafeMutablePointer<CChar>?] = ([executable] + arguments).map { strdup($0) } + [nil]
        defer { for a in argv { free(a) } }
        let env: [UnsafeMutablePointer<CChar>?] = (environment ?? ProcessInfo.processInfo.environment).map { strdup("\($0.key)=\($0.value)") } + [nil]
        defer { for e in env { free(e) } }
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, executable, &actions, nil, argv, env)
        guard rc == 0 else { throw Failure(description: "cannot start \(executable): \(String(cString: strerror(rc)))") }
        return pid
    }

    /// Reads `fd` to its end on a thread of its own, handing each chunk to `chunk`, then
    /// closes it and calls `ended`.
    static func drain(_ fd: Int32, _ chunk: @escaping @Sendable (UnsafeRawBufferPointer) -> Void, ended: @escaping @Sendable () -> Void) {
        Thread {
            var buffer = [UInt8](repeating: 0, count: 1 << 16)
            while true {
                let n = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
                if n < 0 && errno == EINTR { continue }
                if n <= 0 { break }
                buffer.withUnsafeBytes { chunk(UnsafeRawBufferPointer(rebasing: $0[0..<n])) }
            }
            close(fd)
            ended()
        }.start()
    }

    /// How a wait status says the process ended: its exit status, or the signal that ended it.
    static func outcome(_ status: Int32) -> (status: Int32, signalled: Bool) {
        let signal = status & 0x7f
        return signal == 0 ? ((status >> 8) & 0xff, false) : (signal, true)
    }
}

/// A child process whose standard output is read line by line while it runs.
public final class ChildProcess: Sendable {
    private struct Output {
        var buffer = Data()
        var lines: [String] = []
        /// The pipe reached its end: every process holding its write end (the child) closed
        /// it, so every line the child printed is in `lines`.
        var ended = false
    }

    /// What the pipe's reader shares with the waiters.
    private final class Reader: Sendable {
        let state = FerryMutex(Output())
        /// Signalled once the pipe reaches its end.
        let ended = DispatchSemaphore(value: 0)
    }

    private let reader = Reader()
    /// How the child ended, once it has been waited for.
    private let outcome = FerryMutex<(status: Int32, signalled: Bool)?>(nil)
    public let pid: Int32

    /// Starts `executable`; `environment` is added to this process's environment (a crash
    /// test arms a ``CrashPoint`` in the child with `FERRY_CRASH_AT`).
    public init(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws {
        let (r, w) = try Spawn.pipe()
        let env = environment.isEmpty ? nil : ProcessInfo.processInfo.environment.merging(environment) { $1 }
        do {
            pid = try Spawn.start(executable, arguments, environment: env, stdout: w, stderr: nil)
        } catch {
            close(r)
            close(w)
            throw error
        }
        close(w)
        let reader = reader
        Spawn.drain(r, { bytes in
            reader.state.withLock { o in
                o.buffer.append(contentsOf: bytes)
                while let nl = o.buffer.firstIndex(of: 0x0A) {
                    o.lines.append(String(decoding: o.buffer[o.buffer.startIndex..<nl], as: UTF8.self))
                    o.buffer.removeSubrange(o.buffer.startIndex...nl)
                }
            }
        }, ended: {
            reader.state.withLock { $0.ended = true }
            reader.ended.signal()
        })
    }

    /// How the child ended, waiting for it if `blocking`; nil while it runs.
    private func reap(blocking: Bool) -> (status: Int32, signalled: Bool)? {
        if let known = outcome.withLock({ $0 }) { return known }
        var status: Int32 = 0
        var r: pid_t
        repeat { r = waitpid(pid, &status, blocking ? 0 : WNOHANG) } while r < 0 && errno == EINTR
        if r == pid {
            let ended = Spawn.outcome(status)
            outcome.withLock { $0 = ended }
            return ended
        }
        guard r < 0 else { return nil }  // (0: still running)
        // ECHILD: another thread's wait took it and is recording how it ended.
        while true {
            if let known = outcome.withLock({ $0 }) { return known }
            if !blocking { return nil }
            sched_yield()
        }
    }

    /// Complete lines printed so far. (A partial last line is left out: one cut by a kill was
    /// never a complete acknowledgement.)
    public var outputLines: [String] { reader.state.withLock { $0.lines } }

    /// Waits until a line satisfying `match` appears; false if the child's output ended
    /// without one, or `timeout` seconds passed.
    public func waitForLine(timeout: Double = 30, _ match: (String) -> Bool) -> Bool {
        var found = false
        _ = eventuallyOnThisThread(timeout: .seconds(timeout)) {
            let (lines, ended) = reader.state.withLock { ($0.lines, $0.ended) }
            found = lines.contains(where: match)
            return found || ended  // (once the output ended, no line will come)
        }
        return found
    }

    /// Waits until the child's output has ended — the child and whatever it shared its output
    /// with are gone, and every line it printed is in ``outputLines``; false if `timeout`
    /// seconds passed first.
    @discardableResult
    public func waitForOutputEnd(timeout: Double = 30) -> Bool {
        if reader.state.withLock({ $0.ended }) { return true }
        guard reader.ended.wait(timeout: .now() + timeout) == .success else { return false }
        reader.ended.signal()  // (for a later waiter)
        return true
    }

    /// Waits up to `timeout` seconds for the process to end by itself; true if it did.
    public func waitForExit(timeout: Double) -> Bool {
        eventuallyOnThisThread(timeout: .seconds(timeout)) { reap(blocking: false) != nil }
    }

    /// How the process ended: true when a signal ended it (SIGKILL from ``kill9()`` or a crash
    /// point), false for a normal exit. Only meaningful once it has ended.
    public var wasKilled: Bool { reap(blocking: false)?.signalled ?? false }

    /// Sends SIGKILL (unless the process has already ended) and waits for the process to end
    /// and for its output to be read to the end; returns the lines it printed.
    @discardableResult
    public func kill9() -> [String] {
        if reap(blocking: false) == nil { kill(pid, SIGKILL) }
        _ = reap(blocking: true)
        waitForOutputEnd()
        return outputLines
    }

    /// Waits for the process to end and for its output to be read to the end (``outputLines``
    /// then holds every line it printed); returns the exit status (the signal's number when a
    /// signal ended it).
    public func wait() -> Int32 {
        let ended = reap(blocking: true)
        waitForOutputEnd()
        return ended?.status ?? -1
    }
}

/// Runs a command to completion and captures its output.
public struct CommandResult: Sendable {
    public var status: Int32
    public var stdout: String
    public var stderr: String
}

/// Runs `executable` with `arguments`; `environment` adds to (or overrides) this process's.
public func run(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws -> CommandResult {
    let out = try Spawn.pipe()
    let err: (read: Int32, write: Int32)
    do { err = try Spawn.pipe() } catch { close(out.read); close(out.write); throw error }
    let env = environment.isEmpty ? nil : ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
    let pid: pid_t
    do {
        pid = try Spawn.start(executable, arguments, environment: env, stdout: out.write, stderr: err.write)
    } catch {
        for fd in [out.read, out.write, err.read, err.write] { close(fd) }
        throw error
    }
    close(out.write)
    close(err.write)
    // Both pipes are read to their ends before the wait, so a large output cannot block the child.
    let collected = FerryMutex((out: Data(), err: Data()))
    let done = DispatchGroup()
    for (fd, isOut) in [(out.read, true), (err.read, false)] {
        done.enter()
        Spawn.drain(fd, { bytes in collected.withLock { if isOut { $0.out.append(contentsOf: bytes) } else { $0.err.append(contentsOf: bytes) } } },
                    ended: { done.leave() })
    }
    done.wait()
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let (outData, errData) = collected.withLock { ($0.out, $0.err) }
    return CommandResult(status: Spawn.outcome(status).status, stdout: String(decoding: outData, as: UTF8.self),
                         stderr: String(decoding: errData, as: UTF8.self))
}
