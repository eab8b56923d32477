@_spi(Server) import Ferry
import FerryTestSupport
import Testing

/// The README's first command (`scripts/sync-story.sh`) runs `ferry-sync-demo`'s two steps
/// against a `ferry-server`; this runs the same steps against a real `ferry-server` and checks
/// what the story says happened, so that the README cannot silently stop being true.
@Suite struct SyncStoryTests {
    @Test func theStorysOfflineWritesReachTheServerExactlyOnceAfterTheAppRestartsAndGoesOnline() async throws {
        let dir = try TemporaryDirectory("sync-story")
        let server = try ServerProcess(data: dir.sub("server"))
        let url = "http://127.0.0.1:\(server.port)?ns=story"
        let store = dir.sub("client")
        let demo = Locations.executable("ferry-sync-demo")

        // Step 1: written offline, nothing sent.
        let offline = try run(demo, ["offline", store, url])
        #expect(offline.status == 0, "\(offline.stdout)\(offline.stderr)")
        #expect(try serverValue(server.port, "/", ns: "story") == .null)
        let lastWrite: Int64
        do {
            let db = try Database.open(at: store)
            #expect(db.pendingWriteCount == 6)
            #expect(db.acknowledgedThrough == 0)
            lastWrite = try #require(db.pendingWriteIDs.last)
            try await db.close()
        }

        // Step 2: the restarted app goes online; every write reaches the server once.
        let online = try run(demo, ["online", store, url, "--timeout", "60"])
        #expect(online.status == 0, "\(online.stdout)\(online.stderr)")
        let posts = try #require(try serverValue(server.port, "/posts", ns: "story"))
        guard case .object(let byKey) = posts else { Issue.record("no posts on the server: \(posts)"); return }
        #expect(Set(byKey.values.compactMap { post -> String? in
            if case .object(let o) = post, case .string(let title)? = o["title"] { title } else { nil }
        }) == ["Offline first", "Written on a plane", "Sent exactly once"])
        #expect(try serverValue(server.port, "/stats/posts", ns: "story") == 3)
        #expect(online.stdout.contains("cursor \(lastWrite) = the last write (\(lastWrite)), 0 pending, 0 rejected"))
        #expect(online.stdout.contains("B reads the server: /stats/posts = 3"))
        do {
            let db = try Database.open(at: store)
            #expect(db.acknowledgedThrough == lastWrite)
            #expect(db.pendingWriteCount == 0)
            try await db.close()
        }

        // Restarted again with nothing pending: nothing is sent again, the increments stay counted once.
        let again = try run(demo, ["online", store, url, "--timeout", "60"])
        #expect(again.status == 0, "\(again.stdout)\(again.stderr)")
        #expect(try serverValue(server.port, "/stats/posts", ns: "story") == 3)
        #expect(server.terminate() == 0)
    }

    @Test func theStoryRefusesBadArgumentsAndGivesUpOnAServerThatIsNotThere() throws {
        let demo = Locations.executable("ferry-sync-demo")
        let dir = try TemporaryDirectory("sync-story-bad")
        #expect(try run(demo, ["sideways", dir.sub("client"), "http://127.0.0.1:1?ns=story"]).status == 64)
        #expect(try run(demo, ["offline", dir.sub("client"), "not a url"]).status == 1)
        // Offline writes need no server; going online to a port nobody listens on ends, with 1.
        #expect(try run(demo, ["offline", dir.sub("client"), "http://127.0.0.1:1?ns=story"]).status == 0)
        let stranded = try run(demo, ["online", dir.sub("client"), "http://127.0.0.1:1?ns=story", "--timeout", "3"])
        #expect(stranded.status == 1)
        #expect(stranded.stdout.contains("gave up after 3 s"))
    }
}
