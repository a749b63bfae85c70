import Foundation
import StashLMDB
import Synchronization

/// How a record write treats an existing record with the same id.
enum WriteMode {
    case insert, update, upsert
}

/// The state of one write transaction: the schema as it grows, count deltas and the
/// changes that become this transaction's history entry. Every record write goes through
/// ``put(_:id:bytes:mode:)`` or ``remove(_:id:)``: record, indexes, counts and history
/// are updated together.
///
/// One context serves one write transaction on one thread, so the runtime's exclusivity
/// checks on its hot properties (several per record) are left out.
final class WriteContext: FieldTagResolver {
    let path: String
    let txn: WriteTransaction
    let dbs: StoreDatabases
    let siteID: RecordID
    let author: String?
    /// A number no other write context of this process has (see ``ChangeCursor/transaction``).
    let serial: UInt64
    private static let serials = Atomic<UInt64>(0)
    private(set) var catalog: Catalog
    @exclusivity(unchecked) private var schemaChanged = false
    @exclusivity(unchecked) private(set) var encodingType = ""
    @exclusivity(unchecked) private var encodingLayout: TypeLayout?
    /// The capacity the next record encoding reserves (see ``encode(_:)``).
    @exclusivity(unchecked) private var encodedSizeHint = 256
    /// Buffers ``put(_:id:record:mode:versions:origin:absent:)`` reuses from one record to
    /// the next: the index keys that change, and the bytes of a new record's versions.
    @exclusivity(unchecked) private var keyChanges: [(old: KeyBytes?, new: KeyBytes)] = []
    @exclusivity(unchecked) private var scratch = ByteWriter(capacity: 128)
    @exclusivity(unchecked) private var versionScratch = RecordVersions.EncodingScratch()
    /// Type tags a new key of which did not sort last in this transaction (see ``putNew``).
    @exclusivity(unchecked) private var appendMisses: [UInt16] = []
    @exclusivity(unchecked) private var countDeltas: [UInt16: Int] = [:]
    /// Unique index keys that merges of this transaction gave a record, unchecked, with the
    /// record's type: clashes are settled at commit, on the final state (see
    /// ``settleMergedUniqueClashes()``).
    @exclusivity(unchecked) private var mergedUniqueKeys: [KeyBytes: String] = [:]
    /// This transaction's changes so far: its history entry at commit.
    @exclusivity(unchecked) private(set) var changes: [HistoryChange.Stored] = []
    let now: @Sendable () -> Date
    /// The hybrid logical clock: the highest clock used or observed, persisted at commit.
    @exclusivity(unchecked) private var lastClock: UInt64?
    @exclusivity(unchecked) private var localVersion: Version?

    init(path: String, txn: WriteTransaction, dbs: StoreDatabases, catalog: Catalog, siteID: RecordID, author: String?,
         now: @escaping @Sendable () -> Date) {
        self.path = path
        self.txn = txn
        self.dbs = dbs
        self.catalog = catalog
        self.siteID = siteID
        self.author = author
        self.now = now
        serial = Self.serials.add(1, ordering: .relaxed).newValue
    }

    convenience init(store: Store, txn: WriteTransaction, author: String?) throws {
        let catalog = try store.reloadCatalog(txn)   // first: it notes a new site
        self.init(path: store.path, txn: txn, dbs: store.dbs, catalog: catalog,
                  siteID: store.siteID, author: author, now: store.now)
        keptUniqueIndexes = store.keptUniqueIndexes
        recordTypes = store.recordTypes
        referenceTracker.enabled = true
        if let indexes = store.recentCounts.keptIndexes {
            recentCounts = store.recentCounts
            // A kept index another open dropped (`dropsUndeclaredIndexes`) has no entries for
            // this transaction to note, which says nothing of its groups: its commit leaves
            // them unknown (it does not list the index), rather than unchanged.
            func exists(_ index: UInt32) -> Bool {
                catalog.layoutsByTag[UInt16(index >> 16)]?.schema.indexes.contains { $0.tag == UInt16(truncatingIfNeeded: index) } == true
            }
            changedGroups = ChangedGroups(indexes: indexes.allSatisfy(exists) ? indexes : indexes.filter(exists))
        }
    }

    /// Where the counts this transaction leaves go once it commits (nil: nothing is kept,
    /// nothing is noted), and the groups of the kept indexes it changes.
    private var recentCounts: RecentCounts?
    @exclusivity(unchecked) private var changedGroups = ChangedGroups(indexes: [])

    @inline(__always)
    private func noteGroup(_ key: borrowing KeyBytes) {
        if recentCounts != nil { changedGroups.note(key) }
    }

    /// Unique indexes ("Type.index") this process declares plain, kept unique at open (see
    /// ``StoreOptions/relaxesUniqueIndexes``): a violation says so.
    var keptUniqueIndexes: Set<String> = []
    /// The app's Swift types by record type name (``Store/recordTypes``).
    var recordTypes: [String: any Record.Type] = [:]
    /// The references this transaction must check or apply when it ends (``RecordReference``).
    @exclusivity(unchecked) var referenceTracker = ReferenceTracker()

    // MARK: Clock

    private func storedClock() throws -> UInt64 {
        if let lastClock { return lastClock }
        let stored = try txn.uint64(dbs.meta, key: MetaKey.clock) ?? 0
        // Every write takes a clock past it: at the top of the range the store's meta is
        // damaged, and a write would trap.
        guard stored < UInt64.max else {
            throw StoreError(.corrupted, "store \(path): its stored clock is \(stored), past any time: the meta database is damaged; restore the store from a backup or a peer")
        }
        lastClock = stored
        return stored
    }

    /// The version of this transaction's local writes: newer than every clock this store has
    /// used or observed (hybrid logical clock), shared by all writes until a newer observation.
    func writeVersion() throws -> Version {
        let last = try storedClock()
        if let localVersion, localVersion.clock >= last { return localVersion }
        let clock = max(clockReading(now()), last + 1)
        lastClock = clock
        let version = Version(clock: clock, site: siteID)
        localVersion = version
        return version
    }

    /// Lets the clock see a remote version, so later local writes are newer. The clock
    /// follows it at most ``maximumClockSkew`` past local wall time: a device with a wrong
    /// clock cannot drag this store's clock a day ahead. (Its write still loses to any
    /// later local write of the same field, see ``bumped(_:over:)``.)
    func observe(_ version: Version) throws {
        let cap = clockReading(now().addingTimeInterval(maximumClockSkew))
        let seen = min(version.clock, cap)
        if seen > (try storedClock()) { lastClock = seen }
    }

    /// A local write's version for something that had version `old`: newer than what it
    /// overwrites, even when `old` came from a device whose clock runs ahead.
    func bumped(_ version: Version, over old: Version?) -> Version {
        guard let old, old >= version else { return version }
        // Merges refuse clocks past `Version.maximumClock`; saturating keeps a damaged store
        // from trapping here.
        return Version(clock: old.clock == .max ? .max : old.clock + 1, site: version.site)
    }

    /// The new catalog when this transaction changed the schema, or what it carries of types
    /// and fields it does not declare.
    var changedCatalog: Catalog? { schemaChanged || carriedChanged ? catalog : nil }

    /// Actions to run once this transaction has committed (``StoreTransaction/afterCommit(_:)``).
    private(set) var afterCommitActions: [() -> Void] = []

    func afterCommit(_ action: @escaping () -> Void) { afterCommitActions.append(action) }

    func layout(_ name: String) throws -> TypeLayout { try catalog.layout(name, store: path) }

    // MARK: Schema growth

    func updateSchema(_ change: (inout StoreSchema) throws -> Void) rethrows {
        var schema = catalog.schema
        try change(&schema)
        if schema != catalog.schema {
            catalog = Catalog(schema: schema, generation: catalog.generation + 1, carried: catalog.carried)
            schemaChanged = true
            encodingLayout = nil
        }
    }

    @exclusivity(unchecked) private var carriedChanged = false

    /// Changes what the store keeps of undeclared types and fields (``CarriedSchema``); saved
    /// with the schema generation at commit, so other opens read it again.
    func updateCarried(_ change: (inout CarriedSchema) throws -> Void) rethrows {
        var carried = catalog.carried
        try change(&carried)
        if carried != catalog.carried {
            catalog = Catalog(schema: catalog.schema, generation: catalog.generation + 1, carried: carried)
            carriedChanged = true
            encodingLayout = nil
        }
    }

