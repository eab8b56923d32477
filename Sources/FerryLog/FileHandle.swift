#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// A file descriptor with one owner, closed exactly once: by ``close()`` or, if never closed
/// explicitly, when its owner goes away.
struct Descriptor: ~Copyable {
    let rawValue: Int32

    /// Closes the descriptor and returns the `close(2)` result.
    consuming func close(_ system: SystemCalls) -> Result<Void, Errno> {
        let fd = rawValue
        discard self
        return system.close(fd)
    }

    deinit { _ = closeDescriptor(rawValue) }
}

/// `close(2)` (a name of its own: inside ``Descriptor``, `close` is its method).
private func closeDescriptor(_ fd: Int32) -> Int32 { close(fd) }

/// An open file: its descriptor and the path it was opened with (for error messages).
struct FileHandle: ~Copyable {
    let descriptor: Descriptor
    let path: String

    init(fd: Int32, path: String) {
        descriptor = Descriptor(rawValue: fd)
        self.path = path
    }

    init(descriptor: consuming Descriptor, path: String) {
        self.descriptor = descriptor
        self.path = path
    }

    var fd: Int32 { descriptor.rawValue }

    /// The same descriptor, under the name its file has after a rename.
    consuming func renamed(to newPath: String) -> FileHandle {
        FileHandle(descriptor: descriptor, path: newPath)
    }

    /// Closes the file, reporting a failure.
    consuming func close(_ system: SystemCalls) throws {
        let path = self.path
        if case .failure(let e) = descriptor.close(system) { throw LogError.io("close", path: path, e) }
    }
}
