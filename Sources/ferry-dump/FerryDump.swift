import ArgumentParser
@_spi(Tools) import Ferry
@_spi(Tools) import FerryDocuments
import FerryLog
import FerryStore
import Foundation

@main
struct FerryDump: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "ferry-dump",
        abstract: "Inspect a Ferry store. Read-only: takes no lock, changes nothing, and works while another process has the store open.",
        discussion: """
            Exit codes: 0 success (for verify: the store is sound); 1 verify found a torn tail, which an open \
            recovers by truncating it; 2 verify found corruption, which an open refuses (unless it salvages); \
            3 the store uses a format this build does not read; 4 the store could not be read (missing, unreadable); \
            5 the directory holds no Ferry store (no LOCK file, segment or log-start: empty, or unrelated files); \
            64 bad arguments.
            While a writer is appending, the frame it is writing may show as a torn tail.
            """,
        subcommands: [List.self, Records.self, Verify.self, Stats.self, At.self]
    )
}

enum ExitStatus {
    static let tornTail: Int32 = 1
    static let corruption: Int32 = 2
    static let unsupported: Int32 = 3
    static let unreadable: Int32 = 4
    static let noStore: Int32 = 5
}

struct StoreOptions: ParsableArguments {
    @Argument(help: "The store directory.")
    var directory: String

    @Flag(help: "Print JSON instead of text.")
    var json = false

    func inspect(deep: Bool) throws -> LogInspection {
        var isDirectory: ObjCBool = false
        guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
            printError("ferry-dump: \(directory) is not a directory")
            throw ExitCode(ExitStatus.unreadable)
        }
        do {
            guard try LogInspection.containsStore(at: directory) else {
                printError("ferry-dump: \(directory) holds no Ferry store (no LOCK file, segment or log-start)")
                throw ExitCode(ExitStatus.noStore)
            }
            return try LogInspection.inspect(directory, deep: deep)
        } catch let e as LogError {
            printError("ferry-dump: \(e)")
            throw ExitCode(e.code == .unsupportedFormat ? ExitStatus.unsupported : ExitStatus.unreadable)
        }
    }
}

func printError(_ s: String) {
    FileHandle.standardError.write(Data((s + "\n").utf8))
}

/// Prints one JSON value per line.
func printJSON(_ value: some Encodable) throws {
    let encoder = JSONEncoder()
    encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
    print(String(decoding: try encoder.encode(value), as: UTF8.self))
}

struct ProblemJSON: Encodable {
    var severity: String
    var recoverable: Bool
    var file: String
    var offset: Int64
    var message: String

    init(_ p: StoreProblem) {
        severity = p.severity.rawValue
        recoverable = p.severity == .tornTail
        file = p.file
        offset = p.offset
        message = p.message
    }
}

