import Foundation
import StashLMDB

/// Brings a store's stored schema up to what the app declares, at open, inside one write
/// transaction: identity and format on first open, migrations, new types and fields,
/// index backfill and removal. Nothing is half-done: an error aborts all of it.
struct SchemaMerger {
    /// 1: dates stored and indexed as seconds since 1970, strings indexed as their bytes;
    /// 2: dates as seconds since 2001 (`Date`'s own representation: every `Date` reads back
    /// equal), strings indexed in their canonical composition (NFC, as Swift compares them);
    /// 3: every record and history entry carries a CRC-32C checksum, checked on read
    /// (``RecordFormat``). Stores of formats 1 and 2 are upgraded at their first open for
    /// writing: their records and history entries get a checksum (``ChecksumUpgrade``), and
    /// a format-1 store's indexes that may hold dates or strings are rebuilt.
    static let format: UInt64 = 3
    let path: String
    let txn: WriteTransaction
    let dbs: StoreDatabases
    let options: StoreOptions
    /// The store's data file as opened (see ``identity()``).
    let dataFile: FileIdentity

    struct Result {
        let storeID: RecordID
        let siteID: RecordID
        let copiedFrom: [CopyOrigin]
        let catalog: Catalog
        let syncPreference: Bool
        /// Unique indexes the declaration lists as plain, kept unique ("Type.index").
        var keptUniqueIndexes: Set<String> = []
    }

    static func loadSchema<T: TransactionReading>(_ txn: T, _ dbs: StoreDatabases, _ path: String) throws -> StoreSchema? {
        guard let bytes = try txn.get(dbs.meta, key: MetaKey.schema) else { return nil }
        // Stores of format 3 keep the schema's checksum (older ones get it at their upgrade).
        if let stored = try txn.uint64(dbs.meta, key: MetaKey.schemaChecksum), stored != UInt64(Checksum.crc32c(bytes)) {
            throw StoreError(.corrupted, "store \(path): the stored schema does not match its checksum: the meta database is damaged; restore the store from a backup or a peer")
        }
        let decoder = JSONDecoder()
        decoder.nonConformingFloatDecodingStrategy = .convertFromString(positiveInfinity: nonFinite.positive, negativeInfinity: nonFinite.negative, nan: nonFinite.nan)
        do { return try decoder.decode(StoreSchema.self, from: Data(bytes)) }
        catch { throw StoreError(.corrupted, "store \(path): the stored schema cannot be read (\(describe(error))); it was written by a newer Stash (upgrade) or is damaged (run `stash verify \(path)`, then restore from a backup or a peer)") }
    }

    /// How the stored schema's JSON spells a default of infinity or NaN (JSON has no number
    /// for them).
    private static let nonFinite = (positive: "+Infinity", negative: "-Infinity", nan: "NaN")

