@testable @_spi(Server) import Ferry

/// Checks a reopened store against the journal of what the workload reported before it died.
///
/// Must hold: every write confirmed durable is still pending (unless a confirmed answer of the
/// server removed it) or, once answered, shows as the server's echo made it; every confirmed
/// server operation shows; rejected writes are kept until a confirmed clear; and the view and
/// the server data equal the model's. What was in doubt — each task's announced, unconfirmed write and the
/// server's unconfirmed operation — may or may not have survived: the check tries each way
/// (a surviving write is recognised by the id it has in the store, and must be one a task
/// announced, with the same kind, path and value), and adopts the one the store matches.
enum TortureChecker {
    struct Mismatch: Error, CustomStringConvertible {
        var description: String
        /// Writes confirmed durable and pending that no outcome explains missing from the store.
        var lostWrites: Int
        /// No outcome shows the store's view / holds its server data.
        var viewDiffers: Bool, serverDiffers: Bool
    }

    /// Returns the model the store matches (doubts settled), or throws a ``Mismatch`` naming what
    /// differs from the model without the doubtful operations.
    static func check(_ db: Database, against journal: Journal) async throws -> TortureModel {
        let pending = db.pendingWriteIDs
        let rejected = try db.rejectedWrites().map(\.writeID).sorted()
        let view = try await db.root.getData().value
        // The server data too: two outcomes may show the same view when a pending write hides
        // where they differ, and adopting the wrong one would fail a later round.
        let server = db.engine.withLock { $0.server.completeNode(at: .root)?.value(export: true) }.map(TortureModel.normalized)
        let known = Set(journal.model.pendingIDs)
        let unknown = pending.filter { !known.contains($0) }

        // For each write the store has and no report confirmed: the tasks whose announced write it can be.
        var choices: [[Int]] = []
        for id in unknown {
            let record = db.engine.withLock { $0.writeTree.write(id) }
            let tasks = journal.inDoubt.keys.sorted().filter { t in
                (journal.lastID[t] ?? 0) < id && record.map { matches(journal.inDoubt[t]!, $0) } == true
            }
            choices.append(tasks)
        }
        var assignments: [[Int]] = []
        func assign(_ i: Int, _ taken: [Int]) {
            if i == unknown.count { assignments.append(taken); return }
            for t in choices[i] where !taken.contains(t) { assign(i + 1, taken + [t]) }
        }
        assign(0, [])

        for base in outcomes(of: journal) {
            for tasks in assignments {
                var m = base
                for (id, t) in zip(unknown, tasks) { m.addPending(.init(id: id, change: journal.inDoubt[t]!)) }
                if m.pendingIDs == pending && m.rejected.sorted() == rejected && m.visible == view && m.server == server { return m }
            }
        }

        let m = journal.model
        var why: [String] = []
        var fewestLost = Int.max, anyView = false, anyServer = false
        for base in outcomes(of: journal) {
            for tasks in assignments.isEmpty ? [[]] : assignments {
                var c = base
                for (id, t) in zip(unknown, tasks) { c.addPending(.init(id: id, change: journal.inDoubt[t]!)) }
                fewestLost = min(fewestLost, Set(c.pendingIDs).subtracting(pending).count)
                anyView = anyView || c.visible == view
                anyServer = anyServer || c.server == server
            }
        }
        for (i, base) in outcomes(of: journal).enumerated() {
            for tasks in assignments.prefix(3) {
                var c = base
                for (id, t) in zip(unknown, tasks) { c.addPending(.init(id: id, change: journal.inDoubt[t]!)) }
                why.append("outcome \(i) with \(tasks): pending \(c.pendingIDs == pending ? "same" : "differs"), rejected \(c.rejected.sorted() == rejected ? "same" : "differs"), server data \(c.server == server ? "same" : "\(c.server)"), view \(c.visible == view ? "same" : "\(c.visible)")")
            }
        }
        why.append("pending in the store: \(pending.suffix(12)); its server data: \(server.map(\.description) ?? "incomplete")")
        let lost = Set(m.pendingIDs).subtracting(pending)
        if !lost.isEmpty { why.append("confirmed pending writes missing: \(lost.sorted())") }
        if !unknown.isEmpty {
            why.append("writes no report confirmed: \(unknown) (candidates by task: \(choices); announced: \(journal.inDoubt))")
        }
        if m.rejected.sorted() != rejected { why.append("rejected writes \(rejected), the model \(m.rejected.sorted())") }
        if m.visible != view { why.append("the view \(view)\n    the model \(m.visible)") }
        if let op = journal.server { why.append("server operation in doubt: \(op)") }
        if !journal.unsynced.isEmpty { why.append("server operations not known durable: \(journal.unsynced.map(\.op))") }
        throw Mismatch(description: why.joined(separator: "\n    "), lostWrites: fewestLost, viewDiffers: !anyView, serverDiffers: !anyServer)
    }

    /// The states the operations in doubt may have left: any prefix of the server data not yet
    /// known durable; after all of it, the server operation in doubt not applied, applied, and
    /// for an answer with rejections, each rejection recorded in turn before the cursor (the
    /// database appends a record per rejection, then one for the cursor; a crash can fall
    /// between them).
    static func outcomes(of journal: Journal) -> [TortureModel] {
        // Server data not known durable: any prefix of it survived (the log keeps a prefix).
        var out = [journal.model]
        var model = journal.model
        for u in journal.unsynced {
            Journal.apply(u.op, to: &model)
            out.append(model)
        }
        // The operation in doubt came after all of them.
        guard let op = journal.server else { return out }
        if case .ack(_, let rejecting) = op {
            var m = model
            for id in rejecting.sorted() where m.pendingIDs.contains(id) {
                m.pending.removeAll { $0.id == id }
                m.rejected.insert(id)
                out.append(m)
            }
        }
        var applied = model
        Journal.apply(op, to: &applied)
        out.append(applied)
        return out
    }

    /// Whether the store's record of a write is the announced change.
    static func matches(_ change: TortureModel.Change, _ record: WriteRecord) -> Bool {
        switch (change, record.change) {
        case (.set(let path, let value), .overwrite(let node)):
            return path == record.path.keys && TortureModel.normalized(value) == TortureModel.normalized(node.value())
        case (.update(let path, let children), .merge(let write)):
            var written: [String: Value] = [:]
            write.forEachWrite { p, node in written[p.keys.joined(separator: "/")] = TortureModel.normalized(node.value()) }
            return path == record.path.keys && written == children.mapValues(TortureModel.normalized)
        default:
            return false
        }
    }
}
