import Crypto
@_spi(Server) import Ferry
import FerryDocuments
import FerryDocumentsSync
import FerryLog
import FerrySync
import FerryTestSupport
import Foundation
import SwiftASN1
import Synchronization
import Testing
import X509

/// A certificate authority made by the test, and a certificate it issued for 127.0.0.1 and
/// localhost; written as PEM files.
struct TestCertificates {
    /// The authority's certificate (what clients trust).
    let authorityPEM: String
    let chainPath: String
    let keyPath: String

    init(in dir: String, name: String = "Ferry Test CA") throws {
        let caKey = P256.Signing.PrivateKey()
        let caName = try DistinguishedName { CommonName(name) }
        let now = Date()
        let ca = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(caKey.publicKey),
            notValidBefore: now - 3600, notValidAfter: now + 86_400, issuer: caName, subject: caName,
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.isCertificateAuthority(maxPathLength: nil))
                Critical(KeyUsage(keyCertSign: true))
            },
            issuerPrivateKey: .init(caKey))
        let key = P256.Signing.PrivateKey()
        let leaf = try Certificate(
            version: .v3, serialNumber: .init(), publicKey: .init(key.publicKey),
            notValidBefore: now - 3600, notValidAfter: now + 86_400, issuer: caName, subject: try DistinguishedName { CommonName("localhost") },
            signatureAlgorithm: .ecdsaWithSHA256,
            extensions: try Certificate.Extensions {
                Critical(BasicConstraints.notCertificateAuthority)
                try ExtendedKeyUsage([.serverAuth])
                SubjectAlternativeNames([.dnsName("localhost"), .ipAddress(ASN1OctetString(contentBytes: [127, 0, 0, 1]))])
            },
            issuerPrivateKey: .init(caKey))
        authorityPEM = try ca.serializeAsPEM().pemString
        chainPath = dir + "/chain.pem"
        keyPath = dir + "/key.pem"
        try (try leaf.serializeAsPEM().pemString + "\n").write(toFile: chainPath, atomically: true, encoding: .utf8)
        try key.pemRepresentation.write(toFile: keyPath, atomically: true, encoding: .utf8)
    }

    var serverArguments: [String] { ["--tls-cert", chainPath, "--tls-key", keyPath] }
}

/// `ferry-server` over TLS, with FerrySync and the document client checking its certificate.
@Suite struct TLSTests {
    @Test func ferrySyncWithSignedTokensWritesListensAndRunsTransactionsOverTLS() async throws {
        let dir = try TemporaryDirectory("tls-sync")
        let certificates = try TestCertificates(in: dir.path)
        let mint = try await TokenMint()
        let server = try ServerProcess(data: dir.sub("server"), certificates.serverArguments + (try mint.serverArguments(dir.path, rules: usersRules)))
        func client(_ name: String, _ uid: String) async throws -> Client {
            try await Client(dir.sub(name), port: server.port, scheme: "https") { options in
                options.trustedCertificatesPEM = certificates.authorityPEM
                options.tokenProvider = { _ in try await mint.token(.es256, sub: uid) }
            }
        }
        let a = try await client("a", "alice"), a2 = try await client("a2", "alice")
        await a.sync.goOnline()
        await a2.sync.goOnline()
        let seen = FerryMutex<Value?>(nil)
        let handle = try a2.db.reference("users/alice").observe(.value) { s in seen.withLock { $0 = s.value } }
        _ = try await a.db.reference("users/alice/name").setValue("Alice").serverAcknowledgement()
        #expect(await eventually { seen.withLock { $0 } == ["name": "Alice"] })
        for _ in 0..<3 {
            let r = try await a.sync.runTransaction(at: try a.db.reference("users/alice/age")) { data in
                if case .int(let n) = data.value { data.value = .int(n + 1) } else { data.value = 1 }
                return .commit
            }
            #expect(r.committed)
        }
        #expect(await eventually { seen.withLock { $0 } == ["name": "Alice", "age": 3] })
        // The rules hold over TLS too.
        let theirs = try await a.db.reference("users/bob/name").setValue("Mallory")
        await #expect(throws: (any Error).self) { try await theirs.serverAcknowledgement() }
        try a2.db.reference("users/alice").removeObserver(withHandle: handle)
        try await a.close()
        try await a2.close()
        #expect(server.terminate() == 0)
    }

