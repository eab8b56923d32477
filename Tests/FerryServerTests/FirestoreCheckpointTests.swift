import FerryDocuments
import FerryDocumentsSync
import FerryFirestoreWire
import FerryLog
import FerryTestSupport
import Foundation
import Logging
import Testing

@testable import FerryServer

/// A server document store's checkpoint: the log below it is deleted, and an open reads it and
/// replays only what came after, with the documents, deletions and exactly-once marks intact.
@Suite struct FirestoreCheckpointTests {
    static let name = DatabaseName(project: RawFirestore.database.split(separator: "/")[1].description, database: "(default)")

    /// Sets `n` and about 1 KB that compresses poorly, so that a checkpoint spans several blocks.
    static func write(_ path: String, _ n: Int) throws -> ParsedWrite {
        var g = UInt64(n) &* 0x9E37_79B9_7F4A_7C15 | 1
        let pad = String((0..<1_000).map { _ in
            g ^= g << 13; g ^= g >> 7; g ^= g << 17
            return Character(UnicodeScalar(UInt8(97 + g % 26)))
        })
        return try ParsedWrite(wire: RawFirestore.set(path, ["n": n, "pad": pad]), in: name)
    }

    static func delete(_ path: String) throws -> ParsedWrite {
        var w = Google_Firestore_V1_Write()
        w.delete = RawFirestore.root + "/" + path
        return try ParsedWrite(wire: w, in: name)
    }

    /// The documents the store holds, by path, with their `n`.
    static func contents(_ store: DocumentStore) -> [String: Int64] {
        store.state.withLock { s in
            var out: [String: Int64] = [:]
            for (parent, docs) in s.collections {
                for (id, d) in docs {
                    if case .integer(let n)? = d.fields["n"] { out[parent.appending(id).description] = n }
                }
            }
            return out
        }
    }

    static func checkpointWritten(_ dir: String) -> Bool {
        FileManager.default.fileExists(atPath: dir + "/" + StoreCheckpoint.fileName)
    }

    /// Client c1's batches 0..<count: each sets one of 2,000 documents, every seventh deletes
    /// one, and batch 5 is refused (an update of a document that does not exist).
    static func batches(_ range: Range<Int>) throws -> [(id: Int64, writes: Result<[ParsedWrite], FirestoreErrorCode>)] {
        try range.map { i in
            let path = "things/d\(i % 2_000)"
            if i == 5 {
                var w = RawFirestore.set("things/missing", ["n": 0])
                w.currentDocument.exists = true
                return (Int64(i), .success([try ParsedWrite(wire: w, in: name)]))
            }
            return (Int64(i), .success([i % 7 == 0 ? try delete(path) : try write(path, i)]))
        }
    }

    /// What those batches leave.
    static func model(_ count: Int) -> [String: Int64] {
        var m: [String: Int64] = [:]
        for i in 0..<count where i != 5 {
            let path = "things/d\(i % 2_000)"
            m[path] = i % 7 == 0 ? nil : Int64(i)
        }
        return m
    }

