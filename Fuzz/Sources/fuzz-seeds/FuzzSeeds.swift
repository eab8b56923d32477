#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
@_spi(Fuzzing) @_spi(Server) import Ferry
@_spi(Fuzzing) import FerryLog

/// Writes the seed corpora of the fuzz targets into the directory given (`Corpus/`): a small
/// store is made through the public API (local sets and updates, server data, an
/// acknowledgement, a checkpoint), and its segment files, records, checkpoint blocks, and the
/// values and JSON it was made from become one seed each.
@main
struct FuzzSeeds {
    static let json: [String] = [
        #"null"#, #"true"#, #"false"#, #"0"#, #"-42"#, #"9007199254740993"#, #"3.25"#, #"-1e300"#,
        #""text""#, #""esc\"aped\u00e9\ud83d\ude00""#, #"[1,2,null,3]"#, #"{"a":1,"b":{"c":[true,"x"]}}"#,
        #"{"z":1,"10":2,"9":3,"-1":4,"a":null}"#, #"{".priority":5,"x":"y"}"#, #"{".value":3,".priority":"p"}"#,
        #"{"t":{".sv":"timestamp"}}"#, #"{"n":{".sv":{"increment":2}}}"#, #"{"n":{".sv":{"increment":1.5}}}"#,
        #"{"a":{}}"#, #"{"a":[]}"#, #" { "spaced" : [ 1 , 2 ] } "#,
    ]

    static func main() async throws {
        guard CommandLine.arguments.count == 2 else {
            print("usage: fuzz-seeds CORPUS_DIR")
            exit(2)
        }
        let corpus = CommandLine.arguments[1]
        var template = Array("/tmp/ferry-fuzz-seeds-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { fatalError("mkdtemp failed") }
        let store = String(cString: made) + "/store"

        var n = 0
        func seed(_ target: String, _ bytes: [UInt8]) {
            let dir = corpus + "/" + target
            mkdir(corpus, 0o755)
            mkdir(dir, 0o755)
            n += 1
            let path = dir + "/seed-\(n)"
            let fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
            guard fd >= 0, bytes.withUnsafeBytes({ write(fd, $0.baseAddress, $0.count) }) == bytes.count else {
                fatalError("cannot write \(path)")
            }
            close(fd)
        }

        for text in json {
            seed("fuzz-json", Array(text.utf8))
            if let stored = try? FuzzEntryPoints.parseJSON(Array(text.utf8)) { seed("fuzz-value", stored) }
        }

        let db = try Database.open(at: store)
        let root = try db.reference("")
        let first = try await root.child("users/alice").setValue(json: #"{"name":"Alice","age":30,"tags":["a","b"]}"#)
        let second = try await root.child("users/bob").setValue(.object(["name": .string("Bob"), "score": .double(1.5)]), andPriority: .int(2))
        _ = try await root.child("users").updateChildValues(["carol/name": .string("Carol"), "dave": .null])
        _ = try await root.child("counters/hits").setValue(json: #"{".sv":{"increment":1}}"#)
        _ = try await root.child("stamp").setValue(json: #"{".sv":"timestamp"}"#)
        try await db.applyServerPut(at: "rooms/1", .object(["title": .string("one"), "n": .int(1)]))
        try await db.applyServerMerge(at: "rooms", ["2/title": .string("two")])
        try await db.acknowledgeWrite(first.writeID!)
        try await db.acknowledgeWrites(through: second.writeID!, rejecting: [WriteRejection(writeID: second.writeID!, status: 401, message: "denied")])
        try await db.clearRejectedWrites()
        try await db.checkpoint()
        _ = try await root.child("after").setValue(.bool(true))
        try await db.close()

        let log = try WriteAheadLog.open(at: store)
        for record in try log.records() {
            seed("fuzz-record", [record.kind] + record.payload)
        }
        for name in try log.sideFiles(withPrefix: "checkpoint-") {
            var framed: [UInt8] = []
            try log.readSideFile(named: name) { block in
                let count = min(block.count, 0xFFFF)
                framed += [UInt8(count & 0xFF), UInt8(count >> 8)]
                framed += block.prefix(count)
            }
            seed("fuzz-checkpoint", framed)
        }
        try await log.close()

        for name in try listDirectory(store) where name.hasSuffix(".wal") {
            let bytes = try readFile(store + "/" + name)
            seed("fuzz-frame", [0] + bytes)  // as written
            seed("fuzz-frame", [LogFuzzEntryPoints.fixChecksums | LogFuzzEntryPoints.newest | LogFuzzEntryPoints.resync] + bytes)
        }
        print("wrote \(n) seeds under \(corpus)")
    }

    static func listDirectory(_ path: String) throws -> [String] {
        guard let d = opendir(path) else { fatalError("cannot list \(path)") }
        defer { closedir(d) }
        var names: [String] = []
        while let e = readdir(d) {
            let name = withUnsafeBytes(of: e.pointee.d_name) { String(cString: $0.bindMemory(to: CChar.self).baseAddress!) }
            if name != "." && name != ".." { names.append(name) }
        }
        return names.sorted()
    }

    static func readFile(_ path: String) throws -> [UInt8] {
        let fd = open(path, O_RDONLY)
        guard fd >= 0 else { fatalError("cannot read \(path)") }
        defer { close(fd) }
        var out: [UInt8] = []
        var buffer = [UInt8](repeating: 0, count: 65536)
        while true {
            let got = buffer.withUnsafeMutableBytes { read(fd, $0.baseAddress, $0.count) }
            if got <= 0 { break }
            out += buffer[0..<got]
        }
        return out
    }
}

/// Not a fuzz target: it is built with the same flags as the targets, and the fuzzer runtime
/// linked into every executable of this package asks for this symbol.
@_cdecl("LLVMFuzzerTestOneInput")
public func notAFuzzTarget(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 { 0 }
