import Foundation
import Synchronization
import StashLMDB

/// What to fetch: a Foundation `#Predicate`, sort descriptors and a limit, like SwiftData's
/// `FetchDescriptor`.
///
/// ```swift
/// var descriptor = FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == homeID && $0.wearCount > 3 },
///                                        sortBy: [SortDescriptor(\.name)])
/// descriptor.fetchLimit = 20
/// let items = try store.fetch(descriptor)
/// print(try store.explain(descriptor))   // Item: index homeID equality (homeID == …) → filter each candidate by the predicate
/// ```
/// Equality and range conjuncts on indexed fields use an index (the one answering the most of
/// them: `sensor+value` for `sensor == s && value > v`, even beside an index on `sensor`);
/// everything else is evaluated on each candidate. The result is the same whatever plan is
/// chosen.
public struct FetchDescriptor<R: Record>: @unchecked Sendable {
    /// The records to fetch; nil for every record of the type. It is evaluated on each
    /// decoded candidate, whatever part of it an index answers; a predicate that throws makes
    /// the fetch throw `.invalidValue`.
    public var predicate: Predicate<R>? {
        didSet { expression = predicate?.expression }
    }
    /// The order of the result, compared on the decoded records in memory (no index gives
    /// an order): every match is read and sorted, O(m log m) for m matches. Records that sort
    /// equal come in id order. Empty (the default): the plan's order, index or id order.
    public var sortBy: [SortDescriptor<R>]
    /// At most this many records, counted after ``fetchOffset``; nil (the default) for all.
    /// Without ``sortBy`` the fetch stops reading once it has them. Negative: the fetch
    /// throws `.invalidValue`. ``Store/fetchCount(_:)`` ignores it.
    public var fetchLimit: Int?
    /// How many of the matching records to skip, applied after sorting (without ``sortBy``,
    /// in the plan's order), before ``fetchLimit``; nil (the default) for none. Negative: the
    /// fetch throws `.invalidValue`. ``Store/fetchCount(_:)`` ignores it.
    public var fetchOffset: Int?
    /// The predicate's expression, kept apart: copying a `Predicate` out of the descriptor
    /// costs runtime lookups for its variadic generic type (hundreds of instructions), and a
    /// count by key reads only the expression.
    @usableFromInline var expression: (any StandardPredicateExpression<Bool>)?

    /// A descriptor of the records matching `predicate` (nil: all), in `sortBy` order, with
    /// no limit or offset.
    @inlinable
    public init(predicate: Predicate<R>? = nil, sortBy: [SortDescriptor<R>] = []) {
        // Moved, not copied: the predicate is taken apart once and stored.
        if let predicate = consume predicate {
            expression = predicate.expression
            self.predicate = consume predicate
        } else {
            expression = nil
            self.predicate = nil
        }
        self.sortBy = sortBy
    }
}

/// One field condition the planner can use: `field op value`.
public struct QueryCondition: Sendable, Equatable, CustomStringConvertible {
    public enum Operator: String, Sendable {
        case equal = "==", less = "<", lessOrEqual = "<=", greater = ">", greaterOrEqual = ">="
        var flipped: Operator {
            switch self {
            case .equal: return .equal
            case .less: return .greater
            case .lessOrEqual: return .greaterOrEqual
            case .greater: return .less
            case .greaterOrEqual: return .lessOrEqual
            }
        }
    }
    public let field: String
    public let op: Operator
    public let value: FieldValue
    /// False when the condition came from a predicate comparing values of a type of the
    /// app's own (a `Comparable` enum ranked by its own `<`): its order is not the order of
    /// the stored form, which is the index's order, so no index range may answer it.
    let ordersAsStored: Bool

    public init(field: String, op: Operator, value: FieldValue) {
        self.init(field: field, op: op, value: value, ordersAsStored: true)
    }

    init(field: String, op: Operator, value: FieldValue, ordersAsStored: Bool) {
        self.field = field
        self.op = op
        self.value = value
        self.ordersAsStored = ordersAsStored
    }

    public var description: String { "\(field) \(op.rawValue) \(value.json.text)" }

