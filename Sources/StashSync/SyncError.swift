import Foundation
import Stash

/// A sync failure, with a message naming the store, peer or file and what to do.
/// Every refusal leaves the store exactly as it was.
public struct SyncError: Error, CustomStringConvertible, Sendable {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        public var description: String { name }

        /// Not a delta, or truncated, or its checksum does not match (damaged in storage or on
        /// the way): a full snapshot from its source supersedes it.
        public static let corruptDelta = Code("corruptDelta")
        /// A delta format newer than this library.
        public static let unsupportedVersion = Code("unsupportedVersion")
        /// An intact delta (its checksum matches) holding what this library cannot read: a
        /// newer library, or a faulty one, wrote it. Another copy, or a full snapshot from the
        /// same source, would read no better: upgrade Stash.
        public static let unreadableDelta = Code("unreadableDelta")
        /// An intact, authenticated delta holding what no replica writes: a field named `id`
        /// or with no name, a counter field whose value is no counter's state, a record lacking
        /// a field that the source's schema, the same as this store's, requires. Its source is
        /// faulty or hostile: a full snapshot of it would hold the same.
        public static let invalidDelta = Code("invalidDelta")
        /// The delta belongs to another store family (account / container).
        public static let foreignFamily = Code("foreignFamily")
        /// The delta is not authenticated with this store's sync key (or has a wrong HMAC).
        public static let unauthenticated = Code("unauthenticated")
        /// The delta starts after changes from its source that this store has not applied.
        public static let gap = Code("gap")
        /// The store has no family yet: configure one before syncing.
        public static let noFamily = Code("noFamily")
        /// Sync is off for this store (preference or policy at open).
        public static let disabled = Code("disabled")
        /// The transport could not take or give deltas (full, over quota, unavailable).
        public static let transportFailed = Code("transportFailed")
        /// The delta was made for another store (it leaves out what that store already has).
        public static let wrongRecipient = Code("wrongRecipient")
        /// The delta was built against the same store that imports it.
        public static let ownDelta = Code("ownDelta")
        /// The transport already holds history of this store's site past what the store has:
        /// the store was rolled back (a file-system snapshot) or cloned with its file identity.
        /// It takes a new site at its next open (``Stash/Store/requestNewSite()``).
        public static let siteReused = Code("siteReused")
        /// The store was opened read-only (``Stash/StoreOptions/readOnly``): sync writes to it.
        public static let readOnlyStore = Code("readOnlyStore")
    }

    /// What went wrong, to switch on.
    public let code: Code
    /// The full explanation, for logs and users (also the ``description``).
    public let message: String

    /// An error of `code` (a custom ``SyncTransport`` throws `.transportFailed`).
    public init(_ code: Code, _ message: String) {
        self.code = code
        self.message = message
    }

    public var description: String { message }
}
