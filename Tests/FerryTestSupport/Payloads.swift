/// Deterministic record payloads: the same index always gives the same bytes, so a test can
/// check a record's content from its LSN alone.
public enum Payloads {
    /// A ~200-byte JSON post, like an app would store (compresses about 2× in a batch).
    public static func post(_ i: Int) -> [UInt8] {
        var g = SplitMix(seed: UInt64(i))
        let words = ["offline", "ferry", "river", "sync", "cache", "write", "listen", "query", "crossing", "harbor",
                     "tide", "dock", "north", "south", "lantern", "rope"]
        var body = ""
        for _ in 0..<(6 + Int(g.next() % 5)) { body += words[Int(g.next() % UInt64(words.count))] + " " }
        let json = #"{"author":"user\#(g.next() % 5000)","title":"post \#(i)","body":"\#(body)","likes":\#(g.next() % 1000),"ts":\#(1_700_000_000_000 + UInt64(i) * 37),"tags":["\#(words[i % words.count])","\#(words[(i / 7) % words.count])"]}"#
        return Array(json.utf8)
    }

    /// Bytes that LZ4 cannot compress.
    public static func random(_ count: Int, seed: UInt64) -> [UInt8] {
        var g = SplitMix(seed: seed)
        var out = [UInt8]()
        out.reserveCapacity(count + 8)
        while out.count < count { withUnsafeBytes(of: g.next()) { out.append(contentsOf: $0) } }
        return Array(out.prefix(count))
    }

    /// The payload the crash tests write for `lsn`: recognisable and checkable.
    public static func forLSN(_ lsn: UInt64) -> [UInt8] {
        let size = 40 + Int(lsn % 200)
        var out = Array("lsn=\(lsn);".utf8)
        var g = SplitMix(seed: lsn &* 0x9E37_79B9)
        while out.count < size { out.append(UInt8(0x61 + g.next() % 26)) }
        return out
    }
}

/// A small, fast, seedable generator (SplitMix64).
public struct SplitMix: RandomNumberGenerator, Sendable {
    var state: UInt64
    public init(seed: UInt64) { state = seed }
    public mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}

extension Payloads {
    /// Record `k` of batch `n` of writer `w` in the crash tests.
    public static func tagged(writer w: Int, batch n: Int, record k: Int) -> [UInt8] {
        let size = 30 + (w * 131 + n * 17 + k * 7) % 300
        var out = Array("w\(w)/b\(n)/r\(k);".utf8)
        var g = SplitMix(seed: UInt64(w) << 40 ^ UInt64(n) << 8 ^ UInt64(k))
        while out.count < size { out.append(UInt8(0x61 + g.next() % 26)) }
        return out
    }
}
