import FerryLog
import Foundation
import FerryTestSupport
import FerryTortureSupport
import Synchronization
import Testing

@testable @_spi(Server) import Ferry

/// The randomized model test with evictions: a small cache limit, bursts of filler server data
/// that force evictions, pins and listeners. The model (``Model``) knows everything; the
/// database may have forgotten what was evicted and was neither pinned nor listened to. So a
/// read equals the model or says "not cached" — and under a pin or a listener, it equals the
/// model; a listener always sees the model.
@Suite struct RandomizedEvictionTests {
    static let steps = Int(ProcessInfo.processInfo.environment["FERRY_MODEL_STEPS"] ?? "") ?? 300
    static let seeds: [UInt64] = ProcessInfo.processInfo.environment["FERRY_MODEL_SEEDS"]?.split(separator: ",").compactMap { UInt64($0) } ?? [11, 12]

    final class Latest: Sendable {
        let value = FerryMutex<Value?>(nil)
    }

    static func filler(_ i: Int) -> Value {
        var x = UInt64(i) &* 0x9E37_79B9_7F4A_7C15 | 1
        var s = ""
        for _ in 0..<160 {
            x ^= x << 13; x ^= x >> 7; x ^= x << 17
            s += String(x, radix: 36)
        }
        return .string(s)
    }

    @Test(arguments: seeds)
    func readsEqualTheModelOrSayNotCachedAndKeptDataIsNeverForgotten(seed: UInt64) async throws {
        let dir = try TemporaryDirectory()
        var g = SplitMix(seed: seed)
        var options = quietOptions(.none)
        options.cacheSizeBytes = .bytes(CacheSize.minimumBytes)
        options.segmentSize = 8 << 20
        var db = try Database.open(at: dir.path, options: options)
        var model = Model()
        try await db.applyServerPut(at: "", [:])

        let keys = ["a", "b", "c", "d"]
        func randomPath(min: Int = 0) -> [String] { TortureWorkload.randomPath(&g, min: min) }
        func randomValue(_ depth: Int = 0) -> Value { TortureWorkload.randomValue(&g, depth) }
        func at(_ p: [String]) -> String { (["m"] + p).joined(separator: "/") }
        func ref(_ p: [String]) -> DatabaseReference { try! db.reference(at(p)) }

        var listeners: [(path: [String], handle: ObserverHandle, latest: Latest)] = []
        var pins: Set<[String]> = []
        /// Pins made while their data was complete (a pin on data already evicted keeps nothing).
        var trustedPins: Set<[String]> = []
        var fillerCount = 0
        var evictions = 0
        try await db.applyServerPut(at: "m", [:])
        func kept(_ p: [String]) -> Bool {
            listeners.contains { p.starts(with: $0.path) && $0.latest.value.withLock { $0 != nil } } || trustedPins.contains { p.starts(with: $0) }
        }

        for step in 0..<Self.steps {
            let roll = g.next() % 100
            var what = ""
            switch roll {
            case 0..<15:
                let p = randomPath()
                let v = randomValue()
                what = "set \(p) = \(v)"
                let r = try await ref(p).setValue(v)
                model.pending.append(.set(id: r.writeID!, path: p, value: v))
            case 15..<33:
                let p = randomPath()
                let v = randomValue()
                what = "server put \(p) = \(v)"
                try await db.applyServerPut(at: at(p), v)
                model.server = Model.set(model.server, p[...], v)
            case 33..<43:
                let p = randomPath()
                let k = keys[Int(g.next() % 4)]
                let v = randomValue(1)
                what = "server merge \(p) \(k)=\(v)"
                try await db.applyServerMerge(at: at(p), [k: v])
                model.server = Model.set(model.server, (p + [k])[...], v)
            case 43..<55 where !model.pending.isEmpty:
                let w = model.pending.removeFirst()
                what = "ack \(w.id)"
                switch w {
                case .set(_, let p, let v): try await db.applyServerPut(at: at(p), v)
                case .update: break
                }
                model.server = Model.apply(w, to: model.server)
                try await db.acknowledgeWrites(through: w.id)
            case 55..<62:
                let p = randomPath()
                what = "listen \(p)"
                let latest = Latest()
                let handle = ref(p).observe(.value) { s in latest.value.withLock { $0 = s.value } }
                listeners.append((p, handle, latest))
            case 62..<65 where !listeners.isEmpty:
                let l = listeners.remove(at: Int(g.next() % UInt64(listeners.count)))
                what = "unlisten \(l.path)"
                ref(l.path).removeObserver(withHandle: l.handle)
            case 65..<70:
                let p = randomPath(min: 1)
                let pin = !pins.contains(p) || g.next() % 2 == 0
                what = "keepSynced(\(pin)) \(p)"
                try await ref(p).keepSynced(pin)
                if pin {
                    pins.insert(p)
                    if (try? await ref(p).getData()) != nil { trustedPins.insert(p) }
                } else {
                    pins.remove(p)
                    trustedPins.remove(p)
                }
            case 70..<80:
                what = "filler burst"
                for _ in 0..<100 {
                    try await db.applyServerPut(at: "filler/f\(fillerCount)", Self.filler(fillerCount))
                    fillerCount += 1
                }
            case 80..<83:
                what = "restart"
                let paths = listeners.map(\.path)
                for l in listeners { ref(l.path).removeObserver(withHandle: l.handle) }
                listeners = []
                try await db.close()
                db = try Database.open(at: dir.path, options: options)
                #expect(db.pendingWriteIDs == model.pending.map(\.id), "seed \(seed) step \(step): pending writes after a restart")
                #expect(Set(db.statistics.pins) == Set(pins.map { Path(keys: ["m"] + $0).description }), "seed \(seed) step \(step): pins")
                for p in paths {
                    let latest = Latest()
                    let handle = ref(p).observe(.value) { s in latest.value.withLock { $0 = s.value } }
                    listeners.append((p, handle, latest))
                }
            default:
                let p = randomPath()
                what = "read \(p)"
                do {
                    let v = try await ref(p).getData().value
                    #expect(v == model.visible(at: p), "seed \(seed) step \(step): getData at \(p)")
                } catch let e as DatabaseError where e.code == .notCached {
                    #expect(!kept(p), "seed \(seed) step \(step): kept data at \(p) is not cached; pins \(pins) trusted \(trustedPins) listeners \(listeners.map { ($0.path, $0.latest.value.withLock { $0 }) })")
                }
            }
            if ProcessInfo.processInfo.environment["FERRY_MODEL_TRACE"] != nil {
                print("seed \(seed) step \(step): \(what) -> model \(model.visible) pending \(model.pending.map(\.id)) evicted \(db.statistics.lastEviction?.entriesEvicted ?? 0)")
            }
            if let run = db.statistics.lastEviction, run.endedAt > 0 { evictions += 1 }
            for l in listeners {
                let seen = l.latest.value.withLock { $0 }
                if let seen, seen != model.visible(at: l.path) {
                    Issue.record("seed \(seed) step \(step) (\(what)): listener at \(l.path) sees \(seen), the model \(model.visible(at: l.path))")
                }
            }
            // Over the limit only while pending writes (never evicted) hold segments.
            let s = db.statistics
            // (An open does not evict: the first update after it does.)
            #expect(s.bytesOnDisk <= Int64(CacheSize.minimumBytes + options.effectiveSegmentSize) || s.pendingWrites > 0 || what == "restart", "seed \(seed) step \(step) (\(what)): \(s)")
        }
        #expect(evictions > 0, "seed \(seed): nothing was evicted")
        try await db.close()
    }
}
