@_spi(Server) import Ferry
@testable import FerryServer
import FerryWire
import Testing

/// The rules language and its cascade, evaluated in process (the server's own code).
@Suite struct RulesLanguageTests {
    let alice: Value = ["uid": "alice", "provider": "password", "token": ["email": "alice@example.com", "email_verified": true, "sub": "alice"]]

    func rules(_ json: String) throws -> Rules {
        try Rules(body: try Value(json: json))
    }

    /// Evaluates `expression` at `keys` (bound `$variables`) with `data` before and `writes` after.
    func evaluate(_ expression: String, auth: Value? = nil, data: Value = .null, writes: [(keys: [String], value: Value)] = [],
                  keys: [String] = [], variables: [String: String] = [:]) throws -> Bool {
        let e = try RuleParser.parse(expression, variables: Set(variables.keys), allowsNewData: true)
        let context = RuleContext(auth: auth, now: 1_000, before: RuleTree(base: data), after: RuleTree(base: data, writes: writes),
                                  keys: keys, variables: variables)
        return e.grants(context)
    }

    @Test func operatorsFollowJavaScriptsPrecedence() throws {
        #expect(try evaluate("1 + 2 * 3 === 7"))
        #expect(try evaluate("(1 + 2) * 3 === 9"))
        #expect(try evaluate("!false && true || false"))
        #expect(try evaluate("10 % 4 == 2 && -3 < 0 && 7 / 2 === 3.5"))
        #expect(try evaluate("'a' + 'b' === 'ab' && 'n' + 1 === 'n1'"))
        #expect(try evaluate("1 < 2 ? 'yes' === 'yes' : false"))
        #expect(try evaluate("'b' > 'a' && 'a' <= 'a' && 2 >= 2"))
        #expect(try evaluate("1 !== '1' && null === null && true != false"))
        #expect(try evaluate("now === 1000"))
    }

    @Test func aRuleThatCannotBeEvaluatedGrantsNothing() throws {
        #expect(try !evaluate("auth.uid === 'alice'"))  // auth is null
        #expect(try !evaluate("1 < 'a'"))
        #expect(try !evaluate("'text'"))  // not a boolean
        #expect(try !evaluate("data.val().length > 0", data: 5))
        #expect(try !evaluate("data.parent().exists()"))  // the root has no parent
        // A failing operand of || is overruled by one that grants, and never becomes a grant.
        #expect(try evaluate("auth.uid === 'x' || true"))
        #expect(try !evaluate("!(auth.uid === 'x' || false)"))
        #expect(try !evaluate("(auth.uid === 'x' || false) == false"))
        #expect(try !evaluate("(auth.uid === 'x' || false) ? false : true"))
    }

    @Test func authAndItsTokenClaimsAreReadable() throws {
        #expect(try evaluate("auth.uid === 'alice' && auth.token.email_verified === true", auth: alice))
        #expect(try evaluate("auth.token.email.matches(/.*@example[.]com$/)", auth: alice))
        #expect(try evaluate("auth.token.email.matches(/^ALICE@/i)", auth: alice))
        #expect(try !evaluate("auth.token.email.matches(/^bob/)", auth: alice))
        #expect(try evaluate("auth['uid'] === 'alice' && auth.token.missing === null", auth: alice))
        #expect(try evaluate("auth.token.email.beginsWith('alice') && auth.token.email.endsWith('.com') && auth.token.email.contains('@')", auth: alice))
        #expect(try evaluate("auth.uid.toUpperCase() === 'ALICE' && 'AbC'.toLowerCase() === 'abc' && 'a-b-c'.replace('-', '') === 'abc'", auth: alice))
        #expect(try evaluate("auth.uid.length === 5", auth: alice))
        // `$` is the end of the string; escapes as in JavaScript.
        #expect(try !evaluate("'abc\\n'.matches(/^[a-z]+$/)"))
        #expect(try evaluate("'abc'.matches(/^[a-z$]+$/) && 'a$'.matches(/^[a-z$]+$/)"))
        #expect(try evaluate("'\\u0041\\t' === 'A\\t'"))
    }

