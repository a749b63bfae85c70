import CLMDB

/// The state behind one transaction: the LMDB handle and the cursors opened in it.
/// Opaque outside this module.
public final class TransactionHandle {
    var txn: OpaquePointer?
    /// Cursors cached per database; read handles keep them across `mdb_txn_renew`. Used by
    /// the one thread running the transaction: no runtime exclusivity check.
    @exclusivity(unchecked) private var cursors: [(dbi: MDB_dbi, cursor: OpaquePointer, fresh: Bool)] = []
    /// Set when LMDB reported MDB_MAP_FULL, even if the caller swallowed the error.
    var sawMapFull = false
    /// Where the environment maps its data file (values are checked against it).
    let bounds: MapBounds

    init(bounds: MapBounds) { self.bounds = bounds }

    /// A copy of the bytes of `value`, which LMDB handed out in `db`: checked first to lie in
    /// the data file, so that a damaged size (LMDB keeps no checksum) is an error, not a read
    /// past the end of the file or of the map.
    @inline(__always)
    func copy(_ value: MDB_val, _ db: Database, _ path: String) throws(LMDBError) -> [UInt8] {
        guard value.mv_size > 0, let data = value.mv_data else { return [] }
        guard bounds.contains(data, value.mv_size) else { throw outside(value, db, path) }
        return Array(UnsafeRawBufferPointer(start: data, count: value.mv_size))
    }

    func outside(_ value: MDB_val, _ db: Database, _ path: String) -> LMDBError {
        LMDBError(code: .damaged, operation: "read \(db.name)", path: path,
                  detail: "LMDB gave a key or value of \(value.mv_size) bytes that runs past the end of data.mdb: the file is damaged; `stash verify \(path)` shows what it reaches, restore the store from a backup or a peer")
    }

    func cursor(_ db: Database, _ path: String) throws(LMDBError) -> OpaquePointer {
        for i in cursors.indices where cursors[i].dbi == db.dbi {
            if !cursors[i].fresh {
                try check(mdb_cursor_renew(txn, cursors[i].cursor), "mdb_cursor_renew \(db.name)", path)
                cursors[i].fresh = true
            }
            return cursors[i].cursor
        }
        var cursor: OpaquePointer?
        try check(mdb_cursor_open(txn, db.dbi, &cursor), "mdb_cursor_open \(db.name)", path)
        cursors.append((db.dbi, cursor!, true))
        return cursor!
    }

    /// Runs `body` with a cursor of its own, closed afterwards: scans may nest, even on the
    /// same database, without disturbing each other or the cached point-lookup cursors.
    func withScanCursor<R>(_ db: Database, _ path: String, _ body: (OpaquePointer) throws -> R) throws -> R {
        var cursor: OpaquePointer?
        try check(mdb_cursor_open(txn, db.dbi, &cursor), "mdb_cursor_open \(db.name)", path)
        defer { mdb_cursor_close(cursor) }
        return try body(cursor!)
    }

    /// After `mdb_txn_renew`, read cursors must be renewed before use.
    func markCursorsStale() {
        for i in cursors.indices { cursors[i].fresh = false }
    }

    /// Write-transaction cursors must be closed before commit or abort.
    func closeCursors() {
        for entry in cursors { mdb_cursor_close(entry.cursor) }
        cursors.removeAll(keepingCapacity: true)
    }

    /// Frees a pooled read handle for good.
    func release() {
        closeCursors()
        if let txn { mdb_txn_abort(txn) }
        txn = nil
    }
}

/// What every transaction can do: read. ``WriteTransaction`` can do all of it too.
public protocol TransactionReading {
    /// Opaque state; not for use outside StashLMDB.
    var handle: TransactionHandle { get }
    /// The environment path, for error messages.
    var path: String { get }
}

