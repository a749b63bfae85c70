import ArgumentParser
import Foundation
import Stash

struct Init: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Create a store (or update its schema) from a JSON schema file.",
        discussion: """
        The schema file lists types with fields, indexes and local-only flags:
        {"types": [{"name": "Item", "localOnly": false,
           "fields": [{"name": "homeID", "kind": "uuid"},
                      {"name": "name", "kind": "string"},
                      {"name": "note", "kind": "string", "optional": true}],
           "indexes": [{"fields": ["homeID"]},
                       {"fields": ["name"], "unique": true}]}]}
        Kinds: bool, int, double, string, bytes, uuid, date, array, map; counter (a
        map merged per site); any (values of every kind, a FieldValue or JSONValue).
        A field may give "default": a value (as put reads it) for records stored
        before the field existed: {"name": "starred", "kind": "bool", "default": false}.
        A field of large bytes (images) may be external: {"name": "image", "kind":
        "bytes", "external": true, "optional": true}: its bytes live in DIR/blobs/ (one
        file per SHA-256, synced once), the record holds a reference {"$blob": "<sha256>",
        "size": n}; put takes base64 text for it. An inline bytes field declared external
        has its stored values moved out.
        A type without "localOnly" keeps what the store has (a new type is synced).
        "references": [{"field": "homeID", "to": "Home", "onDelete": "cascade"}]
        makes a uuid field refer to a parent type (onDelete: cascade, deny, nullify);
        a type without "references" keeps the stored ones.
        Any other key is refused (a misspelt one would be ignored otherwise).
        """)

    @Argument(help: "The store directory (created if missing).") var directory: String
    @Option(name: .long, help: "The JSON schema file.") var schema: String
    @Flag(name: .long, help: "Remove the stored indexes of listed types that the file no longer lists (default: they stay).")
    var dropUndeclaredIndexes = false
    @Flag(name: .long, help: "Make stored unique indexes that the file lists without \"unique\": true plain (default: they stay unique).")
    var relaxUniqueIndexes = false

    func run() throws {
        try runCommand {
            let data = try readWholeFile(schema, "schema file ")
            let declaration: SchemaDeclaration
            do { declaration = try JSONDecoder().decode(SchemaDeclaration.self, from: data) }
            catch { throw CommandFailure(message: "schema file \(schema): \(describe(error, in: data)); see stash init --help for the format") }
            try check(declaration, stored: try storedSchema())
            var options = StoreOptions()
            options.progress = progressReporter()
            options.dropsUndeclaredIndexes = dropUndeclaredIndexes
            options.relaxesUniqueIndexes = relaxUniqueIndexes
            let store = try Store.open(at: directory, declaration: declaration, options: options)
            let names = store.schema.types.map(\.name).joined(separator: ", ")
            printLine("store \(store.path): \(store.schema.types.count) type(s): \(names)")
        }
    }

    /// The schema of the store already in `directory`, read without writing; nil for none.
    private func storedSchema() throws -> StoreSchema? {
        guard FileManager.default.fileExists(atPath: (directory as NSString).appendingPathComponent("data.mdb")) else { return nil }
        var options = StoreOptions()
        options.readOnly = true
        do { return try Store.open(at: directory, declaration: SchemaDeclaration(types: []), options: options).schema }
        // An older format (the open upgrades it), or data that is no store yet (the open
        // makes one, or refuses another program's): the writable open decides.
        catch let error as StoreError where error.code == .readOnly || error.code == .notAStore { return nil }
    }

    /// What the command line could never use, refused before anything is written: a
    /// nameless type or field, a field named "id" (the record id's name), and an index on a
    /// field neither the file nor the store declares (a typo: records written here must use
    /// declared fields, so the index would stay empty). A type or field twice `Store.open`
    /// refuses, before it makes any file.
    private func check(_ declaration: SchemaDeclaration, stored: StoreSchema?) throws {
        // By name once: a lookup per declared type in the list would make thousands of types quadratic.
        let storedTypes = Dictionary((stored?.types ?? []).map { ($0.name, $0) }, uniquingKeysWith: { first, _ in first })
        for type in declaration.types {
            guard !type.name.isEmpty else { throw CommandFailure(message: "schema file \(schema): a type has an empty name") }
            var fields: Set<String> = Set(storedTypes[type.name]?.fields.map(\.name) ?? [])
            for field in type.fields {
                guard !field.name.isEmpty, field.name != "id" else {
                    throw CommandFailure(message: "schema file \(schema): \(type.name) has a field named \"\(field.name)\"; \(field.name.isEmpty ? "give it a name" : "\"id\" is the record id, every record has it")")
                }
                fields.insert(field.name)
            }
            for index in type.indexes {
                for name in index.fields where !fields.contains(name) {
                    throw CommandFailure(message: "schema file \(schema): an index of \(type.name) names \"\(name)\", which is not one of its fields (\(fields.sorted().joined(separator: ", "))); declare the field, or fix the name")
                }
            }
        }
    }
}

