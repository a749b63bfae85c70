/// Values keyed by the identity of a type or an object (`ObjectIdentifier`), for the caches
/// of hot paths: the first 16 in a short list searched without hashing (a program counts by
/// a few key paths and builds a few predicate shapes, and comparing a dozen pointers costs
/// less than hashing one), the rest in a dictionary. Not synchronized: keep it in a `Mutex`.
struct IdentityTable<Value> {
    private var keys: [ObjectIdentifier] = []
    private var values: [Value] = []
    private var more: [ObjectIdentifier: Value] = [:]

    /// The value kept for `key`. O(1): at most 16 comparisons, then one hash lookup.
    func find(_ key: ObjectIdentifier) -> Value? {
        if let position = keys.firstIndex(of: key) { return values[position] }
        return keys.count < 16 ? nil : more[key]
    }

    /// Keeps `value` for `key`, unless one is kept already (the first one stays).
    mutating func add(_ key: ObjectIdentifier, _ value: Value) {
        guard find(key) == nil else { return }
        if keys.count < 16 {
            keys.append(key)
            values.append(value)
        } else {
            more[key] = value
        }
    }
}

extension IdentityTable: Sendable where Value: Sendable {}
