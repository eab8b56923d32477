#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// Paths as index keys: each key's UTF-8 followed by a 0x00 byte (keys cannot contain control
/// characters), the root empty. A location's subtree is then exactly the keys that start with
/// its key, and sorts right after it; an ancestor sorts before its descendants.
enum PathKey {
    /// The key component of a `.priority` child (appended to a node's key: its priority's key).
    static let priorityComponent: [UInt8] = Array(".priority".utf8) + [0]

    static func encode(_ path: Path) -> [UInt8] {
        var out: [UInt8] = []
        out.reserveCapacity(path.keys.reduce(0) { $0 + $1.utf8.count + 1 })
        for k in path.keys {
            out.append(contentsOf: k.utf8)
            out.append(0)
        }
        return out
    }

    static func decode(_ bytes: some Collection<UInt8>) -> Path {
        Path(keys: bytes.split(separator: 0, omittingEmptySubsequences: true).map { String(decoding: $0, as: UTF8.self) })
    }

    /// How many keys the path whose key is `key` has; nil when `key` is not one (it must end
    /// with 0x00 unless empty, with no empty key, and fewer than 64 keys).
    static func depth(_ key: UnsafeRawBufferPointer) -> Int? {
        let n = key.count
        guard n > 0 else { return 0 }
        guard key[n - 1] == 0, key[0] != 0 else { return nil }
        // Eight bytes at a time: each zero byte marked by its top bit (exactly: no carries
        // between bytes), counted, and two zeros side by side (an empty key) refused, within a
        // word and across words. (A `memchr` call per key cost more than a byte loop.)
        let low: UInt64 = 0x7F7F_7F7F_7F7F_7F7F
        var depth = 0
        var previousWasZero = false
        var i = 0
        while i + 8 <= n {
            let w = UInt64(littleEndian: key.loadUnaligned(fromByteOffset: i, as: UInt64.self))
            let zeros = ~(((w & low) &+ low) | w | low)  // 0x80 in each byte that is zero
            if zeros != 0 {
                if zeros & (zeros >> 8) != 0 || (previousWasZero && zeros & 0x80 != 0) { return nil }
                depth += zeros.nonzeroBitCount
            }
            previousWasZero = zeros >> 63 != 0
            i += 8
        }
        while i < n {
            let b = key[i]
            if b == 0 {
                if previousWasZero { return nil }  // an empty key
                depth += 1
            }
            previousWasZero = b == 0
            i += 1
        }
        return depth < 64 ? depth : nil
    }

    /// The keys of `path` and of each of its ancestors, root first.
    static func prefixes(of path: Path) -> [[UInt8]] {
        var out: [[UInt8]] = [[]]
        var current: [UInt8] = []
        for k in path.keys {
            current.append(contentsOf: k.utf8)
            current.append(0)
            out.append(current)
        }
        return out
    }
}

/// Compares byte strings: bytewise, a proper prefix first. Returns -1, 0 or 1.
@inline(__always)
func compareBytes(_ a: UnsafeRawBufferPointer, _ b: UnsafeRawBufferPointer) -> Int {
    let n = min(a.count, b.count)
    if n > 0 {
        let c = memcmp(a.baseAddress!, b.baseAddress!, n)
        if c != 0 { return c < 0 ? -1 : 1 }
    }
    return a.count == b.count ? 0 : (a.count < b.count ? -1 : 1)
}

@inline(__always)
private func slice(_ b: UnsafeRawBufferPointer, _ range: Range<Int>) -> UnsafeRawBufferPointer {
    UnsafeRawBufferPointer(start: b.baseAddress.map { $0 + range.lowerBound }, count: range.count)
}

/// A sorted map from byte-string keys to small entries, in chunks of contiguous bytes (no
/// object per entry). Each chunk stores the prefix its keys share once, and the rest of each
/// key end to end: neighbouring paths share most of their bytes (`posts/…`), so a key costs a
/// few bytes plus 4 for its end offset, plus the entry. Keys sort bytewise.
///
/// A value type, so that the chunks' arrays are changed in place without the runtime's
/// per-access exclusivity checks that properties of a class would cost on every step.
struct PathIndex<Entry> {
    struct Chunk {
        /// The bytes every key in the chunk starts with.
        var prefix: [UInt8] = []
        /// The rest of each key, end to end.
        var suffixes: [UInt8] = []
        var ends: [UInt32] = []
        var entries: [Entry] = []

