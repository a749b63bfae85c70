import CLMDB

/// How hard a commit works to reach the disk. Chosen when the environment opens.
public enum Durability: String, Sendable, Codable, CaseIterable {
    /// `fsync` at every commit (LMDB's default). A returned commit survives a power cut.
    case full
    /// `MDB_NOMETASYNC`: data pages are synced, the meta page is not. A power cut may lose
    /// the last commit(s) but never corrupts the store. Roughly halves the sync cost.
    case relaxed
    /// `MDB_NOSYNC`: the OS flushes when it likes. A power cut may lose many commits and,
    /// with a filesystem that reorders writes, corrupt the store. Throwaway stores only.
    case none

    /// How much a power cut may cost, in order: none < relaxed < full.
    var strength: Int {
        switch self {
        case .none: return 0
        case .relaxed: return 1
        case .full: return 2
        }
    }

    var flags: UInt32 {
        switch self {
        case .full: return 0
        case .relaxed: return UInt32(MDB_NOMETASYNC)
        case .none: return UInt32(MDB_NOSYNC)
        }
    }
}

/// Flags of a named database, fixed when it is first created.
public struct DatabaseFlags: OptionSet, Sendable, Hashable {
    public let rawValue: UInt32
    public init(rawValue: UInt32) { self.rawValue = rawValue }
    /// `MDB_DUPSORT`: several sorted values per key.
    public static let duplicateSort = DatabaseFlags(rawValue: UInt32(MDB_DUPSORT))
    /// `MDB_DUPFIXED`: all duplicates of a key have the same size (with `duplicateSort`).
    public static let duplicateFixed = DatabaseFlags(rawValue: UInt32(MDB_DUPFIXED))
}

/// A named database to open (or create) when the environment opens (LMDB rule 7:
/// every handle is opened once, in one write transaction, and never closed).
public struct DatabaseSpec: Sendable, Hashable {
    public var name: String
    public var flags: DatabaseFlags
    public init(_ name: String, flags: DatabaseFlags = []) {
        self.name = name
        self.flags = flags
    }
}

/// An opened named database: a handle valid for the life of its ``Environment``.
public struct Database: Sendable, Hashable, CustomStringConvertible {
    public let name: String
    public let flags: DatabaseFlags
    let dbi: MDB_dbi
    public var description: String { name }
}

/// Options for ``Environment/open(path:configuration:)``.
public struct EnvironmentConfiguration: Sendable {
    /// The first map size in bytes. The map doubles by itself when a write finds it full,
    /// so this only needs to be a reasonable start. Default 64 MiB.
    public var initialMapSize: Int = 64 << 20
    /// The map never grows past this. Default 1 TiB (the file is sparse; only used pages cost disk).
    public var maximumMapSize: Int = 1 << 40
    /// Concurrent read transactions across all processes. Default 126 (LMDB's default).
    public var maxReaders: Int = 126
    /// Named databases the environment may hold. Default 16.
    public var maxDatabases: Int = 16
    public var durability: Durability = .full
    /// The named databases, all opened at start.
    public var databases: [DatabaseSpec] = []
    /// Refuse an environment whose main database holds keys, none of them the name of one of
    /// ``databases`` (another program's LMDB data), with ``LMDBError/Code/foreignData``, before
    /// anything is created in it. Default false.
    public var refusesForeignData = false
    /// Open without writing: the directory is not created, the databases are opened in a read
    /// transaction (every one of ``databases`` must exist: a missing one throws
    /// ``LMDBError/Code/notFound`` naming it), and the open does not wait for another
    /// process's write. Where the files can be written, LMDB still opens them read-write, so
    /// that a writable open in this process shares the environment (write through it only if
    /// you mean to: the store layer refuses writes of its read-only opens). Where they cannot
    /// (a read-only file system, files this user cannot write), it opens them `MDB_RDONLY`:
    /// ``Environment/isReadOnly`` is true, ``Environment/write(isolation:_:)`` throws
    /// ``LMDBError/Code/readOnly``, and a writable open in this process is refused while it
    /// lives. Default false.
    public var readOnly = false

    public init(databases: [DatabaseSpec] = [], durability: Durability = .full) {
        self.databases = databases
        self.durability = durability
    }
}
