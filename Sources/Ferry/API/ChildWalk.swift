import Dispatch
import FerryLog

/// A lazily read location's children in an index's order, each read once where it can be (a
/// child stored as one value, without a priority, given as its checked bytes, to be decoded
/// when read): in key order the cursor's children as they come; by priority, the children
/// without one as they come (they sort first, in key order, and are nearly always all of them), then those
/// with one, sorted by it (only their keys and priorities are kept meanwhile, and each is read
/// again); by value or a child's value, the keys sorted by ``LazyLocation/indexOrder(_:)``,
/// each child read again. Used by ``DataSnapshot/forEachChild(_:)`` and ``ChildStream``.
struct OrderedChildWalk {
    private let location: LazyLocation
    /// The cursor's children, all of them (key order) or those without a priority; nil once
    /// it is done. (Kept apart from the rest, so that moving it copies nothing.)
    private var cursor: ChildCursor?
    private let priorityFirst: Bool
    /// By priority: the children with one, in key order, met so far.
    private var withPriority: [(key: String, priority: Node)] = []
    /// Then: the keys to read again, in order.
    private var sorted: [String] = []
    private var nextSorted = 0

    init(_ location: LazyLocation, index: QueryIndex) {
        self.location = location
        priorityFirst = index == .priority
        if index == .key || index == .priority {
            cursor = ChildCursor(location, decode: true)
        } else if let order = location.indexOrder(index) {
            sorted = order
        } else {
            cursor = ChildCursor(location, decode: true)
        }
    }

    /// The next child: its node, or its checked stored bytes (see ``ChildCursor/step(keepingStored:)``).
    mutating func step() -> (String, DataSnapshot.Content)? {
        if cursor != nil {
            while let (key, child) = cursor!.step(keepingStored: true) {
                let node: Node
                switch child {
                case .stored(let bytes): return (key, .stored(bytes))  // (no priority: given at once)
                case .node(let decoded): node = decoded ?? .empty
                }
                if priorityFirst && !node.priority.isEmpty {
                    withPriority.append((key, node.priority))
                    continue
                }
                return (key, .node(node))
            }
            cursor = nil
            // Ties keep key order, as the index's own comparison does.
            let order = withPriority.indices.sorted { i, j in
                let c = Node.compare(withPriority[i].priority, withPriority[j].priority)
                return c != 0 ? c < 0 : i < j
            }
            sorted = order.map { withPriority[$0].key }
            withPriority = []
        }
        guard nextSorted < sorted.count else { return nil }
        defer { nextSorted += 1 }
        return (sorted[nextSorted], .node(location.child(sorted[nextSorted])))
    }
}

/// The children of a snapshot as an asynchronous sequence (``DataSnapshot/childStream``).
public struct ChildStream: AsyncSequence, Sendable {
    /// Each child's snapshot.
    public typealias Element = DataSnapshot
    let snapshot: DataSnapshot
    let batchSize: Int

    /// An iterator that walks the children from the first, a batch at a time.
    public func makeAsyncIterator() -> Iterator {
        Iterator(source: ChildSource(snapshot, batchSize: batchSize))
    }

    /// Iterates a ``ChildStream``.
    public struct Iterator: AsyncIteratorProtocol {
        let source: ChildSource
        private var batch: [DataSnapshot] = []
        private var next = 0

        init(source: ChildSource) { self.source = source }

        /// The next child, nil after the last.
        ///
        /// - Throws: ``DatabaseError`` (``DatabaseError/Code/storage``) when a stored value
        ///   cannot be read; `CancellationError` when the task is cancelled.
        public mutating func next() async throws -> DataSnapshot? {
            if next == batch.count {
                try Task.checkCancellation()
                batch = try await source.nextBatch()
                next = 0
                if batch.isEmpty { return nil }
            }
            defer { next += 1 }
            return batch[next]
        }
    }
}

/// Where a ``ChildStream`` takes its children from: a batch at a time, read on a thread of
/// its own queue (not Swift's cooperative pool, which must not wait on disk reads).
final class ChildSource: @unchecked Sendable {
    private enum Walk {
        case materialized([DataSnapshot], Int)
        case ordered(OrderedChildWalk)
        case done
    }

    private let snapshot: DataSnapshot
    private let batchSize: Int
    private let state: FerryMutex<Walk?> = FerryMutex(nil)
    private static let queue = DispatchQueue(label: "ferry.child-stream", attributes: .concurrent)

    init(_ snapshot: DataSnapshot, batchSize: Int) {
        self.snapshot = snapshot
        self.batchSize = max(1, batchSize)
    }

    func nextBatch() async throws -> [DataSnapshot] {
        if case .lazy(let l) = snapshot.content, l.plan != nil {
            return try await withCheckedThrowingContinuation { c in
                Self.queue.async { c.resume(with: Result { try self.take() }) }
            }
        }
        return try take()
    }

    private func take() throws -> [DataSnapshot] {
        try state.withLock { walk in
            if walk == nil { walk = start() }
            var out: [DataSnapshot] = []
            out.reserveCapacity(batchSize)
            switch walk! {
            case .materialized(let all, var i):
                while out.count < batchSize && i < all.count { out.append(all[i]); i += 1 }
                walk = .materialized(all, i)
            case .ordered(var children):
                walk = .done  // (so that the walk is not copied while it moves)
                let parent = DataSnapshot.Parent(snapshot.ref)
                while out.count < batchSize, let (k, c) = children.step() { out.append(snapshot.child(k, c, of: parent)) }
                if out.count == batchSize { walk = .ordered(children) }
            case .done:
                break
            }
            if case .lazy(let l) = snapshot.content, let e = l.data.reader.error { throw e }
            return out
        }
    }

    private func start() -> Walk {
        guard case .lazy(let l) = snapshot.content, l.plan != nil else { return .materialized(snapshot.children, 0) }
        return .ordered(OrderedChildWalk(l, index: snapshot.index))
    }
}

extension DataSnapshot {
    /// The children in the query's order, as an asynchronous sequence that reads `batchSize`
    /// children at a time on a thread outside Swift's cooperative pool; memory is the batch
    /// and what the caller keeps (see ``forEachChild(_:)`` for the orders that read every
    /// child once first). Each iteration walks the children again from the first.
    public func childStream(batchSize: Int = 256) -> ChildStream { ChildStream(snapshot: self, batchSize: batchSize) }
}
