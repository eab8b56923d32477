import Ferry

/// The data model's tree of values as the model tests keep it: plain JSON objects, no nulls
/// and no empty objects inside. Both the randomized model test and the torture harness build
/// their models on it, so that they mean the same by a write.
public protocol ValueTreeModel {}

extension ValueTreeModel {
    /// The value at `path` below `v` (null when absent).
    public static func get(_ v: Value, _ path: ArraySlice<String>) -> Value {
        guard let k = path.first else { return v }
        guard case .object(let o) = v, let child = o[k] else { return .null }
        return get(child, path.dropFirst())
    }

    /// `v` with the value at `path` replaced by `new`, as the Realtime Database writes it.
    public static func set(_ v: Value, _ path: ArraySlice<String>, _ new: Value) -> Value {
        guard let k = path.first else { return normalized(new) }
        // Removing something below a leaf changes nothing; writing below it replaces it.
        if normalized(new) == .null, !isObject(v) { return v }
        var o: [String: Value] = [:]
        if case .object(let existing) = v { o = existing }
        let child = set(o[k] ?? .null, path.dropFirst(), new)
        o[k] = child == .null ? nil : child
        return o.isEmpty ? .null : .object(o)
    }

    public static func isObject(_ v: Value) -> Bool { if case .object = v { true } else { false } }

    /// `v` without nulls and empty objects inside.
    public static func normalized(_ v: Value) -> Value {
        guard case .object(let o) = v else { return v }
        let kept = o.compactMapValues { c -> Value? in
            let n = normalized(c)
            return n == .null ? nil : n
        }
        return kept.isEmpty ? .null : .object(kept)
    }
}
