/// The value of a leaf node.
enum LeafValue: Sendable {
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    /// A server value (`{".sv": …}`) not yet resolved.
    case deferred(Value)
    /// The placeholder value of a query boundary ("post") node; never stored.
    case post

    /// Firebase's order of leaf types: server values, booleans, numbers, strings.
    var typeRank: Int {
        switch self {
        case .deferred, .post: 0
        case .bool: 1
        case .int, .double: 2
        case .string: 3
        }
    }

    var value: Value {
        switch self {
        case .bool(let b): .bool(b)
        case .int(let i): .int(i)
        case .double(let d): .double(d)
        case .string(let s): .string(s)
        case .deferred(let v): v
        case .post: .string("[PRIORITY-POST]")
        }
    }

    var doubleValue: Double? {
        switch self {
        case .int(let i): Double(i)
        case .double(let d): d
        default: nil
        }
    }

    static func compare(_ a: LeafValue, _ b: LeafValue) -> Int {
        let ra = a.typeRank, rb = b.typeRank
        if ra != rb { return ra < rb ? -1 : 1 }
        switch (a, b) {
        case let (.bool(x), .bool(y)): return x == y ? 0 : (x ? 1 : -1)
        // (By code units, as the Realtime Database and the child-value index order them: not
        // `==`, which holds "é" and "e" with a combining accent equal.)
        case let (.string(x), .string(y)): return KeyOrder.utf16Order(x, y)
        case let (.int(x), .int(y)): return x == y ? 0 : (x < y ? -1 : 1)
        default:
            if let x = a.doubleValue, let y = b.doubleValue {
                if case let (.int(xi), .double(yd)) = (a, b), Double(xi) == yd { return 0 }
                if case let (.double(xd), .int(yi)) = (a, b), xd == Double(yi) { return 0 }
                return x == y ? 0 : (x < y ? -1 : 1)
            }
            return 0
        }
    }
}

extension LeafValue: Equatable, Hashable {
    static func == (a: LeafValue, b: LeafValue) -> Bool {
        switch (a, b) {
        case let (.deferred(x), .deferred(y)): return x == y
        case (.post, .post): return true
        case (.deferred, _), (_, .deferred), (.post, _), (_, .post): return false
        // Exactly, unlike the order (which ties an integer past 2^53 with the double it rounds
        // to): a change between them is a change to show.
        case let (.int(x), .double(y)), let (.double(y), .int(x)): return Int64(exactly: y) == x
        default: return a.typeRank == b.typeRank && LeafValue.compare(a, b) == 0
        }
    }

    func hash(into h: inout Hasher) {
        switch self {
        case .bool(let b): h.combine(b)
        case .int(let i): h.combine(Double(i))
        case .double(let d): h.combine(d)
        case .string(let s): h.combine(s)
        case .deferred(let v): h.combine(v)
        case .post: h.combine(-1)
        }
    }
}

/// A child's key with its node.
struct NamedNode: Sendable, Equatable {
    var name: String
    var node: Node
}

/// A node's children, sorted in key order, none of them empty.
struct ChildMap: Sendable, Equatable {
    private(set) var entries: [NamedNode]

    init() { entries = [] }
    init(sorted: [NamedNode]) { entries = sorted }

    var count: Int { entries.count }
    var isEmpty: Bool { entries.isEmpty }

    /// The position of `key`, or where it would be inserted.
    func search(_ key: String) -> (index: Int, found: Bool) {
        var lo = 0, hi = entries.count
        while lo < hi {
            let mid = (lo + hi) / 2
            let c = KeyOrder.compare(entries[mid].name, key)
            if c == 0 { return (mid, true) }
            if c < 0 { lo = mid + 1 } else { hi = mid }
        }
        return (lo, false)
    }

    subscript(key: String) -> Node? {
        let (i, found) = search(key)
        return found ? entries[i].node : nil
    }

    /// Sets (or, for an empty node, removes) a child.
    func updating(_ key: String, _ node: Node) -> ChildMap {
        var copy = self
        let (i, found) = search(key)
        if node.isEmpty {
            if found { copy.entries.remove(at: i) }
        } else if found {
            copy.entries[i].node = node
        } else {
            copy.entries.insert(NamedNode(name: key, node: node), at: i)
        }
        return copy
    }
}

