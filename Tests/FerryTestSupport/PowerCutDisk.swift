#if canImport(Glibc)
import Glibc
#endif
import Foundation
@_spi(Testing) import FerryLog
import Synchronization

/// A disk that can lose its power: ``SystemCalls`` that pass every call to the real ones while
/// tracking, per file of one store directory, what a power cut would keep — the bytes covered
/// by `fdatasync`/`fsync` of the file, and the creations, renames and deletions covered by an
/// `fsync` of the directory (the model of RocksDB's fault-injection file system and of the
/// ALICE study: nothing else is promised to survive).
///
/// At the cut (after a chosen number of calls that change the disk, or by ``cut()``) it stops
/// forwarding: that call and every later one fails with `EIO` (so the log fail-stops), except
/// `close`, which still releases descriptors. Once the database that used it is closed,
/// ``restoreDurableState(keepUnsynced:using:)`` rewrites the directory to what the disk would
/// hold after the power came back, and the store can be reopened with the real calls.
///
/// Files are tracked by identity: each is hard-linked into a shadow directory when the disk
/// first sees it, so its bytes outlive a rename over it or an unlink that a cut undoes. A
/// `write` must be an append (`O_APPEND`); a `pwrite` may land anywhere: bytes it overwrites
/// below the durable length are kept, and put back by a cut before the file's next sync (the
/// zeros a `preallocate` grew a segment by, over which the log writes its frames). Anything
/// the model cannot follow is listed in ``problems`` rather than silently mis-modelled.
public final class PowerCutDisk: Sendable {
    struct TrackedFile {
        var length: Int64
        var durableLength: Int64
        /// The durable bytes when a truncation cut below them (else: the shadow's prefix).
        var durableImage: [UInt8]?
        /// Durable bytes overwritten since the last sync, oldest first: (offset, the old bytes).
        var overwritten: [(offset: Int64, bytes: [UInt8])] = []
    }

    struct Descriptor {
        var file: Int?  // nil: the store directory itself
        var append: Bool
    }

    struct State {
        var nextFile = 0
        var names: [String: Int] = [:]
        var durableNames: [String: Int] = [:]
        var files: [Int: TrackedFile] = [:]
        var descriptors: [Int32: Descriptor] = [:]
        var callsBeforeCut: Int
        var isCut = false
        var mutatingCalls = 0
        var problems: [String] = []
        var trace: [String] = []
    }

    /// The store directory tracked.
    public let directory: String
    private let shadow: String
    private let state: FerryMutex<State>
    /// The lock file is not data: its `flock` dies with the process, its bytes are a hint.
    private static let untracked: Set<String> = ["LOCK"]

    /// Tracks `directory` (existing files count as durable); the power goes out at the
    /// `callsBeforeCut`-th call that changes the disk (open with `O_CREAT`, write, sync,
    /// truncate, rename, unlink, mkdir). `shadow` is a scratch directory on the same file system.
    public init(directory: String, shadow: String, callsBeforeCut: Int = .max) throws {
        self.directory = directory
        self.shadow = shadow
        try FileManager.default.createDirectory(atPath: shadow, withIntermediateDirectories: true)
        var s = State(callsBeforeCut: callsBeforeCut)
        for name in try FileManager.default.contentsOfDirectory(atPath: directory) where !Self.untracked.contains(name) {
            var st = stat()
            guard stat(directory + "/" + name, &st) == 0, (st.st_mode & S_IFMT) == S_IFREG else { continue }
            let id = s.nextFile
            s.nextFile += 1
            guard link(directory + "/" + name, shadow + "/\(id)") == 0 else { throw POSIXError(.init(rawValue: errno) ?? .EIO) }
            s.names[name] = id
            s.files[id] = TrackedFile(length: Int64(st.st_size), durableLength: Int64(st.st_size))
        }
        s.durableNames = s.names
        state = FerryMutex(s)
    }

