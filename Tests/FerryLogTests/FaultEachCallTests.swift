@_spi(Testing) import FerryLog
import FerryTestSupport
import Testing

/// The torture test: a fixed workload that appends, rolls, writes and removes side files and
/// deletes segments is run once to list the calls that change files it makes; then again for
/// each of those calls, with that one call failing (`EIO`; `ENOSPC` and a short write too for
/// writes). Each time the log must stop with an error naming the call, touch the disk no more,
/// and — the fault cleared — reopen strictly with every acknowledged record and side file.
@Suite struct FaultEachCallTests {
    /// What a run of the workload was told had succeeded before it stopped.
    struct Outcome {
        /// Records whose append returned (durable: the log runs in `.fsync` mode).
        var acknowledged: [(LSN, [UInt8])] = []
        /// Side files whose write returned, and their contents (nil: its removal returned).
        var sideFiles: [String: [UInt8]?] = [:]
        /// The side file being written or removed (nil contents) by a call that did not return.
        var unsettled: (name: String, contents: [UInt8]?)?
        /// The highest LSN a deletion was asked for (nothing below `.first` otherwise).
        var deletionAsked = LSN.first
        var error: LogError?
        /// The log, if the open succeeded.
        var log: WriteAheadLog?
    }

    static let storeID = StoreID(high: 0x0123_4567_89AB_CDEF, low: 0x0FED_CBA9_8765_4321)

    static func options(_ system: SystemCalls) -> LogOptions {
        var o = testOptions(.fsync, segmentSize: 4096)
        o.system = system
        o.newStoreID = storeID
        o.fixedCreationTime = 1_700_000_000_000_000_000
        return o
    }

    static func record(_ i: Int) -> [UInt8] { Payloads.random(700 + i, seed: UInt64(i)) }

    /// Appends, rolls (by itself and when asked), writes side files of both kinds, deletes
    /// segments, rewrites some forward, removes a side file and closes — until a step throws.
    static func workload(_ path: String, _ system: SystemCalls) async -> Outcome {
        var out = Outcome()
        do {
            let log = try WriteAheadLog.open(at: path, options: options(system))
            out.log = log
            func append(_ range: Range<Int>) async throws {
                for i in range {
                    var b = LogBatch()
                    b.append(kind: 1, payload: record(i))
                    let lsn = try await log.append(b).lowerBound
                    out.acknowledged.append((lsn, record(i)))
                }
            }
            func side(_ name: String, _ contents: [UInt8]?, _ step: () throws -> Void) throws {
                out.unsettled = (name, contents)
                try step()
                out.unsettled = nil
                out.sideFiles[name] = .some(contents)
            }
            try await append(0..<12)
            try await log.roll()
            let meta = Payloads.random(300, seed: 99)
            try side("meta", meta) { try log.writeSideFile(named: "meta", contents: meta) }
            let blocks = [Payloads.post(1), Payloads.random(2000, seed: 5)]
            try side("image", blocks.flatMap { $0 }) {
                try log.writeSideFile(named: "image") { w in for b in blocks { try b.withUnsafeBytes { try w.write($0) } } }
            }
            out.deletionAsked = log.segments[1].nextLSN
            try await log.deleteSegments(before: out.deletionAsked)
            try await append(12..<16)
            out.deletionAsked = log.segments[1].nextLSN
            _ = try await log.rewriteForward(before: out.deletionAsked) { r, batch in
                if r.lsn.rawValue % 2 == 0 { batch.append(kind: r.kind, payload: Array(r.payload)) }
            }
            try side("meta", nil) { try log.removeSideFiles(named: ["meta"]) }
            try await append(16..<18)
            try await log.close()
        } catch let e as LogError {
            out.error = e
        } catch {
            Issue.record("not a LogError: \(error)")
        }
        return out
    }

    /// The faults to try on one call.
    static func faults(for call: SystemCallRecorder.Call) -> [SystemCallRecorder.Fault] {
        switch call.kind {
        case .write, .pwrite: call.bytes > 1 ? [.errno(.EIO), .errno(.ENOSPC), .shortWrite] : [.errno(.EIO), .errno(.ENOSPC)]
        default: [.errno(.EIO)]
        }
    }

