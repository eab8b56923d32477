import FerryLog
import FerryTestSupport
import Foundation
import Testing

@testable @_spi(Server) import Ferry

@Suite struct DatabaseWriteTests {
    @Test func aLocalSetFiresListenersBeforeTheCallReturns() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        let rec = Recorder()
        let ref = try db.reference("users/ada")
        ref.observe(.value) { rec.record(.value, $0) }
        #expect(rec.all.isEmpty, "nothing is cached yet: no value event")
        try await ref.setValue(["name": "Ada", "born": 1815])
        #expect(rec.values == [json(#"{"name":"Ada","born":1815}"#)])
        #expect(rec.all.last?.metadata == SnapshotMetadata(fromCache: true, hasPendingWrites: true))
        try await db.close()
    }

    @Test func jsonTextIsStoredAsTheValueItDescribesAndBadTextIsRefused() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        let rec = Recorder()
        let ref = try db.reference("posts/p1")
        ref.observe(.value) { rec.record(.value, $0) }
        try await ref.setValue(json: #"{"title":"Hi","tags":["a",null,"b"],"likes":3,"meta":{},".priority":2}"#)
        #expect(rec.values == [json(#"{"title":"Hi","tags":["a",null,"b"],"likes":3}"#)], "dense enough to read back as an array")
        #expect(try await ref.getData().priority == 2)
        for bad in [#"{"a":1,}"#, #"{"a/b":1}"#, #"{"a":1,"a":2}"#, #"[1, NaN]"#, #"{"x": 1e999}"#, ""] {
            await #expect(throws: DatabaseError.self, "\(bad)") { try await ref.setValue(json: bad) }
        }
        #expect(rec.values.count == 1, "a refused write fires nothing")
        try await db.close()
        let reopened = try Database.open(at: dir.path, options: quietOptions())
        #expect(try await reopened.reference("posts/p1/tags/2").getData().value == "b")
        try await reopened.close()
    }

    @Test func writesSurviveReopenAndListenersGetTheCachedDataAtOnce() async throws {
        let dir = try TemporaryDirectory()
        do {
            let db = try Database.open(at: dir.path, options: quietOptions())
            try await db.reference("a").setValue(["x": 1, "y": ["z": "deep"]])
            try await db.reference("a/y/w").setValue(true)
            try await db.reference("b").updateChildValues(["c/d": 5, "e": "f"])
            try await db.reference("a/x").removeValue()
            try await db.close()
        }
        for checkpoint in [true, false] {
            if !checkpoint {
                for f in try Files.list(dir.path) where f.hasPrefix("checkpoint-") { try Files.remove(dir.sub(f)) }
            }
            var options = quietOptions()
            options.checkpointOnClose = checkpoint
            let db = try Database.open(at: dir.path, options: options)
            let rec = Recorder()
            // Local writes make /a complete (written in full) and /b/c/d, but not /b or /b/c
            // (only parts of them were written), nor the root: a value event fires only for
            // complete data.
            try db.root.child("a").observe(.value) { rec.record(.value, $0) }
            try db.root.child("b/c").observe(.value) { rec.record(.value, $0) }
            try db.root.child("b").observe(.value) { rec.record(.value, $0) }
            try db.root.child("b/c/d").observe(.value) { rec.record(.value, $0) }
            #expect(rec.values == [json(#"{"y":{"z":"deep","w":true}}"#), 5], "checkpoint: \(checkpoint)")
            #expect(rec.all.first?.metadata.hasPendingWrites == true)
            try await db.close()
        }
    }

    @Test func anUpdateIsAllOrNothingAndRefusesOverlappingPaths() async throws {
        let db = Database.inMemory(options: quietOptions())
        let rec = Recorder()
        rec.listen(db.root.query)
        try await db.applyServerPut(at: "", [:])  // the server has nothing: the root is complete
        try await db.root.updateChildValues(["a/b": 1, "c": 2])
        #expect(rec.values.last == json(#"{"a":{"b":1},"c":2}"#))
        #expect(rec.all.filter { $0.type == .value }.count == 2, "one value event for the server's (empty) data, one for the update")
        await #expect(throws: DatabaseError.self) { try await db.root.updateChildValues(["a": 1, "a/b": 2]) }
        await #expect(throws: DatabaseError.self) { try await db.root.updateChildValues(["ok": 1, "bad.key": 2]) }
        #expect(try await db.root.getData().value == json(#"{"a":{"b":1},"c":2}"#), "a failed update writes nothing")
    }

    @Test func keysAndPathsFollowTheRealtimeDatabaseRulesWithClearErrors() throws {
        let db = Database.inMemory()
        for bad in ["a.b", "a$", "x#y", "[a]", "tab\tkey", String(repeating: "k", count: 769)] {
            do {
                _ = try db.reference("ok/\(bad)")
                Issue.record("\(bad.prefix(10)) was accepted")
            } catch let e as DatabaseError {
                #expect(e.code == .invalidPath)
                #expect(e.message.contains("key"))
            } catch {
                Issue.record("unexpected \(error)")
            }
        }
        let deep = (0..<33).map { "k\($0)" }.joined(separator: "/")
        #expect(throws: DatabaseError.self) { _ = try db.reference(deep) }
        #expect(try db.reference("/a//b/").path == Path(keys: ["a", "b"]))
        // Keys are the text between slashes, whatever their script or size in UTF-8.
        #expect(try db.reference("users/日本語/😀 é/e\u{301}").path == Path(keys: ["users", "日本語", "😀 é", "e\u{301}"]))
    }

    @Test func nanAndMisplacedPrioritiesAreRefused() async throws {
        let db = Database.inMemory()
        await #expect(throws: DatabaseError.self) { try await db.root.child("x").setValue(.double(.nan)) }
        await #expect(throws: DatabaseError.self) { try await db.root.child("x").setValue([".value": 1, "other": 2]) }
        await #expect(throws: DatabaseError.self) { try await db.root.child("x").setValue(["a": 1], andPriority: ["no": "objects"]) }
        await #expect(throws: DatabaseError.self) { try await db.root.child("x").setValue([".sv": "bogus"]) }
    }

    /// Values are equal only when the Realtime Database holds them equal: an integer and a
    /// double are equal when they are the same number exactly (`Value ==` trapped on
    /// `.int(Int64.max)` against the double 2^63, which it rounds to), and strings when their
    /// code units are. A listener is told of a change between values that differ only so.
    @Test func valuesAreEqualOnlyWhenExactlyTheSameNumberOrTheSameCodeUnits() async throws {
        #expect(Value.int(1) == .double(1))
        #expect(Value.int(-3) == .double(-3))
        #expect(Value.int(.max) != .double(0x1p63))
        #expect(Value.double(0x1p63) != .int(.max))
        #expect(Value.int(.min) == .double(-0x1p63))
        #expect(Value.int(9_007_199_254_740_993) != .double(9_007_199_254_740_992))
        #expect(Value.double(0.5) != .int(0))
        #expect(Value.string("\u{E9}") != .string("e\u{301}"))
        #expect(Value.string("\u{E9}") == .string("\u{E9}"))
        // From stored JSON, compared and hashed together (a Set of the values did the same).
        let db = Database.inMemory()
        try await db.reference("n").setValue(json: #"{"a":9223372036854775807,"b":9223372036854775808}"#)
        let n = try await db.reference("n").getData()
        #expect(n.childSnapshot(forPath: "a").value != n.childSnapshot(forPath: "b").value)
        #expect(Set(n.children.map(\.value)).count == 2)

        try await db.applyServerPut(at: "c", [:])
        let rec = Recorder()
        rec.listen(try db.reference("c").query)
        let changes: [Value] = [.int(9_007_199_254_740_993), .double(9_007_199_254_740_992), .int(9_007_199_254_740_992),
                                .string("\u{E9}"), .string("e\u{301}")]
        for v in changes { try await db.reference("c/x").setValue(v) }
        let shown = rec.values.map { value -> String in
            guard case .object(let o) = value, let x = o["x"] else { return "\(value)" }
            if case .string(let s) = x { return "string " + s.unicodeScalars.map { String($0.value, radix: 16) }.joined(separator: "+") }
            return "\(x)"
        }
        // Each write a change (the double 2^53 and the integer 2^53 are the same number).
        #expect(shown == ["null", "9007199254740993", "9007199254740992.0", "string e9", "string 65+301"], "\(shown)")
        try await db.close()
    }

    @Test func aHugeValueIsRefusedAndNothingIsWritten() async throws {
        let dir = try TemporaryDirectory()
        let db = try Database.open(at: dir.path, options: quietOptions())
        let big = Value.object(["a": .string(String(repeating: "x", count: 9 << 20)), "b": .string(String(repeating: "y", count: 8 << 20))])
        do {
            try await db.root.child("big").setValue(big)
            Issue.record("a 17 MB value was accepted")
        } catch let e as DatabaseError {
            #expect(e.code == .invalidData)
            #expect(e.message.contains("16"))
        }
        #expect(db.pendingWriteIDs.isEmpty)
        try await db.root.child("small").setValue(1)
        try await db.close()
    }

    @Test func pushIDsAreFirebaseShapedAndIncreasing() {
        let db = Database.inMemory()
        var last = ""
        for _ in 0..<2000 {
            let key = db.root.childByAutoId().key!
            #expect(key.count == 20)
            #expect(key > last)
            last = key
        }
        #expect(last.allSatisfy { PushIDGenerator.chars.contains($0.asciiValue ?? 0) })
    }

    @Test func emptyObjectsAndArraysAreNullAndDenseObjectsReadBackAsArrays() async throws {
        let db = Database.inMemory()
        try await db.root.child("e").setValue([:])
        #expect(try await db.root.child("e").getData().exists == false)
        try await db.root.child("list").setValue(["a", "b", "c"])
        #expect(try await db.root.child("list").getData().value == ["a", "b", "c"])
        try await db.root.child("list/1").removeValue()
        #expect(try await db.root.child("list").getData().value == ["a", .null, "c"])
        try await db.root.child("sparse").setValue(["0": 1, "9": 2])
        #expect(try await db.root.child("sparse").getData().value == ["0": 1, "9": 2])
        try await db.root.child("big").setValue(.int(Int64.max))
        #expect(try await db.root.child("big").getData().value == .int(Int64.max))
        // Only keys as Firebase writes array indices (no sign, no leading zero) make an array:
        // reading an object with a key like "-3" used to trap.
        for keys in [["-3"], ["-1", "0"], ["+1"], ["-0"], ["00", "1"], ["0", "01"]] {
            let object = Value.object(Dictionary(uniqueKeysWithValues: keys.map { ($0, Value.string($0)) }))
            try await db.root.child("signed").setValue(object)
            #expect(try await db.root.child("signed").getData().value == object, "\(keys)")
        }
    }

    @Test func codableValuesRoundTrip() async throws {
        struct Post: Codable, Equatable {
            var title: String
            var likes: Int
            var tags: [String]
        }
        let db = Database.inMemory()
        let post = Post(title: "Crossing", likes: 3, tags: ["river", "ferry"])
        try await db.root.child("p").setValue(post)
        #expect(try await db.root.child("p").getData().decode(Post.self) == post)
    }
}

