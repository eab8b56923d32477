@_spi(Server) import Ferry
import FerryWire
import Foundation

/// The data a rule reads: a tree, with writes laid over it when it is the data as a write would
/// leave it (`newData`). The writes are applied once, to the location they share; the rest of
/// the tree is read where it is.
struct RuleTree: Sendable {
    let base: Value
    /// The deepest location every write is at or below, and its value once they are applied.
    private let written: (keys: [String], value: Value)?

    /// `base`, with `writes` (locations replaced, in order) applied.
    init(base: Value, writes: [(keys: [String], value: Value)] = []) {
        self.base = base
        guard var common = writes.first?.keys else {
            written = nil
            return
        }
        for w in writes.dropFirst() {
            common = Array(zip(common, w.keys).prefix { $0 == $1 }.map(\.0))
        }
        var v = ValueTree.child(base, common[...])
        for w in writes { ValueTree.set(&v, w.keys.dropFirst(common.count), to: w.value) }
        written = (common, v)
    }

    /// The value at `keys` (normal form: priorities kept), the writes applied.
    func value(at keys: [String]) -> Value {
        guard let written else { return ValueTree.child(base, keys[...]) }
        if keys.starts(with: written.keys) { return ValueTree.child(written.value, keys.dropFirst(written.keys.count)) }
        var v = ValueTree.child(base, keys[...])
        if written.keys.starts(with: keys) { ValueTree.set(&v, written.keys.dropFirst(keys.count), to: written.value) }
        return v
    }
}

/// What a rule is evaluated with.
struct RuleContext {
    /// `auth`: the caller's verified claims (`uid`, `provider`, `token`), or nil for none.
    var auth: Value?
    /// `now`: the server's time in milliseconds.
    var now: Int64
    /// `root`, and `data` at ``keys``: the data before the write.
    var before: RuleTree
    /// `newData` at ``keys``: the data as the write leaves it (nil for reads).
    var after: RuleTree?
    /// The location of the rule.
    var keys: [String] = []
    /// The `$variables` of the location.
    var variables: [String: String] = [:]
}

/// A value while a rule is evaluated.
enum RuleValue {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case list([RuleValue])
    /// An object: `auth`, `auth.token`, or a snapshot's `val()`.
    case map([String: Value])
    case snapshot(RuleTree, [String])
    case regex(RuleRegex)

    init(_ v: Value) {
        switch v {
        case .null: self = .null
        case .bool(let b): self = .bool(b)
        case .int(let i): self = .number(Double(i))
        case .double(let d): self = .number(d)
        case .string(let s): self = .string(s)
        case .array(let a): self = .list(a.map(RuleValue.init))
        case .object(let o): self = .map(o)
        }
    }
}

/// A rule that cannot be evaluated (a type error, a member of null): the rule is false.
struct RuleEvaluationError: Error {}

extension RuleExpression {
    /// Whether the rule grants: true only when it evaluates to `true` without an error.
    func grants(_ context: RuleContext) -> Bool {
        guard case .bool(true)? = try? evaluate(context) else { return false }
        return true
    }

