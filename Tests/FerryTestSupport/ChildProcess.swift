import FerryLog
import Foundation

/// A child process whose standard output is read line by line while it runs.
public final class ChildProcess: @unchecked Sendable {
    // @unchecked: `process` and `output` are set up in `init` and not changed after; the
    // output read so far is behind `reader.state`.
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

    private let process = Process()
    private let output = Pipe()
    private let reader = Reader()

    /// Starts `executable`; `environment` is added to this process's environment (a crash
    /// test arms a ``CrashPoint`` in the child with `FERRY_CRASH_AT`).
    public init(_ executable: String, _ arguments: [String], environment: [String: String] = [:]) throws {
        process.executableURL = URL(fileURLWithPath: executable)
        process.arguments = arguments
        if !environment.isEmpty {
            process.environment = ProcessInfo.processInfo.environment.merging(environment) { $1 }
        }
        process.standardOutput = output
        process.standardError = FileHandle.standardError
        let reader = reader
        output.fileHandleForReading.readabilityHandler = { h in
            let d = h.availableData
            if d.isEmpty {  // the end of the pipe
                h.readabilityHandler = nil
                let first = reader.state.withLock { o in
                    defer { o.ended = true }
                    return !o.ended
                }
                if first { reader.ended.signal() }
                return
            }
            reader.state.withLock { o in
                o.buffer.append(d)
                while let nl = o.buffer.firstIndex(of: 0x0A) {
                    o.lines.append(String(decoding: o.buffer[o.buffer.startIndex..<nl], as: UTF8.self))
                    o.buffer.removeSubrange(o.buffer.startIndex...nl)
                }
            }
        }
        try process.run()
    }

    public var pid: Int32 { process.processIdentifier }

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
        eventuallyOnThisThread(timeout: .seconds(timeout)) { !process.isRunning }
    }

    /// How the process ended: true when a signal ended it (SIGKILL from ``kill9()`` or a crash
    /// point), false for a normal exit. Only meaningful once it has ended.
    public var wasKilled: Bool { process.terminationReason == .uncaughtSignal }

    /// Sends SIGKILL (unless the process has already ended) and waits for the process to end
    /// and for its output to be read to the end; returns the lines it printed.
    @discardableResult
    public func kill9() -> [String] {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        waitForOutputEnd()
        return outputLines
    }

    /// Waits for the process to end and for its output to be read to the end (``outputLines``
    /// then holds every line it printed); returns the exit status.
    public func wait() -> Int32 {
        process.waitUntilExit()
        waitForOutputEnd()
        return process.terminationStatus
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
    let p = Process()
    p.executableURL = URL(fileURLWithPath: executable)
    p.arguments = arguments
    if !environment.isEmpty {
        p.environment = ProcessInfo.processInfo.environment.merging(environment) { _, new in new }
    }
    let out = Pipe(), err = Pipe()
    p.standardOutput = out
    p.standardError = err
    try p.run()
    // Read both pipes fully before waiting, so a large output cannot block the child.
    let group = DispatchGroup()
    nonisolated(unsafe) var outData = Data(), errData = Data()
    group.enter()
    DispatchQueue.global().async { outData = out.fileHandleForReading.readDataToEndOfFile(); group.leave() }
    errData = err.fileHandleForReading.readDataToEndOfFile()
    group.wait()
    p.waitUntilExit()
    return CommandResult(status: p.terminationStatus, stdout: String(decoding: outData, as: UTF8.self),
                         stderr: String(decoding: errData, as: UTF8.self))
}
