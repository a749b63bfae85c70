import Foundation
import Stash
import StashLMDB

/// The floor for any LMDB store: the same records written through our StashLMDB layer with a
/// hand-written binary layout, and a DUPSORT|DUPFIXED homeID → item id index maintained by
/// hand. No schema, no counts, no history, no generic encoding.
///
/// Databases: `homes` (id → value), `items` (id → value), `byHome` (homeID → item ids).
/// Item value: homeID (16) | wearCount (8, LE) | modifiedAt (8, LE Double bits)
///             | name (u16 LE length + UTF-8) | category (u16 + UTF-8) | payload (u16 + bytes).
final class RawLMDBEngine: Engine {
    static let name = "LMDB"
    let env: Environment
    let homes: StashLMDB.Database
    let items: StashLMDB.Database
    let byHome: StashLMDB.Database
    /// `gate` (entitlement name → end of access, ms, u64 LE): in gate fixtures only.
    let gate: StashLMDB.Database?
    let directory: URL

    convenience init(directory: URL, sync: SyncLevel) throws {
        try self.init(directory: directory, sync: sync, gate: false)
    }

    /// `gate`: also opens (creating it) the `gate` database of a gate fixture.
    init(directory: URL, sync: SyncLevel, gate withGate: Bool) throws {
        var databases = [DatabaseSpec("homes"), DatabaseSpec("items"),
                         DatabaseSpec("byHome", flags: [.duplicateSort, .duplicateFixed])]
        if withGate { databases.append(DatabaseSpec("gate")) }
        var config = EnvironmentConfiguration(databases: databases, durability: sync.stash)
        config.initialMapSize = 256 << 20
        env = try Environment.open(path: directory.path, configuration: config)
        homes = try env.database("homes")
        items = try env.database("items")
        byHome = try env.database("byHome")
        gate = withGate ? try env.database("gate") : nil
        self.directory = directory
    }

    // MARK: Keys and values

    @inline(__always)
    static func key(_ id: RecordID) -> KeyBytes {
        var key = KeyBytes()
        key.appendBigEndian(id.high)
        key.appendBigEndian(id.low)
        return key
    }

    static func encode(_ item: Item) -> [UInt8] {
        let name = Array(item.name.utf8), category = Array(item.category.utf8)
        var out = [UInt8]()
        out.reserveCapacity(16 + 16 + 6 + name.count + category.count + item.payload.count)
        func u64(_ v: UInt64) { for s in stride(from: 0, to: 64, by: 8) { out.append(UInt8(truncatingIfNeeded: v >> UInt64(s))) } }
        func u16(_ v: Int) { out.append(UInt8(truncatingIfNeeded: v)); out.append(UInt8(truncatingIfNeeded: v >> 8)) }
        u64(item.homeID.high.bigEndian); u64(item.homeID.low.bigEndian)
        u64(UInt64(bitPattern: Int64(item.wearCount)))
        u64(item.modifiedAt.timeIntervalSince1970.bitPattern)
        u16(name.count); out.append(contentsOf: name)
        u16(category.count); out.append(contentsOf: category)
        u16(item.payload.count); out.append(contentsOf: item.payload)
        return out
    }

    static func decode(_ id: RecordID, _ bytes: [UInt8]) -> Item? {
        bytes.withUnsafeBytes { raw -> Item? in
            guard raw.count >= 38 else { return nil }
            func u64(_ at: Int) -> UInt64 { UInt64(littleEndian: raw.loadUnaligned(fromByteOffset: at, as: UInt64.self)) }
            func u16(_ at: Int) -> Int { Int(raw[at]) | Int(raw[at + 1]) << 8 }
            let homeID = RecordID(high: UInt64(bigEndian: u64(0)), low: UInt64(bigEndian: u64(8)))
            let wearCount = Int(Int64(bitPattern: u64(16)))
            let modifiedAt = Date(timeIntervalSince1970: Double(bitPattern: u64(24)))
            var at = 32
            let nameLength = u16(at); at += 2
            let name = String(decoding: raw[at..<at + nameLength], as: UTF8.self); at += nameLength
            let categoryLength = u16(at); at += 2
            let category = String(decoding: raw[at..<at + categoryLength], as: UTF8.self); at += categoryLength
            let payloadLength = u16(at); at += 2
            let payload = Data(raw[at..<at + payloadLength])
            return Item(id: id, homeID: homeID, name: name, category: category, wearCount: wearCount,
                        modifiedAt: modifiedAt, payload: payload)
        }
    }

    static func encode(_ home: Home) -> [UInt8] {
        var out = [UInt8]()
        let bits = home.createdAt.timeIntervalSince1970.bitPattern
        for s in stride(from: 0, to: 64, by: 8) { out.append(UInt8(truncatingIfNeeded: bits >> UInt64(s))) }
        out.append(contentsOf: home.name.utf8)
        return out
    }