    @Test func aStoreOpensFromItsCheckpointAndTheLogBelowItIsGone() async throws {
        let dir = try TemporaryDirectory("firestore-checkpoint")
        let path = dir.sub("db")
        var store = try DocumentStore.open(at: path, name: Self.name, checkpointBytes: 16 << 10, logger: Logger(label: "test"))
        var answers: [Result<DocumentStore.CommitResult, FirestoreErrorCode>] = []
        for start in stride(from: 0, to: 3_000, by: 100) {
            answers += await store.commitBatches(client: "c1", try Self.batches(start..<start + 100))
        }
        #expect(answers.filter { if case .failure = $0 { true } else { false } }.count == 1)
        #expect(await eventually { Self.checkpointWritten(path) && store.log.firstLSN.rawValue > 1 })
        let committed = store.state.withLock { ($0.lastCommit, $0.tombstones.count) }
        // What an open must replay: the records from the newest checkpoint's through-LSN on.
        #expect(await eventually { !store.state.withLock { $0.checkpointRunning } })
        var scratch = DocumentStore.State()
        let through = try #require(try StoreCheckpoint.read(from: store.log, into: &scratch))
        var after: Int64 = 0
        try store.log.forEachRecord(from: LSN(through)) { after += Int64($0.payload.count) }

        // Gone as kill -9 leaves it: every answered commit is on disk, nothing else happens.
        store.log.release()
        store = try DocumentStore.open(at: path, name: Self.name, checkpointBytes: 16 << 10, logger: Logger(label: "test"))
        #expect(Self.contents(store) == Self.model(3_000))
        let reopened = store.state.withLock { ($0.lastCommit, $0.tombstones.count, $0.bytesSinceCheckpoint) }
        #expect(reopened.0 == committed.0)
        #expect(reopened.1 == committed.1, "the deletions are kept for listens that resume")
        #expect(StoreCheckpoint.fileSize(in: path) > 1 << 20, "a checkpoint of several blocks")
        #expect(reopened.2 == after, "only the records after the checkpoint are replayed")
        #expect(after < 2_500_000, "not the 3 MB written (the checkpoint is due each time the records outweigh its file, ~1.3 MB)")

        // The marks came back too: every batch sent again gets its first answer and changes nothing.
        let again = await store.commitBatches(client: "c1", try Self.batches(2_900..<3_000) + Self.batches(5..<6))
        for (a, b) in zip(again, answers[2_900..<3_000] + answers[5...5]) {
            switch (a, b) {
            case (.success(let x), .success(let y)): #expect(x.commitTime == y.commitTime)
            case (.failure(let x), .failure(let y)): #expect(x.code == y.code)
            default: Issue.record("a batch sent again got another answer: \(a) against \(b)")
            }
        }
        #expect(store.state.withLock { $0.lastCommit } == committed.0, "nothing was applied twice")
        #expect(Self.contents(store) == Self.model(3_000))

        // A close after commits weighing an eighth of the checkpoint or more writes one: the
        // next open replays nothing. After a few commits it leaves them to be replayed
        // (rewriting the whole state for them would cost more than replaying them).
        await store.close()
        store = try DocumentStore.open(at: path, name: Self.name, checkpointBytes: 1 << 30, logger: Logger(label: "test"))
        _ = await store.commitBatches(client: "c1", try Self.batches(3_000..<3_400))
        #expect(store.state.withLock { $0.bytesSinceCheckpoint * 8 >= Int64($0.lastCheckpointBytes) })
        await store.close()
        store = try DocumentStore.open(at: path, name: Self.name, checkpointBytes: 1 << 30, logger: Logger(label: "test"))
        #expect(store.state.withLock { $0.bytesSinceCheckpoint } == 0)
        #expect(Self.contents(store) == Self.model(3_400))
        _ = await store.commitBatches(client: "c1", try Self.batches(3_400..<3_410))
        await store.close()
        store = try DocumentStore.open(at: path, name: Self.name, checkpointBytes: 1 << 30, logger: Logger(label: "test"))
        let few = store.state.withLock { ($0.bytesSinceCheckpoint, $0.lastCheckpointBytes) }
        #expect(few.0 > 0 && few.0 * 8 < Int64(few.1), "\(few)")
        #expect(Self.contents(store) == Self.model(3_410))
        await store.close()
    }