extension FerryDump {
    struct List: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "List the segments: LSN ranges, sizes, frames, sealed or not.")
        @OptionGroup var store: StoreOptions

        struct Row: Encodable {
            var name: String, seq: UInt64, firstLSN: UInt64, lastLSN: UInt64?, bytes: Int64, frames: Int, records: UInt64, sealed: Bool
            /// Of `bytes`, zeros after the last frame (space grown ahead of the writes; a crash leaves it).
            var zeroTail: Int64
        }

        func run() throws {
            let inspection = try store.inspect(deep: false)
            let rows = inspection.segments.map { s in
                Row(name: s.info.name, seq: s.info.seq, firstLSN: s.info.firstLSN.rawValue,
                    lastLSN: s.info.nextLSN > s.info.firstLSN ? s.info.nextLSN.rawValue - 1 : nil,
                    bytes: s.fileSize, frames: s.dataFrames, records: s.records, sealed: s.info.sealed, zeroTail: s.zeroTail)
            }
            if store.json {
                for r in rows { try printJSON(r) }
            } else {
                print(pad("segment", 38) + pad("first LSN", 12) + pad("last LSN", 12) + pad("bytes", 12) + pad("frames", 8) + pad("records", 10) + "sealed")
                for r in rows {
                    print(pad(r.name, 38) + pad("\(r.firstLSN)", 12) + pad(r.lastLSN.map(String.init) ?? "-", 12) + pad("\(r.bytes)", 12)
                          + pad("\(r.frames)", 8) + pad("\(r.records)", 10) + (r.sealed ? "yes" : "no")
                          + (r.zeroTail > 0 ? " (\(r.zeroTail) bytes of zeros grown ahead of the writes)" : ""))
                }
            }
            for p in inspection.problems { printError("ferry-dump: note: \(p)") }
        }
    }

    struct Records: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Print records with LSN, kind, size and payload: decoded for the database's records, hex otherwise.")
        @OptionGroup var store: StoreOptions
        @Option(help: "The first LSN to print.") var from: UInt64 = 1
        @Option(help: "The last LSN to print.") var to: UInt64?
        @Flag(help: "Print payloads as hex even when they can be decoded.") var hex = false

        struct Row: Encodable {
            var lsn: UInt64, kind: UInt8, size: Int, payload: String, decoded: String?
        }

        func run() throws {
            let inspection = try store.inspect(deep: false)
            // The store's own model describes its records (any model, for a store none claims).
            let describers = storeModel(inspection, directory: store.directory).map { [$0] } ?? recordModels
            do {
                try inspection.forEachRecord(from: LSN(from), through: to.map { LSN($0) }) { r in
                    let decoded = describers.lazy.compactMap { $0.describe(kind: r.kind, lsn: r.lsn.rawValue, payload: r.payload) }.first
                    if store.json {
                        try printJSON(Row(lsn: r.lsn.rawValue, kind: r.kind, size: r.payload.count, payload: hexString(r.payload), decoded: decoded))
                    } else {
                        let shown = (hex ? nil : decoded) ?? hexString(r.payload)
                        print("\(r.lsn)\tkind=\(r.kind)\tsize=\(r.payload.count)\t\(shown)")
                    }
                }
            } catch let e as LogError {
                printError("ferry-dump: stopped: \(e)")
                throw ExitCode(e.code == .corruption ? ExitStatus.corruption : ExitStatus.unreadable)
            }
            if let p = inspection.firstProblem { printError("ferry-dump: records end before: \(p)") }
        }
    }

    struct Verify: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Check every checksum, frame and record; exit 0 when the store is sound, else report the first problem.")
        @OptionGroup var store: StoreOptions

        struct Report: Encodable {
            var sound: Bool
            var segments: Int
            var records: UInt64
            var problem: ProblemJSON?
        }

        func run() throws {
            let inspection = try store.inspect(deep: true)
            let records = inspection.segments.map(\.records).reduce(UInt64(0), +)
            let problem = inspection.firstProblem
            if store.json {
                try printJSON(Report(sound: problem == nil, segments: inspection.segments.count, records: records, problem: problem.map(ProblemJSON.init)))
            } else if let p = problem {
                let what = switch p.severity {
                case .tornTail: "torn tail (recoverable: an open truncates it)"
                case .corruption: "corruption (an open refuses the store unless it salvages)"
                case .unsupported: "unsupported format (an open refuses the store)"
                }
                print("\(what) in \(p.file) at offset \(p.offset): \(p.message)")
            } else {
                print("sound: \(inspection.segments.count) segment(s), \(records) record(s)")
            }
            if let p = problem {
                let status: Int32 = switch p.severity {
                case .tornTail: ExitStatus.tornTail
                case .corruption: ExitStatus.corruption
                case .unsupported: ExitStatus.unsupported
                }
                throw ExitCode(status)
            }
        }
    }

    struct Stats: ParsableCommand {
        static let configuration = CommandConfiguration(abstract: "Records, bytes on disk and uncompressed, compression ratio, LSN range; the database's statistics (pending and rejected writes, cached paths, pins) from a replay of the log.")
        @OptionGroup var store: StoreOptions

        struct Report: Encodable {
            var segments: Int
            var records: UInt64
            var firstLSN: UInt64?
            var lastLSN: UInt64?
            var bytesOnDisk: Int64
            var segmentBytes: Int64
            var storedBodyBytes: Int64
            var uncompressedBodyBytes: Int64
            var compressionRatio: Double
            /// The database's sync cursor (nil for a store with no cursor record).
            var syncCursor: Int64?
            /// The database's statistics (as `Database.statistics`), from a replay of the log.
            var database: StoreStatistics?
            /// A document store's statistics, from a replay of the log.
            var documents: DocumentTools.Replayer.Statistics?
            /// A `ferry-server` Firestore database's records by kind, and its checkpoint.
            var serverDocuments: ServerDocumentStore?
        }

        func run() throws {
            let inspection = try store.inspect(deep: false)
            let stored = inspection.segments.map(\.storedBodyBytes).reduce(0, +)
            let raw = inspection.segments.map(\.rawBodyBytes).reduce(0, +)
            let segmentBytes = inspection.segments.map { $0.fileSize - $0.zeroTail }.reduce(0, +)  // (frames, as the database counts)
            var report = Report(
                segments: inspection.segments.count, records: inspection.segments.map(\.records).reduce(UInt64(0), +),
                firstLSN: inspection.firstLSN?.rawValue,
                lastLSN: inspection.nextLSN.flatMap { n in inspection.firstLSN.flatMap { n > $0 ? n.rawValue - 1 : nil } },
                bytesOnDisk: directoryBytes(store.directory), segmentBytes: segmentBytes,
                storedBodyBytes: stored, uncompressedBodyBytes: raw,
                compressionRatio: stored > 0 ? Double(raw) / Double(stored) : 1,
                syncCursor: (try? RecordDescription.syncCursor { body in
                    try inspection.forEachRecord { r in try body(r.kind, r.payload) }
                }) ?? nil)
            let model = storeModel(inspection, directory: store.directory)
            if model is ServerDocumentRecordModel {
                report.serverDocuments = try ServerDocumentStore(inspection, directory: store.directory)
            } else if model is DocumentRecordModel {
                let replayer = try DocumentTools.Replayer(directory: store.directory)
                do {
                    try inspection.forEachRecord { r in try replayer.apply(kind: r.kind, lsn: r.lsn.rawValue, payload: r.payload) }
                    report.documents = replayer.statistics
                } catch {
                    printError("ferry-dump: note: the document statistics are missing: the replay stopped: \(error)")
                }
            } else {
            let replayer = StateReplayer()
            do {
                try inspection.forEachRecord { r in try replayer.apply(kind: r.kind, lsn: r.lsn.rawValue, payload: r.payload) }
                let checkpoints = ((try? FileManager.default.contentsOfDirectory(atPath: store.directory)) ?? []).filter { $0.hasPrefix("checkpoint-") && $0.hasSuffix(".ckp") }
                let checkpointBytes = checkpoints.reduce(Int64(0)) { total, name in
                    total + (((try? FileManager.default.attributesOfItem(atPath: store.directory + "/" + name))?[.size] as? NSNumber)?.int64Value ?? 0)
                }
                report.database = replayer.statistics(segments: report.segments, segmentBytes: segmentBytes, checkpointBytes: checkpointBytes)
            } catch {
                printError("ferry-dump: note: the database's statistics are missing: the replay stopped: \(error)")
            }
            }
            if store.json {
                try printJSON(report)
            } else {
                print("segments:            \(report.segments)")
                print("records:             \(report.records)")
                print("LSN range:           \(report.firstLSN.map(String.init) ?? "-")...\(report.lastLSN.map(String.init) ?? "-")")
                print("bytes on disk:       \(report.bytesOnDisk) (segments \(report.segmentBytes))")
                print("record bytes:        \(report.uncompressedBodyBytes) uncompressed, \(report.storedBodyBytes) stored")
                print("compression ratio:   \(String(format: "%.2f", report.compressionRatio))x")
                print("sync cursor:         \(report.syncCursor.map { "writes up to \($0) answered by the server" } ?? "-")")
                if let d = report.serverDocuments {
                    print("store:               a ferry-server Firestore database (FORMAT.md, *Server document stores*)")
                    print("commits:             \(d.commits) in the log, \(d.clears) clears, \(d.refusals) refused batches")
                    print("checkpoint bytes:    \(d.checkpointBytes)")
                }
                if let d = report.documents {
                    print("documents:           \(d.documents) in \(d.collections) collections (\(d.deletedDocuments) known deleted)")
                    print("pending writes:      \(d.pendingWrites) in \(d.pendingBatches) batches")
                }
                if let d = report.database {
                    print("checkpoint bytes:    \(d.checkpointBytes) (segments + checkpoint: \(d.bytesOnDisk))")
                    print("pending writes:      \(d.pendingWrites), \(d.pendingWriteBytes) bytes" + (d.oldestPendingWriteAge.map { String(format: ", oldest %.0f s old", $0) } ?? ""))
                    print("rejected writes:     \(d.rejectedWrites)")
                    print("cached paths:        \(d.cachedPaths)")
                    print("pins (keepSynced):   \(d.pins.isEmpty ? "-" : d.pins.joined(separator: ", "))")
                }
            }
            for p in inspection.problems { printError("ferry-dump: note: \(p)") }
        }
    }
}

