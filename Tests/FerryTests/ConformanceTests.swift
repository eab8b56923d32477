import Foundation
import Testing

@testable import Ferry

/// Runs Firebase's listener-event cases against Ferry's event generation.
@Suite struct ConformanceTests {
    static let specPath: String = ProcessInfo.processInfo.environment["FERRY_SYNCPOINT_SPEC"]
        ?? (URL(fileURLWithPath: #filePath).deletingLastPathComponent().path + "/Conformance/syncPointSpec.json")

    static func loadCases() throws -> [(name: String, steps: [[String: Value]])] {
        let bytes = [UInt8](try Data(contentsOf: URL(fileURLWithPath: specPath)))
        guard case .array(let cases) = try Value(jsonBytes: bytes) else { throw SpecError("the spec is not an array") }
        return try cases.map { c in
            guard case .object(let o) = c, case .string(let name)? = o["name"], case .array(let steps)? = o["steps"] else {
                throw SpecError("a case without name or steps")
            }
            return (name, try steps.map { s in
                guard case .object(let step) = s else { throw SpecError("a step is not an object") }
                return step
            })
        }
    }

    @Test func everyCasePassesAtTheRootAndUnderANestedPath() throws {
        let cases = try Self.loadCases()
        #expect(!cases.isEmpty)
        var passed = 0
        var failures: [String] = []
        for base in ["", "foo/bar/baz"] {
            for c in cases {
                do {
                    try SpecRunner(base: Path(base)).run(c.steps)
                    passed += 1
                } catch {
                    failures.append("\(c.name) [\(base.isEmpty ? "root" : base)]: \(error)")
                }
            }
        }
        print("conformance: \(passed) passed, \(failures.count) failed of \(cases.count * 2) (\(cases.count) cases × 2 base paths) from \(Self.specPath)")
        for f in failures { Issue.record(Comment(rawValue: f)) }
    }
}

struct SpecError: Error, CustomStringConvertible {
    var description: String
    init(_ d: String) { description = d }
}

/// Drives a SyncTree through one case's steps and checks the events of each.
final class SpecRunner {
    let base: Path
    let tree = SyncTree()
    var nextWriteID: Int64 = 0
    var tags: [Int: Int] = [:]  // spec tag → tree tag
    var registrations: [Int: (EventRegistration, QuerySpec)] = [:]
    var nextRegistration: UInt64 = 1

    init(base: Path) { self.base = base }

    func path(_ v: Value?) -> Path {
        guard case .string(let s)? = v else { return base }
        return base.child(Path(s))
    }

    func node(_ v: Value?) throws -> Node { try Node(v ?? .null) }

    func merge(_ v: Value?) throws -> CompoundWrite {
        guard case .object(let o)? = v else { throw SpecError("an update's data must be an object") }
        return CompoundWrite(try o.keys.sorted().map { (Path($0), try Node(o[$0]!)) })
    }

    func run(_ steps: [[String: Value]]) throws {
        for (n, step) in steps.enumerated() {
            guard case .string(let type)? = step["type"] else { throw SpecError("step \(n) has no type") }
            var events: [Event]
            switch type {
            case "listen":
                let query = QuerySpec(path: path(step["path"]), params: try params(step["params"]))
                let registration = EventRegistration(id: nextRegistration, types: Set(DataEventType.allCases)) { _, _ in }
                nextRegistration += 1
                events = tree.addEventRegistration(registration, for: query)
                if case .int(let id)? = step["callbackId"] { registrations[Int(id)] = (registration, query) }
                if case .object(let p)? = step["params"], case .int(let specTag)? = p["tag"], let tag = tree.tag(for: query) {
                    tags[Int(specTag)] = tag
                }
            case "unlisten":
                guard case .int(let id)? = step["callbackId"], let (registration, query) = registrations[Int(id)] else {
                    throw SpecError("step \(n): unlisten of an unknown callbackId")
                }
                tree.removeEventRegistration(registration, for: query)
                events = []
            case "set":
                let visible: Bool
                if case .bool(let v)? = step["visible"] { visible = v } else { visible = true }
                events = tree.applyUserOverwrite(path(step["path"]), try node(step["data"]), writeID: nextWriteID, visible: visible)
                nextWriteID += 1
            case "update":
                events = tree.applyUserMerge(path(step["path"]), try merge(step["data"]), writeID: nextWriteID)
                nextWriteID += 1
            case "serverUpdate":
                if case .int(let t)? = step["tag"] {
                    events = tags[Int(t)].map { tree.applyTaggedOverwrite(path(step["path"]), (try? node(step["data"])) ?? .empty, tag: $0) } ?? []
                } else {
                    events = tree.applyServerOverwrite(path(step["path"]), try node(step["data"]))
                }
            case "serverMerge":
                if case .int(let t)? = step["tag"] {
                    let m = try merge(step["data"])
                    events = tags[Int(t)].map { tree.applyTaggedMerge(path(step["path"]), m, tag: $0) } ?? []
                } else {
                    events = tree.applyServerMerge(path(step["path"]), try merge(step["data"]))
                }
            case "ackUserWrite":
                guard case .int(let id)? = step["writeId"] else { throw SpecError("step \(n): ack without writeId") }
                let revert: Bool
                if case .bool(let r)? = step["revert"] { revert = r } else { revert = false }
                events = tree.ackUserWrite(id, revert: revert)
            case "suppressWarning":
                events = []
            default:
                throw SpecError("step \(n): unknown type \(type)")
            }
            guard case .array(let expected)? = step["events"] else { throw SpecError("step \(n) has no events") }
            do {
                try check(events, expected)
            } catch {
                throw SpecError("step \(n) (\(type)): \(error)")
            }
        }
    }

    func params(_ v: Value?) throws -> QueryParams {
        var p = QueryParams()
        guard case .object(let o)? = v else { return p }
        if case .string(let child)? = o["orderBy"] { p.index = .child(Path(child)) }
        if o["orderByKey"] != nil { p.index = .key }
        if o["orderByPriority"] != nil { p.index = .priority }
        if o["orderByValue"] != nil { p.index = .value }
        func bound(_ b: Value?) throws -> (Node, String?)? {
            guard case .object(let ob)? = b else { return nil }
            let value = ob["index"] ?? .null
            let node: Node = p.index == .priority ? try Node.priorityNode(value, at: .root) : try Node(value)
            if case .string(let name)? = ob["name"] { return (node, name) }
            return (node, nil)
        }
        if let (n, name) = try bound(o["startAt"]) { p.startSet = true; p.startValue = n; p.startName = name }
        if let (n, name) = try bound(o["startAfter"]) {
            p.startSet = true; p.startValue = n; p.startAfter = true
            p.startName = name ?? (p.index == .key ? nil : KeyOrder.maxName)
        }
        if let (n, name) = try bound(o["endAt"]) { p.endSet = true; p.endValue = n; p.endName = name }
        if let (n, name) = try bound(o["endBefore"]) {
            p.endSet = true; p.endValue = n; p.endBefore = true
            p.endName = name ?? (p.index == .key ? nil : KeyOrder.minName)
        }
        if let (n, name) = try bound(o["equalTo"]) {
            p.startSet = true; p.startValue = n; p.startName = name
            p.endSet = true; p.endValue = n; p.endName = name
        }
        if case .int(let l)? = o["limitToFirst"] { p.limit = Int(l); p.viewFromLeft = true }
        if case .int(let l)? = o["limitToLast"] { p.limit = Int(l); p.viewFromLeft = false }
        return p
    }

    struct Observed: CustomStringConvertible {
        var path: Path, type: DataEventType, name: String?, prevName: String?, data: Node, registration: UInt64
        var description: String {
            "\(type) at \(path)\(name.map { " \($0)" } ?? "")\(prevName.map { " after \($0)" } ?? "") = \(data.value(export: true))"
        }
    }

    func check(_ events: [Event], _ expected: [Value]) throws {
        let actual = events.map { e -> Observed in
            let data: Node = e.type == .value ? e.eventCache.node : e.change.node
            return Observed(path: base.relative(to: e.query.path), type: e.type, name: e.change.childKey,
                            prevName: e.change.prevName, data: data, registration: e.registration.id)
        }
        let wanted = try expected.map { v -> Observed in
            guard case .object(let o) = v, case .string(let p)? = o["path"], case .string(let t)? = o["type"] else {
                throw SpecError("an expected event without path or type")
            }
            guard let type = DataEventType.allCases.first(where: { $0.description == t }) else { throw SpecError("unknown event type \(t)") }
            var name: String?
            if case .string(let n)? = o["name"], type != .value { name = n }
            var prev: String?
            if case .string(let n)? = o["prevName"] { prev = n }
            return Observed(path: Path(p), type: type, name: name, prevName: prev, data: try Node(o["data"] ?? .null), registration: 0)
        }
        func groups(_ list: [Observed]) -> [Path] {
            var out: [Path] = []
            for o in list where out.last != o.path { out.append(o.path) }
            return out
        }
        let describe = { (list: [Observed]) in list.map(\.description).joined(separator: "; ") }
        guard groups(actual) == groups(wanted) else {
            throw SpecError("listener paths differ.\n  expected: \(describe(wanted))\n  actual:   \(describe(actual))")
        }
        var unmatched = actual
        for w in wanted {
            guard let i = unmatched.firstIndex(where: { a in
                a.path == w.path && a.type == w.type && a.name == w.name && a.data == w.data
                    && (w.type == .childRemoved || a.prevName == w.prevName)
            }) else {
                throw SpecError("missing \(w).\n  expected: \(describe(wanted))\n  actual:   \(describe(actual))")
            }
            unmatched.remove(at: i)
        }
        if !unmatched.isEmpty { throw SpecError("extra events: \(describe(unmatched)).\n  expected: \(describe(wanted))") }
        var lastType: [UInt64: Int] = [:]
        for a in actual {
            if let last = lastType[a.registration], last > a.type.rawValue {
                throw SpecError("events out of Firebase's order for one listener: \(describe(actual))")
            }
            lastType[a.registration] = a.type.rawValue
        }
    }
}