struct Put: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Insert or replace a record given as a JSON object; prints its id.",
        discussion: "Without an \"id\" member a new time-ordered id is made. Fields must exist in the stored schema.")

    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The record type.") var type: String
    @Argument(help: "The record as a JSON object.") var json: String
    @Flag(name: .long, help: "Fail if a record with this id exists (default: replace it).") var insert = false

    func run() throws {
        try runCommand {
            let store = try openExisting(directory)
            let typeSchema = try requireType(store, type)
            let value = try JSONValue.parse(json)
            let record = try genericRecord(type: typeSchema, json: value)
            let omitted = omittedCounters(type: typeSchema, json: value)
            try store.write(author: "cli") { tx in
                try tx.put(try keepingStoredCounters(record, omitted: omitted, in: tx), replacing: !insert)
            }
            printLine(record.id.description)
        }
    }
}

/// A record from a JSON object, checked against the stored schema: known fields, right
/// kinds, required fields present. A missing "id" gets a new time-ordered id.
/// `orDumpLine`: a line of `stash dump` is read too (its record is then read as a plain one).
func genericRecord(type: TypeSchema, json: JSONValue, orDumpLine: Bool = true) throws -> GenericRecord {
    guard case .object(let members) = json else {
        throw CommandFailure(message: "a record must be a JSON object, like {\"name\": \"Lamp\"}")
    }
    // A line of `stash dump`: {"type": …, "id": …, "fields": {…}}, told by its shape, also for
    // a type with fields named "type" or "fields" (their values are inside "fields" then).
    let ownFields = type.field(named: "fields") != nil || type.field(named: "type") != nil
    if orDumpLine, members.count == 3, case .string(let typeName)? = members["type"], case .object(var inner)? = members["fields"],
       case .string(let idText)? = members["id"], let id = members["id"], UUID(uuidString: idText) != nil, inner["id"] == nil,
       !ownFields || typeName == type.name {
        guard typeName == type.name else {
            throw CommandFailure(message: "a dumped \(typeName) record, not \(type.name); dump one type with `stash dump DIR \(type.name)`")
        }
        inner["id"] = id
        return try genericRecord(type: type, json: .object(inner), orDumpLine: false)
    }
    var id = RecordID()
    var fields: [String: FieldValue] = [:]
    for (name, value) in members {
        if name == "id" {
            guard case .string(let text) = value else { throw CommandFailure(message: "\"id\" must be a UUID string") }
            id = try parseID(text)
            continue
        }
        guard let field = type.field(named: name) else {
            let known = type.fields.map(\.name).sorted().joined(separator: ", ")
            throw StoreError(.unknownField, "\(type.name) has no field '\(name)' (fields: \(known))")
        }
        if field.counter == true, value != .null, { if case .object = value { return false } else { return true } }() {
            throw StoreError(.invalidValue, "\(type.name).\(name) is a counter: leave it out (a new record's starts at 0) and change it with `stash counter DIR \(type.name) ID \(name) +N`, or give its state as `stash get` prints it")
        }
        // An external field takes the bytes as base64 text (kept as a blob by the put), or a
        // reference as `get` prints it.
        let external = field.external == true && { if case .string = value { return true } else { return false } }()
        fields[name] = try FieldValue.fromJSON(value, kind: external ? .bytes : field.kind, field: name)
    }
    for field in type.fields where !field.optional && field.defaultValue == nil && (fields[field.name] ?? .null) == .null {
        // A counter left out starts at zero (`stash counter` changes it); `put` and `load`
        // keep the one a record they replace holds (``keepingStoredCounters(_:omitted:in:)``).
        if field.counter == true && members[field.name] == nil {
            fields[field.name] = Counter.zeroState
            continue
        }
        throw StoreError(.invalidValue, "\(type.name) needs field '\(field.name)' (\(field.kind?.rawValue ?? "any"))")
    }
    return GenericRecord(type: type.name, id: id, fields: fields)
}

