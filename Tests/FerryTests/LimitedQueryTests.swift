import FerryLog
import FerryTestSupport
import Foundation
import Synchronization
import Testing

@testable @_spi(Server) import Ferry

/// Limited queries over many cached children: the window a query shows equals a brute-force
/// selection (sort everything, take the end), first and after changes, for every kind of order.
@Suite struct LimitedQueryTests {
    struct Rng {
        var state: UInt64
        mutating func next() -> UInt64 {
            state = state &* 6364136223846793005 &+ 1442695040888963407
            return state >> 33
        }
    }

    /// The brute-force window: children in range, sorted by the query's order, the last or first `limit`.
    static func bruteForce(_ children: [String: Value], index: QueryIndex, limit: Int, last: Bool,
                           inRange: (NamedNode) -> Bool = { _ in true }) throws -> [String] {
        // Each child's ordering value taken once, then a plain sort by (value, key).
        let nodes = try children.map { NamedNode(name: $0.key, node: try Node($0.value)) }.filter { !$0.node.isEmpty && inRange($0) }
        let keyed: [(value: Node, name: String)] = nodes.map { n in
            switch index {
            case .key: (.empty, n.name)
            case .priority: (n.node.priority, n.name)
            case .value: (n.node, n.name)
            case .child(let p): (n.node.getChild(p), n.name)
            }
        }
        let sorted = keyed.sorted { a, b in
            let c = Node.compare(a.value, b.value)
            return c != 0 ? c < 0 : KeyOrder.compare(a.name, b.name) < 0
        }.map(\.name)
        return last ? Array(sorted.suffix(limit)) : Array(sorted.prefix(limit))
    }

    @Test(arguments: [1_000, 100_000])
    func aLimitedQueryShowsTheSameWindowAsABruteForceSelection(children count: Int) async throws {
        var g = Rng(state: UInt64(count))
        var posts: [String: Value] = [:]
        for i in 0..<count {
            posts["p\(i)"] = ["likes": .int(Int64(g.next() % 1000)), "title": .string("t\(g.next() % 100)")]
        }
        let db = Database.inMemory(options: quietOptions())
        try await db.applyServerPut(at: "posts", .object(posts))
        let ref = try db.reference("posts")
        var cases: [(DatabaseQuery, QueryIndex, Bool)] = [
            (try ref.queryOrdered(byChild: "likes").queryLimited(toLast: 10), .child(Path("likes")), true),
            (try ref.queryOrdered(byChild: "likes").queryLimited(toFirst: 25), .child(Path("likes")), false),
            (try ref.queryOrderedByKey().queryLimited(toLast: 7), .key, true),
            (try ref.queryOrdered(byChild: "title").queryLimited(toFirst: 3), .child(Path("title")), false),
        ]
        if count > 10_000 { cases = [cases[0], cases[2]] }  // the big case: one order by child, one by key
        for (query, index, last) in cases {
            let limit = query.params.limit!
            let seen = FerryMutex<[String]>([])
            let handle = query.observe(.value) { snap in seen.withLock { $0 = snap.children.map { $0.key! } } }
            #expect(seen.withLock { $0 } == (try Self.bruteForce(posts, index: index, limit: limit, last: last)), "\(query)")
            // Changes move children in and out of the window.
            for _ in 0..<20 {
                let key = "p\(g.next() % UInt64(count))"
                if g.next() % 4 == 0 {
                    posts[key] = nil
                    try await db.applyServerPut(at: "posts/\(key)", .null)
                } else {
                    let v: Value = ["likes": .int(Int64(g.next() % 1200)), "title": .string("t\(g.next() % 100)")]
                    posts[key] = v
                    try await db.reference("posts/\(key)").setValue(v)
                }
            }
            #expect(seen.withLock { $0 } == (try Self.bruteForce(posts, index: index, limit: limit, last: last)), "\(query) after changes")
            query.removeObserver(withHandle: handle)
        }
        // A range with a limit.
        let ranged = try ref.queryOrdered(byChild: "likes").queryStarting(atValue: 100).queryEnding(atValue: 500).queryLimited(toLast: 5)
        let snap = try await ranged.getData()
        let expected = try Self.bruteForce(posts, index: .child(Path("likes")), limit: 5, last: true) { n in
            let likes = n.node.getChild(Path("likes"))
            return Node.compare(likes, try! Node(100)) >= 0 && Node.compare(likes, try! Node(500)) <= 0
        }
        #expect(snap.children.map { $0.key! } == expected)
    }
}
