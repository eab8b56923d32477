#if canImport(Glibc)
import Glibc
#elseif canImport(Musl)
import Musl
#elseif canImport(Darwin)
import Darwin
#endif

extension WriteAheadLog {
    /// Creates or replaces a file beside the log (a database checkpoint, say), atomically and
    /// durably: after a crash the file is either absent, the old version, or complete.
    ///
    /// The log never reads these files and ``LogInspection`` ignores them; their content is the
    /// caller's. Names may not contain `/` nor collide with the log's own files.
    ///
    /// - Throws: ``LogError`` — ``LogError/Code/invalidArgument`` for a bad name (nothing is
    ///   written); ``LogError/Code/failed`` when the log has failed, or when a step of the write
    ///   fails: that stops the log, as a failed append does.
    public func writeSideFile(named name: String, contents: [UInt8]) throws {
        try checkSideFileName(name)
        try changingFiles { try directory.createAtomically(name, contents: contents) }
    }

    /// The contents of a side file, or nil if there is none of that name.
    public func readSideFile(named name: String) throws -> [UInt8]? {
        try checkSideFileName(name)
        guard directory.exists(name) else { return nil }
        return try readWholeFile(directory, name)
    }

    /// The names of the side files whose names start with `prefix`.
    public func sideFiles(withPrefix prefix: String) throws -> [String] {
        try directory.list().filter {
            $0.hasPrefix(prefix) && !$0.hasSuffix(LogFormat.segmentSuffix) && !$0.hasSuffix(LogFormat.temporarySuffix)
                && $0 != LogFormat.lockFileName && $0 != LogFormat.startFileName
        }.sorted()
    }

    /// Removes side files durably.
    ///
    /// - Throws: ``LogError`` — ``LogError/Code/invalidArgument`` for a bad name (nothing is
    ///   removed); ``LogError/Code/failed`` when the log has failed, or when an `unlink` or the
    ///   directory's `fsync` fails: that stops the log.
    public func removeSideFiles(named names: [String]) throws {
        for n in names { try checkSideFileName(n) }
        guard !names.isEmpty else { return }
        try changingFiles { try directory.remove(names) }
    }

    private func checkSideFileName(_ name: String) throws {
        guard !name.isEmpty, !name.contains("/"), name != LogFormat.lockFileName, name != LogFormat.startFileName,
              !name.hasSuffix(LogFormat.segmentSuffix), !name.hasSuffix(LogFormat.temporarySuffix), name != LogFormat.damagedDirectory
        else { throw LogError(.invalidArgument, "\"\(name)\" cannot name a side file") }
    }
}

// MARK: Side files of blocks

/// Receives the blocks of a side file being written; see
/// ``WriteAheadLog/writeSideFile(named:blocks:)``.
public final class SideFileBlockWriter {
    fileprivate let log: WriteAheadLog
    fileprivate let fd: Int32
    fileprivate let path: String
    private var frame: [UInt8] = []
    fileprivate private(set) var blocks = 0

    fileprivate init(log: WriteAheadLog, fd: Int32, path: String) {
        self.log = log
        self.fd = fd
        self.path = path
    }

    /// Appends one block (1 byte to ``WriteAheadLog/maximumSideFileBlock`` bytes; an empty
    /// block is the end marker and cannot be written), compressed when that makes it smaller,
    /// behind its checksum.
    ///
    /// - Throws: ``LogError`` — ``LogError/Code/invalidArgument`` for an empty or oversized
    ///   block; ``LogError/Code/failed`` when the `write` fails (that stops the log) or the log
    ///   has failed.
    public func write(_ block: UnsafeRawBufferPointer) throws {
        guard block.count > 0, block.count <= WriteAheadLog.maximumSideFileBlock else {
            throw LogError(.invalidArgument, "a side-file block of \(block.count) bytes: blocks are 1 byte to 16 MiB")
        }
        try writeFrame(block)
        blocks += 1
    }