/// The counter fields of `type` that a record's JSON object leaves out (``genericRecord(type:json:orDumpLine:)``
/// sets them to zero), a dumped line's fields included.
func omittedCounters(type: TypeSchema, json: JSONValue) -> [String] {
    guard case .object(var members) = json else { return [] }
    if members.count == 3, case .object(let inner)? = members["fields"], members["type"] != nil, members["id"] != nil,
       type.field(named: "fields") == nil { members = inner }
    return type.fields.filter { $0.counter == true && !$0.optional && members[$0.name] == nil }.map(\.name)
}

extension Counter {
    /// The state of a counter no site has changed: its value is 0.
    static let zeroState = FieldValue.map(["sites": .map([:])])
}

/// `record`, with the counters its JSON left out taken from the record of its id that the
/// store holds, if any: a `put` or `load` that replaces a record without naming its counter
/// does not reset it (a counter changes through `stash counter` only).
func keepingStoredCounters(_ record: GenericRecord, omitted: [String], in tx: StoreTransaction) throws -> GenericRecord {
    guard !omitted.isEmpty, let stored = try tx.get(typeNamed: record.type, id: record.id) else { return record }
    var record = record
    for name in omitted { if let value = stored.fields[name] { record.fields[name] = value } }
    return record
}

struct Load: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Insert or replace records from JSON lines (one object per line), in one transaction.",
        discussion: """
        A line is a record ({"id": …, "name": …}, the id optional) or a line of `stash dump DIR TYPE`, \
        which reads back exactly. \
        Every line is checked before anything is written, and all records are written in one transaction: \
        a bad line, or a record the store refuses (a unique value taken, say), stops the load with its line \
        number and writes nothing. With --batch N, every N records commit on their own: a refusal then keeps \
        the batches before it, and the error says how many records were committed. \
        The input is read a line at a time, twice (every line is checked, then written): standard input \
        or a pipe is first copied to a temporary file (in TMPDIR), removed when the load ends. \
        One transaction keeps what it writes in memory until it commits (LMDB's rule): for input larger \
        than memory, use --batch.
        """)

    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The record type.") var type: String
    @Argument(help: "A JSON-lines file, or - for standard input.") var file: String
    @Option(help: "Commit every N records (default: all in one transaction).") var batch: Int?

    func validate() throws {
        if let batch, batch < 1 { throw ValidationError("--batch must be at least 1, not \(batch)") }
    }

    func run() throws {
        try runCommand {
            let store = try openExisting(directory)
            let typeSchema = try requireType(store, type)
            // The input is streamed, never held whole (a multi-GB file must load in bounded
            // memory): a first pass checks every line and keeps only the count, then the
            // writes read the lines again. A write may run again when the map grows, so each
            // run opens its own reader at the line where its batch starts (`next`). Without
            // --batch the one write streams every line.
            let input = try JSONLinesInput(path: file)
            let (total, end) = try check(input, typeSchema)
            let size = batch ?? max(total, 1)
            var written = 0
            var next = JSONLinePosition.start
            var reported = 0   // a write that reruns (the map grew) does not print its progress again
            while written < total {
                let (count, after) = try store.write(author: "cli") { tx in
                    var lines = input.lines(from: next, upTo: end)
                    var count = 0
                    while count < size {
                        var number = lines.position.line
                        do {
                            guard let line = try lines.next() else { break }
                            number = line.number
                            let value = try JSONValue.parse(line.text)
                            let record = try genericRecord(type: typeSchema, json: value)
                            try tx.put(try keepingStoredCounters(record, omitted: omittedCounters(type: typeSchema, json: value), in: tx))
                        } catch {
                            let kept = written == 0 ? "nothing was written" : "the first \(written) records were committed (batches of \(size))"
                            throw CommandFailure(message: "\(inputName) line \((error as? NotUTF8Line)?.number ?? number): \(error); \(kept)")
                        }
                        count += 1
                        let done = written + count
                        if done % 10_000 == 0 && done > reported {
                            printError("loaded \(done)/\(total)")
                            reported = done
                        }
                    }
                    return (count, lines.position)
                }
                written += count
                next = after
                if count < size { break }   // the input ended early: it changed since it was checked
            }
            if total > 0 { printError("loaded \(written)/\(total)") }
            printLine("\(written)")
        }
    }

    /// The input as errors name it.
    private var inputName: String { file == "-" ? "standard input" : file }

    /// Reads every line of `input` as a record of `type` and keeps none: the number of records,
    /// and where the input ended (the writes read no further, should it grow meanwhile).
    /// - Throws: ``CommandFailure`` naming the first bad line.
    private func check(_ input: JSONLinesInput, _ type: TypeSchema) throws -> (records: Int, end: JSONLinePosition) {
        var lines = input.lines()
        var records = 0
        while true {
            let line: JSONLine
            do {
                guard let next = try lines.next() else { break }
                line = next
            } catch let error as NotUTF8Line {
                throw CommandFailure(message: "\(inputName) line \(error.number): \(error); nothing was written")
            }
            do { _ = try genericRecord(type: type, json: try JSONValue.parse(line.text)) }
            catch { throw CommandFailure(message: "\(inputName) line \(line.number): \(error); nothing was written") }
            records += 1
            if records % 10_000 == 0 { printError("checked \(records) records") }
        }
        return (records, lines.position)
    }
}