@Suite struct ServerAndAckTests {
    @Test func serverValuesResolveLocallyFromTheClockAndTheCurrentValue() async throws {
        let db = Database.inMemory()
        db.setServerTimeOffset(1_000_000)
        let before = wallClockMillis() + 1_000_000
        try await db.root.child("t").setValue(ServerValue.timestamp)
        let t = try await db.root.child("t").getData().value
        guard case .int(let ms) = t else { Issue.record("timestamp is \(t)"); return }
        #expect(ms >= before && ms < before + 60_000)

        try await db.root.child("n").setValue(40)
        try await db.root.child("n").setValue(ServerValue.increment(2))
        #expect(try await db.root.child("n").getData().value == 42)
        try await db.root.child("s").setValue("text")
        try await db.root.child("s").setValue(ServerValue.increment(5))
        #expect(try await db.root.child("s").getData().value == 5, "a non-number counts as 0")
        try await db.root.child("max").setValue(.int(Int64.max))
        try await db.root.child("max").setValue(ServerValue.increment(1))
        #expect(try await db.root.child("max").getData().value == .double(Double(Int64.max) + 1), "overflow falls back to double")
        try await db.root.updateChildValues(["n": ServerValue.increment(1)])
        #expect(try await db.root.child("n").getData().value == 43)
    }

