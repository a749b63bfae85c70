import Foundation
import Stash
import StashGate
import StashLMDB
import StashTestSupport
import Testing

struct Home: Record, Equatable {
    var id = RecordID()
    var name: String
}

struct Item: Record, Equatable {
    var id = RecordID()
    var homeID: RecordID
    var name: String
    static let indexes: [RecordIndex<Item>] = [.index(\.homeID)]
}

/// A wall clock the test moves by hand (forwards or backwards).
final class TestClock: @unchecked Sendable {
    private let lock = NSLock()
    private var current: Date

    init(_ start: Date = instant(0)) { current = start }

    var now: Date { lock.lock(); defer { lock.unlock() }; return current }
    func set(_ date: Date) { lock.lock(); current = date; lock.unlock() }
    func advance(_ seconds: TimeInterval) { lock.lock(); current += seconds; lock.unlock() }
    func advance(ms: Int64) { advance(Double(ms) / 1000) }

    var function: @Sendable () -> Date { { [self] in self.now } }
}

/// 2026-01-01T00:00:00Z plus `ms` milliseconds: whole-millisecond instants.
let t0: Int64 = 1_767_225_600_000
func instant(_ ms: Int64) -> Date { Date(timeIntervalSince1970: Double(t0 + ms) / 1000) }
let second: Int64 = 1000
let minute: Int64 = 60 * second
let hour: Int64 = 60 * minute
let day: Int64 = 24 * hour

let appKey = Array("0123456789abcdef0123456789abcdef".utf8)
let signer = HMACSnapshotSigner(keyID: "k1", key: appKey)
let verifier = HMACSnapshotVerifier(keys: ["k1": appKey])

enum Tx {
    static func subscription(_ id: String, expires: Int64, period: PurchaseTransaction.Period = .yearly,
                             offer: PurchaseTransaction.Offer? = nil, grace: Int64? = nil, retry: Bool = false,
                             revoked: Int64? = nil, entitlement: String = "pro") -> PurchaseTransaction {
        PurchaseTransaction(id: id, productID: "pro.\(period.rawValue)", type: .autoRenewable, entitlements: [entitlement],
                            purchasedAt: instant(0), expiresAt: instant(expires), period: period, offer: offer,
                            gracePeriodExpiresAt: grace.map(instant), isInBillingRetry: retry, revokedAt: revoked.map(instant),
                            displayName: "Pro \(period.rawValue)", price: Decimal(string: "29.99"), currencyCode: "EUR")
    }

    static func lifetime(_ id: String, revoked: Int64? = nil) -> PurchaseTransaction {
        PurchaseTransaction(id: id, productID: "pro.lifetime", type: .nonConsumable, entitlements: ["pro"],
                            purchasedAt: instant(0), revokedAt: revoked.map(instant), displayName: "Pro forever",
                            price: Decimal(string: "99.99"), currencyCode: "EUR")
    }

    static func pack(_ id: String, credits: Int, revoked: Int64? = nil) -> PurchaseTransaction {
        PurchaseTransaction(id: id, productID: "credits.\(credits)", type: .consumable, purchasedAt: instant(0),
                            revokedAt: revoked.map(instant), credits: credits)
    }
}

func snapshot(_ transactions: [PurchaseTransaction], sequence: UInt64 = 1, server: Int64 = 0, user: String = "u1") -> EntitlementSnapshot {
    EntitlementSnapshot(userID: user, sequence: sequence, serverTime: instant(server), transactions: transactions)
}

func signed(_ transactions: [PurchaseTransaction], sequence: UInt64 = 1, server: Int64 = 0, user: String = "u1") throws -> SignedEntitlementSnapshot {
    try signer.sign(snapshot(transactions, sequence: sequence, server: server, user: user))
}

/// A store with homes, items and the gate's record types, and a gate on a test clock.
final class Fixture {
    let dir = TemporaryDirectory()
    let clock: TestClock
    let store: Store
    var gate: FeatureGate
    var configuration: GateConfiguration

    init(user: String = "u1", start: Date = instant(0), configure: (inout GateConfiguration) -> Void = { _ in }) throws {
        clock = TestClock(start)
        store = try Store.open(at: dir.sub("store"), types: [Home.self, Item.self] + FeatureGate.recordTypes)
        var config = GateConfiguration(userID: user, verifier: verifier)
        config.clock = clock.function
        config.limits = [.maxRecords(Home.self, 1), .maxRecords(Item.self, 10, per: \.homeID)]
        config.freeFeatures = ["quickTimer", "articles"]
        configure(&config)
        configuration = config
        gate = try FeatureGate.open(store, configuration: config)
    }

    /// A new gate on the same store: what the next launch sees.
    @discardableResult
    func relaunch(_ change: (inout GateConfiguration) -> Void = { _ in }) throws -> FeatureGate {
        try gate.persistClock()   // what the app does when it goes to the background
        change(&configuration)
        gate = try FeatureGate.open(store, configuration: configuration)
        return gate
    }

    func addHome(_ name: String = "home") throws -> RecordID {
        let home = Home(name: name)
        try store.write { tx in try tx.insert(home) }
        return home.id
    }

    /// Authorizes and inserts in one transaction; returns the denial, or nil when created.
    @discardableResult
    func create(_ item: Item) -> DenialReason? {
        do {
            try store.write { tx in
                try gate.authorize(.create(Item.self, in: item.homeID), in: tx)
                try tx.insert(item)
            }
            return nil
        } catch let error as GateError {
            return error.decision?.denial
        } catch {
            Issue.record("unexpected error \(error)")
            return nil
        }
    }

    @discardableResult
    func createHome(_ name: String = "home") -> DenialReason? {
        do {
            try store.write { tx in
                try gate.authorize(.create(Home.self), in: tx)
                try tx.insert(Home(name: name))
            }
            return nil
        } catch let error as GateError {
            return error.decision?.denial
        } catch {
            Issue.record("unexpected error \(error)")
            return nil
        }
    }
}

/// Overwrites the stored bytes of record `id` in the store at `path` with a record format no
/// library version writes: reading the record fails as a damaged page or a newer format does.
func damageRecord(_ id: RecordID, inStoreAt path: String) throws {
    let env = try Environment.open(path: path, configuration: EnvironmentConfiguration(databases: [DatabaseSpec("records")]))
    let records = try env.database("records")
    let idBytes = withUnsafeBytes(of: id.high.bigEndian, Array.init) + withUnsafeBytes(of: id.low.bigEndian, Array.init)
    try env.write { txn in
        var key: [UInt8]?
        try txn.scan(records, from: ScanStart<[UInt8]>.first) { k, _ in
            if k.suffix(16).elementsEqual(idBytes) { key = k; return false }
            return true
        }
        try txn.put(records, key: try #require(key), value: [UInt8]([0xFF, 0, 0]))
    }
}

/// The highest time seen as saved in `store` (ms since 1970), nil when none is: the first
/// field of the gate's state (`SGS1`, then the clock, little-endian).
func storedClock(_ store: Store) throws -> Int64? {
    try store.metadata(for: "gate.state").map { bytes in bytes[4..<12].enumerated().reduce(Int64(0)) { $0 | Int64($1.element) << (8 * Int64($1.offset)) } }
}