    @Test func snapshotsReadTheDataBeforeAndAfterTheWrite() throws {
        let data: Value = ["users": ["alice": ["name": "Alice", "age": 30]], "admins": ["alice": true]]
        let keys = ["users", "alice"]
        #expect(try evaluate("data.child('name').val() === 'Alice' && data.child('age').isNumber()", data: data, keys: keys))
        #expect(try evaluate("root.child('admins/' + $uid).exists()", data: data, keys: keys, variables: ["$uid": "alice"]))
        #expect(try evaluate("data.parent().parent().child('admins').hasChild('alice')", data: data, keys: keys))
        #expect(try evaluate("data.hasChildren(['name', 'age']) && !data.hasChildren(['name', 'shoe']) && data.hasChildren()", data: data, keys: keys))
        #expect(try evaluate("data.numChildren() === 2 && data.child('name').isString() && !data.child('name').isBoolean()", data: data, keys: keys))
        // newData: the data as the write leaves it, the rest as it was.
        let writes: [(keys: [String], value: Value)] = [(["users", "alice", "age"], 31)]
        #expect(try evaluate("newData.child('age').val() === data.child('age').val() + 1 && newData.child('name').val() === 'Alice'",
                             data: data, writes: writes, keys: keys))
        #expect(try evaluate("newData.parent().parent().child('admins/alice').val() === true", data: data, writes: writes, keys: keys))
        // A set below a location replaces what was there.
        let replaced: [(keys: [String], value: Value)] = [(["users", "alice"], ["name": "Al"])]
        #expect(try evaluate("!newData.child('age').exists() && newData.child('name').val() === 'Al'", data: data, writes: replaced, keys: keys))
        #expect(try evaluate("!newData.exists()", data: data, writes: [(keys, .null)], keys: keys))
    }

    @Test func readAndWriteCascadeDownAndAWildcardMatchesWhatItsSiblingsDoNot() throws {
        let r = try rules("""
        {"rules": {"public": {".read": true, "secret": {".read": false}},
                   "users": {"$uid": {".write": "auth.uid === $uid"}, "alice": {".write": false}},
                   "rooms": {"$room": {"$member": {".write": "auth.uid === $member && $room.beginsWith('r')"}}}}}
        """)
        // A grant above cannot be taken back below.
        #expect(r.mayRead(["public", "secret", "x"], auth: nil, data: .null, now: 0))
        #expect(!r.mayRead(["users"], auth: alice, data: .null, now: 0))
        #expect(r.mayWrite([(["users", "bob", "name"], "x")], auth: ["uid": "bob"], data: .null, now: 0))
        #expect(!r.mayWrite([(["users", "bob"], "x")], auth: alice, data: .null, now: 0))
        // "alice" is named: the wildcard does not match it.
        #expect(!r.mayWrite([(["users", "alice"], "x")], auth: alice, data: .null, now: 0))
        #expect(r.mayWrite([(["rooms", "r1", "alice"], 1)], auth: alice, data: .null, now: 0))
        #expect(!r.mayWrite([(["rooms", "q1", "alice"], 1)], auth: alice, data: .null, now: 0))
        // Each location of a multi-location write needs its grant.
        #expect(!r.mayWrite([(["users", "bob", "a"], 1), (["users", "carol", "a"], 1)], auth: ["uid": "bob"], data: .null, now: 0))
        // No rules: open.
        #expect(Rules(root: nil).mayWrite([(["x"], 1)], auth: nil, data: .null, now: 0))
    }

    @Test func validateRunsAtEveryLocationLeftNonNullAndDoesNotCascade() throws {
        let r = try rules("""
        {"rules": {".write": true,
                   "items": {"$id": {".validate": "newData.hasChildren(['title'])",
                                     "title": {".validate": "newData.isString()"},
                                     "$other": {".validate": false}}}}}
        """)
        let data: Value = ["items": ["a": ["title": "A"]]]
        #expect(r.mayWrite([(["items", "b"], ["title": "B"])], auth: nil, data: data, now: 0))
        #expect(!r.mayWrite([(["items", "b"], ["title": 2])], auth: nil, data: data, now: 0))       // inside the written data
        #expect(!r.mayWrite([(["items", "b"], ["name": "B"])], auth: nil, data: data, now: 0))      // the written location, and $other
        // Above: "a" left without its title (with nothing left, "a" is gone and passes).
        #expect(!r.mayWrite([(["items", "a", "title"], .null)], auth: nil, data: ["items": ["a": ["title": "A", "n": 1]]], now: 0))
        #expect(r.mayWrite([(["items", "a", "title"], .null)], auth: nil, data: data, now: 0))
        #expect(r.mayWrite([(["items", "a"], .null)], auth: nil, data: data, now: 0))              // deleting passes
        #expect(r.mayWrite([(["elsewhere"], ["anything": 1])], auth: nil, data: data, now: 0))     // no .validate there
        // A multi-location write is judged on the data all of it leaves.
        #expect(r.mayWrite([(["items", "c", "title"], "C"), (["items", "a", "title"], "A2")], auth: nil, data: data, now: 0))
    }

    @Test func theParserNamesWhereARuleFails() throws {
        func failure(_ text: String, variables: Set<String> = [], read: Bool = false) -> String? {
            do {
                _ = try RuleParser.parse(text, variables: variables, allowsNewData: !read)
                return nil
            } catch {
                return error.description
            }
        }
        #expect(failure("auth.uid ===") == "the rule ends where a value is expected at character 13")
        #expect(failure("auth.uid == 'x") == "unterminated string at character 13")
        #expect(failure("data.val() = 1") == "unexpected '=' at character 12")
        #expect(failure("$uid === auth.uid") == "unknown variable $uid: no $ key above this rule names it at character 1")
        #expect(failure("$uid === auth.uid", variables: ["$uid"]) == nil)
        #expect(failure("newData.exists()", read: true) == "newData is not available in a .read rule at character 1")
        #expect(failure("window.alert()") == "unknown variable window at character 1")
        #expect(failure("data.exists(") == "the rule ends where a value is expected at character 13")
        #expect(failure("(true") == "expected ')' but found end of rule at character 6")
        #expect(failure("data.size()") == "unknown method size() at character 6")
        #expect(failure("'a'.matches(/x/g)") == "unknown regular expression flag g at character 16")
    }
}
