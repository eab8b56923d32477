import FerryTestSupport
import Foundation
import Testing

@testable @_spi(Server) import Ferry

/// `ferry-dump` on a database's store: records decoded, and the state at any LSN.
@Suite struct DumpDatabaseTests {
    let dump = Locations.executable("ferry-dump")

    /// A store whose records are: 1 server put, 2 set, 3 update, 4 set with a server value,
    /// 5 ack of 2, 6 reject of 3.
    func store() async throws -> TemporaryDirectory {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions(.none))
        try await db.applyServerPut(at: "users", ["ada": ["born": 1815]])
        let set = try await db.reference("users/ada/name").setValue("Ada")
        let update = try await db.reference("users").updateChildValues(["bob/name": "Bob", "ada/born": 1816])
        try await db.reference("visits").setValue(ServerValue.increment(1))
        try await db.acknowledgeWrite(set.writeID!)
        try await db.acknowledgeWrite(update.writeID!, rejected: true)
        try await db.close()
        return dir
    }

    @Test func recordsAreDecodedIntoWhatTheDatabaseWrote() async throws {
        let dir = try await store()
        let text = try run(dump, ["records", dir.path])
        #expect(text.status == 0)
        let lines = text.stdout.split(separator: "\n").map(String.init)
        #expect(lines.count == 6)
        #expect(lines[0].hasSuffix(#"server put /users = {"ada":{"born":1815}}"#))
        #expect(lines[1].hasSuffix(#"set /users/ada/name = "Ada""#))
        #expect(lines[2].contains("update /users") && lines[2].contains(#"bob/name: "Bob""#) && lines[2].contains("ada/born: 1816"))
        #expect(lines[3].contains(#"set /visits = {".sv":{"increment":1}}"#) && lines[3].contains("(resolved locally: 1)"))
        #expect(lines[4].hasSuffix("ack write 2 (value kept as server data)"))
        #expect(lines[5].hasSuffix("reject write 3"))

        let json = try run(dump, ["records", "--from", "2", "--to", "2", "--json", dir.path])
        let row = try JSONSerialization.jsonObject(with: Data(json.stdout.utf8)) as! [String: Any]
        #expect(row["lsn"] as? Int == 2)
        #expect(row["kind"] as? Int == 1)
        #expect((row["decoded"] as? String)?.hasPrefix("set /users/ada/name") == true)
        #expect(try run(dump, ["records", "--hex", "--from", "2", "--to", "2", dir.path]).stdout.contains("set ") == false)
    }

    @Test func atReplaysTheLogUpToAnLSNAndShowsTheViewTheCacheAndThePendingWrites() async throws {
        let dir = try await store()
        func at(_ lsn: Int) throws -> [String: Any] {
            let r = try run(dump, ["at", dir.path, String(lsn), "--path", "/users", "--json"])
            #expect(r.status == 0)
            return try JSONSerialization.jsonObject(with: Data(r.stdout.utf8)) as! [String: Any]
        }
        func value(_ text: Any?) throws -> Value? { try (text as? String).map { try Value(json: $0) } }

        let afterUpdate = try at(3)
        #expect(try value(afterUpdate["visible"]) == json(#"{"ada":{"born":1816,"name":"Ada"},"bob":{"name":"Bob"}}"#))
        #expect(try value(afterUpdate["serverCache"]) == json(#"{"ada":{"born":1815}}"#))
        #expect((afterUpdate["pendingWrites"] as? [String]) == ["2 /users/ada/name", "3 /users"])

        let end = try at(6)
        #expect(try value(end["visible"]) == json(#"{"ada":{"born":1815,"name":"Ada"}}"#), "the rejected update is reverted")
        #expect(try value(end["serverCache"]) == json(#"{"ada":{"born":1815,"name":"Ada"}}"#), "the acknowledged set became server data")
        #expect((end["pendingWrites"] as? [String]) == ["4 /visits"])

        let text = try run(dump, ["at", dir.path, "--path", "/visits"])
        #expect(text.stdout.contains("visible:      1"))
        #expect(text.stdout.contains("pending writes (1): 4 /visits"))
    }
}
