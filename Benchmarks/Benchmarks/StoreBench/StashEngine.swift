import Foundation
import Stash
import StashGate
import StashLMDB

/// Stash itself: typed records, the homeID index, counts and history, all through the
/// public API a user would call.
final class StashEngine: Engine {
    static let name = "Stash"
    let store: Store
    let directory: URL
    /// Resolved once, as the docs recommend for hot paths.
    let homeIndex: IndexHandle<Item, RecordID>

    init(directory: URL, sync: SyncLevel) throws {
        var options = StoreOptions()
        options.durability = sync.stash
        options.initialMapSize = 256 << 20
        store = try Store.open(at: directory.path, types: [Home.self, Item.self], options: options)
        self.directory = directory
        homeIndex = try store.index(\Item.homeID)
    }

    func insert(homes: [Home]) throws {
        try store.write { tx in for home in homes { try tx.insert(home) } }
    }

    func insert(items: [Item]) throws {
        try store.write { tx in for item in items { try tx.insert(item) } }
    }

    func insert(_ item: Item) throws { try store.insert(item) }

    func item(_ id: RecordID) throws -> Item? { try store.get(Item.self, id: id) }

    /// The documented fast path: `count(_:where:equals:)`.
    func countItems(home: RecordID) throws -> Int {
        try store.count(Item.self, where: \.homeID, equals: home)
    }

    /// Through a pre-resolved index handle.
    func countItemsWithHandle(home: RecordID) throws -> Int {
        try store.count(homeIndex, equals: home)
    }

    /// The SwiftData-style path: a `#Predicate` planned onto the index.
    func countItemsWithPredicate(home: RecordID) throws -> Int {
        try store.fetchCount(FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == home }))
    }

    func itemCount() throws -> Int { try store.count(Item.self) }

    func incrementWearCount(_ id: RecordID) throws {
        try store.update(Item.self, id: id) { $0.wearCount += 1 }
    }

    func flush() throws {}

    func files() -> [URL] { [directory.appendingPathComponent("data.mdb")] }
}

/// The gate check through StashGate's public API: a `FeatureGate` with free-tier limits on
/// homes and on items per home (through the homeID index), the signed snapshot of
/// ``BenchEntitlement`` applied once and read back (verified) at every open, and
/// `check(.create(Item.self, in: home))`: the entitlement evaluated from the verified
/// snapshot the gate holds in memory (no store read, where the peers read theirs from
/// storage at every check), then `count(Home)` and the item total (downgrade-safe rule),
/// from the gate's per-history-sequence cache while nothing is written, and the home's items,
/// in one recycled read transaction.
final class StashGateEngine: GateEngine {
    static let name = StashEngine.name
    static let userID = "bench-user"
    static let keyID = "bench"
    static let signingKey = Array("stash-bench-gate-key-0123456789a".utf8)
    static let transactionID = "bench-yearly"
    let store: Store
    let gate: FeatureGate

    static func configuration(_ limits: GateLimits) -> GateConfiguration {
        var config = GateConfiguration(userID: userID, verifier: HMACSnapshotVerifier(keys: [keyID: signingKey]))
        config.premiumEntitlement = BenchEntitlement.name
        config.limits = [.maxRecords(Home.self, limits.maxHomes),
                         .maxRecords(Item.self, limits.maxItemsPerHome, per: \.homeID)]
        return config
    }

    /// The workload's types plus the gate's own (credit accounts and operations), as an app
    /// that gates opens its store.
    static func openStore(_ directory: URL, durability: Durability = .full) throws -> Store {
        var options = StoreOptions()
        options.initialMapSize = 256 << 20
        options.durability = durability
        return try Store.open(at: directory.path, types: [Home.self, Item.self] + FeatureGate.recordTypes, options: options)
    }

    static func prepareGate(directory: URL, limits: GateLimits) throws {
        let gate = try FeatureGate.open(try openStore(directory), configuration: configuration(limits))
        let now = Date()
        let yearly = PurchaseTransaction(id: transactionID, productID: "pro.yearly", type: .autoRenewable,
                                         entitlements: [BenchEntitlement.name],
                                         purchasedAt: BenchEntitlement.purchasedAt(builtAt: now),
                                         expiresAt: BenchEntitlement.expiresAt(builtAt: now), period: .yearly)
        let snapshot = EntitlementSnapshot(userID: userID, sequence: 1, serverTime: now, transactions: [yearly])
        try gate.apply(try HMACSnapshotSigner(keyID: keyID, key: signingKey).sign(snapshot))
    }

    convenience init(gateDirectory: URL, limits: GateLimits) throws {
        try self.init(gateDirectory: gateDirectory, limits: limits, durability: .full)
    }

    /// `durability` for the writes of the benchmark that checks after each commit.
    init(gateDirectory: URL, limits: GateLimits, durability: Durability) throws {
        store = try Self.openStore(gateDirectory, durability: durability)
        gate = try FeatureGate.open(store, configuration: Self.configuration(limits))
    }

    func checkCreateItem(in home: RecordID) throws -> GateVerdict {
        let decision = gate.check(.create(Item.self, in: home))
        if decision.isAllowed { return .allowed }
        switch decision.denial {
        case .overLimit?: return .overLimit
        case .itemLimitReached?: return .itemLimitReached
        default: throw BenchError("gate/Stash: unexpected decision \(decision)")
        }
    }

    func verifyEntitlement() throws {
        let entitlement = gate.entitlement()
        guard entitlement.status.state == .expired, entitlement.reason == .cached,
              entitlement.status.transactionID == Self.transactionID, gate.tier == .free else {
            throw BenchError("gate/Stash: expected the lapsed subscription read from the store's signed cache (free tier), got \(entitlement), tier \(gate.tier)")
        }
    }
}
