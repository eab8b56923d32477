import Dispatch
@_spi(Testing) import FerryLog
import Synchronization

/// A checkpoint: the stored state at an LSN — the server cache, the pending writes and their
/// overlay — as references into the log (values stay in the log's records). Written beside
/// the log as a side file of checksummed, compressed blocks, streamed both ways so that
/// neither writing nor loading one holds the whole file; the newest one that checks out bounds
/// the replay of the next open. See FORMAT.md ("Checkpoints").
enum Checkpoint {
    static let prefix = "checkpoint-"
    static let magic = Array("FERRYCKP".utf8)
    /// The version written. Versions 2 (no sync cursor, no rejected writes), 3 (no pins),
    /// 4 (no child-value indexes), 5 (indexes entry by entry, not a chunk at a time) and 6 are
    /// still read. 7 and 8 are 6's layout with nulls that stand for a write folded elsewhere
    /// (which a build that reads 6 alone would take for values, so it skips them and replays the
    /// log): in 8 they are ``LayeredEntry/isFoldedNull`` (length 0 and an LSN); in 7 any null
    /// entry's bytes may be one, so every null stored entry of a 7 is read as a folded null.
    static let version: UInt16 = 8
    /// Blocks are cut once they pass this many bytes.
    static let blockTarget = 256 << 10
    /// Pending writes per batch (format 6).
    static let pendingBatch = 256

    enum Section: UInt8 {
        case server = 1, pending = 2, overlay = 3, rejected = 4, pins = 5, childIndexes = 6
    }

    static func fileName(_ lsn: UInt64) -> String {
        let h = String(lsn, radix: 16)
        return prefix + String(repeating: "0", count: max(0, 16 - h.count)) + h + ".ckp"
    }

    static func lsn(of name: String) -> UInt64? {
        guard name.hasPrefix(prefix), name.hasSuffix(".ckp") else { return nil }
        return UInt64(name.dropFirst(prefix.count).dropLast(4), radix: 16)
    }

    /// The longest path key a checkpoint can hold: the longest legal path (``Path/maxDepth``
    /// keys of 768 bytes, each followed by its 0 byte) and a `.priority` key below it.
    static let maxKeyBytes = Path.maxDepth * (768 + 1) + ".priority".utf8.count + 1

    static func damaged(_ why: String) -> DatabaseError { DatabaseError(.storage, "a checkpoint is damaged: \(why)") }
}

/// Writes keys as (bytes shared with the previous key, the rest), which neighbouring paths
/// make short.
struct KeyDelta {
    var previous: [UInt8] = []

    mutating func write(_ key: UnsafeRawBufferPointer, into w: inout ByteWriter) {
        var shared = 0
        let n = min(previous.count, key.count)
        while shared < n && previous[shared] == key[shared] { shared += 1 }
        w.varint(UInt64(shared))
        w.varint(UInt64(key.count - shared))
        w.bytes.append(contentsOf: UnsafeRawBufferPointer(rebasing: key[shared...]))
        previous.removeSubrange(shared...)
        previous.append(contentsOf: UnsafeRawBufferPointer(rebasing: key[shared...]))
    }

    /// Reads the next key into `previous`; returns whether it sorts after the one it replaced
    /// (for a key that shares no bytes with an empty `previous`, whether it is non-empty).
    mutating func read(_ r: inout ByteReader) throws -> Bool {
        let shared = try r.varintCount()
        let rest = try r.varintCount()
        guard shared <= previous.count, rest <= r.bytes.count - r.offset, shared + rest <= Checkpoint.maxKeyBytes else {
            throw Checkpoint.damaged("a key does not fit its block, or is longer than the longest path (\(Checkpoint.maxKeyBytes) bytes)")
        }
        let restBytes = UnsafeRawBufferPointer(rebasing: r.bytes[r.offset..<(r.offset + rest)])
        let rises = rest > 0 && (shared == previous.count || restBytes[0] > previous[shared])
        previous.removeLast(previous.count - shared)
        previous.append(contentsOf: restBytes)
        r.offset += rest
        return rises
    }
}

