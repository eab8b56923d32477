@_spi(Server) import Ferry
import FerryLog
import FerryTestSupport
import Foundation
import Testing

@Suite struct HostileRequestTests {
    @Test func hostileRequestsGetA4xxOrACloseNeverCrashTheServerAndNeverLetARefusedWriteThrough() async throws {
        let dir = try TemporaryDirectory("hostile")
        let mint = try await TokenMint()
        try "the-admin-credential".write(toFile: dir.path + "/admin", atomically: true, encoding: .utf8)
        let server = try ServerProcess(data: dir.sub("server"), try mint.serverArguments(dir.path, rules: usersRules)
                                       + ["--no-emulator", "--admin-token-file", dir.path + "/admin", "--request-timeout", "1", "--log-level", "warning"])
        var tokens: [String] = []
        for (signer, uid) in [(TokenMint.Signer.rs256, "alice"), (.es256, "bob"), (.hs256, "carol")] { tokens.append(try await mint.token(signer, sub: uid)) }
        tokens.append(try await mint.token(.hs256, TestClaims(sub: "dave", exp: Int(Date().timeIntervalSince1970) - 3600)))

        // The hostile client runs in a process of its own (see ferry-hostile-child), waited for
        // on a thread of its own.
        let total = Int(ProcessInfo.processInfo.environment["FERRY_HOSTILE_REQUESTS"] ?? "") ?? 100_000
        let workers = 8
        let client = try ChildProcess(Locations.executable("ferry-hostile-child"),
                                      [String(server.port), "the-admin-credential", String(total), String(workers)] + tokens)
        let status = await withCheckedContinuation { (done: CheckedContinuation<Int32, Never>) in
            DispatchQueue.global().async { done.resume(returning: client.wait()) }
        }
        #expect(status == 0)
        var statuses: [Int: Int] = [:]
        var closed = 0
        var refused = Set<String>()
        var errors: [String] = []
        for line in client.outputLines {
            let parts = line.split(separator: " ", maxSplits: 2).map(String.init)
            switch parts.first {
            case "status": statuses[Int(parts[1])!] = Int(parts[2])!
            case "closed": closed = Int(parts[1])!
            case "refused": refused.insert(parts[1])
            case "error": errors.append(line)
            default: Issue.record("unexpected line: \(line)")
            }
        }
        let answered = statuses.values.reduce(0, +)
        let summary = statuses.keys.sorted().map { "\($0): \(statuses[$0]!)" }.joined(separator: ", ")
        print("hostile requests: \(answered + closed) sent, \(closed) closed without an answer; \(summary)")
        #expect(answered + closed == total / workers * workers)
        #expect(errors.isEmpty, "\(errors.prefix(5))")
        #expect(answered > total / 2, "most requests get an answer")

        // The server is up, and no refused write left its marker.
        let info = try TestHTTP.request(server.port, "GET", "/.ferry/info.json?ns=t")
        #expect(info.status == 200)
        let all = try TestHTTP.request(server.port, "GET", "/.json?ns=t", headers: ["Authorization": "Bearer the-admin-credential"])
        #expect(all.status == 200)
        var leaked: [String] = []
        func walk(_ v: Value) {
            switch v {
            case .string(let s) where refused.contains(s): leaked.append(s)
            case .object(let o): o.values.forEach(walk)
            case .array(let a): a.forEach(walk)
            default: break
            }
        }
        walk(all.json ?? .null)
        #expect(leaked.isEmpty, "refused writes found in the data: \(leaked.prefix(10))")
        #expect(server.terminate() == 0)
    }
}
