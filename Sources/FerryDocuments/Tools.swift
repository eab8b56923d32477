import FerryLog
import FerryStore
import Foundation

/// What tools (`ferry-dump`) need to read a document store's log: record descriptions and a
/// replay with the model's own apply function. Not for apps.
@_spi(Tools) public enum DocumentTools {
    /// The side file a document store keeps its checkpoint in (its presence marks a document store).
    public static let checkpointFileName = "documents.checkpoint"

    /// A one-line description of a document record (nil: not a document record).
    public static func describe(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) -> String? {
        guard let k = DocumentRecordKind(rawValue: kind) else { return nil }
        switch k {
        case .indexConfiguration:
            return "index configuration (\(payload.count) bytes)"
        case .remoteEvent:
            guard let e = try? DocumentRecords.decodeRemoteEvent(payload) else { return "damaged remote event" }
            return "server snapshot at version \(e.version): " + (e.targets.map { "target \($0.id) +\($0.added.count) -\($0.removed.count)\($0.resumeToken.map { " token \($0.isEmpty ? "cleared" : $0)" } ?? "")" }
                + e.documents.map { "\($0.state) \($0.key)@\($0.version)" + ($0.fields.map { " " + json(.map($0)) } ?? "") }).joined(separator: "; ")
        case .writeAnswer:
            guard let a = try? DocumentRecords.decodeWriteAnswer(payload) else { return "damaged write answer" }
            return a.rejection.map { "write batch \(a.batchID) rejected: \($0)" } ?? "write batch \(a.batchID) committed at version \(a.version)"
        case .rejectionsCleared:
            guard payload.count == 8 else { return "damaged rejections-cleared record" }
            return "rejected batches cleared through \(Int64(littleEndian: payload.loadUnaligned(as: Int64.self)))"
        case .target:
            guard let t = try? DocumentRecords.decodeTarget(payload) else { return "damaged target" }
            return "target \(t.id) for \(t.query.documentKey?.description ?? (t.query.collectionGroup.map { "group " + $0 } ?? t.query.path.description))"
        case .writeBatch:
            do {
                let b = try DocumentRecords.decodeBatch(id: Int64(lsn), payload)
                return "write batch \(lsn) at \(b.localWriteTime.micros) µs: " + b.mutations.map(describe).joined(separator: "; ")
            } catch {
                return "damaged write batch: \(error)"
            }
        }
    }

    static func describe(_ m: Mutation) -> String {
        let transforms = m.transforms.isEmpty ? "" : " transforms {" + m.transforms.map { "\($0.0): \($0.1)" }.joined(separator: ", ") + "}"
        switch m.operation {
        case .delete: return "delete \(m.key)"
        case .set: return "set \(m.key) \(json(.map(m.fields)))" + transforms
        case .patch:
            return (m.mustExist ? "update " : "merge ") + "\(m.key) \(json(.map(m.fields))) mask [\(m.mask.map(\.description).joined(separator: ", "))]" + transforms
        }
    }

    /// A value as JSON-like text (typed values tagged: `{"$timestamp": …}`).
    static func json(_ v: FieldValueData) -> String {
        switch v {
        case .null: "null"
        case .bool(let b): "\(b)"
        case .integer(let i): "\(i)"
        case .double(let d): d.isNaN ? "NaN" : d.isInfinite ? (d > 0 ? "Infinity" : "-Infinity") : "\(d)"
        case .timestamp(let t): "{\"$timestamp\": \"\(t.seconds).\(String(format: "%06d", t.nanoseconds / 1000))\"}"
        case .pendingServerTimestamp(let t, _): "{\"$serverTimestamp\": \"pending, local \(t.seconds)\"}"
        case .string(let s): quoted(s)
        case .bytes(let d): "{\"$bytes\": \"\(d.base64EncodedString())\"}"
        case .reference(let r): "{\"$ref\": \(quoted(r))}"
        case .geoPoint(let g): "{\"$geo\": [\(g.latitude), \(g.longitude)]}"
        case .array(let a): "[" + a.map(json).joined(separator: ", ") + "]"
        case .map(let m): "{" + m.keys.sorted(by: FieldValueData.utf8Less).map { quoted($0) + ": " + json(m[$0]!) }.joined(separator: ", ") + "}"
        }
    }

    static func quoted(_ s: String) -> String {
        let data = (try? JSONSerialization.data(withJSONObject: [s], options: [.withoutEscapingSlashes])) ?? Data()
        let t = String(decoding: data, as: UTF8.self)
        return String(t.dropFirst().dropLast())
    }

    /// Rebuilds a document store's state by replaying records with the model's apply function.
    public final class Replayer {
        var engine = DocumentEngine(records: RecordStore(log: nil))
        /// Records below this LSN are in the checkpoint loaded (they are skipped).
        public private(set) var startLSN: UInt64 = 0

        /// A replayer starting from the store's checkpoint in `directory`, if it has one.
        public init(directory: String? = nil) throws {
            guard let directory else { return }
            let path = directory + "/" + DocumentCheckpoint.fileName
            guard FileManager.default.fileExists(atPath: path) else { return }
            let bytes = try [UInt8](Data(contentsOf: URL(fileURLWithPath: path)))
            let c = try DocumentCheckpoint.decode(bytes)
            engine.install(c)
            startLSN = c.throughLSN
        }

        public func apply(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) throws {
            guard lsn >= startLSN else { return }
            _ = try engine.apply(kind: kind, lsn: Int64(lsn), payload: payload)
        }

        /// The document at `path` as the local view shows it: its JSON, "(deleted)", or nil
        /// when the store knows nothing of it.
        public func document(at path: String) throws -> String? {
            let key = try ResourcePath.parse(path, what: "document path")
            guard key.isDocument else { throw FirestoreErrorCode(.invalidArgument, "\(path) names a collection, not a document") }
            guard let d = engine.document(key) else { return nil }
            return d.fields.map { json(.map($0)) + (d.hasLocalMutations ? " (pending writes)" : "") } ?? "(deleted)"
        }

        /// The ids of a collection's documents that exist.
        public func documents(in path: String) throws -> [String] {
            let p = try ResourcePath.parse(path, what: "collection path")
            return (engine.collections[p] ?? [:]).values.filter(\.exists).map(\.key.last).sorted(by: FieldValueData.utf8Less)
        }

        public struct Statistics: Encodable, Sendable {
            public var documents: Int
            public var deletedDocuments: Int
            public var collections: Int
            public var pendingBatches: Int
            public var pendingWrites: Int
        }

        public var statistics: Statistics {
            let all = engine.collections.values.flatMap(\.values)
            return Statistics(documents: all.filter(\.exists).count, deletedDocuments: all.filter { !$0.exists }.count,
                              collections: engine.collections.values.filter { !$0.isEmpty }.count,
                              pendingBatches: engine.pending.count, pendingWrites: engine.pending.reduce(0) { $0 + $1.mutations.count })
        }
    }
}

/// A client document store's records, as tools read them (``DocumentTools``).
package struct DocumentRecordModel: RecordModel {
    package init() {}
    package var name: String { "a document store (FerryDocuments' Firestore)" }
    package func owns(kind: UInt8) -> Bool { DocumentRecordKind(rawValue: kind) != nil }
    package func marks(sideFile name: String) -> Bool { name == DocumentTools.checkpointFileName }
    package func describe(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) -> String? {
        DocumentTools.describe(kind: kind, lsn: lsn, payload: payload)
    }
}