/// The stored schema of `name`, or the one-line error listing the known types.
func requireType(_ store: Store, _ name: String) throws -> TypeSchema {
    guard let type = store.schema.type(named: name) else {
        let known = store.schema.types.map(\.name).sorted().joined(separator: ", ")
        throw StoreError(.unknownType, "store \(store.path) has no record type '\(name)' (known: \(known.isEmpty ? "none" : known))")
    }
    return type
}

struct Get: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Print one record as JSON.")
    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The record type.") var type: String
    @Argument(help: "The record id.") var id: String

    func run() throws {
        try runCommand {
            let store = try openExisting(directory, readOnly: true)
            let recordID = try parseID(id)
            guard let record = try store.read({ try $0.get(typeNamed: type, id: recordID) }) else {
                throw StoreError(.notFound, "store \(store.path): no \(type) with id \(id)")
            }
            var object = record.fieldsJSON(as: try requireType(store, type))
            object["id"] = .string(record.id.description)
            printLine(JSONValue.object(object).text)
        }
    }
}

struct Delete: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Delete one record.")
    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The record type.") var type: String
    @Argument(help: "The record id.") var id: String

    func run() throws {
        try runCommand {
            let store = try openExisting(directory)
            let recordID = try parseID(id)
            guard try store.write(author: "cli", { try $0.delete(typeNamed: type, id: recordID) }) else {
                throw StoreError(.notFound, "store \(store.path): no \(type) with id \(id)")
            }
            printLine("deleted \(type) \(id)")
        }
    }
}

struct Count: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Count records of a type, optionally where fields match.",
        discussion: "Conditions: field=value, field<value, field<=value, field>value, field>=value (all must hold). Values are trimmed; null is no value; a value in double quotes is that JSON string exactly: name=\" padded \" or name=\"null\".")
    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The record type.") var type: String
    @Option(name: .customLong("where"), help: "A condition such as homeID=… or wearCount>=3 (repeatable).") var conditions: [String] = []
    @Flag(name: .long, help: "Also print the query plan on stderr.") var explain = false

    func run() throws {
        try runCommand {
            let store = try openExisting(directory, readOnly: true)
            let typeSchema = try requireType(store, type)
            let parsed = try conditions.map { try parseCondition($0, typeSchema) }
            let (count, plan) = try store.read { snapshot in
                (try snapshot.count(typeNamed: type, where: parsed), try snapshot.explain(typeNamed: type, where: parsed))
            }
            if explain { printError("plan: \(plan)") }
            printLine("\(count)")
        }
    }
}

/// `field=value` and friends, with the value read according to the field's kind. The first
/// operator in the text splits it (a value may hold "<", ">" or "=": `title=a<=b`).
func parseCondition(_ text: String, _ type: TypeSchema) throws -> QueryCondition {
    let operators: [(String, QueryCondition.Operator)] = [("<=", .lessOrEqual), (">=", .greaterOrEqual), ("=", .equal), ("<", .less), (">", .greater)]
    if let first = text.firstIndex(where: { $0 == "<" || $0 == ">" || $0 == "=" }),
       let (symbol, op) = operators.first(where: { text[first...].hasPrefix($0.0) }) {
        let range = first..<text.index(first, offsetBy: symbol.count)
        let field = String(text[..<range.lowerBound]).trimmingCharacters(in: .whitespaces)
        let raw = String(text[range.upperBound...]).trimmingCharacters(in: .whitespaces)
        if field == "id" { return QueryCondition(field: "id", op: op, value: .uuid(try parseID(raw).uuid)) }
        guard let schema = type.field(named: field) else {
            let known = type.fields.map(\.name).sorted().joined(separator: ", ")
            throw StoreError(.unknownField, "\(type.name) has no field '\(field)' (fields: \(known))")
        }
        return QueryCondition(field: field, op: op, value: try parseScalar(raw, kind: schema.kind, field: field))
    }
    throw CommandFailure(message: "condition '\(text)' needs an operator: =, <, <=, >, >=")
}