    /// The migration running (type name) and the kinds it wrote per field. Read for every field
    /// encoded: no runtime exclusivity check (one context serves one write transaction).
    @exclusivity(unchecked) var migration: (type: String, kinds: [String: Set<FieldKind>])?

    func hasDefault(_ name: String) -> Bool {
        (try? currentEncodingLayout())?.defaults[name] != nil
    }

    func tag(for name: String, kind: FieldKind?, hint: Int) throws -> (tag: UInt16, slot: Int) {
        let layout = try currentEncodingLayout()
        if let slot = layout.slot(of: name, hint: hint) {
            let tag = layout.tags[slot]
            if let kind, migration?.type == encodingType, !layout.anyKinds[slot] { migration?.kinds[name, default: []].insert(kind) }
            if let kind, layout.kinds[slot] != kind {
                // A field of any kind (a FieldValue, a JSONValue) keeps no kind.
                if layout.anyKinds[slot] { return (tag, slot) }
                // A migration of the type rewrites every record of it: the field takes the kind
                // it writes (``SchemaMerger`` checks afterwards that all agree).
                guard let stored = layout.kinds[slot], migration?.type != encodingType else {
                    let type = encodingType
                    updateSchema { schema in
                        let t = schema.types.firstIndex { $0.name == type }!
                        let f = schema.types[t].fields.firstIndex { $0.tag == tag }!
                        schema.types[t].fields[f].kind = kind
                    }
                    return (tag, slot)
                }
                throw StoreError(.incompatibleSchema, "store \(path): \(encodingType).\(name) is stored as \(stored.rawValue), got \(kind.rawValue); change a field's kind with a Migration. A field holds one kind: a property whose values are of several kinds (an enum of Int or String, say) must store them as one (text, or inside a map), or be a FieldValue or JSONValue")
            }
            return (tag, slot)
        }
        let type = encodingType
        // Fields are learned from writes (an unprobed type's encode(to:), a merge): the tags
        // of one type can run out.
        guard (layout.schema.fields.map(\.tag).max() ?? 0) < UInt16.max else {
            throw StoreError(.incompatibleSchema, "store \(path): \(type) has \(layout.schema.fields.count) fields, the most a type can have; a type that writes a field per key of its data should keep those keys in a dictionary field")
        }
        // A field a migration creates: its first kind counts too, or a later record writing
        // another kind would leave both unnoticed.
        if let kind, migration?.type == type { migration?.kinds[name, default: []].insert(kind) }
        var newTag: UInt16 = 0, newSlot = 0
        updateSchema { schema in
            let t = schema.types.firstIndex { $0.name == type }!
            newTag = schema.types[t].nextFieldTag
            newSlot = schema.types[t].fields.count
            schema.types[t].fields.append(FieldSchema(name: name, tag: newTag, kind: kind, optional: true))
        }
        return (newTag, newSlot)
    }

    /// The layout of the type being encoded, looked up once per record (and again after the
    /// schema grew), not once per field.
    private func currentEncodingLayout() throws -> TypeLayout {
        if let encodingLayout { return encodingLayout }
        let layout = try self.layout(encodingType)
        encodingLayout = layout
        return layout
    }

    // MARK: Encoding

    func encode<R: Record>(_ record: R) throws -> (TypeLayout, EncodedRecord) {
        // By type first (a pointer-keyed lookup); by name when the catalog lacks the type,
        // which then throws `.unknownType`.
        if let layout = catalog.layout(of: R.self) {
            encodingType = layout.schema.name
            encodingLayout = layout
        } else {
            encodingType = R.recordType
            encodingLayout = nil
        }
        // Records written together tend to be alike: reserve what the last one took (up to
        // 64 KiB, so that one large record does not make every later one reserve as much).
        let encoded: EncodedRecord
        do {
            encoded = try RecordEncoder.encode(record, resolver: self, capacity: encodedSizeHint)
        } catch let error as EncodingError {
            throw StoreError(.invalidValue, "store \(path): \(R.recordType) \(record.id) cannot be stored: \(describe(error))")
        }
        encodedSizeHint = min(max(256, encoded.bytes.count + 32), 1 << 16)
        let layout = try currentEncodingLayout()
        if !IndexFieldCheck.isDone(R.self) { try checkIndexFields(R.self, encoded, layout) }
        return (layout, encoded)
    }

    /// For a type the open could not probe, the first record written shows what it stores:
    /// each field an index of the type names must be among them (written, or encoded as nil).
    private func checkIndexFields<R: Record>(_ type: R.Type, _ encoded: EncodedRecord, _ layout: TypeLayout) throws {
        if DeclaredFields.names(of: R.self) == nil {
            var stored = Set(encoded.nilNames)
            for field in encoded.fields {
                if let name = layout.schema.fields.first(where: { $0.tag == field.tag })?.name { stored.insert(name) }
            }
            for index in R.indexes {
                for (keyPath, field) in zip(index.keyPaths, index.fields) where !stored.contains(field) {
                    throw StoreError(.incompatibleSchema, "store \(path): \(R.recordType) declares an index on \(keyPath), but its encode(to:) stores no field '\(field)' (it stores: \(stored.sorted().joined(separator: ", "))); index stored properties whose coding key is their own name, not computed properties or renamed coding keys")
                }
            }
        }
        IndexFieldCheck.markDone(R.self)
    }

    func encode(_ record: GenericRecord) throws -> (TypeLayout, EncodedRecord) {
        encodingType = record.type
        encodingLayout = nil
        let encoded: EncodedRecord
        do {
            encoded = try RecordEncoder.encode(fields: record.fields, resolver: self)
        } catch let error as EncodingError {
            throw StoreError(.invalidValue, "store \(path): \(record.type) \(record.id) cannot be stored: \(describe(error))")
        }
        let layout = try currentEncodingLayout()
        // A counter's value is a `Counter`'s state: any other map was stored, and every typed
        // read of the record, and every merge of the field, failed on it.
        for field in layout.schema.fields where field.counter == true {
            guard let value = record.fields[field.name], value != .null else { continue }
            if let problem = Counter.problem(in: value) {
                throw StoreError(.invalidValue, "store \(path): \(record.type).\(field.name) of \(record.id) is a counter; its value must be a Counter's state, {\"sites\": {\"<site id>\": {\"increments\": n, \"decrements\": m}}} (as `stash get` prints it; totals are whole numbers of at least 0), not \(value) (\(problem))")
            }
        }
        return (layout, encoded)
    }

    // MARK: Record writes

    func versions(_ layout: TypeLayout, _ id: RecordID) throws -> RecordVersions? {
        guard let bytes = try txn.get(dbs.versions, key: StoreKeys.record(layout.schema.tag, id)) else { return nil }
        do { return try RecordVersions(decoding: bytes) }
        catch { throw StoreError(.corrupted, "store \(path): versions of \(layout.schema.name) \(id) cannot be decoded: \(error)") }
    }

