import CFuzzerDriver
@_spi(Fuzzing) import Ferry

/// Input: JSON text, as `setValue(jsonBytes:)` and `Value(jsonBytes:)` take it.
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzJSON(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    _ = try? FuzzEntryPoints.parseJSON(Array(UnsafeBufferPointer(start: data, count: size)))
    return 0
}

/// The entry point (SwiftPM points `main` here): libFuzzer's driver, with the callback above.
@_cdecl("fuzz_json_main")
public func fuzzMain(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> Int32 {
    var argc = argc, argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzJSON(data, size) }
}