    /// Evaluates the condition on a value (nil and null only equal null).
    func matches(_ candidate: FieldValue) -> Bool {
        if op == .equal { return candidate == value || numericEqual(candidate, value) }
        guard let order = compare(candidate, value) else { return false }
        switch op {
        case .less: return order < 0
        case .lessOrEqual: return order <= 0
        case .greater: return order > 0
        case .greaterOrEqual: return order >= 0
        case .equal: return order == 0
        }
    }
}

private func numericEqual(_ a: FieldValue, _ b: FieldValue) -> Bool { compare(a, b) == 0 }

/// Orders two values of compatible kinds; nil when they cannot be compared.
func compare(_ a: FieldValue, _ b: FieldValue) -> Int? {
    func sign<T: Comparable>(_ x: T, _ y: T) -> Int { x < y ? -1 : (x > y ? 1 : 0) }
    // NaN is unordered: neither less, greater nor equal (`sign` alone would call it equal).
    func sign(_ x: Double, _ y: Double) -> Int? { x.isNaN || y.isNaN ? nil : (x < y ? -1 : (x > y ? 1 : 0)) }
    switch (a, b) {
    case (.int(let x), .int(let y)): return sign(x, y)
    case (.int(let x), .double(let y)): return exactOrder(x, y)
    case (.double(let x), .int(let y)): return exactOrder(y, x).map { -$0 }
    case (.double(let x), .double(let y)): return sign(x, y)
    case (.string(let x), .string(let y)): return sign(x, y)
    case (.date(let x), .date(let y)): return sign(x.timeIntervalSinceReferenceDate, y.timeIntervalSinceReferenceDate)
    case (.bool(let x), .bool(let y)): return sign(x ? 1 : 0, y ? 1 : 0)
    case (.uuid(let x), .uuid(let y)): return sign(x.uuidString.lowercased(), y.uuidString.lowercased())
    default: return nil
    }
}

/// Orders an integer and a double exactly (converting either to the other's type rounds
/// past 2^53: 2^53 + 1 would equal 2^53); nil when `y` is NaN.
private func exactOrder(_ x: Int64, _ y: Double) -> Int? {
    if y.isNaN { return nil }
    // 2^63 is exact as a Double; every finite double below it and at or above -2^63 has an
    // integral part that fits in Int64.
    if y >= 9_223_372_036_854_775_808.0 { return -1 }
    if y < -9_223_372_036_854_775_808.0 { return 1 }
    let whole = y.rounded(.down)
    let integral = Int64(whole)
    if x != integral { return x < integral ? -1 : 1 }
    return y > whole ? -1 : 0
}

/// How a query reads the store, as chosen by the planner; ``Store/explain(_:)`` returns it.
public struct QueryPlan: Sendable, CustomStringConvertible {
    public enum Access: Sendable, Equatable {
        /// One record by id.
        case recordID(RecordID)
        /// All ids under one key of an index (equality on its leading fields).
        case indexEquality(index: String, fields: [String])
        /// A key range of an index: equality on leading fields, then a range on the next.
        case indexRange(index: String, equalityFields: [String], rangeField: String)
        /// Every record of the type.
        case scan
    }
    public let type: String
    public let access: Access
    /// Conditions answered by the access path.
    public let indexedConditions: [QueryCondition]
    /// True when some part of the predicate is evaluated on each candidate record.
    public let hasFilter: Bool

    public var usesIndex: Bool {
        switch access {
        case .indexEquality, .indexRange, .recordID: return true
        case .scan: return false
        }
    }

    /// True when the count is one `mdb_cursor_count`: index equality, nothing left to filter.
    public var isExactIndexCount: Bool {
        if case .indexEquality = access, !hasFilter, !lossy { return true }
        return false
    }

    // Execution details.
    let index: IndexSchema?
    let equalityValues: [FieldValue]
    let lower: QueryCondition?
    let upper: QueryCondition?
    let lossy: Bool

    public var description: String {
        let access: String
        switch self.access {
        case .recordID(let id): access = "get by id \(id)"
        case .indexEquality(let index, _): access = "index \(index) equality (\(indexedConditions.map(\.description).joined(separator: " && ")))"
        case .indexRange(let index, _, _): access = "index \(index) range (\(indexedConditions.map(\.description).joined(separator: " && ")))"
        case .scan: access = "full scan"
        }
        return "\(type): \(access)\(hasFilter || lossy ? " → filter each candidate by the predicate" : "")"
    }
}