    /// Writes one record with its index entries, count, versions and history change.
    ///
    /// Local writes pass no `versions`: the fields that changed get this transaction's
    /// version. A merge passes the merged versions and the origin of the change.
    ///
    /// A local write of a Swift type (`keepingFieldsUnknownTo`) keeps the stored fields that
    /// type does not know: written by a newer (or older) version of the app, or by another
    /// app sharing the store, they are neither its to remove nor changed by it. Without this,
    /// an update from a device still on an older version erased the newer fields, and sync
    /// carried the loss to every device. A field the type declares, or encoded as nil, is
    /// replaced as written. For a type that cannot be probed, what it encodes is all it is
    /// known to have: its `encode(to:)` must encode a nil field (`encodeIfPresent`, as
    /// synthesized Codable does) for the nil to clear the stored value.
    /// - Returns: false when nothing changed (same bytes and versions).
    @discardableResult
    func put(_ layout: TypeLayout, id: RecordID, record written: EncodedRecord, mode: WriteMode,
             versions merged: RecordVersions? = nil, origin: RecordID? = nil, absent: Bool = false,
             keepingFieldsUnknownTo swiftType: (any Record.Type)? = nil) throws -> Bool {
        var new = written
        let type = layout.schema
        let key = StoreKeys.record(type.tag, id)
        if mode == .insert, merged == nil, origin == nil, !absent, !type.indexes.contains(where: \.unique),
           try insertNew(layout, id: id, key: key, record: new) {
            noteReferenceWrite(type, id: id, changedTags: [], inserted: true, merged: false)
            return true
        }
        // `absent`: the caller has just seen that neither a record nor versions exist.
        let oldVersions = absent ? nil : try versions(layout, id)
        // Every stored record has a versions entry (a delete leaves its tombstone there, and
        // `verify` checks the rule), so an insert of an id without versions cannot collide:
        // one lookup instead of two. The record put below refuses to overwrite, should a
        // damaged store break the rule.
        let fresh = absent || (mode == .insert && oldVersions == nil)
        let oldBytes = fresh ? nil : try txn.get(dbs.records, key: key)
        switch (mode, oldBytes) {
        case (.insert, .some):
            throw StoreError(.duplicateID, "store \(path): \(type.name) \(id) already exists; use upsert or update to replace it")
        case (.update, .none):
            throw StoreError(.notFound, "store \(path): no \(type.name) with id \(id) to update")
        default: break
        }
        var decodedOld: EncodedRecord?
        if merged == nil, let oldBytes, oldBytes != new.bytes {
            let stored = try decodeStored(oldBytes, type.name, id)
            decodedOld = stored
            if let swiftType { new = keepingFields(of: stored, unknownTo: swiftType, in: new, layout) }
            new = try leavingDefaultsOut(of: new, missingFrom: stored, layout)
        }
        if oldBytes == new.bytes && (merged == nil || merged == oldVersions) { return false }
        let old = try decodedOld ?? oldBytes.map { try decodeStored($0, type.name, id) }
        // The same fields with the same bytes in another order (kept fields go last): no change.
        if merged == nil, let old, old.fields.count == new.fields.count,
           new.fields.allSatisfy({ old.holdsSameValue(of: $0.tag, at: $0.range, in: new) }) {
            return false
        }
        if old == nil, !type.indexes.contains(where: \.unique) {
            // A new record and no unique index: nothing to check first, no old key to remove.
            // The record first: on a damaged store its put throws before any index entry exists.
            try putRecord(type, id: id, key: key, new, fresh: fresh)
            try putIndexEntries(layout, id: id, new)
        } else {
            // A merge's or a migration's unique keys are judged once all of them are written.
            try changeIndexEntries(layout, id: id, old: old, new: new, merging: merged != nil || migration != nil)
            try putRecord(type, id: id, key: key, new, fresh: fresh)
        }
        var tags: [UInt16] = []
        if let old {
            for field in new.fields where !old.holdsSameValue(of: field.tag, at: field.range, in: new) { tags.append(field.tag) }
            for field in old.fields where new.range(of: field.tag) == nil { tags.append(field.tag) }
        } else {
            countDeltas[type.tag, default: 0] += 1
            tags = new.fields.map(\.tag)
        }
        // The versions are encoded into the reused `scratch` buffer: no allocation per write.
        scratch.bytes.removeAll(keepingCapacity: true)
        if let merged {
            if tags.isEmpty, let oldVersions {
                tags = merged.fields.filter { oldVersions.fields[$0.tag] != $0.version }.map(\.tag)
            }
            merged.encode(into: &scratch, reusing: &versionScratch)
        } else if old == nil {
            // A (re-)insert starts an incarnation newer than any delete of this id, and every
            // field written carries it.
            let tombstone = oldVersions?.tombstone
            let incarnation = bumped(try writeVersion(), over: tombstone)
            RecordVersions.encode(incarnation: incarnation, tombstone: tombstone, fieldTags: tags, into: &scratch)
        } else {
            let version = try writeVersion()
            var versions = oldVersions ?? RecordVersions(incarnation: nil, tombstone: nil, fields: [:])
            for tag in tags {
                var over = versions.fields[tag]
                // A value another replica wrote in another kind, carried under the same name:
                // this write is newer, and replaces it.
                if !versions.carried.isEmpty, let name = type.field(tagged: tag)?.name,
                   let superseded = versions.carried.removeValue(forKey: name) {
                    over = max(over ?? superseded.version, superseded.version)
                }
                versions.fields[tag] = bumped(version, over: over)
            }
            versions.encode(into: &scratch, reusing: &versionScratch)
        }
        if fresh {
            try putNew(dbs.versions, type.tag, key: key, value: scratch.bytes, flags: [])
        } else {
            try txn.put(dbs.versions, key: key, value: scratch.bytes)
        }
        changes.append(.init(typeTag: type.tag, id: id, operation: old == nil ? .insert : .update, fieldTags: tags, origin: origin))
        noteReferenceWrite(type, id: id, changedTags: tags, inserted: old == nil, merged: merged != nil)
        return true
    }

    /// `new` with the fields of `old` that `swiftType` does not know appended: absent from
    /// `new`, not encoded as nil, and not among the fields the type declares (its probe; when
    /// the type cannot be probed, what it encoded is all it is known to have).
    private func keepingFields(of old: EncodedRecord, unknownTo swiftType: any Record.Type, in new: EncodedRecord,
                               _ layout: TypeLayout) -> EncodedRecord {
        var kept: [(tag: UInt16, range: Range<Int>)] = []
        for field in old.fields where new.range(of: field.tag) == nil {
            guard let name = layout.schema.fields.first(where: { $0.tag == field.tag })?.name else {
                kept.append(field)   // a field of no name here: nobody's to remove
                continue
            }
            if new.nilNames.contains(name) || DeclaredFields.names(of: swiftType)?.contains(name) == true { continue }
            kept.append(field)
        }
        return kept.isEmpty ? new : new.appending(kept, from: old)
    }

    /// `new` without the fields `old` lacks whose value is the field's default: the record
    /// already reads that value, so writing it is no change. Written, it took this write's
    /// version and beat a real edit of the field made meanwhile on another device (an update
    /// of another field of a record from before the field existed re-stamped it).
    private func leavingDefaultsOut(of new: EncodedRecord, missingFrom old: EncodedRecord, _ layout: TypeLayout) throws -> EncodedRecord {
        guard !layout.defaults.isEmpty else { return new }
        var dropped: [UInt16] = []
        for field in new.fields where old.range(of: field.tag) == nil {
            guard let schema = layout.schema.fields.first(where: { $0.tag == field.tag }), let value = schema.defaultValue else { continue }
            // The same bytes, not only `==`: -0.0 against a default of 0.0, or another Unicode
            // spelling of a default text, must read back as written.
            var written = ByteWriter(capacity: field.range.count)
            written.value(value)
            if new.bytes[field.range].elementsEqual(written.bytes) { dropped.append(field.tag) }
        }
        return dropped.isEmpty ? new : new.removing(dropped)
    }

    /// The common insert, tried first for types without unique indexes: the versions entry is
    /// put with `noOverwrite`, which doubles as the check that the id is new (one B-tree
    /// search instead of a lookup and then a put).
    /// - Returns: false, having written nothing (the clock included), when the id has versions
    ///   already (a duplicate, or a re-insert after a delete): the general path then handles it.
    /// - Throws: what the puts throw, having removed what this insert wrote, so that a caller
    ///   that catches the error and commits leaves the store as it was.
    private func insertNew(_ layout: TypeLayout, id: RecordID, key: KeyBytes, record new: EncodedRecord) throws -> Bool {
        let type = layout.schema
        let tags = new.fields.map(\.tag)
        // The clock as it was: a transaction whose only write falls back (and then fails as a
        // duplicate) must not commit a clock that no write carries.
        let clockBefore = (lastClock, localVersion)
        scratch.bytes.removeAll(keepingCapacity: true)
        RecordVersions.encode(incarnation: try writeVersion(), tombstone: nil, fieldTags: tags, into: &scratch)
        do {
            try putNew(dbs.versions, type.tag, key: key, value: scratch.bytes, flags: .noOverwrite)
        } catch {
            (lastClock, localVersion) = clockBefore
            if let error = error as? LMDBError, error.code == .keyExists { return false }
            throw error
        }
        var recordPut = false
        do {
            // The record first: on a damaged store (a record without versions) its put throws
            // before any index entry exists.
            try putRecord(type, id: id, key: key, new, fresh: true)
            recordPut = true
            try putIndexEntries(layout, id: id, new)
        } catch {
            // Take back what this insert wrote (best effort: the error that matters is `error`).
            if recordPut {
                let idBytes = StoreKeys.indexValue(id)
                for index in layout.schema.indexes {
                    if let indexKey = try? indexKey(index, layout, new) { _ = try? txn.delete(dbs.index, key: indexKey, value: idBytes) }
                }
                _ = try? txn.delete(dbs.records, key: key)
            }
            _ = try? txn.delete(dbs.versions, key: key)
            (lastClock, localVersion) = clockBefore
            throw error
        }
        countDeltas[type.tag, default: 0] += 1
        changes.append(.init(typeTag: type.tag, id: id, operation: .insert, fieldTags: tags, origin: nil))
        return true
    }

