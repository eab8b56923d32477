/// Firebase-compatible push ids: 20 characters, the first 8 the time in milliseconds, the
/// other 12 random — incremented instead of redrawn within one millisecond, so ids from one
/// client sort in the order they were made.
@_spi(Server) public struct PushIDGenerator: Sendable {
    static let chars = Array("-0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz".utf8)
    private var lastTime: Int64 = -1
    private var lastRandom = [Int](repeating: 0, count: 12)
    private var rng = SystemRandomNumberGenerator()

    public init() {}

    /// The next id, made at `now` (milliseconds since 1970).
    public mutating func next(now: Int64) -> String {
        // Never go back in time: within one id stream, order is what matters.
        let time = max(now, lastTime)
        if time == lastTime {
            // Same millisecond: increment the random part (carrying), so ids stay ordered.
            var i = 11
            while i >= 0 && lastRandom[i] == 63 {
                lastRandom[i] = 0
                i -= 1
            }
            if i >= 0 { lastRandom[i] += 1 }
        } else {
            for i in 0..<12 { lastRandom[i] = Int(rng.next() % 64) }
        }
        lastTime = time
        var out = [UInt8](repeating: 0, count: 20)
        var t = time
        for i in stride(from: 7, through: 0, by: -1) {
            out[i] = Self.chars[Int(t % 64)]
            t /= 64
        }
        for i in 0..<12 { out[8 + i] = Self.chars[lastRandom[i]] }
        return String(decoding: out, as: UTF8.self)
    }
}
