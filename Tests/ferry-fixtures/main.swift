// Writes the stores under Fixtures/ and the README beside each, with the `expect` block the
// fixture tests check. Deterministic: a fixed store id and creation time, one frame per append.
//
//   swift run ferry-fixtures Fixtures
import Foundation
@_spi(Testing) import FerryLog
import FerryTestSupport

let root = CommandLine.arguments.count > 1 ? CommandLine.arguments[1] : "Fixtures"

func options(segmentSize: Int) -> LogOptions {
    var o = LogOptions(durability: .fsync, segmentSize: segmentSize)
    o.frameTargetSize = 4096
    o.newStoreID = StoreID(high: 0x0123_4567_89ab_cdef, low: 0xfedc_ba98_7654_3210)
    o.fixedCreationTime = 1_790_000_000_000_000_000
    return o
}

/// Writes `count` posts, batch sizes cycling 1...4, and returns the store directory.
func writePosts(_ name: String, count: Int, segmentSize: Int) async throws -> String {
    let dir = root + "/" + name + "/store"
    try? FileManager.default.removeItem(atPath: root + "/" + name)
    try FileManager.default.createDirectory(atPath: dir, withIntermediateDirectories: true)
    let log = try WriteAheadLog.open(at: dir, options: options(segmentSize: segmentSize))
    var i = 0
    while i < count {
        var batch = LogBatch()
        for j in i..<min(i + 1 + i % 4, count) { batch.append(kind: UInt8(j % 5), payload: Payloads.post(j)) }
        i += batch.count
        try await log.append(batch)
    }
    try await log.close()
    try FileManager.default.removeItem(atPath: dir + "/LOCK")
    return dir
}

func segments(_ dir: String) throws -> [String] {
    try FileManager.default.contentsOfDirectory(atPath: dir).filter { $0.hasSuffix(".wal") }.sorted()
}

func frameOffsets(_ bytes: [UInt8]) -> [Int] {
    var out: [Int] = []
    var o = 64
    while o + 32 <= bytes.count {
        out.append(o)
        let len = Int(bytes[o + 8]) | Int(bytes[o + 9]) << 8 | Int(bytes[o + 10]) << 16 | Int(bytes[o + 11]) << 24
        o += 32 + len
    }
    return out
}

/// What `ferry-dump verify` prints and an open reports, computed from the store itself.
func expectations(_ dir: String) -> [String] {
    var lines: [String] = []
    let inspection = try! LogInspection.inspect(dir)
    if let p = inspection.firstProblem {
        let status = switch p.severity { case .tornTail: 1; case .corruption: 2; case .unsupported: 3 }
        lines.append("verify-exit: \(status)")
        lines.append("verify-problem: \(p.severity.rawValue) in \(p.file) at offset \(p.offset)")
    } else {
        lines.append("verify-exit: 0")
        lines.append("verify-records: \(inspection.segments.map(\.records).reduce(UInt64(0), +))")
    }
    return lines
}

func writeReadme(_ name: String, title: String, what: String, expect: [String], prose: String) throws {
    let text = """
    # \(title)

    \(what)

    Made by `swift run ferry-fixtures Fixtures` (Tests/ferry-fixtures/main.swift): posts from
    `Payloads.post(i)`, kinds `i % 5`, batch sizes cycling 1–4, one frame per batch, store id
    `0123456789abcdeffedcba9876543210`. Format version 1.

    \(prose)

    The fixture tests (Tests/FerryLogTests/FixtureTests.swift) check every line below against
    `ferry-dump verify` and an open of a copy of `store/`:

    ```expect
    \(expect.joined(separator: "\n"))
    ```

    """
    try text.write(toFile: root + "/" + name + "/README.md", atomically: true, encoding: .utf8)
}

// 1. A clean store of several segments.
do {
    let dir = try await writePosts("v1-clean-multi-segment", count: 600, segmentSize: 16 << 10)
    let n = try segments(dir).count
    try writeReadme("v1-clean-multi-segment", title: "v1-clean-multi-segment: a sound store of \(n) segments",
        what: "600 records in \(n) segments of at most 16 KiB, every older segment sealed.",
        expect: expectations(dir) + ["open: clean", "records: 600", "next-lsn: 601"],
        prose: "Every later Ferry must open this store and read the same 600 records (or refuse it with a clear error).")
}