    /// True once the power is out.
    public var isCut: Bool { state.withLock { $0.isCut } }
    /// Calls that changed (or would have changed) the disk so far.
    public var mutatingCalls: Int { state.withLock { $0.mutatingCalls } }
    /// Every call that changed the disk, in order (for a failure's report).
    public var trace: [String] { state.withLock { $0.trace } }
    /// Things the model could not follow (an empty list for a faithful run).
    public var problems: [String] { state.withLock { $0.problems } }

    /// Cuts the power now.
    public func cut() { state.withLock { $0.isCut = true } }

    private func name(of path: String) -> String? {
        guard path.hasPrefix(directory + "/") else { return nil }
        let rest = String(path.dropFirst(directory.count + 1))
        return rest.contains("/") || Self.untracked.contains(rest) ? nil : rest
    }

    /// `count` bytes of tracked file `id` at `offset` (read through its shadow link).
    private func readShadow(_ id: Int, at offset: Int64, count: Int) -> [UInt8]? {
        let fd = Glibc.open(shadow + "/\(id)", O_RDONLY | O_CLOEXEC)
        guard fd >= 0 else { return nil }
        defer { Glibc.close(fd) }
        var bytes = [UInt8](repeating: 0, count: count)
        let got = bytes.withUnsafeMutableBytes { Glibc.pread(fd, $0.baseAddress, count, off_t(offset)) }
        return got == count ? bytes : nil
    }

    /// Counts a call that changes the disk; false if the power is (now) out.
    private func powered(_ s: inout State, _ what: String) -> Bool {
        if s.isCut { return false }
        s.trace.append(what)
        s.mutatingCalls += 1
        if s.mutatingCalls >= s.callsBeforeCut { s.isCut = true }
        return !s.isCut
    }

