/// A registration and what it was last told.
struct RegistrationState {
    var registration: EventRegistration
    var query: QuerySpec
    var lastMetadata: SnapshotMetadata?
    /// Called once, outside the lock, when the database closes or fails while the registration
    /// is active, or (with nil) when the app removes it: ends the streams and single-event
    /// waits built on it.
    var onEnd: (@Sendable (DatabaseError?) -> Void)?
}

/// The database's active observers — listeners, sequences, single-event waits — by id.
///
/// Invariants: ids are never reused (``newID()`` rises); ``version`` changes with every
/// change — an observer added or removed, or told new metadata (an index no observer used, or
/// whose rebuild could not start, is looked at again once it changes: ``ChildValueIndex/idleAt``;
/// a value event is what retries a rebuild that could not start); each end handler is given out
/// once, by the removal that removes its observer or by ``takeEnds()`` when the database stops.
final class Registrations {
    private var byID: [UInt64: RegistrationState] = [:]
    private var nextID: UInt64 = 1
    /// Changes with every change of the observers or of what they were told.
    private(set) var version: UInt64 = 0

    /// A new observer's id.
    func newID() -> UInt64 {
        defer { nextID += 1 }
        return nextID
    }

    func add(_ state: RegistrationState) {
        byID[state.registration.id] = state
        version &+= 1
    }

    /// Removes observer `id`; returns it (with its end handler, not yet called).
    func remove(_ id: UInt64) -> RegistrationState? {
        guard let state = byID.removeValue(forKey: id) else { return nil }
        version &+= 1
        return state
    }

    /// Removes every observer `matches` selects; returns them.
    func removeAll(where matches: (RegistrationState) -> Bool) -> [RegistrationState] {
        let removed = byID.values.filter(matches)
        guard !removed.isEmpty else { return [] }
        for state in removed { byID[state.registration.id] = nil }
        version &+= 1
        return removed
    }

    /// Records the metadata observer `id` was last told.
    func told(_ id: UInt64, _ metadata: SnapshotMetadata) {
        guard byID[id] != nil else { return }
        byID[id]!.lastMetadata = metadata
        version &+= 1
    }

    /// Takes every active observer's end handler (each is given once), for the database's
    /// stop; the observers stay until the app removes them.
    func takeEnds() -> [@Sendable (DatabaseError?) -> Void] {
        var ends: [@Sendable (DatabaseError?) -> Void] = []
        for (id, state) in byID {
            if let end = state.onEnd {
                ends.append(end)
                byID[id]?.onEnd = nil
            }
        }
        return ends
    }

    var all: Dictionary<UInt64, RegistrationState>.Values { byID.values }
    var isEmpty: Bool { byID.isEmpty }
    var count: Int { byID.count }
}
