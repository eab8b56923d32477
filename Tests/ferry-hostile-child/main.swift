// A hostile client of `ferry-server`, in a process of its own (`HostileRequestTests` runs it):
// its 100,000 connections churn file descriptor numbers in this process, not in the test runner.
//
//   ferry-hostile-child PORT ADMIN REQUESTS WORKERS TOKEN...
//
// Prints `status S N` per status answered, `closed N`, `refused MARKER` per write (or batch) the
// server refused, and `error …` per 5xx answer; exits 0.
import Ferry
import FerryLog
import FerryTestSupport
import Foundation
#if canImport(Glibc)
import Glibc
#endif

/// What a hostile client throws at `ferry-server`, from a seeded generator: malformed rules,
/// tokens, paths, bodies and headers. Every write carries a marker of its own so that a refused
/// one can be looked for in the data afterwards.
struct HostileRequests {
    var random: SplitMix
    let tokens: [String]
    let admin: String
    /// Makes the markers of this generator unique among several.
    let prefix: String
    private(set) var marker = 0
    /// Whether the last request promised more body than it sent (its client then goes away).
    private(set) var cutShort = false

    /// A request's bytes, and the marker of the write it makes (nil: not a write, or not one
    /// that can land).
    mutating func next() -> (bytes: [UInt8], marker: String?) {
        marker += 1
        cutShort = false
        let mark = "fz\(prefix)-\(marker)"
        switch Int.random(in: 0..<100, using: &random) {
        case 0..<45: return write(mark)
        case 45..<65: return (request(["GET", "HEAD", "OPTIONS"].randomElement(using: &random)!, path() + readQuery(), token()), nil)
        case 65..<75: return (request("PUT", "/.settings/rules.json?ns=t", Bool.random(using: &random) ? admin : token(), body: rules()), nil)
        case 75..<85: return batch(mark)
        default: return (garbage(), nil)
        }
    }

    private mutating func pick<T>(_ items: [T]) -> T { items.randomElement(using: &random)! }

    private mutating func token() -> String? {
        switch Int.random(in: 0..<10, using: &random) {
        case 0: return nil
        case 1: return "owner"
        case 2: return String((0..<Int.random(in: 0..<300, using: &random)).map { _ in Character(UnicodeScalar(UInt8.random(in: 33...126, using: &random))) })
        case 3:
            // A real token with one character changed.
            var t = Array(pick(tokens).utf8)
            t[Int.random(in: 0..<t.count, using: &random)] = pick(Array("abcXYZ012-_.".utf8))
            return String(decoding: t, as: UTF8.self)
        default: return pick(tokens)
        }
    }

    /// Mostly keys the rules name (so that most requests reach them), some that no path may hold.
    private mutating func key() -> String {
        if Int.random(in: 0..<10, using: &random) < 8 {
            return pick(["alice", "bob", "carol", "dave", "name", "age", "shoe", "e1", "e2", "by", "at", "x", "ü"])
        }
        return pick(["", "a.b", "$uid", "#", "[0]", "..", "%2F", "\u{7f}", String(repeating: "k", count: Int.random(in: 700...900, using: &random))])
    }

    private mutating func path() -> String {
        let depth = Int.random(in: 0..<20, using: &random) == 0 ? Int.random(in: 0..<40, using: &random) : Int.random(in: 0...3, using: &random)
        let root = Int.random(in: 0..<10, using: &random) < 8 ? pick(["users", "log", "verified"]) : pick(["x", ".settings", ".ferry", ""])
        let keys = [root] + (0..<depth).map { _ in key() }
        let escaped = keys.map { $0.addingPercentEncoding(withAllowedCharacters: .urlPathAllowed.subtracting(CharacterSet(charactersIn: "?#"))) ?? $0 }
        let suffix = Int.random(in: 0..<10, using: &random) < 9 ? ".json?ns=t" : pick(["", ".xml?ns=t", ".json", ".json?ns=", ".json?ns=t&ns=u", ".json?ns=../etc"])
        return "/" + escaped.joined(separator: "/") + suffix
    }

    private mutating func readQuery() -> String {
        pick(["", "", "&orderBy=%22$key%22&limitToFirst=2", "&orderBy=%22name%22&startAt=1", "&limitToFirst=-1", "&orderBy=garbage", "&shallow=true",
              "&shallow=maybe", "&print=silent", "&auth=\(pick(tokens))", "&format=export", "&equalTo=%5B", "&limitToLast=99999999999999999999"])
    }