    func evaluate(_ c: RuleContext) throws(RuleEvaluationError) -> RuleValue {
        switch self {
        case .literal(let l):
            switch l {
            case .null: return .null
            case .bool(let b): return .bool(b)
            case .number(let n): return .number(n)
            case .string(let s): return .string(s)
            case .regex(let r): return .regex(r)
            }
        case .list(let items):
            var out: [RuleValue] = []
            for i in items { out.append(try i.evaluate(c)) }
            return .list(out)
        case .variable(let name):
            switch name {
            case "auth": return c.auth.map(RuleValue.init) ?? .null
            case "now": return .number(Double(c.now))
            case "root": return .snapshot(c.before, [])
            case "data": return .snapshot(c.before, c.keys)
            case "newData":
                guard let after = c.after else { throw RuleEvaluationError() }
                return .snapshot(after, c.keys)
            default:
                guard let v = c.variables[name] else { throw RuleEvaluationError() }
                return .string(v)
            }
        case .member(let e, let name):
            return try Self.member(try e.evaluate(c), name)
        case .index(let e, let i):
            let base = try e.evaluate(c)
            switch (base, try i.evaluate(c)) {
            case (.map, .string(let k)): return try Self.member(base, k)
            case (.list(let l), .number(let n)):
                guard let k = Int(exactly: n), l.indices.contains(k) else { return .null }
                return l[k]
            default: throw RuleEvaluationError()
            }
        case .call(let e, let name, let args):
            var values: [RuleValue] = []
            for a in args { values.append(try a.evaluate(c)) }
            return try Self.call(try e.evaluate(c), name, values)
        case .not(let e):
            guard case .bool(let b) = try e.evaluate(c) else { throw RuleEvaluationError() }
            return .bool(!b)
        case .negate(let e):
            guard case .number(let n) = try e.evaluate(c) else { throw RuleEvaluationError() }
            return .number(-n)
        case .and(let a, let b):
            guard case .bool(let x) = try a.evaluate(c) else { throw RuleEvaluationError() }
            guard x else { return .bool(false) }
            guard case .bool(let y) = try b.evaluate(c) else { throw RuleEvaluationError() }
            return .bool(y)
        case .or(let a, let b):
            // A left operand that fails is overruled only by a right one that grants: a failure
            // never turns into a grant (`!(failing || false)` fails, it is not true).
            let left: RuleValue
            do { left = try a.evaluate(c) } catch {
                if case .bool(true) = try b.evaluate(c) { return .bool(true) }
                throw error
            }
            guard case .bool(let x) = left else { throw RuleEvaluationError() }
            if x { return .bool(true) }
            guard case .bool(let y) = try b.evaluate(c) else { throw RuleEvaluationError() }
            return .bool(y)
        case .conditional(let test, let yes, let no):
            guard case .bool(let t) = try test.evaluate(c) else { throw RuleEvaluationError() }
            return try (t ? yes : no).evaluate(c)
        case .binary(let op, let a, let b):
            return try Self.binary(op, try a.evaluate(c), try b.evaluate(c))
        }
    }

    private static func member(_ base: RuleValue, _ name: String) throws(RuleEvaluationError) -> RuleValue {
        switch base {
        case .map(let o): return o[name].map(RuleValue.init) ?? .null
        case .string(let s) where name == "length": return .number(Double(s.utf16.count))
        case .list(let l) where name == "length": return .number(Double(l.count))
        default: throw RuleEvaluationError()
        }
    }

    private static func binary(_ op: RuleOperator, _ a: RuleValue, _ b: RuleValue) throws(RuleEvaluationError) -> RuleValue {
        switch op {
        case .equal: return .bool(equal(a, b))
        case .notEqual: return .bool(!equal(a, b))
        case .add:
            switch (a, b) {
            case (.number(let x), .number(let y)): return .number(x + y)
            case (.string(let x), .string(let y)): return .string(x + y)
            case (.string(let x), .number(let y)): return .string(x + format(y))
            case (.number(let x), .string(let y)): return .string(format(x) + y)
            default: throw RuleEvaluationError()
            }
        case .less, .lessOrEqual, .greater, .greaterOrEqual:
            let order: ComparisonResult
            switch (a, b) {
            case (.number(let x), .number(let y)): order = x < y ? .orderedAscending : x > y ? .orderedDescending : .orderedSame
            case (.string(let x), .string(let y)):
                order = x.utf16.lexicographicallyPrecedes(y.utf16) ? .orderedAscending : x.utf16.elementsEqual(y.utf16) ? .orderedSame : .orderedDescending
            default: throw RuleEvaluationError()
            }
            switch op {
            case .less: return .bool(order == .orderedAscending)
            case .lessOrEqual: return .bool(order != .orderedDescending)
            case .greater: return .bool(order == .orderedDescending)
            default: return .bool(order != .orderedAscending)
            }
        case .subtract, .multiply, .divide, .remainder:
            guard case .number(let x) = a, case .number(let y) = b else { throw RuleEvaluationError() }
            switch op {
            case .subtract: return .number(x - y)
            case .multiply: return .number(x * y)
            case .divide: return .number(x / y)
            default: return .number(x.truncatingRemainder(dividingBy: y))
            }
        }
    }