    /// The calls to give the log (`LogOptions.system`, `DatabaseOptions.system`).
    @_spi(Testing) public var calls: SystemCalls {
        let live = SystemCalls.live
        var c = live
        c.open = { [self] path, flags, mode in
            state.withLock { s in
                let creates = flags & O_CREAT != 0
                if creates ? !powered(&s, "open \(path)") : s.isCut { return .failure(.EIO) }
                let r = live.open(path, flags, mode)
                guard case .success(let fd) = r else { return r }
                // A descriptor closed without this seam (by its owner's deinit) may be reused.
                s.descriptors.removeValue(forKey: fd)
                if path == directory {
                    s.descriptors[fd] = Descriptor(file: nil, append: false)
                } else if let name = name(of: path) {
                    if flags & O_TRUNC != 0 { s.problems.append("open with O_TRUNC: \(name)") }
                    let id: Int
                    if let existing = s.names[name] {
                        id = existing
                    } else {
                        id = s.nextFile
                        s.nextFile += 1
                        if link(path, shadow + "/\(id)") != 0 { s.problems.append("cannot shadow \(name): errno \(errno)") }
                        s.names[name] = id
                        s.files[id] = TrackedFile(length: 0, durableLength: 0)
                    }
                    s.descriptors[fd] = Descriptor(file: id, append: flags & O_APPEND != 0)
                    s.trace.append("  fd \(fd) = file \(id) \(name)")
                }
                return r
            }
        }
        c.close = { [self] fd in
            state.withLock { _ = $0.descriptors.removeValue(forKey: fd) }
            return live.close(fd)  // even without power: a descriptor is not data
        }
        c.pread = { [self] fd, buffer, offset in
            if isCut { return .failure(.EIO) }
            return live.pread(fd, buffer, offset)
        }
        c.fileSize = { [self] fd in
            if isCut { return .failure(.EIO) }
            return live.fileSize(fd)
        }
        c.write = { [self] fd, bytes in
            state.withLock { s in
                let what = "write fd \(fd) (file \(s.descriptors[fd]?.file.map { String($0) } ?? "-")) \(bytes.count)"
                guard powered(&s, what) else { return .failure(.EIO) }
                let r = live.write(fd, bytes)
                if case .success(let n) = r, let d = s.descriptors[fd], let id = d.file {
                    if !d.append { s.problems.append("a write not in append mode (fd \(fd))") }
                    if case .success(let size) = live.fileSize(fd) { s.files[id]?.length = size } else { s.files[id]?.length += Int64(n) }
                }
                return r
            }
        }
        c.pwrite = { [self] fd, bytes, offset in
            state.withLock { s in
                let what = "pwrite fd \(fd) (file \(s.descriptors[fd]?.file.map { String($0) } ?? "-")) \(bytes.count) at \(offset)"
                guard powered(&s, what) else { return .failure(.EIO) }
                var old: [UInt8] = []
                if let id = s.descriptors[fd]?.file, let f = s.files[id], offset < f.durableLength {
                    // The durable bytes this may overwrite, to put back at a cut.
                    let n = Int(min(Int64(bytes.count), f.durableLength - offset))
                    if let saved = readShadow(id, at: offset, count: n) { old = saved } else {
                        s.problems.append("cannot save bytes a pwrite overwrites (fd \(fd))")
                    }
                }
                let r = live.pwrite(fd, bytes, offset)
                if case .success(let n) = r, let id = s.descriptors[fd]?.file {
                    if !old.isEmpty { s.files[id]?.overwritten.append((offset, Array(old.prefix(n)))) }
                    if case .success(let size) = live.fileSize(fd) { s.files[id]?.length = size }
                }
                return r
            }
        }
        c.preallocate = { [self] fd, length in
            state.withLock { s in
                guard powered(&s, "preallocate fd \(fd) \(length)") else { return .failure(.EIO) }
                let r = live.preallocate(fd, length)
                if case .success = r, let id = s.descriptors[fd]?.file, case .success(let size) = live.fileSize(fd) {
                    s.files[id]?.length = size  // (zeros: durable with the file's next sync)
                }
                return r
            }
        }
        let sync: @Sendable (Int32, @Sendable (Int32) -> Result<Void, Errno>) -> Result<Void, Errno> = { [self] fd, call in
            state.withLock { s in
                let what = "sync fd \(fd) (file \(s.descriptors[fd].map { $0.file.map { String($0) } ?? "dir" } ?? "-"))"
                guard powered(&s, what) else { return .failure(.EIO) }
                let r = call(fd)
                if case .success = r, let d = s.descriptors[fd] {
                    if let id = d.file, var f = s.files[id] {
                        f.durableLength = f.length
                        f.durableImage = nil
                        f.overwritten = []
                        s.files[id] = f
                    } else if d.file == nil {
                        s.durableNames = s.names
                    }
                }
                return r
            }
        }
        c.fdatasync = { fd in sync(fd, live.fdatasync) }
        c.fsync = { fd in sync(fd, live.fsync) }
        c.ftruncate = { [self] fd, length in
            state.withLock { s in
                guard powered(&s, "ftruncate fd \(fd) \(length)") else { return .failure(.EIO) }
                if let id = s.descriptors[fd]?.file, var f = s.files[id], length < f.durableLength, f.durableImage == nil {
                    // The cut bytes were durable: keep them, a cut before the next sync brings them back.
                    // (Read through the shadow link: the descriptor may be write-only.)
                    if let all = try? Files.read(shadow + "/\(id)"), all.count >= Int(f.durableLength) {
                        f.durableImage = Array(all.prefix(Int(f.durableLength)))
                    } else {
                        s.problems.append("cannot save the durable bytes of a truncated file")
                    }
                    s.files[id] = f
                }
                let r = live.ftruncate(fd, length)
                if case .success = r, let id = s.descriptors[fd]?.file { s.files[id]?.length = length }
                return r
            }
        }
        c.rename = { [self] from, to in
            state.withLock { s in
                guard powered(&s, "rename \(from) \(to)") else { return .failure(.EIO) }
                let r = live.rename(from, to)
                if case .success = r {
                    let a = name(of: from), b = name(of: to)
                    if let a, let b, let id = s.names.removeValue(forKey: a) {
                        s.names[b] = id
                    } else if a != nil || b != nil {
                        s.problems.append("a rename across the store directory: \(from) -> \(to)")
                    }
                }
                return r
            }
        }
        c.unlink = { [self] path in
            state.withLock { s in
                guard powered(&s, "unlink \(path)") else { return .failure(.EIO) }
                let r = live.unlink(path)
                if case .success = r, let n = name(of: path) { s.names.removeValue(forKey: n) }
                return r
            }
        }
        c.mkdir = { [self] path in
            state.withLock { s in
                guard powered(&s, "mkdir \(path)") else { return .failure(.EIO) }
                if name(of: path) != nil { s.problems.append("mkdir inside the store: \(path)") }
                return live.mkdir(path)
            }
        }
        return c
    }

