import Foundation
@_spi(Testing) @_spi(Fuzzing) import FerryLog
import FerryTestSupport
import Testing

/// The segment inputs fuzz-frame (Fuzz/, scripts/fuzz.sh) crashed on, kept under
/// `Fixtures/fuzz/fuzz-frame/` (a flags byte, then a segment file): each goes through the same
/// entry point and must come back as a reported problem, not a trap.
@Suite struct LogFuzzRegressionTests {
    static func inputs() -> [String] {
        let dir = Locations.fixture("fuzz/fuzz-frame")
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
        return names.filter { !$0.hasPrefix(".") }.sorted().map { dir + "/" + $0 }
    }

    @Test(arguments: inputs())
    func aSegmentTheFuzzerCrashedOnIsReportedAsAProblem(_ path: String) throws {
        let dir = try TemporaryDirectory("fuzz-frame")
        let input = try Files.read(path)
        let outcome = try input.withUnsafeBytes { try LogFuzzEntryPoints.scanSegment($0, directory: dir.path) }
        #expect(outcome.problem != nil)
    }

    /// A checksummed frame whose LSNs would run past UInt64.max is invalid; computing where it
    /// ends used to trap.
    @Test func aFrameWhoseLSNsRunPastTheLargestIsInvalid() throws {
        let dir = try TemporaryDirectory("fuzz-frame")
        let input = try Files.read(Locations.fixture("fuzz/fuzz-frame/lsn-overflow"))
        let outcome = try input.withUnsafeBytes { try LogFuzzEntryPoints.scanSegment($0, directory: dir.path) }
        #expect(outcome.problem?.contains("run past the largest LSN") == true)
        #expect(outcome.records == 0)
    }

    /// The seeds of fuzz-frame are segments a store wrote: they scan clean and read back.
    @Test func theFrameSeedsScanCleanAndReadBack() throws {
        let dir = try TemporaryDirectory("fuzz-frame")
        let seeds = Locations.packageRoot + "/Fuzz/Corpus/fuzz-frame"
        let names = try FileManager.default.contentsOfDirectory(atPath: seeds)
        #expect(!names.isEmpty)
        for name in names {
            let input = try Files.read(seeds + "/" + name)
            let outcome = try input.withUnsafeBytes { try LogFuzzEntryPoints.scanSegment($0, directory: dir.path) }
            #expect(outcome.problem == nil, "\(name): \(outcome.problem ?? "")")
            #expect(outcome.records > 0 && outcome.recordsRead == outcome.records)
        }
    }
}
