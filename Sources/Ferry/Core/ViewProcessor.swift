/// Applies an operation to a view's caches and collects the child changes it causes.
struct ViewProcessor {
    let filter: any NodeFilter

    func apply(_ operation: Operation, to old: ViewCache, writes: WriteTreeRef, completeCache: Node?) -> (ViewCache, [Change]) {
        let accumulator = ChildChangeAccumulator()
        let new: ViewCache
        switch operation {
        case .overwrite(let source, let path, let node):
            if source.fromUser {
                new = applyUserOverwrite(old, path, node, writes, completeCache, accumulator)
            } else {
                // Filter server data if it was tagged for this query, or if the server cache is
                // already filtered and this is not a full update (which may unfilter it).
                let filterServer = source.tagged || (old.serverCache.isFiltered && !path.isEmpty)
                new = applyServerOverwrite(old, path, node, writes, completeCache, filterServer, accumulator)
            }
        case .merge(let source, let path, let children):
            if source.fromUser {
                new = applyUserMerge(old, path, children, writes, completeCache, accumulator)
            } else {
                let filterServer = source.tagged || old.serverCache.isFiltered
                new = applyServerMerge(old, path, children, writes, completeCache, filterServer, accumulator)
            }
        case .ackUserWrite(let path, let affected, let revert):
            new = revert
                ? revertUserWrite(old, path, writes, completeCache, accumulator)
                : ackUserWrite(old, path, affected, writes, completeCache, accumulator)
        case .listenComplete(_, let path):
            new = listenComplete(old, path, writes, accumulator)
        }
        return (new, maybeAddValue(old: old, new: new, changes: accumulator.all))
    }

    func maybeAddValue(old: ViewCache, new: ViewCache, changes: [Change]) -> [Change] {
        let event = new.eventCache
        guard event.isFullyInitialized else { return changes }
        let isLeafOrEmpty = event.node.isLeaf || event.node.isEmpty
        if !changes.isEmpty || !old.eventCache.isFullyInitialized
            || (isLeafOrEmpty && event.node != old.completeEventSnap)
            || event.node.priority != (old.completeEventSnap?.priority ?? .empty)
        {
            return changes + [.value(event.node)]
        }
        return changes
    }

    private func generateEventCacheAfterServerEvent(_ viewCache: ViewCache, _ changePath: Path, _ writes: WriteTreeRef,
                                                    _ source: any CompleteChildSource, _ accumulator: ChildChangeAccumulator) -> ViewCache {
        let oldEvent = viewCache.eventCache
        if writes.shadowingWrite(changePath) != nil { return viewCache }  // a write shadows it: no change
        var newEvent: IndexedNode
        if changePath.isEmpty {
            precondition(viewCache.serverCache.isFullyInitialized, "a full server update needs complete server data")
            let withWrites: Node
            if viewCache.serverCache.isFiltered {
                // Apply writes to complete children only: deep writes on filtered data may be partial.
                let serverCache = viewCache.completeServerSnap ?? .empty
                let completeChildren: Node = serverCache.isLeaf ? .empty : serverCache
                withWrites = writes.calcCompleteEventChildren(completeChildren)
            } else {
                withWrites = writes.calcCompleteEventCache(viewCache.completeServerSnap) ?? .empty
            }
            newEvent = filter.updateFullNode(oldEvent.indexed, IndexedNode(withWrites, index: filter.index), accumulator: accumulator)
        } else {
            let childKey = changePath.front!
            if childKey == ".priority" {
                precondition(changePath.count == 1, "a priority path has one key")
                if let updated = writes.calcEventCacheAfterServerOverwrite(changePath, existingEventSnap: oldEvent.node, existingServerSnap: viewCache.serverCache.node) {
                    newEvent = filter.updatePriority(updated, oldEvent.indexed)
                } else {
                    newEvent = oldEvent.indexed
                }
            } else {
                let childChangePath = changePath.popFront
                let newChild: Node?
                if oldEvent.isComplete(forChild: childKey), Self.leafAbove(changePath, in: viewCache.serverCache.node),
                   let whole = writes.calcCompleteChild(childKey, serverCache: viewCache.serverCache) {
                    // The server's data above the change is a leaf, so nothing below it shows
                    // (a write below it, just acknowledged, had hidden it): the whole child
                    // again, not the old one with the change folded in — which took the
                    // removal below for a removal of the child when its last key went.
                    newChild = whole
                } else if oldEvent.isComplete(forChild: childKey) {
                    if let update = writes.calcEventCacheAfterServerOverwrite(changePath, existingEventSnap: oldEvent.node, existingServerSnap: viewCache.serverCache.node) {
                        newChild = oldEvent.node.getImmediateChild(childKey).updatingChild(childChangePath, update)
                    } else {
                        newChild = oldEvent.node.getImmediateChild(childKey)
                    }
                } else {
                    newChild = writes.calcCompleteChild(childKey, serverCache: viewCache.serverCache)
                }
                if let newChild {
                    newEvent = filter.updateChild(oldEvent.indexed, key: childKey, newChild: newChild, affectedPath: childChangePath, source: source, accumulator: accumulator)
                } else {
                    newEvent = oldEvent.indexed
                }
            }
        }
        return viewCache.updatingEventSnap(newEvent, complete: oldEvent.isFullyInitialized || changePath.isEmpty, filtered: filter.filtersNodes)
    }