    private mutating func value(_ mark: String, depth: Int = 0) -> String {
        switch Int.random(in: 0..<12, using: &random) {
        case 0: return "\(Int.random(in: Int.min...Int.max, using: &random))"
        case 1: return pick(["true", "null", "1e400", "-0", "NaN", "\"\\ud800\""])
        case 2 where depth < 40: return "{\"n\": \(value(mark, depth: depth + 1))}"
        case 3: return "{\".sv\": \(pick(["\"timestamp\"", "{\"increment\": 1}", "\"nonsense\"", "{\"increment\": \"x\"}"]))}"
        case 4: return "{\"by\": \"\(pick(["alice", "bob"]))\", \"at\": \(pick(["1", "{\".sv\": \"timestamp\"}", "99999999999999"])), \"m\": \"\(mark)\"}"
        case 5: return "{\"name\": \"\(mark)\", \"age\": \(Int.random(in: -5...99, using: &random))}"
        case 6: return "{\"\(key())\": \"\(mark)\"}"
        case 7: return "[\"\(mark)\", 1, {\"a\": null}]"
        default: return "\"\(mark)\""
        }
    }

    private mutating func write(_ mark: String) -> ([UInt8], String?) {
        let method = pick(["PUT", "PUT", "PATCH", "POST", "DELETE"])
        var body = value(mark)
        if method == "PATCH" { body = "{\"\(key())/\(key())\": \(body), \"\(key())\": \(value(mark))}" }
        switch Int.random(in: 0..<8, using: &random) {
        case 0: body = String(body.prefix(Int.random(in: 0...max(0, body.count), using: &random)))  // cut short
        case 1: body = "{" + body
        default: break
        }
        return (request(method, path(), token(), body: body), body.contains(mark) ? mark : nil)
    }

    private mutating func batch(_ mark: String) -> ([UInt8], String?) {
        let client = pick(["0123456789abcdef0123456789abcdef", "not-a-store", "fedcba9876543210fedcba9876543210"])
        let writes = (0..<Int.random(in: 0...4, using: &random)).map { i in
            "{\"id\": \(Int.random(in: -2...50, using: &random)), \"op\": \"\(pick(["set", "update", "delete", "x"]))\", \"path\": \"/\(pick(["users", "log", "x"]))/\(key())/\(i)\", \"data\": \(value(mark))}"
        }
        let body = "{\"client\": \"\(client)\", \"acked\": \(Int.random(in: -1...10, using: &random)), \"writes\": [\(writes.joined(separator: ","))]}"
        return (request("POST", "/.ferry/batch.json?ns=t", token(), body: body), body.contains(mark) ? mark : nil)
    }

    private mutating func rules() -> String {
        let expressions = ["auth.uid === $uid", "auth != null &&", "newData.isString() && newData.val().length < 5", "data.child(", "'unterminated",
                           "root.child('x').val() === 1 ||| true", "/[a-/.test()", "now > 0 ? true : false", "$nope", "newData.hasChildren(['a', 'b'])",
                           String(repeating: "(", count: 300) + "true" + String(repeating: ")", count: 300), "auth.token.email.matches(/.*@x$/)"]
        return pick([
            "{\"rules\": {\"users\": {\"$uid\": {\".write\": \"\(pick(expressions))\", \".read\": \(pick(["true", "false", "3", "\"\(pick(expressions))\""]))}}}}",
            "{\"rules\": {\".read\": \"\(pick(expressions))\"}}",
            "{\"rules\": {\"$a\": {}, \"$b\": {}}}",
            "{\"rules\": [1, 2]}",
            "{\"rules\": {\".write\": {\"nested\": true}}}",
            "not json at all",
            "{\"rules\": {\"x\": {\".validate\": \"\(pick(expressions))\", \".indexOn\": \(pick(["\"a\"", "[\"a\", 1]", "7"]))}}}",
        ])
    }

    private mutating func request(_ method: String, _ target: String, _ token: String?, body: String? = nil) -> [UInt8] {
        var head = "\(method) \(target) HTTP/1.1\r\nHost: 127.0.0.1\r\n"
        if let token {
            head += pick(["Authorization: Bearer \(token)\r\n", "Authorization: Bearer \(token)\r\n", "Authorization: Basic \(token)\r\n", "Authorization: \(token)\r\n"])
        }
        switch Int.random(in: 0..<20, using: &random) {
        case 0: head += "X-Big: \(String(repeating: "h", count: Int.random(in: 1_000...100_000, using: &random)))\r\n"
        case 1: head += "X-Ferry-Write: \(pick(["garbage", "0123456789abcdef0123456789abcdef/-1", "0123456789abcdef0123456789abcdef/9"]))\r\nX-Ferry-Acked: \(pick(["x", "-5", "3"]))\r\n"
        case 2: head += "If-Match: \(pick(["\"x\"", "*", ""]))\r\n"
        case 3: head += "Accept: text/event-stream\r\n"  // a stream: read until the server closes or the client gives up
        default: break
        }
        let bytes = Array((body ?? "").utf8)
        if body != nil {
            switch Int.random(in: 0..<25, using: &random) {
            case 0:
                head += "Content-Length: \(bytes.count + 5)\r\n"  // promised more than sent
                cutShort = true
            case 1: head += "Content-Length: -3\r\n"
            case 2: head += "Transfer-Encoding: chunked\r\n"
            default: head += "Content-Length: \(bytes.count)\r\n"
            }
        }
        return Array((head + "\r\n").utf8) + bytes
    }

    private mutating func garbage() -> [UInt8] {
        switch Int.random(in: 0..<4, using: &random) {
        case 0: return (0..<Int.random(in: 1..<2_000, using: &random)).map { _ in UInt8.random(in: 0...255, using: &random) } + Array("\r\n\r\n".utf8)
        case 1: return Array("GET / HTTP/9.9\r\n\r\n".utf8)
        case 2: return Array("\(pick(["BREW", "G\u{0}ET", "PUT"])) /x.json?ns=t HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\nab".utf8)
        default: return Array("GET /\(String(repeating: "a/", count: 5_000)).json?ns=t HTTP/1.1\r\n\r\n".utf8)
        }
    }
}

