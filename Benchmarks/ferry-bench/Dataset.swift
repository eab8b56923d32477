/// The records every workload writes, generated before any timing: a ~200-byte JSON post per
/// record, keyed `/posts/pNNNNNNNN`, in one contiguous buffer (no per-record allocation).
struct Dataset: Sendable {
    let bytes: [UInt8]
    let offsets: [Int]  // record i is bytes[offsets[i]..<offsets[i+1]]

    var count: Int { offsets.count - 1 }
    var payloadBytes: Int { bytes.count }

    init(count: Int, seed: UInt64 = 1) {
        var bytes: [UInt8] = []
        bytes.reserveCapacity(count * 210)
        var offsets = [0]
        offsets.reserveCapacity(count + 1)
        var g = SplitMix64(seed: seed)
        let words = ["offline", "ferry", "river", "sync", "cache", "write", "listen", "query", "crossing", "harbor",
                     "tide", "dock", "north", "south", "lantern", "rope", "signal", "anchor", "current", "pier"]
        for i in 0..<count {
            var body = ""
            for _ in 0..<(10 + Int(g.next() % 5)) { body += words[Int(g.next() % UInt64(words.count))] + " " }
            let json = #"{"author":"user\#(g.next() % 50_000)","title":"Post number \#(i)","body":"\#(body)","likes":\#(g.next() % 10_000),"ts":\#(1_700_000_000_000 + UInt64(i) * 37 + g.next() % 1000),"tags":["\#(words[Int(g.next() % 20)])","\#(words[Int(g.next() % 20)])"]}"#
            bytes.append(contentsOf: json.utf8)
            offsets.append(bytes.count)
        }
        self.bytes = bytes
        self.offsets = offsets
    }

    static func key(_ i: Int) -> String {
        let s = String(i)
        return "/posts/p" + String(repeating: "0", count: max(0, 8 - s.count)) + s
    }

    @inline(__always) func withRecord<R>(_ i: Int, _ body: (UnsafeRawBufferPointer) throws -> R) rethrows -> R {
        try bytes.withUnsafeBytes { all in
            try body(UnsafeRawBufferPointer(rebasing: all[offsets[i]..<offsets[i + 1]]))
        }
    }
}

struct SplitMix64: RandomNumberGenerator {
    var state: UInt64
    init(seed: UInt64) { state = seed }
    mutating func next() -> UInt64 {
        state &+= 0x9E37_79B9_7F4A_7C15
        var z = state
        z = (z ^ (z >> 30)) &* 0xBF58_476D_1CE4_E5B9
        z = (z ^ (z >> 27)) &* 0x94D0_49BB_1331_11EB
        return z ^ (z >> 31)
    }
}