    /// Whether `node` holds a leaf at a location strictly above `path` (below the root).
    static func leafAbove(_ path: Path, in node: Node) -> Bool {
        var n = node
        for key in path.keys.dropLast() {
            n = n.getImmediateChild(key)
            if n.isLeaf { return true }
            if n.isEmpty { return false }
        }
        return false
    }

    private func applyServerOverwrite(_ old: ViewCache, _ changePath: Path, _ changedSnap: Node, _ writes: WriteTreeRef,
                                      _ completeCache: Node?, _ filterServer: Bool, _ accumulator: ChildChangeAccumulator) -> ViewCache {
        let oldServer = old.serverCache
        let serverFilter: any NodeFilter = filterServer ? filter : filter.indexedFilter
        let newServer: IndexedNode
        if changePath.isEmpty {
            newServer = serverFilter.updateFullNode(oldServer.indexed, IndexedNode(changedSnap, index: serverFilter.index), accumulator: nil)
        } else if serverFilter.filtersNodes && !oldServer.isFiltered {
            // We want to filter the server node but have not yet: simulate a full update.
            let childKey = changePath.front!
            let newChild = oldServer.node.getImmediateChild(childKey).updatingChild(changePath.popFront, changedSnap)
            let indexed = oldServer.indexed.updatingChild(childKey, newChild)
            newServer = serverFilter.updateFullNode(oldServer.indexed, indexed, accumulator: nil)
        } else {
            let childKey = changePath.front!
            if !oldServer.isComplete(forPath: changePath) && changePath.count > 1 {
                return old  // an update for some other listener's incomplete data
            }
            let childChangePath = changePath.popFront
            let newChild = oldServer.node.getImmediateChild(childKey).updatingChild(childChangePath, changedSnap)
            if childKey == ".priority" {
                newServer = serverFilter.updatePriority(newChild, oldServer.indexed)
            } else {
                newServer = serverFilter.updateChild(oldServer.indexed, key: childKey, newChild: newChild, affectedPath: childChangePath,
                                                     source: NoCompleteChildSource(), accumulator: nil)
            }
        }
        let newCache = old.updatingServerSnap(newServer, complete: oldServer.isFullyInitialized || changePath.isEmpty, filtered: serverFilter.filtersNodes)
        let source = WriteTreeCompleteChildSource(writes: writes, viewCache: newCache, completeServerCache: completeCache)
        return generateEventCacheAfterServerEvent(newCache, changePath, writes, source, accumulator)
    }

