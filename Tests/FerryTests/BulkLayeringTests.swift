import FerryTestSupport
import Foundation
import Testing

@testable @_spi(Server) import Ferry

/// Reading a location with many children written below it builds each level once; it must give
/// the very node that applying the writes one at a time gives.
@Suite struct BulkLayeringTests {
    struct Rng {
        var s: UInt64
        mutating func next(_ n: Int) -> Int {
            s = s &* 6364136223846793005 &+ 1442695040888963407
            return Int((s >> 33) % UInt64(n))
        }
    }

    static let keys = (0..<40).map { $0 % 3 == 0 ? String($0) : "k\($0)" } + ["-", "a b", "10", "9", "~"]

    static func node(_ g: inout Rng, depth: Int = 0) -> Node {
        switch g.next(depth > 1 ? 3 : 5) {
        case 0: return .empty
        case 1: return .leaf(.int(Int64(g.next(100))), priority: g.next(3) == 0 ? .leaf(.int(1), priority: .empty) : .empty)
        case 2: return .leaf(.string("v\(g.next(9))"), priority: .empty)
        default:
            var n = Node.empty
            for _ in 0..<(1 + g.next(4)) { n = n.updatingImmediateChild(keys[g.next(keys.count)], node(&g, depth: depth + 1)) }
            return g.next(3) == 0 ? n.updatingPriority(.leaf(.string("p"), priority: .empty)) : n
        }
    }

    @Test func updatingManyChildrenAtOnceEqualsUpdatingThemOneByOne() {
        var g = Rng(s: 7)
        for round in 0..<400 {
            var base = Node.empty
            switch round % 4 {
            case 0: base = .leaf(.int(5), priority: .leaf(.int(2), priority: .empty))
            case 1: base = .empty
            default:
                for _ in 0..<g.next(30) { base = base.updatingImmediateChild(Self.keys[g.next(Self.keys.count)], Self.node(&g)) }
                if g.next(2) == 0 { base = base.updatingPriority(.leaf(.int(9), priority: .empty)) }
            }
            var changes: [(String, Node)] = []
            var used = Set<String>()
            for _ in 0..<(16 + g.next(30)) {
                let k = Self.keys[g.next(Self.keys.count)]
                guard used.insert(k).inserted else { continue }
                changes.append((k, g.next(3) == 0 ? .empty : Self.node(&g, depth: 1)))
            }
            changes.sort { Array($0.0.utf8).lexicographicallyPrecedes(Array($1.0.utf8)) }
            let oneByOne = changes.reduce(base) { $0.updatingImmediateChild($1.0, $1.1) }
            let atOnce = base.updatingImmediateChildren(changes)
            #expect(atOnce == oneByOne && atOnce.priority == oneByOne.priority, "round \(round)")
        }
    }

    @Test func aLocationWithThousandsOfWrittenChildrenReadsWhole() async throws {
        let db = Database.inMemory(options: quietOptions(.none))
        try await db.applyServerPut(at: "posts", ["old": "server", "p00007": ["was": "here"]])
        var expected: [String: Value] = ["old": "server"]
        for i in 0..<3000 {
            let key = "p" + String(format: "%05d", i)
            if i % 7 == 0 {
                try await db.reference("posts/\(key)/title").setValue(.string("t\(i)"))
                try await db.reference("posts/\(key)/n").setValue(.int(Int64(i)))
                expected[key] = key == "p00007" ? ["was": "here", "title": .string("t\(i)"), "n": .int(Int64(i))] : ["title": .string("t\(i)"), "n": .int(Int64(i))]
            } else {
                try await db.reference("posts/\(key)").setValue(["n": .int(Int64(i))])
                expected[key] = ["n": .int(Int64(i))]
            }
        }
        try await db.reference("posts/p00001").removeValue()
        expected["p00001"] = nil
        #expect(try await db.reference("posts").getData().value == .object(expected))
    }
}