// 2. A torn tail: the last frame cut in half, as a crash during a write leaves it.
do {
    let dir = try await writePosts("torn-tail", count: 60, segmentSize: 1 << 20)
    let seg = dir + "/" + (try segments(dir)).last!
    var bytes = try Files.read(seg)
    let last = frameOffsets(bytes).last!
    let cut = last + (bytes.count - last) / 2
    bytes.removeSubrange(cut...)
    try Files.write(seg, bytes)
    let kept = Int(try LogInspection.inspect(dir).segments.map(\.records).reduce(UInt64(0), +))
    let lost = 60 - kept
    try writeReadme("torn-tail", title: "torn-tail: the newest frame is cut short",
        what: "60 records; the last frame (\(lost) records) was cut in the middle, \(cut - last) of its bytes remain.",
        expect: expectations(dir) + ["open: torn tail at offset \(last)", "records: \(kept)", "next-lsn: \(kept + 1)"],
        prose: "An open truncates the segment back to offset \(last), reports it, and continues from there.")
}

// 3. One flipped bit in a frame in the middle of the log.
do {
    let dir = try await writePosts("flipped-bit", count: 600, segmentSize: 16 << 10)
    let seg = dir + "/" + (try segments(dir))[1]
    var bytes = try Files.read(seg)
    let offsets = frameOffsets(bytes)
    let victim = offsets[offsets.count / 2]
    bytes[victim + 32 + 20] ^= 0x10
    try Files.write(seg, bytes)
    try writeReadme("flipped-bit", title: "flipped-bit: one bit flipped in a frame mid-log",
        what: "600 records; bit 4 of byte \(victim + 52) of the second segment (inside the body of the frame at offset \(victim)) is flipped.",
        expect: expectations(dir) + ["open: corruption", "salvage-records: \(600 - recordsIn(seg: bytes, at: victim))"],
        prose: "A strict open refuses the store with an error naming the segment and offset \(victim). A salvage open drops that one frame's records, keeps every other record and records the loss as a hole.")
}

func recordsIn(seg bytes: [UInt8], at offset: Int) -> Int {
    Int(bytes[offset + 24]) | Int(bytes[offset + 25]) << 8
}

// 4. A damaged segment header.
do {
    let dir = try await writePosts("damaged-segment-header", count: 600, segmentSize: 16 << 10)
    let seg = dir + "/" + (try segments(dir))[1]
    var bytes = try Files.read(seg)
    bytes[33] ^= 0x01
    try Files.write(seg, bytes)
    try writeReadme("damaged-segment-header", title: "damaged-segment-header: a segment header fails its checksum",
        what: "600 records; byte 33 (inside the sequence number) of the second segment's header is changed.",
        expect: expectations(dir) + ["open: corruption", "salvage-records: 600"],
        prose: "A strict open refuses the store (offset 0 of that segment). A salvage open rebuilds the header from the file name and loses no record.")
}

// 5. A missing middle segment.
do {
    let dir = try await writePosts("missing-middle-segment", count: 600, segmentSize: 16 << 10)
    let names = try segments(dir)
    let gone = names[names.count / 2]
    let inspection = try LogInspection.inspect(dir)
    let info = inspection.segments.first { $0.info.name == gone }!
    try FileManager.default.removeItem(atPath: dir + "/" + gone)
    let lost = Int(info.info.nextLSN.rawValue - info.info.firstLSN.rawValue)
    try writeReadme("missing-middle-segment", title: "missing-middle-segment: a segment file is gone",
        what: "600 records in \(names.count) segments; \(gone) (LSNs \(info.info.firstLSN)–\(info.info.nextLSN - 1)) was deleted.",
        expect: expectations(dir) + ["open: corruption", "salvage-records: \(600 - lost)"],
        prose: "The gap in LSNs between its neighbours is reported as corruption. A salvage open records LSNs \(info.info.firstLSN)–\(info.info.nextLSN - 1) as a hole.")
}

// 6. A store from a future format version.
do {
    let dir = try await writePosts("future-version", count: 100, segmentSize: 16 << 10)
    for name in try segments(dir) {
        var bytes = try Files.read(dir + "/" + name)
        bytes[8] = 2  // format version 2; a later format may change everything after it
        try Files.write(dir + "/" + name, bytes)
    }
    try writeReadme("future-version", title: "future-version: written by a later format",
        what: "100 records whose segment headers say format version 2.",
        expect: expectations(dir) + ["open: unsupported"],
        prose: "This build reads version 1 only: an open refuses the store with an unsupported-format error and modifies nothing (not even a lock file is created).")
}
print("fixtures written under \(root)")