    /// Equal values of one type; values of different types are never equal.
    private static func equal(_ a: RuleValue, _ b: RuleValue) -> Bool {
        switch (a, b) {
        case (.null, .null): true
        case (.bool(let x), .bool(let y)): x == y
        case (.number(let x), .number(let y)): x == y
        case (.string(let x), .string(let y)): x.utf8.elementsEqual(y.utf8)
        default: false
        }
    }

    private static func format(_ n: Double) -> String {
        if let i = Int64(exactly: n) { return String(i) }
        return String(n)
    }

    private static func call(_ receiver: RuleValue, _ name: String, _ args: [RuleValue]) throws(RuleEvaluationError) -> RuleValue {
        switch receiver {
        case .snapshot(let tree, let keys):
            return try snapshotCall(tree, keys, name, args)
        case .string(let s):
            return try stringCall(s, name, args)
        default:
            throw RuleEvaluationError()
        }
    }

    /// `path` as keys below a snapshot ("a/b" is two keys).
    private static func childKeys(_ args: [RuleValue]) throws(RuleEvaluationError) -> [String] {
        guard args.count == 1, case .string(let path) = args[0] else { throw RuleEvaluationError() }
        return path.split(separator: "/").map(String.init)
    }

    private static func snapshotCall(_ tree: RuleTree, _ keys: [String], _ name: String, _ args: [RuleValue]) throws(RuleEvaluationError) -> RuleValue {
        switch name {
        case "child":
            return .snapshot(tree, keys + (try childKeys(args)))
        case "parent":
            guard args.isEmpty, !keys.isEmpty else { throw RuleEvaluationError() }
            return .snapshot(tree, Array(keys.dropLast()))
        case "hasChild":
            return .bool(tree.value(at: keys + (try childKeys(args))) != .null)
        case "hasChildren":
            let v = ValueTree.exported(tree.value(at: keys))
            guard case .object(let o) = v else { return .bool(false) }
            if args.isEmpty { return .bool(!o.isEmpty) }
            guard args.count == 1, case .list(let names) = args[0] else { throw RuleEvaluationError() }
            for n in names {
                guard case .string(let k) = n else { throw RuleEvaluationError() }
                if o[k] == nil { return .bool(false) }
            }
            return .bool(true)
        default:
            guard args.isEmpty else { throw RuleEvaluationError() }
        }
        let node = tree.value(at: keys)
        let v = ValueTree.exported(node)
        switch name {
        case "val": return RuleValue(v)
        case "exists": return .bool(v != .null)
        case "getPriority": return RuleValue(ValueTree.priority(node))
        case "numChildren":
            if case .object(let o) = v { return .number(Double(o.count)) }
            return .number(0)
        case "isString": if case .string = v { return .bool(true) } else { return .bool(false) }
        case "isBoolean": if case .bool = v { return .bool(true) } else { return .bool(false) }
        case "isNumber":
            switch v {
            case .int, .double: return .bool(true)
            default: return .bool(false)
            }
        default: throw RuleEvaluationError()
        }
    }

    private static func stringCall(_ s: String, _ name: String, _ args: [RuleValue]) throws(RuleEvaluationError) -> RuleValue {
        func string(_ i: Int) throws(RuleEvaluationError) -> String {
            guard args.count > i, case .string(let a) = args[i] else { throw RuleEvaluationError() }
            return a
        }
        switch name {
        case "matches":
            guard args.count == 1, case .regex(let r) = args[0] else { throw RuleEvaluationError() }
            let range = NSRange(s.startIndex..<s.endIndex, in: s)
            return .bool(r.expression.firstMatch(in: s, range: range) != nil)
        case "beginsWith": return .bool(s.hasPrefix(try string(0)))
        case "endsWith": return .bool(s.hasSuffix(try string(0)))
        case "contains": return .bool(s.contains(try string(0)))
        case "replace":
            let target = try string(0)
            guard !target.isEmpty else { return .string(s) }
            return .string(s.replacingOccurrences(of: target, with: try string(1)))
        case "toLowerCase": return .string(s.lowercased())
        case "toUpperCase": return .string(s.uppercased())
        default: throw RuleEvaluationError()
        }
    }
}