    private func applyUserOverwrite(_ old: ViewCache, _ changePath: Path, _ changedSnap: Node, _ writes: WriteTreeRef,
                                    _ completeCache: Node?, _ accumulator: ChildChangeAccumulator) -> ViewCache {
        let oldEvent = old.eventCache
        let source = WriteTreeCompleteChildSource(writes: writes, viewCache: old, completeServerCache: completeCache)
        if changePath.isEmpty {
            let newEvent = filter.updateFullNode(oldEvent.indexed, IndexedNode(changedSnap, index: filter.index), accumulator: accumulator)
            return old.updatingEventSnap(newEvent, complete: true, filtered: filter.filtersNodes)
        }
        let childKey = changePath.front!
        if childKey == ".priority" {
            let newEvent = filter.updatePriority(changedSnap, oldEvent.indexed)
            return old.updatingEventSnap(newEvent, complete: oldEvent.isFullyInitialized, filtered: oldEvent.isFiltered)
        }
        let childChangePath = changePath.popFront
        let oldChild = oldEvent.node.getImmediateChild(childKey)
        let newChild: Node
        if childChangePath.isEmpty {
            newChild = changedSnap
        } else if let fromWrites = writes.calcCompleteChild(childKey, serverCache: serverCacheForChildren(old, completeCache)) {
            // The write tree (which holds this write) is the truth: folding the write into the
            // cached child differs when a null cancels an earlier write below a leaf.
            newChild = fromWrites
        } else if let child = source.completeChild(childKey) {
            if childChangePath.back == ".priority", child.getChild(childChangePath.parent!).isEmpty {
                newChild = child  // a priority on an empty node: the server will send it if it exists
            } else {
                newChild = child.updatingChild(childChangePath, changedSnap)
            }
        } else {
            newChild = .empty
        }
        guard oldChild != newChild else { return old }
        let newEvent = filter.updateChild(oldEvent.indexed, key: childKey, newChild: newChild, affectedPath: childChangePath, source: source, accumulator: accumulator)
        return old.updatingEventSnap(newEvent, complete: oldEvent.isFullyInitialized, filtered: filter.filtersNodes)
    }

    private func serverCacheForChildren(_ viewCache: ViewCache, _ completeCache: Node?) -> CacheNode {
        guard let completeCache else { return viewCache.serverCache }
        return CacheNode(indexed: IndexedNode(completeCache, index: .key), isFullyInitialized: true, isFiltered: false)
    }

    private func applyUserMerge(_ viewCache: ViewCache, _ path: Path, _ children: CompoundWrite, _ writes: WriteTreeRef,
                                _ completeCache: Node?, _ accumulator: ChildChangeAccumulator) -> ViewCache {
        // Children already in view first: in a limited window they may make room for others.
        var current = viewCache
        for pass in [true, false] {
            children.forEachWrite { relative, node in
                let writePath = path.child(relative)
                if viewCache.eventCache.isComplete(forChild: writePath.front!) == pass {
                    current = applyUserOverwrite(current, writePath, node, writes, completeCache, accumulator)
                }
            }
        }
        return current
    }