/// What a checkpoint holds, taken under the engine's lock in O(1) (the indexes and the list
/// are copied on write), so that the file is written while writes go on.
struct CheckpointImage {
    let server: PathIndex<LayeredEntry>
    let pending: PendingList
    let overlay: PathIndex<LayeredEntry>
    /// The sync cursor.
    let ackedThrough: Int64
    /// Rejected writes: (id, LSN of the rejection record), by id.
    let rejected: [(id: Int64, lsn: UInt64)]
    /// `keepSynced` pins, as path keys in key order.
    let pins: [[UInt8]]
    /// The child-value indexes that are up to date: location and child as path keys, and the
    /// sort keys in order.
    let childIndexes: [(location: [UInt8], child: [UInt8], keys: PathIndex<UInt8>)]

    /// The child-value indexes written: those whose sort keys are all within
    /// ``Checkpoint/maxKeyBytes`` (a longer one — a string value of over 8,000 characters — is
    /// left out, and rebuilt from the data by the next open that needs it).
    var keptIndexes: [(location: [UInt8], child: [UInt8], keys: PathIndex<UInt8>)] {
        childIndexes.filter { $0.keys.longestKey <= Checkpoint.maxKeyBytes }
    }

    /// Streams the checkpoint into `out`, a block at a time, in format `version` (the current
    /// one; tests write format 5 to check that it is still read).
    func write(storeID: StoreID, nextLSN: UInt64, to out: SideFileBlockWriter, version: UInt16 = Checkpoint.version) throws {
        precondition(version == Checkpoint.version || version == 5, "only formats 5 and 8 are written")
        let childIndexes = keptIndexes
        var w = ByteWriter(capacity: Checkpoint.blockTarget + 8192)
        w.bytes.append(contentsOf: Checkpoint.magic)
        withUnsafeBytes(of: version.littleEndian) { w.bytes.append(contentsOf: $0) }
        withUnsafeBytes(of: storeID.high.littleEndian) { w.bytes.append(contentsOf: $0) }
        withUnsafeBytes(of: storeID.low.littleEndian) { w.bytes.append(contentsOf: $0) }
        withUnsafeBytes(of: nextLSN.littleEndian) { w.bytes.append(contentsOf: $0) }
        w.varint(UInt64(server.count))
        w.varint(UInt64(pending.count))
        w.varint(UInt64(overlay.count))
        w.varint(UInt64(pending.keyBytes))
        w.signed(ackedThrough)
        w.varint(UInt64(rejected.count))
        w.varint(UInt64(pins.count))
        w.varint(UInt64(childIndexes.reduce(0) { $0 + 1 + $1.keys.count }))  // a start per index, and its keys
        try w.bytes.withUnsafeBytes { try out.write($0) }
        w.bytes.removeAll(keepingCapacity: true)

        var keys = KeyDelta()
        var previousID: Int64 = 0
        func startBlockIfNeeded(_ section: Checkpoint.Section) throws {
            if w.count >= Checkpoint.blockTarget { try flush() }
            if w.count == 0 {
                w.u8(section.rawValue)
                keys.previous.removeAll(keepingCapacity: true)
                previousID = 0
            }
        }
        func flush() throws {
            if w.count > 0 { try w.bytes.withUnsafeBytes { try out.write($0) } }
            w.bytes.removeAll(keepingCapacity: true)
        }
        func entry(_ e: LayeredEntry) {
            precondition(!e.isInline, "only stored values are checkpointed")
            let ref = e.ref
            w.u8((e.isEmpty ? 1 : 0) | (e.hasPriority ? 2 : 0))
            w.varint(ref.lsn)
            w.varint(UInt64(ref.offset))
            w.varint(UInt64(ref.length))
        }
        /// Format 6: an index's chunks as they are in memory (the loader appends each whole).
        func chunks<E>(_ index: PathIndex<E>, _ section: Checkpoint.Section, tag: UInt8?, _ entry: (E) -> Void) throws {
            for chunk in index.chunks where chunk.count > 0 {
                try startBlockIfNeeded(section)
                if let tag { w.u8(tag) }
                w.varint(UInt64(chunk.count))
                w.varint(UInt64(chunk.prefix.count))
                w.bytes.append(contentsOf: chunk.prefix)
                w.varint(UInt64(chunk.suffixes.count))
                w.bytes.append(contentsOf: chunk.suffixes)
                var start: UInt32 = 0
                for end in chunk.ends {
                    w.varint(UInt64(end - start))
                    start = end
                }
                for e in chunk.entries { entry(e) }
            }
        }
        func entries(_ index: PathIndex<LayeredEntry>, _ section: Checkpoint.Section) throws {
            if version >= 6 {
                try chunks(index, section, tag: nil, entry)
            } else {
                try index.forEach(withPrefix: []) { key, e in
                    try startBlockIfNeeded(section)
                    keys.write(key, into: &w)
                    entry(e)
                }
            }
            try flush()
        }
        try entries(server, .server)
        if version >= 6 {
            // Batches: the ids, the flags, each path key's length, the keys end to end.
            var i = 0
            while i < pending.count {
                try startBlockIfNeeded(.pending)
                let batch = i..<min(pending.count, i + Checkpoint.pendingBatch)
                w.varint(UInt64(batch.count))
                for j in batch {
                    let id = pending.id(at: j)
                    w.signed(id &- previousID)
                    previousID = id
                }
                for j in batch { w.u8(pending.flags(at: j)) }
                for j in batch { pending.withKey(at: j) { w.varint(UInt64($0.count)) } }
                for j in batch { pending.withKey(at: j) { w.bytes.append(contentsOf: $0) } }
                i = batch.upperBound
            }
        } else {
            for i in 0..<pending.count {
                try startBlockIfNeeded(.pending)
                let id = pending.id(at: i)
                w.signed(id &- previousID)
                previousID = id
                w.u8(pending.flags(at: i))
                pending.withKey(at: i) { keys.write($0, into: &w) }
            }
        }
        try flush()
        try entries(overlay, .overlay)
        for (id, lsn) in rejected {
            try startBlockIfNeeded(.rejected)
            w.signed(id &- previousID)
            previousID = id
            w.varint(lsn)
        }
        try flush()
        for key in pins {
            try startBlockIfNeeded(.pins)
            key.withUnsafeBytes { keys.write($0, into: &w) }
        }
        try flush()
        for index in childIndexes {
            try startBlockIfNeeded(.childIndexes)
            w.u8(0)
            w.varint(UInt64(index.location.count))
            w.bytes.append(contentsOf: index.location)
            w.varint(UInt64(index.child.count))
            w.bytes.append(contentsOf: index.child)
            w.varint(UInt64(index.keys.count))
            keys.previous.removeAll(keepingCapacity: true)  // (each index's keys rise from its start)
            if version >= 6 {
                try chunks(index.keys, .childIndexes, tag: 2) { _ in }
            } else {
                try index.keys.forEach(withPrefix: []) { key, _ in
                    try startBlockIfNeeded(.childIndexes)
                    w.u8(1)
                    keys.write(key, into: &w)
                }
            }
        }
        try flush()
    }
}

