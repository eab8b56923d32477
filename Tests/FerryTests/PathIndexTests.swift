import FerryTestSupport
import Testing

@testable import Ferry

@Suite struct PathIndexTests {
    /// Random sets, subtree removals and prefix scans against a plain dictionary model, with
    /// enough keys to split chunks many times.
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

    @Test func pathKeysRoundTripAndSortSubtreesTogether() {
        let paths: [Path] = [.root, "a", "a/b", "a/b/c", "ab", "a/.priority", "b"]
        for p in paths { #expect(PathKey.decode(PathKey.encode(p)) == p) }
        let sorted = paths.map(PathKey.encode).sorted { $0.lexicographicallyPrecedes($1) }.map { PathKey.decode($0) }
        #expect(sorted == [.root, "a", "a/.priority", "a/b", "a/b/c", "ab", "b"])
    }
}