    /// The end marker: an empty block, so that a reader can tell a whole file from a cut one.
    fileprivate func finish() throws { try writeFrame(UnsafeRawBufferPointer(start: nil, count: 0)) }

    private func writeFrame(_ block: UnsafeRawBufferPointer) throws {
        let header = SideFileFormat.frameHeader
        frame.removeAll(keepingCapacity: true)
        frame.reserveCapacity(header + LZ4.bound(block.count))
        frame.append(contentsOf: repeatElement(0, count: header + LZ4.bound(block.count)))
        let stored = frame.withUnsafeMutableBytes { f -> Int in
            let out = UnsafeMutableRawBufferPointer(rebasing: f[header...])
            if let n = LZ4.compress(block, into: out) { return n }
            if block.count > 0 { out.copyMemory(from: block) }
            return block.count
        }
        frame.removeSubrange((header + stored)...)
        frame.withUnsafeMutableBytes { f in
            f.storeBytes(of: UInt32(block.count).littleEndian, toByteOffset: 4, as: UInt32.self)
            f.storeBytes(of: UInt32(stored).littleEndian, toByteOffset: 8, as: UInt32.self)
            let crc = CRC32C.checksum(UnsafeRawBufferPointer(rebasing: f[4...]))
            f.storeBytes(of: crc.littleEndian, toByteOffset: 0, as: UInt32.self)
        }
        try log.changingFiles {
            if case .failure(let e) = frame.withUnsafeBytes({ log.system.writeAll(fd, $0) }) { throw LogError.io("write", path: path, e) }
        }
    }
}

/// The framing of block side files (see FORMAT.md, "Side files of blocks").
enum SideFileFormat {
    /// CRC32C of the rest of the frame (u32), raw length (u32), stored length (u32).
    static let frameHeader = 12
}

extension WriteAheadLog {
    /// The largest block ``writeSideFile(named:blocks:)`` takes.
    public static let maximumSideFileBlock = 16 << 20

    /// Creates or replaces a side file written as a sequence of blocks, each LZ4-compressed
    /// when that helps and checksummed, streamed to disk as `body` produces them (nothing holds
    /// the whole file); atomically and durably, like ``writeSideFile(named:contents:)``. If
    /// `body` throws, the file is left as it was. Read it back with
    /// ``readSideFile(named:blocks:)``.
    ///
    /// Every step that changes a file (creating the temporary file, each `write`, the
    /// `fdatasync`, the `rename` and the directory's `fsync`) runs under the fail-stop rule: if
    /// one fails, the log stops as a failed append stops it.
    ///
    /// - Throws: what `body` throws (the log goes on); ``LogError/Code/invalidArgument`` for a
    ///   bad name; ``LogError/Code/failed`` when the log has failed or a step failed.
    public func writeSideFile(named name: String, blocks body: (SideFileBlockWriter) throws -> Void) throws {
        try checkSideFileName(name)
        let temporary = name + LogFormat.temporarySuffix
        let opened = try changingFiles { () throws -> FileHandle in
            try directory.removeIfPresent(temporary)
            return try directory.open(temporary, flags: O_WRONLY | O_CREAT | O_EXCL | O_APPEND)
        }
        let writer = SideFileBlockWriter(log: self, fd: opened.fd, path: opened.path)
        var file = Optional(opened)
        do {
            try body(writer)
        } catch {
            // The caller's own error: leave the file as it was. (After a failed step, the
            // log touches nothing; the next open removes the temporary file.)
            if failure == nil { try? changingFiles { try directory.removeIfPresent(temporary) } }
            throw error
        }
        try changingFiles {
            try writer.finish()
            if case .failure(let e) = system.fdatasync(writer.fd) { throw LogError.io("fdatasync", path: writer.path, e) }
            try file.take()!.close(system)
            CrashPoint.hit("checkpoint.afterTempWrite")  // (checkpoints are the only block side files)
            try directory.rename(temporary, to: name)
        }
    }