        var count: Int { entries.count }

        func suffixRange(_ i: Int) -> Range<Int> { (i == 0 ? 0 : Int(ends[i - 1]))..<Int(ends[i]) }

        /// The whole key at `i`, into `out`.
        func key(_ i: Int, into out: inout [UInt8]) {
            out.removeAll(keepingCapacity: true)
            out.append(contentsOf: prefix)
            out.append(contentsOf: suffixes[suffixRange(i)])
        }

        /// Compares `key` with the chunk's prefix: nil when `key` starts with it (then its
        /// keys must be compared one by one), else whether `key` sorts before all of them (-1)
        /// or after (1).
        @inline(__always)
        func comparePrefix(_ key: UnsafeRawBufferPointer) -> Int? {
            prefix.withUnsafeBytes { p in
                let c = compareBytes(slice(key, 0..<min(p.count, key.count)), p)
                if c != 0 { return c }
                return key.count >= p.count ? nil : -1
            }
        }

        /// The sign of (key at `i`) − `key`.
        func compare(_ i: Int, _ key: UnsafeRawBufferPointer) -> Int {
            if let c = comparePrefix(key) { return -c }
            let r = suffixRange(i)
            return suffixes.withUnsafeBytes { s in compareBytes(slice(s, r), slice(key, prefix.count..<key.count)) }
        }

        /// Whether the key at `i` starts with `p`.
        func hasPrefix(_ i: Int, _ p: UnsafeRawBufferPointer) -> Bool {
            let r = suffixRange(i)
            guard prefix.count + r.count >= p.count else { return false }
            return prefix.withUnsafeBytes { own in
                let n = min(own.count, p.count)
                if n > 0 && memcmp(own.baseAddress!, p.baseAddress!, n) != 0 { return false }
                guard p.count > own.count else { return true }
                return suffixes.withUnsafeBytes { s in
                    memcmp(s.baseAddress! + r.lowerBound, p.baseAddress! + own.count, p.count - own.count) == 0
                }
            }
        }

        /// Position of `key`, or where it would go.
        func search(_ key: UnsafeRawBufferPointer) -> (Int, Bool) {
            if let c = comparePrefix(key) { return (c < 0 ? 0 : count, false) }
            let rest = slice(key, prefix.count..<key.count)
            return suffixes.withUnsafeBytes { s in
                ends.withUnsafeBufferPointer { e in
                    var lo = 0, hi = e.count
                    while lo < hi {
                        let mid = (lo + hi) >> 1
                        let c = compareBytes(slice(s, (mid == 0 ? 0 : Int(e[mid - 1]))..<Int(e[mid])), rest)
                        if c == 0 { return (mid, true) }
                        if c < 0 { lo = mid + 1 } else { hi = mid }
                    }
                    return (lo, false)
                }
            }
        }

        mutating func insert(_ key: UnsafeRawBufferPointer, _ entry: Entry, at i: Int) {
            if count == 0 {
                prefix = Array(key)
                suffixes.removeAll(keepingCapacity: true)
                ends = [0]
                entries = [entry]
                return
            }
            if comparePrefix(key) != nil { shortenPrefix(to: commonPrefixLength(key)) }
            let rest = slice(key, prefix.count..<key.count)
            if i == count {
                suffixes.append(contentsOf: rest)
                ends.append(UInt32(suffixes.count))
                entries.append(entry)
                return
            }
            let start = i == 0 ? 0 : Int(ends[i - 1])
            suffixes.insert(contentsOf: rest, at: start)
            ends.insert(UInt32(start + rest.count), at: i)
            if rest.count > 0 { for j in (i + 1)..<ends.count { ends[j] += UInt32(rest.count) } }
            entries.insert(entry, at: i)
        }