/// A read-only snapshot, valid only inside the ``Environment/read(_:)`` closure.
///
/// Transactions are small values so that higher layers can wrap them; do not let one
/// escape its closure: after the closure the handle is recycled for another read.
public struct ReadTransaction: TransactionReading {
    public let handle: TransactionHandle
    public let path: String

    /// The committed state this snapshot sees (LMDB's transaction id): snapshots with the same
    /// id see the same data, in this process and in others. O(1).
    public var snapshotID: UInt64 { UInt64(mdb_txn_id(handle.txn)) }
}

/// The write transaction, valid only inside the ``Environment/write(isolation:_:)`` closure.
public struct WriteTransaction: TransactionReading {
    public let handle: TransactionHandle
    public let path: String
}

/// Runs one LMDB call with `source` as an `MDB_val`; answers the call's status code.
@inline(__always)
func withVal(_ source: some ByteSource, _ body: (inout MDB_val) -> Int32) -> Int32 {
    source.withLMDBBytes { buffer in
        var val = MDB_val(mv_size: buffer.count, mv_data: UnsafeMutableRawPointer(mutating: buffer.baseAddress))
        return body(&val)
    }
}

/// The position a scan starts from.
public enum ScanStart<Key: ByteSource> {
    case first
    /// The first key greater than or equal to this one (`MDB_SET_RANGE`).
    case atOrAfter(Key)
}

extension TransactionReading {
    /// The value stored under `key`, copied out (LMDB rule 9), or nil.
    /// On a DUPSORT database this is the first duplicate.
    public func get(_ db: Database, key: some ByteSource) throws(LMDBError) -> [UInt8]? {
        try checkKey(key, db, "get")
        var data = MDB_val()
        let rc = withVal(key) { k in mdb_get(handle.txn, db.dbi, &k, &data) }
        if rc == MDB_NOTFOUND { return nil }
        try check(rc, "mdb_get \(db.name)", path)
        return try handle.copy(data, db, path)
    }

    /// The 8-byte little-endian integer stored under `key` (nil when absent or not 8 bytes),
    /// read in place: no allocation. For counters kept as fixed-width values.
    public func uint64(_ db: Database, key: some ByteSource) throws(LMDBError) -> UInt64? {
        try checkKey(key, db, "get")
        var data = MDB_val()
        let rc = withVal(key) { k in mdb_get(handle.txn, db.dbi, &k, &data) }
        if rc == MDB_NOTFOUND { return nil }
        try check(rc, "mdb_get \(db.name)", path)
        guard data.mv_size == 8, let raw = data.mv_data else { return nil }
        guard handle.bounds.contains(raw, 8) else { throw handle.outside(data, db, path) }
        return UInt64(littleEndian: raw.loadUnaligned(as: UInt64.self))
    }

    /// Calls `body(key, duplicates)` for each distinct key starting with `prefix` in a
    /// DUPSORT database, jumping from key to key (`MDB_NEXT_NODUP` + `mdb_cursor_count`):
    /// O(distinct keys), not O(entries).
    public func forEachKeyWithCount(_ db: Database, prefix: some ByteSource, _ body: ([UInt8], Int) throws -> Bool) throws {
        let prefixBytes = prefix.withByteBuffer { Array($0) }
        try checkKey(prefixBytes, db, "scan")
        try handle.withScanCursor(db, path) { cursor in
            var key = MDB_val(), data = MDB_val()
            var rc = withVal(prefixBytes) { k in
                var probe = k
                let rc = mdb_cursor_get(cursor, &probe, &data, MDB_SET_RANGE)
                key = probe
                return rc
            }
            while rc == 0 {
                let current = try handle.copy(key, db, path)
                guard current.starts(with: prefixBytes) else { return }
                var count = 0
                try check(mdb_cursor_count(cursor, &count), "mdb_cursor_count \(db.name)", path)
                guard try body(current, count) else { return }
                rc = mdb_cursor_get(cursor, &key, &data, MDB_NEXT_NODUP)
            }
            if rc != MDB_NOTFOUND { try check(rc, "mdb_cursor_get \(db.name)", path) }
        }
    }