/// Chooses an access path for a set of conditions on one type.
enum QueryPlanner {
    /// The access path for `conditions` (all of which must hold) on `type`: a get by id for
    /// an `id ==`, else the index that answers the most conditions (equality on its leading
    /// fields, then a range on the next field, bounded on one side or both, counting as one),
    /// else a scan. Among indexes answering as many, the one that should leave fewer
    /// candidates: more equality fields, then a whole key, then a range, then fewer fields,
    /// then the first declared. So `sensor == s && value > v` takes `sensor+value` over
    /// `sensor`, and `sensor == s` alone takes `sensor`, whose whole key is an exact count.
    static func plan(type: TypeSchema, conditions: [QueryCondition], hasResidual: Bool) -> QueryPlan {
        if let byID = conditions.first(where: { $0.field == "id" && $0.op == .equal }),
           case .uuid(let uuid) = byID.value {
            return QueryPlan(type: type.name, access: .recordID(RecordID(uuid)), indexedConditions: [byID],
                             hasFilter: hasResidual || conditions.count > 1, index: nil, equalityValues: [], lower: nil, upper: nil, lossy: false)
        }
        // Compared in order, higher first: conditions answered, equality fields, a whole key,
        // a range, fewer fields.
        var best: (rank: (Int, Int, Int, Int, Int), plan: QueryPlan)?
        // Conditions an index can answer; the others stay in the filter (`unused` below).
        let usable = conditions.filter { indexable($0, type) }
        for index in type.indexes {
            var used: [QueryCondition] = []
            var values: [FieldValue] = []
            for field in index.fields {
                guard let eq = usable.first(where: { $0.field == field && $0.op == .equal }) else { break }
                used.append(eq)
                values.append(eq.value)
            }
            var lower: QueryCondition?, upper: QueryCondition?
            if values.count < index.fields.count {
                let next = index.fields[values.count]
                lower = usable.first { $0.field == next && ($0.op == .greater || $0.op == .greaterOrEqual) }
                upper = usable.first { $0.field == next && ($0.op == .less || $0.op == .lessOrEqual) }
                if let lower { used.append(lower) }
                if let upper { used.append(upper) }
            }
            let isRange = lower != nil || upper != nil
            guard !values.isEmpty || isRange else { continue }
            let full = values.count == index.fields.count
            // Most conditions answered first: a composite answering `a ==` and a range on `b`
            // reads a part of what an index on `a` alone answering `a ==` would read.
            let rank = (values.count + (isRange ? 1 : 0), values.count, full ? 1 : 0, isRange ? 1 : 0, -index.fields.count)
            let unused = conditions.contains { c in !used.contains(c) }
            // The key as the index holds it, prefix included: values that fit only without the
            // prefix are cut short in the real key, which then counts other records too.
            var probe = StoreKeys.indexPrefix(type.tag, index.tag)
            for v in values { v.appendIndexComponent(to: &probe) }
            // A partial key without a range is a prefix scan: a range with no bounds.
            let access: QueryPlan.Access = full
                ? .indexEquality(index: index.name, fields: index.fields)
                : .indexRange(index: index.name, equalityFields: Array(index.fields.prefix(values.count)), rangeField: index.fields[values.count])
            let plan = QueryPlan(type: type.name, access: access, indexedConditions: used,
                                 hasFilter: hasResidual || unused || isRange, index: index, equalityValues: values,
                                 lower: lower, upper: upper, lossy: probe.isLossy)
            if best == nil || rank > best!.rank { best = (rank, plan) }   // a tie keeps the first declared
        }
        return best?.plan ?? QueryPlan(type: type.name, access: .scan, indexedConditions: [], hasFilter: hasResidual || !conditions.isEmpty,
                                       index: nil, equalityValues: [], lower: nil, upper: nil, lossy: false)
    }

    /// True when an index key built from `condition.value` finds exactly the matching records:
    /// the value must have the field's stored kind (`.double(3)` against an int field encodes
    /// differently from `.int(3)` and would find nothing), a null only answers `==`, NaN,
    /// whose key equals itself, equals nothing, and a range needs values ordered as stored.
    static func indexable(_ condition: QueryCondition, _ type: TypeSchema) -> Bool {
        indexable(condition, fieldKind: type.field(named: condition.field)?.kind)
    }