        private func commonPrefixLength(_ key: UnsafeRawBufferPointer) -> Int {
            prefix.withUnsafeBytes { p in
                var n = 0
                while n < p.count && n < key.count && p[n] == key[n] { n += 1 }
                return n
            }
        }

        /// Moves the prefix's bytes from `n` on back into every key.
        private mutating func shortenPrefix(to n: Int) {
            let moved = Array(prefix[n...])
            var rebuilt: [UInt8] = []
            rebuilt.reserveCapacity(suffixes.count + moved.count * count)
            var start = 0
            for i in 0..<count {
                let end = Int(ends[i])
                rebuilt.append(contentsOf: moved)
                rebuilt.append(contentsOf: suffixes[start..<end])
                ends[i] = UInt32(rebuilt.count)
                start = end
            }
            suffixes = rebuilt
            prefix.removeSubrange(n...)
        }

        /// Moves bytes all keys share from their rests into the prefix (after a split).
        mutating func tightenPrefix() {
            guard count > 1 else { return }
            let first = suffixRange(0), last = suffixRange(count - 1)
            var n = 0
            while n < first.count && n < last.count && suffixes[first.lowerBound + n] == suffixes[last.lowerBound + n] { n += 1 }
            guard n > 0 else { return }
            prefix.append(contentsOf: suffixes[first.lowerBound..<(first.lowerBound + n)])
            var rebuilt: [UInt8] = []
            rebuilt.reserveCapacity(suffixes.count - n * count)
            var start = 0
            for i in 0..<count {
                let end = Int(ends[i])
                rebuilt.append(contentsOf: suffixes[(start + n)..<end])
                ends[i] = UInt32(rebuilt.count)
                start = end
            }
            suffixes = rebuilt
        }

        mutating func remove(_ range: Range<Int>) {
            guard !range.isEmpty else { return }
            let byteStart = range.lowerBound == 0 ? 0 : Int(ends[range.lowerBound - 1])
            let byteEnd = Int(ends[range.upperBound - 1])
            let removedBytes = UInt32(byteEnd - byteStart)
            suffixes.removeSubrange(byteStart..<byteEnd)
            ends.removeSubrange(range)
            if removedBytes > 0 { for j in range.lowerBound..<ends.count { ends[j] -= removedBytes } }
            entries.removeSubrange(range)
        }

        enum ChildKeyScan { case refused, ended, more }

        /// ``PathIndex/allChildKeys(below:_:)`` over this chunk's keys from slot `first` on:
        /// whether `test` refused a child, the keys below `p` ended here, or they may go on.
        func childKeys(from first: Int, below p: UnsafeRawBufferPointer, _ scratch: inout [UInt8],
                       _ test: (UnsafeRawBufferPointer) -> Bool) -> ChildKeyScan {
            prefix.withUnsafeBytes { shared in
                suffixes.withUnsafeBytes { suffixes in
                    // A child's key wholly in the shared prefix: every key here is below that one child.
                    if shared.count > p.count, memcmp(shared.baseAddress!, p.baseAddress!, p.count) == 0,
                       let zero = shared[p.count...].firstIndex(of: 0) {
                        return test(UnsafeRawBufferPointer(rebasing: shared[p.count..<zero])) ? .more : .refused
                    }
                    for i in first..<count {
                        guard hasPrefix(i, p) else { return .ended }
                        let rest = UnsafeRawBufferPointer(rebasing: suffixes[suffixRange(i)])
                        if shared.count + rest.count == p.count { continue }  // `prefix` itself
                        let child: Bool
                        if shared.count <= p.count {  // the child's key is in the key's own rest
                            let from = p.count - shared.count
                            let to = rest[from...].firstIndex(of: 0) ?? rest.count
                            child = test(UnsafeRawBufferPointer(rebasing: rest[from..<to]))
                        } else {  // it begins in the shared prefix and ends in the rest
                            scratch.removeAll(keepingCapacity: true)
                            // (Appended as buffers: a slice of one is copied a byte at a time.)
                            scratch.append(contentsOf: UnsafeRawBufferPointer(rebasing: shared[p.count...]))
                            scratch.append(contentsOf: UnsafeRawBufferPointer(rebasing: rest[..<(rest.firstIndex(of: 0) ?? rest.count)]))
                            child = scratch.withUnsafeBytes(test)
                        }
                        if !child { return .refused }
                    }
                    return .more
                }
            }
        }

