import FerryLog
import FerryTestSupport
import Foundation
import Logging
import Testing

@testable @_spi(Server) @_spi(Fuzzing) import Ferry

@Suite struct CheckpointTests {
    /// What a reopened store must give back: the data at a few locations and the pending writes.
    struct State: Equatable {
        var server: Value?
        var written: Value?
        var pending: [Int64]
    }

    static func state(_ db: Database) async throws -> State {
        State(server: try await db.reference("s").getData().value,
              written: try await db.reference("w").getData().value,
              pending: db.pendingWriteIDs)
    }

    static func checkpointName(_ dir: TemporaryDirectory) throws -> String? {
        try Files.list(dir.path).first { $0.hasPrefix("checkpoint-") }
    }

    @Test func aCheckpointOfManyBlocksBringsBackServerDataPendingWritesAndTheOverlay() async throws {
        let dir = try TemporaryDirectory()
        let before: State
        // Long keys that differ early fill the 256 KiB blocks with few entries: every section
        // spans several blocks.
        func key(_ i: Int) -> String { "k\(i)-" + String(repeating: "abcdefghij", count: 60) }
        do {
            let db = try Database.open(at: dir.path, options: quietOptions(.none))
            try await db.applyServerPut(at: "s", [:])
            try await db.applyServerPut(at: "w", [:])
            for i in 0..<1500 { try await db.applyServerPut(at: "s/\(key(i))", ["n": .int(Int64(i))]) }
            var ids: [Int64] = []
            for i in 0..<1500 { ids.append(try await db.reference("w/\(key(i))").setValue(.int(Int64(i))).writeID!) }
            for i in 0..<500 { try await db.acknowledgeWrite(ids[i]) }  // acknowledged in order, as a server does
            try await db.reference("w/\(key(700))").removeValue()
            before = try await Self.state(db)
            #expect(before.pending.count == 1001)
            guard case .object(let written)? = before.written else { Issue.record("no data at /w"); return }
            #expect(written.count == 1499)
            try await db.close()
        }
        // The image is several blocks long (the point of this test), and a second open finds it.
        let log = try WriteAheadLog.open(at: dir.path, options: LogOptions(durability: .none))
        var blocks = 0
        #expect(try log.readSideFile(named: try #require(try Self.checkpointName(dir))) { _ in blocks += 1 })
        #expect(blocks >= 7, "a header and at least two blocks for each of the three sections; found \(blocks)")
        try await log.close()

        let name = try #require(try Self.checkpointName(dir))
        let image = try Files.read(dir.sub(name))
        for useCheckpoint in [true, false] {
            if useCheckpoint { try Files.write(dir.sub(name), image) } else { try Files.remove(dir.sub(name)) }
            var options = quietOptions(.none)
            options.checkpointOnClose = false
            let db = try Database.open(at: dir.path, options: options)
            #expect(try await Self.state(db) == before, "with checkpoint: \(useCheckpoint)")
            try await db.close()
        }
        // Pending writes restored from the checkpoint are still acknowledged one by one.
        try Files.write(dir.sub(name), image)
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        try await db.acknowledgeWrite(before.pending[0])
        #expect(db.pendingWriteIDs == Array(before.pending.dropFirst()))
        try await db.close()
    }