    /// ``indexable(_:_:)`` for a field whose stored kind is `fieldKind` (nil: not known yet).
    static func indexable(_ condition: QueryCondition, fieldKind: FieldKind?) -> Bool {
        if condition.op != .equal && !condition.ordersAsStored { return false }
        switch condition.value {
        case .null: return condition.op == .equal
        case .double(let d) where d.isNaN: return false
        case .date(let d) where d.timeIntervalSinceReferenceDate.isNaN: return false
        // Arrays and maps are indexed by their bytes, not canonically: [-0.0] and [0.0], or
        // two spellings of one text, are `==` under different keys.
        case .array, .map: return false
        default: break
        }
        guard let fieldKind else { return true }
        return condition.value.kind == fieldKind
    }
}

// MARK: Reading predicates

// The planner reads Foundation's predicate expression tree through these small views of
// the expression types; anything it does not recognize stays in the filter.
protocol PlannerConjunction { var plannerOperands: (Any, Any) { get } }
protocol PlannerEqual { var plannerOperands: (Any, Any) { get } }
/// ``PlannerEqual`` reached through the metatype (see ``PredicateAnalyzer/soleEquality(of:)``).
protocol PlannerEqualType { static func plannerOperands<V>(of value: V) -> (Any, Any) }
/// `$0.field == constant` recognized from the expression's type alone (one conformance
/// lookup, cached by the runtime per type), its key path and constant then read as typed
/// values: no operand is boxed, cast or encoded through `Encodable`.
protocol PlannerFieldEquality {
    /// ``Catalog/exactIndexCount(_:_:equals:_:)`` for this expression.
    func exactIndexCount<R: Record>(_ type: R.Type, in catalog: Catalog, _ count: (KeyBytes) throws -> Int?) rethrows -> Int?
}
/// `$0.field`: a key path expression on the predicate's variable.
protocol PlannerRecordField { var plannerField: AnyKeyPath { get } }
/// A captured value.
protocol PlannerConstant {
    associatedtype Constant
    var plannerConstant: Constant { get }
}
/// `plannerOperator` is nil for an operator this library does not know (a later Foundation's):
/// the comparison then stays in the filter.
protocol PlannerComparison { var plannerOperands: (Any, Any) { get }; var plannerOperator: QueryCondition.Operator? { get } }
protocol PlannerKeyPath { var plannerRoot: Any { get }; var plannerKeyPath: AnyKeyPath { get } }
protocol PlannerVariable {}

extension PredicateExpressions.Conjunction: PlannerConjunction { var plannerOperands: (Any, Any) { (lhs, rhs) } }
extension PredicateExpressions.Equal: PlannerEqual { var plannerOperands: (Any, Any) { (lhs, rhs) } }
extension PredicateExpressions.Equal: PlannerEqualType {
    static func plannerOperands<V>(of value: V) -> (Any, Any) {
        let equal = value as! Self   // V is Self: the caller found Self through V's metatype
        return (equal.lhs, equal.rhs)
    }
}
extension PredicateExpressions.Equal: PlannerFieldEquality
where LHS: PlannerRecordField, RHS: PlannerConstant, RHS.Constant == LHS.Output, LHS.Output: IndexableValue {
    func exactIndexCount<R: Record>(_ type: R.Type, in catalog: Catalog, _ count: (KeyBytes) throws -> Int?) rethrows -> Int? {
        let value = rhs.plannerConstant
        // NaN equals nothing, yet an index lookup would find stored NaNs: leave it to the planner.
        guard value == value else { return nil }
        return try catalog.exactIndexCount(lhs.plannerField, R.self, equals: value, count)
    }
}
// Read as `AnyKeyPath` and the constant through its witness, so that the generic code above
// needs no metadata of its own (each generic type it named would be a runtime lookup).
extension PredicateExpressions.KeyPath: PlannerRecordField where Root: PlannerVariable {
    var plannerField: AnyKeyPath { keyPath }
}
extension PredicateExpressions.Value: PlannerConstant {
    var plannerConstant: Output { value }
}
extension PredicateExpressions.Comparison: PlannerComparison {
    var plannerOperands: (Any, Any) { (lhs, rhs) }
    var plannerOperator: QueryCondition.Operator? {
        switch op {
        case .lessThan: return .less
        case .lessThanOrEqual: return .lessOrEqual
        case .greaterThan: return .greater
        case .greaterThanOrEqual: return .greaterOrEqual
        @unknown default: return nil
        }
    }
}
extension PredicateExpressions.KeyPath: PlannerKeyPath {
    var plannerRoot: Any { root }
    var plannerKeyPath: AnyKeyPath { keyPath }
}
extension PredicateExpressions.Variable: PlannerVariable {}
protocol PlannerValue { var plannerValue: Any { get } }
extension PredicateExpressions.Value: PlannerValue { var plannerValue: Any { value } }

