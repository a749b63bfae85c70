import Foundation
import GRDB
import Stash

// The SQLite peer: GRDB 7.10.0, a DatabasePool (WAL), an index on item.homeID and the query
// interface. Records map to the same structs as the other engines, with hand-written row
// coding (GRDB's fastest record path) and choices that favour the peer:
// - ids are 16-byte BLOB primary keys (GRDB's UUID encoding), not 36-character text;
// - dates are REAL seconds since 1970 instead of GRDB's default ISO-8601 text;
// - no foreign-key constraint on item.homeID (Stash does not check one either).

extension Home: FetchableRecord, PersistableRecord {
    static var databaseTableName: String { "home" }

    init(row: Row) throws {
        self.init(id: RecordID(row["id"] as UUID), name: row["name"],
                  createdAt: Date(timeIntervalSince1970: row["createdAt"]))
    }

    func encode(to container: inout PersistenceContainer) throws {
        container["id"] = id.uuid
        container["name"] = name
        container["createdAt"] = createdAt.timeIntervalSince1970
    }
}

extension Item: FetchableRecord, PersistableRecord {
    static var databaseTableName: String { "item" }

    init(row: Row) throws {
        self.init(id: RecordID(row["id"] as UUID), homeID: RecordID(row["homeID"] as UUID),
                  name: row["name"], category: row["category"], wearCount: row["wearCount"],
                  modifiedAt: Date(timeIntervalSince1970: row["modifiedAt"]), payload: row["payload"])
    }

    func encode(to container: inout PersistenceContainer) throws {
        container["id"] = id.uuid
        container["homeID"] = homeID.uuid
        container["name"] = name
        container["category"] = category
        container["wearCount"] = wearCount
        container["modifiedAt"] = modifiedAt.timeIntervalSince1970
        container["payload"] = payload
    }
}

final class GRDBEngine: Engine {
    static let name = "GRDB"
    let pool: DatabasePool
    let file: URL

    init(directory: URL, sync: SyncLevel) throws {
        try FileManager.default.createDirectory(at: directory, withIntermediateDirectories: true)
        file = directory.appendingPathComponent("db.sqlite")
        pool = try DatabasePool(path: file.path)
        // GRDB sets `synchronous = NORMAL` on the writer connection when it enables WAL (after
        // `prepareDatabase` runs), so the level is set here, on the one writer, and checked.
        let level = sync.sqlite
        try pool.writeWithoutTransaction { db in try db.execute(sql: "PRAGMA synchronous = \(level)") }
        let expected = ["OFF": 0, "NORMAL": 1, "FULL": 2][level]!
        let actual = try pool.write { db in try Int.fetchOne(db, sql: "PRAGMA synchronous") }
        let journal = try pool.write { db in try String.fetchOne(db, sql: "PRAGMA journal_mode") }
        guard actual == expected, journal?.lowercased() == "wal" else {
            throw BenchError("GRDB: synchronous = \(actual.map(String.init) ?? "?"), journal_mode = \(journal ?? "?"); expected \(level) and WAL")
        }
        try pool.write { db in
            try db.create(table: "home", options: .ifNotExists) { t in
                t.primaryKey("id", .blob)
                t.column("name", .text).notNull()
                t.column("createdAt", .double).notNull()
            }
            try db.create(table: "item", options: .ifNotExists) { t in
                t.primaryKey("id", .blob)
                t.column("homeID", .blob).notNull().indexed()
                t.column("name", .text).notNull()
                t.column("category", .text).notNull()
                t.column("wearCount", .integer).notNull()
                t.column("modifiedAt", .double).notNull()
                t.column("payload", .blob).notNull()
            }
        }
    }

    func insert(homes: [Home]) throws {
        try pool.write { db in for home in homes { try home.insert(db) } }
    }

    func insert(items: [Item]) throws {
        try pool.write { db in for item in items { try item.insert(db) } }
    }

    func insert(_ item: Item) throws {
        try pool.write { db in try item.insert(db) }
    }

    func item(_ id: RecordID) throws -> Item? {
        try pool.read { db in try Item.fetchOne(db, key: id.uuid) }
    }

    func countItems(home: RecordID) throws -> Int {
        try pool.read { db in try Item.filter(Column("homeID") == home.uuid).fetchCount(db) }
    }

    /// A reference point outside the query interface: hand-written SQL in a cached prepared
    /// statement, the cheapest way GRDB offers to run a query.
    func itemWithCachedSQL(_ id: RecordID) throws -> Item? {
        try pool.read { db in
            try Item.fetchOne(db.cachedStatement(sql: "SELECT * FROM item WHERE id = ?"), arguments: [id.uuid])
        }
    }

