import Foundation
import StashLMDB

/// An error from the store, with a message that names the store, type, record or field
/// involved and says what to do.
///
/// ```swift
/// do { try store.insert(item) }
/// catch let error as StoreError where error.code == .uniqueViolation { … }
/// ```
/// `Code` is an extensible struct: new codes never break a `switch` with a `default`.
public struct StoreError: Error, CustomStringConvertible, Sendable {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        public var description: String { name }

        /// The type is not in the store's schema.
        public static let unknownType = Code("unknownType")
        /// The field is not in the type's schema: a query names it, or a generic put
        /// (``StoreTransaction/put(_:replacing:)``) writes it to a type whose fields are known.
        public static let unknownField = Code("unknownField")
        /// A value does not fit its field (wrong kind, a required field left out or null,
        /// malformed JSON, bad id).
        public static let invalidValue = Code("invalidValue")
        /// Insert of an id that exists.
        public static let duplicateID = Code("duplicateID")
        /// Update of an id that does not exist.
        public static let notFound = Code("notFound")
        /// A unique index already holds the value.
        public static let uniqueViolation = Code("uniqueViolation")
        /// The declared schema cannot be reconciled with the stored one without a migration.
        public static let incompatibleSchema = Code("incompatibleSchema")
        /// Stored bytes could not be decoded, do not match their checksum, or LMDB found its
        /// own pages damaged (`MDB_CORRUPTED`, `MDB_PAGE_NOTFOUND`, a data file cut short).
        public static let corrupted = Code("corrupted")
        /// The directory is not a Stash store (or is a newer format).
        public static let notAStore = Code("notAStore")
        /// An index was asked for that the type does not declare.
        public static let noSuchIndex = Code("noSuchIndex")
        /// History a registered consumer still needs would be purged.
        public static let historyNeeded = Code("historyNeeded")
        /// History after the requested token was purged: the reader must resynchronize.
        public static let historyPurged = Code("historyPurged")
        /// A history token past the store's newest entry: it belongs to another store, or to
        /// this store before it was restored from an older copy.
        public static let historyAhead = Code("historyAhead")
        /// LMDB failed; ``StoreError/underlying`` holds the ``LMDBError``.
        public static let storage = Code("storage")
        /// The file system holding the store is full ("no space left on device"): nothing of
        /// the write was committed, and the store works again once space is freed.
        /// ``StoreError/underlying`` holds the ``LMDBError`` (``LMDBError/Code/noSpace``).
        public static let noSpace = Code("noSpace")
        /// The operation needs the store to itself (compaction in place), and another process,
        /// or a `Store` of this one, has it open.
        public static let inUse = Code("inUse")
        /// A write was started inside another write on the same thread (it would wait for
        /// itself): a programming error, not a storage fault. Do the work in the outer
        /// write's transaction.
        public static let nestedWrite = Code("nestedWrite")
        /// A write to a store opened with ``StoreOptions/readOnly``, a read-only open of a
        /// store that must be upgraded first, or an open for writing of a store this process
        /// has open read-only.
        public static let readOnly = Code("readOnly")
        /// The store was closed (``Store/close()``): open it again to go on.
        public static let closed = Code("closed")
        /// A record refers to a parent that does not exist (a ``RecordReference`` field naming a
        /// record its parent type does not hold).
        public static let parentNotFound = Code("parentNotFound")
        /// A delete was refused because records refer to the record through a reference whose
        /// rule is ``DeleteRule/deny``.
        public static let deleteDenied = Code("deleteDenied")
        /// The file of an external value (``ExternalData``) could not be written or read,
        /// or holds other bytes than its name says.
        public static let blob = Code("blob")
    }

    /// What went wrong, to switch on.
    public let code: Code
    /// The full explanation, for logs and users (also the ``description``).
    public let message: String
    /// The error behind it, when there is one (the ``LMDBError`` of `.storage`).
    public let underlying: (any Error & Sendable)?

    /// An error of `code`; `message` should name the store and say what to do.
    public init(_ code: Code, _ message: String, underlying: (any Error & Sendable)? = nil) {
        self.code = code
        self.message = message
        self.underlying = underlying
    }

    public var description: String { message }
}
