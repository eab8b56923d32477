import FerryTestSupport
import Testing

@testable import Ferry

@Suite struct PathIndexTests {
    /// Random sets, subtree removals and prefix scans against a plain dictionary model, with
    /// enough keys to split chunks many times.
    /// A path key's depth, read eight bytes at a time, is what a byte-by-byte reading gives,
    /// on random bytes rich in zeros: an empty key (two zeros side by side, within a word or
    /// across two), a key not ending in 0 or starting with it, 64 keys or more.
    @Test func aPathKeysDepthReadAWordAtATimeIsTheDepthReadByteByByte() {
        func reference(_ key: [UInt8]) -> Int? {
            if key.isEmpty { return 0 }
            guard key.last == 0, key.first != 0 else { return nil }
            var depth = 0
            for (i, b) in key.enumerated() where b == 0 {
                if i > 0 && key[i - 1] == 0 { return nil }
                depth += 1
            }
            return depth < 64 ? depth : nil
        }
        var g = SplitMix(seed: 77)
        for _ in 0..<200_000 {
            let n = Int(g.next() % 40) + (g.next() % 50 == 0 ? 100 : 0)
            let zeroEvery = 1 + g.next() % 6
            let key: [UInt8] = (0..<n).map { _ in g.next() % zeroEvery == 0 ? 0 : UInt8(truncatingIfNeeded: 1 + g.next() % 255) }
            let got = key.withUnsafeBytes { PathKey.depth($0) }
            #expect(got == reference(key), "\(key)")
            if got != reference(key) { return }
        }
        for path in [Path("a"), Path("posts/p00000001"), Path("abcdefg/h"), Path("abcdefgh/ijklmnop"), Path(keys: (0..<63).map { "k\($0)" }), Path(keys: (0..<64).map { _ in "x" })] {
            #expect(PathKey.encode(path).withUnsafeBytes { PathKey.depth($0) } == (path.count < 64 ? path.count : nil))
        }
    }

