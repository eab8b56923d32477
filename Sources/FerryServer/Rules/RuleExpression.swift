import Foundation

/// One `.read`, `.write` or `.validate` expression of the Realtime Database's rules language, parsed:
/// literals (numbers, `'strings'`/`"strings"`, `true`, `false`, `null`, `[lists]`, `/regexes/i`),
/// the variables `auth`, `root`, `data`, `newData`, `now` and the `$variables` of the path,
/// member access (`auth.token.email`, `auth['uid']`), calls (`data.child('a').val()`), the
/// operators `!` `-` `*` `/` `%` `+` `-` `<` `<=` `>` `>=` `==` `===` `!=` `!==` `&&` `||` and
/// `a ? b : c`, with JavaScript's precedence.
indirect enum RuleExpression: Sendable {
    case literal(RuleLiteral)
    case list([RuleExpression])
    case variable(String)
    case member(RuleExpression, String)
    case index(RuleExpression, RuleExpression)
    case call(RuleExpression, String, [RuleExpression])
    case not(RuleExpression)
    case negate(RuleExpression)
    case binary(RuleOperator, RuleExpression, RuleExpression)
    case and(RuleExpression, RuleExpression)
    case or(RuleExpression, RuleExpression)
    case conditional(RuleExpression, RuleExpression, RuleExpression)
}

extension RuleExpression {
    /// Whether the expression uses one of these variables.
    func mentions(_ names: Set<String>) -> Bool {
        switch self {
        case .literal: false
        case .variable(let n): names.contains(n)
        case .list(let items): items.contains { $0.mentions(names) }
        case .member(let e, _), .not(let e), .negate(let e): e.mentions(names)
        case .index(let a, let b), .binary(_, let a, let b), .and(let a, let b), .or(let a, let b): a.mentions(names) || b.mentions(names)
        case .call(let e, _, let args): e.mentions(names) || args.contains { $0.mentions(names) }
        case .conditional(let a, let b, let c): a.mentions(names) || b.mentions(names) || c.mentions(names)
        }
    }
}

enum RuleLiteral: Sendable {
    case null
    case bool(Bool)
    case number(Double)
    case string(String)
    case regex(RuleRegex)
}

/// A `/pattern/flags` literal, compiled once.
struct RuleRegex: @unchecked Sendable {  // NSRegularExpression is immutable and thread-safe
    let source: String
    let expression: NSRegularExpression
}

enum RuleOperator: String, Sendable {
    case multiply = "*", divide = "/", remainder = "%", add = "+", subtract = "-"
    case less = "<", lessOrEqual = "<=", greater = ">", greaterOrEqual = ">="
    case equal = "==", notEqual = "!="
}

/// Why a rule does not parse, and where (a character offset in its text, from 0).
struct RuleSyntaxError: Error, Sendable, CustomStringConvertible {
    var message: String
    var offset: Int
    var description: String { "\(message) at character \(offset + 1)" }
}

/// The methods each kind of value has; a call of any other name is refused at upload.
enum RuleMethods {
    static let snapshot: Set<String> = ["val", "exists", "child", "parent", "hasChild", "hasChildren", "isString", "isNumber",
                                        "isBoolean", "getPriority", "numChildren"]
    static let string: Set<String> = ["matches", "beginsWith", "endsWith", "contains", "replace", "toLowerCase", "toUpperCase"]
    static let all = snapshot.union(string)
}

/// A recursive-descent parser over the expression's characters (offsets in errors count
/// characters from 1, as an editor shows them).
struct RuleParser {
    private let text: [Character]
    private var at = 0
    /// The names a rule may use: `auth`, `now`, `root`, `data`, `newData` (`.write` and `.validate` only) and the path's `$variables`.
    private let names: Set<String>

    /// Parses `source`, which may name `variables` (the `$names` of its path).
    static func parse(_ source: String, variables: Set<String>, allowsNewData: Bool) throws(RuleSyntaxError) -> RuleExpression {
        var names: Set<String> = ["auth", "now", "root", "data"]
        if allowsNewData { names.insert("newData") }
        var p = RuleParser(text: Array(source), names: names.union(variables))
        let e = try p.expression()
        p.skipSpace()
        guard p.at == p.text.count else { throw p.error("unexpected \(p.describeNext())") }
        return e
    }

