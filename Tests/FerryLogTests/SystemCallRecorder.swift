@_spi(Testing) import FerryLog
import Synchronization

/// A `SystemCalls` that records, in order, every call that changes a file — with the name of
/// the file — and fails one chosen call. The log under test makes every call through it.
///
/// A fault is one-shot: once the chosen call has failed, later calls go through again (the
/// fault "clears"), so a test can see whether the log goes on using the disk after a failure.
final class SystemCallRecorder: Sendable {
    enum Kind: String, Sendable, CaseIterable {
        case write, pwrite, fsync, fdatasync, rename, unlink, ftruncate
    }

    struct Call: Sendable, CustomStringConvertible {
        var kind: Kind
        /// The file's name (the last path component); for `rename`, the source's.
        var name: String
        /// Bytes asked for (`write`, `pwrite`).
        var bytes: Int
        var description: String { "\(kind)(\(name)\(bytes > 0 ? ", \(bytes) bytes" : ""))" }
    }

    enum Fault: Sendable, CustomStringConvertible {
        case errno(Errno)
        /// Half of the bytes are written; the next write of that file fails with `ENOSPC`.
        case shortWrite
        var description: String {
            switch self {
            case .errno(let e): "\(e)"
            case .shortWrite: "a short write, then ENOSPC"
            }
        }
    }

    /// Which call fails: the (`skip` + 1)-th call of `kind` (any kind if nil) on a file whose name
    /// contains `nameContains` (any file if nil).
    struct Plan: Sendable {
        var kind: Kind?
        var nameContains: String?
        var skip = 0
        var fault: Fault
    }

    private struct State {
        var names: [Int32: String] = [:]
        var calls: [Call] = []
        var plan: Plan?
        var seen = 0
        var shortPending: Int32?
        /// The index in `calls` of the call that returned the injected error.
        var failedAt: Int?
    }

    private let state = FerryMutex(State())
    /// The store's directory: files are named relative to it (the directory itself is ".").
    private let store: String

    init(store: String) { self.store = store }

    private func name(_ path: String) -> String {
        if path == store { return "." }
        if path.hasPrefix(store + "/") { return String(path.dropFirst(store.count + 1)) }
        return path
    }

    func arm(_ plan: Plan) {
        state.withLock { s in
            s.plan = plan
            s.seen = 0
        }
    }

    var calls: [Call] { state.withLock { $0.calls } }
    var failedAt: Int? { state.withLock { $0.failedAt } }
    /// The calls made after the one that failed.
    var callsAfterTheFault: [Call] {
        state.withLock { s in s.failedAt.map { Array(s.calls[($0 + 1)...]) } ?? [] }
    }

    private enum Action { case pass, fail(Errno), short }

    private func decide(_ kind: Kind, fd: Int32? = nil, path: String? = nil, bytes: Int = 0) -> Action {
        state.withLock { s in
            let name = path.map(self.name) ?? fd.flatMap { s.names[$0] } ?? "fd \(fd ?? -1)"
            s.calls.append(Call(kind: kind, name: name, bytes: bytes))
            if let short = s.shortPending, short == fd, kind == .write || kind == .pwrite {
                s.shortPending = nil
                s.failedAt = s.calls.count - 1
                return .fail(.ENOSPC)
            }
            guard let plan = s.plan, plan.kind == nil || plan.kind == kind,
                  plan.nameContains.map({ name.contains($0) }) ?? true else { return .pass }
            s.seen += 1
            guard s.seen > plan.skip else { return .pass }
            s.plan = nil
            switch plan.fault {
            case .errno(let e):
                s.failedAt = s.calls.count - 1
                return .fail(e)
            case .shortWrite where bytes > 1 && fd != nil:
                s.shortPending = fd
                return .short
            case .shortWrite:
                s.failedAt = s.calls.count - 1
                return .fail(.ENOSPC)
            }
        }
    }

    var system: SystemCalls {
        var sys = SystemCalls.live
        let live = SystemCalls.live
        sys.open = { path, flags, mode in
            let r = live.open(path, flags, mode)
            if case .success(let fd) = r { self.state.withLock { $0.names[fd] = self.name(path) } }
            return r
        }
        sys.close = { fd in
            self.state.withLock { _ = $0.names.removeValue(forKey: fd) }
            return live.close(fd)
        }
        sys.write = { fd, bytes in
            switch self.decide(.write, fd: fd, bytes: bytes.count) {
            case .pass: live.write(fd, bytes)
            case .fail(let e): .failure(e)
            case .short: live.write(fd, UnsafeRawBufferPointer(rebasing: bytes[0..<(bytes.count / 2)]))
            }
        }
        sys.pwrite = { fd, bytes, offset in
            switch self.decide(.pwrite, fd: fd, bytes: bytes.count) {
            case .pass: live.pwrite(fd, bytes, offset)
            case .fail(let e): .failure(e)
            case .short: live.pwrite(fd, UnsafeRawBufferPointer(rebasing: bytes[0..<(bytes.count / 2)]), offset)
            }
        }
        sys.fsync = { fd in self.failure(of: .fsync, fd: fd) ?? live.fsync(fd) }
        sys.fdatasync = { fd in self.failure(of: .fdatasync, fd: fd) ?? live.fdatasync(fd) }
        sys.ftruncate = { fd, length in self.failure(of: .ftruncate, fd: fd) ?? live.ftruncate(fd, length) }
        sys.rename = { from, to in
            if let f = self.failure(of: .rename, path: from) { return f }
            let r = live.rename(from, to)
            if case .success = r {
                // A file open under its temporary name is known by its new one from now on.
                let (old, new) = (self.name(from), self.name(to))
                self.state.withLock { s in for (fd, n) in s.names where n == old { s.names[fd] = new } }
            }
            return r
        }
        sys.unlink = { path in self.failure(of: .unlink, path: path) ?? live.unlink(path) }
        return sys
    }

    private func failure(of kind: Kind, fd: Int32? = nil, path: String? = nil) -> Result<Void, Errno>? {
        if case .fail(let e) = decide(kind, fd: fd, path: path) { return .failure(e) }
        return nil
    }
}