    @Test func resolvedServerValuesReplayTheSameAfterReopen() async throws {
        let dir = try TemporaryDirectory()
        var seen: Value = .null
        var t: Value = .null
        do {
            let db = try Database.open(at: dir.path, options: quietOptions())
            try await db.root.child("n").setValue(10)
            try await db.root.child("n").setValue(ServerValue.increment(5))
            try await db.root.child("t").setValue(ServerValue.timestamp)
            seen = try await db.root.child("n").getData().value
            #expect(seen == 15)
            t = try await db.root.child("t").getData().value
            try await db.close()
        }
        // The clock moves past the timestamp, so that one resolved again on replay would differ.
        guard case .int(let written) = t else { Issue.record("the timestamp is \(t)"); return }
        try #require(await eventually { wallClockMillis() > written }, "the clock passes \(written)")
        var options = quietOptions()
        options.checkpointOnClose = false
        for f in try Files.list(dir.path) where f.hasPrefix("checkpoint-") { try Files.remove(dir.sub(f)) }
        let db = try Database.open(at: dir.path, options: options)
        #expect(try await db.root.child("n").getData().value == seen)
        #expect(try await db.root.child("t").getData().value == t, "the timestamp is the one resolved when written")
        try await db.close()
    }

    @Test func acknowledgedWritesStayAndRejectedOnesAreRevertedForListeners() async throws {
        let db = Database.inMemory()
        try await db.applyServerPut(at: "doc", ["v": 1])
        let rec = Recorder()
        try db.root.child("doc").observe(.value, includeMetadataChanges: true) { rec.record(.value, $0) }
        #expect(rec.values == [json(#"{"v":1}"#)])
        let kept = try await db.root.child("doc/v").setValue(2)
        let rejected = try await db.root.child("doc/w").setValue(3)
        #expect(rec.values.last == json(#"{"v":2,"w":3}"#))
        try await db.applyServerMerge(at: "doc", ["v": 2])  // the server applies the write, then acknowledges it
        try await db.acknowledgeWrite(kept.writeID!)
        try await kept.serverAcknowledgement()
        try await db.acknowledgeWrite(rejected.writeID!, rejected: true)
        await #expect(throws: DatabaseError.self) { try await rejected.serverAcknowledgement() }
        #expect(rec.values.last == json(#"{"v":2}"#), "the rejected write is reverted")
        #expect(rec.all.last?.metadata.hasPendingWrites == false)
        #expect(db.pendingWriteIDs.isEmpty)
    }

