import CCRC32C
import CLZ4
import Foundation
import FerryTestSupport
import Testing

@testable @_spi(Server) import Ferry

/// A walk checks each child's stored value as decoding would, wherever that is done: on the
/// walk's thread, or on the log's thread reading frames ahead of it.
@Suite struct DamagedValueWalkTests {
    /// A child whose stored value is damaged behind valid checksums (the frame's and its
    /// header's, so that only checking the value finds it; below the checkpoint, so that no
    /// replay reads it) stops a walk of a big location at that child with a storage error,
    /// after every child before it — also when the log read its frame ahead on another thread
    /// and checked the values there.
    @Test func aWalkStopsAtAChildWhoseStoredValueIsDamagedBehindValidChecksums() async throws {
        let dir = try TemporaryDirectory()
        var options = quietOptions(.none)
        options.segmentSize = 1 << 20  // (frames of a segment are read ahead together)
        options.cacheSizeBytes = .unlimited
        let count = 6_000, victim = 5_000
        func text(_ i: Int) -> String { "post <\(100_000 + i)> of the walk" }
        do {
            let db = try Database.open(at: dir.path, options: options)
            try await db.applyServerPut(at: "posts", [:])
            let posts = try db.reference("posts")
            for i in 0..<count { _ = try posts.child("p\(100_000 + i)").setValueNow(.string(text(i))) }
            try await db.close()  // (with a checkpoint)
        }
        let frames = try Self.damageStringValue(text(victim), in: dir.path)
        #expect(frames > 4, "the posts fill \(frames) data frames")

        let db = try Database.open(at: dir.path, options: options)
        let snapshot = try await db.reference("posts").getData()
        var seen: [String] = []
        do {
            try snapshot.forEachChild { seen.append($0.key ?? "") }
            Issue.record("the walk gave all \(seen.count) children")
        } catch let e as DatabaseError {
            #expect(e.code == .storage, "\(e)")
        }
        #expect(seen.count == victim, "children before the damaged one: \(seen.count)")
        #expect(seen.last == "p\(100_000 + victim - 1)")
        try? await db.close()
    }

    /// Finds the data frame whose records hold the string value `text`, turns that value's
    /// tag into one no value has, and writes the frame back with its checksums made valid.
    /// Returns how many data frames the log holds.
    static func damageStringValue(_ text: String, in dir: String) throws -> Int {
        let needle = Array(text.utf8)
        var dataFrames = 0, damaged = false
        for name in try FileManager.default.contentsOfDirectory(atPath: dir).filter({ $0.hasSuffix(".wal") }).sorted() {
            let path = dir + "/" + name
            var file = [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
            var offset = 64  // (the segment header)
            while offset + 32 <= file.count {
                func u32(_ at: Int) -> Int { (0..<4).reduce(0) { $0 | Int(file[offset + at + $1]) << (8 * $1) } }
                let type = file[offset + 4], codec = file[offset + 5], stored = u32(8), raw = u32(12)
                guard type != 0 else { break }  // (the zeros the segment grew into)
                let next = offset + 32 + stored
                guard type == 1 else { offset = next; continue }
                dataFrames += 1
                var body = Array(file[(offset + 32)..<next])
                if codec == 1 {
                    var out = [UInt8](repeating: 0, count: raw)
                    let n = body.withUnsafeBufferPointer { b in out.withUnsafeMutableBufferPointer { o in
                        LZ4_decompress_safe(UnsafeRawPointer(b.baseAddress!).assumingMemoryBound(to: CChar.self),
                                            UnsafeMutableRawPointer(o.baseAddress!).assumingMemoryBound(to: CChar.self), Int32(stored), Int32(raw))
                    } }
                    #expect(Int(n) == raw)
                    body = out
                }
                guard !damaged, let at = Self.find(needle, in: body) else { offset = next; continue }
                // The value: its tag, its length (one byte: shorter than 128), its bytes.
                #expect(body[at - 2] == ValueCodec.Tag.string.rawValue && Int(body[at - 1]) == needle.count)
                body[at - 2] = 0xC8
                damaged = true
                // Written back raw (codec 0), with both checksums.
                var header = Array(file[offset..<(offset + 32)])
                header[5] = 0
                func put(_ v: UInt32, _ at: Int) { for i in 0..<4 { header[at + i] = UInt8(truncatingIfNeeded: v >> (8 * i)) } }
                put(UInt32(body.count), 8)
                put(body.withUnsafeBytes { ferry_crc32c(0, $0.baseAddress!, $0.count) }, 28)
                put(header[4..<32].withUnsafeBytes { ferry_crc32c(0, $0.baseAddress!, $0.count) }, 0)
                file = Array(file[..<offset]) + header + body + Array(file[next...])
                try Data(file).write(to: URL(fileURLWithPath: path))
                offset += 32 + body.count
            }
        }
        #expect(damaged, "no frame held \(text)")
        return dataFrames
    }

    static func find(_ needle: [UInt8], in haystack: [UInt8]) -> Int? {
        guard haystack.count >= needle.count else { return nil }
        for i in 2...(haystack.count - needle.count) where haystack[i] == needle[0] && Array(haystack[i..<(i + needle.count)]) == needle {
            return i
        }
        return nil
    }
}