    /// Format 6 keeps indexes a chunk at a time; format 5 (an entry at a time) must still be
    /// read. Both give back what replaying the whole log gives, the child-value index included.
    @Test(arguments: [UInt16(5), Checkpoint.version])
    func aCheckpointOfEitherFormatBringsBackWhatReplayingTheLogGives(format: UInt16) async throws {
        let dir = try TemporaryDirectory()
        var options = quietOptions(.none)
        options.indexes = [ChildIndex(location: "w", child: "n")]
        options.checkpointFormat = format
        func top(_ db: Database) async throws -> [String] {
            try await db.reference("w").queryOrdered(byChild: "n").queryLimited(toLast: 7).getData().children.map { $0.key! }
        }
        let before: State, topBefore: [String]
        do {
            // Hundreds of entries in each section: several chunks, and batches of pending writes.
            let db = try Database.open(at: dir.path, options: options)
            try await db.applyServerPut(at: "s", [:])
            try await db.applyServerPut(at: "w", [:])
            for i in 0..<700 { try await db.applyServerPut(at: "s/k\(i)", ["n": .int(Int64(i % 13))]) }
            var ids: [Int64] = []
            for i in 0..<900 { ids.append(try await db.reference("w/k\(i)").setValue(["n": .int(Int64(i * 7 % 901))]).writeID!) }
            for i in 0..<300 { try await db.acknowledgeWrite(ids[i]) }
            try await db.reference("w/k700").removeValue()
            try await db.reference("w/k5/n/deeper").setValue(true)  // a leaf turned into an object: a marker
            topBefore = try await top(db)
            before = try await Self.state(db)
            #expect(before.pending.count == 602)
            try await db.close()
        }
        let name = try #require(try Self.checkpointName(dir))
        let log = try WriteAheadLog.open(at: dir.path, options: LogOptions(durability: .none))
        var written: UInt16?
        _ = try log.readSideFile(named: name) { block in
            if written == nil { written = UInt16(block[8]) | UInt16(block[9]) << 8 }
        }
        try await log.close()
        #expect(written == format, "the checkpoint says the format it was written in")

        let image = try Files.read(dir.sub(name))
        options.checkpointOnClose = false
        for useCheckpoint in [true, false] {
            if !useCheckpoint { try Files.remove(dir.sub(name)) }
            let db = try Database.open(at: dir.path, options: options)
            if useCheckpoint {
                #expect(db.engine.withLock { $0.checkpointLSN } > 0, "the checkpoint was loaded")
                #expect(db.engine.withLock { $0.childIndexes.allSatisfy(\.isCurrent) }, "the index came back with it")
            }
            #expect(try await Self.state(db) == before, "with checkpoint: \(useCheckpoint)")
            #expect(try await top(db) == topBefore, "with checkpoint: \(useCheckpoint)")
            try await db.close()
        }
        try Files.write(dir.sub(name), image)
    }

    /// Chunks whose blocks check out but whose keys do not rise, or are not paths, are damage
    /// (the open then replays the log); the same chunk with its keys in order loads.
    @Test func aChunkWhoseKeysDoNotRiseIsDamage() throws {
        func checkpoint(_ keys: [String]) -> [UInt8] {
            var header = ByteWriter(capacity: 64)
            header.bytes.append(contentsOf: Checkpoint.magic)
            withUnsafeBytes(of: Checkpoint.version.littleEndian) { header.bytes.append(contentsOf: $0) }
            header.bytes.append(contentsOf: [UInt8](repeating: 7, count: 16))  // store id
            withUnsafeBytes(of: UInt64(10).littleEndian) { header.bytes.append(contentsOf: $0) }  // LSN
            for count in [UInt64(keys.count), 0, 0, 0] { header.varint(count) }
            header.signed(0)
            for count in [UInt64(0), 0, 0] { header.varint(count) }
            var block = ByteWriter(capacity: 256)
            block.u8(Checkpoint.Section.server.rawValue)
            block.varint(UInt64(keys.count))
            block.varint(0)  // no shared prefix
            let rests = keys.flatMap { Array($0.utf8) }
            block.varint(UInt64(rests.count))
            block.bytes.append(contentsOf: rests)
            for k in keys { block.varint(UInt64(k.utf8.count)) }
            for _ in keys { block.u8(1); block.varint(0); block.varint(0); block.varint(0) }  // null markers
            var input: [UInt8] = []
            for b in [header.bytes, block.bytes] { input += [UInt8(b.count & 0xff), UInt8(b.count >> 8)] + b }
            return input
        }
        func load(_ keys: [String]) throws -> UInt64 { try checkpoint(keys).withUnsafeBytes { try FuzzEntryPoints.loadCheckpoint($0) } }
        #expect(try load(["a\0", "a\0b\0", "c\0"]) == 3)
        for bad in [["c\0", "a\0"], ["a\0", "a\0"], ["a\0", "b"], ["a\0\0"]] {
            let error = #expect(throws: DatabaseError.self, "\(bad)") { try load(bad) }
            #expect(error?.message.contains("a checkpoint is damaged") == true, "\(bad): \(error?.message ?? "")")
        }
    }