    @Test func metadataOnlyChangesGoOnlyToListenersThatAskedForThem() async throws {
        let db = Database.inMemory()
        try await db.applyServerPut(at: "doc", ["v": 1])
        let plain = Recorder(), meta = Recorder()
        try db.root.child("doc").observe(.value) { plain.record(.value, $0) }
        try db.root.child("doc").observe(.value, includeMetadataChanges: true) { meta.record(.value, $0) }
        let w = try await db.root.child("doc/v").setValue(2)
        try await db.applyServerMerge(at: "doc", ["v": 2])  // the server's echo: no visible change
        try await db.acknowledgeWrite(w.writeID!)  // same data, only hasPendingWrites changes
        try await db.applyListenComplete(at: "doc")  // only fromCache changes
        #expect(plain.all.map(\.metadata) == [.init(fromCache: true, hasPendingWrites: false), .init(fromCache: true, hasPendingWrites: true)])
        #expect(meta.all.map(\.metadata) == [
            .init(fromCache: true, hasPendingWrites: false), .init(fromCache: true, hasPendingWrites: true),
            .init(fromCache: true, hasPendingWrites: false), .init(fromCache: false, hasPendingWrites: false),
        ])
        #expect(meta.values.last == json(#"{"v":2}"#))
    }

    @Test func aValueEventFiresOnlyWhenTheDataIsComplete() async throws {
        let db = Database.inMemory()
        let rec = Recorder()
        rec.listen(try db.root.child("room").query)
        try await db.root.child("room/a/x").setValue(1)  // a part of an unknown child: no events at all
        #expect(rec.all.isEmpty)
        try await db.root.child("room/c").setValue(["k": 1])  // a whole child: child_added, but no value
        #expect(rec.all.map(\.type) == [.childAdded])
        try await db.applyServerPut(at: "room", ["a": ["y": 0], "b": 2])
        #expect(rec.values.last == json(#"{"a":{"x":1,"y":0},"b":2,"c":{"k":1}}"#))
        try await db.root.child("other").setValue(["k": 1])  // written in full: complete
        #expect(try await db.root.child("other").getData().value == ["k": 1])
    }

    @Test func serverDataSurvivesReopenAndTheAckedWriteBecomesServerData() async throws {
        let dir = try TemporaryDirectory()
        do {
            let db = try Database.open(at: dir.path, options: quietOptions())
            try await db.applyServerPut(at: "s", ["a": 1, "b": 2])
            try await db.applyServerMerge(at: "s", ["b": 3, "c/d": 4])
            let w = try await db.root.child("s/e").setValue(5)
            try await db.acknowledgeWrite(w.writeID!)
            let pending = try await db.root.child("p").setValue("still pending")
            #expect(db.pendingWriteIDs == [pending.writeID!])
            try await db.close()
        }
        let db = try Database.open(at: dir.path, options: quietOptions())
        #expect(try await db.root.child("s").getData().value == json(#"{"a":1,"b":3,"c":{"d":4},"e":5}"#))
        #expect(db.pendingWriteIDs.count == 1)
        #expect(try await db.root.child("p").getData().metadata.hasPendingWrites)
        #expect(try await db.root.child("s").getData().metadata.hasPendingWrites == false)
        try await db.close()
    }
}
