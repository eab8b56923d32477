import FerryDocuments
import FerryLog
import Foundation

/// A server document store's checkpoint: its documents, deletions and client marks below an
/// LSN, so that an open reads them and replays only the records after it, and the segments
/// below it can be deleted (FORMAT.md, *Server document stores*).
///
/// It is written once the records since the last one weigh ``DocumentStore/checkpointBytes``
/// and the last checkpoint (writing the whole state then costs, amortized, a constant per
/// byte committed), and on close when what was committed since weighs an eighth of it or more. The image is taken by the store's writer between two groups,
/// when every record in the log is installed and nothing else is, so it is exactly the log
/// below its LSN; it is encoded and written beside the writer, which goes on committing.
struct StoreCheckpoint: Sendable {
    static let fileName = ServerDocumentRecord.checkpointFileName
    static let version: UInt8 = 1

    /// Records below this LSN are in the checkpoint.
    var throughLSN: UInt64
    var lastCommit: Int64
    var horizon: Int64
    var collections: [ResourcePath: [String: StoredDocument]]
    var tombstones: [ResourcePath: Int64]
    var marks: [String: DocumentStore.ClientMarks]

    init(_ s: DocumentStore.State, throughLSN: UInt64) {
        self.throughLSN = throughLSN
        lastCommit = s.lastCommit
        horizon = s.horizon
        collections = s.collections
        tombstones = s.tombstones
        marks = s.marks
    }

    /// Block tags: each block of the file starts with one.
    enum Tag: UInt8 {
        case header = 1, documents = 2, tombstones = 3, marks = 4, end = 5
    }

    /// Writes the checkpoint as a side file of blocks of about 1 MiB (see FORMAT.md).
    func write(to log: WriteAheadLog) throws {
        try log.writeSideFile(named: Self.fileName) { out in
            var w = PayloadWriter()
            var n: UInt32 = 0
            var tag = Tag.header
            func flush() throws {
                guard n > 0 else { return }
                var block = PayloadWriter()
                block.u8(tag.rawValue)
                block.u32(n)
                block.bytes += w.bytes
                try block.bytes.withUnsafeBytes { try out.write($0) }
                w = PayloadWriter()
                n = 0
            }
            /// Before each item: a block holds one kind of item, about 1 MiB of them.
            func item(_ t: Tag) throws {
                if t != tag || w.bytes.count >= 1 << 20 { try flush() }
                tag = t
                n += 1
            }
            w.u8(Self.version)
            w.i64(Int64(throughLSN))
            w.i64(lastCommit)
            w.i64(horizon)
            n = 1
            var count = 0
            for (parent, docs) in collections {
                for (id, d) in docs {
                    try item(.documents)
                    w.path(parent.appending(id))
                    w.i64(d.createTime)
                    w.i64(d.updateTime)
                    w.fields(d.fields)
                    count += 1
                }
            }
            for (key, time) in tombstones {
                try item(.tombstones)
                w.path(key)
                w.i64(time)
            }
            for (client, m) in marks {
                try item(.marks)
                w.string(client)
                w.i64(m.highest)
                w.i64(m.highestTime)
                w.u32(UInt32(m.answers.count))
                for (batch, answer) in m.answers {
                    w.i64(batch)
                    switch answer {
                    case .success(let time):
                        w.u8(1)
                        w.i64(time)
                    case .failure(let e):
                        w.u8(0)
                        w.u32(UInt32(e.code.rawValue))
                        w.string(e.message)
                    }
                }
            }
            try item(.end)
            w.u32(UInt32(count))
            w.u32(UInt32(tombstones.count))
            w.u32(UInt32(marks.count))
            try flush()
        }
    }

    /// The size of the checkpoint file in the store at `directory` (0: none).
    static func fileSize(in directory: String) -> Int {
        ((try? FileManager.default.attributesOfItem(atPath: directory + "/" + fileName))?[.size] as? Int) ?? 0
    }

    /// Reads the checkpoint into `s` and returns its through-LSN, or nil when there is none.
    /// A damaged or cut file throws ``FirestoreErrorCode/Code/dataLoss`` (`s` is then partly
    /// filled: the caller starts over).
    static func read(from log: WriteAheadLog, into s: inout DocumentStore.State) throws -> UInt64? {
        try read(from: log, into: &s, keeping: true)
    }

    /// Reads the checkpoint whole, checking every block and item, without building the state:
    /// its through-LSN, or nil when there is none.
    static func check(in log: WriteAheadLog) throws -> UInt64? {
        var scratch = DocumentStore.State()
        return try read(from: log, into: &scratch, keeping: false)
    }