    /// True when `key` is present. No copy of the value.
    public func contains(_ db: Database, key: some ByteSource) throws(LMDBError) -> Bool {
        try checkKey(key, db, "get")
        var data = MDB_val()
        let rc = withVal(key) { k in mdb_get(handle.txn, db.dbi, &k, &data) }
        if rc == MDB_NOTFOUND { return false }
        try check(rc, "mdb_get \(db.name)", path)
        return true
    }

    /// The number of values under `key` in a DUPSORT database (0 when absent).
    ///
    /// O(1): one cursor positioning and one `mdb_cursor_count`, on a cursor cached with the
    /// transaction handle, so no allocation once warm.
    public func duplicateCount(_ db: Database, key: some ByteSource) throws(LMDBError) -> Int {
        try checkKey(key, db, "count")
        let cursor = try handle.cursor(db, path)
        var data = MDB_val()
        let rc = withVal(key) { k in mdb_cursor_get(cursor, &k, &data, MDB_SET) }
        if rc == MDB_NOTFOUND { return 0 }
        try check(rc, "mdb_cursor_get \(db.name)", path)
        guard db.flags.contains(.duplicateSort) else { return 1 }
        var count = 0
        try check(mdb_cursor_count(cursor, &count), "mdb_cursor_count \(db.name)", path)
        return count
    }

    /// True when exactly the pair (`key`, `value`) is present in a DUPSORT database.
    public func containsDuplicate(_ db: Database, key: some ByteSource, value: some ByteSource) throws(LMDBError) -> Bool {
        try checkKey(key, db, "get")
        let cursor = try handle.cursor(db, path)
        let rc = withVal(key) { k in withVal(value) { v in mdb_cursor_get(cursor, &k, &v, MDB_GET_BOTH) } }
        if rc == MDB_NOTFOUND { return false }
        try check(rc, "mdb_cursor_get \(db.name)", path)
        return true
    }

    /// Calls `body` with every value stored under `key` (in sort order) until it returns false.
    public func forEachDuplicate(_ db: Database, key: some ByteSource,
                                 _ body: ([UInt8]) throws -> Bool) throws {
        try checkKey(key, db, "scan")
        try handle.withScanCursor(db, path) { cursor in
            var k = MDB_val(), data = MDB_val()
            var rc = withVal(key) { key in mdb_cursor_get(cursor, &key, &data, MDB_SET_KEY) }
            k = MDB_val()
            while rc == 0 {
                guard try body(handle.copy(data, db, path)) else { return }
                rc = mdb_cursor_get(cursor, &k, &data, MDB_NEXT_DUP)
            }
            if rc != MDB_NOTFOUND { try check(rc, "mdb_cursor_get \(db.name)", path) }
        }
    }

    /// Walks the database in key order from `start`, calling `body(key, value)` for every
    /// entry (every duplicate, on a DUPSORT database) until it returns false.
    /// Keys and values are copies, safe to keep.
    public func scan<K: ByteSource>(_ db: Database, from start: ScanStart<K>,
                                    _ body: ([UInt8], [UInt8]) throws -> Bool) throws {
        if case .atOrAfter(let startKey) = start { try checkKey(startKey, db, "scan") }
        try handle.withScanCursor(db, path) { cursor in
            var key = MDB_val(), data = MDB_val()
            var rc: Int32
            switch start {
            case .first:
                rc = mdb_cursor_get(cursor, &key, &data, MDB_FIRST)
            case .atOrAfter(let startKey):
                rc = withVal(startKey) { k in
                    var probe = k
                    let rc = mdb_cursor_get(cursor, &probe, &data, MDB_SET_RANGE)
                    key = probe
                    return rc
                }
            }
            while rc == 0 {
                guard try body(handle.copy(key, db, path), handle.copy(data, db, path)) else { return }
                rc = mdb_cursor_get(cursor, &key, &data, MDB_NEXT)
            }
            if rc != MDB_NOTFOUND { try check(rc, "mdb_cursor_get \(db.name)", path) }
        }
    }