enum PredicateAnalyzer {
    /// The conjuncts of `predicate` that are `field op constant`, and whether anything else remains.
    static func conditions<R>(of predicate: Predicate<R>) -> (conditions: [QueryCondition], residual: Bool) {
        var conditions: [QueryCondition] = []
        var residual = false
        func walk(_ expression: Any) {
            if let and = expression as? PlannerConjunction {
                walk(and.plannerOperands.0)
                walk(and.plannerOperands.1)
            } else if let eq = expression as? PlannerEqual, let c = condition(eq.plannerOperands, .equal) {
                conditions.append(c)
            } else if let cmp = expression as? PlannerComparison, let op = cmp.plannerOperator, let c = condition(cmp.plannerOperands, op) {
                conditions.append(c)
            } else {
                residual = true
            }
        }
        walk(predicate.expression)
        return (conditions, residual)
    }

    /// `count(key)` of the index key whose duplicate count answers `descriptor`'s predicate
    /// (whose expression is `expression`) exactly when the whole predicate is one
    /// `field == constant` on a single-field index (the commonest count); nil otherwise.
    /// `$0.field == captured` is read through its type without allocating; other spellings
    /// (constant first, an expression to evaluate) through ``soleEquality(of:)``.
    static func exactIndexCount<R: Record>(of expression: any StandardPredicateExpression<Bool>, _ descriptor: FetchDescriptor<R>,
                                           in catalog: Catalog, _ count: (KeyBytes) throws -> Int?) throws -> Int? {
        func read<E: PredicateExpression>(_ expression: E) throws -> Int?? {
            guard let equality = fieldEquality(E.self) else { return nil }
            // The value is cast to the type just found (a copy: E is that type), never to an
            // existential, which would box its four words on the heap.
            func typed<T: PlannerFieldEquality>(_ type: T.Type) throws -> Int? {
                try (expression as! T).exactIndexCount(R.self, in: catalog, count)
            }
            return .some(try typed(equality))
        }
        if let typed = try read(expression) { return typed }
        guard let predicate = descriptor.predicate, let (condition, keyPath) = soleEquality(of: predicate),
              let key = catalog.exactIndexKey(keyPath, R.self, condition) else { return nil }
        return try count(key)
    }

    /// `type`'s conformance to ``PlannerFieldEquality``, looked up once per expression type.
    /// The runtime caches conformances too, but its lookup (a conditional conformance, in a
    /// table keyed by type and protocol) costs several hundred instructions, a tenth of a
    /// count, where a predicate built in every call of one shape always has the same type.
    private static func fieldEquality<E>(_ type: E.Type) -> (any PlannerFieldEquality.Type)? {
        let key = ObjectIdentifier(type)
        if let known = fieldEqualities.withLock({ $0.find(key) }) { return known.conformance }
        let conformance = type as? any PlannerFieldEquality.Type
        fieldEqualities.withLock { $0.add(key, FieldEqualityConformance(conformance: conformance)) }
        return conformance
    }

    /// A metatype is immutable and global: safe to share.
    private struct FieldEqualityConformance: @unchecked Sendable {
        let conformance: (any PlannerFieldEquality.Type)?
    }
    private static let fieldEqualities = Mutex(IdentityTable<FieldEqualityConformance>())

