extension Engine {
    /// Sets up the child-value indexes the options declare (before the checkpoint is loaded,
    /// which may hold them, and before replay, which moves their entries).
    ///
    /// - Throws: ``DatabaseError`` (``DatabaseError/Code/invalidData``) naming a location or
    ///   child that is not a valid path, or an index declared twice.
    func declareIndexes(_ specs: [ChildIndex]) throws {
        var seen = Set<ChildIndex>()
        for spec in specs {
            guard seen.insert(spec).inserted else {
                throw DatabaseError(.invalidData, "the index of \(spec.location) by \(spec.child) is declared twice")
            }
            let location: Path, child: Path
            do {
                location = try Path(validating: spec.location)
                child = try Path(validating: spec.child)
            } catch let e as DatabaseError {
                throw DatabaseError(.invalidData, "the index of \(spec.location) by \(spec.child): \(e.message)")
            }
            guard !child.isEmpty, !child.keys.contains(".priority") else {
                throw DatabaseError(.invalidData, "the index of \(spec.location) by \(spec.child): the child must be a path of keys below each child")
            }
            addIndex(location: location, child: child)
        }
    }

    @discardableResult
    private func addIndex(location: Path, child: Path) -> ChildValueIndex {
        let index = ChildValueIndex(location: location, child: child)
        attach(index)
        return index
    }

    /// Makes an index for a listener of `query` (see ``DatabaseOptions/automaticIndexes``)
    /// when no index orders it, it is limited, unranged and ordered by a child, and its
    /// location is big: many stored entries below it, or a node of many children (as one
    /// server put stores them). The index is empty: the caller builds it outside the lock.
    /// Returns the automatic index the listener will use (new or already there), counted as
    /// arriving until the caller has registered the listener or given up (``listenerArrived(_:)``).
    func addAutomaticIndex(for query: QuerySpec) -> ChildValueIndex? {
        if let existing = childIndex(for: query) {
            guard existing.automatic else { return nil }
            existing.arrivingListeners += 1
            return existing
        }
        guard let child = Self.indexedChild(of: query.index), query.params.limit != nil, !query.params.startSet, !query.params.endSet,
              !child.isEmpty, child == Self.priorityPath || !child.keys.contains(".priority") else { return nil }
        guard isBig(query.path) || storedChildCount(query.path) >= LazyLocation.lazyThreshold else { return nil }
        let index = addIndex(location: query.path, child: child)
        index.automatic = true
        index.arrivingListeners = 1
        return index
    }

    /// The listener counted by ``addAutomaticIndex(for:)`` is registered, or was refused.
    func listenerArrived(_ index: ChildValueIndex) {
        index.arrivingListeners -= 1
        dropUnusedAutomaticIndexes()
    }

    /// Whether an index a listener uses must be built again and can be (a write at or above its
    /// location, or its data complete at last): then the caller has
    /// ``Database/rebuildListenedIndexes()`` run outside the lock. Each such index is marked
    /// scheduled, so that it is asked once.
    ///
    /// Cheap when nothing is due: the listeners are looked for only for an index that needs a
    /// rebuild, and not again until they change (``Registrations/version``); an index reset
    /// because it could not order a value is left to the next query (``ChildValueIndex/resetForUnusable``).
    func takeIndexRebuildsDue() -> Bool {
        guard !childIndexes.isEmpty else { return false }
        var due = false
        for index in childIndexes where index.needsRebuild && !index.isRebuilding && !index.rebuildScheduled && !index.resetForUnusable {
            if index.idleAt == registrations.version { continue }
            guard registrations.all.contains(where: { childIndex(for: $0.query) === index }) else {
                index.idleAt = registrations.version
                continue
            }
            guard isComplete(index.location) else { continue }
            index.rebuildScheduled = true
            due = true
        }
        return due
    }

    /// How many children the stored node that holds `path` whole has there (the server's or
    /// a local write's, at or above it, whichever has more), read from the value's header:
    /// nothing is decoded under the lock.
    private func storedChildCount(_ path: Path) -> Int {
        var most = 0
        for layer in [server, writeTree.overlay] {
            guard let (at, entry) = layer.deepestChainEntry(path), !entry.isEmpty else { continue }
            let below = at.relative(to: path)
            if entry.isInline {
                most = max(most, layer.value(entry).getChild(below).numChildren)
            } else if entry.ref.length > 0 {
                most = max(most, (try? withValue(entry.ref) { try ValueCodec.childCount($0, at: below) }) ?? 0)
            }
        }
        return most
    }