    private init(text: [Character], names: Set<String>) {
        self.text = text
        self.names = names
    }

    private func error(_ message: String, at offset: Int? = nil) -> RuleSyntaxError {
        RuleSyntaxError(message: message, offset: offset ?? min(at, text.count))
    }

    private func describeNext() -> String {
        at < text.count ? "'\(text[at])'" : "end of rule"
    }

    private mutating func skipSpace() {
        while at < text.count, text[at].isWhitespace { at += 1 }
    }

    /// Consumes `token` if it comes next (an operator must not be the start of a longer one in `longer`).
    private mutating func take(_ token: String, unless longer: [String] = []) -> Bool {
        skipSpace()
        for l in longer where matches(l) { return false }
        guard matches(token) else { return false }
        at += token.count
        return true
    }

    private func matches(_ token: String) -> Bool {
        var i = at
        for c in token {
            guard i < text.count, text[i] == c else { return false }
            i += 1
        }
        return true
    }

    private mutating func expect(_ token: String) throws(RuleSyntaxError) {
        guard take(token) else { throw error("expected '\(token)' but found \(describeNext())") }
    }

    // MARK: Precedence levels

    private mutating func expression() throws(RuleSyntaxError) -> RuleExpression {
        let condition = try or()
        guard take("?") else { return condition }
        let yes = try expression()
        try expect(":")
        let no = try expression()
        return .conditional(condition, yes, no)
    }

    private mutating func or() throws(RuleSyntaxError) -> RuleExpression {
        var e = try and()
        while take("||") { e = .or(e, try and()) }
        return e
    }

    private mutating func and() throws(RuleSyntaxError) -> RuleExpression {
        var e = try equality()
        while take("&&") { e = .and(e, try equality()) }
        return e
    }

    private mutating func equality() throws(RuleSyntaxError) -> RuleExpression {
        var e = try relational()
        while true {
            if take("===") || take("==") {
                e = .binary(.equal, e, try relational())
            } else if take("!==") || take("!=") {
                e = .binary(.notEqual, e, try relational())
            } else {
                return e
            }
        }
    }

    private mutating func relational() throws(RuleSyntaxError) -> RuleExpression {
        var e = try additive()
        while true {
            if take("<=") { e = .binary(.lessOrEqual, e, try additive()) }
            else if take(">=") { e = .binary(.greaterOrEqual, e, try additive()) }
            else if take("<") { e = .binary(.less, e, try additive()) }
            else if take(">") { e = .binary(.greater, e, try additive()) }
            else { return e }
        }
    }

    private mutating func additive() throws(RuleSyntaxError) -> RuleExpression {
        var e = try multiplicative()
        while true {
            if take("+") { e = .binary(.add, e, try multiplicative()) }
            else if take("-") { e = .binary(.subtract, e, try multiplicative()) }
            else { return e }
        }
    }

    private mutating func multiplicative() throws(RuleSyntaxError) -> RuleExpression {
        var e = try unary()
        while true {
            if take("*") { e = .binary(.multiply, e, try unary()) }
            else if take("/") { e = .binary(.divide, e, try unary()) }
            else if take("%") { e = .binary(.remainder, e, try unary()) }
            else { return e }
        }
    }

    private mutating func unary() throws(RuleSyntaxError) -> RuleExpression {
        if take("!", unless: ["!=", "!=="]) { return .not(try unary()) }
        if take("-") { return .negate(try unary()) }
        return try postfix()
    }

    private mutating func postfix() throws(RuleSyntaxError) -> RuleExpression {
        var e = try primary()
        while true {
            if take(".") {
                skipSpace()
                let start = at
                let name = identifier()
                guard !name.isEmpty else { throw error("expected a name after '.'") }
                if take("(") {
                    guard RuleMethods.all.contains(name) else { throw error("unknown method \(name)()", at: start) }
                    e = .call(e, name, try arguments(closing: ")"))
                } else {
                    e = .member(e, name)
                }
            } else if take("[") {
                let i = try expression()
                try expect("]")
                e = .index(e, i)
            } else {
                return e
            }
        }
    }

