import Testing

@testable import Ferry

/// What the server said about locations, on its own: a completed listen makes its location
/// and every query below it live until it ends; a filtered query's listen makes only itself
/// live.
@Suite struct ServerStatusTests {
    func path(_ s: String) throws -> Path { try Path(validating: s) }

    @Test func aCompletedListenMakesQueriesAtAndBelowItLiveUntilItEnds() throws {
        let status = ServerStatus()
        let below = QuerySpec.defaultQuery(at: try path("/posts/a"))
        #expect(!status.isLive(below))
        status.listenCompleted(at: try path("/posts"))
        #expect(status.isLive(below))
        #expect(!status.isLive(.defaultQuery(at: try path("/users"))), "a sibling is still from the cache")
        #expect(status.hasLiveListen(touching: try path("/")), "a listen below the root touches it")
        status.listenEnded(at: try path("/posts"))
        #expect(!status.isLive(below))
        #expect(!status.hasLiveListen(touching: try path("/posts/a")))
    }

    @Test func aFilteredQuerysListenMakesOnlyThatQueryLive() throws {
        let status = ServerStatus()
        var params = QueryParams.default
        params.limit = 3
        let limited = QuerySpec(path: try path("/posts"), params: params)
        status.listenCompleted(at: limited.path, query: limited)
        #expect(status.isLive(limited))
        #expect(!status.isLive(.defaultQuery(at: limited.path)), "the whole location is not kept up to date by a limited listen")
        #expect(status.hasLiveListen(touching: try path("/posts/b")))
        status.listenEnded(at: limited.path, query: limited)
        #expect(!status.isLive(limited))
    }

    @Test func theClockOffsetIsTheLastMeasured() {
        let status = ServerStatus()
        #expect(status.timeOffset == 0)
        status.setTimeOffset(3_600_000)
        status.setTimeOffset(-5)
        #expect(status.timeOffset == -5)
    }
}
