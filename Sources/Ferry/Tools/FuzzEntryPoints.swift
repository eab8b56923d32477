import FerryLog
import Logging

/// Narrow doors into the database's decoders for the libFuzzer targets of the `Fuzz/` package
/// and for the regression tests of what they found. Not API: the SPI keeps them out of the
/// library's public face (`@_spi(Fuzzing) import Ferry` to see them).
///
/// Each entry point runs the real decoder on bytes it is given. Damaged input must come back as
/// a thrown ``DatabaseError``; a trap, an out-of-bounds access or a broken invariant (checked here
/// with `preconditionFailure`, so that libFuzzer sees a crash) is a bug.
@_spi(Fuzzing) public enum FuzzEntryPoints {
    /// Decodes a stored value (``ValueCodec``), as a read or a listener does.
    ///
    /// Checks: the validator (which a walk over a big location uses, decoding each child only
    /// when read) refuses exactly what decoding refuses; what decodes, the skipper (which
    /// replay uses to index records) steps over exactly; encoding the decoded node and
    /// decoding that gives the same node.
    /// - Returns: the number of nodes decoded (leaves and objects).
    /// - Throws: ``DatabaseError`` (``DatabaseError/Code/storage``) for damaged bytes.
    @discardableResult
    public static func decodeValue(_ bytes: UnsafeRawBufferPointer) throws -> Int {
        let node: Node
        do { node = try ValueCodec.decode(bytes) } catch {
            if (try? ValueCodec.validate(bytes)) != nil { preconditionFailure("validate accepts a value that decode refuses: \(error)") }
            throw error
        }
        do {
            guard try ValueCodec.validate(bytes) == node.isEmpty else { preconditionFailure("validate and decode disagree on emptiness") }
        } catch { preconditionFailure("decode accepts a value that validate refuses: \(error)") }
        var r = ByteReader(bytes)
        do { try ValueCodec.skip(&r) } catch { preconditionFailure("decode accepts a value that skip refuses: \(error)") }
        guard r.offset == bytes.count else { preconditionFailure("skip stops at \(r.offset) of a \(bytes.count)-byte value") }
        let again = try ValueCodec.encode(node).withUnsafeBytes { try ValueCodec.decode($0) }
        guard again == node else { preconditionFailure("a value does not survive encoding and decoding") }
        return count(node)
    }

    /// Decodes a database record as replay does: its kind byte, then ``RecordCodec``'s summary
    /// (paths and value positions), then each value it points at, and a local write's values
    /// as they are sent to the server.
    ///
    /// Checks: every value range the summary gives lies inside the payload.
    /// - Parameter input: the record's kind byte, then its payload.
    /// - Returns: the number of values the record holds.
    /// - Throws: ``DatabaseError`` (``DatabaseError/Code/storage``) for damaged bytes or a kind
    ///   this build does not know.
    @discardableResult
    public static func decodeRecord(_ input: UnsafeRawBufferPointer) throws -> Int {
        guard let kind = input.first else { throw ByteReader.damaged("an empty record") }
        let payload = UnsafeRawBufferPointer(rebasing: input[1...])
        let summary = try RecordCodec.summarize(kind: kind, payload)
        for (_, range) in summary.values {
            guard range.lowerBound >= 0, range.upperBound <= payload.count else {
                preconditionFailure("a value range \(range) outside a \(payload.count)-byte record")
            }
            if !range.isEmpty { _ = try ValueCodec.decode(UnsafeRawBufferPointer(rebasing: payload[range])) }
        }
        if summary.kind == .localSet || summary.kind == .localUpdate {
            _ = try RecordCodec.unresolvedValues(kind: summary.kind, payload)
        }
        if let inner = summary.embeddedKind {
            _ = try RecordCodec.unresolvedValues(kind: inner, UnsafeRawBufferPointer(rebasing: payload[summary.embedded]))
        }
        return summary.values.count
    }

