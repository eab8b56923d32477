import Foundation
@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

@Suite struct DumpTests {
    let dump = Locations.executable("ferry-dump")

    @Test func listShowsEverySegmentWithItsLSNRangeAndSeal() async throws {
        let dir = try await multiSegmentStore(records: 300, segmentSize: 8192)
        let result = try run(dump, ["list", "--json", dir.path])
        #expect(result.status == 0)
        let rows = try result.stdout.split(separator: "\n").map {
            try JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any]
        }
        let names = try segmentFiles(dir.path)
        #expect(rows.map { $0["name"] as? String } == names)
        #expect(rows.dropLast().allSatisfy { $0["sealed"] as? Bool == true })
        #expect(rows.map { ($0["records"] as? Int) ?? 0 }.reduce(0, +) == 300)
        #expect(rows.first?["firstLSN"] as? Int == 1)
        #expect(rows.last?["lastLSN"] as? Int == 300)
        let text = try run(dump, ["list", dir.path])
        #expect(text.stdout.contains(names[0]))
    }

    @Test func recordsPrintsTheRequestedRangeWithPayloads() async throws {
        let dir = try await writeStore(50)
        let result = try run(dump, ["records", "--from", "10", "--to", "12", "--json", dir.path])
        #expect(result.status == 0)
        let rows = try result.stdout.split(separator: "\n").map {
            try JSONSerialization.jsonObject(with: Data($0.utf8)) as! [String: Any]
        }
        #expect(rows.map { $0["lsn"] as? Int } == [10, 11, 12])
        #expect(rows[0]["kind"] as? Int == 9 % 5)
        #expect(rows[0]["size"] as? Int == Payloads.post(9).count)
        #expect(rows[0]["payload"] as? String == Payloads.post(9).map { String(format: "%02x", $0) }.joined())
        let text = try run(dump, ["records", dir.path])
        #expect(text.stdout.split(separator: "\n").count == 50)
    }

    @Test func statsReportsRecordsBytesAndCompression() async throws {
        let dir = try await writeStore(2000, batchSize: 50)
        let result = try run(dump, ["stats", "--json", dir.path])
        #expect(result.status == 0)
        let stats = try JSONSerialization.jsonObject(with: Data(result.stdout.utf8)) as! [String: Any]
        #expect(stats["records"] as? Int == 2000)
        #expect(stats["firstLSN"] as? Int == 1)
        #expect(stats["lastLSN"] as? Int == 2000)
        #expect((stats["compressionRatio"] as? Double ?? 0) > 1.5)
        #expect((stats["uncompressedBodyBytes"] as? Int ?? 0) > (stats["storedBodyBytes"] as? Int ?? 0))
    }

    @Test func verifyDistinguishesSoundTornAndCorrupt() async throws {
        let dir = try await multiSegmentStore(records: 200, segmentSize: 8192)
        #expect(try run(dump, ["verify", dir.path]).status == 0)
        let names = try segmentFiles(dir.path)
        try Files.append(dir.sub(names.last!), [1, 2, 3, 4, 5])
        let torn = try run(dump, ["verify", dir.path])
        #expect(torn.status == 1)
        #expect(torn.stdout.contains("torn tail (recoverable"))
        try Files.flipBit(dir.sub(names[0]), byte: 200, bit: 1)
        let corrupt = try run(dump, ["verify", dir.path])
        #expect(corrupt.status == 2)
        #expect(corrupt.stdout.contains("corruption"))
        #expect(corrupt.stdout.contains(names[0]))
        // `records` prints what comes before the damaged first frame (nothing) and says where
        // the records end (finding the store's model, which reads the first record, does not
        // stop it first).
        let records = try run(dump, ["records", dir.path])
        #expect(records.status == 0 && records.stderr.contains("records end before: corruption in \(names[0])"), "\(records.status) \(records.stderr)")
    }

    @Test func theDumpNeverModifiesTheStoreAndWorksWhileItIsOpen() async throws {
        let dir = try TemporaryDirectory()
        let log = try WriteAheadLog.open(at: dir.path, options: testOptions(.fsync, segmentSize: 8192))
        try await appendPosts(log, 0..<200)
        let before = try Files.snapshot(dir.path)
        for command in ["list", "records", "verify", "stats"] {
            let r = try run(dump, [command, dir.path])
            #expect(r.status == 0, "\(command) failed on an open store: \(r.stderr)")
        }
        #expect(try Files.snapshot(dir.path) == before)
        try await log.close()
    }

    @Test func aMissingDirectoryIsAClearError() throws {
        let r = try run(dump, ["verify", "/nonexistent/ferry-store"])
        #expect(r.status == 4)
        #expect(r.stderr.contains("not a directory"))
    }
}