    /// Puts the index entries of a new record of a type without unique indexes: nothing to
    /// check first, no old key to remove.
    private func putIndexEntries(_ layout: TypeLayout, id: RecordID, _ new: EncodedRecord) throws {
        let idBytes = StoreKeys.indexValue(id)
        for index in layout.schema.indexes {
            let key = try indexKey(index, layout, new)
            try txn.put(dbs.index, key: key, value: idBytes)
            noteGroup(key)
        }
    }

    /// Puts a record's bytes. `fresh`: the id has no versions, so no record may exist either;
    /// one that does means a damaged store, reported as such rather than overwritten.
    private func putRecord(_ type: TypeSchema, id: RecordID, key: KeyBytes, _ new: EncodedRecord, fresh: Bool) throws {
        do {
            if fresh {
                try putNew(dbs.records, type.tag, key: key, value: new.bytes, flags: .noOverwrite)
            } else {
                try txn.put(dbs.records, key: key, value: new.bytes)
            }
        } catch let error as LMDBError where error.code == .keyExists {
            throw StoreError(.corrupted, "store \(path): \(type.name) \(id) is stored without versions; run `stash verify \(path)`")
        }
    }

    /// Puts a key of type `typeTag` that `db` should not hold yet. Time-ordered ids mostly
    /// arrive in key order, so it is appended when it sorts after every key (LMDB goes straight
    /// to the last leaf); otherwise, or once a key of this type did not sort last in this
    /// transaction, it is put the ordinary way with `flags`.
    private func putNew(_ db: Database, _ typeTag: UInt16, key: KeyBytes, value: [UInt8], flags: PutFlags) throws {
        if !appendMisses.contains(typeTag) {
            if try txn.appendIfLast(db, key: key, value: value) { return }
            appendMisses.append(typeTag)
        }
        try txn.put(db, key: key, value: value, flags: flags)
    }

    /// Moves a record's index entries from `old` (nil: a new record) to `new`, checking every
    /// unique index before changing anything, so that a refused write leaves no partial index
    /// change behind. A merge's unique keys are not checked here but noted, and settled at
    /// commit (``settleMergedUniqueClashes()``).
    private func changeIndexEntries(_ layout: TypeLayout, id: RecordID, old: EncodedRecord?, new: EncodedRecord, merging: Bool) throws {
        let idBytes = StoreKeys.indexValue(id)
        keyChanges.removeAll(keepingCapacity: true)
        for index in layout.schema.indexes {
            let newKey = try indexKey(index, layout, new)
            let oldKey = try old.map { try indexKey(index, layout, $0) }
            if let oldKey, oldKey == newKey, !newKey.isLossy { continue }
            if index.unique, try !lacksUniqueValue(index, layout, new) {
                if merging {
                    mergedUniqueKeys[newKey] = layout.schema.name
                } else if let other = try uniqueHolder(index, layout, newKey, new, id) {
                    throw try uniqueViolation(index, layout, new, holder: other)
                }
            }
            keyChanges.append((oldKey, newKey))
        }
        for change in keyChanges {
            if let oldKey = change.old {
                try txn.delete(dbs.index, key: oldKey, value: idBytes)
                noteGroup(oldKey)
            }
            try txn.put(dbs.index, key: change.new, value: idBytes)
            noteGroup(change.new)
        }
    }

    /// Deletes one record with its index entries and count, leaves a tombstone in its
    /// versions, and records the history change.
    /// - Returns: false when there was no such record.
    @discardableResult
    func remove(_ layout: TypeLayout, id: RecordID, versions merged: RecordVersions? = nil, origin: RecordID? = nil) throws -> Bool {
        let type = layout.schema
        let key = StoreKeys.record(type.tag, id)
        guard let oldBytes = try txn.get(dbs.records, key: key) else { return false }
        let old = try decodeStored(oldBytes, type.name, id)
        // Everything that can fail on a damaged store (the versions, the clock) comes before
        // the first delete: a caller that catches the error and commits must not commit half
        // a delete (the record gone, its count and history not).
        var versions = try merged ?? versions(layout, id) ?? RecordVersions(incarnation: nil, tombstone: nil, fields: [:])
        if merged == nil {
            let latest = ([versions.incarnation, versions.tombstone].compactMap { $0 } + versions.fields.versions).max()
            versions.tombstone = bumped(try writeVersion(), over: latest)
            versions.fields = FieldVersions()
            versions.carried = [:]
        }
        let keys = try type.indexes.map { try indexKey($0, layout, old) }
        let idBytes = StoreKeys.indexValue(id)
        for indexKey in keys {
            try txn.delete(dbs.index, key: indexKey, value: idBytes)
            noteGroup(indexKey)
        }
        try txn.delete(dbs.records, key: key)
        try txn.put(dbs.versions, key: key, value: versions.encoded())
        countDeltas[type.tag, default: 0] -= 1
        changes.append(.init(typeTag: type.tag, id: id, operation: .delete, fieldTags: [], origin: origin))
        if merged != nil { noteMergedDelete(type, id: id) }
        return true
    }

    // MARK: Replication

    /// Merges a remote state into the stored one (see ``RecordState/merged(with:counters:)``)
    /// and writes the result with its versions; the history change carries `origin`.
    /// `sourceCounters`: the fields the source merges as counters, for those this store
    /// carries without declaring them.
    ///
    /// What the schema does not declare is carried, never added to the schema: a field it
    /// lacks, or holds in another kind, is kept with its version beside the record
    /// (``RecordVersions/carried``), and a state of a type it lacks is kept whole, under a tag
    /// of ``CarriedSchema``. Both are sent on to other replicas with the record.
    ///
    /// A version more than ``maximumClockSkew`` ahead of this store's clock is taken as made
    /// when it arrived (``arrivalVersions(of:)``): a device whose clock runs years ahead
    /// cannot win against the edits made after its write arrived.
    ///
    /// A unique-index clash with another record is settled when the transaction commits
    /// (``settleMergedUniqueClashes()``), the same way on every replica.
    /// - Returns: false when the remote state changed nothing here.
    @discardableResult
    func merge(_ remote: RecordState, origin: RecordID, sourceCounters: Set<String> = [], sentAt: Date? = nil,
               sameSchema: Bool = false) throws -> Bool {
        mergeFromSameSchema = sameSchema
        defer { mergeFromSameSchema = false }
        if let latest = remote.latestVersion {
            guard latest.isWithinClockRange else {
                throw StoreError(.invalidValue, "store \(path): the state of \(remote.type) \(remote.id) carries version \(latest), past the clock range (Version.maximumClock); its source's clock or the delta is broken, so it was not merged")
            }
        }
        let remote = try arrivalVersions(of: remote, origin: origin, sentAt: sentAt)
        if let latest = remote.latestVersion { try observe(latest) }
        guard let layout = catalog.layoutsByName[remote.type] else {
            return try mergeCarried(remote, origin: origin, sourceCounters: sourceCounters)
        }
        return try merge(remote, layout, origin: origin, sourceCounters: sourceCounters, versionedOnly: true)
    }

