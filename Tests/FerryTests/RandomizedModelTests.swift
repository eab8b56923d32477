import FerryLog
import Foundation
import FerryTestSupport
import FerryTortureSupport
import Synchronization
import Testing

@testable @_spi(Server) import Ferry

/// A deliberately simple model of what a client sees: server data as a plain value tree, the
/// pending local writes in order, and the visible data = server data with the writes applied.
/// It shares no code with the engine.
struct Model: ValueTreeModel {
    enum Write {
        case set(id: Int64, path: [String], value: Value)
        case update(id: Int64, path: [String], children: [([String], Value)])
        var id: Int64 { switch self { case .set(let id, _, _), .update(let id, _, _): id } }
    }

    var server: Value = .null
    var pending: [Write] = []
    /// Writes refused in a batch answer and not cleared (kept by the database).
    var rejected: [Int64] = []

    static func apply(_ w: Write, to v: Value) -> Value {
        switch w {
        case .set(_, let p, let value): return set(v, p[...], value)
        case .update(_, let p, let children):
            var out = v
            for (rel, value) in children { out = set(out, (p + rel)[...], value) }
            return out
        }
    }

    /// Pending writes apply to the server data as the Realtime Database's client layers them:
    /// a write below an earlier pending write folds into it (in order); other writes are
    /// patches at their paths (a later one at or above a path replaces the earlier ones there).
    var visible: Value {
        var layers: [(path: [String], value: Value)] = []
        func add(_ path: [String], _ value: Value) {
            if let i = layers.firstIndex(where: { path.starts(with: $0.path) }) {
                layers[i].value = Model.set(layers[i].value, path.dropFirst(layers[i].path.count), value)
            } else {
                layers.removeAll { $0.path.starts(with: path) }
                layers.append((path, Model.normalized(value)))
            }
        }
        for w in pending {
            switch w {
            case .set(_, let p, let v): add(p, v)
            case .update(_, let p, let children): for (rel, v) in children { add(p + rel, v) }
            }
        }
        return layers.reduce(server) { Model.set($0, $1.path[...], $1.value) }
    }

    func visible(at path: [String]) -> Value { Model.get(visible, path[...]) }
}

@Suite struct RandomizedModelTests {
    /// Steps per seed and the seeds: a few hundred normally; set FERRY_MODEL_STEPS and
    /// FERRY_MODEL_SEEDS (comma-separated) for a soak.
    static let steps = Int(ProcessInfo.processInfo.environment["FERRY_MODEL_STEPS"] ?? "") ?? 600
    static let seeds: [UInt64] = ProcessInfo.processInfo.environment["FERRY_MODEL_SEEDS"]?.split(separator: ",").compactMap { UInt64($0) } ?? [1, 2, 3]

    final class Latest: Sendable {
        let value = FerryMutex<Value?>(nil)
    }

    struct Listener {
        var path: [String]
        var handle: ObserverHandle
        var latest: Latest
    }