    /// Reads the checkpoint; with `keeping` false, every item is decoded and dropped (the
    /// header and the counts are still checked).
    private static func read(from log: WriteAheadLog, into s: inout DocumentStore.State, keeping: Bool) throws -> UInt64? {
        var through: UInt64?
        var ended = false
        var counted = (documents: 0, tombstones: 0, marks: 0)
        let found: Bool
        do {
            found = try log.readSideFile(named: fileName) { block in
                var r = PayloadReader(block)
                guard !ended else { throw FirestoreErrorCode(.dataLoss, "\(fileName) has blocks after its end") }
                guard let tag = Tag(rawValue: try r.u8()) else { throw FirestoreErrorCode(.dataLoss, "\(fileName) holds a block of an unknown kind") }
                let n = try r.count()
                switch tag {
                case .header:
                    guard through == nil, n == 1 else { throw FirestoreErrorCode(.dataLoss, "\(fileName) has a header that is not its first block's one item") }
                case .end:
                    guard n == 1 else { throw FirestoreErrorCode(.dataLoss, "\(fileName) has an end block of \(n) items") }
                default:
                    guard through != nil else { throw FirestoreErrorCode(.dataLoss, "\(fileName) does not start with its header") }
                }
                for _ in 0..<n {
                    switch tag {
                    case .header:
                        let version = try r.u8()
                        guard version == Self.version else { throw FirestoreErrorCode(.dataLoss, "\(fileName) is of version \(version), which this build does not read") }
                        through = UInt64(bitPattern: try r.i64())
                        s.lastCommit = try r.i64()
                        s.horizon = try r.i64()
                    case .documents:
                        let key = try r.path()
                        let created = try r.i64(), updated = try r.i64()
                        let fields = try r.fields()
                        if keeping { s.install(key, StoredDocument(fields: fields, createTime: created, updateTime: updated), at: updated) }
                        counted.documents += 1
                    case .tombstones:
                        let key = try r.path()
                        let time = try r.i64()
                        if keeping { s.tombstones[key] = time }
                        counted.tombstones += 1
                    case .marks:
                        var m = DocumentStore.ClientMarks()
                        let client = try r.string()
                        m.highest = try r.i64()
                        m.highestTime = try r.i64()
                        for _ in 0..<(try r.count()) {
                            let batch = try r.i64()
                            if try r.u8() == 1 {
                                m.answers[batch] = .success(try r.i64())
                            } else {
                                let code = FirestoreErrorCode.Code(rawValue: Int(try r.u32())) ?? .unknown
                                m.answers[batch] = .failure(FirestoreErrorCode(code, try r.string()))
                            }
                        }
                        if keeping { s.marks[client] = m }
                        counted.marks += 1
                    case .end:
                        let want = (Int(try r.u32()), Int(try r.u32()), Int(try r.u32()))
                        guard want == counted else {
                            throw FirestoreErrorCode(.dataLoss, "\(fileName) holds \(counted) documents, deletions and clients, but its end says \(want)")
                        }
                        ended = true
                    }
                }
                guard r.atEnd else { throw FirestoreErrorCode(.dataLoss, "\(fileName) has bytes after a block's items") }
            }
        } catch let e as LogError {
            throw FirestoreErrorCode(.dataLoss, "\(fileName) is damaged: \(e)")
        }
        guard found else { return nil }
        guard ended, let through else { throw FirestoreErrorCode(.dataLoss, "\(fileName) is cut short") }
        return through
    }
}

extension DocumentStore {
    /// Writes a checkpoint of `image` (which covers `bytes` of records since the last one),
    /// reads it back (checking it, without a second copy of the state), and deletes the log's
    /// segments below it, beside the writer. A failure is logged and the bytes count again
    /// towards the next checkpoint; a failed write to the store's directory stops its log as a
    /// failed append does, so the database is then refused until the server restarts (and the
    /// log, kept whole below the failed checkpoint, replays).
    func writeCheckpoint(_ image: StoreCheckpoint, covering bytes: Int64) async {
        do {
            try image.write(to: log)
            // Read back whole before the only other copy of its records goes.
            guard try StoreCheckpoint.check(in: log) == image.throughLSN else {
                throw FirestoreErrorCode(.dataLoss, "\(StoreCheckpoint.fileName) did not read back as written")
            }
            let size = StoreCheckpoint.fileSize(in: directory)
            state.withLock { $0.lastCheckpointBytes = size }
            try await log.roll()
            let deleted = try await log.deleteSegments(before: LSN(image.throughLSN))
            logger.info("firestore \(name): checkpoint through LSN \(image.throughLSN) (\(size) bytes); \(deleted.count) segments deleted")
        } catch {
            state.withLock { $0.bytesSinceCheckpoint += bytes }
            logger.error("firestore \(name): the checkpoint failed (\(error))")
        }
    }

    /// Called by the writer between groups: starts a checkpoint in the background when the
    /// records since the last one outweigh ``checkpointBytes`` and the last checkpoint, and
    /// none is under way.
    func checkpointIfDue() {
        let image: (StoreCheckpoint, Int64)? = state.withLock { s in
            guard !s.checkpointRunning, !s.closing, s.failure == nil,
                  s.bytesSinceCheckpoint >= max(Int64(checkpointBytes), Int64(s.lastCheckpointBytes)) else { return nil }
            defer { s.bytesSinceCheckpoint = 0 }
            s.checkpointRunning = true
            return (StoreCheckpoint(s, throughLSN: log.nextLSN.rawValue), s.bytesSinceCheckpoint)
        }
        guard let image else { return }
        let task = Task { [self] in
            await writeCheckpoint(image.0, covering: image.1)
            state.withLock { $0.checkpointRunning = false }
        }
        state.withLock { $0.checkpointTask = task }
    }
}
