/// A data model's records as a tool (`ferry-dump`) reads them: which record kinds are the
/// model's, which side file marks a store of the model (its checkpoint, which outlives the
/// records compaction deletes), and a one-line description of each record by the model's own
/// decoder. Each model on the log has one; ``RecordModels/identify(_:sideFiles:firstKind:)``
/// says whose a store is, so that a tool never interprets a record with a second decoder of
/// its own.
package protocol RecordModel: Sendable {
    /// What a store of the model is, for messages ("a Realtime Database store").
    var name: String { get }
    /// Whether `kind` is one of the model's record kinds.
    func owns(kind: UInt8) -> Bool
    /// Whether a side file named `name` marks a store of the model.
    func marks(sideFile name: String) -> Bool
    /// A one-line description of one of the model's records; nil for a kind it does not own.
    func describe(kind: UInt8, lsn: UInt64, payload: UnsafeRawBufferPointer) -> String?
}

package enum RecordModels {
    /// The model whose store holds `sideFiles` and whose first record (if any) is of
    /// `firstKind`: the one a side file marks, else the one owning the first record's kind
    /// (asked for only then); nil when neither tells (an empty store).
    package static func identify(_ models: [any RecordModel], sideFiles: [String], firstKind: @autoclosure () -> UInt8?) -> (any RecordModel)? {
        if let m = models.first(where: { m in sideFiles.contains(where: m.marks(sideFile:)) }) { return m }
        guard let firstKind = firstKind() else { return nil }
        return models.first { $0.owns(kind: firstKind) }
    }
}