    /// Format 7 wrote a write folded elsewhere as any other null (with the write's bytes), so
    /// every null stored entry of a 7 is read as a folded null (compaction restates it, the
    /// write tree re-layers); format 8 tells them apart by length.
    @Test(arguments: [UInt16(7), 8])
    func everyNullOfAFormat7CheckpointIsReadAsAFoldedWrite(format: UInt16) throws {
        var header = ByteWriter(capacity: 64)
        header.bytes.append(contentsOf: Checkpoint.magic)
        withUnsafeBytes(of: format.littleEndian) { header.bytes.append(contentsOf: $0) }
        header.bytes.append(contentsOf: [UInt8](repeating: 7, count: 16))  // store id
        withUnsafeBytes(of: UInt64(10).littleEndian) { header.bytes.append(contentsOf: $0) }  // LSN
        for count in [UInt64(2), 0, 0, 0] { header.varint(count) }
        header.signed(0)
        for count in [UInt64(0), 0, 0] { header.varint(count) }
        var block = ByteWriter(capacity: 64)
        block.u8(Checkpoint.Section.server.rawValue)
        block.varint(2)
        block.varint(0)  // no shared prefix
        block.varint(4)
        block.bytes.append(contentsOf: Array("a\0b\0".utf8))
        block.varint(2); block.varint(2)
        block.u8(1); block.varint(5); block.varint(3); block.varint(1)  // a: a null of one byte
        block.u8(0); block.varint(6); block.varint(3); block.varint(4)  // b: a value
        let engine = Engine(log: nil, logger: Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() }))
        let state = CheckpointState(indexing: [])
        var loader = CheckpointLoader(into: state, storeID: StoreID(high: 0x0707070707070707, low: 0x0707070707070707),
                                      expectedLSN: 10, firstLSN: 1, nextLSN: 10)
        _ = try loader.load { body in
            for b in [header.bytes, block.bytes] { try b.withUnsafeBytes { try body($0) } }
            return true
        }
        #expect(engine.server.isEmpty, "the loader fills its own state; the engine takes it only when installed")
        engine.install(state)
        let a = try #require(engine.server.entry(at: Path("a")))
        let b = try #require(engine.server.entry(at: Path("b")))
        #expect(a.isEmpty && a.ref.lsn == 5)
        #expect(a.isFoldedNull == (format == 7))
        #expect(engine.server.hasFoldedWrites == (format == 7))
        #expect(!b.isEmpty && !b.isFoldedNull && b.ref == ValueRef(lsn: 6, offset: 3, length: 4))
    }

    /// A batch of pending writes is put back on the load's second thread; damage found there
    /// fails the load as damage found on the first does.
    @Test func aBatchOfPendingWritesWithIdsOutOfOrderOrUnknownFlagsIsDamage() throws {
        func load(ids: [Int64], flags: UInt8) throws -> UInt64 {
            var header = ByteWriter(capacity: 64)
            header.bytes.append(contentsOf: Checkpoint.magic)
            withUnsafeBytes(of: Checkpoint.version.littleEndian) { header.bytes.append(contentsOf: $0) }
            header.bytes.append(contentsOf: [UInt8](repeating: 7, count: 16))
            withUnsafeBytes(of: UInt64(100).littleEndian) { header.bytes.append(contentsOf: $0) }
            for count in [UInt64(0), UInt64(ids.count), 0, UInt64(ids.count * 2)] { header.varint(count) }
            header.signed(0)
            for count in [UInt64(0), 0, 0] { header.varint(count) }
            var block = ByteWriter(capacity: 256)
            block.u8(Checkpoint.Section.pending.rawValue)
            block.varint(UInt64(ids.count))
            var previous: Int64 = 0
            for id in ids { block.signed(id - previous); previous = id }
            for _ in ids { block.u8(flags) }
            for _ in ids { block.varint(2) }
            for _ in ids { block.bytes.append(contentsOf: Array("a\0".utf8)) }
            var input: [UInt8] = []
            for b in [header.bytes, block.bytes] { input += [UInt8(b.count & 0xff), UInt8(b.count >> 8)] + b }
            return try input.withUnsafeBytes { try FuzzEntryPoints.loadCheckpoint($0) }
        }
        #expect(try load(ids: [3, 5, 9], flags: 3) == 3)
        for (ids, flags) in [([Int64(3), 5, 5], UInt8(3)), ([5, 3], 3), ([3, 5], 7)] {
            let error = #expect(throws: DatabaseError.self, "\(ids) \(flags)") { try load(ids: ids, flags: flags) }
            #expect(error?.message.contains("a checkpoint is damaged") == true, "\(ids) \(flags): \(error?.message ?? "")")
        }
    }

    @Test func aDamagedCheckpointIsSkippedAndTheLogReplayedInstead() async throws {
        let dir = try TemporaryDirectory()
        do {
            let db = try Database.open(at: dir.path, options: quietOptions(.none))
            try await db.applyServerPut(at: "s", ["a": 1, "b": ["c": true]])
            try await db.reference("w").setValue(["x": "y"])
            try await db.close()
        }
        let name = try #require(try Self.checkpointName(dir))
        let good = try Files.read(dir.sub(name))
        for position in [0, 5, 13, good.count / 2, good.count - 1] {
            var bad = good
            bad[position] ^= 0x10
            try Files.write(dir.sub(name), bad)
            var options = quietOptions(.none)
            options.checkpointOnClose = false
            let db = try Database.open(at: dir.path, options: options)
            #expect(try await db.reference("s").getData().value == json(#"{"a":1,"b":{"c":true}}"#), "byte \(position) damaged")
            #expect(try await db.reference("w").getData().value == json(#"{"x":"y"}"#))
            #expect(db.pendingWriteIDs.count == 1)
            try await db.close()
        }
        // Closing with a checkpoint replaces the damaged one.
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        try await db.close()
        #expect(try Files.read(dir.sub(name)) == good)
    }

    @Test func anotherStoresCheckpointIsIgnored() async throws {
        let a = try TemporaryDirectory(), b = try TemporaryDirectory()
        for (dir, value) in [(a, "mine"), (b, "theirs")] {
            let db = try Database.open(at: dir.path, options: quietOptions(.none))
            try await db.reference("w").setValue(.string(value))
            try await db.close()
        }
        let name = try #require(try Self.checkpointName(b))
        #expect(try Self.checkpointName(a) == name, "same number of records: same checkpoint name")
        try Files.write(a.sub(name), try Files.read(b.sub(name)))
        let db = try Database.open(at: a.path, options: quietOptions(.none))
        #expect(try await db.reference("w").getData().value == "mine")
        try await db.close()
    }

    @Test func aCheckpointTakenWhileWritesGoOnLeavesNothingOut() async throws {
        let dir = try TemporaryDirectory()
        var options = quietOptions(.none)
        options.checkpointOnClose = false
        do {
            let db = try Database.open(at: dir.path, options: options)
            try await db.applyServerPut(at: "w", [:])
            let writer = Task {
                for i in 0..<3000 { try await db.reference("w/k\(i)").setValue(.int(Int64(i))) }
            }
            for _ in 0..<5 {
                try await db.checkpoint()
                await Task.yield()
            }
            try await writer.value
            try await db.checkpoint()
            try await db.reference("w/late").setValue(true)  // after the last checkpoint: replayed
            try await db.close()
        }
        let db = try Database.open(at: dir.path, options: options)
        let w = try await db.reference("w").getData()
        #expect(w.childrenCount == 3001)
        #expect(w.childSnapshot(forPath: "k2999").value == 2999)
        #expect(w.childSnapshot(forPath: "late").value == true)
        #expect(try Files.list(dir.path).filter { $0.hasPrefix("checkpoint-") }.count == 1, "older checkpoints are removed")
        try await db.close()
    }
}
