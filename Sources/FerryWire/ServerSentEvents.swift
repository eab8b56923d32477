import Ferry

/// One server-sent event of a stream: `put`, `patch`, `keep-alive`, `cancel`, `auth_revoked`;
/// or, with an empty name, an `id:` alone (a *progress* mark: the stream's position moved).
public struct StreamEvent: Sendable, Equatable {
    /// The event's name (empty for a progress mark).
    public var name: String
    /// Its data, parsed.
    public var data: Value
    /// The `id:` given with the event, nil when none. `ferry-server` numbers its commits, and
    /// an event's id is the commit its stream reflects once the event is applied.
    public var id: String?

    /// Creates an event.
    public init(name: String, data: Value, id: String? = nil) {
        self.name = name
        self.data = data
        self.id = id
    }

    /// A `put`: the data at `path` (relative to the stream's location) is now `data`.
    public static func put(_ path: String, _ data: Value, id: String? = nil) -> StreamEvent {
        StreamEvent(name: "put", data: ["path": .string(path), "data": data], id: id)
    }

    /// A `patch`: each listed child of `path` is now its value.
    public static func patch(_ path: String, _ children: [String: Value], id: String? = nil) -> StreamEvent {
        StreamEvent(name: "patch", data: ["path": .string(path), "data": .object(children)], id: id)
    }

    /// An `id:` alone: the stream is current through `id`, though nothing it shows changed.
    public static func progress(_ id: String) -> StreamEvent { StreamEvent(name: "", data: .null, id: id) }

    /// Whether this is a progress mark (an `id:` alone).
    public var isProgress: Bool { name.isEmpty }

    /// Nothing happened for 30 s.
    public static let keepAlive = StreamEvent(name: "keep-alive", data: .null)
    /// The rules no longer let the stream's token read its location.
    public static let cancel = StreamEvent(name: "cancel", data: "Permission denied")
    /// The stream's token is no longer accepted.
    public static let authRevoked = StreamEvent(name: "auth_revoked", data: "Auth token is expired")

    /// The event as text on the wire: `id: N\nevent: NAME\ndata: JSON\n\n` (`id: N\n\n` for a
    /// progress mark; no `id:` line when it has none).
    public var encoded: String {
        let idLine = id.map { "id: \($0)\n" } ?? ""
        if isProgress { return idLine + "\n" }
        return idLine + "event: \(name)\ndata: \(data.json)\n\n"
    }
}

/// Parses a stream of server-sent events fed in arbitrary pieces (lines may be split across
/// pieces). Ignores comments and `retry:`. An event carries the `id:` given in its block; a
/// block with an `id:` and no data (which an `EventSource` does not dispatch, though it moves
/// its last event id) is returned as a progress mark (``StreamEvent/isProgress``).
///
/// Each byte is looked at once: a feed searches only the bytes it brought for line ends, and
/// the lines it completes are dropped from the buffer together, so a long line fed in small
/// pieces, or many lines fed at once, costs time in proportion to their bytes.
public struct StreamEventParser: Sendable {
    /// The most bytes one event's data may take, and one line not yet ended: past this,
    /// ``feed(_:)`` throws rather than hold more of a stream that never ends its event.
    public let maxEventBytes: Int
    /// Bytes not yet taken as lines: a line's start, its end not yet fed.
    private var buffer: [UInt8] = []
    /// Where the next feed looks for a line end in `buffer` (the bytes before it hold none).
    private var scanFrom = 0
    private var name = "message"
    /// The event's data lines so far, joined by line ends; nil before its first.
    private var data: [UInt8]?
    /// A line too long to hold was refused: its bytes up to its end are dropped.
    private var droppingLine = false
    /// The `id:` of the event being read; nil before one.
    private var id: String?

    /// A parser with nothing buffered. The default limit, 512 MiB, is twice the most a
    /// Realtime Database read returns (256 MB).
    public init(maxEventBytes: Int = 512 << 20) {
        self.maxEventBytes = maxEventBytes
    }

    /// Feeds bytes; returns the events they complete, in order.
    ///
    /// - Throws: ``WireError`` (`invalidData`) when an event's data is not JSON, or an event's
    ///   data or a line passes ``maxEventBytes``. The events these bytes completed before it
    ///   are dropped with it, and so is the event or line at fault; the next feed goes on after
    ///   it (though a stream that gave one is best not trusted further: the sync client
    ///   reconnects).
    public mutating func feed(_ bytes: some Sequence<UInt8>) throws -> [StreamEvent] {
        var scanned = scanFrom
        buffer.append(contentsOf: bytes)
        if droppingLine {
            guard let nl = buffer.firstIndex(of: 0x0A) else {
                buffer.removeAll(keepingCapacity: true)
                return []
            }
            buffer.removeSubrange(...nl)
            droppingLine = false
            scanned = 0
        }
        var events: [StreamEvent] = []
        var lineStart = 0
        defer {
            if lineStart > 0 { buffer.removeSubrange(..<lineStart) }
            scanFrom = max(0, scanned - lineStart)
        }
        while let nl = buffer[scanned...].firstIndex(of: 0x0A) {
            var end = nl
            if end > lineStart && buffer[end - 1] == 0x0D { end -= 1 }
            let line = buffer[lineStart..<end]
            lineStart = nl + 1
            scanned = lineStart
            if let event = try take(line) { events.append(event) }
        }
        scanned = buffer.count
        if buffer.count - lineStart > maxEventBytes {
            buffer.removeAll(keepingCapacity: false)
            (lineStart, scanned, droppingLine) = (0, 0, true)
            defer { name = "message"; data = nil; id = nil }  // (its event is dropped with it)
            throw WireError(.invalidData, "a line of the stream is longer than \(maxEventBytes) bytes", location: "event \(name)")
        }
        return events
    }

    /// Takes one line (without its line end); returns the event an empty line completes.
    private mutating func take(_ line: ArraySlice<UInt8>) throws -> StreamEvent? {
        if line.isEmpty {
            defer { name = "message"; data = nil; id = nil }
            guard let data else { return id.map(StreamEvent.progress) }
            do {
                return StreamEvent(name: name, data: try Value(jsonBytes: data), id: id)
            } catch {
                throw WireError(.invalidData, "the data of a \(name) event is not JSON: \(String(decoding: data.prefix(80), as: UTF8.self))",
                                underlying: error as? DatabaseError, location: "event \(name)")
            }
        }
        if line.first == UInt8(ascii: ":") { return nil }
        let field: ArraySlice<UInt8>, value: ArraySlice<UInt8>
        if let colon = line.firstIndex(of: UInt8(ascii: ":")) {
            field = line[..<colon]
            var v = line[(colon + 1)...]
            if v.first == UInt8(ascii: " ") { v = v.dropFirst() }
            value = v
        } else {
            field = line
            value = []
        }
        if field.elementsEqual("event".utf8) {
            name = String(decoding: value, as: UTF8.self)
        } else if field.elementsEqual("id".utf8) {
            if !value.contains(0) { id = String(decoding: value, as: UTF8.self) }
        } else if field.elementsEqual("data".utf8) {
            if data == nil {
                data = Array(value)
            } else {
                data!.append(0x0A)
                data!.append(contentsOf: value)
            }
            if data!.count > maxEventBytes {
                defer { name = "message"; data = nil; id = nil }  // (the event is dropped)
                throw WireError(.invalidData, "the data of a \(name) event is longer than \(maxEventBytes) bytes", location: "event \(name)")
            }
        }
        return nil
    }
}
