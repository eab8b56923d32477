@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

@Suite struct LockTests {
    @Test func aSecondOpenerInTheSameProcessIsRefused() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
        #expect(e?.code == .storeInUse)
        #expect(e?.message.contains("another open in this process") == true)
        try await log.close()
        let again = try WriteAheadLog.open(at: dir.path, options: testOptions())
        try await again.close()
    }

    @Test func aSecondOpenerInAnotherProcessIsRefusedUntilTheHolderDies() async throws {
        let dir = try TemporaryDirectory()
        let child = try ChildProcess(Locations.executable("ferry-crash-child"), ["hold", dir.path])
        #expect(child.waitForLine { $0 == "locked" })
        let e = logError { _ = try WriteAheadLog.open(at: dir.path, options: testOptions()) }
        #expect(e?.code == .storeInUse)
        #expect(e?.message.contains("process \(child.pid)") == true)
        child.kill9()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions())
        try await log.close()
    }
}
