import Foundation

/// The bloom filter a server sends with an existence filter: the names of the documents that
/// still match a target (Firestore's `BloomFilter`: a bitmap with padding, tested with
/// `hashCount` hashes derived from the MD5 of a document's full name).
struct BloomFilter {
    let bitmap: [UInt8]
    let bitCount: Int
    let hashCount: Int

    /// nil when the filter is malformed (the client then ignores it and re-queries).
    init?(bitmap: [UInt8], padding: Int, hashCount: Int) {
        guard (0...7).contains(padding), hashCount >= 0 else { return nil }
        if bitmap.isEmpty {
            guard padding == 0, hashCount == 0 else { return nil }
        } else if hashCount == 0 {
            return nil
        }
        self.bitmap = bitmap
        bitCount = bitmap.count * 8 - padding
        self.hashCount = hashCount
    }

    func mightContain(_ name: String) -> Bool {
        guard bitCount > 0 else { return false }
        let digest = MD5.hash(Array(name.utf8))
        let h1 = digest[0..<8].enumerated().reduce(UInt64(0)) { $0 | UInt64($1.element) << (8 * UInt64($1.offset)) }
        let h2 = digest[8..<16].enumerated().reduce(UInt64(0)) { $0 | UInt64($1.element) << (8 * UInt64($1.offset)) }
        for i in 0..<UInt64(hashCount) {
            let bit = Int((h1 &+ i &* h2) % UInt64(bitCount))
            if bitmap[bit / 8] & (1 << (bit % 8)) == 0 { return false }
        }
        return true
    }
}

/// MD5 (RFC 1321), for bloom filter hashes only.
enum MD5 {
    static let s: [UInt32] = [7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22, 7, 12, 17, 22,
                              5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20, 5, 9, 14, 20,
                              4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23, 4, 11, 16, 23,
                              6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21, 6, 10, 15, 21]
    static let k: [UInt32] = (0..<64).map { UInt32(truncatingIfNeeded: Int64(abs(sin(Double($0 + 1))) * 4_294_967_296.0)) }

    static func hash(_ message: [UInt8]) -> [UInt8] {
        var m = message
        let bitLength = UInt64(message.count) * 8
        m.append(0x80)
        while m.count % 64 != 56 { m.append(0) }
        for i in 0..<8 { m.append(UInt8(truncatingIfNeeded: bitLength >> (8 * UInt64(i)))) }
        var a0: UInt32 = 0x67452301, b0: UInt32 = 0xefcdab89, c0: UInt32 = 0x98badcfe, d0: UInt32 = 0x10325476
        for chunk in stride(from: 0, to: m.count, by: 64) {
            var w = [UInt32](repeating: 0, count: 16)
            for i in 0..<16 {
                let j = chunk + i * 4
                w[i] = UInt32(m[j]) | UInt32(m[j + 1]) << 8 | UInt32(m[j + 2]) << 16 | UInt32(m[j + 3]) << 24
            }
            var a = a0, b = b0, c = c0, d = d0
            for i in 0..<64 {
                var f: UInt32
                var g: Int
                switch i {
                case 0..<16: f = (b & c) | (~b & d); g = i
                case 16..<32: f = (d & b) | (~d & c); g = (5 * i + 1) % 16
                case 32..<48: f = b ^ c ^ d; g = (3 * i + 5) % 16
                default: f = c ^ (b | ~d); g = (7 * i) % 16
                }
                f = f &+ a &+ k[i] &+ w[g]
                a = d
                d = c
                c = b
                b = b &+ (f << s[i] | f >> (32 - s[i]))
            }
            a0 = a0 &+ a; b0 = b0 &+ b; c0 = c0 &+ c; d0 = d0 &+ d
        }
        var out: [UInt8] = []
        for v in [a0, b0, c0, d0] { for i in 0..<4 { out.append(UInt8(truncatingIfNeeded: v >> (8 * UInt32(i)))) } }
        return out
    }
}
