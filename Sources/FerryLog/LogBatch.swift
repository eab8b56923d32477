/// Records to append together: all of them are replayed after a crash, or none.
///
/// A batch holds its records already encoded in the log's record layout (a kind byte, a varint
/// length, the payload), in one growable buffer, so appending it costs one copy.
/// Reuse a batch with ``removeAll(keepingCapacity:)`` to avoid allocating per append.
public struct LogBatch: Sendable {
    /// The encoded records.
    private(set) var bytes: [UInt8]
    /// How many records the batch holds.
    public private(set) var count: Int = 0
    /// The size of the largest payload added that the format cannot hold, if any.
    private(set) var oversizedPayload: Int?

    /// An empty batch with room for `capacity` bytes of records.
    public init(capacity: Int = 0) {
        bytes = []
        bytes.reserveCapacity(capacity)
    }

    /// True when the batch holds no record.
    public var isEmpty: Bool { count == 0 }
    /// Bytes of the encoded records (payloads plus 2–6 bytes of framing each).
    public var encodedSize: Int { bytes.count }

    /// Adds one record.
    /// - Parameters:
    ///   - kind: the record's type, a byte the log stores and returns but never interprets.
    ///   - payload: the record's bytes; at most 64 MiB less 6 bytes. A larger payload makes the
    ///     batch's append fail with ``LogError/Code/invalidArgument``.
    public mutating func append(kind: UInt8, payload: UnsafeRawBufferPointer) {
        guard payload.count <= LogFormat.maxRecordPayload else {
            oversizedPayload = max(oversizedPayload ?? 0, payload.count)
            return
        }
        append(kind: kind, exactLength: payload.count) { out in
            if payload.count > 0 { out.baseAddress!.copyMemory(from: payload.baseAddress!, byteCount: payload.count) }
        }
    }

    /// Adds one record whose payload is the contents of `payload`.
    public mutating func append(kind: UInt8, payload: some Collection<UInt8>) {
        if let done = payload.withContiguousStorageIfAvailable({ buffer in
            append(kind: kind, payload: UnsafeRawBufferPointer(buffer))
        }) {
            return done
        }
        let copy = Array(payload)
        copy.withUnsafeBytes { append(kind: kind, payload: $0) }
    }

    /// Adds one record of exactly `length` bytes, written in place by `body` (no intermediate copy).
    public mutating func append(kind: UInt8, exactLength length: Int, _ body: (UnsafeMutableRawBufferPointer) -> Void) {
        guard length <= LogFormat.maxRecordPayload, length >= 0 else {
            oversizedPayload = max(oversizedPayload ?? 0, length)
            return
        }
        let start = bytes.count
        let header = 1 + Varint.length(UInt32(length))
        bytes.append(contentsOf: repeatElement(0, count: header + length))
        bytes.withUnsafeMutableBytes { all in
            let p = all.baseAddress! + start
            p.storeBytes(of: kind, as: UInt8.self)
            _ = Varint.write(UInt32(length), to: p + 1)
            body(UnsafeMutableRawBufferPointer(start: p + header, count: length))
        }
        count += 1
    }

    /// Removes every record.
    public mutating func removeAll(keepingCapacity: Bool = true) {
        bytes.removeAll(keepingCapacity: keepingCapacity)
        count = 0
        oversizedPayload = nil
    }

    /// Why this batch cannot be appended, or nil.
    var problem: String? {
        if let n = oversizedPayload {
            return "a record payload of \(n) bytes exceeds the limit of \(LogFormat.maxRecordPayload) bytes"
        }
        if count == 0 { return "an empty batch cannot be appended" }
        if bytes.count > LogFormat.maxFrameBody {
            return "a batch of \(bytes.count) encoded bytes exceeds the limit of \(LogFormat.maxFrameBody) bytes"
        }
        return nil
    }
}
