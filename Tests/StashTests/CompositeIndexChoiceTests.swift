import Foundation
import Stash
import Testing
import StashTestSupport

/// The indexes a ``Sample`` declares: one record shape, several index sets, so that the same
/// predicates can be planned and answered by each and the answers compared.
protocol SampleIndexSet: Sendable {
    /// The record type name of `Sample<Self>` (a name of its own per set).
    static var name: String { get }
    static var indexes: [RecordIndex<Sample<Self>>] { get }
    /// True when a single-field index on `sensor` is declared besides `sensor+value`.
    static var hasSensorIndex: Bool { get }
}

/// The new user's declaration: `sensor`, then `sensor+value`.
enum SensorThenComposite: SampleIndexSet {
    static let name = "SampleSensorThenComposite"
    static var indexes: [RecordIndex<Sample<Self>>] { [.index(\.sensor), .index(\.sensor, \.value)] }
    static let hasSensorIndex = true
}

/// The same two indexes declared the other way round: the plan must not depend on the order.
enum CompositeThenSensor: SampleIndexSet {
    static let name = "SampleCompositeThenSensor"
    static var indexes: [RecordIndex<Sample<Self>>] { [.index(\.sensor, \.value), .index(\.sensor)] }
    static let hasSensorIndex = true
}

enum CompositeOnly: SampleIndexSet {
    static let name = "SampleCompositeOnly"
    static var indexes: [RecordIndex<Sample<Self>>] { [.index(\.sensor, \.value)] }
    static let hasSensorIndex = false
}

/// A reading of a sensor: `value` is indexed after `sensor` (by `Indexes`), `unit` is not.
struct Sample<Indexes: SampleIndexSet>: Record, Equatable {
    var id = RecordID()
    var sensor: String
    var value: Int
    var unit: String
    static var recordType: String { Indexes.name }
    static var indexes: [RecordIndex<Sample>] { Indexes.indexes }
}

/// A composite index `sensor+value` next to a single-field index on `sensor`: a predicate
/// with equality on `sensor` and a range (or equality) on `value` must use the composite,
/// which answers both conditions, as it does when it is the only index; a predicate it
/// answers no more of than the single-field index keeps the single-field equality. Whatever
/// the plan, results equal the predicate applied to every record.
@Suite struct CompositeIndexChoiceTests {
    typealias Shape = PlannerTests.Shape
    typealias Expect = PlannerTests.Expect

    static let units = ["C", "F", "K"]
    /// Stored values: a few years around 1990, and the ends of `Int` (the ends of the key order).
    static let values = [Int.min, -1, 0, 1985, 1986, 1989, 1990, 1991, 1994, 1995, Int.max]
    /// Range bounds: every stored value, and values just past them on either side.
    static let bounds = values + [Int.min + 1, 1984, 1987, 1996, Int.max - 1]

    static func pick<T>(_ values: [T], _ rng: inout SeededGenerator) -> T { values.randomElement(using: &rng)! }

