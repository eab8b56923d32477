import Dispatch
import FerryLog
import Testing

/// The lock a ThreadSanitizer build uses for every `FerryMutex` (see `scripts/sanitizers.sh`).
@Suite struct PthreadMutexTests {
    /// Four threads adding to one count behind the lock lose none of their additions, and a
    /// value that cannot be copied is kept and handed out in place.
    @Test func threadsTakingTheLockInTurnLoseNoUpdate() {
        let count = PthreadMutex(0)
        DispatchQueue.concurrentPerform(iterations: 4) { _ in
            for _ in 0..<100_000 { count.withLock { $0 += 1 } }
        }
        #expect(count.withLock { $0 } == 400_000)

        struct Token: ~Copyable { var uses = 0 }
        let token = PthreadMutex(Token())
        DispatchQueue.concurrentPerform(iterations: 4) { _ in
            for _ in 0..<1_000 { token.withLock { $0.uses += 1 } }
        }
        #expect(token.withLock { $0.uses } == 4_000)
    }
}
