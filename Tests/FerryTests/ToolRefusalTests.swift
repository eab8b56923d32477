import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable import Ferry

/// The tools do not trust a directory to be a store: `ferry-dump` says there is none, and
/// `ferry-demo` does not delete what is not its own.
@Suite struct ToolRefusalTests {
    let dump = Locations.executable("ferry-dump")
    let demo = Locations.executable("ferry-demo")

    @Test(arguments: ["verify", "list", "stats", "records", "at"])
    func ferryDumpOnADirectoryWithoutAStoreSaysSoAndExitsFive(command: String) throws {
        let empty = try TemporaryDirectory()
        let unrelated = try TemporaryDirectory()
        try Files.write(unrelated.sub("notes.txt"), Array("not a store".utf8))
        try FileManager.default.createDirectory(atPath: unrelated.sub("photos"), withIntermediateDirectories: false)
        for dir in [empty, unrelated] {
            let before = try Files.snapshot(dir.path)
            for json in [false, true] {
                let r = try run(dump, [command, dir.path] + (json ? ["--json"] : []))
                #expect(r.status == 5, "\(command) \(r.stdout) \(r.stderr)")
                #expect(r.stderr.contains("holds no Ferry store"), "\(r.stderr)")
                #expect(!r.stdout.contains("sound"), "\(r.stdout)")
            }
            #expect(try Files.snapshot(dir.path) == before, "read-only")
        }
    }

    @Test func ferryDumpHelpDocumentsTheNoStoreExitCode() throws {
        let r = try run(dump, ["--help"])
        let text = r.stdout.split(whereSeparator: \.isWhitespace).joined(separator: " ")  // --help wraps lines
        #expect(text.contains("5 the directory holds no Ferry store"), "\(r.stdout)")
    }

    @Test func ferryDumpStillVerifiesAStoreWithNoRecordsYet() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        try await db.close()
        let r = try run(dump, ["verify", dir.path])
        #expect(r.status == 0, "\(r.stdout) \(r.stderr)")
        #expect(r.stdout.hasPrefix("sound:"))
    }

    @Test func ferryDemoRefusesADirectoryThatIsNotEmptyAndNotAStoreAndLeavesItAlone() throws {
        let dir = try TemporaryDirectory()
        try Files.write(dir.sub("thesis.tex"), Array("three years of work".utf8))
        let before = try Files.snapshot(dir.path)
        for arguments in [["--posts", "8"], [dir.path, "--posts", "8"]] {
            let r = try run(demo, arguments, environment: ["FERRY_DEMO_STORE": dir.path])
            #expect(r.status == 65, "\(r.stdout) \(r.stderr)")
            #expect(r.stderr.contains("is not empty and is not a Ferry store"), "\(r.stderr)")
            #expect(try Files.snapshot(dir.path) == before, "the stray file is still there, untouched, and nothing was added")
        }
        // A plain file is refused too.
        let r = try run(demo, [dir.sub("thesis.tex"), "--posts", "8"])
        #expect(r.status == 65)
        #expect(try Files.read(dir.sub("thesis.tex")) == Array("three years of work".utf8))
    }

    @Test func ferryDemoReusesAFerryStoreAndKeepsWhatIsNotTheStores() throws {
        let dir = try TemporaryDirectory()
        let store = dir.sub("store")
        let first = try run(demo, ["--posts", "8"], environment: ["FERRY_DEMO_STORE": store])
        #expect(first.status == 0, "\(first.stdout) \(first.stderr)")
        try Files.write(store + "/README.txt", Array("mine".utf8))
        let second = try run(demo, [store, "--posts", "16"])
        #expect(second.status == 0, "\(second.stdout) \(second.stderr)")
        #expect(second.stdout.contains("16 posts"), "a fresh store: \(second.stdout)")
        #expect(try Files.read(store + "/README.txt") == Array("mine".utf8))
    }
}