    /// Predicates on `Sample<I>` and the plan each must get with `I`'s indexes.
    static func shapes<I: SampleIndexSet>(_: I.Type) -> [Shape<Sample<I>>] {
        typealias S = Sample<I>
        // Equality on `sensor` alone: the single-field index's whole key when there is one
        // (an exact count), else a prefix of the composite.
        let sensorOnly: Expect = I.hasSensorIndex ? .equality("sensor") : .range("sensor+value")
        let sensors = PlannerTests.sensors
        return [
            Shape(name: "sensor ==", expect: sensorOnly) { rng, _ in
                let s = pick(sensors, &rng)
                return #Predicate<S> { $0.sensor == s }
            },
            Shape(name: "sensor == && value >", expect: .range("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng)
                return #Predicate<S> { $0.sensor == s && $0.value > v }
            },
            Shape(name: "sensor == && value >=", expect: .range("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng)
                return #Predicate<S> { $0.sensor == s && $0.value >= v }
            },
            Shape(name: "sensor == && value <", expect: .range("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng)
                return #Predicate<S> { $0.sensor == s && $0.value < v }
            },
            Shape(name: "sensor == && value <=", expect: .range("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng)
                return #Predicate<S> { $0.sensor == s && $0.value <= v }
            },
            Shape(name: "sensor == && value between", expect: .range("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), lo = pick(bounds, &rng), hi = pick(bounds, &rng)
                return #Predicate<S> { $0.sensor == s && $0.value >= lo && $0.value <= hi }
            },
            Shape(name: "constant < value && constant == sensor (flipped)", expect: .range("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng)
                return #Predicate<S> { v < $0.value && s == $0.sensor }
            },
            Shape(name: "sensor == && value ==", expect: .equality("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng)
                return #Predicate<S> { $0.sensor == s && $0.value == v }
            },
            Shape(name: "sensor == && value == && value >", expect: .equality("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng), w = pick(bounds, &rng)
                return #Predicate<S> { $0.sensor == s && $0.value == v && $0.value > w }
            },
            Shape(name: "sensor == && value > && unit ==", expect: .range("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng), u = pick(units, &rng)
                return #Predicate<S> { $0.sensor == s && $0.value > v && $0.unit == u }
            },
            Shape(name: "unit == && value < && sensor ==", expect: .range("sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng), u = pick(units, &rng)
                return #Predicate<S> { $0.unit == u && $0.value < v && $0.sensor == s }
            },
            Shape(name: "sensor == && unit ==", expect: sensorOnly) { rng, _ in
                let s = pick(sensors, &rng), u = pick(units, &rng)
                return #Predicate<S> { $0.sensor == s && $0.unit == u }
            },
            Shape(name: "sensor == && (value > || unit ==)", expect: sensorOnly) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng), u = pick(units, &rng)
                return #Predicate<S> { $0.sensor == s && ($0.value > v || $0.unit == u) }
            },
            Shape(name: "sensor >= && value >", expect: .range(I.hasSensorIndex ? "sensor" : "sensor+value")) { rng, _ in
                let s = pick(sensors, &rng), v = pick(bounds, &rng)
                return #Predicate<S> { $0.sensor >= s && $0.value > v }
            },
            Shape(name: "value > (not leading)", expect: .scan) { rng, _ in
                let v = pick(bounds, &rng)
                return #Predicate<S> { $0.value > v }
            },
        ]
    }

    /// Seeded records of `Sample<I>` in a store of their own, churned so that index entries
    /// have moved; the records as they end up.
    static func seed<I: SampleIndexSet>(_: I.Type, _ store: Store, seed: UInt64) throws -> [Sample<I>] {
        var rng = SeededGenerator(seed: seed)
        var samples = (0..<400).map { _ in
            Sample<I>(sensor: pick(PlannerTests.sensors, &rng), value: pick(values, &rng), unit: pick(units, &rng))
        }
        try store.write { tx in for sample in samples { try tx.insert(sample) } }
        try store.write { tx in
            for i in stride(from: 0, to: samples.count, by: 9) {
                samples[i].value = pick(values, &rng)
                samples[i].sensor = pick(PlannerTests.sensors, &rng)
                try tx.update(samples[i])
            }
            for i in stride(from: samples.count - 1, to: 0, by: -13) {
                try tx.delete(Sample<I>.self, id: samples[i].id)
                samples.remove(at: i)
            }
        }
        return samples
    }

    static func compare<I: SampleIndexSet>(_: I.Type, seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Sample<I>.self])
        let samples = try Self.seed(I.self, store, seed: seed)
        #expect(try store.verify().isClean, "seed \(seed) \(I.name)")
        var rng = SeededGenerator(seed: seed &+ 1)
        let sorts: [[SortDescriptor<Sample<I>>]] = [
            [],
            [SortDescriptor(\.value), SortDescriptor(\.id)],
            [SortDescriptor(\.value, order: .reverse), SortDescriptor(\.id)],
            [SortDescriptor(\.unit), SortDescriptor(\.value, order: .reverse), SortDescriptor(\.id, order: .reverse)],
        ]
        try PlannerTests.compare(store, samples, shapes(I.self), sorts: sorts, seed: seed, rounds: 12, rng: &rng)
        // The count by key path, through the single-field index or a prefix of the composite.
        for sensor in PlannerTests.sensors + ["none"] {
            #expect(try store.count(Sample<I>.self, where: \.sensor, equals: sensor) == samples.filter { $0.sensor == sensor }.count,
                    "seed \(seed) \(I.name): count where sensor == \(sensor)")
        }
    }

    @Test(arguments: [UInt64(3), 1990, 424242])
    func resultsEqualTheOracleWithEveryIndexSet(seed: UInt64) throws {
        try Self.compare(SensorThenComposite.self, seed: seed)
        try Self.compare(CompositeThenSensor.self, seed: seed)
        try Self.compare(CompositeOnly.self, seed: seed)
    }

    /// The plans as `explain` prints them: the new user's query, equality on both fields,
    /// extra conditions on a field no index holds, and a sort on the composite's second field.
    static func checkExplain<I: SampleIndexSet>(_: I.Type, _ store: Store) throws {
        typealias S = Sample<I>
        let s = "t1", year = 1990, later = 1995, unit = "K"
        func explain(_ predicate: Predicate<S>, sortBy: [SortDescriptor<S>] = []) throws -> QueryPlan {
            try store.explain(FetchDescriptor(predicate: predicate, sortBy: sortBy))
        }
        let filtered = " → filter each candidate by the predicate"

        let range = try explain(#Predicate { $0.sensor == s && $0.value > year })
        #expect(range.description == "\(I.name): index sensor+value range (sensor == \"t1\" && value > 1990)\(filtered)")
        #expect(range.access == .indexRange(index: "sensor+value", equalityFields: ["sensor"], rangeField: "value"))

        let between = try explain(#Predicate { $0.sensor == s && $0.value >= year && $0.value < later && $0.unit == unit })
        #expect(between.description == "\(I.name): index sensor+value range (sensor == \"t1\" && value >= 1990 && value < 1995)\(filtered)")

        let both = try explain(#Predicate { $0.sensor == s && $0.value == year })
        #expect(both.description == "\(I.name): index sensor+value equality (sensor == \"t1\" && value == 1990)")
        #expect(both.isExactIndexCount)

        let extra = try explain(#Predicate { $0.sensor == s && $0.value == year && $0.unit == unit })
        #expect(extra.description == "\(I.name): index sensor+value equality (sensor == \"t1\" && value == 1990)\(filtered)")

        // Nothing on `value`: the composite answers no more than the single-field index,
        // whose whole key is the exact count, so that one stays chosen; a sort is done in
        // memory whatever the plan (no index gives an order), so it changes nothing.
        // (A prefix of the composite's key holds only matches too: nothing to filter.)
        let sensorOnly = "\(I.name): index \(I.hasSensorIndex ? "sensor equality" : "sensor+value range") (sensor == \"t1\")"
        #expect(try explain(#Predicate { $0.sensor == s }).description == sensorOnly)
        #expect(try explain(#Predicate { $0.sensor == s }, sortBy: [SortDescriptor(\.value)]).description == sensorOnly)
        #expect(try explain(#Predicate { $0.sensor == s }).isExactIndexCount == I.hasSensorIndex)
        let sensorAndUnit = try explain(#Predicate { $0.sensor == s && $0.unit == unit })
        #expect(sensorAndUnit.description == sensorOnly + filtered)

        // The schema-driven conditions are planned alike.
        let conditions = [QueryCondition(field: "sensor", op: .equal, value: .string(s)),
                          QueryCondition(field: "value", op: .greater, value: .int(Int64(year)))]
        #expect(try store.read { try $0.explain(typeNamed: I.name, where: conditions) }.description == range.description)
    }

    @Test func explainPicksTheIndexAnsweringMostConditions() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Sample<SensorThenComposite>.self, Sample<CompositeThenSensor>.self,
                                                           Sample<CompositeOnly>.self])
        try Self.checkExplain(SensorThenComposite.self, store)
        try Self.checkExplain(CompositeThenSensor.self, store)
        try Self.checkExplain(CompositeOnly.self, store)
    }
}