    /// `state` with every version more than ``maximumClockSkew`` ahead of this store's clock
    /// taken back by how far its site's clock runs ahead, so that it reads as made when it was
    /// made, by this store's clock. How far a site runs ahead is measured when a delta from it
    /// arrives (the clock of the site when it made the delta, `sentAt`, against this store's
    /// now), and is at least enough to bring the version to its arrival here; it is kept per
    /// site and only grows, so a version that arrives again maps to what it mapped to before
    /// (or older), and a site's versions keep their order. Every replica so judges a write
    /// from a clock far ahead as made no later than its arrival there: an edit made after that
    /// wins, wherever it is made. A merge keeps the newest version of each value that reached
    /// it, so replicas converge; the device with the clock ahead keeps its own versions until
    /// its clock passes them.
    private func arrivalVersions(of state: RecordState, origin: RecordID, sentAt: Date?) throws -> RecordState {
        let limit = clockReading(now().addingTimeInterval(maximumClockSkew))
        guard let latest = state.latestVersion, latest.clock > limit else { return state }
        var ahead = try clockAhead()
        let all = [state.incarnation, state.tombstone].compactMap { $0 } + state.fields.values.map(\.version)
        var newest: [RecordID: UInt64] = [:]
        for version in all where version.clock > limit { newest[version.site] = max(newest[version.site] ?? 0, version.clock) }
        // Now, as this store's hybrid clock reads it: after everything it has written or seen.
        let arrival = max(clockReading(now()), (try storedClock()) &+ 1)
        // The source's clock when it made the delta, against ours now: how far it runs ahead
        // (less the time the delta took to arrive).
        if let sentAt, sentAt.timeIntervalSince1970.isFinite, newest[origin] != nil {
            let sent = clockReading(sentAt)
            if sent > limit, sent - arrival > ahead[origin] ?? 0 { ahead[origin] = sent - arrival }
        }
        for (site, clock) in newest where clock &- min(clock, ahead[site] ?? 0) > limit {
            ahead[site] = clock - arrival
        }
        if ahead != clockAheadOfSites {
            clockAheadOfSites = ahead
            clockAheadChanged = true
        }
        func arrived(_ version: Version) -> Version {
            guard version.clock > limit, let offset = ahead[version.site] else { return version }
            return Version(clock: version.clock - min(version.clock, offset), site: version.site)
        }
        var result = state
        result.incarnation = state.incarnation.map(arrived)
        result.tombstone = state.tombstone.map(arrived)
        for (name, field) in state.fields where field.version.clock > limit {
            result.fields[name]!.version = arrived(field.version)
        }
        return result
    }

    /// How far ahead each site's clock was found to run (see ``arrivalVersions(of:)``), in
    /// clock units; read once per transaction, when a version from a clock ahead arrives.
    @exclusivity(unchecked) private var clockAheadOfSites: [RecordID: UInt64]?
    @exclusivity(unchecked) private var clockAheadChanged = false

    private func clockAhead() throws -> [RecordID: UInt64] {
        if let clockAheadOfSites { return clockAheadOfSites }
        var result: [RecordID: UInt64] = [:]
        if let bytes = try txn.get(dbs.meta, key: MetaKey.clockAhead),
           let stored = try? JSONDecoder().decode([String: UInt64].self, from: Data(bytes)) {
            for (site, offset) in stored { if let id = RecordID(string: site) { result[id] = offset } }
        }
        clockAheadOfSites = result
        return result
    }

    /// ``merge(_:origin:sourceCounters:)`` once the remote state is checked. `versionedOnly`:
    /// an id without versions holds nothing (see
    /// ``loadStoredRecordState(_:_:_:_:site:path:versionedOnly:)``), so the write need not look again.
    private func merge(_ remote: RecordState, _ layout: TypeLayout, origin: RecordID, sourceCounters: Set<String>,
                       versionedOnly: Bool) throws -> Bool {
        let (local, stored) = try loadStoredRecordState(txn, dbs, layout, remote.id, site: siteID, path: path, versionedOnly: versionedOnly)
        var counters = layout.counterNames
        if !sourceCounters.isEmpty || (!catalog.carried.isEmpty && catalog.carried.fields[layout.schema.name] != nil) {
            counters.formUnion(catalog.carried.counters(of: layout.schema.name))
            counters.formUnion(sourceCounters.filter { layout.tagsByName[$0] == nil })
        }
        let merged = local.merged(with: remote, counters: counters)
        if merged == local { return false }
        do {
            return try write(merged, layout, origin: origin, absent: !stored, sourceCounters: sourceCounters)
        } catch let error as StoreError where error.code == .corrupted && versionedOnly && !stored {
            // A damaged store may keep a record without versions: its put refused to
            // overwrite it, before writing anything. The merge takes it into account, as it
            // does every stored record (the result gets versions again); refused, every delta
            // of that record would hold back its source for good.
            guard try txn.get(dbs.records, key: StoreKeys.record(layout.schema.tag, remote.id)) != nil else { throw error }
            return try merge(remote, layout, origin: origin, sourceCounters: sourceCounters, versionedOnly: false)
        }
    }

    /// Merges a state of a type the schema does not declare: kept whole (incarnation,
    /// tombstone, every field as carried) in `versions` under the type's tag in
    /// ``CarriedSchema``, given one when it is new here, and noted in history so that it is
    /// sent on. - Throws: `.invalidValue` past ``CarriedSchema/maximumTypes``, or for a name
    /// no record type can have.
    private func mergeCarried(_ remote: RecordState, origin: RecordID, sourceCounters: Set<String>) throws -> Bool {
        let tag = try carriedTag(for: remote.type)
        let key = StoreKeys.record(tag, remote.id)
        let stored: RecordVersions?
        do { stored = try txn.get(dbs.versions, key: key).map { try RecordVersions(decoding: $0) } }
        catch { throw StoreError(.corrupted, "store \(path): the carried state of \(remote.type) \(remote.id) cannot be decoded: \(error); run `stash verify \(path)`") }
        let local = RecordState(type: remote.type, id: remote.id, incarnation: stored?.incarnation, tombstone: stored?.tombstone,
                                fields: stored?.carried ?? [:])
        let merged = local.merged(with: remote, counters: catalog.carried.counters(of: remote.type).union(sourceCounters))
        if merged == local { return false }
        try noteCarried(Array(merged.fields.keys), of: remote.type, counters: sourceCounters)
        let versions = RecordVersions(incarnation: merged.incarnation, tombstone: merged.tombstone, fields: [:], carried: merged.fields)
        try txn.put(dbs.versions, key: key, value: versions.encoded())
        let operation: HistoryChange.Operation = merged.exists ? (local.exists ? .update : .insert) : .delete
        changes.append(.init(typeTag: tag, id: remote.id, operation: operation, fieldTags: [], origin: origin))
        return true
    }

    /// The tag the states of undeclared `type` are kept under, given one when new: the highest
    /// tag neither the schema nor another carried type has.
    private func carriedTag(for type: String) throws -> UInt16 {
        if let tag = catalog.carried.types[type] { return tag }
        try Self.checkCarriedName(type, "type", store: path)
        guard catalog.carried.types.count < CarriedSchema.maximumTypes else {
            throw StoreError(.invalidValue, "store \(path): a merge brings \(type), and this store already keeps \(CarriedSchema.maximumTypes) types it does not declare, the most it carries; declare the types this app uses, or check the replica that sends them")
        }
        let taken = Set(catalog.schema.types.map(\.tag)).union(catalog.carried.types.values)
        var tag = UInt16.max
        while taken.contains(tag) { tag -= 1 }
        updateCarried { $0.types[type] = tag }
        return tag
    }

    /// Notes carried field `names` of `type` (with the ones `counters` names merged as
    /// counters at their source) in ``CarriedSchema/fields``.
    private func noteCarried(_ names: some Sequence<String>, of type: String, counters: Set<String>) throws {
        let known = catalog.carried.fields[type] ?? [:]
        var added: [String: Bool] = [:]
        for name in names where known[name] == nil || (counters.contains(name) && known[name] == false) {
            if known[name] == nil { try Self.checkCarriedName(name, "field of \(type)", store: path) }
            added[name] = counters.contains(name)
        }
        guard !added.isEmpty else { return }
        guard known.count + added.count <= CarriedSchema.maximumFields else {
            throw StoreError(.invalidValue, "store \(path): a merge brings \(type) fields this store does not declare beyond the \(CarriedSchema.maximumFields) it carries for a type; check the replica that sends them")
        }
        updateCarried { $0.fields[type, default: [:]].merge(added) { _, new in new } }
    }

