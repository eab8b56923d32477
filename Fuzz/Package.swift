// swift-tools-version: 6.1
// libFuzzer targets for Ferry's decoders. A separate package, so that a normal `swift build` or
// `swift test` of the main package never builds them. Build and run them with
// `scripts/fuzz.sh` (which passes `-sanitize=fuzzer,address` and `-parse-as-library`).
import PackageDescription

/// One executable per decoder; each defines `LLVMFuzzerTestOneInput` and links libFuzzer's main.
func fuzzTarget(_ name: String, _ products: [String]) -> Target {
    .executableTarget(
        name: name,
        dependencies: ["CFuzzerDriver"] + products.map { .product(name: $0, package: "Ferry") },
        path: "Sources/\(name)"
    )
}

let package = Package(
    name: "FerryFuzz",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(name: "Ferry", path: ".."),
    ],
    targets: [
        .target(name: "CFuzzerDriver"),
        fuzzTarget("fuzz-frame", ["FerryLog"]),
        fuzzTarget("fuzz-record", ["Ferry"]),
        fuzzTarget("fuzz-value", ["Ferry"]),
        fuzzTarget("fuzz-checkpoint", ["Ferry"]),
        fuzzTarget("fuzz-json", ["Ferry"]),
        // Writes the seed corpora (Corpus/) from a small store made through the public API.
        .executableTarget(name: "fuzz-seeds", dependencies: [.product(name: "Ferry", package: "Ferry"), .product(name: "FerryLog", package: "Ferry")]),
    ]
)
