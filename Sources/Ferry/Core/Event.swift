/// Someone listening: which event types it takes and where its events go.
///
/// Identity matters: removing a registration removes exactly this one.
final class EventRegistration: Sendable, CustomStringConvertible {
    let id: UInt64
    let types: Set<DataEventType>
    /// Also deliver value events whose only change is metadata (fromCache, hasPendingWrites).
    let includeMetadataChanges: Bool
    let handler: @Sendable (Event, SnapshotMetadata) -> Void

    init(id: UInt64, types: Set<DataEventType>, includeMetadataChanges: Bool = false,
         handler: @escaping @Sendable (Event, SnapshotMetadata) -> Void) {
        self.id = id
        self.types = types
        self.includeMetadataChanges = includeMetadataChanges
        self.handler = handler
    }

    func responds(to type: DataEventType) -> Bool { types.contains(type) }

    var description: String { "registration \(id) \(types.map(\.description).sorted())" }
}

/// One event for one registration.
struct Event: Sendable {
    let registration: EventRegistration
    let query: QuerySpec
    let change: Change
    /// The view's data after the change (value events carry it; child events use it for order).
    let eventCache: IndexedNode

    var type: DataEventType { change.type }
    /// The location the event's snapshot is of.
    var path: Path { change.childKey.map { query.path.child($0) } ?? query.path }
}