    @Test func aDamagedCheckpointIsRefusedOnceTheLogBelowItIsGoneAndReplacedByTheLogOtherwise() async throws {
        let dir = try TemporaryDirectory("firestore-checkpoint-damage")
        func damage(_ path: String) throws {
            let file = path + "/" + StoreCheckpoint.fileName
            var bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: file)))
            bytes[bytes.count / 2] ^= 0x5A
            try Data(bytes).write(to: URL(fileURLWithPath: file))
        }

        // The log still holds every record (the process died after the checkpoint was written
        // and before any segment was deleted): the open sets the checkpoint aside and replays
        // the log.
        let whole = dir.sub("whole")
        var store = try DocumentStore.open(at: whole, name: Self.name, logger: Logger(label: "test"))
        _ = await store.commitBatches(client: "c1", try Self.batches(0..<50))
        try StoreCheckpoint(store.state.withLock { $0 }, throughLSN: store.log.nextLSN.rawValue).write(to: store.log)
        store.log.release()
        #expect(Self.checkpointWritten(whole))
        try damage(whole)
        store = try DocumentStore.open(at: whole, name: Self.name, logger: Logger(label: "test"))
        #expect(Self.contents(store) == Self.model(50))
        await store.close()

        // Segments below it were deleted: the open refuses the store and changes nothing.
        let cut = dir.sub("cut")
        store = try DocumentStore.open(at: cut, name: Self.name, checkpointBytes: 16 << 10, logger: Logger(label: "test"))
        for start in stride(from: 0, to: 2_000, by: 100) { _ = await store.commitBatches(client: "c1", try Self.batches(start..<start + 100)) }
        #expect(await eventually { store.log.firstLSN.rawValue > 1 })
        await store.close()
        try damage(cut)
        let files = try FileManager.default.contentsOfDirectory(atPath: cut).sorted()
        #expect {
            _ = try DocumentStore.open(at: cut, name: Self.name, logger: Logger(label: "test"))
        } throws: { error in
            (error as? FirestoreErrorCode)?.code == .dataLoss && "\(error)".contains("cannot be rebuilt")
        }
        #expect(try FileManager.default.contentsOfDirectory(atPath: cut).sorted() == files)

        // So is a store whose checkpoint is missing once segments were deleted.
        try FileManager.default.removeItem(atPath: cut + "/" + StoreCheckpoint.fileName)
        #expect {
            _ = try DocumentStore.open(at: cut, name: Self.name, logger: Logger(label: "test"))
        } throws: { error in
            (error as? FirestoreErrorCode)?.code == .dataLoss && "\(error)".contains("is missing")
        }
    }
}

extension FirestoreCheckpointTests {
    /// The same through `ferry-server` and Ferry's document client, with kill -9.
    @Test func aServerKilledAfterACheckpointStartsFromItWithEveryDocument() async throws {
        let dir = try TemporaryDirectory("firestore-checkpoint-server")
        let flags = ["--firestore-port", "0", "--firestore-checkpoint-bytes", "32768"]
        var server = try ServerProcess(data: dir.path, flags)
        var (db, c) = try FirestoreSyncTests.connected(dir, "writer", server, project: "ckpt")
        for round in 0..<20 {
            let batch = db.batch()
            for i in 0..<50 { batch.setData(["round": round, "i": i], forDocument: db.collection("rows").document("r\(i + 50 * (round % 4))")) }
            try await batch.commit()
        }
        try await db.collection("rows").document("r3").delete()
        try await db.waitForPendingWrites()
        let store = dir.path + "/firestore/ckpt/(default)"
        #expect(await eventually { Self.checkpointWritten(store) })
        await c.close()
        try await db.terminate()
        server.kill9()

        server = try ServerProcess(data: dir.path, flags)
        (db, c) = try FirestoreSyncTests.connected(dir, "reader", server, project: "ckpt")
        let rows = try await db.collection("rows").getDocuments(source: .server)
        #expect(rows.count == 199)
        // ferry-dump tells the store for what it is (and `at`, which does not read it, says so).
        let stats = try run(Locations.executable("ferry-dump"), ["stats", store])
        #expect(stats.status == 0)
        #expect(stats.stdout.contains("a ferry-server Firestore database"), "\(stats.stdout)")
        #expect(stats.stdout.contains("checkpoint bytes:") && !stats.stdout.contains("cached paths"))
        let at = try run(Locations.executable("ferry-dump"), ["at", store])
        #expect(at.status == 64 && at.stderr.contains("is a ferry-server Firestore database"), "\(at.stderr)")
        // and reads its records through the server's own decoder.
        try await db.collection("rows").document("r500").setData(["round": 99])
        try await db.waitForPendingWrites()
        let records = try run(Locations.executable("ferry-dump"), ["records", store])
        #expect(records.status == 0)
        #expect(records.stdout.split(separator: "\n").contains { $0.contains("kind=40") && $0.contains("commit at ") && $0.contains("rows/r500") && $0.contains("\"round\": 99") }, "\(records.stdout)")
        #expect(rows.documents.allSatisfy { ($0.data()["round"] as? Int).map { $0 >= 16 } ?? false })
        #expect(!rows.documents.contains { $0.documentID == "r3" })
        await c.close()
        try await db.terminate()
        #expect(server.terminate() == 0)
    }
}
