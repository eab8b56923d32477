import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable import FerryDocuments

/// Snapshots a listener received, in order, with a way to wait for the next ones.
final class Snapshots<S: Sendable>: Sendable {
    private let state = FerryMutex<(items: [S], errors: [String])>(([], []))
    var items: [S] { state.withLock { $0.items } }
    var errors: [String] { state.withLock { $0.errors } }
    func add(_ s: S?, _ e: (any Error)?) {
        state.withLock { st in
            if let s { st.items.append(s) }
            if let e { st.errors.append("\(e)") }
        }
    }
    /// Waits until `n` snapshots arrived; returns them all.
    func wait(for n: Int) async throws -> [S] {
        let ok = await eventually { items.count >= n || !errors.isEmpty }
        try #require(ok && errors.isEmpty, "waited for \(n) snapshots, have \(items.count); errors: \(errors)")
        return items
    }
}

/// A fresh store in a temporary directory.
struct Store {
    let dir: TemporaryDirectory
    var path: String { dir.sub("docs") }
    init() throws { dir = try TemporaryDirectory("ferry-docs") }
    func open() throws -> Firestore {
        var s = FirestoreSettings()
        s.durability = .fsync
        return try Firestore.open(at: path, settings: s)
    }
}

/// The ids of a query snapshot's documents, in order.
func ids(_ s: QuerySnapshot) -> [String] { s.documents.map(\.documentID) }

/// Sorts anything sortable by its Firestore description (for comparing `[String: Any]`).
func same(_ a: Any?, _ b: Any?) -> Bool {
    switch (a, b) {
    case (nil, nil): return true
    case (let x as NSNull, let y as NSNull): return x == y
    case (let x as Bool, let y as Bool): return x == y
    case (let x as Int, let y as Int): return x == y
    case (let x as Int64, let y as Int): return x == Int64(y)
    case (let x as Int, let y as Int64): return Int64(x) == y
    case (let x as Double, let y as Double): return x.bitPattern == y.bitPattern || (x.isNaN && y.isNaN)
    case (let x as String, let y as String): return x == y
    case (let x as Data, let y as Data): return x == y
    case (let x as Timestamp, let y as Timestamp): return x == y
    case (let x as GeoPoint, let y as GeoPoint): return x == y
    case (let x as DocumentReference, let y as DocumentReference): return x.path == y.path
    case (let x as [Any], let y as [Any]): return x.count == y.count && zip(x, y).allSatisfy { same($0, $1) }
    case (let x as [String: Any], let y as [String: Any]): return x.count == y.count && x.allSatisfy { same($0.value, y[$0.key]) }
    default: return false
    }
}

/// A value behind a lock, shareable by reference (closures capture the box).
final class Locked<T>: @unchecked Sendable {
    private let lock = NSLock()
    private var value: T
    init(_ value: T) { self.value = value }
    func withLock<R>(_ body: (inout T) throws -> R) rethrows -> R {
        lock.lock()
        defer { lock.unlock() }
        return try body(&value)
    }
}
