import FerryLog
import FerryTestSupport
import Foundation
import Logging
import Synchronization
import Testing

@testable @_spi(Server) import Ferry

func quietOptions(_ durability: Durability = .fsync) -> DatabaseOptions {
    var o = DatabaseOptions(durability: durability)
    o.segmentSize = 64 << 10
    o.logger = Logger(label: "test", factory: { _ in SwiftLogNoOpLogHandler() })
    return o
}

/// Collects what a listener receives, in order.
final class Recorder: Sendable {
    struct Entry: Sendable, CustomStringConvertible {
        var type: DataEventType
        var key: String?
        var value: Value
        var prev: String?
        var metadata: SnapshotMetadata
        var description: String { "\(type) \(key ?? "-") \(value)\(prev.map { " after \($0)" } ?? "")" }
    }
    private let entries = FerryMutex<[Entry]>([])

    var all: [Entry] { entries.withLock { $0 } }
    var values: [Value] { all.filter { $0.type == .value }.map(\.value) }
    func reset() { entries.withLock { $0 = [] } }

    func record(_ type: DataEventType, _ s: DataSnapshot, _ prev: String? = nil) {
        entries.withLock { $0.append(Entry(type: type, key: s.key, value: s.value, prev: prev, metadata: s.metadata)) }
    }

    /// Observes every event type of `query`.
    @discardableResult
    func listen(_ query: DatabaseQuery, includeMetadataChanges: Bool = false) -> [ObserverHandle] {
        DataEventType.allCases.map { type in
            query.observe(type, includeMetadataChanges: includeMetadataChanges) { s, prev in self.record(type, s, prev) }
        }
    }
}

func json(_ text: String) -> Value { try! Value(json: text) }
