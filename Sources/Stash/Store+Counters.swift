import Foundation

extension StoreTransaction {
    /// Adds `amount` (negative to subtract) to the ``Counter`` in field `field` of record `id`
    /// of `type`, on behalf of this store's site (``siteID``), as
    /// `counter.add(amount, site: tx.siteID)` does in a typed update: the change merges with
    /// every other site's across sync, counted once. For tools without the record's Swift
    /// type (`stash counter`). A record lacking the field starts from 0.
    /// - Returns: the counter's value after the change.
    /// - Throws: `.unknownType`; `.notFound` when there is no such record; `.unknownField`;
    ///   `.invalidValue` when the field is not a counter, or holds no counter's state.
    @discardableResult
    public func addToCounter(typeNamed type: String, id: RecordID, field: String, _ amount: Int64) throws -> Int64 {
        let layout = try context.layout(type)
        guard let schema = layout.schema.field(named: field) else {
            let known = layout.schema.fields.map(\.name).sorted().joined(separator: ", ")
            throw StoreError(.unknownField, "store \(reader.path): \(type) has no field '\(field)' (fields: \(known))")
        }
        guard schema.counter == true else {
            throw StoreError(.invalidValue, "store \(reader.path): \(type).\(field) is not a counter (declare it a Counter, or \"kind\": \"counter\" in a schema file); set its value with an update instead")
        }
        guard var record = try get(typeNamed: type, id: id) else {
            throw StoreError(.notFound, "store \(reader.path): no \(type) with id \(id) to change")
        }
        var counter = Counter()
        if let stored = record.fields[field], stored != .null {
            if let problem = Counter.problem(in: stored) {
                throw StoreError(.invalidValue, "store \(reader.path): \(type).\(field) of \(id) holds no counter's state (\(problem))")
            }
            counter = try TreeDecoder.decode(Counter.self, from: stored)
        }
        counter.add(amount, site: context.siteID)
        record.fields[field] = try FieldValue(encoding: counter)
        try put(record, replacing: true)
        return counter.value
    }
}