/// One answer read from a socket: its status, headers and body.
struct Answer {
    var status: Int
    var headers: [String: String]
    var body: [UInt8]
}

/// Reading answers off loopback sockets (``LoopbackHTTP`` connects and sends).
enum Wire {
    /// Reads one answer: its head, and its body up to its Content-Length (an event stream's
    /// head alone); nil when the connection ends before a whole head.
    static func readAnswer(_ fd: Int32, headOnly: Bool) -> Answer? {
        var raw: [UInt8] = []
        var chunk = [UInt8](repeating: 0, count: 65536)
        while true {
            if let h = LoopbackHTTP.head(raw) {
                let r = Answer(status: h.status, headers: h.headers, body: Array(raw[h.bodyStart...]))
                if headOnly || r.headers["content-type"]?.hasPrefix("text/event-stream") == true { return r }
                if let n = r.headers["content-length"].flatMap(Int.init), r.body.count >= n { return r }
            }
            let n = chunk.withUnsafeMutableBytes { recv(fd, $0.baseAddress, $0.count, 0) }
            if n <= 0 { return LoopbackHTTP.head(raw).map { Answer(status: $0.status, headers: $0.headers, body: Array(raw[$0.bodyStart...])) } }
            raw += chunk[0..<n]
        }
    }
}

/// What the requests got.
struct Tally: Sendable {
    var statuses: [Int: Int] = [:]
    var closed = 0
    var refusedMarkers: [String] = []
    var serverErrors: [String] = []
}

final class Tallies: Sendable { let all = FerryMutex(Tally()) }

let args = CommandLine.arguments
guard args.count >= 6, let port = Int(args[1]), let total = Int(args[3]), let workers = Int(args[4]) else {
    FileHandle.standardError.write(Data("usage: ferry-hostile-child PORT ADMIN REQUESTS WORKERS TOKEN...\n".utf8))
    exit(2)
}
let admin = args[2]
let tokens = Array(args[5...])
let tally = Tallies()
DispatchQueue.concurrentPerform(iterations: workers) { w in
    var requests = HostileRequests(random: SplitMix(seed: 0xF00D + UInt64(w)), tokens: tokens, admin: admin, prefix: String(w))
    var local = Tally()
    for _ in 0..<(total / workers) {
        let (bytes, marker) = requests.next()
        // One connection per request: what a request leaves behind (a half-sent body, a
        // stream) never decides the next one's fate.
        guard let fd = LoopbackHTTP.connect(port, receiveTimeout: 5) else {
            local.serverErrors.append("cannot connect")
            break
        }
        LoopbackHTTP.send(fd, bytes)
        if requests.cutShort { shutdown(fd, Int32(SHUT_WR)) }  // (and goes away)
        let r = Wire.readAnswer(fd, headOnly: bytes.starts(with: Array("HEAD ".utf8)))
        close(fd)
        guard let r else {
            local.closed += 1
            continue
        }
        local.statuses[r.status, default: 0] += 1
        if r.status >= 500 { local.serverErrors.append("\(r.status): \(String(decoding: bytes.prefix(120), as: UTF8.self))") }
        if let marker, r.status >= 400 { local.refusedMarkers.append(marker) }
        // A batch is answered 200 with each write's own status: refused when all are.
        if let marker, r.status == 200, case .object(let o)? = try? Value(jsonBytes: r.body), case .array(let results)? = o["results"],
           results.allSatisfy({ if case .object(let w) = $0 { w["status"] != 200 } else { false } }) {
            local.refusedMarkers.append(marker)
        }
    }
    let done = local
    tally.all.withLock { t in
        t.statuses.merge(done.statuses, uniquingKeysWith: +)
        t.closed += done.closed
        t.refusedMarkers += done.refusedMarkers
        t.serverErrors += done.serverErrors
    }
}
let t = tally.all.withLock { $0 }
var out = ""
for (status, n) in t.statuses.sorted(by: { $0.key < $1.key }) { out += "status \(status) \(n)\n" }
out += "closed \(t.closed)\n"
for m in t.refusedMarkers { out += "refused \(m)\n" }
for e in t.serverErrors { out += "error \(e.replacingOccurrences(of: "\n", with: " "))\n" }
FileHandle.standardOutput.write(Data(out.utf8))
