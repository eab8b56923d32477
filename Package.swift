// swift-tools-version: 6.1
import PackageDescription

let package = Package(
    name: "Ferry",
    platforms: [.macOS(.v15)],
    products: [
        .library(name: "Ferry", targets: ["Ferry"]),
        .library(name: "FerryLog", targets: ["FerryLog"]),
        .library(name: "FerryDocuments", targets: ["FerryDocuments"]),
        .library(name: "FerryDocumentsSync", targets: ["FerryDocumentsSync"]),
        .executable(name: "ferry-dump", targets: ["ferry-dump"]),
        .executable(name: "ferry-bench", targets: ["ferry-bench"]),
        .executable(name: "ferry-demo", targets: ["ferry-demo"]),
        .library(name: "FerryWire", targets: ["FerryWire"]),
        .library(name: "FerryServer", targets: ["FerryServer"]),
        .executable(name: "ferry-server", targets: ["ferry-server"]),
        .library(name: "FerrySync", targets: ["FerrySync"]),
        .executable(name: "ferry-sync-demo", targets: ["ferry-sync-demo"]),
    ],
    dependencies: [
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-log", from: "1.16.2"),
        .package(url: "https://github.com/swift-server/async-http-client", from: "1.37.0"),
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.3"),
        .package(url: "https://github.com/apple/swift-protobuf", from: "1.39.0"),
        .package(url: "https://github.com/grpc/grpc-swift-2", from: "2.4.3"),
        .package(url: "https://github.com/grpc/grpc-swift-protobuf", from: "2.4.1"),
        .package(url: "https://github.com/grpc/grpc-swift-nio-transport", from: "2.9.2"),
        .package(url: "https://github.com/vapor/jwt-kit", from: "5.7.1"),
        .package(url: "https://github.com/apple/swift-crypto", from: "4.5.2"),
        .package(url: "https://github.com/apple/swift-nio-ssl", from: "2.37.6"),
        .package(url: "https://github.com/apple/swift-certificates", from: "1.21.1"),
        .package(url: "https://github.com/apple/swift-asn1", from: "1.7.4"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
    ],
    targets: [
        // C shims: bytes only, not API.
        .systemLibrary(
            name: "CLZ4",
            pkgConfig: "liblz4",
            providers: [.apt(["liblz4-dev"]), .brew(["lz4"])]
        ),
        .target(name: "CCRC32C"),
        .target(name: "CFileSpace"),

        // The write-ahead log: segments, frames, records, LSNs, fsync, recovery.
        .target(
            name: "FerryLog",
            dependencies: [
                "CLZ4", "CCRC32C", "CFileSpace",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        // What every data model on the log shares: the record store, the pending-write ledger,
        // the upkeep's owner, snapshot metadata.
        .target(name: "FerryStore", dependencies: ["FerryLog"]),

        // The database: the Realtime Database data model on the log.
        .target(
            name: "Ferry",
            dependencies: [
                "FerryLog", "FerryStore",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        // Documents: Cloud Firestore's data model on the same log and layer.
        .target(name: "FerryDocuments", dependencies: ["FerryLog", "FerryStore", "CCRC32C", "CLZ4"]),

        .executableTarget(
            name: "ferry-dump",
            dependencies: [
                "FerryLog", "FerryStore", "Ferry", "FerryDocuments",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ]
        ),

        .executableTarget(name: "ferry-demo", dependencies: ["Ferry", "FerryLog"]),

        // Cloud Firestore's v1 API: messages generated from firestore.proto (committed), the
        // service's stubs, and their translation to and from the document model's values.
        .target(
            name: "FerryFirestoreWire",
            dependencies: [
                "FerryDocuments",
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCProtobuf", package: "grpc-swift-protobuf"),
            ],
            exclude: ["firestore.proto", "README.md"]
        ),

        // The document model connected to a server over Firestore's gRPC API.
        .target(
            name: "FerryDocumentsSync",
            dependencies: [
                "FerryDocuments", "FerryFirestoreWire", "FerryLog",
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2", package: "grpc-swift-nio-transport"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        // Sync: what client and server share (no networking), the server, its executable.
        .target(name: "FerryWire", dependencies: ["Ferry"], exclude: ["PROTOCOL.md"]),
        .target(
            name: "FerryServer",
            dependencies: [
                "Ferry", "FerryLog", "FerryWire", "FerryDocuments", "FerryFirestoreWire",
                .product(name: "Logging", package: "swift-log"),
                .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2", package: "grpc-swift-nio-transport"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOPosix", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "JWTKit", package: "jwt-kit"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
            ]
        ),
        // The client side of sync: a Database connected to a server (networking lives here, not in Ferry).
        .target(
            name: "FerrySync",
            dependencies: [
                "Ferry", "FerryWire", "FerryLog",
                .product(name: "AsyncHTTPClient", package: "async-http-client"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "NIOSSL", package: "swift-nio-ssl"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
        // The client of the README's first command (scripts/sync-story.sh).
        .executableTarget(name: "ferry-sync-demo", dependencies: ["Ferry", "FerrySync"]),
        .executableTarget(
            name: "ferry-server",
            dependencies: [
                "FerryServer",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Logging", package: "swift-log"),
            ]
        ),

        // Peers for the bench only; the libraries never link them.
        .systemLibrary(name: "CLevelDB", path: "Benchmarks/CLevelDB", providers: [.apt(["libleveldb-dev"])]),
        .systemLibrary(name: "CSQLite", path: "Benchmarks/CSQLite", pkgConfig: "sqlite3", providers: [.apt(["libsqlite3-dev"])]),
        .executableTarget(
            name: "ferry-bench",
            dependencies: [
                "Ferry", "FerryLog", "CLZ4", "CCRC32C", "CLevelDB", "CSQLite", "FerrySync", "FerryDocuments",
                "FerryDocumentsSync", "FerryFirestoreWire",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "GRPCCore", package: "grpc-swift-2"),
                .product(name: "GRPCNIOTransportHTTP2", package: "grpc-swift-nio-transport"),
                .product(name: "Logging", package: "swift-log"),
            ],
            path: "Benchmarks/ferry-bench"
        ),

        // Tests
        .target(
            name: "FerryTestSupport",
            dependencies: ["FerryLog"],
            path: "Tests/FerryTestSupport"
        ),
        .executableTarget(
            name: "ferry-crash-child",
            dependencies: ["FerryLog", "FerryTestSupport"],
            path: "Tests/ferry-crash-child"
        ),
        .executableTarget(
            name: "ferry-space-child",
            dependencies: ["Ferry", .product(name: "Logging", package: "swift-log")],
            path: "Tests/ferry-space-child"
        ),
        .executableTarget(
            name: "ferry-fixtures",
            dependencies: ["FerryLog", "FerryTestSupport"],
            path: "Tests/ferry-fixtures"
        ),
        .testTarget(
            name: "FerryTests",
            dependencies: ["Ferry", "FerryLog", "CLZ4", "CCRC32C", "FerryTestSupport", "FerryTortureSupport", "ferry-dump", "ferry-demo", "ferry-space-child"],
            exclude: ["Conformance"]
        ),
        // The torture harness: a random database workload killed and power-cut at random.
        .target(
            name: "FerryTortureSupport",
            dependencies: ["Ferry", "FerryTestSupport"],
            path: "Tests/FerryTortureSupport"
        ),
        .executableTarget(
            name: "ferry-torture-child",
            dependencies: ["Ferry", "FerryTortureSupport"],
            path: "Tests/ferry-torture-child"
        ),
        .testTarget(
            name: "FerryDocumentsTests",
            dependencies: ["FerryDocuments", "FerryLog", "FerryTestSupport", "Ferry", "ferry-dump"],
            exclude: ["Conformance"]
        ),
        .testTarget(
            name: "FerryTortureTests",
            dependencies: ["Ferry", "FerryLog", "FerryTestSupport", "FerryTortureSupport", "ferry-torture-child"]
        ),
        .executableTarget(
            name: "ferry-hostile-child",
            dependencies: ["Ferry", "FerryLog", "FerryTestSupport"],
            path: "Tests/ferry-hostile-child"
        ),
        .executableTarget(
            name: "ferry-sync-child",
            dependencies: ["Ferry", "FerrySync", .product(name: "Logging", package: "swift-log")],
            path: "Tests/ferry-sync-child"
        ),
        .executableTarget(
            name: "ferry-documents-child",
            dependencies: ["FerryDocuments", "FerryDocumentsSync", .product(name: "Logging", package: "swift-log")],
            path: "Tests/ferry-documents-child"
        ),
        .testTarget(
            name: "FerryServerTests",
            dependencies: ["Ferry", "FerryWire", "FerrySync", "FerryServer", "FerryTestSupport", "ferry-server", "ferry-dump", "ferry-sync-child", "ferry-sync-demo", "ferry-hostile-child",
                           "FerryDocuments", "FerryDocumentsSync", "ferry-documents-child", "FerryFirestoreWire",
                           .product(name: "GRPCCore", package: "grpc-swift-2"),
                           .product(name: "GRPCNIOTransportHTTP2", package: "grpc-swift-nio-transport"),
                           .product(name: "SwiftProtobuf", package: "swift-protobuf"),
                           .product(name: "JWTKit", package: "jwt-kit"),
                           .product(name: "CryptoExtras", package: "swift-crypto"),
                           .product(name: "X509", package: "swift-certificates"),
                           .product(name: "SwiftASN1", package: "swift-asn1"),
                           .product(name: "Crypto", package: "swift-crypto"),
                           .product(name: "AsyncHTTPClient", package: "async-http-client"),
                           .product(name: "NIOSSL", package: "swift-nio-ssl")]
        ),
        .testTarget(
            name: "FerryLogTests",
            dependencies: [
                "FerryLog", "CCRC32C", "FerryTestSupport", "ferry-crash-child", "ferry-dump",
                .product(name: "Logging", package: "swift-log"),
            ]
        ),
    ]
)