    static func saveSchema(_ schema: StoreSchema, generation: UInt64, _ txn: WriteTransaction, _ dbs: StoreDatabases) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        encoder.nonConformingFloatEncodingStrategy = .convertToString(positiveInfinity: nonFinite.positive, negativeInfinity: nonFinite.negative, nan: nonFinite.nan)
        let bytes = Array(try encoder.encode(schema))
        try txn.put(dbs.meta, key: MetaKey.schema, value: bytes)
        try txn.put(dbs.meta, key: MetaKey.schemaChecksum, uint64: UInt64(Checksum.crc32c(bytes)))
        try txn.put(dbs.meta, key: MetaKey.schemaGeneration, uint64: generation)
    }

    func run(_ declared: SchemaDeclaration) throws -> Result {
        let declaration = declared.indexingReferences()   // children are found through an index
        let (storeID, siteID) = try identity()
        let generation = try txn.uint64(dbs.meta, key: MetaKey.schemaGeneration) ?? 0
        let stored = try Self.loadSchema(txn, dbs, path) ?? StoreSchema()
        let context = WriteContext(path: path, txn: txn, dbs: dbs,
                                   catalog: Catalog(schema: stored, generation: generation, carried: try CarriedSchema.load(txn, dbs, path)),
                                   siteID: siteID, author: "migration", now: options.clock)
        if try txn.get(dbs.meta, key: MetaKey.schema) == nil {
            // A new store: persist the (empty) schema so generic tools see a valid store.
            try Self.saveSchema(stored, generation: generation, txn, dbs)
        }
        let format = try txn.uint64(dbs.meta, key: MetaKey.format) ?? Self.format
        if format < 2 {
            try rebuildIndexesOfFormatOne(context)
        }
        if format < Self.format {
            // The checksums were given before this transaction (``ChecksumUpgrade``).
            try txn.put(dbs.meta, key: MetaKey.format, uint64: Self.format)
        }
        try migrate(context, declaring: declaration.types)
        // Types the store lacks are built whole and added in one change of the schema (each
        // change makes a new catalog of every type: one per type made creating a store of
        // thousands of types quadratic); the others are merged one by one.
        let added = try addNewTypes(declaration.types, into: context)
        for type in declaration.types where !added.contains(type.name) { try merge(type, into: context) }
        try Self.mergeReferences(declaration, into: context, path: path)
        try context.finish()
        let (copiedFrom, preference) = try Self.storedOrigins(txn, dbs)
        return Result(storeID: storeID, siteID: siteID, copiedFrom: copiedFrom, catalog: context.catalog, syncPreference: preference,
                      keptUniqueIndexes: context.keptUniqueIndexes)
    }

    /// Throws `.notAStore` for a store format newer than this library's.
    private static func refuseNewer(_ format: UInt64, _ path: String) throws {
        guard format <= Self.format else {
            throw StoreError(.notAStore, "store \(path) has format \(format), newer than this library (\(Self.format)); upgrade Stash")
        }
    }

    /// The store and site ids kept in meta. - Throws: `.corrupted` when either is missing.
    private static func storedIDs<T: TransactionReading>(_ txn: T, _ dbs: StoreDatabases, _ path: String) throws -> (RecordID, RecordID) {
        (try storedID(MetaKey.storeID, txn, dbs, path), try storedID(MetaKey.siteID, txn, dbs, path))
    }

    /// The id kept in meta under `key` (the store's or the site's). - Throws: `.corrupted` when missing.
    static func storedID<T: TransactionReading>(_ key: [UInt8], _ txn: T, _ dbs: StoreDatabases, _ path: String) throws -> RecordID {
        guard let id = RecordID(bytes: (try txn.get(dbs.meta, key: key) ?? [])[...]) else {
            throw StoreError(.corrupted, "store \(path): the store or site id is missing from meta: the store is damaged; restore it from a backup or a peer")
        }
        return id
    }

    /// The replicas the store was copied from, and the user's sync preference (default on).
    private static func storedOrigins<T: TransactionReading>(_ txn: T, _ dbs: StoreDatabases) throws -> ([CopyOrigin], Bool) {
        let preference = try txn.get(dbs.meta, key: MetaKey.extensionKey(Store.syncPreferenceKey))
        return (CopyOrigin.list(decoding: try txn.get(dbs.meta, key: MetaKey.copiedFrom) ?? []), preference != [0])
    }

    /// What a read-only open needs, read without writing anything: no upgrade, no schema
    /// merge, no new site for a copy (the stored one is used as is).
    /// - Throws: `.notAStore` without a format marker or for a newer format; `.readOnly` for
    ///   an older format, which must be upgraded by an open for writing first, and for a store
    ///   that has not run `migrations` yet (its records are in their form from before).
    static func inspect<T: TransactionReading>(_ txn: T, _ dbs: StoreDatabases, _ path: String, migrations: [Migration] = []) throws -> Result {
        guard let format = try txn.uint64(dbs.meta, key: MetaKey.format) else {
            if try txn.statistics(dbs.records).entries == 0 { throw unfinished(path, "this open only reads") }
            throw StoreError(.notAStore, "\(path) holds no Stash format marker; it is not a Stash store")
        }
        try refuseNewer(format, path)
        guard format == Self.format else {
            throw StoreError(.readOnly, "store \(path) has format \(format) and must be upgraded to \(Self.format) before it can be read; open it once for writing")
        }
        let (store, site) = try storedIDs(txn, dbs, path)
        let generation = try txn.uint64(dbs.meta, key: MetaKey.schemaGeneration) ?? 0
        let schema = try loadSchema(txn, dbs, path) ?? StoreSchema()
        if let newest = migrations.map(\.version).max(), newest > schema.version {
            throw StoreError(.readOnly, "store \(path) has run its migrations up to version \(schema.version), and this process brings migration \(newest): read-only, its records would read in their form from before the migration; open it once for writing first (that runs the migration)")
        }
        let (copiedFrom, preference) = try storedOrigins(txn, dbs)
        return Result(storeID: store, siteID: site, copiedFrom: copiedFrom,
                      catalog: Catalog(schema: schema, generation: generation, carried: try CarriedSchema.load(txn, dbs, path)),
                      syncPreference: preference)
    }

    /// A store whose creation did not finish: its databases exist (made by the first open's
    /// first transaction) but not its identity (the second), as a failed or interrupted first
    /// open leaves it. An open that may create stores finishes it.
    private static func unfinished(_ path: String, _ why: String) -> StoreError {
        StoreError(.notAStore, "no Stash store in \(path) yet: its creation did not finish (the open that made it failed or was interrupted), and \(why); open it to create it (`stash init \(path) --schema FILE`); nothing was changed")
    }

    private func identity() throws -> (RecordID, RecordID) {
        if let format = try txn.uint64(dbs.meta, key: MetaKey.format) {
            try Self.refuseNewer(format, path)
        } else {
            guard try txn.statistics(dbs.records).entries == 0 else {
                throw StoreError(.notAStore, "\(path) holds LMDB data but no Stash format marker; it is not a Stash store")
            }
            guard options.createIfMissing else { throw Self.unfinished(path, "this open does not create stores (StoreOptions.createIfMissing)") }
            try txn.put(dbs.meta, key: MetaKey.format, uint64: Self.format)
            try txn.put(dbs.meta, key: MetaKey.storeID, value: RecordID().bytes)
            try txn.put(dbs.meta, key: MetaKey.siteID, value: RecordID().bytes)
            try txn.put(dbs.meta, key: MetaKey.dataFile, value: Self.encoded(dataFile))
            try txn.put(dbs.meta, key: MetaKey.nextSequence, uint64: 1)
            try txn.put(dbs.meta, key: MetaKey.created, uint64: UInt64(Date().timeIntervalSince1970 * 1000))
        }
        var (store, site) = try Self.storedIDs(txn, dbs, path)
        let stored = try txn.get(dbs.meta, key: MetaKey.dataFile).map(Self.fileIdentity(decoding:))
        let requested = try txn.get(dbs.meta, key: MetaKey.newSiteRequested) != nil
        if requested { try txn.delete(dbs.meta, key: MetaKey.newSiteRequested) }
        if requested || stored.map({ !$0.isSameFile(as: dataFile) }) ?? false {
            // Another file than the one the site id was made for: a copy (a restored backup,
            // a copied directory) and so another replica. Writing as the original's site, it
            // would reuse history sequence numbers peers have received from the original
            // (and drop as duplicates) and restart the original's counter totals from stale
            // values. It gets a site of its own; the store id stays. What it holds of the
            // original's history is noted before anything (a migration) writes as the new site.
            // A copy that kept the file's identity (a file-system snapshot rolled back, a cloned
            // volume) is found by sync instead, which asks for this (`requested`).
            let through = max(1, try txn.uint64(dbs.meta, key: MetaKey.nextSequence) ?? 1) - 1
            let earlier = try txn.get(dbs.meta, key: MetaKey.copiedFrom) ?? []
            try txn.put(dbs.meta, key: MetaKey.copiedFrom, value: earlier + CopyOrigin(site: site, through: HistoryToken(sequence: through)).encoded())
            site = RecordID()
            try txn.put(dbs.meta, key: MetaKey.siteID, value: site.bytes)
            try txn.put(dbs.meta, key: MetaKey.dataFile, value: Self.encoded(dataFile))
            // Stores of this directory open already (here or in another process) notice a new
            // schema generation at their next write, and read the new site then.
            try txn.put(dbs.meta, key: MetaKey.schemaGeneration, uint64: (try txn.uint64(dbs.meta, key: MetaKey.schemaGeneration) ?? 0) + 1)
        } else if stored.map({ !$0.hasBirth && dataFile.hasBirth }) ?? true {
            // Kept for the first time (a store from before it was kept is taken as the original),
            // or now with the birth time the stored identity lacked.
            try txn.put(dbs.meta, key: MetaKey.dataFile, value: Self.encoded(dataFile))
        }
        return (store, site)
    }

    /// Stored form of the data file's identity: inode, birth seconds, birth nanoseconds (24
    /// bytes big-endian).
    static func encoded(_ identity: FileIdentity) -> [UInt8] {
        var key = KeyBytes()
        key.appendBigEndian(identity.inode)
        key.appendBigEndian(UInt64(bitPattern: identity.birthSeconds))
        key.appendBigEndian(UInt64(identity.birthNanoseconds))
        return key.bytes
    }

    /// ``encoded(_:)`` read back; the 16-byte form of an earlier build (device, inode) gives
    /// its inode without a birth time.
    static func fileIdentity(decoding bytes: [UInt8]) -> FileIdentity {
        func word(_ at: Int) -> UInt64 {
            guard bytes.count >= at + 8 else { return 0 }
            return bytes[at..<at + 8].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        }
        if bytes.count == 16 { return FileIdentity(inode: word(8), birth: nil) }
        return FileIdentity(inode: word(0), birth: (Int64(bitPattern: word(8)), UInt32(truncatingIfNeeded: word(16))))
    }

    private func report(_ phase: String, _ done: Int, _ total: Int) {
        options.progress?(StoreProgress(phase: phase, done: done, total: total))
    }

    /// The ids of a type's records, listed before any of them is rewritten: 16 bytes each,
    /// where the records' bytes (large inline data, say) could outgrow memory.
    private func recordIDs(of type: TypeSchema) throws -> [RecordID] {
        var result: [RecordID] = []
        try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(type.tag)) { key, _ in
            if let id = StoreKeys.id(fromRecordKey: key) { result.append(id) }
            return true
        }
        return result
    }

    /// An optional field declared non-optional now, without a default: every stored record
    /// must hold a value, or each one without would fail to read (and with it every `fetch`
    /// of the type). O(records of the type), only when a field turns required.
    private func refuseRequiredFieldsMissingFromRecords(_ declaration: TypeDeclaration, _ stored: TypeSchema, _ storedCount: Int) throws {
        guard storedCount > 0 else { return }
        for field in declaration.fields where !field.optional {
            guard let old = stored.fields.first(where: { $0.name == field.name }), old.optional else { continue }
            // A record without the field reads the default, if there is one; a stored null
            // (a nil the app wrote) reads as nothing either way.
            let hasDefault = declaration.defaults[field.name] != nil || old.defaultValue != nil
            var lacking = 0
            try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(stored.tag)) { _, bytes in
                let value = try EncodedRecord.value(of: old.tag, in: bytes)
                if value == .null || (value == nil && !hasDefault) { lacking += 1 }
                return true
            }
            if lacking > 0 {
                throw StoreError(.incompatibleSchema, "store \(path): \(stored.name).\(field.name) was optional and is declared non-optional now, but \(lacking) of the \(storedCount) stored \(stored.name) records have no value (nil); keep it optional, or give those records a value with a Migration\(hasDefault ? "" : " or set \(stored.name).fieldDefaults[\"\(field.name)\"] (in a schema file, \"default\" on the field)")")
            }
        }
    }

    /// Whether a stored record of `type` holds a non-null value of field `tag`. O(records).
    private func anyRecordHolds(_ tag: UInt16, of type: TypeSchema) throws -> Bool {
        var held = false
        try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(type.tag)) { _, bytes in
            if let value = try EncodedRecord.value(of: tag, in: bytes), value != .null { held = true }
            return !held
        }
        return held
    }

    /// Runs the migrations newer than the stored schema version, in version order (those of
    /// one version in the order given), and stores each version once all of its migrations ran.
    /// - Throws: `.invalidValue` when two migrations of one version name the same type;
    ///   `.incompatibleSchema` when one names a type a store holding types neither holds nor is
    ///   opened with (a misspelt name would otherwise do nothing, and its version would count
    ///   as done).
    private func migrate(_ context: WriteContext, declaring declarations: [TypeDeclaration]) throws {
        let declared = Set(declarations.map(\.name))
        let stored = context.catalog.schema.version
        let pending = options.migrations.enumerated()
            .filter { $0.element.version > stored }
            .sorted { ($0.element.version, $0.offset) < ($1.element.version, $1.offset) }
            .map(\.element)
        var seen = Set<String>()
        for migration in pending {
            guard seen.insert("\(migration.version) \(migration.type)").inserted else {
                throw StoreError(.invalidValue, "store \(path): two migrations of version \(migration.version) name type \(migration.type); make them one")
            }
            // A store that holds no type yet (a new install) has nothing to migrate: a migration
            // of a type the app no longer declares is no mistake there.
            guard context.catalog.schema.types.isEmpty || context.catalog.schema.type(named: migration.type) != nil
                    || declared.contains(migration.type) else {
                throw StoreError(.incompatibleSchema, "store \(path): migration \(migration.version) names type \(migration.type), which this store neither holds nor is opened with; check the name (Record.recordType)")
            }
        }
        for (position, migration) in pending.enumerated() {
            if let type = context.catalog.schema.type(named: migration.type) {
                let all = try recordIDs(of: type)
                let phase = "migration \(migration.version) (\(type.name))"
                context.migration = (type.name, [:])
                defer { context.migration = nil }
                let declaredFields = declarations.first { $0.name == type.name }?.fields ?? []
                for (n, id) in all.enumerated() {
                    guard let bytes = try txn.get(dbs.records, key: StoreKeys.record(type.tag, id)) else { continue }
                    let layout = try context.layout(type.name)
                    var record = try GenericRecord(decoding: context.decodeStored(bytes, type.name, id), id: id, layout: layout)
                    do { try migration.transform(&record) }
                    catch { throw StoreError(.incompatibleSchema, "store \(path): migration \(migration.version) failed on \(type.name) \(id): \(describe(error))") }
                    // An int written into a field read as a double (`.int(0)` for a price) is
                    // that number: stored as an int it would change the field's kind.
                    for (name, value) in record.fields {
                        guard case .int(let int) = value else { continue }
                        let kind = declaredFields.first { $0.name == name }?.kind ?? layout.schema.field(named: name)?.kind
                        if kind == .double { record.fields[name] = .double(Double(int)) }
                    }
                    record.id = id
                    record.type = type.name
                    let (newLayout, encoded) = try context.encode(record)
                    try context.put(newLayout, id: id, record: encoded, mode: .upsert)
                    if n % 10_000 == 0 || n == all.count - 1 { report(phase, n + 1, all.count) }
                }
                if let clash = try context.migratedUniqueClashes().first {
                    throw StoreError(.uniqueViolation, "store \(path): migration \(migration.version) left \(type.name) \(clash.removed) and \(clash.kept) with one value of unique index \(clash.index); make the values unique in the migration, or relax the index (StoreOptions.relaxesUniqueIndexes) in a release before this migration's")
                }
                for (field, kinds) in context.migration?.kinds ?? [:] where kinds.count > 1 {
                    let names = kinds.map(\.rawValue).sorted().joined(separator: " and ")
                    throw StoreError(.incompatibleSchema, "store \(path): migration \(migration.version) left \(type.name).\(field) as both \(names); convert it in every record")
                }
            }
            // The version counts as done once every migration of it ran.
            if position == pending.count - 1 || pending[position + 1].version != migration.version {
                context.updateSchema { $0.version = migration.version }
            }
        }
    }

    /// Adds the declared types the store lacks and holds nothing of (no states or fields
    /// carried for other replicas), each built whole as ``merge(_:into:)`` would make it, in
    /// one change of the schema. O(types + their fields and indexes).
    /// - Returns: the names of the types added.
    private func addNewTypes(_ declarations: [TypeDeclaration], into context: WriteContext) throws -> Set<String> {
        let catalog = context.catalog
        var nextTag = catalog.schema.nextTypeTag
        var added: [TypeSchema] = []
        for declaration in declarations where catalog.layoutsByName[declaration.name] == nil
            && catalog.carried.types[declaration.name] == nil && catalog.carried.fields[declaration.name] == nil {
            try refuseStrayDefaults(declaration)
            var type = TypeSchema(name: declaration.name, tag: nextTag, fields: [], indexes: [], localOnly: declaration.localOnly)
            try applyFields(of: declaration, to: &type, storedCount: 0, unheld: [], version: catalog.schema.version)
            appendMissingIndexes(of: declaration, to: &type)
            added.append(type)
            nextTag += 1
        }
        if !added.isEmpty { context.updateSchema { $0.types.append(contentsOf: added) } }
        return Set(added.map(\.name))
    }

    /// A default for a field the type does not decode (a misspelt name) would add a field of
    /// that name to every record for good, and leave the intended one without.
    private func refuseStrayDefaults(_ declaration: TypeDeclaration) throws {
        guard !declaration.fields.isEmpty else { return }
        let name = declaration.name
        let declared = Set(declaration.fields.map(\.name))
        if let stray = declaration.defaults.keys.sorted().first(where: { !declared.contains($0) }) {
            throw StoreError(.incompatibleSchema, "store \(path): \(name).fieldDefaults names '\(stray)', a field \(name) does not decode (its fields: \(declared.sorted().joined(separator: ", "))); check the name")
        }
    }

    private func merge(_ declaration: TypeDeclaration, into context: WriteContext) throws {
        let name = declaration.name
        try refuseStrayDefaults(declaration)
        if context.catalog.layoutsByName[name] == nil {
            context.updateSchema { schema in
                schema.types.append(TypeSchema(name: name, tag: schema.nextTypeTag, fields: [], indexes: [], localOnly: declaration.localOnly))
            }
        }
        let storedCount = try context.count(try context.layout(name).schema.tag)
        try moveInlineBytesOut(declaration, into: context)
        let before = try context.layout(name).schema
        let localOnly = declaration.keepsStoredLocalOnly ? before.localOnly : declaration.localOnly
        try refuseRequiredFieldsMissingFromRecords(declaration, before, storedCount)
        // A field no stored record holds a value of may take another kind (a kind recorded
        // wrongly, such as the map an older probe gave an enum with Double raw values).
        var unheld = Set<String>()
        for field in declaration.fields where !field.anyKind {
            guard let old = before.fields.first(where: { $0.name == field.name }) else { continue }
            if old.anyKind == true {
                // Values of any kind, declared of one now: the stored ones may be of others.
                if try storedCount > 0 && anyRecordHolds(old.tag, of: before) {
                    throw StoreError(.incompatibleSchema, "store \(path): \(name).\(field.name) holds values of any kind (it was a FieldValue or JSONValue) but is declared \(field.kind.rawValue) now; declare it as before, or store the values under a new field name (a Migration can move them)")
                }
                continue
            }
            guard let kind = old.kind, kind != field.kind else { continue }
            if try storedCount == 0 || !anyRecordHolds(old.tag, of: before) { unheld.insert(field.name) }
        }
        var merged = before
        merged.localOnly = localOnly
        try applyFields(of: declaration, to: &merged, storedCount: storedCount, unheld: unheld, version: context.catalog.schema.version)
        if merged != before {
            context.updateSchema { schema in
                if let t = schema.types.firstIndex(where: { $0.tag == merged.tag }) { schema.types[t] = merged }
            }
        }
        // What the store carried for the type while it was not declared here, or for fields
        // it holds only now, joins its records.
        try context.absorbCarried(typeNamed: name, before: before) { done in
            report("records of \(name) kept for other replicas", done, 0)
        }
        if before.localOnly && !localOnly {
            // Synced from now on: the records it holds (and its deletes) are in history that
            // sync passed over while the type was local-only, so this open's history entry
            // lists them again. Peers' records of the type were skipped here while their
            // watermarks moved past them: the sync engine asks every peer for everything again.
            try context.noteEveryRecordChanged(try context.layout(name))
            try txn.put(dbs.meta, key: MetaKey.extensionKey(Store.typesTurnedSyncedKey), value: [1])
        }
        try mergeIndexes(declaration, into: context)
        // Stored records that lack a field are indexed under its default: an index on a field
        // whose default changed is rebuilt (indexes added just now were built with the new one).
        let after = try context.layout(name).schema
        let changedDefaults = Set(declaration.defaults.keys.filter { fieldName in
            before.field(named: fieldName).map { $0.defaultValue != after.field(named: fieldName)?.defaultValue } ?? false
        })
        guard !changedDefaults.isEmpty else { return }
        for index in after.indexes where before.indexes.contains(where: { $0.tag == index.tag })
            && index.fields.contains(where: changedDefaults.contains) {
            try removeEntries(of: index, of: after)
            try backfill(index, of: name, context)
        }
    }

    /// Merges the fields and defaults of `declaration` into `type` (holding `storedCount`
    /// records; `unheld`: fields whose kind may change, no record holding a value of them).
    /// - Throws: `.incompatibleSchema` for a change the stored records do not allow.
    private func applyFields(of declaration: TypeDeclaration, to type: inout TypeSchema, storedCount: Int, unheld: Set<String>, version: Int) throws {
        let name = declaration.name
        for field in declaration.fields {
            if let f = type.fields.firstIndex(where: { $0.name == field.name }) {
                let stored = type.fields[f]
                if field.anyKind {
                    // Whatever kind the values stored so far have, the field takes any now.
                    type.fields[f].kind = nil
                    type.fields[f].anyKind = true
                    type.fields[f].optional = field.optional
                    type.fields[f].counter = nil
                    continue
                }
                type.fields[f].anyKind = nil
                if let kind = stored.kind, kind != field.kind, !unheld.contains(field.name) {
                    throw StoreError(.incompatibleSchema, "store \(path): \(name).\(field.name) is stored as \(kind.rawValue) but declared \(field.kind.rawValue); add a Migration (version \(version + 1)) that converts it")
                }
                // Counter or plain map decides how replicas merge the field; a store that
                // holds records keeps its choice (replicas that merged differently diverge).
                if storedCount > 0, stored.kind != nil, (stored.counter == true) != field.counter {
                    let was = stored.counter == true ? "a counter" : "a plain \(stored.kind?.rawValue ?? "value")"
                    throw StoreError(.incompatibleSchema, "store \(path): \(name).\(field.name) is \(was) in the \(storedCount) stored \(name) records but declared \(field.counter ? "a counter" : "a plain \(field.kind.rawValue)"); declare it as stored (a schema file says \"kind\": \"counter\" for a counter)")
                }
                type.fields[f].kind = field.kind
                type.fields[f].optional = field.optional
                type.fields[f].counter = field.counter ? true : nil
                type.fields[f].external = field.external ? true : nil
            } else {
                if !field.optional && storedCount > 0 && declaration.defaults[field.name] == nil {
                    throw StoreError(.incompatibleSchema, "store \(path): \(name).\(field.name) is new and not optional, but \(storedCount) stored \(name) records lack it; make it optional or set \(name).fieldDefaults[\"\(field.name)\"] (in a schema file, \"default\" on the field)")
                }
                let tag = type.nextFieldTag
                type.fields.append(FieldSchema(name: field.name, tag: tag, kind: field.anyKind ? nil : field.kind,
                                               optional: field.optional, counter: field.counter ? true : nil,
                                               anyKind: field.anyKind ? true : nil, external: field.external ? true : nil))
            }
        }
        if !declaration.fields.isEmpty {
            // A stored field the type no longer declares is not written by it: records it
            // writes lack the field, so it is optional from now on. Declared required
            // again later, the check above then counts the records that lack it.
            let declared = Set(declaration.fields.map(\.name))
            for f in type.fields.indices where !declared.contains(type.fields[f].name) {
                type.fields[f].optional = true
            }
        }
        for (fieldName, value) in declaration.defaults {
            if let f = type.fields.firstIndex(where: { $0.name == fieldName }) {
                type.fields[f].defaultValue = try storedDefault(value, of: "\(name).\(fieldName)", kind: type.fields[f].kind)
            } else {
                let tag = type.nextFieldTag
                type.fields.append(FieldSchema(name: fieldName, tag: tag, kind: value.kind, optional: true, defaultValue: value))
            }
        }
    }

    /// Adds to `type` each index `declaration` lists that it lacks (a new type's: no entries to
    /// build).
    private func appendMissingIndexes(of declaration: TypeDeclaration, to type: inout TypeSchema) {
        for wanted in declaration.indexes where type.index(named: IndexSchema.name(for: wanted.fields)) == nil {
            let index = IndexSchema(name: IndexSchema.name(for: wanted.fields), tag: type.nextIndexTag, fields: wanted.fields, unique: wanted.unique)
            type.indexes.append(index)
            type.lastIndexTag = index.tag
        }
    }

    /// A declared default in the stored kind of its field, which is how records lacking the
    /// field are read and indexed: an int default of a double field becomes that double.
    /// - Throws: `.incompatibleSchema` for any other default whose kind differs from the
    ///   field's (its index keys would sort apart from the field's values).
    private func storedDefault(_ value: FieldValue, of field: String, kind: FieldKind?) throws -> FieldValue {
        guard let kind, let given = value.kind, given != kind else { return value }
        if kind == .double, case .int(let integer) = value { return .double(Double(integer)) }
        throw StoreError(.incompatibleSchema, "store \(path): the declared default of \(field) is \(given.rawValue) \(value), but the field is \(kind.rawValue); give a \(kind.rawValue) value in fieldDefaults")
    }

    private func mergeIndexes(_ declaration: TypeDeclaration, into context: WriteContext) throws {
        let name = declaration.name
        let wanted = declaration.indexes.map { (IndexSchema.name(for: $0.fields), $0) }
        let stored = try context.layout(name).schema
        // An index the declaration lacks stays (every writer maintains the stored schema's
        // indexes, declared or not) unless the app asks for its removal: another process, or
        // an older version of the app, opening with fewer indexes must not remove an index
        // that the processes declaring it count and query through (their catalogs still list
        // it, so they would read its missing entries as no records). A declared index whose
        // uniqueness changed is rebuilt under its own tag, for the same reason: a process still
        // holding the older schema goes on finding its entries.
        for index in stored.indexes {
            let declared = wanted.first { $0.0 == index.name }
            if let declared, declared.1.unique == index.unique { continue }
            // A unique index declared plain stays unique unless the app asks (an older version
            // opening would otherwise let duplicates in, and the newer one then fail to open).
            if let declared, index.unique, !declared.1.unique, !options.relaxesUniqueIndexes {
                context.keptUniqueIndexes.insert("\(name).\(index.name)")
                continue
            }
            if let declared {
                try removeEntries(of: index, of: stored)
                var changed = index
                changed.unique = declared.1.unique
                context.updateSchema { schema in
                    let t = schema.types.firstIndex { $0.name == name }!
                    let i = schema.types[t].indexes.firstIndex { $0.tag == index.tag }!
                    schema.types[t].indexes[i] = changed
                }
                try backfill(changed, of: name, context)
                continue
            }
            if options.dropsUndeclaredIndexes { try dropIndex(index, of: stored, context) }
        }
        for (indexName, wantedIndex) in wanted where try context.layout(name).schema.index(named: indexName) == nil {
            var added: IndexSchema?
            context.updateSchema { schema in
                let t = schema.types.firstIndex { $0.name == name }!
                let index = IndexSchema(name: indexName, tag: schema.types[t].nextIndexTag, fields: wantedIndex.fields, unique: wantedIndex.unique)
                schema.types[t].indexes.append(index)
                schema.types[t].lastIndexTag = index.tag
                added = index
            }
            try backfill(added!, of: name, context)
        }
    }

    private func dropIndex(_ index: IndexSchema, of type: TypeSchema, _ context: WriteContext) throws {
        try removeEntries(of: index, of: type)
        context.updateSchema { schema in
            let t = schema.types.firstIndex { $0.name == type.name }!
            schema.types[t].indexes.removeAll { $0.tag == index.tag }
        }
    }

    /// Deletes every entry of `index` (each key with all its duplicates). O(distinct keys).
    private func removeEntries(of index: IndexSchema, of type: TypeSchema) throws {
        var keys: [[UInt8]] = []
        try txn.forEachKeyWithCount(dbs.index, prefix: StoreKeys.indexPrefix(type.tag, index.tag)) { key, _ in
            keys.append(key)
            return true
        }
        for key in keys { try txn.delete(dbs.index, key: key) }
    }

    /// Rebuilds every index of a format-1 store whose keys changed in format 2: those that may
    /// hold a date (keys were seconds since 1970), a string (keys were its bytes, not its NFC
    /// form), or an array or map (which may hold either), or a field of a kind not known yet.
    private func rebuildIndexesOfFormatOne(_ context: WriteContext) throws {
        let changed: Set<FieldKind?> = [.date, .string, .array, .map, nil]
        for type in context.catalog.schema.types {
            for index in type.indexes where index.fields.contains(where: { changed.contains(type.field(named: $0)?.kind) }) {
                try removeEntries(of: index, of: type)
                try backfill(index, of: type.name, context, upgrading: true)
            }
        }
    }

    /// Indexes every stored record of `typeName` under `index`. `upgrading`: the rebuild of a
    /// format-1 store, which runs before migrations and declarations (a clash there says so).
    private func backfill(_ index: IndexSchema, of typeName: String, _ context: WriteContext, upgrading: Bool = false) throws {
        let layout = try context.layout(typeName)
        let total = try context.count(layout.schema.tag)
        guard total > 0 else { return }
        let phase = "index \(typeName)(\(index.name))"
        var done = 0
        report(phase, 0, total)
        try txn.scan(dbs.records, prefix: StoreKeys.typePrefix(layout.schema.tag)) { key, value in
            guard let id = StoreKeys.id(fromRecordKey: key) else { return true }
            try context.addIndexEntry(index, layout, try context.decodeStored(value, typeName, id), id: id, upgrading: upgrading)
            done += 1
            if done % 10_000 == 0 { report(phase, done, total) }
            return true
        }
        report(phase, done, total)
    }
}

extension GenericRecord {
    /// A stored record seen through its type's layout (unknown tags are kept as `#tag`).
    init(decoding record: EncodedRecord, id: RecordID, layout: TypeLayout) throws {
        var fields: [String: FieldValue] = [:]
        for (tag, value) in try record.values() {
            fields[layout.schema.field(tagged: tag)?.name ?? "#\(tag)"] = value
        }
        for (name, value) in layout.defaults where fields[name] == nil { fields[name] = value }
        self.init(type: layout.schema.name, id: id, fields: fields)
    }
}
