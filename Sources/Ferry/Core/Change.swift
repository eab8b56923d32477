/// The kinds of events a listener can receive, in the order Firebase raises them within one
/// change: removed, added, moved, changed, value.
public enum DataEventType: Int, Sendable, Hashable, CaseIterable, CustomStringConvertible {
    case childRemoved, childAdded, childMoved, childChanged, value

    public var description: String {
        switch self {
        case .childRemoved: "child_removed"
        case .childAdded: "child_added"
        case .childMoved: "child_moved"
        case .childChanged: "child_changed"
        case .value: "value"
        }
    }
}

/// A raw change to a view's data, before it becomes events for registrations.
struct Change: Sendable {
    var type: DataEventType
    var node: Node
    var childKey: String?
    var oldNode: Node?
    var prevName: String?

    static func value(_ node: Node) -> Change { Change(type: .value, node: node) }
    static func added(_ key: String, _ node: Node) -> Change { Change(type: .childAdded, node: node, childKey: key) }
    static func removed(_ key: String, _ node: Node) -> Change { Change(type: .childRemoved, node: node, childKey: key) }
    static func changed(_ key: String, _ node: Node, old: Node) -> Change {
        Change(type: .childChanged, node: node, childKey: key, oldNode: old)
    }
}

/// Collects the child changes of one operation, folding successive changes to the same child
/// into one (removed then added is changed, added then removed is nothing, …).
final class ChildChangeAccumulator {
    private var changes: [String: Change] = [:]
    private var order: [String] = []

    func track(_ change: Change) {
        guard let key = change.childKey else { preconditionFailure("only child changes are tracked") }
        guard let old = changes[key] else {
            changes[key] = change
            order.append(key)
            return
        }
        switch (change.type, old.type) {
        case (.childAdded, .childRemoved):
            changes[key] = .changed(key, change.node, old: old.node)
        case (.childRemoved, .childAdded):
            changes[key] = nil
            order.removeAll { $0 == key }
        case (.childRemoved, .childChanged):
            changes[key] = .removed(key, old.oldNode ?? old.node)
        case (.childChanged, .childAdded):
            changes[key] = .added(key, change.node)
        case (.childChanged, .childChanged):
            changes[key] = .changed(key, change.node, old: old.oldNode ?? old.node)
        default:
            preconditionFailure("illegal combination of changes: \(change.type) after \(old.type)")
        }
    }

    var all: [Change] { order.compactMap { changes[$0] } }
}

/// Turns raw changes into events for a view's registrations: synthesizes moves for children
/// whose indexed value changed, sorts each kind by the index, and fills in prevName.
enum EventGenerator {
    static func events(for changes: [Change], eventCache: IndexedNode, registrations: [EventRegistration], query: QuerySpec) -> [Event] {
        var events: [Event] = []
        var moves: [Change] = []
        for c in changes where c.type == .childChanged {
            if let old = c.oldNode, query.index.indexedValueChanged(old, c.node) {
                moves.append(Change(type: .childMoved, node: c.node, childKey: c.childKey))
            }
        }
        for type in [DataEventType.childRemoved, .childAdded, .childMoved, .childChanged, .value] {
            var ofType = (type == .childMoved ? moves : changes).filter { $0.type == type }
            if type != .value {
                ofType.sort { query.index.compare(NamedNode(name: $0.childKey!, node: $0.node), NamedNode(name: $1.childKey!, node: $1.node)) < 0 }
            }
            for var change in ofType {
                if type != .value && type != .childRemoved {
                    change.prevName = eventCache.predecessor(of: change.childKey!, child: change.node)
                }
                for registration in registrations where registration.responds(to: type) {
                    events.append(Event(registration: registration, query: query, change: change, eventCache: eventCache))
                }
            }
        }
        return events
    }
}