        /// ``PathIndex/allChildKeysArePlain(below:)`` over this chunk's keys from slot `first`
        /// on, when every one of them is below `p`: one scan of their bytes for any that sorts
        /// apart in UTF-16 (≥ 0xEE), then a look at each child key's first byte (an integer key
        /// starts with "-" or a digit) — one for the chunk when the child keys begin in its
        /// shared prefix. Nil when the keys must be read one by one: not all below `p`, a byte
        /// ≥ 0xEE, or a child key wholly in the shared prefix or starting like an integer there.
        func childKeysArePlain(from first: Int, below p: UnsafeRawBufferPointer) -> Bool? {
            guard first < count, hasPrefix(first, p), hasPrefix(count - 1, p) else { return nil }
            func startsLikeInteger(_ b: UInt8) -> Bool { b == UInt8(ascii: "-") || (b >= UInt8(ascii: "0") && b <= UInt8(ascii: "9")) }
            return prefix.withUnsafeBytes { shared in
                suffixes.withUnsafeBytes { s -> Bool? in
                    let start = suffixRange(first).lowerBound
                    if Self.hasByteSortingApart(UnsafeRawBufferPointer(rebasing: s[start...])) { return nil }
                    if shared.count > p.count {
                        // Every child key here begins in the shared prefix, with the same byte.
                        let own = UnsafeRawBufferPointer(rebasing: shared[p.count...])
                        if own.contains(0) || Self.hasByteSortingApart(own) || startsLikeInteger(own[0]) { return nil }
                        return true
                    }
                    let from = p.count - shared.count
                    for i in first..<count {
                        let r = suffixRange(i)
                        guard r.count > from else { continue }  // the location's own key
                        guard startsLikeInteger(s[r.lowerBound + from]) else { continue }
                        let rest = UnsafeRawBufferPointer(rebasing: s[(r.lowerBound + from)..<r.upperBound])
                        let key = UnsafeRawBufferPointer(rebasing: rest[..<(rest.firstIndex(of: 0) ?? rest.count)])
                        if KeyOrder.integerValue(utf8: key.assumingMemoryBound(to: UInt8.self)) != nil { return false }
                    }
                    return true
                }
            }
        }

        /// Whether any byte is ≥ 0xEE (a character from U+E000 on: such keys sort by UTF-16
        /// otherwise than by their bytes). Eight bytes at a time: most keys are ASCII.
        static func hasByteSortingApart(_ bytes: UnsafeRawBufferPointer) -> Bool {
            var i = 0
            while i + 8 <= bytes.count {
                if bytes.loadUnaligned(fromByteOffset: i, as: UInt64.self) & 0x8080_8080_8080_8080 != 0,
                   bytes[i..<(i + 8)].contains(where: { $0 >= 0xEE }) {
                    return true
                }
                i += 8
            }
            return bytes[i...].contains { $0 >= 0xEE }
        }

        /// Moves the entries from `at` on into a new chunk.
        mutating func split(at half: Int) -> Chunk {
            var upper = Chunk()
            let byteStart = half == 0 ? 0 : Int(ends[half - 1])
            upper.prefix = prefix
            upper.suffixes = Array(suffixes[byteStart...])
            upper.ends = ends[half...].map { $0 - UInt32(byteStart) }
            upper.entries = Array(entries[half...])
            suffixes.removeSubrange(byteStart...)
            ends.removeSubrange(half...)
            entries.removeSubrange(half...)
            tightenPrefix()
            upper.tightenPrefix()
            return upper
        }
    }

    private(set) var chunks: [Chunk] = []
    private(set) var count = 0
    static var chunkCapacity: Int { 256 }

    var isEmpty: Bool { count == 0 }

