import Foundation
@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

/// Every store under Fixtures/ behaves as the `expect` block of the README beside it says.
@Suite struct FixtureTests {
    static let names = ["v1-clean-multi-segment", "torn-tail", "flipped-bit", "damaged-segment-header",
                        "missing-middle-segment", "future-version"]

    /// The `key: value` lines of the README's ```expect block.
    static func expectations(_ name: String) throws -> [String: String] {
        let text = try String(contentsOfFile: Locations.fixture(name + "/README.md"), encoding: .utf8)
        guard let start = text.range(of: "```expect\n"), let end = text.range(of: "\n```", range: start.upperBound..<text.endIndex) else {
            return [:]
        }
        var out: [String: String] = [:]
        for line in text[start.upperBound..<end.lowerBound].split(separator: "\n") {
            let parts = line.split(separator: ":", maxSplits: 1).map { $0.trimmingCharacters(in: .whitespaces) }
            if parts.count == 2 { out[parts[0]] = parts[1] }
        }
        return out
    }

    func copyOfStore(_ name: String) throws -> TemporaryDirectory {
        let dir = try TemporaryDirectory("fixture")
        try Files.remove(dir.path)
        try Files.copyTree(Locations.fixture(name + "/store"), to: dir.path)
        return dir
    }

    @Test(arguments: names)
    func verifyReportsWhatTheFixtureReadmeSays(_ name: String) throws {
        let expect = try Self.expectations(name)
        let exit = try #require(expect["verify-exit"].flatMap { Int32($0) }, "README of \(name) has no verify-exit")
        let store = try copyOfStore(name)
        let result = try run(Locations.executable("ferry-dump"), ["verify", store.path])
        #expect(result.status == exit, "\(name): \(result.stdout)\(result.stderr)")
        if let problem = expect["verify-problem"] {
            // "corruption in FILE at offset N" — the same words verify prints.
            let words = problem.components(separatedBy: " in ")
            #expect(result.stdout.contains(" in " + words.dropFirst().joined(separator: " in ")), "\(name): \(result.stdout)")
        }
        if let records = expect["verify-records"] {
            #expect(result.stdout.contains("\(records) record(s)"), "\(name): \(result.stdout)")
        }
        let json = try run(Locations.executable("ferry-dump"), ["verify", "--json", store.path])
        #expect(json.status == exit)
        #expect(json.stdout.contains(#""sound":\#(exit == 0)"#))
    }

    @Test(arguments: names)
    func openingBehavesAsTheFixtureReadmeSays(_ name: String) async throws {
        let expect = try Self.expectations(name)
        let open = try #require(expect["open"], "README of \(name) has no open line")
        let store = try copyOfStore(name)
        var options = LogOptions()
        options.logger = testOptions().logger
        if open == "clean" || open.hasPrefix("torn tail") {
            let log = try WriteAheadLog.open(at: store.path, options: options)
            if open == "clean" {
                #expect(log.recovery.isClean)
            } else {
                let offset = Int64(open.split(separator: " ").last!)!
                #expect(log.recovery.tornTail?.offset == offset)
            }
            #expect(try log.records().count == Int(expect["records"]!)!)
            expectPosts(try log.records(), count: Int(expect["records"]!)!)
            #expect(log.nextLSN == LSN(UInt64(expect["next-lsn"]!)!))
            try await log.close()
            return
        }
        let before = try Files.snapshot(store.path)
        let e = logError { _ = try WriteAheadLog.open(at: store.path, options: options) }
        switch open {
        case "corruption":
            #expect(e?.code == .corruption)
            #expect(e?.file != nil && e?.offset != nil, "a corruption error names file and offset")
        case "unsupported":
            #expect(e?.code == .unsupportedFormat)
            #expect(try Files.snapshot(store.path) == before, "a refused store is not modified")
        default:
            Issue.record("unknown open expectation \(open)")
        }
        if let salvaged = expect["salvage-records"] {
            options.recovery = .salvage
            let log = try WriteAheadLog.open(at: store.path, options: options)
            let records = try log.records()
            #expect(records.count == Int(salvaged)!)
            #expect(records.allSatisfy { $0.payload == Payloads.post(Int($0.lsn.rawValue) - 1) })
            try await log.close()
        }
    }

    @Test func everyFixtureDirectoryIsCoveredByTheseTests() throws {
        // fuzz/ holds the fuzz targets' regression inputs, not stores: FuzzRegressionTests covers it.
        let dirs = try Files.list(Locations.fixture("")).filter { !$0.hasSuffix(".md") && $0 != "fuzz" }
        #expect(Set(dirs) == Set(Self.names))
    }
}