extension Engine {
    var checkpointImage: CheckpointImage {
        for index in childIndexes { index.refresh() }
        return CheckpointImage(server: server.index, pending: writeTree.pending, overlay: writeTree.overlay.index,
                               ackedThrough: ledger.ackedThrough, rejected: ledger.rejected.sorted { $0.key < $1.key }.map { ($0.key, $0.value) },
                               pins: pins.map { PathKey.encode($0) }.sorted { a, b in a.lexicographicallyPrecedes(b) },
                               childIndexes: childIndexes.filter { $0.isCurrent && !$0.automatic }.map { ($0.locationKey, PathKey.encode($0.child), $0.sorted) })
    }

    /// Loads the newest checkpoint that checks out; returns the LSN replay starts at (the
    /// first record after it, or the log's first record without one). A damaged or foreign
    /// checkpoint is skipped with a warning: the log still holds everything.
    func loadLatestCheckpoint() throws -> UInt64 {
        guard let log else { return 1 }
        let names = (try log.sideFiles(withPrefix: Checkpoint.prefix)).compactMap { n in Checkpoint.lsn(of: n).map { (n, $0) } }
        for (name, lsn) in names.sorted(by: { $0.1 > $1.1 }) {
            do {
                let state = CheckpointState(indexing: childIndexes)
                var loader = CheckpointLoader(into: state, storeID: log.storeID, expectedLSN: lsn,
                                              firstLSN: log.firstLSN.rawValue, nextLSN: log.nextLSN.rawValue)
                guard try loader.load({ try log.readSideFile(named: name, blocks: $0) }) else { continue }
                install(state)
                noteCheckpoint(at: lsn)
                return lsn
            } catch {
                // (Nothing of it was installed: the engine is as it was.)
                logger.warning("ignoring checkpoint \(name): \(error); replaying the log instead")
            }
        }
        return log.firstLSN.rawValue
    }
}

