import Dispatch
import FerryLog

/// Observers and reads of the cache, on the engine: what ``DatabaseQuery`` and
/// ``DatabaseReference`` ask of the database (they never take the engine's lock themselves).
extension Database {
    /// Registers an observer of `observed` (see ``DatabaseQuery/observe(_:includeMetadataChanges:with:)``):
    /// its first events are raised at once from what is cached. `onEnd` is called once, outside
    /// the lock, when the database closes or fails while it is registered, or (with nil) when
    /// the app removes it.
    func addObserver(_ observed: DatabaseQuery, types: Set<DataEventType>, includeMetadataChanges: Bool,
                     onEnd: (@Sendable (DatabaseError?) -> Void)?,
                     _ handler: @escaping @Sendable (DataEvent) -> Void) -> ObserverHandle {
        let db = self
        let query = observed.spec
        let id = withEngine { $0.registrations.newID() }
        let registration = EventRegistration(id: id, types: types, includeMetadataChanges: includeMetadataChanges) { event, metadata in
            handler(DataEvent(event, metadata: metadata, database: db))
        }
        // A limited view over an indexed location finds the child after its window from the
        // index: built first, outside the lock, if it must be (a failure to read stops the
        // database, which then refuses the registration below). A big location no declared
        // index orders gets one made for its listeners (DatabaseOptions.automaticIndexes).
        let automatic = !options.automaticIndexes ? nil : withEngine { e in
            e.stopReason == nil ? e.addAutomaticIndex(for: query) : nil
        }
        try? buildIndexIfNeeded(for: query)
        // A big location's view is built outside the lock (from frozen data), so that writes
        // from other tasks do not wait for it; it is installed if nothing changed meanwhile.
        let prepared = withEngine { e -> (FrozenData, LocationWatch)? in
            guard e.stopReason == nil, e.syncTree.canTakePrebuiltView(for: query), e.isBig(query.path),
                  e.currentIndex(for: query) == nil,  // (else the view is its window alone)
                  let frozen = e.freeze(onFailure: { _ in }) else { return nil }
            return (frozen, e.watch(query.path))
        }
        let prebuilt = prepared.flatMap { View.prebuilt(query, from: $0.0) }
        var refused: DatabaseError?
        raise { e in
            defer { if let automatic { e.listenerArrived(automatic) } }  // (registered, or refused)
            if let reason = e.stopReason {
                refused = reason
                return []
            }
            if let watch = prepared?.1 { e.unwatch(watch) }
            e.registrations.add(RegistrationState(registration: registration, query: query, lastMetadata: nil, onEnd: onEnd))
            var view = prebuilt != nil && prepared?.1.changed == false && e.syncTree.canTakePrebuiltView(for: query) ? prebuilt : nil
            if view == nil, e.syncTree.canTakePrebuiltView(for: query), let window = e.window(of: query) {
                view = View(storeBacked: query, window: window)
            }
            return e.syncTree.addEventRegistration(registration, for: query, prebuilt: view)
        }
        if let refused { onEnd?(refused) }  // closed or failed already: end at once
        return ObserverHandle(id: id)
    }

    /// Removes the observer `id`; a sequence or single-event wait built on it ends.
    func removeObserver(_ id: UInt64) {
        let end = withEngine { e -> (@Sendable (DatabaseError?) -> Void)? in
            guard let state = e.registrations.remove(id) else { return nil }
            e.syncTree.removeEventRegistration(state.registration, for: state.query)
            e.dropUnusedAutomaticIndexes()
            return state.onEnd
        }
        end?(nil)  // outside the lock: a stream's end removes its observer again (a no-op now)
    }

    /// Removes every observer of `query` (of a location's default query: of every query at
    /// it); sequences and single-event waits built on them end.
    func removeAllObservers(of query: QuerySpec) {
        let ends = withEngine { e -> [@Sendable (DatabaseError?) -> Void] in
            let removed = e.registrations.removeAll { query.isDefault ? $0.query.path == query.path : $0.query == query }
            e.syncTree.removeEventRegistration(nil, for: query)
            e.dropUnusedAutomaticIndexes()
            return removed.compactMap(\.onEnd)
        }
        for end in ends { end(nil) }
    }

