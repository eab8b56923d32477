import Foundation
import Testing

/// The folders of `Sources/Ferry` show the architecture, lowest first: a file uses only types
/// declared in its own folder or in folders below it (values, their encoding, the views,
/// reading, the engine, its upkeep, the public API, the server seam, the tools). The check is by
/// type name; a function that a folder above adds to a type declared below is not seen by it.
@Suite struct FolderLayeringTests {
    static let order = ["Model", "Storage", "Core", "Reading", "Engine", "Maintenance", "API", "ServerSeam", "Tools"]

    static var sources: URL {
        URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent()
            .deletingLastPathComponent().appendingPathComponent("Sources/Ferry")
    }

    /// Every Swift file of each folder, its text without comments.
    func files() throws -> [(folder: String, name: String, text: String)] {
        var out: [(String, String, String)] = []
        for folder in Self.order {
            let dir = Self.sources.appendingPathComponent(folder)
            for name in try FileManager.default.contentsOfDirectory(atPath: dir.path) where name.hasSuffix(".swift") {
                let text = try String(contentsOf: dir.appendingPathComponent(name), encoding: .utf8)
                let code = text.split(separator: "\n", omittingEmptySubsequences: false).map { line -> Substring in
                    guard let r = line.range(of: "//") else { return line }
                    return line[..<r.lowerBound]
                }.joined(separator: "\n")
                out.append((folder, name, code))
            }
        }
        return out
    }

    @Test func noFolderUsesATypeDeclaredInAFolderAboveIt() throws {
        let files = try files()
        #expect(Set(files.map(\.folder)) == Set(Self.order), "every folder holds sources")
        let declaration = try Regex(#"(?m)^\s*(?:(?:public|package|internal|fileprivate|private|final|indirect|@\w+)\s+)*(?:class|struct|enum|protocol|actor|typealias)\s+(\w+)"#)
        var owners: [String: Set<String>] = [:]
        for f in files {
            for m in f.text.matches(of: declaration) {
                if let name = m.output[1].substring { owners[String(name), default: []].insert(f.folder) }
            }
        }
        let rank = Dictionary(uniqueKeysWithValues: Self.order.enumerated().map { ($1, $0) })
        var upward: [String] = []
        for f in files {
            let words = f.text.split { !($0.isLetter || $0.isNumber || $0 == "_") }
            for name in Set(words.map(String.init)) where name.first?.isUppercase == true {
                guard let folders = owners[name], folders.count == 1, let owner = folders.first,
                      rank[owner]! > rank[f.folder]! else { continue }
                upward.append("\(f.folder)/\(f.name) uses \(name) (\(owner))")
            }
        }
        #expect(upward.isEmpty, "\(upward.sorted().joined(separator: "\n"))")
        #expect(owners["Engine"] == ["Engine"] && owners["Database"] == ["API"], "the check finds the declarations it guards")
    }
}
