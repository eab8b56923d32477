import CFuzzerDriver
@_spi(Fuzzing) import Ferry

/// Input: checkpoint blocks, each behind a 2-byte little-endian length (the side file's own
/// framing is checksummed, so the fuzzer is given the blocks the side-file reader hands over).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzCheckpoint(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    _ = try? FuzzEntryPoints.loadCheckpoint(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}

/// The entry point (SwiftPM points `main` here): libFuzzer's driver, with the callback above.
@_cdecl("fuzz_checkpoint_main")
public func fuzzMain(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> Int32 {
    var argc = argc, argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzCheckpoint(data, size) }
}
