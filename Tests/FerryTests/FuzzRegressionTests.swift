import Foundation
import FerryTestSupport
import Testing

@_spi(Fuzzing) import Ferry

/// The inputs the fuzz targets (Fuzz/, scripts/fuzz.sh) crashed on, kept under
/// `Fixtures/fuzz/<target>/`: each is fed to the same entry point the target calls and must
/// come back as a clear error, not a trap. Named tests beside them state each bug's rule.
@Suite struct FuzzRegressionTests {
    static func inputs(_ target: String) -> [String] {
        let dir = Locations.fixture("fuzz/" + target)
        let names = (try? FileManager.default.contentsOfDirectory(atPath: dir)) ?? []
        return names.filter { !$0.hasPrefix(".") }.sorted().map { dir + "/" + $0 }
    }

    static func bytes(_ path: String) throws -> [UInt8] { [UInt8](try Data(contentsOf: URL(fileURLWithPath: path))) }

    @Test func everyDecoderHasItsRegressionInputs() {
        for target in ["fuzz-record", "fuzz-value", "fuzz-checkpoint"] {
            #expect(!Self.inputs(target).isEmpty, "no inputs under Fixtures/fuzz/\(target)")
        }
    }

    @Test(arguments: inputs("fuzz-record"))
    func aRecordTheFuzzerCrashedOnIsReportedAsDamage(_ path: String) throws {
        let input = try Self.bytes(path)
        let error = #expect(throws: DatabaseError.self) { try input.withUnsafeBytes { try FuzzEntryPoints.decodeRecord($0) } }
        #expect(error?.code == .storage)
    }

    @Test(arguments: inputs("fuzz-value"))
    func aValueTheFuzzerCrashedOnIsReportedAsDamage(_ path: String) throws {
        let input = try Self.bytes(path)
        let error = #expect(throws: DatabaseError.self) { try input.withUnsafeBytes { try FuzzEntryPoints.decodeValue($0) } }
        #expect(error?.code == .storage)
    }

    @Test(arguments: inputs("fuzz-checkpoint"))
    func aCheckpointTheFuzzerCrashedOnIsReportedAsDamage(_ path: String) throws {
        let input = try Self.bytes(path)
        let error = #expect(throws: DatabaseError.self) { try input.withUnsafeBytes { try FuzzEntryPoints.loadCheckpoint($0) } }
        #expect(error?.code == .storage)
    }

    /// A varint count (a string's length, a number of keys or children) above `Int.max` is
    /// damage; it used to trap converting to `Int`.
    @Test func aCountAboveIntMaxIsDamageNotATrap() throws {
        let huge: [UInt8] = [0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0xFF, 0x01]  // 2^64 - 1
        let children: [UInt8] = [6] + huge  // a value: children, then their count
        #expect(throws: DatabaseError.self) { try children.withUnsafeBytes { try FuzzEntryPoints.decodeValue($0) } }
        let serverPut: [UInt8] = [3] + huge  // a record: server put, then its path's key count
        #expect(throws: DatabaseError.self) { try serverPut.withUnsafeBytes { try FuzzEntryPoints.decodeRecord($0) } }
    }

    /// Only finite numbers are written, so a stored NaN or infinity is damage; a NaN used to be
    /// decoded into a node that is not equal to itself.
    @Test func aStoredNumberThatIsNotFiniteIsDamage() throws {
        for bits in [Double.nan.bitPattern, Double.infinity.bitPattern, (-Double.infinity).bitPattern] {
            for tag: UInt8 in [4, 9] {  // a double, an increment by a double
                let value = [tag] + withUnsafeBytes(of: bits.littleEndian) { Array($0) }
                #expect(throws: DatabaseError.self) { try value.withUnsafeBytes { try FuzzEntryPoints.decodeValue($0) } }
            }
        }
        let finite = [UInt8(4)] + withUnsafeBytes(of: (2.5).bitPattern.littleEndian) { Array($0) }
        #expect(try finite.withUnsafeBytes { try FuzzEntryPoints.decodeValue($0) } == 1)
    }

    /// The JSON both ways the API takes it agrees on what it accepts and what it stores.
    @Test func bothJSONEncodersAgreeOnTheSeeds() throws {
        let dir = Locations.packageRoot + "/Fuzz/Corpus/fuzz-json"
        let names = try FileManager.default.contentsOfDirectory(atPath: dir)
        #expect(!names.isEmpty)
        for name in names {
            let text = try Self.bytes(dir + "/" + name)
            _ = try? FuzzEntryPoints.parseJSON(text)  // a disagreement stops the process
        }
        #expect(try FuzzEntryPoints.parseJSON(Array(#"{"b":1,"a":[true]}"#.utf8)).count > 0)
        #expect(throws: DatabaseError.self) { try FuzzEntryPoints.parseJSON(Array(#"{"a":1,"a":2}"#.utf8)) }
    }
}