    @Test func aServerWhoseCertificateIsNotTrustedGetsNothingAndTheWriteStaysPending() async throws {
        let dir = try TemporaryDirectory("tls-untrusted")
        let certificates = try TestCertificates(in: dir.path)
        let server = try ServerProcess(data: dir.sub("server"), certificates.serverArguments)
        let strangerDir = dir.sub("stranger")
        try FileManager.default.createDirectory(atPath: strangerDir, withIntermediateDirectories: true)
        let stranger = try TestCertificates(in: strangerDir, name: "Another CA")
        for (name, url, trusted) in [("wrong-ca", "https://127.0.0.1:\(server.port)?ns=t", Optional(stranger.authorityPEM)),
                                     ("system", "https://127.0.0.1:\(server.port)?ns=t", nil),
                                     ("plaintext", "http://127.0.0.1:\(server.port)?ns=t", Optional(certificates.authorityPEM))] {
            let db = try Database.open(at: dir.sub(name))
            var options = SyncOptions()
            options.trustedCertificatesPEM = trusted
            let sync = try SyncClient(database: db, url: url, options: options)
            _ = try await db.reference("note").setValue(name)
            await sync.goOnline()
            // (A read falls back to the cache; a transaction needs the server.)
            await #expect(throws: SyncError.self, "\(name)") { try await sync.runTransaction(at: try db.reference("other")) { _ in .abort } }
            #expect(db.pendingWriteCount == 1, "\(name)")
            await sync.close()
            try await db.close()
        }
        // Nothing reached the server.
        let db = try Database.open(at: dir.sub("check"))
        var options = SyncOptions()
        options.trustedCertificatesPEM = certificates.authorityPEM
        let sync = try SyncClient(database: db, url: "https://127.0.0.1:\(server.port)?ns=t", options: options)
        await sync.goOnline()
        #expect(try await sync.getData(try db.reference("note")).value == .null)
        await sync.close()
        try await db.close()
        #expect(throws: SyncError.self) { try SyncClient(database: db, url: "https://127.0.0.1:1?ns=t", options: { var o = SyncOptions(); o.trustedCertificatesPEM = "not a certificate"; return o }()) }
        #expect(server.terminate() == 0)
    }

    @Test func theDocumentClientSyncsOverTLS() async throws {
        let dir = try TemporaryDirectory("tls-documents")
        let certificates = try TestCertificates(in: dir.path)
        let server = try ServerProcess(data: dir.sub("server"), certificates.serverArguments + ["--firestore-port", "0"])
        func connected(_ name: String) throws -> (Firestore, FirestoreConnection) {
            let db = try Firestore.open(at: dir.sub(name))
            let c = try FirestoreConnection.connect(db, to: .init(host: "127.0.0.1", port: server.firestorePort!, project: "tls", tls: .pem(certificates.authorityPEM)))
            return (db, c)
        }
        let (a, ca) = try connected("a")
        let (b, cb) = try connected("b")
        let seen = Mutex<[String]>([])
        let reg = b.collection("cities").addSnapshotListener { snap, _ in
            if let snap, !snap.metadata.isFromCache { seen.withLock { $0 = snap.documents.map(\.documentID) } }
        }
        try await a.collection("cities").document("SF").setData(["name": "San Francisco"])
        try await a.waitForPendingWrites()
        #expect(await eventually { seen.withLock { $0 } == ["SF"] })
        reg.remove()
        // A client that does not trust the server's certificate gets nothing from it.
        let strangerDir = dir.sub("stranger")
        try FileManager.default.createDirectory(atPath: strangerDir, withIntermediateDirectories: true)
        let stranger = try TestCertificates(in: strangerDir, name: "Another CA")
        let c = try Firestore.open(at: dir.sub("c"))
        let cc = try FirestoreConnection.connect(c, to: .init(host: "127.0.0.1", port: server.firestorePort!, project: "tls", tls: .pem(stranger.authorityPEM)))
        await #expect(throws: (any Error).self) { _ = try await c.collection("cities").document("SF").getDocument(source: .server) }
        await cc.close()
        try await c.terminate()
        await ca.close()
        await cb.close()
        try await a.terminate()
        try await b.terminate()
        #expect(server.terminate() == 0)
    }
}

/// The tests of `FerrySync` against `ferry-server` that need no plaintext-only tool (a scripted
/// server, a cutting proxy, a child process, raw sockets): run again over TLS with signed tokens,
/// and with the server's namespaces in PostgreSQL.
enum SyncSuiteCase: String, CaseIterable, Sendable {
    case writesMadeOfflineReachTheServerInOrderWhenTheClientGoesOnline
    case aWriteTheRulesDenyIsRevertedListedAndItsReceiptThrowsWhileTheOthersApply
    case twoClientsRunningTransactionsOnOneCounterEndWithTheSum
    case bothClientsConvergeToTheServersDataAfterAPartitionWithConflictingWrites
    case writesSentWhileTheServerIsKilledAndRestartedAreAllAppliedExactlyOnce
    case anExpiredTokenPausesSendingUntilTheProviderGivesANewOne
    case getDataAsksTheServerWhenConnectedAndTheCacheOtherwise
    case theConnectionStateFollowsTheServerGoingAwayAndComingBack
    case aQueryListensWithItsOwnParametersAndSeesTheServersWindow
    case anIndexedLimitedListenerShowsTheCacheOfflineAndTheServersWindowOnline
    case aReconnectingListenerSeesOnlyWhatChangedWhileItWasAway
    case withoutBatchesEachWriteIsOneRequestAndStillAppliedOnce
    case aListenerAddedJustBeforeABurstOfWritesGetsItsListenAndEveryWriteIsSent
    case aTransactionWhoseDataChangedOnTheServerRunsAgainOnTheNewValue
    case aListenTheRulesRefuseIsReportedAndAskedAgainWithANewToken
    case aListenerOfItsOwnWritesNeverSeesAnOlderValueAfterTheServersAnswer
    case aStreamWhoseTokenIsRevokedReconnectsWithTheProvidersNewToken
    case listenersSayFromCacheAgainWhenTheClientGoesOfflineAndNotWhenItIsBack
    case nullBelowALeafLeavesTheLeafOnTheServerInEveryForm
    case theServerReadsBackAfterARestartExactlyWhatItServed
    case twoClientsWritingOneLocationInTurnNeverSeeItGoBack