    /// The chunk that holds (or would hold) `key`: the last whose first key is not after it.
    private func chunkIndex(_ key: UnsafeRawBufferPointer) -> Int {
        let n = chunks.count
        if n <= 1 { return 0 }
        if chunks[n - 1].compare(0, key) <= 0 { return n - 1 }  // appends (push ids) are common
        var lo = 0, hi = n - 1
        while lo < hi {
            let mid = (lo + hi) >> 1
            if chunks[mid].compare(0, key) <= 0 { lo = mid + 1 } else { hi = mid }
        }
        return max(0, lo - 1)
    }

    func get(_ key: UnsafeRawBufferPointer) -> Entry? {
        guard !chunks.isEmpty else { return nil }
        let ci = chunkIndex(key)
        guard chunks[ci].count > 0 else { return nil }
        let (i, found) = chunks[ci].search(key)
        return found ? chunks[ci].entries[i] : nil
    }

    func get(_ key: [UInt8]) -> Entry? { key.withUnsafeBytes { get($0) } }

    /// Sets `key`; returns the entry it replaced.
    @discardableResult
    mutating func set(_ key: [UInt8], _ entry: Entry) -> Entry? {
        key.withUnsafeBytes { set($0, entry) }
    }

    @discardableResult
    mutating func set(_ k: UnsafeRawBufferPointer, _ entry: Entry) -> Entry? {
        if chunks.isEmpty { chunks.append(Chunk()) }
        let ci = chunkIndex(k)
        let (i, found) = chunks[ci].search(k)
        if found {
            let old = chunks[ci].entries[i]
            chunks[ci].entries[i] = entry
            return old
        }
        insert(k, entry, chunk: ci, at: i)
        return nil
    }

    /// Sets `key`, taking the short way when it sorts after every key already here (as when
    /// an index is rebuilt in key order); returns the entry it replaced.
    @discardableResult
    mutating func append(_ k: UnsafeRawBufferPointer, _ entry: Entry) -> Entry? {
        if let last = chunks.last, last.count > 0, last.compare(last.count - 1, k) < 0 {
            insert(k, entry, chunk: chunks.count - 1, at: last.count)
            return nil
        }
        return set(k, entry)
    }

    /// The length of the longest key.
    var longestKey: Int {
        var longest = 0
        for chunk in chunks {
            var start: UInt32 = 0
            for end in chunk.ends {
                longest = max(longest, chunk.prefix.count + Int(end - start))
                start = end
            }
        }
        return longest
    }

    /// Appends a whole chunk: `count` keys, each `prefix` followed by its slice of
    /// `suffixes` (ending at its `ends` offset), with their entries. The caller has checked
    /// that the keys rise and sort after every key already here, and that there are at most
    /// ``chunkCapacity`` of them (a checkpoint's chunk, put back as it was written).
    mutating func appendChunk(prefix: [UInt8], suffixes: [UInt8], ends: [UInt32], entries: [Entry]) {
        precondition(!entries.isEmpty && entries.count == ends.count && entries.count <= Self.chunkCapacity)
        if let last = chunks.last, last.count == 0 { chunks.removeLast() }
        chunks.append(Chunk(prefix: prefix, suffixes: suffixes, ends: ends, entries: entries))
        count += entries.count
    }

    private mutating func insert(_ key: UnsafeRawBufferPointer, _ entry: Entry, chunk ci: Int, at i: Int) {
        count += 1
        let n = chunks[ci].count
        if n >= Self.chunkCapacity && i == n && ci == chunks.count - 1 {
            // Appending past a full last chunk: start a new one, leaving this one full.
            var fresh = Chunk()
            fresh.insert(key, entry, at: 0)
            chunks.append(fresh)
            return
        }
        chunks[ci].insert(key, entry, at: i)
        if chunks[ci].count > Self.chunkCapacity {
            let upper = chunks[ci].split(at: chunks[ci].count / 2)
            chunks.insert(upper, at: ci + 1)
        }
    }