    /// Parses JSON text both ways the API takes it — ``Value/init(jsonBytes:)`` then the value
    /// encoder (`setValue(_:)`), and the one-pass JSON encoder (`setValue(jsonBytes:)`) — and
    /// checks that they agree: both refuse, or both accept with the same stored bytes.
    ///
    /// - Returns: the stored bytes.
    /// - Throws: ``DatabaseError`` (``DatabaseError/Code/invalidData``) when both refuse the text.
    @discardableResult
    public static func parseJSON(_ bytes: [UInt8]) throws -> [UInt8] {
        let viaValue = Result { try EncodedValue(Value(jsonBytes: bytes), path: .root) }
        let direct = Result { try EncodedValue(jsonBytes: bytes, path: .root) }
        switch (viaValue, direct) {
        case (.failure(let e), .failure):
            throw e
        case (.success(let a), .success(let b)):
            guard a.bytes == b.bytes else { preconditionFailure("the JSON encoders store different bytes: \(a.bytes) and \(b.bytes)") }
            guard a.hasServerValues == b.hasServerValues else { preconditionFailure("the JSON encoders disagree on server values") }
            do { _ = try b.node() } catch { preconditionFailure("stored bytes of accepted JSON do not decode: \(error)") }
            return b.bytes
        case (.success, .failure(let e)):
            preconditionFailure("Value(jsonBytes:) accepts what EncodedValue(jsonBytes:) refuses (\(e))")
        case (.failure(let e), .success):
            preconditionFailure("EncodedValue(jsonBytes:) accepts what Value(jsonBytes:) refuses (\(e))")
        }
    }

    /// Loads checkpoint blocks as an open does, into a fresh memory-only engine: the first block
    /// is the header, the others the sections. The store id and LSN the loader expects are taken
    /// from the header, so that a header that checks out leads to the sections.
    ///
    /// - Parameter input: the blocks of a checkpoint side file as
    ///   ``WriteAheadLog/readSideFile(named:blocks:)`` hands them over (after their checksums),
    ///   each behind a 2-byte little-endian length; a length that runs past the end takes the rest.
    /// - Returns: the entries loaded (server, pending, overlay and rejected).
    /// - Throws: ``DatabaseError`` (``DatabaseError/Code/storage``) for a damaged checkpoint.
    @discardableResult
    public static func loadCheckpoint(_ input: UnsafeRawBufferPointer) throws -> UInt64 {
        var blocks: [[UInt8]] = []
        var i = 0
        while i + 2 <= input.count {
            let n = Int(input[i]) | Int(input[i + 1]) << 8
            let end = min(input.count, i + 2 + n)
            blocks.append(Array(input[(i + 2)..<end]))
            i = end
        }
        var storeID = StoreID(high: 0, low: 0), lsn: UInt64 = 1
        if let head = blocks.first, head.count >= 34 {
            head.withUnsafeBytes { h in
                storeID = StoreID(high: UInt64(littleEndian: h.loadUnaligned(fromByteOffset: 10, as: UInt64.self)),
                                  low: UInt64(littleEndian: h.loadUnaligned(fromByteOffset: 18, as: UInt64.self)))
                lsn = UInt64(littleEndian: h.loadUnaligned(fromByteOffset: 26, as: UInt64.self))
            }
        }
        var loader = CheckpointLoader(into: CheckpointState(indexing: []), storeID: storeID, expectedLSN: lsn, firstLSN: 1, nextLSN: lsn)
        _ = try loader.load { body in
            for block in blocks { try block.withUnsafeBytes { try body($0) } }
            return true
        }
        return loader.counts.server + loader.counts.pending + loader.counts.overlay + loader.counts.rejected
    }

    private static func count(_ node: Node) -> Int {
        switch node {
        case .empty, .max: return 0
        case .plainLeaf, .prioritizedLeaf: return 1
        case .plainChildren(let c), .prioritizedChildren(let c, _): return c.entries.reduce(1) { $0 + count($1.node) }
        }
    }
}