struct Dump: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print records as JSON lines: {\"type\": …, \"id\": …, \"fields\": {…}}.",
        discussion: "Records are decoded from the stored schema; no Swift types are needed.")
    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "Only this record type.") var type: String?

    func run() throws {
        try runCommand {
            let store = try openExisting(directory, readOnly: true)
            let types = try type.map { [try requireType(store, $0).name] } ?? store.schema.types.map(\.name)
            try store.read { snapshot in
                for name in types {
                    let schema = try requireType(store, name)
                    try snapshot.forEachRecord(typeNamed: name) { record in
                        let line = JSONValue.object(["type": .string(record.type), "id": .string(record.id.description),
                                                     "fields": .object(record.fieldsJSON(as: schema))])
                        printLine(line.text)
                        return true
                    }
                }
            }
        }
    }
}

struct Stat: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "Types, counts, indexes, map size and LMDB statistics.")
    @Argument(help: "The store directory.") var directory: String
    @Flag(name: .long, help: "Print JSON instead of text.") var json = false

    func run() throws {
        try runCommand {
            let store = try openExisting(directory, readOnly: true)
            let stats = try store.statistics()
            if json {
                let encoder = JSONEncoder()
                encoder.outputFormatting = [.sortedKeys, .prettyPrinted]
                // The store's statistics, with its blobs under "blobs".
                var object = try JSONDecoder().decode([String: JSONValue].self, from: try encoder.encode(stats))
                object["blobs"] = try JSONDecoder().decode(JSONValue.self, from: try encoder.encode(try store.blobStatistics()))
                printLine(String(decoding: try encoder.encode(object), as: UTF8.self))
                return
            }
            printLine("store    \(stats.path)")
            printLine("ids      store \(stats.storeID)  site \(stats.siteID)  schema v\(stats.schemaVersion)")
            printLine("map      \(bytes(stats.mapUsed)) used of \(bytes(stats.mapSize)) (file \(bytes(stats.fileSize)), page \(stats.pageSize) B)")
            printLine("readers  \(stats.readersInUse) of \(stats.maxReaders)")
            printLine("history  \(stats.historyEntries) entries, \(bytes(stats.historyBytes))")
            for type in stats.types {
                printLine("type     \(type.name): \(type.count) records, \(type.fields) fields\(type.localOnly ? ", local-only" : "")")
                for index in type.indexes {
                    printLine("  index  \(index.name)\(index.unique ? " (unique)" : ""): \(index.entries) entries, \(index.distinctKeys) keys")
                }
            }
            for (name, db) in stats.databases.sorted(by: { $0.key < $1.key }) {
                printLine("lmdb     \(name): \(db.entries) entries, depth \(db.depth), \(db.leafPages) leaf + \(db.branchPages) branch + \(db.overflowPages) overflow pages")
            }
            let blobs = try store.blobStatistics()
            printLine("blobs    \(blobs.files) files, \(bytes(blobs.bytes)); referenced \(blobs.referenced) (\(bytes(blobs.referencedBytes))), pending \(blobs.pending) (\(bytes(blobs.pendingBytes))), unreferenced \(blobs.unreferenced) (\(bytes(blobs.unreferencedBytes))), temporary \(blobs.temporary)")
        }
    }

    private func bytes(_ n: Int) -> String {
        n >= 1 << 20 ? String(format: "%.1f MiB", Double(n) / 1048576) : String(format: "%.1f KiB", Double(n) / 1024)
    }
}

