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
    let directory: URL

    init(directory: URL, sync: SyncLevel) throws {
        var config = EnvironmentConfiguration(
            databases: [DatabaseSpec("homes"), DatabaseSpec("items"),
                        DatabaseSpec("byHome", flags: [.duplicateSort, .duplicateFixed])],
            durability: sync.stash)
        config.initialMapSize = 256 << 20
        env = try Environment.open(path: directory.path, configuration: config)
        homes = try env.database("homes")
        items = try env.database("items")
        byHome = try env.database("byHome")
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
        try txn.put(items, key: id, value: Self.encode(item), flags: .noOverwrite)
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
