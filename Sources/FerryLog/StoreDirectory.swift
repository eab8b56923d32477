#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

/// The store's directory and every file operation on it.
///
/// The durability order is written once, here: write → `fdatasync(file)` → `rename` →
/// `fsync(directory)` for every file created, and `unlink` → `fsync(directory)` for every file
/// deleted. Nothing else in the module creates, renames or deletes files.
struct StoreDirectory: Sendable {
    let path: String
    let system: SystemCalls

    func path(_ name: String) -> String { path + "/" + name }

    /// Creates the directory (and missing parents) if absent.
    func createIfNeeded() throws {
        var isDirectory = false
        if fileExists(path, isDirectory: &isDirectory) {
            guard isDirectory else {
                throw LogError(.invalidArgument, "the store path exists and is not a directory", file: path)
            }
            return
        }
        let parent = parentPath(path)
        if parent != path, !parent.isEmpty {
            try StoreDirectory(path: parent, system: system).createIfNeeded()
        }
        switch system.mkdir(path) {
        case .success: break
        case .failure(.EEXIST): return
        case .failure(let e): throw LogError.io("mkdir", path: path, e)
        }
        // Make the new directory's own entry durable.
        try StoreDirectory(path: parent.isEmpty ? "." : parent, system: system).syncDirectory()
    }

    /// The names of the entries in the directory (not "." or "..").
    func list() throws -> [String] {
        guard let dir = opendir(path) else { throw LogError.io("opendir", path: path, .current) }
        defer { closedir(dir) }
        var names: [String] = []
        while let entry = readdir(dir) {
            let name = withUnsafeBytes(of: entry.pointee.d_name) { raw in
                String(cString: raw.baseAddress!.assumingMemoryBound(to: CChar.self))
            }
            if name != "." && name != ".." { names.append(name) }
        }
        return names
    }

    func open(_ name: String, flags: Int32, mode: mode_t = 0o644) throws -> FileHandle {
        let p = path(name)
        switch system.open(p, flags, mode) {
        case .success(let fd): return FileHandle(fd: fd, path: p)
        case .failure(let e): throw LogError.io("open", path: p, e)
        }
    }

    /// Makes creations, renames and deletions in the directory durable.
    func syncDirectory() throws {
        let fd: Int32
        switch system.open(path, O_RDONLY | O_DIRECTORY, 0) {
        case .success(let d): fd = d
        case .failure(let e): throw LogError.io("open directory", path: path, e)
        }
        let handle = FileHandle(fd: fd, path: path)
        if case .failure(let e) = system.fsync(handle.fd) { throw LogError.io("fsync directory", path: path, e) }
        try handle.close(system)
    }

    /// Creates `name` with exactly `contents`, atomically: readers see either no file or the whole
    /// file, after a crash too. Replaces an existing file of that name.
    func createAtomically(_ name: String, contents: [UInt8]) throws {
        let file = try createAtomicallyKeepingOpen(name, contents: contents)
        try file.close(system)
    }

    /// Like ``createAtomically(_:contents:)``, and returns the new file open for writing (with
    /// `O_APPEND` unless `append` is false: the caller then writes at offsets).
    func createAtomicallyKeepingOpen(_ name: String, contents: [UInt8], append: Bool = true) throws -> FileHandle {
        let temporary = name + LogFormat.temporarySuffix
        try removeIfPresent(temporary)
        let file = try open(temporary, flags: O_RDWR | O_CREAT | O_EXCL | (append ? O_APPEND : 0))
        let written = contents.withUnsafeBytes { append ? system.writeAll(file.fd, $0) : system.pwriteAll(file.fd, $0, at: 0) }
        if case .failure(let e) = written { throw LogError.io(append ? "write" : "pwrite", path: file.path, e) }
        if case .failure(let e) = system.fdatasync(file.fd) { throw LogError.io("fdatasync", path: file.path, e) }
        if case .failure(let e) = system.rename(path(temporary), path(name)) {
            throw LogError.io("rename to \(name)", path: file.path, e)
        }
        try syncDirectory()
        return file.renamed(to: path(name))
    }

    /// Removes a leftover file (a temporary one) if there is one, without syncing the directory:
    /// the caller creates a file of that name next, and makes that durable. A failure other
    /// than the file's absence is an error: an `unlink` that failed is never ignored.
    func removeIfPresent(_ name: String) throws {
        switch system.unlink(path(name)) {
        case .success, .failure(.ENOENT): break
        case .failure(let e): throw LogError.io("unlink", path: path(name), e)
        }
    }

    /// Deletes files durably. Missing files are not an error. `crashPointBetween` names the
    /// ``CrashPoint`` hit between two deletions.
    func remove(_ names: [String], crashPointBetween: StaticString? = nil) throws {
        guard !names.isEmpty else { return }
        for (i, name) in names.enumerated() {
            if i > 0, let point = crashPointBetween { CrashPoint.hit(point) }
            switch system.unlink(path(name)) {
            case .success, .failure(.ENOENT): break
            case .failure(let e): throw LogError.io("unlink", path: path(name), e)
            }
        }
        try syncDirectory()
    }

    /// Renames a file durably (both directories are synced when they differ).
    func rename(_ from: String, to: String) throws {
        if case .failure(let e) = system.rename(path(from), path(to)) { throw LogError.io("rename to \(to)", path: path(from), e) }
        try syncDirectory()
        let toParent = parentPath(path(to)), fromParent = parentPath(path(from))
        if toParent != fromParent { try StoreDirectory(path: toParent, system: system).syncDirectory() }
    }

    func exists(_ name: String) -> Bool {
        var d = false
        return fileExists(path(name), isDirectory: &d)
    }
}

private func fileExists(_ path: String, isDirectory: inout Bool) -> Bool {
    var st = stat()
    guard stat(path, &st) == 0 else { return false }
    isDirectory = (st.st_mode & S_IFMT) == S_IFDIR
    return true
}

func parentPath(_ path: String) -> String {
    var p = path
    while p.count > 1 && p.hasSuffix("/") { p.removeLast() }
    guard let slash = p.lastIndex(of: "/") else { return "." }
    if slash == p.startIndex { return "/" }
    return String(p[..<slash])
}