    // MARK: Engine

    func insert(homes list: [Home]) throws {
        try env.write { txn in
            for home in list { try txn.put(homes, key: Self.key(home.id), value: Self.encode(home)) }
        }
    }

    @inline(__always)
    private func put(_ item: Item, _ txn: WriteTransaction) throws {
        let id = Self.key(item.id)
        let value = Self.encode(item)
        // As Stash does: time-ordered ids are appended when they sort last (a new key, pages
        // filled up), put the ordinary way otherwise.
        if try !txn.appendIfLast(items, key: id, value: value) {
            try txn.put(items, key: id, value: value, flags: .noOverwrite)
        }
        try txn.put(byHome, key: Self.key(item.homeID), value: id)
    }

    func insert(items list: [Item]) throws {
        try env.write { txn in for item in list { try put(item, txn) } }
    }

    func insert(_ item: Item) throws {
        try env.write { txn in try put(item, txn) }
    }

    func item(_ id: RecordID) throws -> Item? {
        guard let bytes = try env.read({ txn in try txn.get(items, key: Self.key(id)) }) else { return nil }
        return Self.decode(id, bytes)
    }

    func countItems(home: RecordID) throws -> Int {
        try env.read { txn in try txn.duplicateCount(byHome, key: Self.key(home)) }
    }

    func itemCount() throws -> Int {
        try env.read { txn in try txn.statistics(items).entries }
    }

    /// Read, change the 8 bytes of wearCount in place, write back. homeID does not change,
    /// so the index is untouched (the hand-written floor knows that; a store has to check).
    func incrementWearCount(_ id: RecordID) throws {
        try env.write { txn in
            let key = Self.key(id)
            guard var bytes = try txn.get(items, key: key), bytes.count >= 24 else { return }
            var count = bytes.withUnsafeBytes { UInt64(littleEndian: $0.loadUnaligned(fromByteOffset: 16, as: UInt64.self)) }
            count &+= 1
            for s in 0..<8 { bytes[16 + s] = UInt8(truncatingIfNeeded: count >> UInt64(8 * s)) }
            try txn.put(items, key: key, value: bytes)
        }
    }

    func flush() throws { try env.sync() }

    func files() -> [URL] { [directory.appendingPathComponent("data.mdb")] }
}

/// The gate check by hand on raw LMDB, in one read transaction: the end of access stored under
/// `pro` in the `gate` database (read in place), compared with the wall clock; then the number
/// of homes (`mdb_stat` entries of `homes`, O(1)) and of the home's items (`mdb_cursor_count`
/// on `byHome`), compared with the limits.
final class RawLMDBGateEngine: GateEngine {
    static let name = RawLMDBEngine.name
    static let entitlementKey = Array(BenchEntitlement.name.utf8)
    let engine: RawLMDBEngine
    let gate: StashLMDB.Database
    let limits: GateLimits

    static func prepareGate(directory: URL, limits: GateLimits) throws {
        let engine = try RawLMDBEngine(directory: directory, sync: .full, gate: true)
        let end = UInt64(bitPattern: BenchEntitlement.expiresAtMilliseconds(builtAt: Date()))
        try engine.env.write { txn in
            try txn.put(engine.gate!, key: entitlementKey, value: withUnsafeBytes(of: end.littleEndian) { Array($0) })
        }
        try engine.flush()
    }

    init(gateDirectory: URL, limits: GateLimits) throws {
        engine = try RawLMDBEngine(directory: gateDirectory, sync: .full, gate: true)
        gate = engine.gate!
        self.limits = limits
    }

    func checkCreateItem(in home: RecordID) throws -> GateVerdict {
        try engine.env.read { txn in
            let end = try txn.uint64(gate, key: Self.entitlementKey).map { Int64(bitPattern: $0) } ?? Int64.min
            if BenchEntitlement.isActive(endMilliseconds: end) { return .allowed }
            let homes = try txn.statistics(engine.homes).entries
            let items = try txn.duplicateCount(engine.byHome, key: RawLMDBEngine.key(home))
            return GateVerdict.decideFree(homes: homes, itemsInHome: items, limits: limits)
        }
    }

    func verifyEntitlement() throws {
        let end = try engine.env.read { txn in try txn.uint64(gate, key: Self.entitlementKey) }.map { Int64(bitPattern: $0) }
        guard let end, end != BenchEntitlement.lifetime, !BenchEntitlement.isActive(endMilliseconds: end) else {
            throw BenchError("gate/LMDB: expected the lapsed subscription's end under `pro`, got \(end.map(String.init) ?? "nothing")")
        }
    }
}
