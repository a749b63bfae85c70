import Foundation
import Stash
import StashGate
import StashSync

struct GateDemoHome: Record {
    static let recordType = "Home"
    var id = RecordID()
    var name: String
}

struct GateDemoItem: Record {
    static let recordType = "Item"
    var id = RecordID()
    var homeID: RecordID
    var name: String
    static let indexes: [RecordIndex<GateDemoItem>] = [.index(\.homeID)]
}

/// The gating act of `stash demo`: a free user hits the item limit, upgrades, is refunded
/// with three homes (view and edit allowed, creation denied), and spends credits on two
/// devices that converge through sync. Stores go under `directory` (created if missing):
/// gate-device-a and gate-device-b. `stash gate DIR demo` runs it on its own.
func gatingStory(in directory: String, say: (String) -> Void) async throws {
    typealias Home = GateDemoHome
    typealias Item = GateDemoItem
    try FileManager.default.createDirectory(atPath: directory, withIntermediateDirectories: true)
    // The server's key pair: the app ships only the public key.
    let signer = Ed25519SnapshotSigner(keyID: "demo")
    let verifier = try Ed25519SnapshotVerifier(publicKeys: ["demo": signer.publicKey])
    func open(_ name: String) throws -> (Store, FeatureGate) {
        let store = try Store.open(at: (directory as NSString).appendingPathComponent(name),
                                   types: [Home.self, Item.self] + FeatureGate.recordTypes)
        var config = GateConfiguration(userID: "demo-user", verifier: verifier)
        config.limits = [.maxRecords(Home.self, 1).named("homes"), .maxRecords(Item.self, 10, per: \.homeID, of: Home.self)]
        return (store, try FeatureGate.open(store, configuration: config))
    }
    func create<R: Record>(_ record: R, in parent: RecordID? = nil, _ gate: FeatureGate, _ store: Store) throws -> String {
        do {
            try store.write { tx in
                try gate.authorize(.create(R.self, in: parent), in: tx)   // same transaction as the insert
                try tx.insert(record)
            }
            return "created"
        } catch let error as GateError where error.code == .denied {
            return "denied: \(error.decision!.denial!)" + (error.decision!.limit.map { " (\($0.name): \($0.count) of \($0.maximum))" } ?? "")
        }
    }

    say("== Gating: free tier of 1 home and 10 items per home")
    let (store, gate) = try open("gate-device-a")
    say("entitlement at open: \(gate.entitlement())")
    let flat = Home(name: "Flat")
    say("create home Flat: \(try create(flat, gate, store))")
    var results: [String] = []
    for n in 1...11 { results.append(try create(Item(homeID: flat.id, name: "item \(n)"), in: flat.id, gate, store)) }
    say("create 11 items: \(results.filter { $0 == "created" }.count) created, then \(results.last!)")
    say("create home Cabin: \(try create(Home(name: "Cabin"), gate, store))")

    let now = Date()
    let yearly = PurchaseTransaction(id: "t-1", productID: "pro.yearly", type: .autoRenewable, entitlements: ["pro"],
                                     purchasedAt: now, expiresAt: now.addingTimeInterval(365 * 86_400), period: .yearly,
                                     displayName: "Pro (yearly)", price: Decimal(string: "29.99"), currencyCode: "EUR")
    let upgrade = try gate.apply(signer.sign(EntitlementSnapshot(userID: "demo-user", sequence: 1, serverTime: now, transactions: [yearly])))
    say("upgrade (signed snapshot #1): \(upgrade)")
    say("create homes Cabin and Studio: \(try create(Home(name: "Cabin"), gate, store)), \(try create(Home(name: "Studio"), gate, store))")
    say("create a 12th item in Flat: \(try create(Item(homeID: flat.id, name: "item 12"), in: flat.id, gate, store))")

    var refunded = yearly
    refunded.revokedAt = now
    let downgrade = try gate.apply(signer.sign(EntitlementSnapshot(userID: "demo-user", sequence: 2, serverTime: now, transactions: [refunded])))
    say("refund (snapshot #2): \(downgrade)")
    let byHome = try store.index(\Item.homeID)
    say("  view: \(try store.count(Home.self)) homes, Flat has \(try store.count(byHome, equals: flat.id)) items (\(gate.check(.view)))")
    try store.write(isolation: #isolation) { tx in
        try gate.authorize(.edit, in: tx)
        try tx.update(Home.self, id: flat.id) { $0.name = "Flat (renamed)" }
    }
    say("  edit: renamed Flat (\(gate.check(.edit)))")
    let studio = try store.fetch(FetchDescriptor<Home>()).first { $0.name == "Studio" }!
    say("  create an item in the empty Studio: \(try create(Item(homeID: studio.id, name: "lamp"), in: studio.id, gate, store))")
    say("  sync policy at the next open: \(try FeatureGate.open(store, configuration: gate.configuration).syncPolicy)")

    say("== Credits on two devices")
    let (storeB, gateB) = try open("gate-device-b")
    let family = RecordID()
    let engineA = try SyncEngine(store: store, configuration: SyncConfiguration(family: family, enabled: true))
    let engineB = try SyncEngine(store: storeB, configuration: SyncConfiguration(family: family, enabled: true))
    let spentA = try gate.spendCredit(operationID: "generate-1")
    let spentB = try gateB.spendCredit(operationID: "generate-2")
    say("device A spends one: \(spentA.remaining) left; device B spends one: \(spentB.remaining) left")
    _ = try await engineA.sync(via: DirectTransport(to: engineB))
    _ = try await engineB.sync(via: DirectTransport(to: engineA))
    say("after sync: A has \(gate.credits()), B has \(gateB.credits()) (3 free credits granted once, 2 spent)")
    say("replay of generate-1 on B: \(try gateB.spendCredit(operationID: "generate-1"))")
    _ = try gate.spendCredit(operationID: "generate-3")
    _ = try gateB.spendCredit(operationID: "generate-4")
    _ = try await engineA.sync(via: DirectTransport(to: engineB))
    _ = try await engineB.sync(via: DirectTransport(to: engineA))
    say("both spend the last credit offline, then sync: \(gate.creditBalance().map(\.description) ?? "?")")
}