    /// Puts `entry` at `key` in place of `key` and every key below it (every key that starts
    /// with it); `removed` sees each entry taken out.
    mutating func replaceSubtree(_ key: [UInt8], _ entry: Entry, removed: (Entry) -> Void) {
        key.withUnsafeBytes { k in
            if chunks.isEmpty { chunks.append(Chunk()) }
            let ci = chunkIndex(k)
            let (i, found) = chunks[ci].search(k)
            // The key alone, nothing below it (an overwrite of a leaf or of a value at the
            // same place, the common case): replaced where it stands, nothing shifted.
            if found && !hasKeyAfter(chunk: ci, at: i, withPrefix: k) {
                removed(chunks[ci].entries[i])
                chunks[ci].entries[i] = entry
                return
            }
            if removeRun(prefix: k, chunk: ci, at: i, removed) {
                insert(k, entry, chunk: ci, at: i)
            } else {
                set(k, entry)
            }
        }
    }

    /// Whether the key following (`ci`, `i`) starts with `p`.
    private func hasKeyAfter(chunk ci: Int, at i: Int, withPrefix p: UnsafeRawBufferPointer) -> Bool {
        if i + 1 < chunks[ci].count { return chunks[ci].hasPrefix(i + 1, p) }
        return ci + 1 < chunks.count && chunks[ci + 1].count > 0 && chunks[ci + 1].hasPrefix(0, p)
    }

    /// Removes every key that starts with `prefix` (the key `prefix` itself included), calling
    /// `removed` for each entry.
    mutating func removeAll(withPrefix prefix: [UInt8], _ removed: (Entry) -> Void = { _ in }) {
        guard !chunks.isEmpty else { return }
        prefix.withUnsafeBytes { p in
            let ci = chunkIndex(p)
            let (i, _) = chunks[ci].search(p)
            _ = removeRun(prefix: p, chunk: ci, at: i, removed)
        }
    }

    /// Removes the run of keys starting with `prefix` that begins at (`ci`, `i`). Returns
    /// whether chunk `ci` is still there (so that a key may be inserted at `i`).
    private mutating func removeRun(prefix p: UnsafeRawBufferPointer, chunk start: Int, at first: Int, _ removed: (Entry) -> Void) -> Bool {
        var ci = start, i = first
        var startSurvives = true
        while ci < chunks.count {
            var j = i
            while j < chunks[ci].count && chunks[ci].hasPrefix(j, p) { removed(chunks[ci].entries[j]); j += 1 }
            if j > i {
                chunks[ci].remove(i..<j)
                count -= j - i
            }
            let stoppedInside = i < chunks[ci].count  // a key without the prefix follows: done
            if chunks[ci].count == 0 && chunks.count > 1 {
                chunks.remove(at: ci)
                if ci == start { startSurvives = false }
            } else {
                ci += 1
            }
            if stoppedInside { break }
            i = 0
        }
        return startSurvives
    }

    /// Calls `body` with each key starting with `prefix` (in order) and its entry. The key's
    /// bytes are valid only during the call.
    func forEach(withPrefix prefix: [UInt8], _ body: (UnsafeRawBufferPointer, Entry) throws -> Void) rethrows {
        guard !chunks.isEmpty else { return }
        try prefix.withUnsafeBytes { p in
            var ci = chunkIndex(p)
            var (i, _) = chunks[ci].search(p)
            var key: [UInt8] = []
            while ci < chunks.count {
                while i < chunks[ci].count {
                    guard chunks[ci].hasPrefix(i, p) else { return }
                    chunks[ci].key(i, into: &key)
                    let entry = chunks[ci].entries[i]
                    try key.withUnsafeBytes { try body($0, entry) }
                    i += 1
                }
                ci += 1
                i = 0
            }
        }
    }

    /// Whether `test` accepts the key of every child that keys starting with `prefix` (a path
    /// key, ending with 0) have below it: the bytes after `prefix` up to the next 0, given as
    /// they are held (valid during the call; a child with several keys below it is asked about
    /// more than once). Stops at the first child refused. Reads the chunks in place, a child's
    /// key copied only when it straddles a chunk's shared prefix (a pass with a ``Walker``,
    /// copying each key, was ~5% of walking a million children).
    func allChildKeys(below prefix: [UInt8], _ test: (UnsafeRawBufferPointer) -> Bool) -> Bool {
        allChildKeys(below: prefix, test, chunkAnswer: { _, _, _ in nil })
    }

