#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A POSIX error number, as returned by a failed system call.
public struct Errno: Error, Hashable, Sendable, CustomStringConvertible {
    /// The `errno` value.
    public var rawValue: Int32
    /// An error number.
    public init(rawValue: Int32) { self.rawValue = rawValue }

    /// I/O error.
    public static let EIO = Errno(rawValue: Glibc_EIO)
    /// No space left on device.
    public static let ENOSPC = Errno(rawValue: Glibc_ENOSPC)
    /// No such file or directory.
    public static let ENOENT = Errno(rawValue: Glibc_ENOENT)
    /// Interrupted system call (the wrappers retry it).
    public static let EINTR = Errno(rawValue: Glibc_EINTR)
    /// The operation would block (a lock held by someone else).
    public static let EWOULDBLOCK = Errno(rawValue: Glibc_EWOULDBLOCK)
    /// The file exists.
    public static let EEXIST = Errno(rawValue: Glibc_EEXIST)
    /// Not a directory.
    public static let ENOTDIR = Errno(rawValue: Glibc_ENOTDIR)
    /// Invalid argument.
    public static let EINVAL = Errno(rawValue: Glibc_EINVAL)

    /// The calling thread's current `errno`.
    static var current: Errno { Errno(rawValue: errno) }

    public var description: String {
        guard let cString = strerror(rawValue) else { return "errno \(rawValue)" }
        return "\(String(cString: cString)) (errno \(rawValue))"
    }
}

private let Glibc_EIO: Int32 = EIO
private let Glibc_ENOSPC: Int32 = ENOSPC
private let Glibc_ENOENT: Int32 = ENOENT
private let Glibc_EINTR: Int32 = EINTR
private let Glibc_EWOULDBLOCK: Int32 = EWOULDBLOCK
private let Glibc_EEXIST: Int32 = EEXIST
private let Glibc_ENOTDIR: Int32 = ENOTDIR
private let Glibc_EINVAL: Int32 = EINVAL