    /// What a restore did.
    public struct Restore: Sendable, CustomStringConvertible {
        /// Files whose unsynced bytes were dropped (or cut to a prefix).
        public var truncatedFiles = 0
        /// The unsynced bytes dropped.
        public var droppedBytes: Int64 = 0
        /// Directory entries a cut undid: creations and renames removed, deletions brought back.
        public var undoneEntries = 0
        /// Unsynced overwrites of durable bytes put back (wholly or in part).
        public var undoneOverwrites = 0
        /// One line for a test's report.
        public var description: String { "\(truncatedFiles) file(s) lost \(droppedBytes) unsynced byte(s), \(undoneOverwrites) overwrite(s) undone, \(undoneEntries) directory change(s) undone" }
    }

    /// Rewrites the store directory to what survives the cut: only the directory entries that
    /// an `fsync` of the directory covered, each file holding only its synced bytes. With
    /// `keepUnsynced`, each file also keeps a random prefix of its unsynced bytes (the page
    /// cache may have written some back before the cut), giving torn tails.
    ///
    /// Call it once the database is closed (no descriptor of the store open).
    public func restoreDurableState<G: RandomNumberGenerator>(keepUnsynced: Bool, using g: inout G) throws -> Restore {
        cut()
        let s = state.withLock { $0 }
        var report = Restore()
        for name in try FileManager.default.contentsOfDirectory(atPath: directory) where !Self.untracked.contains(name) {
            if s.durableNames[name] == nil || s.durableNames[name] != s.names[name] { report.undoneEntries += 1 }
            try FileManager.default.removeItem(atPath: directory + "/" + name)
        }
        for (name, id) in s.durableNames {
            guard let f = s.files[id] else { continue }
            if s.names[name] != id { report.undoneEntries += 1 }
            var bytes: [UInt8]
            if let image = f.durableImage {
                bytes = image
            } else {
                let all = try Files.read(shadow + "/\(id)")
                var keep = Int(f.durableLength)
                if keepUnsynced, f.length > f.durableLength, g.next() % 2 == 0 {
                    keep += Int(g.next() % UInt64(f.length - f.durableLength + 1))
                }
                bytes = Array(all.prefix(keep))
            }
            // Overwrites of durable bytes since the last sync are undone, newest first (with
            // `keepUnsynced`, each may have reached the disk in part: a prefix of it stays).
            for (offset, old) in f.overwritten.reversed() where offset < Int64(bytes.count) {
                var from = 0
                if keepUnsynced, g.next() % 2 == 0 { from = Int(g.next() % UInt64(old.count + 1)) }
                for i in from..<old.count where Int(offset) + i < bytes.count { bytes[Int(offset) + i] = old[i] }
                report.undoneOverwrites += 1
            }
            if Int64(bytes.count) < f.length {
                report.truncatedFiles += 1
                report.droppedBytes += f.length - Int64(bytes.count)
            }
            try Files.write(directory + "/" + name, bytes)
        }
        try FileManager.default.removeItem(atPath: shadow)
        return report
    }
}
