#if canImport(Glibc)
import Glibc
#endif
import Synchronization

#if FERRY_TSAN
/// The lock Ferry's code takes. In a ThreadSanitizer build (`scripts/sanitizers.sh thread`
/// compiles with `-DFERRY_TSAN`) it is ``PthreadMutex``, which ThreadSanitizer sees handed over;
/// otherwise `Synchronization.Mutex`, whose contended handoff on Linux (a priority-inheriting
/// futex) it does not see, so it reported every contended access to mutex-guarded state as a
/// race (`scripts/tsan-mutex-repro.swift`).
public typealias FerryMutex<Value: ~Copyable> = PthreadMutex<Value>
#else
/// The lock Ferry's code takes: `Synchronization.Mutex` (``PthreadMutex`` in a
/// ThreadSanitizer build, which compiles with `-DFERRY_TSAN`).
public typealias FerryMutex<Value: ~Copyable> = Mutex<Value>
#endif

/// A value behind a `pthread_mutex_t`, with `Synchronization.Mutex`'s `withLock`: what
/// ``FerryMutex`` is in a ThreadSanitizer build, where the locks must be ones ThreadSanitizer
/// intercepts. One allocation per lock (a `Mutex` is stored inline).
public final class PthreadMutex<Value: ~Copyable>: @unchecked Sendable {
    private let lock: UnsafeMutablePointer<pthread_mutex_t>
    private let value: UnsafeMutablePointer<Value>

    /// A lock around `initialValue`.
    public init(_ initialValue: consuming sending Value) {
        lock = .allocate(capacity: 1)
        lock.initialize(to: pthread_mutex_t())
        pthread_mutex_init(lock, nil)
        value = .allocate(capacity: 1)
        value.initialize(to: initialValue)
    }

    deinit {
        value.deinitialize(count: 1)
        value.deallocate()
        pthread_mutex_destroy(lock)
        lock.deallocate()
    }

    /// Calls `body` with the value, holding the lock.
    public func withLock<Result: ~Copyable, E: Error>(_ body: (inout sending Value) throws(E) -> sending Result) throws(E) -> sending Result {
        pthread_mutex_lock(lock)
        defer { pthread_mutex_unlock(lock) }
        return try body(&value.pointee)
    }
}