/// A node of the data tree: empty (null), a leaf, or children; leaves and non-empty children
/// may carry a priority (an empty, number or string leaf node). Immutable.
///
/// Make nodes with ``leaf(_:priority:)`` and ``children(_:priority:)``, read them with
/// ``leafParts`` and ``childParts``: a node without a priority — nearly every one — is held in
/// place, not in an allocated box (a decoded post's fields cost no allocation each).
enum Node: Sendable {
    case empty
    /// A leaf without a priority.
    case plainLeaf(LeafValue)
    /// A leaf with a priority (never an empty one).
    indirect case prioritizedLeaf(LeafValue, priority: Node)
    /// Children (never none) without a priority.
    case plainChildren(ChildMap)
    /// Children (never none) with a priority (never an empty one).
    indirect case prioritizedChildren(ChildMap, priority: Node)
    /// Greater than every other node; used only as a query boundary.
    case max

    /// A leaf with `priority` (empty: none).
    static func leaf(_ value: LeafValue, priority: Node) -> Node {
        priority.isEmpty ? .plainLeaf(value) : .prioritizedLeaf(value, priority: priority)
    }

    /// Children (not none) with `priority` (empty: none).
    static func children(_ children: ChildMap, priority: Node) -> Node {
        priority.isEmpty ? .plainChildren(children) : .prioritizedChildren(children, priority: priority)
    }

    /// A leaf's value and priority; nil for any other node.
    var leafParts: (value: LeafValue, priority: Node)? {
        switch self {
        case .plainLeaf(let v): (v, .empty)
        case .prioritizedLeaf(let v, let p): (v, p)
        default: nil
        }
    }

    /// A leaf's value; nil for any other node.
    var leafValue: LeafValue? {
        switch self {
        case .plainLeaf(let v), .prioritizedLeaf(let v, _): v
        default: nil
        }
    }

    /// The children and priority of a node that has children; nil for any other node.
    var childParts: (children: ChildMap, priority: Node)? {
        switch self {
        case .plainChildren(let c): (c, .empty)
        case .prioritizedChildren(let c, let p): (c, p)
        default: nil
        }
    }

    var isEmpty: Bool { if case .empty = self { true } else { false } }
    var isLeaf: Bool {
        switch self {
        case .plainLeaf, .prioritizedLeaf: true
        default: false
        }
    }
    var hasChildren: Bool {
        switch self {
        case .plainChildren, .prioritizedChildren: true
        default: false
        }
    }

    var priority: Node {
        switch self {
        case .prioritizedLeaf(_, let p), .prioritizedChildren(_, let p): p
        default: .empty
        }
    }

    var childMap: ChildMap {
        switch self {
        case .plainChildren(let c), .prioritizedChildren(let c, _): c
        default: ChildMap()
        }
    }

    var numChildren: Int { childMap.count }

    func hasChild(_ key: String) -> Bool { !getImmediateChild(key).isEmpty }

    func getImmediateChild(_ key: String) -> Node {
        switch self {
        case .plainChildren(let c): return key == ".priority" ? .empty : c[key] ?? .empty
        case .prioritizedChildren(let c, let p): return key == ".priority" ? p : c[key] ?? .empty
        case .prioritizedLeaf(_, let p): return key == ".priority" ? p : .empty
        default: return .empty
        }
    }

    func getChild(_ path: Path) -> Node {
        var node = self
        for key in path.keys {
            node = node.getImmediateChild(key)
            if node.isEmpty { return .empty }
        }
        return node
    }

    func updatingPriority(_ p: Node) -> Node {
        switch self {
        case .plainLeaf(let v), .prioritizedLeaf(let v, _): return .leaf(v, priority: p)
        case .plainChildren(let c), .prioritizedChildren(let c, _): return .children(c, priority: p)
        case .empty, .max: return self
        }
    }