    /// Walks all entries whose key starts with `prefix`, in key order.
    public func scan(_ db: Database, prefix: some ByteSource,
                     _ body: ([UInt8], [UInt8]) throws -> Bool) throws {
        let prefixBytes = prefix.withByteBuffer { Array($0) }
        try scan(db, from: .atOrAfter(prefixBytes)) { key, value in
            guard key.starts(with: prefixBytes) else { return false }
            return try body(key, value)
        }
    }

    /// Walks the database backwards from its last key, until `body` returns false.
    public func scanBackward(_ db: Database, _ body: ([UInt8], [UInt8]) throws -> Bool) throws {
        try handle.withScanCursor(db, path) { cursor in
            var key = MDB_val(), data = MDB_val()
            var rc = mdb_cursor_get(cursor, &key, &data, MDB_LAST)
            while rc == 0 {
                guard try body(handle.copy(key, db, path), handle.copy(data, db, path)) else { return }
                rc = mdb_cursor_get(cursor, &key, &data, MDB_PREV)
            }
            if rc != MDB_NOTFOUND { try check(rc, "mdb_cursor_get \(db.name)", path) }
        }
    }

    /// The last entry (greatest key), if any.
    public func last(_ db: Database) throws(LMDBError) -> (key: [UInt8], value: [UInt8])? {
        let cursor = try handle.cursor(db, path)
        var key = MDB_val(), data = MDB_val()
        let rc = mdb_cursor_get(cursor, &key, &data, MDB_LAST)
        if rc == MDB_NOTFOUND { return nil }
        try check(rc, "mdb_cursor_get \(db.name)", path)
        return (try handle.copy(key, db, path), try handle.copy(data, db, path))
    }

    /// `mdb_stat` of one database.
    public func statistics(_ db: Database) throws(LMDBError) -> DatabaseStatistics {
        var stat = MDB_stat()
        try check(mdb_stat(handle.txn, db.dbi, &stat), "mdb_stat \(db.name)", path)
        return DatabaseStatistics(entries: Int(stat.ms_entries), depth: Int(stat.ms_depth),
                                  branchPages: Int(stat.ms_branch_pages), leafPages: Int(stat.ms_leaf_pages),
                                  overflowPages: Int(stat.ms_overflow_pages), pageSize: Int(stat.ms_psize))
    }

    func checkKey(_ key: some ByteSource, _ db: Database, _ operation: String) throws(LMDBError) {
        let size = key.byteCount
        if size > LMDBLimits.maxKeySize || size == 0 {
            throw LMDBError(code: size == 0 ? .badValueSize : .keyTooLong, operation: "\(operation) \(db.name)", path: path,
                            detail: "key is \(size) bytes; LMDB keys must be 1...\(LMDBLimits.maxKeySize)")
        }
    }
}

/// Flags for ``WriteTransaction/put(_:key:value:flags:)``.
public struct PutFlags: OptionSet, Sendable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// Fail with ``LMDBError/Code/keyExists`` instead of replacing (`MDB_NOOVERWRITE`).
    public static let noOverwrite = PutFlags(rawValue: UInt32(MDB_NOOVERWRITE))
    /// On DUPSORT: do nothing if the exact pair exists (`MDB_NODUPDATA`).
    public static let noDuplicateData = PutFlags(rawValue: UInt32(MDB_NODUPDATA))
    /// The key is greater than every key in the database (`MDB_APPEND`): a fast bulk load.
    public static let append = PutFlags(rawValue: UInt32(MDB_APPEND))
}