struct Verify: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Check that indexes, counts and history agree with the records; exit 1 on any mismatch.",
        discussion: """
        Progress goes to stderr ("verified N records", "verified N index entries", …) every --progress-every \
        items of each phase, and the end of a phase that took that many ("verified N records: done"). \
        The report goes to stdout.
        """)
    @Argument(help: "The store directory.") var directory: String
    @Option(help: "Report progress every N records or entries.") var progressEvery = 100_000

    func validate() throws {
        if progressEvery < 1 { throw ValidationError("--progress-every must be at least 1, not \(progressEvery)") }
    }

    func run() throws {
        try runCommand {
            let store = try openExisting(directory, readOnly: true)
            // A small store stays quiet, as before: only phases long enough to report
            // progress report their end.
            var report = try store.verify(progressEvery: progressEvery) { progress in
                if !progress.isFinished || progress.checked >= progressEvery { printError("\(progress)") }
            }
            // Every blob the records reference: present ones must match their hash; absent
            // ones are pending (sync brings them), which is no damage.
            let blobs = try store.verifyBlobs()
            report.add(contentsOf: blobs.problems)
            printLine(report.description)
            if !blobs.pending.isEmpty {
                printLine("\(blobs.pending.count) blob(s) pending (referenced, not arrived by sync yet): \(blobs.pending.prefix(10).map(\.sha256).joined(separator: ", "))\(blobs.pending.count > 10 ? ", …" : "")")
            }
            if !report.isClean { Foundation.exit(1) }
        }
    }
}

struct History: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Print committed transactions as JSON lines.",
        discussion: "With --follow, keeps printing new commits (from any process) until interrupted.")
    @Argument(help: "The store directory.") var directory: String
    @Option(help: "Only entries after this sequence number (default: the oldest kept).") var after: UInt64?
    @Option(name: .customLong("type"), help: "Only changes of this type (repeatable).") var types: [String] = []
    @Option(help: "At most this many entries.") var limit: Int?
    @Flag(help: "Keep printing new commits until interrupted.") var follow = false

    func validate() throws {
        if let limit, limit < 0 { throw ValidationError("--limit must be 0 or more, not \(limit)") }
    }

    func run() async throws {
        do {
            let store = try openExisting(directory, readOnly: true)
            for type in types { _ = try requireType(store, type) }   // a typo would print nothing, forever with --follow
            let start = try after.map { HistoryToken(sequence: $0) } ?? store.oldestAvailableToken()
            let filter = types.isEmpty ? nil : Set(types)
            var printed = 0
            var token = start
            for entry in try store.history(after: start, types: filter, limit: limit) {
                printLine(historyJSON(entry).text)
                printed += 1
                token = entry.token
            }
            if !follow || limit.map({ printed >= $0 }) ?? false { return }
            // On from the last entry printed: the observation reads what came after it, in
            // its own snapshots (a newer token taken here would skip commits made meanwhile).
            for try await entry in store.changes(of: filter, after: token) {
                if let limit, printed >= limit { return }
                printLine(historyJSON(entry).text)
                printed += 1
            }
        } catch {
            fail(error)
        }
    }
}

func historyJSON(_ entry: HistoryEntry) -> JSONValue {
    .object([
        "sequence": Int64(exactly: entry.sequence).map { .int($0) } ?? .string(String(entry.sequence)),
        "timestamp": .string(FieldValue.date(entry.timestamp).json.textValue),
        "origin": .string(entry.origin.description),
        "author": entry.author.map { .string($0) } ?? .null,
        "changes": .array(entry.changes.map { change in
            .object(["type": .string(change.type), "id": .string(change.id.description),
                     "op": .string("\(change.operation)"), "fields": .array(change.fields.map { .string($0) })])
        }),
    ])
}

extension JSONValue {
    var textValue: String {
        if case .string(let s) = self { return s }
        return text
    }
}

struct CollectBlobs: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "collect-blobs",
        abstract: "Remove the blob files no record references (external values: DIR/blobs/).",
        discussion: """
        Only files older than --grace seconds go (default 3600): a blob of a write still \
        under way (in any process) is younger, and one of a write that was aborted or killed \
        goes at a later run. A blob that any record references, or a value the store keeps \
        for other app versions, is never removed.
        """)
    @Argument(help: "The store directory.") var directory: String
    @Option(help: "Keep blob files younger than this many seconds.") var grace: Double = 3600

    func validate() throws {
        if !(grace >= 0) { throw ValidationError("--grace must be 0 or more seconds, not \(grace)") }
    }

    func run() throws {
        try runCommand {
            let store = try openExisting(directory, readOnly: false)
            printLine(try store.collectGarbageBlobs(olderThan: grace).description)
        }
    }
}
