import CLMDB
import Foundation

/// An error returned by LMDB, or by the Swift layer that guards it.
///
/// Every error names the environment path and the operation that failed, so a log line
/// alone is enough to find the store:
///
/// ```swift
/// do { try env.write { txn in try txn.put(db, key: k, value: v) } }
/// catch let error as LMDBError where error.code == .mapFull { … }
/// catch let error as LMDBError { print(error) }   // "LMDB put in /data/store: …"
/// ```
///
/// `Code` is an extensible struct (not an enum) so new codes never break callers; switch on
/// it with `case .notFound:` patterns.
public struct LMDBError: Error, CustomStringConvertible, Sendable {
    /// The LMDB return code (or a POSIX errno, or one of Stash's own codes below -40000).
    public struct Code: RawRepresentable, Hashable, Sendable, CustomStringConvertible {
        public let rawValue: Int32
        public init(rawValue: Int32) { self.rawValue = rawValue }

        public static let keyExists = Code(rawValue: MDB_KEYEXIST)
        public static let notFound = Code(rawValue: MDB_NOTFOUND)
        public static let pageNotFound = Code(rawValue: MDB_PAGE_NOTFOUND)
        public static let corrupted = Code(rawValue: MDB_CORRUPTED)
        public static let panic = Code(rawValue: MDB_PANIC)
        public static let versionMismatch = Code(rawValue: MDB_VERSION_MISMATCH)
        public static let invalid = Code(rawValue: MDB_INVALID)
        public static let mapFull = Code(rawValue: MDB_MAP_FULL)
        public static let databasesFull = Code(rawValue: MDB_DBS_FULL)
        public static let readersFull = Code(rawValue: MDB_READERS_FULL)
        public static let tlsFull = Code(rawValue: MDB_TLS_FULL)
        public static let transactionFull = Code(rawValue: MDB_TXN_FULL)
        public static let cursorFull = Code(rawValue: MDB_CURSOR_FULL)
        public static let pageFull = Code(rawValue: MDB_PAGE_FULL)
        public static let mapResized = Code(rawValue: MDB_MAP_RESIZED)
        public static let incompatible = Code(rawValue: MDB_INCOMPATIBLE)
        public static let badReaderSlot = Code(rawValue: MDB_BAD_RSLOT)
        public static let badTransaction = Code(rawValue: MDB_BAD_TXN)
        public static let badValueSize = Code(rawValue: MDB_BAD_VALSIZE)
        public static let badDatabase = Code(rawValue: MDB_BAD_DBI)
        // Stash's own codes: programming errors caught before they reach LMDB.
        /// A write transaction was started on a thread that already runs one (rule 3).
        public static let nestedWrite = Code(rawValue: -40001)
        /// A key or DUPSORT value is longer than LMDB's 511-byte limit (rule 6).
        public static let keyTooLong = Code(rawValue: -40002)
        /// A database name was not declared when the environment was opened (rule 7).
        public static let unknownDatabase = Code(rawValue: -40003)
        /// The map cannot grow further (configured maximum reached).
        public static let mapLimit = Code(rawValue: -40004)
        /// The environment holds data other than the configured databases
        /// (``EnvironmentConfiguration/refusesForeignData``).
        public static let foreignData = Code(rawValue: -40005)
        /// A write to an environment opened read-only (``EnvironmentConfiguration/readOnly``),
        /// or an open for writing of a directory this process has open read-only.
        public static let readOnly = Code(rawValue: -40006)
        /// Resizing the map failed after LMDB had unmapped the file (out of address space): the
        /// environment cannot be used until every store of its directory is closed and reopened.
        public static let mapLost = Code(rawValue: -40007)
        /// The directory's data file was deleted or replaced while this process still has the
        /// environment of the old one open: an open would share that, not the files now there.
        public static let replaced = Code(rawValue: -40008)
        /// The file system is full (`ENOSPC`; also a write LMDB saw cut short, `EIO`, on a
        /// file system with no room left): nothing of the write was committed.
        public static let noSpace = Code(rawValue: ENOSPC)
        /// Another process has the environment open, and the operation needs it to itself
        /// (compaction in place).
        public static let inUse = Code(rawValue: -40009)
        /// Stash found the data file damaged where LMDB would read it without a check: a file
        /// shorter than its meta pages say, a key or value running past its end.
        public static let damaged = Code(rawValue: -40010)
        /// The environment was closed (``Environment/releaseHandle()``, through `Store.close()`).
        public static let closed = Code(rawValue: -40011)

        public var description: String {
            switch self {
            case .nestedWrite: return "nested write transaction on one thread"
            case .keyTooLong: return "key longer than \(LMDBLimits.maxKeySize) bytes"
            case .unknownDatabase: return "database not declared at open"
            case .mapLimit: return "map size limit reached"
            case .foreignData: return "the environment holds other data than its declared databases"
            case .readOnly: return "the environment is open read-only"
            case .mapLost: return "the map was lost in a failed resize"
            case .replaced: return "the data file was deleted or replaced while this process has the old one open"
            case .noSpace: return "no space left on device"
            case .inUse: return "the environment is open in another process"
            case .damaged: return "the data file is damaged"
            case .closed: return "the environment was closed"
            default: return String(cString: mdb_strerror(rawValue))
            }
        }

        /// Lets `switch error.code { case .mapFull: … }` match families of codes.
        public static func ~= (pattern: Code, value: Code) -> Bool { pattern == value }
    }

    public let code: Code
    /// The LMDB call or Swift operation that failed, such as `mdb_put` or `open`.
    public let operation: String
    /// The environment directory.
    public let path: String
    /// Extra words about what to do, if any.
    public let detail: String?

    public init(code: Code, operation: String, path: String, detail: String? = nil) {
        self.code = code
        self.operation = operation
        self.path = path
        self.detail = detail
    }

    public var description: String { message(naming: true) }

    /// The description, without the directory when `naming` is false (for a message that
    /// names it already, such as a store's: "store /a: LMDB write in /a: …" said it twice).
    public func message(naming: Bool) -> String {
        var text = naming ? "LMDB \(operation) in \(path): " : "LMDB \(operation): "
        text += "\(code) (\(code.rawValue))"
        if let detail { text += "; \(detail)" }
        return text
    }
}

/// Fixed limits of the LMDB build Debian ships (0.9.24).
public enum LMDBLimits {
    /// `mdb_env_get_maxkeysize` for the default build: keys and DUPSORT values must not exceed it.
    public static let maxKeySize = 511
}

@inline(__always)
func check(_ rc: Int32, _ operation: @autoclosure () -> String, _ path: @autoclosure () -> String) throws(LMDBError) {
    if rc != 0 { throw LMDBError.failure(rc, operation(), path()) }
}