    func updatingImmediateChild(_ key: String, _ child: Node) -> Node {
        if key == ".priority" { return updatingPriority(child) }
        switch self {
        case .plainChildren, .prioritizedChildren:
            let updated = childMap.updating(key, child)
            return updated.isEmpty ? .empty : .children(updated, priority: priority)
        case .plainLeaf, .prioritizedLeaf:
            // Removing a child of a leaf changes nothing; adding one replaces the leaf.
            if child.isEmpty { return self }
            return .children(ChildMap().updating(key, child), priority: priority)
        case .empty:
            if child.isEmpty { return self }
            return .children(ChildMap().updating(key, child), priority: .empty)
        case .max:
            return self
        }
    }

    /// The same node as `updatingImmediateChild` applied for each change in turn, built in one
    /// pass (sorting the new keys once) instead of a copy of the children per change. No key
    /// may be `.priority`.
    func updatingImmediateChildren(_ changes: [(String, Node)]) -> Node {
        if changes.count < 16 {
            return changes.reduce(self) { $0.updatingImmediateChild($1.0, $1.1) }
        }
        var base: ChildMap
        var priority: Node
        var leaf: LeafValue?
        switch self {
        case .plainChildren, .prioritizedChildren: base = childMap; priority = self.priority; leaf = nil
        case .plainLeaf(let v), .prioritizedLeaf(let v, _): base = ChildMap(); priority = self.priority; leaf = v
        case .empty: base = ChildMap(); priority = .empty; leaf = nil
        case .max: return self
        }
        // Follow the count of children through the changes in order: a node whose last child
        // goes becomes empty and loses its priority, as one change at a time would.
        var updates: [String: Node] = [:]
        updates.reserveCapacity(changes.count)
        var count = base.count
        for (key, child) in changes {
            var replacingLeaf = false
            if leaf != nil {
                if child.isEmpty { continue }  // removing a child of a leaf changes nothing
                leaf = nil  // adding one replaces the leaf, keeping its priority
                replacingLeaf = true
            }
            let existed = updates[key].map { !$0.isEmpty } ?? (base[key] != nil)
            if child.isEmpty {
                if existed {
                    count -= 1
                    if count == 0 { priority = .empty }
                }
            } else if !existed {
                if count == 0 && !replacingLeaf { priority = .empty }  // children of an empty node
                count += 1
            }
            updates[key] = child
        }
        if let leaf { return .leaf(leaf, priority: priority) }
        if count == 0 { return .empty }
        // New keys in the order of the changes (each once, with its last value).
        var added: [NamedNode] = []
        var seen = Set<String>()
        let repeats = updates.count != changes.count
        for (key, _) in changes {
            guard let u = updates[key], !u.isEmpty, base[key] == nil else { continue }
            if repeats && !seen.insert(key).inserted { continue }
            added.append(NamedNode(name: key, node: u))
        }
        // Often already in key order (the changes come in byte order, which it matches for
        // keys that are not numbers): check before sorting.
        if added.indices.dropFirst().contains(where: { KeyOrder.compare(added[$0 - 1].name, added[$0].name) > 0 }) {
            added.sort { KeyOrder.compare($0.name, $1.name) < 0 }
        }
        var merged: [NamedNode] = []
        merged.reserveCapacity(count)
        var j = 0
        for e in base.entries {
            while j < added.count && KeyOrder.compare(added[j].name, e.name) < 0 { merged.append(added[j]); j += 1 }
            if let u = updates[e.name] {
                if !u.isEmpty { merged.append(NamedNode(name: e.name, node: u)) }
            } else {
                merged.append(e)
            }
        }
        merged.append(contentsOf: added[j...])
        return .children(ChildMap(sorted: merged), priority: priority)
    }

    func updatingChild(_ path: Path, _ child: Node) -> Node {
        guard let front = path.front else { return child }
        if front == ".priority" {
            precondition(path.count == 1, ".priority must be the last key of a path")
            return updatingPriority(child)
        }
        let updated = getImmediateChild(front).updatingChild(path.popFront, child)
        return updatingImmediateChild(front, updated)
    }

    /// Calls `body` for each child in key order.
    func forEachChild(_ body: (String, Node) throws -> Void) rethrows {
        if let c = childParts?.children { for e in c.entries { try body(e.name, e.node) } }
    }

