import Foundation

/// A fresh directory under the system's temporary directory, removed when the value goes away.
public final class TemporaryDirectory: Sendable {
    public let path: String

    public init(_ label: String = "ferry") throws {
        let base = ProcessInfo.processInfo.environment["TMPDIR"] ?? "/tmp"
        let path = base + "/\(label)-\(UUID().uuidString.prefix(12))"
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        self.path = path
    }

    /// A path inside the directory (not created).
    public func sub(_ name: String) -> String { path + "/" + name }

    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// Byte-level access to files, for tests that damage stores on purpose.
public enum Files {
    public static func read(_ path: String) throws -> [UInt8] {
        [UInt8](try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    public static func write(_ path: String, _ bytes: [UInt8]) throws {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
    }

    public static func size(_ path: String) throws -> Int {
        (try FileManager.default.attributesOfItem(atPath: path)[.size] as? NSNumber)?.intValue ?? 0
    }

    public static func list(_ directory: String) throws -> [String] {
        try FileManager.default.contentsOfDirectory(atPath: directory).sorted()
    }

    public static func exists(_ path: String) -> Bool { FileManager.default.fileExists(atPath: path) }

    public static func remove(_ path: String) throws { try FileManager.default.removeItem(atPath: path) }

    /// Copies a directory tree (fixtures are copied before a test opens them).
    public static func copyTree(_ from: String, to: String) throws {
        try FileManager.default.copyItem(atPath: from, toPath: to)
    }

    public static func truncate(_ path: String, to length: Int) throws {
        let h = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        try h.truncate(atOffset: UInt64(length))
        try h.close()
    }

    public static func flipBit(_ path: String, byte: Int, bit: Int) throws {
        var b = try read(path)
        b[byte] ^= UInt8(1 << bit)
        try write(path, b)
    }

    public static func append(_ path: String, _ bytes: [UInt8]) throws {
        let h = try FileHandle(forWritingTo: URL(fileURLWithPath: path))
        try h.seekToEnd()
        try h.write(contentsOf: bytes)
        try h.close()
    }

    /// Every regular file in a directory tree with its bytes, for "nothing was modified" checks.
    public static func snapshot(_ directory: String) throws -> [String: [UInt8]] {
        var out: [String: [UInt8]] = [:]
        let e = FileManager.default.enumerator(atPath: directory)
        while let rel = e?.nextObject() as? String {
            var isDir: ObjCBool = false
            let full = directory + "/" + rel
            if FileManager.default.fileExists(atPath: full, isDirectory: &isDir), !isDir.boolValue {
                out[rel] = try read(full)
            }
        }
        return out
    }
}