/// The second thread of a checkpoint's load, and what it did: `loader` is used from its
/// queue only, and by the reading thread once that queue is drained.
private final class SideLoader: @unchecked Sendable {
    let queue = DispatchQueue(label: "ferry.checkpoint-load")
    /// Blocks handed over and not yet loaded, at most this many (about 16 MiB): enough for the
    /// reading thread to go on to the overlay, which follows the pending writes, while this
    /// one restores them (with 4, it waited for them: an open of a million pending posts took
    /// 0.14 s instead of 0.12 s), and still a bound.
    let slots = DispatchSemaphore(value: 64)
    var loader: CheckpointLoader?
    /// The first error of either thread: both stop at it.
    let failure = FerryMutex<(any Error)?>(nil)

    var error: (any Error)? { failure.withLock { $0 } }
    var failed: Bool { error != nil }
    func fail(_ error: any Error) { failure.withLock { if $0 == nil { $0 = error } } }
}

/// What a checkpoint restores — the server cache, the pending writes and their overlay, the
/// sync cursor and rejected writes, the pins, the declared child-value indexes — loaded apart
/// from the engine, which installs it whole once it has checked out (``Engine/install(_:)``):
/// a damaged checkpoint leaves the engine untouched. (A class: the load's two threads fill
/// different parts of it, as ``CheckpointLoader/load(_:)`` says.)
final class CheckpointState: @unchecked Sendable {
    let server = LayeredIndex()
    let writeTree = WriteTree()
    var pins: Set<Path> = []
    var rejected: [Int64: UInt64] = [:]
    var ackedThrough: Int64 = 0
    /// One per declared index (same location and child), to receive its sort keys.
    let childIndexes: [ChildValueIndex]

    init(indexing declared: [ChildValueIndex]) {
        childIndexes = declared.filter { !$0.automatic }.map { ChildValueIndex(location: $0.location, child: $0.child) }
    }
}

extension Engine {
    /// Takes a loaded checkpoint's state as the engine's (see ``CheckpointState``).
    func install(_ state: CheckpointState) {
        install(server: state.server, writeTree: state.writeTree, pins: state.pins,
                ackedThrough: state.ackedThrough, rejected: state.rejected, childIndexes: state.childIndexes)
    }
}

/// Puts a checkpoint's blocks into a ``CheckpointState`` as they are read.
struct CheckpointLoader {
    let state: CheckpointState
    let storeID: StoreID
    let expectedLSN: UInt64
    let firstLSN: UInt64
    let nextLSN: UInt64
    var expected: (server: UInt64, pending: UInt64, overlay: UInt64, rejected: UInt64, pins: UInt64, indexes: UInt64)?
    var counts: (server: UInt64, pending: UInt64, overlay: UInt64, rejected: UInt64, pins: UInt64, indexes: UInt64) = (0, 0, 0, 0, 0, 0)
    /// The declared child-value index the section's keys go to (nil: an index no longer
    /// declared, whose keys are skipped), and how many keys it announced and got.
    var currentIndex: ChildValueIndex?
    var indexKeys: (announced: UInt64, read: UInt64) = (0, 0)
    var restoredIndexes: [(ChildValueIndex, announced: UInt64, read: UInt64)] = []
    var lastSection: UInt8 = 0
    var keys = KeyDelta()
    /// The section's previous key: keys must rise (the indexes are rebuilt by appending).
    var lastKey: [UInt8] = []
    var hasLastKey = false
    var lastID: Int64 = .min
    var lastRejectedID: Int64 = .min
    /// The checkpoint's format version (from its header).
    var version: UInt16 = 0

    init(into state: CheckpointState, storeID: StoreID, expectedLSN: UInt64, firstLSN: UInt64, nextLSN: UInt64) {
        self.state = state
        self.storeID = storeID
        self.expectedLSN = expectedLSN
        self.firstLSN = firstLSN
        self.nextLSN = nextLSN
    }