    /// The complete data for this query from an active view or the stored cache, or nil.
    ///
    /// A big location with no view is not read under the lock: the lock is held only to
    /// freeze the indexes (``FrozenData``), and the snapshot reads its children from them, and
    /// from the log's files, as it is used. A limited query a child-value index orders
    /// (``DatabaseOptions/indexes``) reads its window alone: its keys from the index, their
    /// data, under the lock (the index is first built outside it when it must be).
    func cachedSnapshot(of observed: DatabaseQuery, buildingIndex: Bool = true, readsOutsideTheLock: Bool = true) throws -> DataSnapshot? {
        enum Found {
            case node(Node)
            case frozen(FrozenData)
            case small(FrozenData)
        }
        let query = observed.spec, ref = observed.ref, index = observed.params.index
        if buildingIndex { try buildIndexIfNeeded(for: query) }
        let onFailure = readFailureHandler
        let result = try withEngine { e -> (Found, SnapshotMetadata)? in
            try e.checkUsable()
            if let view = e.syncTree.view(for: query), view.eventCache.isFullyInitialized {
                return (.node(view.eventCache.node), e.metadata(for: query))
            }
            if let window = e.window(of: query) {  // (a current index orders the query: its window alone)
                return (.node(window), e.metadata(for: query))
            }
            if e.isBig(query.path), let frozen = e.freeze(onFailure: onFailure) {
                return (.frozen(frozen), e.metadata(for: query))
            }
            if readsOutsideTheLock && e.log != nil {
                // Small data is read outside the lock too (stored values decoded there).
                return (.small(e.freezeForOneRead(onFailure: onFailure)), e.metadata(for: query))
            }
            guard let node = e.visibleNode(at: query.path) else { return nil }
            if query.loadsAllData { return (.node(node), e.metadata(for: query)) }
            return (.node(query.params.filtered(node)), e.metadata(for: query))
        }
        // A stored value that could not be read shows as missing: that is an error, not data.
        if let failure = withEngine({ $0.failure }) { throw failure }
        guard let (found, metadata) = result else { return nil }
        // A value read outside the lock could not be read: the database stops now (as when a
        // read under the lock fails), before this call throws.
        func failed(_ e: DatabaseError) -> DatabaseError {
            withEngine { $0.failReading(e) }
            return e
        }
        switch found {
        case .node(let node):
            return DataSnapshot(ref: ref, node: node, index: index, metadata: metadata)
        case .small(let frozen):
            let node = frozen.visibleNode(at: query.path)
            if frozen.reader.stale { return try cachedSnapshot(of: observed, buildingIndex: buildingIndex, readsOutsideTheLock: false) }
            if let failure = frozen.reader.error { throw failed(failure) }
            guard let node else { return nil }
            return DataSnapshot(ref: ref, node: query.loadsAllData ? node : query.params.filtered(node), index: index, metadata: metadata)
        case .frozen(let frozen):
            guard let location = LazyLocation.make(frozen, at: query.path) else { return nil }
            if query.loadsAllData {
                if let failure = frozen.reader.error { throw failed(failure) }
                return DataSnapshot(ref: ref, content: .lazy(location), index: index, metadata: metadata)
            }
            let filtered = location.filtered(by: query.params)
            if let failure = frozen.reader.error { throw failed(failure) }
            return DataSnapshot(ref: ref, node: filtered, index: index, metadata: metadata)
        }
    }

    /// A read failure found outside the lock, told asynchronously (a frozen read may run under
    /// the lock, finishing an index rebuild).
    var readFailureHandler: @Sendable (DatabaseError) -> Void {
        { [self] e in DispatchQueue.global().async { self.withEngine { $0.failReading(e) } } }
    }

    /// Builds the child-value index that orders this query (``DatabaseOptions/indexes``) when
    /// it must be built, outside the lock from frozen data; it is installed unless the data
    /// changed at or above its location meanwhile (then the query reads without it).
    func buildIndexIfNeeded(for query: QuerySpec) throws {
        let onFailure = readFailureHandler
        let job = withEngine { e -> (ChildValueIndex, UInt64, FrozenData)? in
            guard e.stopReason == nil, let index = e.childIndex(for: query), e.isComplete(query.path) else { return nil }
            index.refresh()
            guard index.needsRebuild, !index.isRebuilding, let frozen = e.freeze(onFailure: onFailure) else { return nil }
            return (index, index.beginRebuild(), frozen)
        }
        guard let (index, token, frozen) = job else { return }
        try build(index, token: token, from: frozen)
    }

    /// Builds `index` (its rebuild begun under the lock, `token` its token) from `frozen`,
    /// outside the lock, and installs it unless a reset meanwhile (a change at or above its
    /// location) made it stale or the database stopped. A stale build is thrown away, and the
    /// index is built again if a listener uses it.
    func build(_ index: ChildValueIndex, token: UInt64, from frozen: FrozenData) throws {
        let built = ChildValueIndex.build(frozen, location: index.location, child: index.child)
        if let failure = frozen.reader.error {
            withEngine { e in
                index.cancelRebuild(token)
                e.failReading(failure)
            }
            throw failure
        }
        let again = withEngine { e -> Bool in
            guard e.stopReason == nil, let built else {
                index.cancelRebuild(token)
                return false
            }
            if index.finishRebuild(built.0, usable: built.usable, frozen: frozen, token: token) { return false }
            return e.takeIndexRebuildsDue()  // (stale: the reset's rebuild waited for this one)
        }
        if again { scheduleIndexRebuilds() }
    }

    /// Builds again, outside the lock, the indexes listeners use that an operation left
    /// needing it (``Engine/takeIndexRebuildsDue()``): else each of their window changes
    /// would look for the next child among all children, under the lock.
    func rebuildListenedIndexes() {
        let onFailure = readFailureHandler
        let job = withEngine { $0.beginScheduledRebuilds(onFailure: onFailure) }
        guard let (indexes, frozen) = job else { return }
        for (i, (index, token)) in indexes.enumerated() {
            do { try build(index, token: token, from: frozen) } catch {
                withEngine { _ in for (later, token) in indexes[(i + 1)...] { later.cancelRebuild(token) } }
                return
            }
        }
    }

    /// Schedules ``rebuildListenedIndexes()`` on a thread outside Swift's cooperative pool (it
    /// reads the log).
    func scheduleIndexRebuilds() {
        DispatchQueue.global().async { [weak self] in self?.rebuildListenedIndexes() }
    }
}