    /// The Realtime Database's value order for nodes: empty < leaves (by type, then value) <
    /// objects (all alike) < max.
    static func compare(_ a: Node, _ b: Node) -> Int {
        switch (a, b) {
        case (.max, .max): return 0
        case (.max, _): return 1
        case (_, .max): return -1
        case (.empty, .empty): return 0
        case (.empty, _): return -1
        case (_, .empty): return 1
        default:
            if let x = a.leafValue {
                if let y = b.leafValue { return LeafValue.compare(x, y) }
                return -1  // (a leaf before children)
            }
            return b.isLeaf ? 1 : 0
        }
    }
}

extension Node: Equatable, Hashable {
    static func == (a: Node, b: Node) -> Bool {
        switch (a, b) {
        case (.empty, .empty), (.max, .max): return true
        case let (.plainLeaf(x), .plainLeaf(y)): return x == y
        case let (.prioritizedLeaf(x, p), .prioritizedLeaf(y, q)): return x == y && p == q
        case let (.plainChildren(x), .plainChildren(y)): return x == y
        case let (.prioritizedChildren(x, p), .prioritizedChildren(y, q)): return p == q && x == y
        default: return false
        }
    }

    func hash(into h: inout Hasher) {
        switch self {
        case .empty: h.combine(0)
        case .max: h.combine(1)
        case .plainLeaf(let v), .prioritizedLeaf(let v, _):
            h.combine(v)
            h.combine(priority)
        case .plainChildren(let c), .prioritizedChildren(let c, _):
            let p = priority
            h.combine(c.count)
            for e in c.entries.prefix(8) {
                h.combine(e.name)
                h.combine(e.node)
            }
            h.combine(p)
        }
    }
}

extension Node {
    /// The node's value: a leaf's value, an object of children (an array when its keys are
    /// dense integers), or null. With `export`, priorities are included (`.priority`, and
    /// `{".value": v, ".priority": p}` for leaves) and arrays are never made.
    func value(export: Bool = false) -> Value {
        switch self {
        case .empty, .max: return .null
        case .plainLeaf(let v): return v.value
        case .prioritizedLeaf(let v, let p):
            if export { return .object([".value": v.value, ".priority": p.value()]) }
            return v.value
        case .plainChildren(let c), .prioritizedChildren(let c, _):
            // An array when every key is an index and at least half the slots are used; built
            // straight, not through a dictionary first.
            if !export, let count = Self.arrayCount(c.entries) {
                var array = [Value](repeating: .null, count: count)
                for e in c.entries { array[arrayIndex(e.name)!] = e.node.value() }
                return .array(array)
            }
            let p = priority
            var object = [String: Value](minimumCapacity: c.count + 1)
            for e in c.entries { object[e.name] = e.node.value(export: export) }
            if export, !p.isEmpty { object[".priority"] = p.value() }
            return .object(object)
        }
    }

    /// The length of the array that children with these keys make (in key order, never
    /// none), or nil when they make an object.
    private static func arrayCount(_ entries: [NamedNode]) -> Int? {
        var maxKey = 0
        for e in entries {
            guard let k = arrayIndex(e.name) else { return nil }
            maxKey = Swift.max(maxKey, k)
        }
        return arrayLength(maxIndex: maxKey, count: entries.count)
    }

    /// Builds a node from a value, checking it: keys, priorities, server values, numbers, and
    /// depth — `path` is where the value is written, and no key may lie deeper than
    /// ``Path/maxDepth`` below the root.
    /// - Throws: ``DatabaseError`` with code ``DatabaseError/Code/invalidData`` naming where.
    init(_ value: Value, path: Path = .root) throws {
        self = try Node.build(value, at: path, depth: 0)
    }