extension FerryDump {
    struct At: ParsableCommand {
        static let configuration = CommandConfiguration(
            abstract: "Rebuild the database's state at an LSN by replaying the log, and print it.",
            discussion: "Prints what a reader would see at the path (server data with pending writes), the server cache there, and the pending writes.")
        @OptionGroup var store: StoreOptions
        @Argument(help: "Replay records up to and including this LSN (default: all).") var lsn: UInt64?
        @Option(help: "The location to print.") var path = "/"

        struct Report: Encodable {
            var lsn: UInt64?
            var path: String
            var visible: String?
            var serverCache: String?
            var pendingWrites: [String]
            var syncCursor: Int64
            var rejectedWrites: [String]
        }

        func run() throws {
            let inspection = try store.inspect(deep: false)
            let model = storeModel(inspection, directory: store.directory)
            if let model, model is ServerDocumentRecordModel {
                throw ValidationError("\(store.directory) is \(model.name): `at` rebuilds the Realtime Database's and the document client's stores; `records` and `stats` read this one")
            }
            if model is DocumentRecordModel { return try documentsAt(inspection) }
            let replayer = StateReplayer()
            let last = try replay(inspection) { try replayer.apply(kind: $0.kind, lsn: $0.lsn.rawValue, payload: $0.payload) }
            let report = Report(lsn: last, path: path, visible: replayer.visible(at: path)?.json, serverCache: replayer.serverCache(at: path)?.json,
                                pendingWrites: replayer.pendingWrites.map { "\($0.id) \($0.path)" },
                                syncCursor: replayer.acknowledgedThrough,
                                rejectedWrites: ((try? replayer.rejectedWrites()) ?? []).map { "\($0.writeID) \($0.path) (\($0.status): \($0.message))" })
            if store.json {
                try printJSON(report)
            } else {
                print("state after LSN \(last.map(String.init) ?? "-") at \(path):")
                print("  visible:      \(report.visible ?? "(not complete: no server data or full local write covers it)")")
                print("  server cache: \(report.serverCache ?? "(not cached)")")
                print("  pending writes (\(report.pendingWrites.count)): \(report.pendingWrites.prefix(20).joined(separator: ", "))\(report.pendingWrites.count > 20 ? ", …" : "")")
                print("  sync cursor:  \(report.syncCursor) (writes up to it answered by the server)")
                if !report.rejectedWrites.isEmpty {
                    print("  rejected writes (\(report.rejectedWrites.count)): \(report.rejectedWrites.prefix(20).joined(separator: ", "))")
                }
            }
        }
    }
}

