#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif
import CFileSpace

/// The system calls the log makes, one small wrapper each.
///
/// Each wrapper retries on `EINTR` and returns the `errno` of a failure. The log reaches the
/// disk only through a value of this type, so tests can replace single calls to inject faults
/// (`EIO` from `fdatasync`, `ENOSPC` or a short count from `write`) into the production code path.
@_spi(Testing) public struct SystemCalls: Sendable {
    /// `open(2)`, always with `O_CLOEXEC`.
    public var open: @Sendable (_ path: String, _ flags: Int32, _ mode: mode_t) -> Result<Int32, Errno>
    /// `close(2)`; never retried.
    public var close: @Sendable (_ fd: Int32) -> Result<Void, Errno>
    /// `pread(2)`.
    public var pread: @Sendable (_ fd: Int32, _ into: UnsafeMutableRawBufferPointer, _ offset: Int64) -> Result<Int, Errno>
    /// One `write(2)`; it may write fewer bytes than asked (callers loop through ``writeAll``).
    public var write: @Sendable (_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Result<Int, Errno>
    /// One `pwrite(2)` at an offset; it may write fewer bytes than asked (callers loop through
    /// ``pwriteAll``).
    public var pwrite: @Sendable (_ fd: Int32, _ bytes: UnsafeRawBufferPointer, _ offset: Int64) -> Result<Int, Errno>
    /// `fdatasync(2)` (`F_FULLFSYNC` on Apple platforms).
    public var fdatasync: @Sendable (_ fd: Int32) -> Result<Void, Errno>
    /// `fsync(2)` (`F_FULLFSYNC` on Apple platforms); used on directories.
    public var fsync: @Sendable (_ fd: Int32) -> Result<Void, Errno>
    /// `fallocate(2)` (mode 0): gives the file blocks up to `length`, growing it with zeros.
    /// `ENOTSUP` where the system has no such call.
    public var preallocate: @Sendable (_ fd: Int32, _ length: Int64) -> Result<Void, Errno>
    /// `ftruncate(2)`.
    public var ftruncate: @Sendable (_ fd: Int32, _ length: Int64) -> Result<Void, Errno>
    /// The size from `fstat(2)`.
    public var fileSize: @Sendable (_ fd: Int32) -> Result<Int64, Errno>
    /// `rename(2)`.
    public var rename: @Sendable (_ from: String, _ to: String) -> Result<Void, Errno>
    /// `unlink(2)`.
    public var unlink: @Sendable (_ path: String) -> Result<Void, Errno>
    /// `mkdir(2)` with mode 0755.
    public var mkdir: @Sendable (_ path: String) -> Result<Void, Errno>
    /// `flock(LOCK_EX | LOCK_NB)`.
    public var lockExclusive: @Sendable (_ fd: Int32) -> Result<Void, Errno>

    /// The real system calls.
    public static let live = SystemCalls(
        open: { path, flags, mode in retrying { c_open(path, flags | O_CLOEXEC, mode) } },
        close: { fd in
            // Never retry close: the descriptor is released even when it reports EINTR.
            c_close(fd) == 0 ? .success(()) : .failure(.current)
        },
        pread: { fd, buffer, offset in retrying { c_pread(fd, buffer.baseAddress, buffer.count, off_t(offset)) } },
        write: { fd, bytes in retrying { c_write(fd, bytes.baseAddress, bytes.count) } },
        pwrite: { fd, bytes, offset in retrying { c_pwrite(fd, bytes.baseAddress, bytes.count, off_t(offset)) } },
        fdatasync: { fd in retrying { c_fdatasync(fd) }.map { _ in () } },
        fsync: { fd in retrying { c_fsync(fd) }.map { _ in () } },
        preallocate: { fd, length in retrying { c_fallocate(fd, off_t(length)) }.map { _ in () } },
        ftruncate: { fd, length in retrying { c_ftruncate(fd, off_t(length)) }.map { _ in () } },
        fileSize: { fd in
            var st = stat()
            return retrying { fstat(fd, &st) }.map { _ in Int64(st.st_size) }
        },
        rename: { from, to in retrying { c_rename(from, to) }.map { _ in () } },
        unlink: { path in retrying { c_unlink(path) }.map { _ in () } },
        mkdir: { path in retrying { c_mkdir(path, 0o755) }.map { _ in () } },
        lockExclusive: { fd in retrying { flock(fd, LOCK_EX | LOCK_NB) }.map { _ in () } }
    )

    /// Writes every byte, looping over short writes. A `write` that reports 0 bytes is an error
    /// (`EIO`), so a device that stops taking bytes cannot make this spin.
    func writeAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer) -> Result<Void, Errno> {
        var done = 0
        while done < bytes.count {
            switch write(fd, UnsafeRawBufferPointer(rebasing: bytes[done...])) {
            case .success(let n) where n > 0: done += n
            case .success: return .failure(.EIO)
            case .failure(let e): return .failure(e)
            }
        }
        return .success(())
    }

