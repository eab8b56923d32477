import Foundation

/// Where the package's files and built products are, found from this file's location and from
/// the running test binary, so tests work from any working directory and scratch path.
public enum Locations {
    /// The package root.
    public static let packageRoot: String = {
        var url = URL(fileURLWithPath: #filePath)
        for _ in 0..<3 { url.deleteLastPathComponent() }
        return url.path
    }()

    /// `Fixtures/` at the top of the package.
    public static func fixture(_ name: String) -> String { packageRoot + "/Fixtures/" + name }

    /// The directory holding the built executables (beside the test bundle).
    public static let productsDirectory: String = {
        var url = URL(fileURLWithPath: CommandLine.arguments[0]).resolvingSymlinksInPath()
        while url.path != "/" {
            url.deleteLastPathComponent()
            if FileManager.default.fileExists(atPath: url.appendingPathComponent("ferry-crash-child").path) { return url.path }
        }
        // swift-testing's runner on Linux: the binary is inside the products directory.
        return URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent().path
    }()

    public static func executable(_ name: String) -> String { productsDirectory + "/" + name }
}
