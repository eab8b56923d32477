import FerryLog
import Testing

@testable import Ferry

/// The database's observers on their own: ids are never reused, the version moves with every
/// change (and not without one), and each end handler is given out once.
@Suite struct RegistrationsTests {
    /// The observers whose end handlers were called.
    final class Ended: Sendable {
        let ids = FerryMutex<[UInt64]>([])
    }

    func state(_ id: UInt64, at path: String, ended: Ended? = nil) throws -> RegistrationState {
        let registration = EventRegistration(id: id, types: [.value], handler: { _, _ in })
        var onEnd: (@Sendable (DatabaseError?) -> Void)?
        if let ended { onEnd = { _ in ended.ids.withLock { $0.append(id) } } }
        return RegistrationState(registration: registration, query: QuerySpec.defaultQuery(at: try Path(validating: path)),
                                 lastMetadata: nil, onEnd: onEnd)
    }

    @Test func theVersionMovesWithEveryChangeAndOnlyThen() throws {
        let r = Registrations()
        let a = r.newID(), b = r.newID()
        #expect(b > a, "ids rise")
        let v0 = r.version
        r.add(try state(a, at: "posts"))
        r.add(try state(b, at: "users"))
        let v1 = r.version
        #expect(v1 != v0)
        r.told(a, SnapshotMetadata(fromCache: false, hasPendingWrites: true))
        let v2 = r.version
        #expect(v2 != v1, "what an observer was told counts (a value event retries a rebuild that could not start)")
        #expect(r.all.first { $0.registration.id == a }?.lastMetadata == SnapshotMetadata(fromCache: false, hasPendingWrites: true))
        r.told(999, SnapshotMetadata(fromCache: true, hasPendingWrites: false))
        #expect(r.remove(999) == nil && r.version == v2, "telling or removing no observer changes nothing")
        #expect(r.removeAll { $0.query.path.keys == ["nowhere"] }.isEmpty && r.version == v2)
        #expect(r.remove(a)?.registration.id == a)
        #expect(r.version != v2)
        #expect(r.count == 1 && !r.isEmpty)
    }

    @Test func eachEndHandlerIsGivenOutOnce() throws {
        let r = Registrations()
        let ended = Ended()
        for path in ["a", "b", "c"] { r.add(try state(r.newID(), at: path, ended: ended)) }
        let ends = r.takeEnds()
        #expect(ends.count == 3)
        #expect(r.takeEnds().isEmpty, "a second stop gives nothing again")
        #expect(r.count == 3, "the observers stay until the app removes them")
        let found = r.remove(1)
        let removed = try #require(found)
        #expect(removed.onEnd == nil, "a removal after the stop does not end it again")
        for end in ends { end(nil) }
        #expect(ended.ids.withLock { $0.sorted() } == [1, 2, 3])
    }
}