    private func applyServerMerge(_ viewCache: ViewCache, _ path: Path, _ children: CompoundWrite, _ writes: WriteTreeRef,
                                  _ completeCache: Node?, _ filterServer: Bool, _ accumulator: ChildChangeAccumulator) -> ViewCache {
        // No server data yet: the merge was meant for an earlier listen here; wait for the full update.
        if viewCache.serverCache.node.isEmpty && !viewCache.serverCache.isFullyInitialized { return viewCache }
        var current = viewCache
        let actual = path.isEmpty ? children : CompoundWrite.empty.addingCompoundWrite(children, at: path)
        let serverNode = viewCache.serverCache.node
        let childWrites = actual.childCompoundWrites
        // Many children of complete, unfiltered data: one pass over the location's children
        // (the children built in one go, the events found by comparing the old and new event
        // caches) instead of a pass per child — a stream resuming with 100 changes of a
        // 100,000-child location spent 6 ms per child.
        if childWrites.count >= 8, viewCache.serverCache.isFullyInitialized, !viewCache.serverCache.isFiltered,
           !filterServer, !filter.filtersNodes, !childWrites.contains(where: { $0.0 == ".priority" }) {
            let changes = childWrites.map { key, merge in (key, merge.apply(to: serverNode.getImmediateChild(key))) }
                .sorted { KeyOrder.compare($0.0, $1.0) < 0 }
            let newServer = serverNode.updatingImmediateChildren(changes)
            let newCache = viewCache.updatingServerSnap(IndexedNode(newServer, index: filter.index), complete: true, filtered: false)
            let oldEvent = viewCache.eventCache
            guard oldEvent.isFullyInitialized, !oldEvent.isFiltered, !oldEvent.node.isLeaf else {
                let source = WriteTreeCompleteChildSource(writes: writes, viewCache: newCache, completeServerCache: completeCache)
                return generateEventCacheAfterServerEvent(newCache, .root, writes, source, accumulator)
            }
            // Only the merged children can change what is shown: each again, from the writes
            // over the new server data.
            var eventChanges: [(String, Node)] = []
            for (key, _) in changes {
                let newChild = writes.calcCompleteChild(key, serverCache: newCache.serverCache) ?? .empty
                let oldChild = oldEvent.node.getImmediateChild(key)
                guard newChild != oldChild else { continue }
                if newChild.isEmpty {
                    accumulator.track(.removed(key, oldChild))
                } else if oldChild.isEmpty {
                    accumulator.track(.added(key, newChild))
                } else {
                    accumulator.track(.changed(key, newChild, old: oldChild))
                }
                eventChanges.append((key, newChild))
            }
            if eventChanges.isEmpty { return newCache }
            let newEvent = oldEvent.node.updatingImmediateChildren(eventChanges)
            return newCache.updatingEventSnap(IndexedNode(newEvent, index: filter.index), complete: true, filtered: filter.filtersNodes)
        }
        for (key, childMerge) in childWrites where serverNode.hasChild(key) {
            let newChild = childMerge.apply(to: serverNode.getImmediateChild(key))
            current = applyServerOverwrite(current, Path(keys: [key]), newChild, writes, completeCache, filterServer, accumulator)
        }
        for (key, childMerge) in childWrites where !serverNode.hasChild(key) {
            let unknownDeepMerge = !viewCache.serverCache.isComplete(forChild: key) && childMerge.rootWrite == nil
            if unknownDeepMerge { continue }
            let newChild = childMerge.apply(to: serverNode.getImmediateChild(key))
            current = applyServerOverwrite(current, Path(keys: [key]), newChild, writes, completeCache, filterServer, accumulator)
        }
        return current
    }

    private func ackUserWrite(_ viewCache: ViewCache, _ ackPath: Path, _ affected: ImmutableTree<Bool>, _ writes: WriteTreeRef,
                              _ completeCache: Node?, _ accumulator: ChildChangeAccumulator) -> ViewCache {
        // Another pending write determines the data here: recompute it from the writes. (When
        // that write is newer than the acknowledged one nothing changes; when it is older, the
        // acknowledged write had been layered over it and is no longer on top.)
        if writes.shadowingWrite(ackPath) != nil {
            return refreshFromWrites(viewCache, ackPath, writes, completeCache, accumulator)
        }
        let filterServer = viewCache.serverCache.isFiltered
        let serverCache = viewCache.serverCache
        if affected.value != nil {
            // An overwrite: re-apply the server data it shadowed.
            if (ackPath.isEmpty && serverCache.isFullyInitialized) || serverCache.isComplete(forPath: ackPath) {
                return applyServerOverwrite(viewCache, ackPath, serverCache.node.getChild(ackPath), writes, completeCache, filterServer, accumulator)
            }
            if ackPath.isEmpty {
                // Acked at this location without full data: re-apply what we have as a merge.
                var changed = CompoundWrite.empty
                serverCache.node.forEachChild { k, n in changed.addWrite(n, at: Path(keys: [k])) }
                return applyServerMerge(viewCache, ackPath, changed, writes, completeCache, filterServer, accumulator)
            }
            return viewCache
        }
        // A merge: re-apply the server data under each written path.
        var changed = CompoundWrite.empty
        affected.forEach { mergePath, _ in
            let serverCachePath = ackPath.child(mergePath)
            if serverCache.isComplete(forPath: serverCachePath) {
                changed.addWrite(serverCache.node.getChild(serverCachePath), at: mergePath)
            }
        }
        return applyServerMerge(viewCache, ackPath, changed, writes, completeCache, filterServer, accumulator)
    }

