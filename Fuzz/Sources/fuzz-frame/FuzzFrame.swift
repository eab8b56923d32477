#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif
import CFuzzerDriver
@_spi(Fuzzing) import FerryLog

/// A directory of this process's own for the segment file each input becomes: in memory
/// (/dev/shm) where there is one, so that the file system is not what the fuzzer measures.
let scratch: String = {
    let base = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp"
    var template = Array("\(base)/ferry-fuzz-frame-XXXXXX".utf8CString)
    guard let made = mkdtemp(&template) else { fatalError("mkdtemp failed: \(errno)") }
    return String(cString: made)
}()

/// Input: a flags byte (bit 0: put the checksums right, bit 1: newest segment, bit 2: salvage
/// scan), then the bytes of a segment file.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzFrame(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    do {
        _ = try LogFuzzEntryPoints.scanSegment(UnsafeRawBufferPointer(start: data, count: size), directory: scratch)
    } catch {
        fatalError("the scratch directory failed: \(error)")
    }
    return 0
}

/// The entry point (SwiftPM points `main` here): libFuzzer's driver, with the callback above.
@_cdecl("fuzz_frame_main")
public func fuzzMain(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> Int32 {
    var argc = argc, argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzFrame(data, size) }
}
