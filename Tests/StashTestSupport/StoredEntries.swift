import StashLMDB

/// A store's LMDB entries read and changed behind the store's back, for tests of damaged
/// stores: the entry of a database (`records`, `versions`, …) whose key ends with a record
/// id's 16 bytes.
public enum StoredEntries {
    /// No entry of `database` has a key ending with the bytes asked for.
    public struct NotFound: Error, CustomStringConvertible {
        public let database: String
        public var description: String { "no entry of '\(database)' has a key ending with the given id" }
    }

    /// The key and value of the first entry of `database` in `env` whose key ends with
    /// `suffix`.
    /// - Throws: ``NotFound`` when there is none.
    public static func find(_ database: String, keyEndingWith suffix: [UInt8], in env: Environment) throws -> (key: [UInt8], value: [UInt8]) {
        let db = try env.database(database)
        var found: (key: [UInt8], value: [UInt8])?
        try env.read { txn in
            try txn.scan(db, from: ScanStart<[UInt8]>.first) { key, value in
                if key.suffix(suffix.count).elementsEqual(suffix) { found = (key, value); return false }
                return true
            }
        }
        guard let found else { throw NotFound(database: database) }
        return found
    }

    /// Replaces the value of that entry of the store at `path` with `value`, or deletes the
    /// entry (nil).
    /// - Throws: ``NotFound`` when there is none.
    public static func replace(_ database: String, keyEndingWith suffix: [UInt8], at path: String, with value: [UInt8]?) throws {
        let env = try Environment.open(path: path)
        let key = try find(database, keyEndingWith: suffix, in: env).key
        let db = try env.database(database)
        try env.write { txn in
            if let value { try txn.put(db, key: key, value: value) }
            else if try !txn.delete(db, key: key) { throw NotFound(database: database) }
        }
    }
}
