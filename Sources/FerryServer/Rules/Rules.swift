@_spi(Server) import Ferry
import FerryWire

/// A namespace's security rules, as the Realtime Database defines them: a tree mirroring the
/// data whose `.read`, `.write` and `.validate` keys hold expressions (``RuleExpression``, or
/// `true`/`false`), a `$name` key matching any child its named siblings do not (and binding
/// `$name` for the rules below), `.indexOn` accepted. Without rules, everything is allowed.
///
/// - `.read` and `.write` cascade: a grant at a location covers everything below it, and one
///   below cannot take it back.
/// - `.validate` does not cascade: every location a write leaves non-null — the written one,
///   those above it and those inside the written data — must pass its own `.validate`.
/// - A rule that fails to evaluate (a member of null, a type error) grants nothing.
struct Rules: Sendable {
    /// One location of the rules tree.
    final class Node: Sendable {
        let read: RuleExpression?
        let write: RuleExpression?
        let validate: RuleExpression?
        let children: [String: Node]
        /// The `$name` child, matching keys no named child has.
        let wildcard: (name: String, node: Node)?
        /// Whether this node or one below has a `.validate`.
        let validates: Bool

        init(read: RuleExpression?, write: RuleExpression?, validate: RuleExpression?, children: [String: Node], wildcard: (name: String, node: Node)?) {
            self.read = read
            self.write = write
            self.validate = validate
            self.children = children
            self.wildcard = wildcard
            validates = validate != nil || children.values.contains { $0.validates } || wildcard?.node.validates == true
        }

        /// The child for `key`, with the variable it binds.
        func child(_ key: String) -> (Node, String?)? {
            if let c = children[key] { return (c, nil) }
            if let w = wildcard { return (w.node, w.name) }
            return nil
        }
    }

    /// The rules tree; nil: no rules set (open).
    let root: Node?
    /// Whether a `.read` rule looks at `root`, `data` or `now`: then a write can revoke a
    /// stream's read, not only new rules.
    let readsDependOnData: Bool
    /// The `rules` object as it was given (what `GET /.settings/rules.json` shows).
    let source: Value?

    /// The rules of a `PUT /.settings/rules.json` body (`{"rules": {...}}`), each expression parsed.
    ///
    /// - Throws: ``RulesError`` naming the rule's location and, for an expression that does
    ///   not parse, the character where it fails. Nothing is half-applied: the caller keeps the
    ///   rules it had.
    init(body: Value) throws(RulesError) {
        guard case .object(let o) = body, let rules = o["rules"], o.count == 1 else {
            throw RulesError(message: "the rules must be an object {\"rules\": {...}}")
        }
        self.init(root: try Rules.node(rules, path: [], variables: []), source: rules)
    }

    init(root: Node?, source: Value? = nil) {
        self.root = root
        self.source = source
        readsDependOnData = root.map(Rules.readsData) ?? false
    }

    private static func readsData(_ node: Node) -> Bool {
        if node.read?.mentions(["root", "data", "now"]) == true { return true }
        return node.children.values.contains(where: readsData) || node.wildcard.map { readsData($0.node) } == true
    }

    struct RulesError: Error, Sendable { var message: String }

    private static func node(_ v: Value, path: [String], variables: Set<String>) throws(RulesError) -> Node {
        let shown = "/" + path.joined(separator: "/")
        guard case .object(let o) = v else { throw RulesError(message: "the rules at \(shown) must be an object") }
        var read: RuleExpression?, write: RuleExpression?, validate: RuleExpression?
        var children: [String: Node] = [:]
        var wildcard: (name: String, node: Node)?
        for k in o.keys.sorted() {
            let child = o[k]!
            switch k {
            case ".read": read = try expression(child, k, shown, variables, allowsNewData: false)
            case ".write": write = try expression(child, k, shown, variables, allowsNewData: true)
            case ".validate": validate = try expression(child, k, shown, variables, allowsNewData: true)
            case ".indexOn":
                switch child {
                case .string: continue
                case .array(let a) where a.allSatisfy({ if case .string = $0 { true } else { false } }): continue
                default: throw RulesError(message: ".indexOn at \(shown) must be a string or a list of strings")
                }
            default:
                if k.hasPrefix(".") { throw RulesError(message: "unknown rule \(k) at \(shown)") }
                if k.hasPrefix("$") {
                    if let w = wildcard { throw RulesError(message: "\(shown) has two $ children, \(w.name) and \(k)") }
                    if variables.contains(k) { throw RulesError(message: "\(k) at \(shown) is already a variable above") }
                    wildcard = (k, try node(child, path: path + [k], variables: variables.union([k])))
                } else {
                    children[k] = try node(child, path: path + [k], variables: variables)
                }
            }
        }
        return Node(read: read, write: write, validate: validate, children: children, wildcard: wildcard)
    }