    /// The condition when the whole predicate is one `field == constant` (the commonest
    /// query), read without building the general analysis. nil for any other shape.
    ///
    /// Casts the expression's *type*, not its value: casting a value of more than three words
    /// (an `Equal` of a key path and a captured id is four) to an existential boxes it on the
    /// heap, and this path must not allocate.
    static func soleEquality<R>(of predicate: Predicate<R>) -> (condition: QueryCondition, keyPath: AnyKeyPath)? {
        func read<E: PredicateExpression>(_ expression: E) -> (condition: QueryCondition, keyPath: AnyKeyPath)? {
            guard let equal = E.self as? any PlannerEqualType.Type else { return nil }
            return located(equal.plannerOperands(of: expression), .equal)
        }
        return read(predicate.expression)
    }

    private static func condition(_ operands: (Any, Any), _ op: QueryCondition.Operator) -> QueryCondition? {
        located(operands, op)?.condition
    }

    /// ``condition(_:_:)`` with the key path of its field, each operand cast once.
    private static func located(_ operands: (Any, Any), _ op: QueryCondition.Operator) -> (condition: QueryCondition, keyPath: AnyKeyPath)? {
        if let (field, keyPath) = fieldKeyPath(operands.0), let (value, ordered) = constant(operands.1, ordering: op != .equal) {
            return (QueryCondition(field: field, op: op, value: value, ordersAsStored: ordered), keyPath)
        }
        if let (field, keyPath) = fieldKeyPath(operands.1), let (value, ordered) = constant(operands.0, ordering: op != .equal) {
            return (QueryCondition(field: field, op: op.flipped, value: value, ordersAsStored: ordered), keyPath)
        }
        return nil
    }

    /// True when Swift's `<` on `value` is the order of its stored form (the order of index
    /// keys): Stash's own ``IndexableValue`` types and optionals of them. An enum stored as
    /// its raw string but ranked by its own `<` is not.
    private static func ordersAsStored(_ value: Any) -> Bool {
        guard let indexable = value as? any IndexableValue else { return false }
        return type(of: indexable).indexComponentMatchesStoredForm
    }

    /// `$0.field` with one path component: its name and key path.
    private static func fieldKeyPath(_ operand: Any) -> (String, AnyKeyPath)? {
        guard let kp = operand as? PlannerKeyPath, kp.plannerRoot is PlannerVariable else { return nil }
        let keyPath = kp.plannerKeyPath
        let name = Stash.fieldName(of: keyPath)
        return name.utf8.contains(UInt8(ascii: ".")) ? nil : (name, keyPath)
    }

    /// An operand that does not involve the record, evaluated now, and (when `ordering`)
    /// whether its type orders as stored (``ordersAsStored(_:)``; true when not asked).
    private static func constant(_ operand: Any, ordering: Bool) -> (FieldValue, ordersAsStored: Bool)? {
        let value: Any
        if let constant = operand as? PlannerValue {
            value = constant.plannerValue                    // a captured value: no evaluation needed
        } else {
            guard let expression = operand as? any PredicateExpression, !mentionsVariable(operand) else { return nil }
            guard let evaluated = try? evaluate(expression) else { return nil }
            value = evaluated
        }
        let ordered = !ordering || ordersAsStored(value)
        let field: FieldValue
        if let special = specialFieldValue(value) {
            field = special
        } else {
            guard let encodable = value as? any Encodable, let encoded = try? FieldValue(encoding: encodable) else { return nil }
            field = encoded
        }
        // Arrays and maps are indexed by their bytes, not canonically (-0.0, Unicode
        // spellings): such a constant, a `FieldValue` one too, stays in the filter.
        switch field {
        case .map, .array: return nil
        default: return (field, ordered)
        }
    }

    private static func evaluate<E: PredicateExpression>(_ expression: E) throws -> Any {
        try expression.evaluate(PredicateBindings())
    }

    private static func mentionsVariable(_ operand: Any) -> Bool {
        if operand is PlannerVariable { return true }
        if operand is PlannerValue { return false }
        if let kp = operand as? PlannerKeyPath { return mentionsVariable(kp.plannerRoot) }
        // Only key paths on constants and plain values are treated as constants.
        let name = String(describing: type(of: operand))
        return name.contains("Variable<")
    }
}