    private mutating func arguments(closing: String) throws(RuleSyntaxError) -> [RuleExpression] {
        var list: [RuleExpression] = []
        if take(closing) { return list }
        repeat { list.append(try expression()) } while take(",")
        try expect(closing)
        return list
    }

    private mutating func identifier() -> String {
        var name = ""
        while at < text.count, text[at].isLetter || text[at].isNumber || text[at] == "_" || text[at] == "$" {
            name.append(text[at])
            at += 1
        }
        return name
    }

    private mutating func primary() throws(RuleSyntaxError) -> RuleExpression {
        skipSpace()
        let start = at
        guard at < text.count else { throw error("the rule ends where a value is expected") }
        let c = text[at]
        if take("(") {
            let e = try expression()
            try expect(")")
            return e
        }
        if take("[") { return .list(try arguments(closing: "]")) }
        if c == "'" || c == "\"" { return .literal(.string(try string(quote: c))) }
        if c == "/" { return .literal(.regex(try regex())) }
        if c.isNumber || (c == "." && at + 1 < text.count && text[at + 1].isNumber) { return .literal(.number(try number())) }
        let name = identifier()
        switch name {
        case "": throw error("unexpected \(describeNext())")
        case "true": return .literal(.bool(true))
        case "false": return .literal(.bool(false))
        case "null": return .literal(.null)
        default:
            guard names.contains(name) else {
                if name == "newData" { throw error("newData is not available in a .read rule", at: start) }
                if name.hasPrefix("$") { throw error("unknown variable \(name): no $ key above this rule names it", at: start) }
                throw error("unknown variable \(name)", at: start)
            }
            return .variable(name)
        }
    }

    private mutating func string(quote: Character) throws(RuleSyntaxError) -> String {
        let start = at
        at += 1
        var s = ""
        while at < text.count {
            let c = text[at]
            at += 1
            if c == quote { return s }
            if c == "\\" {
                guard at < text.count else { break }
                let e = text[at]
                at += 1
                switch e {
                case "n": s.append("\n")
                case "t": s.append("\t")
                case "r": s.append("\r")
                case "b": s.append("\u{8}")
                case "f": s.append("\u{c}")
                case "v": s.append("\u{b}")
                case "u":
                    guard at + 4 <= text.count, let code = UInt32(String(text[at..<at + 4]), radix: 16), let scalar = Unicode.Scalar(code) else {
                        throw error("invalid \\u escape", at: at - 2)
                    }
                    s.unicodeScalars.append(scalar)
                    at += 4
                default: s.append(e)
                }
            } else {
                s.append(c)
            }
        }
        throw error("unterminated string", at: start)
    }

    private mutating func number() throws(RuleSyntaxError) -> Double {
        let start = at
        while at < text.count, text[at].isNumber || text[at] == "." { at += 1 }
        if at < text.count, text[at] == "e" || text[at] == "E" {
            at += 1
            if at < text.count, text[at] == "+" || text[at] == "-" { at += 1 }
            while at < text.count, text[at].isNumber { at += 1 }
        }
        guard let d = Double(String(text[start..<at])), d.isFinite else { throw error("invalid number", at: start) }
        return d
    }

    private mutating func regex() throws(RuleSyntaxError) -> RuleRegex {
        let start = at
        at += 1
        var pattern = ""
        var inClass = false
        while true {
            guard at < text.count else { throw error("unterminated regular expression", at: start) }
            let c = text[at]
            at += 1
            if c == "\\", at < text.count {
                pattern.append(c)
                pattern.append(text[at])
                at += 1
                continue
            }
            if c == "[" { inClass = true } else if c == "]" { inClass = false }
            if c == "/" && !inClass { break }
            // `$` is the end of the string, as in JavaScript (ICU's would also match before a final newline).
            pattern += c == "$" && !inClass ? "\\z" : String(c)
        }
        var options: NSRegularExpression.Options = []
        while at < text.count, text[at].isLetter {
            guard text[at] == "i" else { throw error("unknown regular expression flag \(text[at])") }
            options.insert(.caseInsensitive)
            at += 1
        }
        do {
            return RuleRegex(source: pattern, expression: try NSRegularExpression(pattern: pattern, options: options))
        } catch {
            throw self.error("invalid regular expression /\(pattern)/", at: start)
        }
    }
}
