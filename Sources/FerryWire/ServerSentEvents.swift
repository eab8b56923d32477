import Ferry

/// One server-sent event of a stream: `put`, `patch`, `keep-alive`, `cancel`, `auth_revoked`.
public struct StreamEvent: Sendable, Equatable {
    /// The event's name.
    public var name: String
    /// Its data, parsed.
    public var data: Value

    /// Creates an event.
    public init(name: String, data: Value) {
        self.name = name
        self.data = data
    }

    /// A `put`: the data at `path` (relative to the stream's location) is now `data`.
    public static func put(_ path: String, _ data: Value) -> StreamEvent {
        StreamEvent(name: "put", data: ["path": .string(path), "data": data])
    }

    /// A `patch`: each listed child of `path` is now its value.
    public static func patch(_ path: String, _ children: [String: Value]) -> StreamEvent {
        StreamEvent(name: "patch", data: ["path": .string(path), "data": .object(children)])
    }

    /// Nothing happened for 30 s.
    public static let keepAlive = StreamEvent(name: "keep-alive", data: .null)
    /// The rules no longer let the stream's token read its location.
    public static let cancel = StreamEvent(name: "cancel", data: "Permission denied")
    /// The stream's token is no longer accepted.
    public static let authRevoked = StreamEvent(name: "auth_revoked", data: "Auth token is expired")

    /// The event as text on the wire: `event: NAME\ndata: JSON\n\n`.
    public var encoded: String { "event: \(name)\ndata: \(data.json)\n\n" }
}

/// Parses a stream of server-sent events fed in arbitrary pieces (lines may be split across
/// pieces). Ignores comments, `id:` and `retry:`.
public struct StreamEventParser: Sendable {
    private var buffer: [UInt8] = []
    private var name = "message"
    private var dataLines: [String] = []

    /// A parser with nothing buffered.
    public init() {}

    /// Feeds bytes; returns the events they complete, in order.
    ///
    /// - Throws: ``WireError`` (`invalidData`) when an event's data is not JSON.
    public mutating func feed(_ bytes: some Sequence<UInt8>) throws -> [StreamEvent] {
        buffer.append(contentsOf: bytes)
        var events: [StreamEvent] = []
        while let nl = buffer.firstIndex(of: 0x0A) {
            var line = Array(buffer[..<nl])
            buffer.removeSubrange(...nl)
            if line.last == 0x0D { line.removeLast() }
            if line.isEmpty {
                if !dataLines.isEmpty {
                    let text = dataLines.joined(separator: "\n")
                    do {
                        events.append(StreamEvent(name: name, data: try Value(json: text)))
                    } catch {
                        throw WireError(.invalidData, "the data of a \(name) event is not JSON: \(text.prefix(80))",
                                        underlying: error as? DatabaseError, location: "event \(name)")
                    }
                }
                name = "message"
                dataLines = []
                continue
            }
            let text = String(decoding: line, as: UTF8.self)
            if text.hasPrefix(":") { continue }
            let field: Substring, value: Substring
            if let colon = text.firstIndex(of: ":") {
                field = text[..<colon]
                var v = text[text.index(after: colon)...]
                if v.hasPrefix(" ") { v = v.dropFirst() }
                value = v
            } else {
                field = Substring(text)
                value = ""
            }
            switch field {
            case "event": name = String(value)
            case "data": dataLines.append(String(value))
            default: break
            }
        }
        return events
    }
}
