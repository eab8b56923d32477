import CCRC32C
import FerryTestSupport
import Testing

@Suite struct CRC32CTests {
    /// The check values of RFC 3720 (iSCSI), appendix B.4, and the standard "123456789" check.
    static let checkValues: [(String, [UInt8], UInt32)] = [
        ("123456789", Array("123456789".utf8), 0xE306_9283),
        ("32 zeros", [UInt8](repeating: 0, count: 32), 0x8A91_36AA),
        ("32 x 0xFF", [UInt8](repeating: 0xFF, count: 32), 0x62A8_AB43),
        ("ascending", (0..<32).map { UInt8($0) }, 0x46DD_794E),
        ("descending", (0..<32).reversed().map { UInt8($0) }, 0x113F_DB5C),
        ("empty", [], 0),
    ]

    @Test(arguments: checkValues.indices)
    func dispatchedImplementationMatchesTheStandardCheckValues(_ i: Int) {
        let (_, bytes, expected) = Self.checkValues[i]
        #expect(ferry_crc32c(0, bytes, bytes.count) == expected)
    }

    @Test(arguments: checkValues.indices)
    func portableImplementationMatchesTheStandardCheckValues(_ i: Int) {
        let (_, bytes, expected) = Self.checkValues[i]
        #expect(ferry_crc32c_portable(0, bytes, bytes.count) == expected)
    }

    @Test func hardwarePathIsChosenOnCPUsThatHaveTheInstruction() {
        #if arch(x86_64) || arch(arm64)
        // Every x86-64 machine this project runs on has SSE4.2; ARM64 servers and Macs have CRC.
        #expect(ferry_crc32c_hardware_available() == 1)
        #endif
    }

    @Test func hardwareAndPortableAgreeAtEveryAlignmentAndLength() {
        let data = Payloads.random(4096 + 64, seed: 42)
        data.withUnsafeBytes { raw in
            for offset in 0..<16 {
                for length in [0, 1, 3, 7, 8, 9, 15, 16, 31, 32, 33, 63, 64, 65, 200, 1000, 4096] {
                    let p = raw.baseAddress! + offset
                    #expect(ferry_crc32c(0, p, length) == ferry_crc32c_portable(0, p, length), "offset \(offset) length \(length)")
                }
            }
        }
    }

    @Test func extendingACRCEqualsTheCRCOfTheConcatenation() {
        let a = Payloads.random(1000, seed: 1), b = Payloads.random(777, seed: 2)
        let whole = ferry_crc32c(0, a + b, a.count + b.count)
        #expect(ferry_crc32c(ferry_crc32c(0, a, a.count), b, b.count) == whole)
        #expect(ferry_crc32c_portable(ferry_crc32c_portable(0, a, a.count), b, b.count) == whole)
    }
}
