@_spi(Server) import Ferry
import FerryTortureSupport

/// What the database must show, rebuilt from the workload's reports alone: the server's data
/// as a plain value tree, the pending local writes in id order, and the rejected writes kept
/// for the app. It shares no code with the engine (the layering rules are those of
/// `RandomizedModelTests`' model).
struct TortureModel: ValueTreeModel {
    enum Change: Equatable {
        case set(path: [String], value: Value)
        case update(path: [String], children: [String: Value])
    }

    struct Write {
        var id: Int64
        var change: Change
    }

    var server: Value = .null
    /// Pending writes, oldest (lowest id) first.
    var pending: [Write] = []
    var rejected: Set<Int64> = []

    var pendingIDs: [Int64] { pending.map(\.id) }

    mutating func addPending(_ w: Write) {
        let i = pending.firstIndex { $0.id > w.id } ?? pending.count
        pending.insert(w, at: i)
    }

    /// The server applies data: a put replaces the value at its path, a merge its children.
    mutating func serverPut(_ path: [String], _ value: Value) { server = Self.set(server, path[...], value) }

    mutating func serverMerge(_ path: [String], _ children: [String: Value]) {
        for (k, v) in children.sorted(by: { $0.key < $1.key }) {
            server = Self.set(server, (path + k.split(separator: "/").map(String.init))[...], v)
        }
    }

    /// The server answered every pending write through `through`, refusing `rejecting`. With no
    /// listener keeping a location up to date, an accepted write's value is the best knowledge
    /// of the server's data there: it goes into the server data, in write order.
    mutating func acknowledge(through: Int64, rejecting: Set<Int64>) {
        for w in pending where w.id <= through {
            if rejecting.contains(w.id) {
                rejected.insert(w.id)
                continue
            }
            switch w.change {
            case .set(let p, let v): serverPut(p, v)
            case .update(let p, let children): serverMerge(p, children)
            }
        }
        pending.removeAll { $0.id <= through }
    }

    /// Pending writes apply to the server data as the Realtime Database's client layers them:
    /// a write below an earlier pending write folds into it (in order); other writes are
    /// patches at their paths (a later one at or above a path replaces the earlier ones there).
    var visible: Value {
        var layers: [(path: [String], value: Value)] = []
        func add(_ path: [String], _ value: Value) {
            if let i = layers.firstIndex(where: { path.starts(with: $0.path) }) {
                layers[i].value = Self.set(layers[i].value, path.dropFirst(layers[i].path.count), value)
            } else {
                layers.removeAll { $0.path.starts(with: path) }
                layers.append((path, Self.normalized(value)))
            }
        }
        for w in pending {
            switch w.change {
            case .set(let p, let v): add(p, v)
            case .update(let p, let children):
                for (k, v) in children.sorted(by: { $0.key < $1.key }) { add(p + k.split(separator: "/").map(String.init), v) }
            }
        }
        return layers.reduce(server) { Self.set($0, $1.path[...], $1.value) }
    }
}

/// The workload's reports (see `TortureWorkload`) read into a model, with what was in doubt
/// when the reports stopped: each task's announced write and the server's announced operation.
struct Journal {
    enum ServerOp {
        case put([String], Value)
        case merge([String], [String: Value])
        case ack(through: Int64, rejecting: Set<Int64>)
        case clear
    }

    var model = TortureModel()
    /// Each task's write announced and not confirmed.
    var inDoubt: [Int: TortureModel.Change] = [:]
    /// Each task's last confirmed write id in this run (a task's writes get rising ids).
    var lastID: [Int: Int64] = [:]
    var server: ServerOp?
    /// Server data applied and returned, but not yet known durable: `applyServerPut` and
    /// `applyServerMerge` do not wait for their record (server data is a cache, fetched again if
    /// lost). Each becomes certain once a record appended after it is confirmed durable — an
    /// answer of the server, or a write announced after it returned — since the log keeps a
    /// prefix. The line each returned on, oldest first.
    var unsynced: [(op: ServerOp, line: Int)] = []
    /// The line each task's write in doubt was announced on.
    var announcedAt: [Int: Int] = [:]
    var line = 0
    var errors: [String] = []
    var confirmedWrites = 0, serverOperations = 0, checkpoints = 0, compactions = 0, deletedSegments = 0

    static func path(_ s: Substring) -> [String] { s.isEmpty ? [] : s.split(separator: "/").map(String.init) }

    static func value(_ s: Substring) -> Value? { try? Value(json: String(s)) }

    /// The unsynced server operations that returned before `line` are durable now.
    mutating func synced(before line: Int) {
        while let first = unsynced.first, first.line < line {
            Self.apply(first.op, to: &model)
            unsynced.removeFirst()
        }
    }

    mutating func take(_ line: String) {
        self.line += 1
        let f = line.split(separator: "\t", omittingEmptySubsequences: false)
        guard let tag = f.first else { return }
        switch tag {
        case "i" where f.count == 5:
            guard let t = Int(f[1]), let v = Self.value(f[4]) else { return errors.append("unreadable: \(line)") }
            announcedAt[t] = self.line
            if f[2] == "update", case .object(let children) = v {
                inDoubt[t] = .update(path: Self.path(f[3]), children: children)
            } else {
                inDoubt[t] = .set(path: Self.path(f[3]), value: v)
            }
        case "w" where f.count == 3:
            guard let t = Int(f[1]), let id = Int64(f[2]), let change = inDoubt.removeValue(forKey: t) else {
                return errors.append("a confirmation without its announcement: \(line)")
            }
            synced(before: announcedAt[t] ?? 0)
            model.addPending(.init(id: id, change: change))
            lastID[t] = id
            confirmedWrites += 1
        case "s":
            if f.count == 4, f[1] == "put", let v = Self.value(f[3]) {
                server = .put(Self.path(f[2]), v)
            } else if f.count == 4, f[1] == "merge", let v = Self.value(f[3]), case .object(let children) = v {
                server = .merge(Self.path(f[2]), children)
            } else if f.count == 4, f[1] == "ack", let through = Int64(f[2]) {
                server = .ack(through: through, rejecting: Set(f[3].split(separator: ",").compactMap { Int64($0) }))
            } else if f.count == 2, f[1] == "clear" {
                server = .clear
            } else {
                errors.append("unreadable: \(line)")
            }
        case "S":
            guard let op = server else { return errors.append("a server confirmation without its announcement") }
            switch op {
            case .put, .merge:
                unsynced.append((op, self.line))
            case .clear where model.rejected.isEmpty:
                break  // nothing to clear: no record
            case .ack, .clear:
                // Its record was appended after every earlier server operation, and waited for.
                synced(before: self.line)
                Self.apply(op, to: &model)
            }
            server = nil
            serverOperations += 1
        case "c": checkpoints += 1
        case "k":
            compactions += 1
            deletedSegments += f.count > 1 ? Int(f[1]) ?? 0 : 0
        case "e": errors.append(f.dropFirst().joined(separator: " "))
        default: break
        }
    }

    static func apply(_ op: ServerOp, to m: inout TortureModel) {
        switch op {
        case .put(let p, let v): m.serverPut(p, v)
        case .merge(let p, let c): m.serverMerge(p, c)
        case .ack(let through, let rejecting): m.acknowledge(through: through, rejecting: rejecting)
        case .clear: m.rejected.removeAll()
        }
    }

    /// Starts a new run: the doubts were settled by ``TortureChecker``.
    mutating func settle(_ model: TortureModel) {
        self.model = model
        inDoubt = [:]
        lastID = [:]
        server = nil
        unsynced = []
        announcedAt = [:]
    }
}