    mutating func block(_ bytes: UnsafeRawBufferPointer) throws {
        var r = ByteReader(bytes)
        guard expected != nil else { return try header(&r) }
        guard let section = Checkpoint.Section(rawValue: try r.u8()), section.rawValue >= lastSection else {
            throw Checkpoint.damaged("blocks out of order")
        }
        if section.rawValue != lastSection { hasLastKey = false }
        lastSection = section.rawValue
        keys.previous.removeAll(keepingCapacity: true)
        var previousID: Int64 = 0
        var first = true
        while !r.atEnd {
            switch section {
            case .server where version >= 6, .overlay where version >= 6:
                var depths: [Int] = []
                depths.reserveCapacity(PathIndex<LayeredEntry>.chunkCapacity)
                let chunk = try chunkKeys(&r) { key in
                    guard let depth = PathKey.depth(key) else { return false }
                    depths.append(depth)
                    return true
                }
                guard let chunk else { throw Checkpoint.damaged("a key is not a path, or keys are out of order") }
                var entries: [LayeredEntry] = []
                entries.reserveCapacity(depths.count)
                for depth in depths { entries.append(try entry(&r, depth: depth)) }
                let index = section == .server ? state.server : state.writeTree.overlay
                index.restoreChunk(prefix: chunk.prefix, suffixes: chunk.suffixes, ends: chunk.ends, entries: entries)
                if section == .server { counts.server += UInt64(entries.count) } else { counts.overlay += UInt64(entries.count) }
            case .server, .overlay:
                let rises = try keys.read(&r)
                if first {
                    // The first key of a block follows the last of the section's previous block.
                    if hasLastKey, keys.previous.withUnsafeBytes({ k in lastKey.withUnsafeBytes { compareBytes(k, $0) } }) <= 0 {
                        throw Checkpoint.damaged("keys out of order")
                    }
                } else if !rises {
                    throw Checkpoint.damaged("keys out of order")
                }
                guard let depth = keys.previous.withUnsafeBytes({ PathKey.depth($0) }) else { throw Checkpoint.damaged("a key is not a path") }
                let entry = try entry(&r, depth: depth)
                let index = section == .server ? state.server : state.writeTree.overlay
                keys.previous.withUnsafeBytes { index.restore(entry, key: $0) }
                if section == .server { counts.server += 1 } else { counts.overlay += 1 }
            case .pins:
                _ = try keys.read(&r)
                guard keys.previous.withUnsafeBytes({ PathKey.depth($0) }) != nil else { throw Checkpoint.damaged("a pin is not a path") }
                state.pins.insert(PathKey.decode(keys.previous))
                counts.pins += 1
            case .childIndexes:
                let kind = try r.u8()
                if kind == 0 {
                    counts.indexes += 1
                    closeIndex()
                    func pathKey() throws -> [UInt8] {
                        let n = try r.varintCount()
                        guard n <= Checkpoint.maxKeyBytes, n <= r.bytes.count - r.offset else { throw Checkpoint.damaged("an index's path does not fit its block") }
                        defer { r.offset += n }
                        return Array(r.bytes[r.offset..<(r.offset + n)])
                    }
                    let location = try pathKey(), child = try pathKey()
                    indexKeys = (try r.varint(), 0)
                    keys.previous.removeAll(keepingCapacity: true)
                    currentIndex = state.childIndexes.first { $0.locationKey == location && PathKey.encode($0.child) == child && $0.sorted.isEmpty }
                    hasLastKey = false
                } else if version >= 6 {
                    guard kind == 2 else { throw Checkpoint.damaged("an index record of an unknown kind") }
                    let chunk = try chunkKeys(&r) { SortKey.keyStart($0) != nil }
                    guard let chunk else { throw Checkpoint.damaged("an index key is not a sort key, or keys are out of order") }
                    counts.indexes += UInt64(chunk.ends.count)
                    indexKeys.read += UInt64(chunk.ends.count)
                    currentIndex?.restoreChunk(prefix: chunk.prefix, suffixes: chunk.suffixes, ends: chunk.ends)
                } else {
                    counts.indexes += 1
                    let rises = try keys.read(&r)
                    guard first || rises else { throw Checkpoint.damaged("index keys out of order") }
                    indexKeys.read += 1
                    if let index = currentIndex, !index.restore(keys.previous) { throw Checkpoint.damaged("an index key is not a sort key") }
                }
            case .rejected:
                let id = previousID &+ (try r.signed())
                previousID = id
                let lsn = try r.varint()
                guard id > lastRejectedID else { throw Checkpoint.damaged("rejected writes out of order") }
                lastRejectedID = id
                guard lsn >= firstLSN && lsn < expectedLSN else { throw Checkpoint.damaged("it names rejection record \(lsn), outside the log") }
                state.rejected[id] = lsn
                counts.rejected += 1
            case .pending where version >= 6:
                let n = try r.varintCount()
                guard n >= 1, n <= Checkpoint.pendingBatch else { throw Checkpoint.damaged("a batch of pending writes does not fit its block") }
                var ids: [Int64] = []
                ids.reserveCapacity(n)
                for _ in 0..<n {
                    let id = previousID &+ (try r.signed())
                    previousID = id
                    guard id >= firstLSN && UInt64(id) < expectedLSN else {
                        throw Checkpoint.damaged("it names pending write \(id), outside the log")
                    }
                    ids.append(id)
                }
                guard n <= r.bytes.count - r.offset else { throw Checkpoint.damaged("a batch of pending writes does not fit its block") }
                let flags = UnsafeRawBufferPointer(rebasing: r.bytes[r.offset..<(r.offset + n)])
                r.offset += n
                var ends: [UInt32] = []
                ends.reserveCapacity(n)
                var end = 0
                for _ in 0..<n {
                    let length = try r.varintCount()
                    guard length <= Checkpoint.maxKeyBytes else { throw Checkpoint.damaged("a pending write's path is longer than the longest path") }
                    end += length
                    ends.append(UInt32(truncatingIfNeeded: end))
                }
                guard end <= r.bytes.count - r.offset else { throw Checkpoint.damaged("a batch of pending writes does not fit its block") }
                let keyBytes = UnsafeRawBufferPointer(rebasing: r.bytes[r.offset..<(r.offset + end)])
                r.offset += end
                guard state.writeTree.restorePending(ids: ids, flags: flags, keys: keyBytes, keyEnds: ends) else {
                    throw Checkpoint.damaged("pending writes out of order, unknown flags, or a path that is not a path")
                }
                counts.pending += UInt64(n)
            case .pending:
                let id = previousID &+ (try r.signed())
                previousID = id
                guard id > lastID else { throw Checkpoint.damaged("pending writes out of order") }
                guard id >= firstLSN && UInt64(id) < expectedLSN else {
                    throw Checkpoint.damaged("it names pending write \(id), outside the log")
                }
                lastID = id
                let flags = try r.u8()
                _ = try keys.read(&r)
                guard keys.previous.withUnsafeBytes({ state.writeTree.restorePending(id, flags: flags, key: $0) }) else {
                    throw Checkpoint.damaged("a pending write's path is not a path")
                }
                counts.pending += 1
            }
            first = false
        }
        if version < 6 && !first && (section == .server || section == .overlay) {
            lastKey.removeAll(keepingCapacity: true)
            lastKey.append(contentsOf: keys.previous)
            hasLastKey = true
        }
    }