    @Test func everyCallThatChangesAFileFailedInTurnStopsTheLogAndLosesNothingAcknowledged() async throws {
        // The calls of a run without faults.
        let cleanDir = try TemporaryDirectory()
        let clean = SystemCallRecorder(store: cleanDir.path)
        let reference = await Self.workload(cleanDir.path, clean.system)
        #expect(reference.error == nil)
        let calls = clean.calls
        for kind in [SystemCallRecorder.Kind.write, .pwrite, .fsync, .fdatasync, .rename, .unlink, .ftruncate] {
            #expect(calls.contains { $0.kind == kind }, "the workload makes a \(kind) call")
        }
        #expect(try readStore(cleanDir).count >= 2, "the workload rolled")

        let runs = calls.enumerated().flatMap { k, call in Self.faults(for: call).map { (k, call, $0) } }
        #expect(runs.count > calls.count)
        // Four runs at a time: each spends most of its time waiting for fdatasync.
        try await withThrowingTaskGroup(of: Void.self) { group in
            for (n, (k, call, fault)) in runs.enumerated() {
                if n >= 4 { try await group.next() }
                group.addTask {
                    let what = "call \(k) of \(calls.count), \(call), failing with \(fault)"
                    let dir = try TemporaryDirectory()
                    let recorder = SystemCallRecorder(store: dir.path)
                    recorder.arm(.init(skip: k, fault: fault))
                    let run = await Self.workload(dir.path, recorder.system)
                    guard recorder.calls.prefix(k).map(\.description) == calls.prefix(k).map(\.description) else {
                        Issue.record("\(what): the workload is not deterministic")
                        return
                    }
                    try await Self.expectFailStop(run, call, fault, recorder, what)
                    try await Self.expectRecovered(dir, run, what)
                }
            }
            try await group.waitForAll()
        }
    }

    static func expectFailStop(_ run: Outcome, _ call: SystemCallRecorder.Call, _ fault: SystemCallRecorder.Fault,
                               _ recorder: SystemCallRecorder, _ what: String) async throws {
        guard let error = run.error else {
            Issue.record("\(what): the workload did not fail")
            return
        }
        // Opening fails with the call's error; a log that runs stops (`.failed`, the cause kept).
        let cause = run.log == nil ? error : error.cause as? LogError
        #expect(run.log == nil ? error.code == .io : error.code == .failed, "\(what): \(error)")
        #expect(cause?.message.contains(call.kind.rawValue) == true, "\(what): the error names the call: \(error)")
        switch fault {
        case .errno(let e): #expect(error.errno == e, "\(what): \(error)")
        case .shortWrite: #expect(error.errno == .ENOSPC, "\(what): \(error)")
        }
        #expect(recorder.callsAfterTheFault.isEmpty, "\(what): the disk was used after the failure: \(recorder.callsAfterTheFault)")
        if let log = run.log {
            #expect(log.failure?.code == .failed, "\(what)")
            await #expect(throws: LogError.self, "\(what)") { try await log.append({ var b = LogBatch(); b.append(kind: 1, payload: [1]); return b }()) }
            try? await log.close()
        }
    }

    static func expectRecovered(_ dir: TemporaryDirectory, _ run: Outcome, _ what: String) async throws {
        let log: WriteAheadLog
        do {
            log = try WriteAheadLog.open(at: dir.path, options: testOptions())  // strict
        } catch {
            Issue.record("\(what): a strict reopen failed: \(error)")
            return
        }
        #expect(log.firstLSN <= run.deletionAsked, "\(what): more was deleted than asked")
        let records = Dictionary(uniqueKeysWithValues: try log.records().map { ($0.lsn, $0.payload) })
        for (lsn, payload) in run.acknowledged where lsn >= log.firstLSN {
            #expect(records[lsn] == payload, "\(what): acknowledged LSN \(lsn) lost")
        }
        func read(_ name: String) throws -> [UInt8]? {
            name == "image" ? try readBlocks(log, name) : try log.readSideFile(named: name)
        }
        for (name, contents) in run.sideFiles where name != run.unsettled?.name {
            #expect(try read(name) == contents, "\(what): side file \(name) as acknowledged")
        }
        if let (name, contents) = run.unsettled {
            // Atomic: as it was before the call, or as the call would have left it.
            let before = run.sideFiles[name] ?? nil
            let found = try read(name)
            #expect(found == before || found == contents, "\(what): side file \(name) is whole or as it was")
        }
        try await log.close()
    }

    static func readBlocks(_ log: WriteAheadLog, _ name: String) throws -> [UInt8]? {
        var all: [UInt8] = []
        return try log.readSideFile(named: name, blocks: { all += $0 }) ? all : nil
    }
}