    /// Whether every child key below `prefix` (a path key, ending with 0) sorts as its bytes
    /// do (``KeyOrder/sortsAsBytes(utf8:)``): what ``allChildKeys(below:_:)`` answers asking
    /// that of each child key, read a chunk at a time where it can be (a scan of its bytes and a
    /// look at each key's first byte: asking of each key was ~8% of a walk of a million children).
    func allChildKeysArePlain(below prefix: [UInt8]) -> Bool {
        allChildKeys(below: prefix, { KeyOrder.sortsAsBytes(utf8: $0) }, chunkAnswer: { $0.childKeysArePlain(from: $1, below: $2) })
    }

    /// ``allChildKeys(below:_:)``, taking a chunk's answer from `chunkAnswer` (its keys from a
    /// slot on) where it gives one, else asking `test` of each child key in it.
    private func allChildKeys(below prefix: [UInt8], _ test: (UnsafeRawBufferPointer) -> Bool,
                              chunkAnswer: (Chunk, Int, UnsafeRawBufferPointer) -> Bool?) -> Bool {
        guard !chunks.isEmpty else { return true }
        return prefix.withUnsafeBytes { p in
            var ci = chunkIndex(p)
            var i = chunks[ci].search(p).0
            var scratch: [UInt8] = []
            while ci < chunks.count {
                if let answer = chunkAnswer(chunks[ci], i, p) {
                    if !answer { return false }
                    (ci, i) = (ci + 1, 0)
                    continue
                }
                switch chunks[ci].childKeys(from: i, below: p, &scratch, test) {
                case .refused: return false
                case .ended: return true
                case .more: (ci, i) = (ci + 1, 0)
                }
            }
            return true
        }
    }

    /// A place in the index (where a ``Walker`` starts).
    private struct Position {
        var chunk: Int
        var slot: Int
    }

    /// The place of the first key not before `key`.
    private func position(atOrAfter key: [UInt8]) -> Position {
        guard !chunks.isEmpty else { return Position(chunk: 0, slot: 0) }
        return key.withUnsafeBytes { k in
            let ci = chunkIndex(k)
            let (i, _) = chunks[ci].search(k)
            return normalized(Position(chunk: ci, slot: i))
        }
    }

    private func normalized(_ p: Position) -> Position {
        var p = p
        while p.chunk < chunks.count && p.slot >= chunks[p.chunk].count {
            p.chunk += 1
            p.slot = 0
        }
        return p
    }


    /// Walks the index from a key on, a step at a time, holding the chunks itself (so that a
    /// step costs no reference counting: reading the index through a class's property would
    /// copy it at every step).
    struct Walker {
        private let chunks: [Chunk]
        private var chunk = 0
        private var slot = 0

        init(_ index: PathIndex, atOrAfter key: [UInt8]) {
            chunks = index.chunks
            let p = index.position(atOrAfter: key)
            chunk = p.chunk
            slot = p.slot
        }

        var isAtEnd: Bool { chunk >= chunks.count }
        /// The key here (not at the end), into `out`.
        func key(into out: inout [UInt8]) {
            let c = chunk, i = slot
            chunks.withUnsafeBufferPointer { all in
                // (Each array through the buffer's element, not a copy of the chunk: that would
                // retain and release its four arrays at every step.)
                let start = i == 0 ? 0 : Int(all[c].ends[i - 1]), end = Int(all[c].ends[i])
                out.removeAll(keepingCapacity: true)
                all[c].prefix.withUnsafeBufferPointer { out.append(contentsOf: $0) }
                all[c].suffixes.withUnsafeBufferPointer { out.append(contentsOf: UnsafeBufferPointer(rebasing: $0[start..<end])) }
            }
        }
        var entry: Entry { chunks[chunk].entries[slot] }
        /// The length of the key here.
        var keyCount: Int { chunks[chunk].prefix.count + chunks[chunk].suffixRange(slot).count }
        /// Whether the key here starts with `prefix` (false at the end).
        func hasPrefix(_ prefix: UnsafeRawBufferPointer) -> Bool { !isAtEnd && chunks[chunk].hasPrefix(slot, prefix) }