    /// Takes into the records of type `name`, declared now, what the store carried for it:
    /// the states kept while no schema declared the type, and the carried values of the fields
    /// that the schema holds since `before` (declared, or now of their values' kind). Each
    /// record so written is a change of this transaction (its peers merge it as a no-op).
    /// O(records of the type), when there is anything to take in; one cursor seek otherwise.
    /// - Throws: `.incompatibleSchema` when carried records lack a field the declaration
    ///   requires (not optional, no default): typed reads of them would fail.
    func absorbCarried(typeNamed name: String, before: TypeSchema, progress: (Int) -> Void) throws {
        let layout = try self.layout(name)
        let counters = catalog.carried.counters(of: name)
        var taken = 0
        if let tag = catalog.carried.types[name], tag != layout.schema.tag {
            var states: [RecordState] = []
            try txn.scan(dbs.versions, prefix: StoreKeys.typePrefix(tag)) { key, value in
                guard let id = StoreKeys.id(fromRecordKey: key) else { return true }
                let versions: RecordVersions
                do { versions = try RecordVersions(decoding: value) }
                catch { throw StoreError(.corrupted, "store \(path): the carried state of \(name) \(id) cannot be decoded: \(error); run `stash verify \(path)`") }
                states.append(RecordState(type: name, id: id, incarnation: versions.incarnation, tombstone: versions.tombstone, fields: versions.carried))
                return true
            }
            let required = layout.schema.fields.filter { !$0.optional && $0.defaultValue == nil }
            let lacking = states.filter { state in state.exists && required.contains { (state.fields[$0.name]?.value ?? .null) == .null } }
            if let first = lacking.first, let field = required.first(where: { (first.fields[$0.name]?.value ?? .null) == .null }) {
                throw StoreError(.incompatibleSchema, "store \(path): \(name).\(field.name) is declared required (not optional, no default), but \(lacking.count) of the \(states.count) \(name) records this store kept for other replicas before declaring \(name) lack a value (\(name) \(first.id), say); make the field optional, or give it a default (Record.fieldDefaults; in a schema file, \"default\" on the field)")
            }
            for state in states {
                try txn.delete(dbs.versions, key: StoreKeys.record(tag, state.id))
                _ = try write(state, layout, origin: nil, absent: true, sourceCounters: counters)
                taken += 1
                if taken % 10_000 == 0 { progress(taken) }
            }
        }
        // Carried values of fields the schema holds now that it did not before.
        let after = try self.layout(name).schema
        let nowHeld = Set((catalog.carried.fields[name] ?? [:]).keys.filter { field in
            guard let now = after.field(named: field) else { return false }
            guard let then = before.field(named: field) else { return true }
            return then.kind != now.kind || then.anyKind != now.anyKind
        })
        if !nowHeld.isEmpty {
            var ids: [RecordID] = []
            try txn.scan(dbs.versions, prefix: StoreKeys.typePrefix(after.tag)) { key, value in
                guard value.first == 2, let id = StoreKeys.id(fromRecordKey: key) else { return true }
                if let versions = try? RecordVersions(decoding: value), versions.carried.keys.contains(where: nowHeld.contains) { ids.append(id) }
                return true
            }
            let current = try self.layout(name)
            for id in ids {
                let (state, stored) = try loadStoredRecordState(txn, dbs, current, id, site: siteID, path: path)
                _ = try write(state, current, origin: nil, absent: !stored, sourceCounters: counters)
                taken += 1
                if taken % 10_000 == 0 { progress(taken) }
            }
        }
        if taken > 0 { progress(taken) }
    }

    /// - Throws: `.invalidValue` for a name no honest replica sends: empty, `id` (the record
    ///   id is the key, never a field), or longer than 255 bytes of UTF-8.
    static func checkCarriedName(_ name: String, _ what: String, store path: String) throws {
        guard !name.isEmpty, name != "id", name.utf8.count <= 255, !name.hasPrefix("#") else {
            throw StoreError(.invalidValue, "store \(path): a merge names a \(what) '\(name.prefix(64))', which no record can have (empty, 'id', starting with '#', or over 255 bytes); the replica that sent it is faulty")
        }
    }

    private func write(_ state: RecordState, _ layout: TypeLayout, origin: RecordID?, absent: Bool,
                       sourceCounters: Set<String> = []) throws -> Bool {
        encodingType = layout.schema.name
        encodingLayout = layout
        var fieldVersions = FieldVersions(minimumCapacity: state.fields.count)
        var values: [(slot: Int, tag: UInt16, value: FieldValue)] = []
        var carried: [String: FieldState] = [:]
        // Fields stored here whose merged value is of another kind: the record keeps the value
        // it has (the app reads it), and the other one goes beside it, carried.
        var otherKind: [Int] = []
        values.reserveCapacity(state.fields.count)
        for (name, field) in state.fields {
            // The id is the key: a field of that name is no field.
            if name == "id" { continue }
            let hint = values.last.map { $0.slot + 1 } ?? 0
            guard let known = layout.slot(of: name, hint: hint), layout.holds(field.value, at: known) else {
                carried[name] = field
                if let slot = layout.slot(of: name, hint: hint) { otherKind.append(slot) }
                continue
            }
            if layout.counterNames.contains(name), field.value != .null, let problem = Counter.problem(in: field.value) {
                throw StoreError(.invalidValue, "store \(path): \(layout.schema.name).\(name) of \(state.id) is a counter, but the merged value is not a counter's state (\(problem))")
            }
            let (tag, slot) = try tag(for: name, kind: field.value.kind, hint: known)
            fieldVersions[tag] = field.version
            // A null is stored only for an optional field with a default (where no field reads
            // as the default, see `RecordEncoder.finish`), as the replica that wrote it stores
            // it. A field required here reads a stored null as nothing, failing typed reads:
            // a nil from a replica where it is optional leaves it out (it reads as the default).
            if name != "id", field.value != .null || (layout.defaults[name] != nil && layout.schema.field(named: name)?.optional != false) {
                values.append((slot, tag, field.value))
            }
        }
        if !otherKind.isEmpty, !absent, let stored = try txn.get(dbs.records, key: StoreKeys.record(layout.schema.tag, state.id)) {
            let old = try decodeStored(stored, layout.schema.name, state.id)
            let oldVersions = try versions(layout, state.id)
            for slot in otherKind {
                let tag = layout.tags[slot]
                guard let value = try old.value(of: tag) else { continue }
                values.append((slot, tag, value))
                if let version = oldVersions?.fields[tag] { fieldVersions[tag] = version }
            }
        }
        // This store's schema order, as its typed writes store fields: typed reads of merged
        // records then find each field where they look first.
        values.sort { $0.slot < $1.slot }
        // The layout again: `tag(for:)` may have grown the schema by a field.
        let layout = try currentEncodingLayout()
        guard state.exists else {
            let versions = RecordVersions(incarnation: state.incarnation, tombstone: state.tombstone, fields: fieldVersions)
            if try remove(layout, id: state.id, versions: versions, origin: origin) { return true }
            // Never seen here: keep the tombstone so the delete wins later and travels on.
            try txn.put(dbs.versions, key: StoreKeys.record(layout.schema.tag, state.id), value: versions.encoded())
            changes.append(.init(typeTag: layout.schema.tag, id: state.id, operation: .delete, fieldTags: [], origin: origin))
            return true
        }
        var encoded = RecordEncoder.encode(tagged: values.lazy.map { ($0.tag, $0.value) }, capacity: encodedSizeHint)
        // What the app cannot read must not become its record: every typed fetch of the type
        // would fail on it. A merged value its type does not read (an array of other elements,
        // written by another version of the app) is carried instead, and the record keeps the
        // value it had, if that one reads.
        if let swiftType = recordTypes[layout.schema.name], !mergeFromSameSchema || !typedReadIsCertain(values, layout) {
            var triedOld = Set<String>()
            while let failure = Self.typedReadProblem(swiftType, encoded, state.id, layout) {
                guard let field = failure.field, let position = values.firstIndex(where: { layout.names[$0.slot] == field }) else {
                    throw StoreError(.invalidValue, "store \(path): \(layout.schema.name) \(state.id) as merged would not read as this app's \(swiftType) (\(failure.problem)); the state was not merged")
                }
                let (slot, tag, refused) = values.remove(at: position)
                fieldVersions[tag] = nil
                if let merged = state.fields[field], merged.value == refused { carried[field] = merged }
                if !absent, triedOld.insert(field).inserted,
                   let stored = try txn.get(dbs.records, key: StoreKeys.record(layout.schema.tag, state.id)),
                   let old = try decodeStored(stored, layout.schema.name, state.id).value(of: tag), old != refused {
                    values.append((slot, tag, old))
                    values.sort { $0.slot < $1.slot }
                    if let version = try versions(layout, state.id)?.fields[tag] { fieldVersions[tag] = version }
                }
                encoded = RecordEncoder.encode(tagged: values.lazy.map { ($0.tag, $0.value) }, capacity: encodedSizeHint)
            }
        }
        encodedSizeHint = min(max(256, encoded.bytes.count + 32), 1 << 16)
        if !carried.isEmpty { try noteCarried(carried.keys, of: layout.schema.name, counters: sourceCounters) }
        let versions = RecordVersions(incarnation: state.incarnation, tombstone: state.tombstone, fields: fieldVersions, carried: carried)
        return try put(layout, id: state.id, record: encoded, mode: .upsert, versions: versions, origin: origin, absent: absent)
    }

