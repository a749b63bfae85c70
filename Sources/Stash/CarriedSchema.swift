import Foundation
import StashLMDB

/// What a store knows of the types and fields it keeps for other replicas without declaring
/// them (``RecordVersions/carried``): the tag under which each undeclared type's states are
/// kept, and per type the carried field names with how their source merges them.
///
/// An import never changes the stored schema, which is the app's declaration: what another
/// version of the app declares and this one does not (a field dropped here, a type added
/// there) is carried, with its versions, and sent on, as protobuf keeps unknown fields. A
/// later declaration of the field or type takes the values in (``SchemaMerger``). Kept in
/// `meta` apart from the schema, and bounded (``maximumTypes``, ``maximumFields``), so that a
/// faulty or hostile peer cannot grow it without end.
struct CarriedSchema: Codable, Equatable, Sendable {
    /// Each type the store received but did not declare, with the tag its states are kept
    /// under in `versions` (taken from the top of the tag range down, never one of the
    /// schema's). A type declared later keeps its entry: history written while it was
    /// carried names that tag.
    var types: [String: UInt16] = [:]
    /// Per type name: the names of its carried fields, each true when its source merges it as
    /// a counter (``Counter``).
    var fields: [String: [String: Bool]] = [:]

    /// Undeclared types a store carries at most.
    static let maximumTypes = 1024
    /// Carried field names per type at most.
    static let maximumFields = 1024

    var isEmpty: Bool { types.isEmpty && fields.isEmpty }

    /// The carried fields of `type` that its source merges as counters.
    func counters(of type: String) -> Set<String> {
        guard let known = fields[type] else { return [] }
        return Set(known.filter(\.value).keys)
    }

    static func load<T: TransactionReading>(_ txn: T, _ dbs: StoreDatabases, _ path: String) throws -> CarriedSchema {
        guard let bytes = try txn.get(dbs.meta, key: MetaKey.carriedSchema) else { return CarriedSchema() }
        do { return try JSONDecoder().decode(CarriedSchema.self, from: Data(bytes)) }
        catch { throw StoreError(.corrupted, "store \(path): what it keeps of types and fields it does not declare cannot be read (\(describe(error))); run `stash verify \(path)`") }
    }

    func save(_ txn: WriteTransaction, _ dbs: StoreDatabases) throws {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys]
        try txn.put(dbs.meta, key: MetaKey.carriedSchema, value: Array(try encoder.encode(self)))
    }
}