    static func build(_ value: Value, at path: Path, depth: Int) throws -> Node {
        guard depth <= 512 else { throw DatabaseError(.invalidData, "the value at \(path) is nested too deeply") }
        switch value {
        case .null: return .empty
        case .bool(let b): return .leaf(.bool(b), priority: .empty)
        case .int(let i): return .leaf(.int(i), priority: .empty)
        case .double(let d):
            guard d.isFinite else { throw DatabaseError(.invalidData, "the number at \(path) is \(d); only finite numbers can be stored") }
            return .leaf(.double(d), priority: .empty)
        case .string(let s): return .leaf(.string(s), priority: .empty)
        case .array(let items):
            var entries: [NamedNode] = []
            for (i, item) in items.enumerated() {
                let childPath = path.child(String(i))
                if childPath.count > Path.maxDepth { throw Path.valueTooDeep(at: childPath.description, depth: childPath.count) }
                let child = try build(item, at: childPath, depth: depth + 1)
                if !child.isEmpty { entries.append(NamedNode(name: String(i), node: child)) }
            }
            entries.sort { KeyOrder.compare($0.name, $1.name) < 0 }
            return entries.isEmpty ? .empty : .children(ChildMap(sorted: entries), priority: .empty)
        case .object(let object):
            let priority = try object[".priority"].map { try priorityNode($0, at: path) } ?? .empty
            if let sv = object[".sv"] {
                try validateServerValue(sv, at: path)
                guard object.keys.allSatisfy({ $0 == ".sv" || $0 == ".priority" }) else {
                    throw DatabaseError(.invalidData, "the server value at \(path) has other keys beside .sv")
                }
                return .leaf(.deferred([".sv": sv]), priority: priority)
            }
            if let v = object[".value"] {
                guard object.keys.allSatisfy({ $0 == ".value" || $0 == ".priority" }) else {
                    throw DatabaseError(.invalidData, "the value at \(path) has .value beside keys other than .priority")
                }
                let inner = try build(v, at: path, depth: depth + 1)
                return inner.isEmpty ? .empty : inner.updatingPriority(priority)
            }
            var entries: [NamedNode] = []
            entries.reserveCapacity(object.count)
            for (key, child) in object where key != ".priority" {
                do { try Path.validate(key: key) } catch let e as DatabaseError {
                    throw DatabaseError(.invalidData, "at \(path): \(e.message)")
                }
                let childPath = path.child(key)
                if childPath.count > Path.maxDepth { throw Path.valueTooDeep(at: childPath.description, depth: childPath.count) }
                let node = try build(child, at: childPath, depth: depth + 1)
                if !node.isEmpty { entries.append(NamedNode(name: key, node: node)) }
            }
            guard !entries.isEmpty else { return .empty }
            entries.sort { KeyOrder.compare($0.name, $1.name) < 0 }
            return .children(ChildMap(sorted: entries), priority: priority)
        }
    }

    /// A priority: null, a number or a string.
    static func priorityNode(_ value: Value, at path: Path) throws -> Node {
        switch value {
        case .null: return .empty
        case .int, .double, .string: return try Node(value, path: path)
        default:
            throw DatabaseError(.invalidData, "the priority at \(path) is \(value); a priority must be a string, a number or null")
        }
    }

    static func validateServerValue(_ sv: Value, at path: Path) throws {
        switch sv {
        case .string("timestamp"): return
        case .object(let o) where o.count == 1:
            if let n = o["increment"], let d = n.number, d.isFinite { return }
        default: break
        }
        throw DatabaseError(.invalidData, "the server value at \(path) is \(sv); only \"timestamp\" and {\"increment\": n} with n a finite number exist")
    }
}

/// The length of the array that `count` children whose keys are indices, the largest
/// `maxIndex`, make: nil when fewer than half its slots would be used (they are an object).
func arrayLength(maxIndex: Int, count: Int) -> Int? { maxIndex < 2 * count ? maxIndex + 1 : nil }

/// The index of an array element: a non-negative integer key without leading zeros.
func arrayIndex(_ key: String) -> Int? {
    // Firebase's /^(0|[1-9]\d*)$/ (up to 9 digits): no sign, no leading zero. (`Int(key)`
    // alone took "-3" for an index, and reading an object with such a key trapped.)
    let utf8 = key.utf8
    guard let first = utf8.first, utf8.count <= 9, first != UInt8(ascii: "0") || utf8.count == 1 else { return nil }
    var n = 0
    for byte in utf8 {
        guard byte >= UInt8(ascii: "0") && byte <= UInt8(ascii: "9") else { return nil }
        n = n * 10 + Int(byte - UInt8(ascii: "0"))
    }
    return n
}