func pad(_ s: String, _ width: Int) -> String { s.count >= width ? s + " " : s + String(repeating: " ", count: width - s.count) }

func hexString(_ bytes: UnsafeRawBufferPointer) -> String {
    let digits = Array("0123456789abcdef".utf8)
    var out = [UInt8]()
    out.reserveCapacity(bytes.count * 2)
    for b in bytes {
        out.append(digits[Int(b >> 4)])
        out.append(digits[Int(b & 15)])
    }
    return String(decoding: out, as: UTF8.self)
}

func directoryBytes(_ path: String) -> Int64 {
    var total: Int64 = 0
    let e = FileManager.default.enumerator(atPath: path)
    while let rel = e?.nextObject() as? String {
        if let size = try? FileManager.default.attributesOfItem(atPath: path + "/" + rel)[.size] as? NSNumber { total += size.int64Value }
    }
    return total
}

/// The data models a store may hold, each describing its own records.
let recordModels: [any RecordModel] = [TreeRecordModel(), DocumentRecordModel(), ServerDocumentRecordModel()]

/// Whose store this is: the model its checkpoint marks, else the one whose kind its first
/// record is (nil: an empty store without a checkpoint, or one whose first record cannot be
/// read — the command that reads the records then reports the damage).
func storeModel(_ inspection: LogInspection, directory: String) -> (any RecordModel)? {
    let files = (try? FileManager.default.contentsOfDirectory(atPath: directory)) ?? []
    return RecordModels.identify(recordModels, sideFiles: files, firstKind: (try? firstRecordKind(inspection)) ?? nil)
}

