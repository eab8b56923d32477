import Ferry

/// Security rules as `ferry-server` understands them: `.read` and `.write` at any path, each
/// `true`, `false` or `"auth != null"` (also as the strings `"true"`/`"false"`); a `$name` key
/// matches any child. A grant at a path covers everything below it (as in Firebase, a grant above
/// cannot be revoked below). Without rules, everything is allowed.
struct Rules: Sendable {
    /// The `rules` object; nil: no rules set (open).
    var tree: Value?

    /// Reads rules from a `PUT /.settings/rules.json` body.
    ///
    /// - Throws: a message for the client when a rule is not one of the supported forms.
    init(body: Value) throws(RulesError) {
        guard case .object(let o) = body, let rules = o["rules"], o.count == 1 else {
            throw RulesError(message: "the rules must be an object {\"rules\": {...}}")
        }
        try Rules.check(rules, path: "")
        tree = rules
    }

    init(tree: Value?) { self.tree = tree }

    struct RulesError: Error { var message: String }

    private static func check(_ v: Value, path: String) throws(RulesError) {
        guard case .object(let o) = v else { throw RulesError(message: "the rules at \(path.isEmpty ? "/" : path) must be an object") }
        for (k, child) in o {
            switch k {
            case ".read", ".write":
                if condition(child) == nil {
                    throw RulesError(message: "\(k) at \(path.isEmpty ? "/" : path) must be true, false or \"auth != null\"")
                }
            case ".indexOn", ".validate": continue  // accepted and not enforced
            default:
                if k.hasPrefix(".") { throw RulesError(message: "unknown rule \(k) at \(path.isEmpty ? "/" : path)") }
                try check(child, path: path + "/" + k)
            }
        }
    }

    /// A rule's condition: nil when unsupported; else whether it needs a token.
    enum Condition { case always, never, authenticated }

    static func condition(_ v: Value) -> Condition? {
        switch v {
        case .bool(let b): return b ? .always : .never
        case .string(let s):
            switch s.replacingOccurrences(of: " ", with: "") {
            case "true": return .always
            case "false": return .never
            case "auth!=null": return .authenticated
            default: return nil
            }
        default: return nil
        }
    }

    /// Whether a request with (`authenticated`) or without a token may `.read` or `.write` at `keys`.
    /// O(depth).
    func allows(_ kind: String, at keys: [String], authenticated: Bool) -> Bool {
        guard var node = tree else { return true }
        for depth in 0...keys.count {
            if case .object(let o) = node, let rule = o[kind], let c = Rules.condition(rule) {
                switch c {
                case .always: return true
                case .authenticated where authenticated: return true
                default: break
                }
            }
            guard depth < keys.count, case .object(let o) = node else { return false }
            if let next = o[keys[depth]] {
                node = next
            } else if let wildcard = o.first(where: { $0.key.hasPrefix("$") }) {
                node = wildcard.value
            } else {
                return false
            }
        }
        return false
    }
}