    /// A reverted write: recompute what it touched from the remaining writes and the server
    /// data. (Firebase returns early when some write shadows the path, assuming that write is
    /// newer; an older one, which the reverted write was layered over, must show again.)
    private func revertUserWrite(_ viewCache: ViewCache, _ path: Path, _ writes: WriteTreeRef, _ completeCache: Node?,
                                 _ accumulator: ChildChangeAccumulator) -> ViewCache {
        refreshFromWrites(viewCache, path, writes, completeCache, accumulator)
    }

    /// Recomputes the event cache's child at `path.front` (all of it for the root or a
    /// priority) from the writes and the server cache.
    private func refreshFromWrites(_ viewCache: ViewCache, _ path: Path, _ writes: WriteTreeRef, _ completeCache: Node?,
                                   _ accumulator: ChildChangeAccumulator) -> ViewCache {
        let source = WriteTreeCompleteChildSource(writes: writes, viewCache: viewCache, completeServerCache: completeCache)
        let oldEvent = viewCache.eventCache.indexed
        var newEvent: IndexedNode
        if path.isEmpty || path.front == ".priority" {
            let node: Node
            if viewCache.serverCache.isFullyInitialized {
                node = writes.calcCompleteEventCache(viewCache.completeServerSnap) ?? .empty
            } else {
                node = writes.calcCompleteEventChildren(viewCache.serverCache.node)
            }
            newEvent = filter.updateFullNode(oldEvent, IndexedNode(node, index: filter.index), accumulator: accumulator)
        } else {
            let childKey = path.front!
            var newChild = writes.calcCompleteChild(childKey, serverCache: viewCache.serverCache)
            if newChild == nil && viewCache.serverCache.isComplete(forChild: childKey) {
                newChild = oldEvent.node.getImmediateChild(childKey)
            }
            if let newChild {
                newEvent = filter.updateChild(oldEvent, key: childKey, newChild: newChild, affectedPath: path.popFront, source: source, accumulator: accumulator)
            } else if viewCache.eventCache.node.hasChild(childKey) {
                // No complete child available: delete the existing one.
                newEvent = filter.updateChild(oldEvent, key: childKey, newChild: .empty, affectedPath: path.popFront, source: source, accumulator: accumulator)
            } else {
                newEvent = oldEvent
            }
            if newEvent.node.isEmpty && viewCache.serverCache.isFullyInitialized {
                // All child writes may be reverted; the old data may have been a leaf.
                if let complete = writes.calcCompleteEventCache(viewCache.completeServerSnap), complete.isLeaf {
                    newEvent = filter.updateFullNode(newEvent, IndexedNode(complete), accumulator: accumulator)
                }
            }
        }
        let complete = viewCache.serverCache.isFullyInitialized || writes.shadowingWrite(.root) != nil
        return viewCache.updatingEventSnap(newEvent, complete: complete, filtered: filter.filtersNodes)
    }

    private func listenComplete(_ viewCache: ViewCache, _ path: Path, _ writes: WriteTreeRef, _ accumulator: ChildChangeAccumulator) -> ViewCache {
        let oldServer = viewCache.serverCache
        let newCache = viewCache.updatingServerSnap(oldServer.indexed, complete: oldServer.isFullyInitialized || path.isEmpty, filtered: oldServer.isFiltered)
        return generateEventCacheAfterServerEvent(newCache, path, writes, NoCompleteChildSource(), accumulator)
    }
}
