import ArgumentParser
import Foundation

@main
struct FerryBench: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ferry-bench",
        abstract: "Measure Ferry's workloads beside a raw ceiling (and, where they apply, LevelDB and SQLite) in one run.",
        discussion: "Build with -c release. Figures are medians over --runs, with [min–max] of ops/s. Nothing here asserts a speed; ratios are printed.",
        subcommands: [LogBench.self, DBBench.self, CompareBench.self, DBOpen.self, DBMemory.self, CompareRun.self, CacheBench.self, SyncBench.self, DocumentsBench.self, DocumentsRun.self]
    )
}

struct CommonOptions: ParsableArguments {
    @Option(help: "Runs per measurement; the median is reported.") var runs = 3
    @Option(help: "Where stores are written (a fresh directory inside it, removed afterwards).")
    var directory = ProcessInfo.processInfo.environment["TMPDIR"] ?? "/tmp"
    @Flag(help: "Print one JSON object per measurement.") var json = false

    func scratch(_ label: String) throws -> String {
        let path = directory + "/ferry-bench-\(label)-\(getpid())-\(UInt32.random(in: 0...UInt32.max))"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        return path
    }
}

func remove(_ path: String) { try? FileManager.default.removeItem(atPath: path) }

func say(_ s: String, json: Bool) {
    if json { FileHandle.standardError.write(Data((s + "\n").utf8)) } else { print(s) }
}