    /// A merge whose source has this store's schema (``merge(_:origin:sourceCounters:sentAt:sameSchema:)``):
    /// what its top-level kinds allow, the app's type reads, but for nested values.
    @exclusivity(unchecked) private var mergeFromSameSchema = false

    /// Whether merged `values` of a source with this store's schema read back through the
    /// app's type without decoding them: every required field holds a value, and none holds
    /// values the schema does not describe (an array's or a map's elements, but a counter's).
    /// O(fields).
    private func typedReadIsCertain(_ values: [(slot: Int, tag: UInt16, value: FieldValue)], _ layout: TypeLayout) -> Bool {
        for required in layout.requiredSlots where !values.contains(where: { $0.slot == required && $0.value != .null }) {
            return false
        }
        return !values.contains { field in
            switch field.value {
            case .array, .map: return !layout.counterNames.contains(layout.names[field.slot])
            default: return false
            }
        }
    }

    /// Why `encoded` does not read back as `type` (and the field at fault, from the decoding
    /// error's path), or nil when it does.
    private static func typedReadProblem(_ type: any Record.Type, _ encoded: EncodedRecord, _ id: RecordID,
                                         _ layout: TypeLayout) -> (field: String?, problem: String)? {
        func check<R: Record>(_ type: R.Type) -> (field: String?, problem: String)? {
            do {
                _ = try RecordReader.decodeFields(type, encoded.bytes, id, layout)
                return nil
            } catch let error as DecodingError {
                let field: String?
                switch error {
                case .keyNotFound(let key, let context): field = (context.codingPath.first ?? key).stringValue
                case .typeMismatch(_, let context), .valueNotFound(_, let context), .dataCorrupted(let context):
                    field = context.codingPath.first?.stringValue
                @unknown default: field = nil
                }
                return (field, describe(error))
            } catch {
                return (nil, describe(error))
            }
        }
        return check(type)
    }

    /// Settles the unique-index clashes this transaction's merges left, on the state the
    /// transaction ends with, the same way on every replica: of the records of a type that
    /// share a unique value, the one with the smallest id stays and each other one is deleted.
    /// The delete is a local write, so it travels to every peer, the merge's origin included.
    ///
    /// Judging the final state rather than each merge in turn is what keeps a delta that moves
    /// a value between two records, or swaps two, from deleting one of them: merged one at a
    /// time, their states clash in between although the final ones do not.
    ///
    /// Records are visited in ascending id order, so a record loses exactly when a smaller
    /// one that stays shares one of its unique values. Each record under the merged keys is
    /// read once: O(those records). Returns the records deleted.
    @discardableResult
    func settleMergedUniqueClashes() throws -> [UniqueClash] { try mergedUniqueClashes(removing: true) }

    /// The clashes among the unique keys a migration wrote, judged on the migrated state as
    /// merges are (a migration that shifts every value of a unique field by one passes through
    /// clashes record by record), none removed: the caller refuses the migration.
    func migratedUniqueClashes() throws -> [UniqueClash] { try mergedUniqueClashes(removing: false) }

    private func mergedUniqueClashes(removing: Bool) throws -> [UniqueClash] {
        guard !mergedUniqueKeys.isEmpty else { return [] }
        var candidates: [String: Set<RecordID>] = [:]
        for (key, type) in mergedUniqueKeys {
            var ids: [RecordID] = []
            try txn.forEachDuplicate(dbs.index, key: key) { value in
                if let id = RecordID(bytes: value[...]) { ids.append(id) }
                return true
            }
            if ids.count > 1 { candidates[type, default: []].formUnion(ids) }
        }
        mergedUniqueKeys.removeAll()
        var settled: [UniqueClash] = []
        for (type, ids) in candidates.sorted(by: { $0.key < $1.key }) {
            let layout = try self.layout(type)
            let unique = layout.schema.indexes.filter(\.unique)
            // Per unique index, the values of the records kept so far, with the record holding each.
            var kept = [[[UInt8]: RecordID]](repeating: [:], count: unique.count)
            for id in ids.sorted() {
                guard let bytes = try txn.get(dbs.records, key: StoreKeys.record(layout.schema.tag, id)) else { continue }
                let record = try decodeStored(bytes, type, id)
                let values = try unique.map { try uniqueValue($0, layout, record) }
                let holders = values.indices.map { position in values[position].flatMap { kept[position][$0] } }
                if let position = holders.firstIndex(where: { $0 != nil }), let holder = holders[position] {
                    if removing {
                        try remove(layout, id: id)
                        noteClashRemoval(type, removed: id, kept: holder)
                    }
                    settled.append(UniqueClash(type: type, removed: id, kept: holder, index: unique[position].name))
                } else {
                    for (position, value) in values.enumerated() { if let value { kept[position][value] = id } }
                }
            }
        }
        return settled
    }

    /// What two records must share to clash on unique `index`: the index key, and, when the
    /// key is shortened (long strings or bytes), the full values too; nil for a record that
    /// lacks the value (it clashes with none).
    private func uniqueValue(_ index: IndexSchema, _ layout: TypeLayout, _ record: EncodedRecord) throws -> [UInt8]? {
        if try lacksUniqueValue(index, layout, record) { return nil }
        let key = try indexKey(index, layout, record)
        var value = key.bytes
        if key.isLossy {
            for name in index.fields { RecordValueCoding.append(try fieldValue(name, layout, record), to: &value) }
        }
        return value
    }

    /// The stored count plus this transaction's pending changes.
    func count(_ typeTag: UInt16) throws -> Int {
        let stored = try RecordReader.count(try txn.uint64(dbs.counts, key: StoreKeys.count(typeTag)), of: typeTag, path)
        return stored + countDeltas[typeTag, default: 0]
    }

    /// Adds the index entry of a stored record (index backfill), checking uniqueness.
    /// Lists every record of `layout`'s type, with all its fields, as updated in this
    /// transaction's history entry, without writing any: for a type that becomes synced, whose
    /// records so far sync never sent. O(records of the type).
    func noteEveryRecordChanged(_ layout: TypeLayout) throws {
        let tags = layout.schema.fields.map(\.tag)
        // Every record and every delete has a versions entry: deletes made while the type was
        // local-only are listed too (as deletes), so that peers learn of them.
        try txn.scan(dbs.versions, prefix: StoreKeys.typePrefix(layout.schema.tag)) { key, _ in
            if let id = StoreKeys.id(fromRecordKey: key) {
                let live = try txn.get(dbs.records, key: key) != nil
                changes.append(.init(typeTag: layout.schema.tag, id: id, operation: live ? .update : .delete, fieldTags: live ? tags : []))
            }
            return true
        }
    }

    /// - Throws: `.uniqueViolation` naming both records when two stored records share the
    ///   values of a unique index being built (at open: it says how to get past it; `upgrading`,
    ///   the rebuild of a format-1 store, runs before migrations and declarations can help).
    func addIndexEntry(_ index: IndexSchema, _ layout: TypeLayout, _ record: EncodedRecord, id: RecordID, upgrading: Bool = false) throws {
        let key = try indexKey(index, layout, record)
        if index.unique, try !lacksUniqueValue(index, layout, record), let other = try uniqueHolder(index, layout, key, record, id) {
            let type = layout.schema.name
            let values = try index.fields.map { "\($0) = \(try fieldValue($0, layout, record).json.text)" }.joined(separator: ", ")
            let remedy = upgrading
                ? "the format-1 store this library upgrades let both in (two Unicode spellings of one text); open it with the Stash release before format 2, make the two values differ, then open it here"
                : "remove the duplicates with a Migration (version \(catalog.schema.version + 1)), or declare the index with .index instead of .unique (with StoreOptions.relaxesUniqueIndexes when the stored index is unique)"
            throw StoreError(.uniqueViolation, "store \(path): cannot build the unique index \(type)(\(index.name)) at open: \(type) \(other) and \(type) \(id) both have \(values); \(remedy)")
        }
        try txn.put(dbs.index, key: key, value: id.bytes)
        noteGroup(key)
    }

