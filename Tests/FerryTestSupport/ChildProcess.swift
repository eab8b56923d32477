import Foundation

/// A child process whose standard output is read line by line while it runs.
public final class ChildProcess: @unchecked Sendable {
    // @unchecked: `lines` and `buffer` are only touched under `lock`.
    private let process = Process()
    private let output = Pipe()
    private let lock = NSLock()
    private var buffer = Data()
    private var lines: [String] = []

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
        output.fileHandleForReading.readabilityHandler = { [weak self] h in
            let d = h.availableData
            guard let self, !d.isEmpty else { return }
            self.lock.lock()
            self.buffer.append(d)
            while let nl = self.buffer.firstIndex(of: 0x0A) {
                self.lines.append(String(decoding: self.buffer[self.buffer.startIndex..<nl], as: UTF8.self))
                self.buffer.removeSubrange(self.buffer.startIndex...nl)
            }
            self.lock.unlock()
        }
        try process.run()
    }

    public var pid: Int32 { process.processIdentifier }

    /// Complete lines printed so far.
    public var outputLines: [String] {
        lock.lock()
        defer { lock.unlock() }
        return lines
    }

    /// Waits (polling) until a line satisfying `match` appears, or `timeout` passes.
    public func waitForLine(timeout: Double = 30, _ match: (String) -> Bool) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while Date() < deadline {
            if outputLines.contains(where: match) { return true }
            if !process.isRunning && !outputLines.contains(where: match) {
                usleep(20_000)
                return outputLines.contains(where: match)
            }
            usleep(2_000)
        }
        return false
    }

    /// Waits (polling) up to `timeout` seconds for the process to end by itself; true if it did.
    public func waitForExit(timeout: Double) -> Bool {
        let deadline = Date().addingTimeInterval(timeout)
        while process.isRunning && Date() < deadline { usleep(2_000) }
        return !process.isRunning
    }

    /// How the process ended: true when a signal ended it (SIGKILL from ``kill9()`` or a crash
    /// point), false for a normal exit. Only meaningful once it has ended.
    public var wasKilled: Bool { process.terminationReason == .uncaughtSignal }

    /// Sends SIGKILL (unless the process has already ended) and waits for the process to end;
    /// returns the lines it printed.
    @discardableResult
    public func kill9() -> [String] {
        if process.isRunning { kill(process.processIdentifier, SIGKILL) }
        process.waitUntilExit()
        // Let the reader drain what the pipe still holds.
        usleep(20_000)
        output.fileHandleForReading.readabilityHandler = nil
        let rest = output.fileHandleForReading.readDataToEndOfFile()
        lock.lock()
        buffer.append(rest)
        while let nl = buffer.firstIndex(of: 0x0A) {
            lines.append(String(decoding: buffer[buffer.startIndex..<nl], as: UTF8.self))
            buffer.removeSubrange(buffer.startIndex...nl)
        }
        // A partial last line was cut by the kill: it was never a complete acknowledgement.
        let all = lines
        lock.unlock()
        return all
    }

    /// Waits for a normal exit; returns the status.
    public func wait() -> Int32 {
        process.waitUntilExit()
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
