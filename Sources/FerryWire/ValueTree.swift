@_spi(Server) import Ferry

/// Operations on a whole tree of values as the server keeps it: objects only (arrays become
/// objects with integer keys), no empty objects, no nulls inside, priorities kept as
/// `.priority` keys and leaves with a priority as `{".value": v, ".priority": p}`.
public enum ValueTree {
    /// `value` in the tree's normal form: arrays as objects keyed "0", "1"…, nulls and empty
    /// objects removed.
    public static func normalized(_ value: Value) -> Value {
        if isNormal(value) { return value }  // (most are: checked without building anything)
        switch value {
        case .array(let items):
            var o: [String: Value] = [:]
            for (i, item) in items.enumerated() {
                let n = normalized(item)
                if case .null = n { continue }
                o[String(i)] = n
            }
            return o.isEmpty ? .null : .object(o)
        case .object(let dict):
            var o: [String: Value] = [:]
            for (k, v) in dict {
                let n = normalized(v)
                if case .null = n { continue }
                o[k] = n
            }
            if o.isEmpty { return .null }
            if o.count == 1, o[".priority"] != nil { return .null }  // a priority alone holds nothing
            return .object(o)
        default:
            return value
        }
    }

    /// Whether `value` is in the tree's normal form already: no arrays, no nulls inside, no
    /// empty objects, no object holding only a priority.
    static func isNormal(_ value: Value) -> Bool {
        switch value {
        case .array: return false
        case .object(let o):
            if o.isEmpty || (o.count == 1 && o[".priority"] != nil) { return false }
            for child in o.values {
                if case .null = child { return false }
                if !isNormal(child) { return false }
            }
            return true
        default: return true
        }
    }

    /// The value at `keys` below `value` (null when absent).
    public static func child(_ value: Value, _ keys: ArraySlice<String>) -> Value {
        guard let first = keys.first else { return value }
        guard case .object(let o) = value, let c = o[first] else { return .null }
        return child(c, keys.dropFirst())
    }

    /// Replaces the location `keys` in `value` (normal) by `new` (normalized; parents emptied
    /// by a delete are removed), in place: where `value`'s objects are not shared, no object on
    /// the path is copied — O(size of `new` + the path's depth), not the siblings' count.
    ///
    /// The Realtime Database's tree rules, as a Ferry client's cache applies them
    /// (`Node.updatingChild`): writing a value below a leaf replaces the leaf (keeping its
    /// priority); writing null below a leaf changes nothing; a node whose last child goes is
    /// gone, priority and all.
    public static func set(_ value: inout Value, _ keys: ArraySlice<String>, to new: Value) {
        guard let first = keys.first else {
            value = normalized(new)
            return
        }
        var o: [String: Value] = [:]
        switch value {
        case .null:
            break
        case .object(let dict) where dict[".value"] == nil:
            o = dict
        default:
            // A leaf (with a priority: `{".value": v, ".priority": p}`).
            var child = Value.null
            set(&child, keys.dropFirst(), to: new)
            if case .null = child { return }  // nothing written below a leaf: it stays
            o[first] = child
            if case .object(let dict) = value, let p = dict[".priority"] { o[".priority"] = p }
            value = .object(o)
            return
        }
        value = .null  // (o is now the only reference to the object: it changes in place)
        var child = o.removeValue(forKey: first) ?? .null
        set(&child, keys.dropFirst(), to: new)
        if case .null = child {} else { o[first] = child }
        // Only this level can have emptied: the siblings were normal already.
        if o.isEmpty || (o.count == 1 && o[".priority"] != nil) { return }
        value = .object(o)
    }

    /// About how many bytes `value` takes as JSON (keys and strings by their UTF-8, numbers
    /// and punctuation by a few each).
    public static func approximateBytes(_ value: Value) -> Int {
        switch value {
        case .object(let o): return o.reduce(2) { $0 + $1.key.utf8.count + 4 + approximateBytes($1.value) }
        case .array(let a): return a.reduce(2) { $0 + 1 + approximateBytes($1) }
        case .string(let t): return t.utf8.count + 2
        default: return 8
        }
    }

    /// How many keys deep the deepest leaf of `value` is (0 for a leaf).
    public static func depth(_ value: Value) -> Int {
        switch value {
        case .object(let o):
            if o[".value"] != nil { return 0 }
            var deepest = 0
            for v in o.values { deepest = max(deepest, depth(v)) }
            return 1 + deepest
        case .array(let a):
            var deepest = 0
            for v in a { deepest = max(deepest, depth(v)) }
            return 1 + deepest
        default: return 0
        }
    }

    /// Validates every key of `value` (Realtime Database key rules; `.priority`, `.value` and
    /// `.sv` where they belong).
    ///
    /// - Throws: ``WireError`` (`invalidPath`) naming the key.
    public static func validateKeys(_ value: Value) throws {
        guard case .object(let o) = value else {
            if case .array(let a) = value { try a.forEach(validateKeys) }
            return
        }
        if o[".sv"] != nil { return }
        for (k, v) in o {
            if k == ".priority" || k == ".value" { continue }
            try Path.validate(key: k)
            try validateKeys(v)
        }
    }

    /// The value as a plain read shows it: priorities dropped.
    public static func exported(_ value: Value) -> Value {
        guard case .object(let o) = value else { return value }
        if let v = o[".value"] { return v }
        var out: [String: Value] = [:]
        for (k, v) in o where k != ".priority" { out[k] = exported(v) }
        return out.isEmpty ? .null : .object(out)
    }

    /// A shallow read: each child replaced by `true`; a leaf as itself.
    public static func shallow(_ value: Value) -> Value {
        let v = exported(value)
        guard case .object(let o) = v else { return v }
        return .object(o.mapValues { _ in .bool(true) })
    }

    /// The priority of a node (null when it has none).
    public static func priority(_ value: Value) -> Value {
        if case .object(let o) = value, let p = o[".priority"] { return p }
        return .null
    }

    /// Resolves server values in `value` (written at `keys`) against `current`, the tree now:
    /// `{".sv": "timestamp"}` becomes `now`, `{".sv": {"increment": n}}` the number at that
    /// location plus n (n when it holds no number) — by Ferry's own resolver (``ServerValues``),
    /// so the server stores what its clients showed locally.
    ///
    /// - Throws: ``WireError`` (`invalidData`) for an unknown server value or data the data
    ///   model refuses.
    public static func resolvingServerValues(_ value: Value, at keys: [String], in current: Value, now: Int64) throws -> Value {
        do {
            return try ServerValues.resolve(value, at: keys.joined(separator: "/"), existing: child(current, keys[...]), time: now)
        } catch let e as DatabaseError {
            throw WireError(.invalidData, "\(e.message) at /\(keys.joined(separator: "/"))")
        }
    }
}