    func countItemsWithCachedSQL(home: RecordID) throws -> Int {
        try pool.read { db in
            try Int.fetchOne(db.cachedStatement(sql: "SELECT COUNT(*) FROM item WHERE homeID = ?"), arguments: [home.uuid]) ?? 0
        }
    }

    func itemCount() throws -> Int {
        try pool.read { db in try Item.fetchCount(db) }
    }

    /// `UPDATE item SET wearCount = wearCount + 1 WHERE id = ?`: GRDB's cheapest way, with no
    /// read and no decode (Stash reads, decodes, changes and re-encodes the record).
    func incrementWearCount(_ id: RecordID) throws {
        _ = try pool.write { db in
            try Item.filter(key: id.uuid).updateAll(db, Column("wearCount") += 1)
        }
    }

    func flush() throws {
        _ = try pool.writeWithoutTransaction { db in try db.checkpoint(.truncate) }
    }

    func files() -> [URL] {
        [file, URL(fileURLWithPath: file.path + "-wal"), URL(fileURLWithPath: file.path + "-shm")]
    }
}

/// The gate check on GRDB, in one read transaction (`DatabasePool.read`): the `entitlement`
/// row `pro` (end of access in ms) compared with the wall clock, then `SELECT COUNT(*)` of the
/// homes (SQLite has no stored row count: it walks the table's b-tree) and of the home's items
/// (through the homeID index). Through the query interface, or with cached prepared statements.
final class GRDBGateEngine: GateEngine {
    static let name = GRDBEngine.name
    let engine: GRDBEngine
    let limits: GateLimits

    static func prepareGate(directory: URL, limits: GateLimits) throws {
        let engine = try GRDBEngine(directory: directory, sync: .full)
        let end = BenchEntitlement.expiresAtMilliseconds(builtAt: Date())
        try engine.pool.write { db in
            try db.create(table: "entitlement") { t in
                t.primaryKey("name", .text)
                t.column("expiresAt", .integer).notNull()
            }
            try db.execute(sql: "INSERT INTO entitlement (name, expiresAt) VALUES (?, ?)", arguments: [BenchEntitlement.name, end])
        }
        try engine.flush()
    }

    init(gateDirectory: URL, limits: GateLimits) throws {
        engine = try GRDBEngine(directory: gateDirectory, sync: .full)
        self.limits = limits
    }

    func checkCreateItem(in home: RecordID) throws -> GateVerdict {
        try engine.pool.read { db in
            let end = try Int64.fetchOne(db, Table("entitlement").select(Column("expiresAt"))
                .filter(Column("name") == BenchEntitlement.name)) ?? Int64.min
            if BenchEntitlement.isActive(endMilliseconds: end) { return .allowed }
            let homes = try Home.fetchCount(db)
            let items = try Item.filter(Column("homeID") == home.uuid).fetchCount(db)
            return GateVerdict.decideFree(homes: homes, itemsInHome: items, limits: limits)
        }
    }

    func checkCreateItemWithCachedSQL(in home: RecordID) throws -> GateVerdict {
        try engine.pool.read { db in
            let end = try Int64.fetchOne(db.cachedStatement(sql: "SELECT expiresAt FROM entitlement WHERE name = ?"),
                                         arguments: [BenchEntitlement.name]) ?? Int64.min
            if BenchEntitlement.isActive(endMilliseconds: end) { return .allowed }
            let homes = try Int.fetchOne(db.cachedStatement(sql: "SELECT COUNT(*) FROM home")) ?? 0
            let items = try Int.fetchOne(db.cachedStatement(sql: "SELECT COUNT(*) FROM item WHERE homeID = ?"),
                                         arguments: [home.uuid]) ?? 0
            return GateVerdict.decideFree(homes: homes, itemsInHome: items, limits: limits)
        }
    }

    func verifyEntitlement() throws {
        let end = try engine.pool.read { db in
            try Int64.fetchOne(db, sql: "SELECT expiresAt FROM entitlement WHERE name = ?", arguments: [BenchEntitlement.name])
        }
        guard let end, end != BenchEntitlement.lifetime, !BenchEntitlement.isActive(endMilliseconds: end) else {
            throw BenchError("gate/GRDB: expected the lapsed subscription's end in row `pro`, got \(end.map(String.init) ?? "nothing")")
        }
    }
}