/// A `ferry-server` Firestore database (FORMAT.md, *Server document stores*): what `stats`
/// says of it.
struct ServerDocumentStore: Encodable {
    var commits = 0
    var clears = 0
    var refusals = 0
    var checkpointBytes: Int64 = 0

    init(_ inspection: LogInspection, directory: String) throws {
        try inspection.forEachRecord { r in
            switch ServerDocumentRecord.Kind(rawValue: r.kind) {
            case .commit: commits += 1
            case .clear: clears += 1
            case .refusal: refusals += 1
            case nil: break
            }
        }
        checkpointBytes = ((try? FileManager.default.attributesOfItem(atPath: directory + "/" + ServerDocumentRecord.checkpointFileName))?[.size] as? NSNumber)?.int64Value ?? 0
    }
}

/// The kind of the store's first record (nil: none).
func firstRecordKind(_ inspection: LogInspection) throws -> UInt8? {
    var first: UInt8?
    do {
        try inspection.forEachRecord { r in
            first = r.kind
            throw StopWalk()
        }
    } catch is StopWalk {}
    return first
}

struct StopWalk: Error {}

extension FerryDump.At {
    /// Replays the records up to the LSN asked for through `apply`; returns the last one
    /// replayed. A record that cannot be replayed stops the command (exit 2).
    func replay(_ inspection: LogInspection, _ apply: (RecordView) throws -> Void) throws -> UInt64? {
        var last: UInt64?
        do {
            try inspection.forEachRecord(through: lsn.map { LSN($0) }) { r in
                try apply(r)
                last = r.lsn.rawValue
            }
        } catch {
            printError("ferry-dump: replay stopped: \(error)")
            throw ExitCode(ExitStatus.corruption)
        }
        return last
    }

    /// `at` for a document store: the document at `--path`, or a collection's documents.
    func documentsAt(_ inspection: LogInspection) throws {
        let replayer: DocumentTools.Replayer
        do { replayer = try DocumentTools.Replayer(directory: store.directory) } catch {
            printError("ferry-dump: the document checkpoint cannot be read: \(error)")
            throw ExitCode(ExitStatus.corruption)
        }
        let last = try replay(inspection) { try replayer.apply(kind: $0.kind, lsn: $0.lsn.rawValue, payload: $0.payload) }
        struct DocReport: Encodable { var lsn: UInt64?; var path: String; var document: String?; var documents: [String]?; var statistics: DocumentTools.Replayer.Statistics }
        let segments = path.split(separator: "/").count
        var report = DocReport(lsn: last, path: path, statistics: replayer.statistics)
        do {
            if segments % 2 == 0 && segments > 0 { report.document = try replayer.document(at: path) } else if segments > 0 { report.documents = try replayer.documents(in: path) }
        } catch {
            printError("ferry-dump: \(error)")
            throw ExitCode(64)
        }
        if store.json { return try printJSON(report) }
        print("document store after LSN \(last.map(String.init) ?? "-"): \(report.statistics.documents) documents, \(report.statistics.pendingWrites) pending writes")
        if let d = report.documents { print("  \(path): \(d.count) documents: \(d.prefix(50).joined(separator: ", "))\(d.count > 50 ? ", …" : "")") }
        if segments % 2 == 0 && segments > 0 { print("  \(path): \(report.document ?? "(not cached)")") }
    }
}
