import Ferry

/// One write of a batch (`POST /.ferry/batch.json`).
public struct BatchWrite: Sendable, Equatable {
    /// What a write does.
    public enum Op: String, Sendable {
        /// Replace the value at the path (null removes it).
        case set
        /// A multi-path update relative to the path.
        case update
    }
    /// The write's id (the client's LSN).
    public var id: Int64
    /// What it does.
    public var op: Op
    /// Where, e.g. `/posts/p1`.
    public var path: String
    /// The value (`set`) or the children (`update`).
    public var data: Value

    /// Creates a write.
    public init(id: Int64, op: Op, path: String, data: Value) {
        self.id = id
        self.op = op
        self.path = path
        self.data = data
    }
}

/// A batch request: a client store, its acknowledged cursor, writes in increasing id order.
public struct BatchRequest: Sendable, Equatable {
    /// The client store's id.
    public var client: String
    /// The highest write id whose outcome the client has recorded.
    public var acked: Int64
    /// The writes, in increasing id order.
    public var writes: [BatchWrite]

    /// Creates a batch.
    public init(client: String, acked: Int64, writes: [BatchWrite]) {
        self.client = client
        self.acked = acked
        self.writes = writes
    }

    /// Reads a batch from its JSON body.
    ///
    /// - Throws: ``WireError`` (`invalidData`) saying what is wrong with it.
    public init(_ v: Value) throws {
        func bad(_ m: String) -> WireError { WireError(.invalidData, "malformed batch: \(m)") }
        guard case .object(let o) = v else { throw bad("the body must be an object") }
        guard case .string(let client)? = o["client"], WriteIdentity.isStoreID(client) else { throw bad("client must be 32 lowercase hex digits") }
        guard case .int(let acked)? = o["acked"] ?? .int(0), acked >= 0 else { throw bad("acked must be a non-negative integer") }
        let list: [Value]
        switch o["writes"] {
        case .array(let a)?: list = a
        case .object(let d)?: list = d.keys.sorted { (Int($0) ?? 0) < (Int($1) ?? 0) }.map { d[$0]! }  // a dense array stored as an object
        default: throw bad("writes must be an array")
        }
        var writes: [BatchWrite] = []
        for w in list {
            guard case .object(let wo) = w, case .int(let id)? = wo["id"], id >= 0 else { throw bad("each write needs an integer id") }
            guard case .string(let opName)? = wo["op"], let op = BatchWrite.Op(rawValue: opName) else { throw bad("write \(id): op must be \"set\" or \"update\"") }
            guard case .string(let path)? = wo["path"] else { throw bad("write \(id): path must be a string") }
            if let last = writes.last, last.id >= id { throw bad("write ids must increase (\(id) after \(last.id))") }
            writes.append(BatchWrite(id: id, op: op, path: path, data: wo["data"] ?? .null))
        }
        self.init(client: client, acked: acked, writes: writes)
    }
}

/// The answer to one write of a batch.
public struct BatchResult: Sendable, Equatable {
    /// The write's id.
    public var id: Int64
    /// The status the same write sent alone would have got.
    public var status: Int
    /// The error message of a rejection.
    public var error: String?
    /// The server had processed this write before; this is the outcome it recorded.
    public var duplicate: Bool
    /// The commit a success is visible at (`ferry-server` numbers its commits): a stream
    /// shows the write once it has reached this number. For a duplicate, a commit at or
    /// after the write's.
    public var commit: Int64?

    /// Creates a result.
    public init(id: Int64, status: Int, error: String? = nil, duplicate: Bool = false, commit: Int64? = nil) {
        self.id = id
        self.status = status
        self.error = error
        self.duplicate = duplicate
        self.commit = commit
    }

    /// The result as JSON.
    public var value: Value {
        var o: [String: Value] = ["id": .int(id), "status": .int(Int64(status))]
        if let error { o["error"] = .string(error) }
        if duplicate { o["duplicate"] = true }
        if let commit { o["commit"] = .int(commit) }
        return .object(o)
    }

    /// Appends the result's JSON (``value``'s, written directly: a batch's answer holds
    /// thousands).
    public func appendJSON(to out: inout [UInt8]) {
        out += #"{"id":"#.utf8
        out += String(id).utf8
        out += #","status":"#.utf8
        out += String(status).utf8
        if let error {
            out += #","error":"#.utf8
            out += Value.string(error).jsonBytes
        }
        if duplicate { out += #","duplicate":true"#.utf8 }
        if let commit {
            out += #","commit":"#.utf8
            out += String(commit).utf8
        }
        out.append(UInt8(ascii: "}"))
    }

    /// A batch's answer, `{"results":[…]}`, as JSON.
    public static func answer(_ results: [BatchResult]) -> [UInt8] {
        var out = Array(#"{"results":["#.utf8)
        out.reserveCapacity(results.count * 48)
        for (i, r) in results.enumerated() {
            if i > 0 { out.append(UInt8(ascii: ",")) }
            r.appendJSON(to: &out)
        }
        out += "]}".utf8
        return out
    }
}