        mutating func advance() {
            slot += 1
            while chunk < chunks.count && slot >= chunks[chunk].count {
                chunk += 1
                slot = 0
            }
        }
    }

    /// The key right after `key` (right before it when `after` is false), whether or not
    /// `key` is here; nil at the end.
    func neighbour(of key: [UInt8], after: Bool) -> [UInt8]? {
        guard !chunks.isEmpty else { return nil }
        return key.withUnsafeBytes { k -> [UInt8]? in
            var ci = chunkIndex(k)
            var (i, found) = chunks[ci].search(k)
            if after {
                if found { i += 1 }
                while i >= chunks[ci].count {
                    ci += 1
                    i = 0
                    if ci == chunks.count { return nil }
                }
            } else {
                i -= 1  // (the slot before the one `key` is in, or would go to)
                while i < 0 {
                    ci -= 1
                    if ci < 0 { return nil }
                    i = chunks[ci].count - 1
                }
            }
            var out: [UInt8] = []
            chunks[ci].key(i, into: &out)
            return out
        }
    }

    /// The first (or last) `n` keys, in the index's order from that end.
    func keys(_ n: Int, fromEnd: Bool) -> [[UInt8]] {
        var out: [[UInt8]] = []
        var key: [UInt8] = []
        if fromEnd {
            for chunk in chunks.reversed() {
                for i in stride(from: chunk.count - 1, through: 0, by: -1) {
                    if out.count == n { return out }
                    chunk.key(i, into: &key)
                    out.append(key)
                }
            }
        } else {
            for chunk in chunks {
                for i in 0..<chunk.count {
                    if out.count == n { return out }
                    chunk.key(i, into: &key)
                    out.append(key)
                }
            }
        }
        return out
    }

    /// How many keys start with `prefix` and are longer than it, counting up to `limit`.
    func count(strictlyBelow prefix: [UInt8], limit: Int) -> Int {
        guard !chunks.isEmpty else { return 0 }
        return prefix.withUnsafeBytes { p in
            var ci = chunkIndex(p)
            var (i, exact) = chunks[ci].search(p)
            if exact { i += 1 }
            var n = 0
            while ci < chunks.count && n < limit {
                while i < chunks[ci].count && n < limit {
                    guard chunks[ci].hasPrefix(i, p) else { return n }
                    n += 1
                    i += 1
                }
                ci += 1
                i = 0
            }
            return n
        }
    }

    /// Whether any key starts with `prefix`.
    func hasKey(withPrefix prefix: [UInt8]) -> Bool {
        guard !chunks.isEmpty else { return false }
        return prefix.withUnsafeBytes { p in
            var ci = chunkIndex(p)
            var (i, _) = chunks[ci].search(p)
            while ci < chunks.count {
                if i < chunks[ci].count { return chunks[ci].hasPrefix(i, p) }
                ci += 1
                i = 0
            }
            return false
        }
    }

    /// Whether any key starts with `prefix` and is longer than it (below it, for a path key).
    func hasKey(strictlyBelow prefix: [UInt8]) -> Bool {
        guard !chunks.isEmpty else { return false }
        return prefix.withUnsafeBytes { p in
            var ci = chunkIndex(p)
            var (i, exact) = chunks[ci].search(p)
            if exact { i += 1 }
            while ci < chunks.count {
                if i < chunks[ci].count { return chunks[ci].hasPrefix(i, p) }
                ci += 1
                i = 0
            }
            return false
        }
    }

    mutating func removeAll() {
        chunks = []
        count = 0
    }

    /// Bytes held by keys and entries (an estimate of the index's memory).
    var footprint: Int {
        chunks.reduce(0) {
            $0 + $1.prefix.capacity + $1.suffixes.capacity + $1.ends.capacity * 4 + $1.entries.capacity * MemoryLayout<Entry>.stride + 160
        }
    }
}
