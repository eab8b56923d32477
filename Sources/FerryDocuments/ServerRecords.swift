import FerryStore

/// A record of a `ferry-server` Firestore database (FORMAT.md, *Server document stores*), as
/// read back: the server replays its log with this decoder, and `ferry-dump` describes the
/// records with it.
package enum ServerDocumentRecord {
    /// The record kinds (a client document store uses 32–37).
    package enum Kind: UInt8, CaseIterable {
        /// A commit: its time, the client batch it answers (if any), each document it wrote.
        case commit = 40
        /// Every document removed (the emulator's clear-data request), at a time.
        case clear = 41
        /// A client's batch refused: client id, batch id, code, message (so that the batch,
        /// sent again, gets the same answer).
        case refusal = 42
    }

    /// The side file of the database's checkpoint.
    package static let checkpointFileName = "server-documents.checkpoint"

    /// A document a commit wrote: its create time and fields, or nil where it deleted it.
    package typealias Written = (key: ResourcePath, document: (createTime: Int64, fields: [String: FieldValueData])?)

    case commit(time: Int64, origin: (client: String, batch: Int64)?, documents: [Written])
    case clear(time: Int64)
    case refusal(client: String, batch: Int64, error: FirestoreErrorCode)

    /// Decodes a record; nil for a kind that is not a server document record.
    /// - Throws: ``FirestoreErrorCode`` (`dataLoss`) for a damaged record.
    package static func decode(kind: UInt8, _ payload: UnsafeRawBufferPointer) throws -> ServerDocumentRecord? {
        guard let k = Kind(rawValue: kind) else { return nil }
        var reader = PayloadReader(payload)
        switch k {
        case .commit:
            let version = try reader.u8()
            guard version == 1 || version == 2 else { throw FirestoreErrorCode(.dataLoss, "a commit record of an unknown version (\(version))") }
            let time = try reader.i64()
            let origin = version == 2 ? (client: try reader.string(), batch: try reader.i64()) : nil
            var documents: [Written] = []
            for _ in 0..<(try reader.count()) {
                let key = try reader.path()
                if try reader.u8() == 1 {
                    let created = try reader.i64()
                    documents.append((key, (created, try reader.fields())))
                } else {
                    documents.append((key, nil))
                }
            }
            return .commit(time: time, origin: origin, documents: documents)
        case .clear:
            return .clear(time: try reader.i64())
        case .refusal:
            let client = try reader.string()
            let batch = try reader.i64()
            let code = FirestoreErrorCode.Code(rawValue: Int(try reader.u32())) ?? .unknown
            return .refusal(client: client, batch: batch, error: FirestoreErrorCode(code, try reader.string()))
        }
    }
}

/// A `ferry-server` Firestore database's records, as tools read them.
package struct ServerDocumentRecordModel: RecordModel {
    package init() {}
    package var name: String { "a ferry-server Firestore database" }
    package func owns(kind: UInt8) -> Bool { ServerDocumentRecord.Kind(rawValue: kind) != nil }
    package func marks(sideFile name: String) -> Bool { name == ServerDocumentRecord.checkpointFileName }

    package func describe(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) -> String? {
        guard owns(kind: kind) else { return nil }
        let record: ServerDocumentRecord?
        do { record = try ServerDocumentRecord.decode(kind: kind, payload) } catch {
            return "damaged server record: \(error)"
        }
        switch record {
        case .commit(let time, let origin, let documents)?:
            let shown = documents.prefix(20).map { d in d.document.map { "set \(d.key) " + DocumentTools.json(.map($0.fields)) } ?? "delete \(d.key)" }
            return "commit at \(time)" + (origin.map { " (client \($0.client) batch \($0.batch))" } ?? "") + ": "
                + shown.joined(separator: "; ") + (documents.count > 20 ? "; … (\(documents.count) documents)" : "")
        case .clear(let time)?:
            return "every document removed at \(time)"
        case .refusal(let client, let batch, let error)?:
            return "client \(client) batch \(batch) refused: \(error)"
        case nil:
            return nil
        }
    }
}
