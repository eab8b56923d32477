#if canImport(Glibc)
import Glibc
#endif
import Foundation

/// Waits until `condition` holds, looking again every 10 ms; false if it still did not hold
/// after `timeout` and as many looks as fit in it. Tests wait for what they need this way,
/// never for a fixed time: the bound is no timed assertion, it only keeps a broken build from
/// hanging the suite, so it is generous. Pass the result to `#expect` (or `#require`) saying
/// what was awaited.
///
/// Both bounds must pass: the whole suite on two cores keeps Swift's cooperative threads busy
/// for minutes (tests that block them), which starves this task and what it waits for alike,
/// and then 30 s of time go by with few looks — giving up on time alone failed correct builds.
public func eventually(timeout: Duration = .seconds(30), _ condition: () async throws -> Bool) async rethrows -> Bool {
    let interval = Duration.milliseconds(10)
    let deadline = ContinuousClock.now + timeout
    let looks = Int(timeout / interval)
    var looked = 0
    while true {
        if try await condition() { return true }
        looked += 1
        if looked >= looks && ContinuousClock.now >= deadline { return false }
        do { try await Task.sleep(for: interval) } catch { return try await condition() }  // (cancelled)
    }
}

/// ``eventually(timeout:_:)`` for code on a thread of its own (not a task): blocks the thread
/// while it waits, looking every 2 ms.
public func eventuallyOnThisThread(timeout: Duration = .seconds(30), _ condition: () throws -> Bool) rethrows -> Bool {
    let interval = Duration.milliseconds(2)
    let deadline = ContinuousClock.now + timeout
    let looks = Int(timeout / interval)
    var looked = 0
    while true {
        if try condition() { return true }
        looked += 1
        if looked >= looks && ContinuousClock.now >= deadline { return false }
        usleep(2_000)
    }
}