    /// Begins the rebuilds scheduled for listened indexes (``Database/rebuildListenedIndexes()``
    /// runs them outside the lock): the indexes that still need one, with their tokens, and
    /// the data frozen to build them from; nil when there is nothing to do.
    func beginScheduledRebuilds(onFailure: @escaping @Sendable (DatabaseError) -> Void) -> ([(ChildValueIndex, UInt64)], FrozenData)? {
        let due = childIndexes.filter(\.rebuildScheduled)
        for index in due { index.rebuildScheduled = false }
        guard stopReason == nil else { return nil }
        let ready = due.filter { $0.needsRebuild && !$0.isRebuilding && isComplete($0.location) }
        guard !ready.isEmpty else { return nil }
        guard let frozen = freeze(onFailure: onFailure) else {
            // (No read snapshot now, e.g. no file descriptors: not asked again until the
            // listeners change or a query builds it.)
            for index in ready { index.idleAt = registrations.version }
            return nil
        }
        countBackgroundRebuilds(ready.count)
        return (ready.map { ($0, $0.beginRebuild()) }, frozen)
    }

    /// Drops the automatic indexes no listener's query uses any more.
    func dropUnusedAutomaticIndexes() {
        let unused = childIndexes.filter { index in
            index.automatic && index.arrivingListeners == 0 && !registrations.all.contains { childIndex(for: $0.query) === index }
        }
        guard !unused.isEmpty else { return }
        detach(unused)
    }

    /// The declared index that orders `query`'s window, when the query can be answered from
    /// one: ordered by an indexed child at its location, limited, with no range.
    func childIndex(for query: QuerySpec) -> ChildValueIndex? {
        guard let child = Self.indexedChild(of: query.index), query.params.limit != nil,
              !query.params.startSet, !query.params.endSet else { return nil }
        return childIndexes.first { $0.location == query.path && $0.child == child }
    }

    /// What an index for `index` orders children by: a child's value at a path, or its
    /// priority (the path `.priority`: a node's child there is its priority, and priorities
    /// order as those values do). Only automatic indexes order by priority (a declaration
    /// names a child).
    static func indexedChild(of index: QueryIndex) -> Path? {
        switch index {
        case .child(let child): child
        case .priority: Self.priorityPath
        case .key, .value: nil
        }
    }

    static let priorityPath = Path(keys: [".priority"])

    /// Puts the children marked in indexes that hold many marks in their places (at the end
    /// of an operation, when every change of it is made).
    func refreshIndexesIfDue() {
        for index in childIndexes where index.refreshIsDue { index.refresh() }
    }

    /// Whether the data at `path` is complete (a reader sees all of it).
    func isComplete(_ path: Path) -> Bool {
        writeTree.overlay.isComplete(at: path) || server.isComplete(at: path)
    }
}

/// Notes whether anything at, above or below a location changes (while a view of it is built
/// outside the lock from frozen data: it is installed only if nothing did).
final class LocationWatch: LayeredChangeObserver {
    let key: [UInt8]
    private(set) var changed = false

    init(_ path: Path) { key = PathKey.encode(path) }

    func willChange(_ changed: UnsafeRawBufferPointer) {
        if self.changed { return }
        // Related when one key starts with the other: the change is at, above or below.
        let n = min(changed.count, key.count)
        self.changed = n == 0 || key.withUnsafeBytes { k in memcmp(k.baseAddress!, changed.baseAddress!, n) == 0 }
    }

    func willChangeEverything() { changed = true }
}

extension Engine {
    /// Starts watching `path` for changes (see ``LocationWatch``).
    func watch(_ path: Path) -> LocationWatch {
        let w = LocationWatch(path)
        server.observers.append(w)
        writeTree.overlay.observers.append(w)
        return w
    }

    func unwatch(_ w: LocationWatch) {
        server.observers.removeAll { $0 === w }
        writeTree.overlay.observers.removeAll { $0 === w }
    }
}

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

extension Engine: VisibleData {}

extension Engine: IndexedChildSource {
    func window(of query: QuerySpec) -> Node? {
        guard let index = currentIndex(for: query) else { return nil }  // (never rebuilt here, under the lock)
        countIndexedLookup()
        // The window's children: the index orders them exactly; the filter builds the window
        // from them as from all children.
        let keys = index.keys(first: query.params.limit ?? 0, fromEnd: !query.params.isViewFromLeft)
        return query.params.filtered(Node.empty.updatingImmediateChildren(keys.map { ($0, visibleNode(at: query.path.child($0)) ?? .empty) }))
    }

    /// The index that orders `query` when it can answer at once: the data there complete, the
    /// index built, usable and with its marked children in their places.
    func currentIndex(for query: QuerySpec) -> ChildValueIndex? {
        guard let index = childIndex(for: query), isComplete(query.path) else { return nil }
        index.refresh()
        return index.isCurrent ? index : nil
    }

    func indexedChild(at location: Path, after post: NamedNode, index: QueryIndex, reverse: Bool) -> NamedNode?? {
        guard let child = Self.indexedChild(of: index),
              let found = childIndexes.first(where: { $0.location == location && $0.child == child }),
              isComplete(location), let name = found.child(after: post, reverse: reverse) else { return nil }
        countIndexedLookup()
        guard let name else { return .some(nil) }
        return .some(NamedNode(name: name, node: visibleNode(at: location.child(name)) ?? .empty))
    }
}