extension WriteTransaction {
    /// Stores `value` under `key`. On a DUPSORT database, adds `value` as one more duplicate.
    /// - Throws: ``LMDBError/Code/keyExists`` with ``PutFlags/noOverwrite``;
    ///   ``LMDBError/Code/keyTooLong`` for keys (and DUPSORT values) over 511 bytes.
    public func put(_ db: Database, key: some ByteSource, value: some ByteSource, flags: PutFlags = []) throws(LMDBError) {
        try checkKey(key, db, "put")
        if db.flags.contains(.duplicateSort) { try checkKey(value, db, "put (duplicate value)") }
        let rc = withVal(key) { k in withVal(value) { v in mdb_put(handle.txn, db.dbi, &k, &v, flags.rawValue) } }
        if rc == MDB_MAP_FULL { handle.sawMapFull = true }
        try check(rc, "mdb_put \(db.name)", path)
    }

    /// Stores `value` under `key` if `key` sorts after every key of `db` (`MDB_APPEND`): LMDB
    /// goes straight to the last leaf instead of searching from the root. For databases whose
    /// keys mostly arrive in order (time-ordered ids, sequence numbers); not for DUPSORT
    /// databases.
    /// - Returns: false, having written nothing, when `key` does not sort after the last key
    ///   (an equal key included): the caller then puts it the ordinary way.
    public func appendIfLast(_ db: Database, key: some ByteSource, value: some ByteSource) throws(LMDBError) -> Bool {
        precondition(!db.flags.contains(.duplicateSort), "appendIfLast is for databases without duplicates")
        do {
            try put(db, key: key, value: value, flags: .append)
            return true
        } catch {
            guard error.code == .keyExists else { throw error }
            return false
        }
    }

    /// Stores `value` under `key` as 8 little-endian bytes, the form ``TransactionReading/uint64(_:key:)``
    /// reads; no allocation. For counters kept as fixed-width values.
    public func put(_ db: Database, key: some ByteSource, uint64 value: UInt64) throws(LMDBError) {
        try checkKey(key, db, "put")
        let rc = withVal(key) { k in
            withUnsafeBytes(of: value.littleEndian) { raw in
                var v = MDB_val(mv_size: raw.count, mv_data: UnsafeMutableRawPointer(mutating: raw.baseAddress))
                return mdb_put(handle.txn, db.dbi, &k, &v, 0)
            }
        }
        if rc == MDB_MAP_FULL { handle.sawMapFull = true }
        try check(rc, "mdb_put \(db.name)", path)
    }

    /// Deletes `key` (all its duplicates), or on a DUPSORT database with `value`, just that
    /// pair (`mdb_del(key, value)`, the safe path on LMDB 0.9.24, rule 10).
    /// - Returns: false when there was nothing to delete.
    @discardableResult
    public func delete(_ db: Database, key: some ByteSource, value: (some ByteSource)? = [UInt8]?.none) throws(LMDBError) -> Bool {
        try checkKey(key, db, "delete")
        let rc: Int32 = withVal(key) { k in
            if let value {
                return withVal(value) { v in mdb_del(handle.txn, db.dbi, &k, &v) }
            }
            return mdb_del(handle.txn, db.dbi, &k, nil)
        }
        if rc == MDB_NOTFOUND { return false }
        if rc == MDB_MAP_FULL { handle.sawMapFull = true }
        try check(rc, "mdb_del \(db.name)", path)
        return true
    }

    /// Removes every entry of `db` (`mdb_drop(dbi, 0)`); the handle stays valid.
    public func removeAll(_ db: Database) throws(LMDBError) {
        try check(mdb_drop(handle.txn, db.dbi, 0), "mdb_drop \(db.name)", path)
    }
}

/// `mdb_stat` figures of one database.
public struct DatabaseStatistics: Sendable, Codable {
    public let entries: Int
    public let depth: Int
    public let branchPages: Int
    public let leafPages: Int
    public let overflowPages: Int
    public let pageSize: Int
    public var bytes: Int { (branchPages + leafPages + overflowPages) * pageSize }
}