    /// A stored entry's flags and reference, checked against the log.
    private func entry(_ r: inout ByteReader, depth: Int) throws -> LayeredEntry {
        let flags = try r.u8()
        let lsn = try r.varint(), offset = try r.varint(), length = try r.varint()
        guard offset <= UInt64(UInt32.max), length < 1 << 31 else { throw Checkpoint.damaged("a value's place is out of range") }
        var ref = ValueRef(lsn: lsn, offset: UInt32(offset), length: UInt32(length))
        // Format 7 did not tell a folded null from a null: any may be one (see `version`).
        if version == 7, flags & 1 != 0, length != 0 { ref = ValueRef(lsn: lsn, offset: 0, length: 0) }
        guard flags <= (version >= 5 ? 3 : 1), ref.lsn <= LayeredEntry.largestLSN,
              ref.length == 0 || (ref.lsn >= firstLSN && ref.lsn < expectedLSN) else {
            throw Checkpoint.damaged("it refers to record \(ref.lsn), outside the log")
        }
        return LayeredEntry(ref: ref, empty: flags & 1 != 0, depth: depth, priority: flags & 2 != 0)
    }

    /// The keys of one chunk (format 6): their count, the prefix they share, the rest of each
    /// end to end, and each rest's length. Nil when a key fails `check` or the keys do not rise
    /// (from the section's previous key on); the chunk's parts as ``PathIndex`` keeps them.
    private mutating func chunkKeys(_ r: inout ByteReader, _ check: (UnsafeRawBufferPointer) -> Bool) throws -> (prefix: [UInt8], suffixes: [UInt8], ends: [UInt32])? {
        let n = try r.varintCount()
        let prefixCount = try r.varintCount()
        guard n >= 1, n <= PathIndex<UInt8>.chunkCapacity, prefixCount <= Checkpoint.maxKeyBytes, prefixCount <= r.bytes.count - r.offset else {
            throw Checkpoint.damaged("a chunk of keys does not fit its block")
        }
        let prefix = UnsafeRawBufferPointer(rebasing: r.bytes[r.offset..<(r.offset + prefixCount)])
        r.offset += prefixCount
        let suffixCount = try r.varintCount()
        guard suffixCount <= r.bytes.count - r.offset else { throw Checkpoint.damaged("a chunk of keys does not fit its block") }
        let suffixes = UnsafeRawBufferPointer(rebasing: r.bytes[r.offset..<(r.offset + suffixCount)])
        r.offset += suffixCount
        var ends: [UInt32] = []
        ends.reserveCapacity(n)
        // Each whole key in turn, in one buffer: the prefix, then the key's rest.
        let key = UnsafeMutableRawBufferPointer.allocate(byteCount: prefixCount + suffixCount, alignment: 1)
        defer { key.deallocate() }
        if prefixCount > 0 { key.baseAddress!.copyMemory(from: prefix.baseAddress!, byteCount: prefixCount) }
        var start = 0, previousStart = 0
        for i in 0..<n {
            let length = try r.varintCount()
            guard length <= suffixCount - start, prefixCount + length <= Checkpoint.maxKeyBytes else {
                throw Checkpoint.damaged("a chunk of keys does not fit its block")
            }
            let rest = UnsafeRawBufferPointer(rebasing: suffixes[start..<(start + length)])
            // Keys share the prefix: the rests must rise.
            guard i == 0 || compareBytes(UnsafeRawBufferPointer(rebasing: suffixes[previousStart..<start]), rest) < 0 else { return nil }
            if length > 0 { (key.baseAddress! + prefixCount).copyMemory(from: rest.baseAddress!, byteCount: length) }
            let whole = UnsafeRawBufferPointer(rebasing: key[0..<(prefixCount + length)])
            if i == 0 && hasLastKey && lastKey.withUnsafeBytes({ compareBytes(whole, $0) }) <= 0 { return nil }
            guard check(whole) else { return nil }
            previousStart = start
            start += length
            ends.append(UInt32(start))
        }
        guard start == suffixCount else { throw Checkpoint.damaged("a chunk of keys does not fit its block") }
        lastKey.removeAll(keepingCapacity: true)
        lastKey.append(contentsOf: prefix)
        lastKey.append(contentsOf: UnsafeRawBufferPointer(rebasing: suffixes[previousStart..<start]))
        hasLastKey = true
        return (Array(prefix), Array(suffixes), ends)
    }