    private static func expression(_ v: Value, _ kind: String, _ shown: String, _ variables: Set<String>, allowsNewData: Bool) throws(RulesError) -> RuleExpression {
        switch v {
        case .bool(let b): return .literal(.bool(b))
        case .string(let text):
            do {
                return try RuleParser.parse(text, variables: variables, allowsNewData: allowsNewData)
            } catch {
                throw RulesError(message: "\(kind) at \(shown): \(error): \(text)")
            }
        default:
            throw RulesError(message: "\(kind) at \(shown) must be a boolean or an expression in a string")
        }
    }

    // MARK: Decisions

    /// Whether `auth` may read at `keys`: a `.read` at or above it grants. O(depth) rules.
    func mayRead(_ keys: [String], auth: Value?, data: Value, now: Int64) -> Bool {
        guard let root else { return true }
        var context = RuleContext(auth: auth, now: now, before: RuleTree(base: data))
        return cascade(root, keys, \.read, &context)
    }

    /// Whether `auth` may make `writes` (locations and their new values, server values
    /// resolved) to `data`: at each written location a `.write` at or above it grants, and
    /// every location the writes leave non-null passes its `.validate`.
    func mayWrite(_ writes: [(keys: [String], value: Value)], auth: Value?, data: Value, now: Int64) -> Bool {
        guard let root else { return true }
        var context = RuleContext(auth: auth, now: now, before: RuleTree(base: data), after: RuleTree(base: data, writes: writes))
        for w in writes where !cascade(root, w.keys, \.write, &context) { return false }
        guard root.validates else { return true }
        var checked = Set<[String]>()
        for w in writes {
            // The written location and those above it…
            var node: Node? = root
            context.variables = [:]
            for depth in 0...w.keys.count {
                guard let n = node else { break }
                let keys = Array(w.keys.prefix(depth))
                if let v = n.validate, checked.insert(keys).inserted {
                    context.keys = keys
                    if context.after!.value(at: keys) != .null, !v.grants(context) { return false }
                }
                if depth == w.keys.count {
                    // …and those inside the written data.
                    if n.validates, !validateBelow(n, keys, context.after!.value(at: keys), &context, &checked) { return false }
                    break
                }
                guard let (next, variable) = n.child(w.keys[depth]) else { node = nil; break }
                if let variable { context.variables[variable] = w.keys[depth] }
                node = next
            }
        }
        return true
    }

    /// Walks `value` (the new data at `keys`) with the rules below `node`.
    private func validateBelow(_ node: Node, _ keys: [String], _ value: Value, _ context: inout RuleContext, _ checked: inout Set<[String]>) -> Bool {
        guard case .object(let o) = value, o[".value"] == nil else { return true }
        let saved = context.variables
        defer { context.variables = saved }
        for (key, child) in o where key != ".priority" {
            guard let (next, variable) = node.child(key), next.validates else { continue }
            context.variables = saved
            if let variable { context.variables[variable] = key }
            let childKeys = keys + [key]
            if let v = next.validate, checked.insert(childKeys).inserted {
                context.keys = childKeys
                if !v.grants(context) { return false }
            }
            if !validateBelow(next, childKeys, child, &context, &checked) { return false }
        }
        return true
    }

    /// Whether a rule of `kind` at or above `keys` grants.
    private func cascade(_ root: Node, _ keys: [String], _ kind: KeyPath<Node, RuleExpression?>, _ context: inout RuleContext) -> Bool {
        var node = root
        context.variables = [:]
        for depth in 0...keys.count {
            if let rule = node[keyPath: kind] {
                context.keys = Array(keys.prefix(depth))
                if rule.grants(context) { return true }
            }
            guard depth < keys.count, let (next, variable) = node.child(keys[depth]) else { return false }
            if let variable { context.variables[variable] = keys[depth] }
            node = next
        }
        return false
    }
}