    func run() async throws {
        let s = SyncTests()
        switch self {
        case .writesMadeOfflineReachTheServerInOrderWhenTheClientGoesOnline: try await s.writesMadeOfflineReachTheServerInOrderWhenTheClientGoesOnline()
        case .aWriteTheRulesDenyIsRevertedListedAndItsReceiptThrowsWhileTheOthersApply: try await s.aWriteTheRulesDenyIsRevertedListedAndItsReceiptThrowsWhileTheOthersApply()
        case .twoClientsRunningTransactionsOnOneCounterEndWithTheSum: try await s.twoClientsRunningTransactionsOnOneCounterEndWithTheSum()
        case .bothClientsConvergeToTheServersDataAfterAPartitionWithConflictingWrites: try await s.bothClientsConvergeToTheServersDataAfterAPartitionWithConflictingWrites()
        case .writesSentWhileTheServerIsKilledAndRestartedAreAllAppliedExactlyOnce: try await s.writesSentWhileTheServerIsKilledAndRestartedAreAllAppliedExactlyOnce()
        case .anExpiredTokenPausesSendingUntilTheProviderGivesANewOne: try await s.anExpiredTokenPausesSendingUntilTheProviderGivesANewOne()
        case .getDataAsksTheServerWhenConnectedAndTheCacheOtherwise: try await s.getDataAsksTheServerWhenConnectedAndTheCacheOtherwise()
        case .theConnectionStateFollowsTheServerGoingAwayAndComingBack: try await s.theConnectionStateFollowsTheServerGoingAwayAndComingBack()
        case .aQueryListensWithItsOwnParametersAndSeesTheServersWindow: try await s.aQueryListensWithItsOwnParametersAndSeesTheServersWindow()
        case .anIndexedLimitedListenerShowsTheCacheOfflineAndTheServersWindowOnline: try await s.anIndexedLimitedListenerShowsTheCacheOfflineAndTheServersWindowOnline()
        case .aReconnectingListenerSeesOnlyWhatChangedWhileItWasAway: try await s.aReconnectingListenerSeesOnlyWhatChangedWhileItWasAway()
        case .withoutBatchesEachWriteIsOneRequestAndStillAppliedOnce: try await s.withoutBatchesEachWriteIsOneRequestAndStillAppliedOnce()
        case .aListenerAddedJustBeforeABurstOfWritesGetsItsListenAndEveryWriteIsSent: try await s.aListenerAddedJustBeforeABurstOfWritesGetsItsListenAndEveryWriteIsSent()
        case .aTransactionWhoseDataChangedOnTheServerRunsAgainOnTheNewValue: try await s.aTransactionWhoseDataChangedOnTheServerRunsAgainOnTheNewValue()
        case .aListenTheRulesRefuseIsReportedAndAskedAgainWithANewToken: try await s.aListenTheRulesRefuseIsReportedAndAskedAgainWithANewToken()
        case .aListenerOfItsOwnWritesNeverSeesAnOlderValueAfterTheServersAnswer: try await s.aListenerOfItsOwnWritesNeverSeesAnOlderValueAfterTheServersAnswer()
        case .aStreamWhoseTokenIsRevokedReconnectsWithTheProvidersNewToken: try await s.aStreamWhoseTokenIsRevokedReconnectsWithTheProvidersNewToken()
        case .listenersSayFromCacheAgainWhenTheClientGoesOfflineAndNotWhenItIsBack: try await s.listenersSayFromCacheAgainWhenTheClientGoesOfflineAndNotWhenItIsBack()
        case .nullBelowALeafLeavesTheLeafOnTheServerInEveryForm: try await ConvergenceTests().nullBelowALeafLeavesTheLeafOnTheServerInEveryForm()
        case .theServerReadsBackAfterARestartExactlyWhatItServed: try await ConvergenceTests().theServerReadsBackAfterARestartExactlyWhatItServed()
        case .twoClientsWritingOneLocationInTurnNeverSeeItGoBack: try await NeverBackTests().twoClientsWritingOneLocationInTurnNeverSeeItGoBack()
        }
    }
}

extension TLSTests {
    // One case at a time: beside the rest of the suite, twenty-one more servers and clients at
    // once would only raise the test process's peak of open descriptors.
    @Test(.serialized, arguments: SyncSuiteCase.allCases)
    func theSyncSuitePassesOverTLSWithSignedTokens(_ test: SyncSuiteCase) async throws {
        let setup = try await SecureSetup.shared.value
        try await ServerMode.$current.withValue(.tlsWithSignedTokens(setup)) { try await test.run() }
    }
}
