import CFuzzerDriver
@_spi(Fuzzing) import Ferry

/// Input: the bytes of one stored value (ValueCodec's form).
@_cdecl("LLVMFuzzerTestOneInput")
public func fuzzValue(_ data: UnsafePointer<UInt8>?, _ size: Int) -> Int32 {
    _ = try? FuzzEntryPoints.decodeValue(UnsafeRawBufferPointer(start: data, count: size))
    return 0
}

/// The entry point (SwiftPM points `main` here): libFuzzer's driver, with the callback above.
@_cdecl("fuzz_value_main")
public func fuzzMain(_ argc: Int32, _ argv: UnsafeMutablePointer<UnsafeMutablePointer<CChar>?>?) -> Int32 {
    var argc = argc, argv = argv
    return LLVMFuzzerRunDriver(&argc, &argv) { data, size in fuzzValue(data, size) }
}
