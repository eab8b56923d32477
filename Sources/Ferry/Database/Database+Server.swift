/// Server data and acknowledgements enter the database here — as records in the log, like
/// everything else. The sync layer will call these; until then, tests (and tools) do.
@_spi(Server) extension Database {
    /// The server says: this is the whole value at `path`. With a `tag`, it is meant for that
    /// query only (a filtered query's data).
    public func applyServerPut(at path: String, _ value: Value, tag: Int? = nil) async throws {
        let p = try Path(validating: path)
        let node = try Node(value, path: p)
        _ = try await perform { e in (nil, try e.serverPut(p, node, tag: tag)) }
    }

    /// The server says: these children (paths relative to `path`) now have these values.
    public func applyServerMerge(at path: String, _ children: [String: Value], tag: Int? = nil) async throws {
        let p = try Path(validating: path)
        let list = try children.keys.sorted().map { k -> (Path, Node) in
            let rel = try Path(validating: k)
            return (rel, try Node(children[k]!, path: p.child(rel)))
        }
        _ = try await perform { e in (nil, try e.serverMerge(p, list, tag: tag)) }
    }

    /// The server acknowledged (or rejected) a local write.
    public func acknowledgeWrite(_ writeID: Int64, rejected: Bool = false) async throws {
        _ = try await perform { e in (nil, try e.acknowledge(writeID, revert: rejected)) }
        compactIfDue()
    }

    /// The server has sent everything for the listen at `path` (or the tagged query): its
    /// snapshots stop being `fromCache`.
    public func applyListenComplete(at path: String, tag: Int? = nil) async throws {
        let p = try Path(validating: path)
        _ = try await perform { e in (nil, e.listenComplete(p, tag: tag)) }
    }

    /// The tag the database gave a filtered query's listen (nil for a query that loads all data).
    public func tag(for query: DatabaseQuery) -> Int? {
        engine.withLock { $0.syncTree.tag(for: query.spec) }
    }

    /// Milliseconds to add to the local clock to get the server's.
    public func setServerTimeOffset(_ offset: Int64) {
        engine.withLock { $0.serverTimeOffset = offset }
    }

    /// The ids of the local writes the server has not yet acknowledged, oldest first.
    public var pendingWriteIDs: [Int64] {
        engine.withLock { $0.writeTree.pending.ids }
    }
}
