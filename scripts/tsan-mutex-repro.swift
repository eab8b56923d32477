// Shows that ThreadSanitizer reports races on state guarded by Synchronization.Mutex when the
// lock is contended (the kernel hands it over; TSan sees no acquire). A correct program: four
// threads append under one Mutex. scripts/sanitizers.sh compiles it with -sanitize=thread and
// reports whether this toolchain still produces the false reports that
// scripts/tsan-suppressions.txt (entry 1) suppresses in Ferry's log.
import Dispatch
import Synchronization
#if canImport(Glibc)
import Glibc
#endif

final class Box: Sendable {
    let items = Mutex<[Int]>([])
}

let box = Box()
DispatchQueue.concurrentPerform(iterations: 4) { i in
    for j in 0..<200 {
        box.items.withLock {
            $0.append(i * j)
            usleep(50)  // hold the lock so that the others wait for it in the kernel
        }
    }
}
print(box.items.withLock { $0.count })
