import Foundation
import StashLMDB

// Counting primitives for code that checks quotas on the hot path (StashGate builds its
// limits on them). They are generic: nothing here knows about entitlements or tiers.

/// A resolved record type: counting through it skips the type-name lookup, so a count
/// inside a transaction is one B-tree lookup and allocates nothing.
public struct TypeHandle<R: Record>: Sendable {
    let typeTag: UInt16
    /// The stored type name.
    public let name: String
}

extension Store {
    /// A handle on `type` for allocation-free O(1) counts with ``StoreReading/count(_:)-(TypeHandle<R>)``.
    /// - Throws: `.unknownType` when the store was not opened with `type`.
    public func typeHandle<R: Record>(_ type: R.Type) throws -> TypeHandle<R> {
        let layout = try catalog.layout(R.recordType, store: path)
        return TypeHandle(typeTag: layout.schema.tag, name: layout.schema.name)
    }
}

extension StoreReading {
    /// The number of records of the handle's type, including this transaction's own pending
    /// inserts and deletes. O(1): one lookup in `counts`, no allocation.
    public func count<R: Record>(_ type: TypeHandle<R>) throws -> Int {
        try reader.storedCount(type.typeTag)
    }

    /// The number of records of the index's type. O(1), no allocation.
    public func count<R: Record, V: IndexableValue>(all index: IndexHandle<R, V>) throws -> Int {
        try reader.storedCount(index.typeTag)
    }

    /// The largest number of records that share one value of `index`'s field (0 when the
    /// type is empty): "does any home hold more than 10 items?".
    ///
    /// O(distinct values): one cursor jumps from value to value and reads each group's size
    /// with `mdb_cursor_count`. Check ``count(all:)`` first, since no group can be larger
    /// than the whole type. Strings longer than the indexed prefix group by that prefix
    /// (an upper bound).
    public func largestGroupCount<R: Record, V: IndexableValue>(_ index: IndexHandle<R, V>) throws -> Int {
        var largest = 0
        try reader.txn.forEachKeyWithCount(index.database, prefix: StoreKeys.indexPrefix(index.typeTag, index.indexTag)) { _, count in
            largest = max(largest, count)
            return true
        }
        return largest
    }
}