    @Test(arguments: seeds)
    func theViewFollowsASimpleModelThroughWritesAcksRevertsAndRestarts(seed: UInt64) async throws {
        let dir = try TemporaryDirectory()
        var g = SplitMix(seed: seed)
        var options = quietOptions(.none)
        options.segmentSize = 16 << 10
        var db = try Database.open(at: dir.path, options: options)
        var model = Model()
        try await db.applyServerPut(at: "", [:])  // the server's data starts empty and complete

        let keys = ["a", "b", "c", "d"]
        func randomPath(min: Int = 0) -> [String] { TortureWorkload.randomPath(&g, min: min) }
        func randomValue(_ depth: Int = 0) -> Value { TortureWorkload.randomValue(&g, depth) }
        func ref(_ p: [String]) -> DatabaseReference { p.isEmpty ? db.root : try! db.reference(p.joined(separator: "/")) }
        /// The server's own update for a write it applied (it arrives before the acknowledgement).
        func echo(_ w: Model.Write) async throws {
            switch w {
            case .set(_, let p, let v): try await db.applyServerPut(at: p.joined(separator: "/"), v)
            case .update(_, let p, let children):
                try await db.applyServerMerge(at: p.joined(separator: "/"), Dictionary(uniqueKeysWithValues: children.map { ($0.0.joined(separator: "/"), $0.1) }))
            }
            model.server = Model.apply(w, to: model.server)
        }

        var listeners: [Listener] = []
        func listen(_ path: [String]) {
            let latest = Latest()
            let handle = ref(path).observe(.value) { s in latest.value.withLock { $0 = s.value } }
            listeners.append(Listener(path: path, handle: handle, latest: latest))
        }

        func check(_ step: Int, _ what: String, sourceLocation: SourceLocation = #_sourceLocation) {
            for l in listeners {
                let seen = l.latest.value.withLock { $0 }
                let expected = model.visible(at: l.path)
                if seen != expected {
                    Issue.record("seed \(seed) step \(step) (\(what)): listener at /\(l.path.joined(separator: "/")) sees \(seen.map(\.description) ?? "nothing"), the model \(expected)", sourceLocation: sourceLocation)
                }
            }
        }

        for step in 0..<Self.steps {
            let roll = g.next() % 100
            var what = ""
            switch roll {
            case 0..<25:
                let p = randomPath()
                let v = randomValue()
                what = "set /\(p.joined(separator: "/")) = \(v)"
                let r = try await ref(p).setValue(v)
                model.pending.append(.set(id: r.writeID!, path: p, value: v))
            case 25..<35:
                let p = randomPath()
                var children: [([String], Value)] = []
                for k in keys.shuffled(using: &g).prefix(1 + Int(g.next() % 3)) { children.append(([k], randomValue(1))) }
                what = "update /\(p.joined(separator: "/")) \(children.map { "\($0.0[0])=\($0.1)" })"
                let r = try await ref(p).updateChildValues(Dictionary(uniqueKeysWithValues: children.map { ($0.0.joined(separator: "/"), $0.1) }))
                model.pending.append(.update(id: r.writeID!, path: p, children: children))
            case 35..<47:
                let p = randomPath()
                let v = randomValue()
                what = "server put /\(p.joined(separator: "/")) = \(v)"
                try await db.applyServerPut(at: p.joined(separator: "/"), v)
                model.server = Model.set(model.server, p[...], v)
            case 47..<55:
                let p = randomPath()
                let k = keys[Int(g.next() % 4)]
                let v = randomValue(1)
                what = "server merge /\(p.joined(separator: "/")) \(k)=\(v)"
                try await db.applyServerMerge(at: p.joined(separator: "/"), [k: v])
                model.server = Model.set(model.server, (p + [k])[...], v)
            case 55..<63 where !model.pending.isEmpty:
                // The server applies the oldest write, echoes it, then acknowledges it.
                let w = model.pending.removeFirst()
                what = "ack \(w.id)"
                try await echo(w)
                try await db.acknowledgeWrite(w.id)
            case 63..<72 where !model.pending.isEmpty:
                // The server answers the oldest writes in order, refusing some: one cursor record.
                let n = 1 + Int(g.next() % UInt64(min(4, model.pending.count)))
                var rejections: [WriteRejection] = []
                for w in model.pending.prefix(n) {
                    if g.next() % 4 == 0 {
                        rejections.append(WriteRejection(writeID: w.id, status: 401, message: "Permission denied"))
                        model.rejected.append(w.id)
                    } else {
                        try await echo(w)
                    }
                }
                let through = model.pending[n - 1].id
                model.pending.removeFirst(n)
                what = "ack through \(through), rejecting \(rejections.map(\.writeID))"
                try await db.acknowledgeWrites(through: through, rejecting: rejections)
                #expect(db.acknowledgedThrough == through)
            case 97..<98 where !model.rejected.isEmpty:
                let id = model.rejected.remove(at: Int(g.next() % UInt64(model.rejected.count)))
                what = "clear rejected \(id)"
                try await db.clearRejectedWrites([id])
            case 72..<78 where !model.pending.isEmpty:
                let i = Int(g.next() % UInt64(model.pending.count))
                let w = model.pending.remove(at: i)
                what = "reject \(w.id)"
                try await db.acknowledgeWrite(w.id, rejected: true)
            case 78..<88:
                let p = randomPath()
                what = "listen /\(p.joined(separator: "/"))"
                listen(p)
            case 88..<93 where !listeners.isEmpty:
                let l = listeners.remove(at: Int(g.next() % UInt64(listeners.count)))
                what = "unlisten /\(l.path.joined(separator: "/"))"
                ref(l.path).removeObserver(withHandle: l.handle)
            case 93..<97:
                // Restart: the replayed view must equal the view before.
                what = "restart"
                let before = try await db.root.getData().value
                #expect(before == model.visible, "seed \(seed) step \(step): the view before a restart")
                let paths = listeners.map(\.path)
                for l in listeners { ref(l.path).removeObserver(withHandle: l.handle) }
                listeners = []
                if g.next() % 2 == 0 {
                    // Compaction restates what the old segments held: reads must not change.
                    what += " after compaction"
                    try await db.compact()
                    #expect(try await db.root.getData().value == before, "seed \(seed) step \(step): the view after compaction")
                }
                options.checkpointOnClose = g.next() % 2 == 0
                try await db.close()
                if g.next() % 3 == 0 {
                    // Without any checkpoint, the restated records replay in log order.
                    for f in try Files.list(dir.path) where f.hasPrefix("checkpoint-") { try Files.remove(dir.sub(f)) }
                }
                db = try Database.open(at: dir.path, options: options)
                #expect(try await db.root.getData().value == before, "seed \(seed) step \(step): replay after a restart")
                #expect(db.pendingWriteIDs == model.pending.map(\.id), "seed \(seed) step \(step): pending writes after a restart")
                #expect(try db.rejectedWrites().map(\.writeID) == model.rejected.sorted(), "seed \(seed) step \(step): rejected writes after a restart")
                for p in paths { listen(p) }
            default:
                let p = randomPath()
                what = "read /\(p.joined(separator: "/"))"
                #expect(try await ref(p).getData().value == model.visible(at: p), "seed \(seed) step \(step): getData at /\(p.joined(separator: "/"))")
            }
            if ProcessInfo.processInfo.environment["FERRY_MODEL_TRACE"] != nil {
                print("seed \(seed) step \(step): \(what) -> model \(model.visible) pending \(model.pending.map(\.id))")
            }
            check(step, what)
        }
        try await db.close()
    }
}