    /// Another record (than `id`) whose values for unique `index` (key `key`) are those of
    /// `new`, or nil.
    private func uniqueHolder(_ index: IndexSchema, _ layout: TypeLayout, _ key: KeyBytes, _ new: EncodedRecord, _ id: RecordID) throws -> RecordID? {
        var conflict: RecordID?
        try txn.forEachDuplicate(dbs.index, key: key) { value in
            guard let other = RecordID(bytes: value[...]), other != id else { return true }
            if key.isLossy {
                // A shortened key: compare the real values before calling it a duplicate.
                let otherKey = StoreKeys.record(layout.schema.tag, other)
                guard let otherBytes = try txn.get(dbs.records, key: otherKey) else { return true }
                let otherRecord = try decodeStored(otherBytes, layout.schema.name, other)
                let same = try index.fields.allSatisfy { name in
                    try fieldValue(name, layout, otherRecord) == fieldValue(name, layout, new)
                }
                if !same { return true }
            }
            conflict = other
            return false
        }
        return conflict
    }

    /// The error of a write that would give `new` the unique values `holder` has.
    private func uniqueViolation(_ index: IndexSchema, _ layout: TypeLayout, _ new: EncodedRecord, holder: RecordID) throws -> StoreError {
        let values = try index.fields.map { "\($0) = \(try fieldValue($0, layout, new).json.text)" }.joined(separator: ", ")
        let kept = keptUniqueIndexes.contains("\(layout.schema.name).\(index.name)")
            ? " (this app declares the index plain, but the store keeps it unique: set StoreOptions.relaxesUniqueIndexes to relax it)" : ""
        // A holder this transaction inserted is not stored yet: "update that record" would send
        // the caller looking for a record that does not exist (two lines of one load, say).
        if changes.contains(where: { $0.typeTag == layout.schema.tag && $0.id == holder && $0.operation == .insert }) {
            return StoreError(.uniqueViolation, "store \(path): \(layout.schema.name) \(holder), inserted earlier in this same transaction, already has \(values) (unique index \(index.name))\(kept); two records of one transaction cannot share it: give them different values")
        }
        return StoreError(.uniqueViolation, "store \(path): \(layout.schema.name) \(holder) already has \(values) (unique index \(index.name))\(kept); update that record instead")
    }

    func decodeStored(_ bytes: [UInt8], _ type: String, _ id: RecordID) throws -> EncodedRecord {
        do { return try EncodedRecord(bytes) }
        catch { throw StoreError(.corrupted, "store \(path): \(type) \(id) cannot be decoded: \(error); run `stash verify \(path)`") }
    }

    // MARK: Commit

    /// Flushes counts, the schema (when it grew) and this transaction's history entry.
    func finish() throws {
        try settleMergedUniqueClashes()
        try applyReferenceRules()   // after the clashes: their removed records' children move
        var totals: [(typeTag: UInt16, count: Int)] = []
        for (tag, delta) in countDeltas where delta != 0 {
            let key = StoreKeys.count(tag)
            let stored = try RecordReader.count(try txn.uint64(dbs.counts, key: key), of: tag, path)
            let total = max(0, stored + delta)
            try txn.put(dbs.counts, key: key, uint64: UInt64(total))
            if recentCounts != nil { totals.append((tag, total)) }
        }
        countDeltas.removeAll()
        if let lastClock {
            try txn.put(dbs.meta, key: MetaKey.clock, uint64: lastClock)
        }
        if schemaChanged {
            try SchemaMerger.saveSchema(catalog.schema, generation: catalog.generation, txn, dbs)
        } else if carriedChanged {
            try txn.put(dbs.meta, key: MetaKey.schemaGeneration, uint64: catalog.generation)
        }
        if carriedChanged { try catalog.carried.save(txn, dbs) }
        if clockAheadChanged, let clockAheadOfSites {
            let stored = Dictionary(uniqueKeysWithValues: clockAheadOfSites.map { ($0.key.description, $0.value) })
            try txn.put(dbs.meta, key: MetaKey.clockAhead, value: Array(try JSONEncoder().encode(stored)))
            clockAheadChanged = false
        }
        if !changes.isEmpty {
            let sequence = try txn.uint64(dbs.meta, key: MetaKey.nextSequence) ?? 1
            guard sequence < UInt64.max else {
                throw StoreError(.corrupted, "store \(path): the next history sequence number in meta is \(sequence), past any real history; run `stash verify \(path)`")
            }
            let entry = HistoryEntry.encode(timestamp: now(), origin: siteID, author: author, changes: changes)
            var key = KeyBytes()
            key.appendBigEndian(sequence)
            // Sequences only grow: the entry sorts last. Should a damaged `meta` have sent the
            // sequence back, the write fails: an existing entry is never overwritten, and an
            // entry below a later one (in a purged range, or a hole) would never be read by
            // consumers that are past it.
            if try sequence == 0 || !txn.appendIfLast(dbs.history, key: key, value: entry) {
                let found = try txn.contains(dbs.history, key: key) ? "entry \(sequence) exists already" : "later entries exist"
                throw StoreError(.corrupted, "store \(path): the next history sequence number in meta (\(sequence)) is behind the history (\(found)); run `stash verify \(path)`")
            }
            try txn.put(dbs.meta, key: MetaKey.nextSequence, uint64: sequence + 1)
            changes.removeAll()
            try keepCounts(totals, committedAs: sequence)
        }
    }
}

extension WriteContext {
    /// Hands the counts this transaction leaves (the totals it changed, the sizes of the
    /// groups it changed in kept indexes) to ``RecentCounts`` once it commits as history
    /// entry `sequence`. The sizes are read here, in the transaction's final state (an
    /// earlier writer of its group commit included), so a group noted twice or put back as it
    /// was costs one read and lists its true size.
    private func keepCounts(_ totals: [(typeTag: UInt16, count: Int)], committedAs sequence: UInt64) throws {
        guard let recentCounts else { return }
        var groups: [(index: UInt32, value: RecordID, size: Int)] = []
        if !changedGroups.overflowed {
            groups.reserveCapacity(changedGroups.groups.count)
            for group in changedGroups.groups {
                groups.append((group.index, group.value, try txn.duplicateCount(dbs.index, key: ChangedGroups.key(group.index, group.value))))
            }
        }
        let commit = RecentCounts.Commit(from: sequence - 1, to: sequence, indexes: changedGroups.indexes, totals: totals,
                                         groups: groups, complete: !changedGroups.overflowed)
        afterCommit { recentCounts.record(commit) }
    }
}

// MARK: Index keys from stored records

/// The value of field `name` in a stored record, or its schema default, or null.
func fieldValue(_ name: String, _ layout: TypeLayout, _ record: EncodedRecord) throws -> FieldValue {
    try fieldValue(name, tag: layout.tagsByName[name], layout, record)
}

/// ``fieldValue(_:_:_:)`` when the field's tag is known (nil: the schema lacks the field).
private func fieldValue(_ name: String, tag: UInt16?, _ layout: TypeLayout, _ record: EncodedRecord) throws -> FieldValue {
    if let tag, let value = try record.value(of: tag) { return value }
    return layout.defaults[name] ?? .null
}

/// True when `record` has no value of its own for a field of unique `index`: absent, null,
/// or the field's declared default (what a record stored before the field existed reads as,
/// and what a typed write of such a record then stores). Such a record clashes with no other
/// on that index, like a row with NULL under SQL's UNIQUE: any number of records may lack the
/// value.
func lacksUniqueValue(_ index: IndexSchema, _ layout: TypeLayout, _ record: EncodedRecord) throws -> Bool {
    try index.fields.contains { name in
        guard let tag = layout.tagsByName[name], let value = try record.value(of: tag) else { return true }
        return value == .null || value == layout.defaults[name]
    }
}

/// The index key of a stored record: type tag, index tag, then each field's component.
func indexKey(_ index: IndexSchema, _ layout: TypeLayout, _ record: EncodedRecord) throws -> KeyBytes {
    var key = StoreKeys.indexPrefix(layout.schema.tag, index.tag)
    let tags = layout.fieldTags(ofIndex: index.tag)
    for (position, name) in index.fields.enumerated() {
        let tag = tags.map { $0[position] } ?? layout.tagsByName[name]
        try fieldValue(name, tag: tag, layout, record).appendIndexComponent(to: &key)
    }
    return key
}