    /// Reads a side file of blocks, handing each block to `body` in order (the buffer is valid
    /// only during the call). Returns false when there is no such file. A frame whose checksum
    /// fails, that does not decompress, or a file cut short throws ``LogError/Code/corruption``
    /// after the blocks before it were handed over — a caller that builds state from the
    /// blocks must discard it then.
    @discardableResult
    public func readSideFile(named name: String, blocks body: (UnsafeRawBufferPointer) throws -> Void) throws -> Bool {
        try checkSideFileName(name)
        guard directory.exists(name) else { return false }
        let system = directory.system
        let file = try directory.open(name, flags: O_RDONLY)
        let size: Int64
        switch system.fileSize(file.fd) {
        case .success(let s): size = s
        case .failure(let e): throw LogError.io("fstat", path: file.path, e)
        }
        func corrupt(_ why: String, at offset: Int64) -> LogError {
            LogError(.corruption, "side file \(name) is damaged at byte \(offset): \(why)", file: file.path)
        }
        func read(_ buffer: UnsafeMutableRawBufferPointer, at offset: Int64) throws {
            switch system.preadFully(file.fd, buffer, at: offset) {
            case .success(let n) where n == buffer.count: return
            case .success: throw corrupt("the file ends inside a frame", at: offset)
            case .failure(let e): throw LogError.io("read", path: file.path, e)
            }
        }
        var offset: Int64 = 0
        var stored: [UInt8] = []
        var raw: [UInt8] = []
        var header = [UInt8](repeating: 0, count: SideFileFormat.frameHeader)
        while true {
            guard offset + Int64(SideFileFormat.frameHeader) <= size else { throw corrupt("the file ends before its end marker", at: offset) }
            try header.withUnsafeMutableBytes { try read($0, at: offset) }
            let (crc, rawCount, storedCount) = header.withUnsafeBytes { h in
                (UInt32(littleEndian: h.loadUnaligned(fromByteOffset: 0, as: UInt32.self)),
                 Int(UInt32(littleEndian: h.loadUnaligned(fromByteOffset: 4, as: UInt32.self))),
                 Int(UInt32(littleEndian: h.loadUnaligned(fromByteOffset: 8, as: UInt32.self))))
            }
            guard rawCount <= Self.maximumSideFileBlock, storedCount <= rawCount,
                  offset + Int64(SideFileFormat.frameHeader + storedCount) <= size
            else { throw corrupt("impossible frame lengths", at: offset) }
            if stored.count < storedCount { stored = [UInt8](repeating: 0, count: storedCount) }
            try stored.withUnsafeMutableBytes { try read(UnsafeMutableRawBufferPointer(rebasing: $0[0..<storedCount]), at: offset + Int64(SideFileFormat.frameHeader)) }
            let check = stored.withUnsafeBytes { s in
                CRC32C.checksum(UnsafeRawBufferPointer(rebasing: s[0..<storedCount]),
                                extending: header.withUnsafeBytes { CRC32C.checksum(UnsafeRawBufferPointer(rebasing: $0[4...])) })
            }
            guard check == crc else { throw corrupt("checksum mismatch", at: offset) }
            let frameStart = offset
            offset += Int64(SideFileFormat.frameHeader + storedCount)
            if rawCount == 0 {
                guard offset == size else { throw corrupt("bytes after the end marker", at: offset) }
                return true
            }
            if storedCount == rawCount {
                try stored.withUnsafeBytes { try body(UnsafeRawBufferPointer(rebasing: $0[0..<rawCount])) }
            } else {
                if raw.count < rawCount { raw = [UInt8](repeating: 0, count: rawCount) }
                let ok = stored.withUnsafeBytes { s in
                    raw.withUnsafeMutableBytes { r in
                        LZ4.decompress(UnsafeRawBufferPointer(rebasing: s[0..<storedCount]), into: UnsafeMutableRawBufferPointer(rebasing: r[0..<rawCount]))
                    }
                }
                guard ok else { throw corrupt("the block does not decompress", at: frameStart) }
                try raw.withUnsafeBytes { try body(UnsafeRawBufferPointer(rebasing: $0[0..<rawCount])) }
            }
        }
    }
}