    private mutating func header(_ r: inout ByteReader) throws {
        guard r.bytes.count >= 37, Array(r.bytes[0..<8]) == Checkpoint.magic else { throw Checkpoint.damaged("not a checkpoint") }
        let version = UInt16(littleEndian: r.bytes.loadUnaligned(fromByteOffset: 8, as: UInt16.self))
        guard (2...Checkpoint.version).contains(version) else {
            throw DatabaseError(.storage, "checkpoint format version \(version) is not understood by this build")
        }
        let high = UInt64(littleEndian: r.bytes.loadUnaligned(fromByteOffset: 10, as: UInt64.self))
        let low = UInt64(littleEndian: r.bytes.loadUnaligned(fromByteOffset: 18, as: UInt64.self))
        guard StoreID(high: high, low: low) == storeID else { throw Checkpoint.damaged("it belongs to another store") }
        let next = UInt64(littleEndian: r.bytes.loadUnaligned(fromByteOffset: 26, as: UInt64.self))
        guard next == expectedLSN, next <= nextLSN else { throw Checkpoint.damaged("its LSN \(next) does not fit the log") }
        r.offset = 34
        let (server, pending, overlay) = (try r.varint(), try r.varint(), try r.varint())
        let pendingKeyBytes = try r.varint()
        var ackedThrough: Int64 = 0, rejected: UInt64 = 0, pins: UInt64 = 0, indexes: UInt64 = 0
        if version >= 3 {
            ackedThrough = try r.signed()
            rejected = try r.varint()
        }
        if version >= 4 { pins = try r.varint() }
        if version >= 5 { indexes = try r.varint() }
        self.version = version
        expected = (server, pending, overlay, rejected, pins, indexes)
        guard r.atEnd else { throw Checkpoint.damaged("trailing bytes in its header") }
        state.ackedThrough = ackedThrough
        // Before format 5 an entry does not say whether its value carries a priority.
        state.server.knowsPriorities = version >= 5
        state.writeTree.overlay.knowsPriorities = version >= 5
        // Room for what the header announces, within reason: it is not trusted further, and a
        // damaged count must not reserve gigabytes (beyond this, the list grows as it loads).
        let room = Int(min(expected!.pending, 1 << 20)), bytes = Int(min(pendingKeyBytes, 64 << 20))
        state.writeTree.reservePending(room, keyBytes: bytes)
    }