    /// Writes every byte at `offset`, looping over short writes like ``writeAll``.
    func pwriteAll(_ fd: Int32, _ bytes: UnsafeRawBufferPointer, at offset: Int64) -> Result<Void, Errno> {
        var done = 0
        while done < bytes.count {
            switch pwrite(fd, UnsafeRawBufferPointer(rebasing: bytes[done...]), offset + Int64(done)) {
            case .success(let n) where n > 0: done += n
            case .success: return .failure(.EIO)
            case .failure(let e): return .failure(e)
            }
        }
        return .success(())
    }

    /// Reads exactly `buffer.count` bytes at `offset`, or fewer only at end of file.
    func preadFully(_ fd: Int32, _ buffer: UnsafeMutableRawBufferPointer, at offset: Int64) -> Result<Int, Errno> {
        var done = 0
        while done < buffer.count {
            switch pread(fd, UnsafeMutableRawBufferPointer(rebasing: buffer[done...]), offset + Int64(done)) {
            case .success(0): return .success(done)
            case .success(let n): done += n
            case .failure(let e): return .failure(e)
            }
        }
        return .success(done)
    }
}

@inline(__always)
private func retrying<T: BinaryInteger>(_ call: () -> T) -> Result<T, Errno> {
    while true {
        let r = call()
        if r >= 0 { return .success(r) }
        let e = Errno.current
        if e != .EINTR { return .failure(e) }
    }
}

// File-scope shims, so the closures above reach the C functions rather than the members
// of the same names.
private func c_open(_ path: String, _ flags: Int32, _ mode: mode_t) -> Int32 { open(path, flags, mode) }
private func c_close(_ fd: Int32) -> Int32 { close(fd) }
private func c_pread(_ fd: Int32, _ buf: UnsafeMutableRawPointer?, _ n: Int, _ off: off_t) -> Int { pread(fd, buf, n, off) }
private func c_write(_ fd: Int32, _ buf: UnsafeRawPointer?, _ n: Int) -> Int { write(fd, buf, n) }
private func c_pwrite(_ fd: Int32, _ buf: UnsafeRawPointer?, _ n: Int, _ off: off_t) -> Int { pwrite(fd, buf, n, off) }
private func c_fsync(_ fd: Int32) -> Int32 {
    #if canImport(Darwin)
    fcntl(fd, F_FULLFSYNC)  // fsync on Apple platforms does not flush the drive's cache
    #else
    fsync(fd)
    #endif
}
private func c_fdatasync(_ fd: Int32) -> Int32 {
    #if canImport(Darwin)
    fcntl(fd, F_FULLFSYNC)
    #else
    fdatasync(fd)
    #endif
}
private func c_fallocate(_ fd: Int32, _ length: off_t) -> Int32 { ferry_fallocate(fd, Int64(length)) }
private func c_ftruncate(_ fd: Int32, _ length: off_t) -> Int32 { ftruncate(fd, length) }
private func c_rename(_ from: String, _ to: String) -> Int32 { rename(from, to) }
private func c_unlink(_ path: String) -> Int32 { unlink(path) }
private func c_mkdir(_ path: String, _ mode: mode_t) -> Int32 { mkdir(path, mode) }