    @Test func randomOperationsMatchASimpleModel() {
        var index = PathIndex<Int>()
        var model: [[UInt8]: Int] = [:]
        var g = SplitMix(seed: 42)
        func randomPath() -> Path {
            let depth = 1 + Int(g.next() % 3)
            return Path(keys: (0..<depth).map { d in ["a", "b", "posts", "p\(g.next() % 400)", "x\(d)", ".priority"][Int(g.next() % 6)] })
        }
        for step in 0..<20_000 {
            let p = randomPath()
            let key = PathKey.encode(p)
            switch g.next() % 10 {
            case 0..<4:
                index.set(key, step)
                model[key] = step
            case 4..<6:
                var removed: [Int] = []
                index.replaceSubtree(key, step) { removed.append($0) }
                let expected = model.keys.filter { $0.starts(with: key) }
                #expect(Set(removed) == Set(expected.map { model[$0]! }))
                for k in expected { model[k] = nil }
                model[key] = step
            case 6..<8:
                var removed: [Int] = []
                index.removeAll(withPrefix: key) { removed.append($0) }
                let expected = model.keys.filter { $0.starts(with: key) }
                #expect(Set(removed) == Set(expected.map { model[$0]! }))
                for k in expected { model[k] = nil }
            default:
                var seen: [[UInt8]] = []
                index.forEach(withPrefix: key) { k, v in
                    seen.append(Array(k))
                    #expect(model[Array(k)] == v)
                }
                let expected = model.keys.filter { $0.starts(with: key) }.sorted { $0.lexicographicallyPrecedes($1) }
                #expect(seen == expected, "scan of \(p) at step \(step)")
                #expect(index.hasKey(withPrefix: key) == !expected.isEmpty)
            }
            #expect(index.count == model.count)
            if step % 997 == 0 {
                for (k, v) in model { #expect(index.get(k) == v) }
            }
        }
        #expect(index.chunks.count > 1)
    }

    /// A key replaced where it stands (nothing below it) and a key whose only descendant
    /// begins the next chunk: the descendant goes too, wherever it is kept.
    @Test func replacingAKeyRemovesADescendantThatBeginsTheNextChunk() {
        var index = PathIndex<Int>()
        let capacity = PathIndex<Int>.chunkCapacity
        for i in 0..<(capacity - 1) { index.set(PathKey.encode(Path(keys: ["k\(1000 + i)"])), i) }
        let parent = PathKey.encode(Path(keys: ["z"])), child = PathKey.encode(Path(keys: ["z", "c"]))
        index.set(parent, -1)  // fills the first chunk
        index.set(child, -2)  // past a full last chunk: begins a new one
        #expect(index.chunks.count == 2 && index.chunks[1].count == 1)

        var removed: [Int] = []
        let alone = PathKey.encode(Path(keys: ["k1007"]))
        index.replaceSubtree(alone, 7_000) { removed.append($0) }
        #expect(removed == [7] && index.get(alone) == 7_000 && index.count == capacity + 1)

        removed = []
        index.replaceSubtree(parent, 9_000) { removed.append($0) }
        #expect(Set(removed) == [-1, -2])
        #expect(index.get(parent) == 9_000 && index.get(child) == nil && index.count == capacity)
        var seen: [[UInt8]] = []
        index.forEach(withPrefix: []) { k, _ in seen.append(Array(k)) }
        #expect(seen.count == capacity && seen.last == parent)
    }

    /// Keys that share long prefixes, inserted in order (whole chunks fill up) and out of
    /// order (chunks split and their shared prefixes shrink and grow).
    @Test func keysWithLongSharedPrefixesStayFindableInAnyInsertionOrder() {
        for shuffled in [false, true] {
            var index = PathIndex<Int>()
            var keys = (0..<5_000).map { PathKey.encode(Path(keys: ["posts", "post-\(String($0 * 7919 % 100_000, radix: 16))", "title"])) }
            keys += (0..<300).map { PathKey.encode(Path(keys: ["p\($0 % 7)"])) }
            var g = SplitMix(seed: 7)
            if shuffled { keys.shuffle(using: &g) }
            for (i, k) in keys.enumerated() { index.set(k, i) }
            let distinct = Set(keys)
            #expect(index.count == distinct.count)
            var last: [UInt8]? = nil
            var seen = 0
            index.forEach(withPrefix: []) { k, _ in
                if let last { #expect(last.lexicographicallyPrecedes(Array(k))) }
                last = Array(k)
                seen += 1
            }
            #expect(seen == distinct.count)
            for (i, k) in keys.enumerated() where keys.lastIndex(of: k) == i { #expect(index.get(k) == i) }
            #expect(index.get(PathKey.encode(Path(keys: ["posts"]))) == nil)
            #expect(index.hasKey(withPrefix: PathKey.encode(Path(keys: ["posts"]))))
        }
    }

    /// Whether every child key below a location sorts as its bytes do, read a chunk at a time
    /// (`allChildKeysArePlain`), is what asking each child key finds — with integer keys,
    /// keys with characters from U+E000 on, keys that only start like integers, such keys
    /// only deeper down, chunks that hold keys of several locations, and chunks whose keys
    /// share a prefix past the location's key.
    @Test func whetherChildKeysSortAsTheirBytesIsWhatAskingEachFinds() {
        var g = SplitMix(seed: 77)
        var answers: [Bool: Int] = [:]
        for round in 0..<40 {
            var index = PathIndex<Int>()
            let odd = ["7", "-3", "0", "-", "-x", "007", "1e3", "\u{E000}a", "a\u{FFFF}", "é", "😀"]
            for i in 0..<(300 * (1 + round % 8)) {
                let top = ["posts", "users", "p"][Int(g.next() % 3)]
                var child = "p\(String(format: "%06d", Int(g.next() % 100_000)))"
                if g.next() % UInt64(2 + round * 40) == 0 { child = odd[Int(g.next() % UInt64(odd.count))] + (g.next() % 2 == 0 ? "" : "\(i)") }
                var keys = [top, child]
                if g.next() % 3 == 0 { keys.append(g.next() % 5 == 0 ? odd[Int(g.next() % UInt64(odd.count))] : "likes") }
                index.set(PathKey.encode(Path(keys: keys)), i)
            }
            // Whole chunks whose keys share a prefix past the location: integers, or not.
            // (Below "mix", keys before the integers in byte order, "!" sorting before digits.)
            for i in 1_000..<2_000 {
                index.set(PathKey.encode(Path(keys: ["arr", String(i)])), i)
                index.set(PathKey.encode(Path(keys: ["grid", "x\(i)", "y"])), i)
                index.set(PathKey.encode(Path(keys: ["mix", "!\(i)"])), i)
                if round % 2 == 0 { index.set(PathKey.encode(Path(keys: ["mix", String(i)])), i) }
            }
            for location in [["posts"], ["users"], ["p"], ["none"], [], ["arr"], ["grid"], ["mix"]] {
                let prefix = PathKey.encode(Path(keys: location))
                let expected = index.allChildKeys(below: prefix) { KeyOrder.sortsAsBytes(utf8: $0) }
                #expect(index.allChildKeysArePlain(below: prefix) == expected, "round \(round), below \(location)")
                answers[expected, default: 0] += 1
            }
        }
        #expect(answers[true, default: 0] > 20 && answers[false, default: 0] > 20, "\(answers)")
    }

    /// `allChildKeys(below:)` — read from the chunks in place — asks about exactly the
    /// children a key-by-key derivation finds below each location (keys sharing long prefixes,
    /// locations whose children share a chunk's prefix, the location's own key, deeper keys),
    /// and stops at the first it refuses.
    @Test func theChildKeysBelowALocationAreThoseOfItsKeys() {
        var g = SplitMix(seed: 21)
        for round in 0..<6 {
            var index = PathIndex<Int>()
            var paths: [Path] = [Path(keys: ["posts"]), Path(keys: ["users"])]
            for i in 0..<(800 * (round + 1)) {
                let top = ["posts", "users", "p", "postsX"][Int(g.next() % 4)]
                let child = g.next() % 3 == 0 ? "\(g.next() % 40)" : "p\(String(format: "%08d", Int(g.next() % 5_000)))"
                paths.append(g.next() % 4 == 0 ? Path(keys: [top, child, "likes"]) : Path(keys: [top, child]))
                if i % 97 == 0 { paths.append(Path(keys: [top, "é\(i)"])) }
            }
            // A child with whole chunks of keys below it (its key lies in their shared prefix).
            paths += (0..<700).map { Path(keys: ["users", "u1", "f\($0)"]) }
            for (i, p) in paths.enumerated() { index.set(PathKey.encode(p), i) }
            for location in [Path(keys: ["posts"]), Path(keys: ["users"]), Path(keys: ["p"]), Path(keys: ["none"]), Path(keys: ["posts", "7"])] {
                let prefix = PathKey.encode(location)
                var expected = Set<String>()
                index.forEach(withPrefix: prefix) { k, _ in
                    guard k.count > prefix.count else { return }
                    let rest = k[prefix.count...]
                    expected.insert(String(decoding: rest[rest.startIndex..<rest.firstIndex(of: 0)!], as: UTF8.self))
                }
                var asked = Set<String>()
                #expect(index.allChildKeys(below: prefix) { asked.insert(String(decoding: $0, as: UTF8.self)); return true })
                #expect(asked == expected, "round \(round), below \(location)")
                if let refused = expected.randomElement(using: &g) {
                    var after = 0
                    let all = index.allChildKeys(below: prefix) { k in
                        if String(decoding: k, as: UTF8.self) == refused { after += 1; return false }
                        #expect(after == 0, "asked again after a refusal")
                        return true
                    }
                    #expect(!all && after == 1)
                }
            }
        }
    }

    @Test func pathKeysRoundTripAndSortSubtreesTogether() {
        let paths: [Path] = [.root, "a", "a/b", "a/b/c", "ab", "a/.priority", "b"]
        for p in paths { #expect(PathKey.decode(PathKey.encode(p)) == p) }
        let sorted = paths.map(PathKey.encode).sorted { $0.lexicographicallyPrecedes($1) }.map { PathKey.decode($0) }
        #expect(sorted == [.root, "a", "a/.priority", "a/b", "a/b/c", "ab", "b"])
    }
}