    fileprivate mutating func closeIndex() {
        if let index = currentIndex { restoredIndexes.append((index, indexKeys.announced, indexKeys.read)) }
        currentIndex = nil
    }

    /// Loads the checkpoint whose blocks `read` hands over (false: there is none), then checks
    /// it whole (``finish()``). The pending writes and the child-value indexes are put back on
    /// a second thread while this one reads the blocks and puts back the layered indexes: they
    /// touch none of the same state (the write tree's pending list, and the indexes' sorted
    /// keys, against the server cache, the overlay, rejections and pins), and an open on two
    /// cores takes about a third less time. An open and the fuzz target both load this way.
    mutating func load(_ read: ((UnsafeRawBufferPointer) throws -> Void) throws -> Bool) throws -> Bool {
        let side = SideLoader()
        var lastSection: UInt8 = 0
        let found: Bool
        do {
            defer { side.queue.sync {} }  // (nothing may be reset while the second thread works)
            do {
                found = try read { bytes in
                    guard expected != nil else {
                        try block(bytes)
                        side.loader = self  // (the header's facts; nothing restored yet)
                        return
                    }
                    if let error = side.error { throw error }
                    guard let section = bytes.first, section >= lastSection else { throw Checkpoint.damaged("blocks out of order") }
                    lastSection = section
                    guard section == Checkpoint.Section.pending.rawValue || section == Checkpoint.Section.childIndexes.rawValue else {
                        return try block(bytes)
                    }
                    side.slots.wait()
                    let copy = Array(bytes)
                    side.queue.async {
                        defer { side.slots.signal() }
                        guard !side.failed else { return }
                        do { try copy.withUnsafeBytes { try side.loader!.block($0) } } catch { side.fail(error) }
                    }
                }
            } catch {
                side.fail(error)
                throw error
            }
        }
        if let error = side.error { throw error }
        guard found else { return false }
        if let other = side.loader { merge(other) }
        try finish()
        return true
    }

    /// Takes in what a loader given the other sections' blocks restored.
    mutating func merge(_ other: CheckpointLoader) {
        closeIndex()
        var other = other
        other.closeIndex()
        counts = (counts.server + other.counts.server, counts.pending + other.counts.pending, counts.overlay + other.counts.overlay,
                  counts.rejected + other.counts.rejected, counts.pins + other.counts.pins, counts.indexes + other.counts.indexes)
        restoredIndexes += other.restoredIndexes
    }

    /// Checks that every entry the header announced arrived; the child-value indexes that
    /// arrived whole are then current.
    mutating func finish() throws {
        closeIndex()
        guard let expected, expected == counts else { throw Checkpoint.damaged("entries are missing") }
        for (index, announced, read) in restoredIndexes {
            guard announced == read else { throw Checkpoint.damaged("a child-value index is missing keys") }
            index.finishRestore()
        }
    }
}

extension EngineHost {
    /// Writes a checkpoint once the upkeep's job under way (and those asked before) ended; a
    /// memory-only store has none.
    func checkpointAfterOtherJobs() async throws {
        guard let log else { return }
        try await maintenance.run { try await writeCheckpoint(log) }
    }

    /// Writes a checkpoint; the caller holds the maintenance lock.
    func writeCheckpoint(_ log: WriteAheadLog) async throws {
        let (image, lsn) = try withEngine { e -> (CheckpointImage, UInt64) in
            try e.checkUsable()
            return (e.checkpointImage, log.nextLSN.rawValue)
        }
        do {
            try await log.sync()  // every record the checkpoint refers to must be durable first
            let name = Checkpoint.fileName(lsn)
            let format = upkeep.checkpointFormat
            try log.writeSideFile(named: name) { try image.write(storeID: log.storeID, nextLSN: lsn, to: $0, version: format) }
            CrashPoint.hit("checkpoint.afterRename")
            try log.removeSideFiles(named: try log.sideFiles(withPrefix: Checkpoint.prefix).filter { $0 != name })
            noteCheckpointWritten(log, name: name)
            CrashPoint.hit("checkpoint.afterRemoveOld")
        } catch {
            throw maintenanceFailure("writing a checkpoint", error)
        }
        withEngine {
            $0.noteCheckpoint(at: lsn)
        }
    }
}
