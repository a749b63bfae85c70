import Foundation
import Stash
import StashLMDB
import Testing
import StashTestSupport

/// The planner must never change a result: `fetch` through whatever plan it picks equals the
/// oracle filtered by the SAME predicate and sorted the same way.
@Suite struct PlannerTests {
    /// How a predicate shape is expected to be answered.
    enum Expect: CustomStringConvertible {
        case scan
        case index(String)          // an index (equality or range) of that name
        case equality(String)       // an index equality on the whole key
        case range(String)          // an index range (or prefix)
        case byID
        var description: String {
            switch self {
            case .scan: return "scan"
            case .index(let n): return "index \(n)"
            case .equality(let n): return "equality on \(n)"
            case .range(let n): return "range on \(n)"
            case .byID: return "by id"
            }
        }
    }

    struct Shape<R: Record> {
        let name: String
        let expect: Expect
        let make: (inout SeededGenerator, [R]) -> Predicate<R>
    }

    static func checkPlan(_ plan: QueryPlan, _ expect: Expect, _ context: String) {
        switch expect {
        case .scan:
            #expect(plan.access == .scan, "\(context): \(plan)")
            #expect(!plan.usesIndex, "\(context)")
        case .byID:
            if case .recordID = plan.access {} else { Issue.record("\(context): expected a get by id, got \(plan)") }
            #expect(plan.usesIndex, "\(context)")
        case .index(let name):
            #expect(plan.usesIndex, "\(context): \(plan)")
            switch plan.access {
            case .indexEquality(let index, _), .indexRange(let index, _, _): #expect(index == name, "\(context): \(plan)")
            default: Issue.record("\(context): expected index \(name), got \(plan)")
            }
        case .equality(let name):
            if case .indexEquality(let index, _) = plan.access { #expect(index == name, "\(context): \(plan)") }
            else { Issue.record("\(context): expected equality on \(name), got \(plan)") }
        case .range(let name):
            if case .indexRange(let index, _, _) = plan.access { #expect(index == name, "\(context): \(plan)") }
            else { Issue.record("\(context): expected a range on \(name), got \(plan)") }
        }
        if plan.usesIndex { #expect(!plan.indexedConditions.isEmpty, "\(context): \(plan)") }
    }

    static func pick<T>(_ values: [T], _ rng: inout SeededGenerator) -> T { values.randomElement(using: &rng)! }

    static var itemShapes: [Shape<Item>] { [
        Shape(name: "homeID ==", expect: .equality("homeID")) { rng, items in
            let h = pick(items, &rng).homeID
            return #Predicate<Item> { $0.homeID == h }
        },
        Shape(name: "homeID == missing", expect: .equality("homeID")) { _, _ in
            let h = RecordID()
            return #Predicate<Item> { $0.homeID == h }
        },
        Shape(name: "homeID && category", expect: .equality("homeID+category")) { rng, items in
            let h = pick(items, &rng).homeID, c = pick(["a", "b", "c", "d"], &rng)
            return #Predicate<Item> { $0.homeID == h && $0.category == c }
        },
        Shape(name: "category && homeID (reversed)", expect: .equality("homeID+category")) { rng, items in
            let h = pick(items, &rng).homeID, c = pick(["a", "b", "c"], &rng)
            return #Predicate<Item> { $0.category == c && h == $0.homeID }
        },
        Shape(name: "wearCount ==", expect: .equality("wearCount")) { rng, _ in
            let w = Int.random(in: -1..<9, using: &rng)
            return #Predicate<Item> { $0.wearCount == w }
        },
        Shape(name: "wearCount >", expect: .range("wearCount")) { rng, _ in
            let w = Int.random(in: -1..<9, using: &rng)
            return #Predicate<Item> { $0.wearCount > w }
        },
        Shape(name: "wearCount >= && <", expect: .range("wearCount")) { rng, _ in
            let lo = Int.random(in: -1..<9, using: &rng), hi = Int.random(in: -1..<9, using: &rng)
            return #Predicate<Item> { $0.wearCount >= lo && $0.wearCount < hi }
        },
        Shape(name: "wearCount <= && price >", expect: .range("wearCount")) { rng, _ in
            let hi = Int.random(in: -1..<9, using: &rng), p = pick([-5, 0, 0.5, 5, 9.99], &rng)
            return #Predicate<Item> { $0.wearCount <= hi && $0.price > p }
        },
        Shape(name: "constant < wearCount (flipped)", expect: .range("wearCount")) { rng, _ in
            let lo = Int.random(in: -1..<9, using: &rng)
            return #Predicate<Item> { lo < $0.wearCount }
        },
        Shape(name: "two lower bounds", expect: .range("wearCount")) { rng, _ in
            let a = Int.random(in: 0..<8, using: &rng), b = Int.random(in: 0..<8, using: &rng)
            return #Predicate<Item> { $0.wearCount >= a && $0.wearCount > b }
        },
        Shape(name: "price <", expect: .scan) { rng, _ in
            let p = pick([-5, 0, 0.5, 1, 9.99, 25], &rng)
            return #Predicate<Item> { $0.price < p }
        },
        Shape(name: "price between", expect: .scan) { rng, _ in
            let lo = pick([-5, 0, 0.5, 1], &rng), hi = pick([0.5, 1, 9.99, 25], &rng)
            return #Predicate<Item> { $0.price >= lo && $0.price <= hi }
        },
        Shape(name: "name ==", expect: .scan) { rng, _ in
            let n = pick(["lamp", "Lamp", "desk", "nothing"], &rng)
            return #Predicate<Item> { $0.name == n }
        },
        Shape(name: "category == (not a leading index field)", expect: .scan) { rng, _ in
            let c = pick(["a", "b", "c"], &rng)
            return #Predicate<Item> { $0.category == c }
        },
        Shape(name: "homeID && wearCount >", expect: .index("homeID")) { rng, items in
            let h = pick(items, &rng).homeID, w = Int.random(in: 0..<8, using: &rng)
            return #Predicate<Item> { $0.homeID == h && $0.wearCount > w }
        },
        Shape(name: "homeID && category && wearCount <=", expect: .equality("homeID+category")) { rng, items in
            let h = pick(items, &rng).homeID, c = pick(["a", "b", "c"], &rng), w = Int.random(in: 0..<8, using: &rng)
            return #Predicate<Item> { $0.homeID == h && $0.category == c && $0.wearCount <= w }
        },
        Shape(name: "id ==", expect: .byID) { rng, items in
            let id = pick(items, &rng).id
            return #Predicate<Item> { $0.id == id }
        },
        Shape(name: "id == missing", expect: .byID) { _, _ in
            let id = RecordID()
            return #Predicate<Item> { $0.id == id }
        },
        Shape(name: "id && wearCount", expect: .byID) { rng, items in
            let id = pick(items, &rng).id, w = Int.random(in: 0..<8, using: &rng)
            return #Predicate<Item> { $0.id == id && $0.wearCount >= w }
        },
        Shape(name: "disjunction", expect: .scan) { rng, _ in
            let c = pick(["a", "b", "c"], &rng), w = Int.random(in: 0..<8, using: &rng)
            return #Predicate<Item> { $0.category == c || $0.wearCount == w }
        },
        Shape(name: "homeID && disjunction", expect: .index("homeID")) { rng, items in
            let h = pick(items, &rng).homeID, c = pick(["a", "b"], &rng), n = pick(["lamp", "rug"], &rng)
            return #Predicate<Item> { $0.homeID == h && ($0.category == c || $0.name == n) }
        },
        Shape(name: "negation", expect: .scan) { rng, items in
            let h = pick(items, &rng).homeID
            return #Predicate<Item> { !($0.homeID == h) }
        },
        Shape(name: "contradictory homeIDs", expect: .equality("homeID")) { rng, items in
            let h = pick(items, &rng).homeID, h2 = pick(items, &rng).homeID
            return #Predicate<Item> { $0.homeID == h && $0.homeID == h2 }
        },
        Shape(name: "note == nil", expect: .scan) { _, _ in
            #Predicate<Item> { $0.note == nil }
        },
        Shape(name: "note == worn", expect: .scan) { _, _ in
            #Predicate<Item> { $0.note == "worn" }
        },
        Shape(name: "true", expect: .scan) { _, _ in
            #Predicate<Item> { _ in true }
        },
    ] }

    static let sensors = ["", "a", "a\u{0}b", "ab", "b", "é", String(repeating: "s", count: 130) + "1",
                          String(repeating: "s", count: 130) + "2", String(repeating: "s", count: 119) + "éé"]

    static var readingShapes: [Shape<Reading>] { [
        Shape(name: "sensor == (prefix of composite)", expect: .range("sensor+at")) { rng, _ in
            let s = pick(sensors, &rng)
            return #Predicate<Reading> { $0.sensor == s }
        },
        Shape(name: "sensor == && at range", expect: .range("sensor+at")) { rng, _ in
            let s = pick(sensors, &rng), a = Int.random(in: -10..<10, using: &rng), b = Int.random(in: -10..<10, using: &rng)
            return #Predicate<Reading> { $0.sensor == s && $0.at >= a && $0.at < b }
        },
        Shape(name: "sensor == && at <=", expect: .range("sensor+at")) { rng, _ in
            let s = pick(sensors, &rng), a = Int.random(in: -10..<10, using: &rng)
            return #Predicate<Reading> { $0.sensor == s && $0.at <= a }
        },
        Shape(name: "sensor == && at ==", expect: .equality("sensor+at")) { rng, _ in
            let s = pick(sensors, &rng), a = Int.random(in: -10..<10, using: &rng)
            return #Predicate<Reading> { $0.sensor == s && $0.at == a }
        },
        Shape(name: "at > (not leading)", expect: .scan) { rng, _ in
            let a = Int.random(in: -10..<10, using: &rng)
            return #Predicate<Reading> { $0.at > a }
        },
        Shape(name: "sensor range", expect: .range("sensor+at")) { rng, _ in
            let lo = pick(sensors, &rng), hi = pick(sensors, &rng)
            return #Predicate<Reading> { $0.sensor >= lo && $0.sensor <= hi }
        },
        Shape(name: "sensor <", expect: .range("sensor+at")) { rng, _ in
            let hi = pick(sensors, &rng)
            return #Predicate<Reading> { $0.sensor < hi }
        },
        Shape(name: "sensor >", expect: .range("sensor+at")) { rng, _ in
            let lo = pick(sensors, &rng)
            return #Predicate<Reading> { $0.sensor > lo }
        },
        Shape(name: "value >", expect: .range("value")) { rng, _ in
            let v = pick([-2.5, -0.0, 0, 0.1, 1, 3.75, .infinity, -.infinity], &rng)
            return #Predicate<Reading> { $0.value > v }
        },
        Shape(name: "value between", expect: .range("value")) { rng, _ in
            let lo = pick([-2.5, -0.0, 0, 0.1, 1], &rng), hi = pick([-0.0, 0, 1, 3.75, 100], &rng)
            return #Predicate<Reading> { $0.value >= lo && $0.value <= hi }
        },
        Shape(name: "value ==", expect: .equality("value")) { rng, _ in
            let v = pick([-2.5, -0.0, 0, 0.1, 1, 3.75], &rng)
            return #Predicate<Reading> { $0.value == v }
        },
        Shape(name: "flag && value <", expect: .range("value")) { rng, _ in
            let v = pick([-2.5, 0, 1, 3.75], &rng)
            return #Predicate<Reading> { $0.flag == true && $0.value < v }
        },
        Shape(name: "flag ==", expect: .scan) { rng, _ in
            let f = Bool.random(using: &rng)
            return #Predicate<Reading> { $0.flag == f }
        },
    ] }

    static func randomReading(_ rng: inout SeededGenerator) -> Reading {
        Reading(sensor: pick(sensors, &rng), at: Int.random(in: -10..<10, using: &rng),
                value: pick([-2.5, -0.0, 0, 0.1, 1, 3.75, 1e300, -1e300, .infinity, -.infinity], &rng),
                flag: Bool.random(using: &rng))
    }

    /// Runs `rounds` random queries of every shape and compares with the oracle.
    static func compare<R: Record & Equatable>(_ store: Store, _ all: [R], _ shapes: [Shape<R>], sorts: [[SortDescriptor<R>]],
                                               seed: UInt64, rounds: Int, rng: inout SeededGenerator) throws {
        for shape in shapes {
            for round in 0..<rounds {
                let predicate = shape.make(&rng, all)
                var descriptor = FetchDescriptor<R>(predicate: predicate, sortBy: pick(sorts, &rng))
                if Bool.random(using: &rng) { descriptor.fetchLimit = Int.random(in: 0..<25, using: &rng) }
                if Int.random(in: 0..<4, using: &rng) == 0 { descriptor.fetchOffset = Int.random(in: 0..<5, using: &rng) }
                let context = "seed \(seed) \(R.self) shape '\(shape.name)' round \(round) (limit \(String(describing: descriptor.fetchLimit)), offset \(String(describing: descriptor.fetchOffset)))"
                let expectedAll = try all.filter { try predicate.evaluate($0) }
                let plan = try store.explain(descriptor)
                checkPlan(plan, shape.expect, context)
                let got = try store.fetch(descriptor)
                let offset = descriptor.fetchOffset ?? 0
                if descriptor.sortBy.isEmpty {
                    // Unsorted: any `limit` matches are right, but they must be matches, distinct,
                    // and as many as there are (after the offset).
                    let expectedCount = max(0, min(descriptor.fetchLimit ?? .max, expectedAll.count - offset))
                    #expect(got.count == expectedCount, "\(context): \(got.count) results, expected \(expectedCount); plan \(plan)")
                    let ids = Set(got.map(\.id))
                    #expect(ids.count == got.count, "\(context): duplicate results")
                    let byID = Dictionary(uniqueKeysWithValues: expectedAll.map { ($0.id, $0) })
                    #expect(got.allSatisfy { byID[$0.id] == $0 }, "\(context): a result does not match; plan \(plan)")
                } else {
                    let sorted = expectedAll.sorted(using: descriptor.sortBy)
                    let expected = Array(sorted.dropFirst(offset).prefix(descriptor.fetchLimit ?? .max))
                    #expect(got == expected, "\(context): got \(got.map(\.id)), expected \(expected.map(\.id)); plan \(plan)")
                }
                #expect(try store.fetchCount(descriptor) == expectedAll.count, "\(context): fetchCount; plan \(plan)")
            }
        }
    }

    @Test(arguments: [UInt64(7), 31337])
    func planResultsEqualOracle(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self, Reading.self])
        var rng = SeededGenerator(seed: seed)
        let homes = (0..<4).map { Home(name: "home \($0)") }
        var items: [Item] = []
        var readings: [Reading] = []
        try store.write { tx in
            items = []; readings = []
            var local = SeededGenerator(seed: seed &+ 1)
            for home in homes { try tx.insert(home) }
            for _ in 0..<300 {
                let item = Item.random(homes: homes.map(\.id), using: &local)
                try tx.insert(item)
                items.append(item)
            }
            for _ in 0..<300 {
                let reading = Self.randomReading(&local)
                try tx.insert(reading)
                readings.append(reading)
            }
        }
        // Some churn so that index entries have been moved and deleted, not just appended.
        try store.write { tx in
            for i in stride(from: 0, to: 300, by: 7) {
                items[i].wearCount = (items[i].wearCount + 3) % 8
                items[i].homeID = homes[i % 4].id
                try tx.update(items[i])
                readings[i].sensor = Self.sensors[i % Self.sensors.count]
                readings[i].value = -readings[i].value
                try tx.update(readings[i])
            }
        }
        try store.write { tx in
            for i in stride(from: 299, to: 0, by: -11) {
                try tx.delete(Item.self, id: items[i].id)
                try tx.delete(Reading.self, id: readings[i].id)
                items.remove(at: i)
                readings.remove(at: i)
            }
        }
        #expect(try store.verify().isClean)
        let itemSorts: [[SortDescriptor<Item>]] = [
            [],
            [SortDescriptor(\.wearCount), SortDescriptor(\.id)],
            [SortDescriptor(\.price, order: .reverse), SortDescriptor(\.id)],
            [SortDescriptor(\.name), SortDescriptor(\.wearCount, order: .reverse), SortDescriptor(\.id, order: .reverse)],
        ]
        let readingSorts: [[SortDescriptor<Reading>]] = [
            [],
            [SortDescriptor(\.value), SortDescriptor(\.id)],
            [SortDescriptor(\.sensor), SortDescriptor(\.at), SortDescriptor(\.id)],
        ]
        try Self.compare(store, items, Self.itemShapes, sorts: itemSorts, seed: seed, rounds: 6, rng: &rng)
        try Self.compare(store, readings, Self.readingShapes, sorts: readingSorts, seed: seed, rounds: 6, rng: &rng)
        // No predicate at all: everything, sorted.
        let everything = try store.fetch(FetchDescriptor<Item>(sortBy: [SortDescriptor(\.id)]))
        #expect(everything == items.sorted { $0.id < $1.id })
        #expect(try store.fetchCount(FetchDescriptor<Item>()) == items.count)
    }

    /// The generic (schema-driven) path: `fetch(typeNamed:where:)` and `count(typeNamed:where:)`
    /// with ``QueryCondition``s, against an oracle evaluated on the typed records.
    @Test(arguments: [UInt64(5), 99])
    func genericConditionsEqualOracle(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        var rng = SeededGenerator(seed: seed)
        let homes = (0..<3).map { _ in RecordID() }
        var items: [Item] = []
        try store.write { tx in
            items = []
            var local = SeededGenerator(seed: seed &* 3)
            for _ in 0..<250 {
                let item = Item.random(homes: homes, using: &local)
                try tx.insert(item)
                items.append(item)
            }
        }
        func value(_ item: Item, _ field: String) -> FieldValue {
            switch field {
            case "id": return .uuid(item.id.uuid)
            case "homeID": return .uuid(item.homeID.uuid)
            case "category": return .string(item.category)
            case "name": return .string(item.name)
            case "wearCount": return .int(Int64(item.wearCount))
            case "price": return .double(item.price)
            default: fatalError(field)
            }
        }
        func holds(_ item: Item, _ c: QueryCondition) -> Bool {
            let v = value(item, c.field)
            let order: Int
            switch (v, c.value) {
            case (.int(let a), .int(let b)): order = a < b ? -1 : (a > b ? 1 : 0)
            case (.double(let a), .double(let b)): order = a < b ? -1 : (a > b ? 1 : 0)
            case (.string(let a), .string(let b)): order = a < b ? -1 : (a > b ? 1 : 0)
            case (.uuid(let a), .uuid(let b)):
                guard c.op == .equal else { return false }
                order = a == b ? 0 : 1
            default: fatalError("\(v) vs \(c.value)")
            }
            switch c.op {
            case .equal: return order == 0
            case .less: return order < 0
            case .lessOrEqual: return order <= 0
            case .greater: return order > 0
            case .greaterOrEqual: return order >= 0
            }
        }
        let ops: [QueryCondition.Operator] = [.equal, .less, .lessOrEqual, .greater, .greaterOrEqual]
        func randomCondition() -> QueryCondition {
            switch Int.random(in: 0..<6, using: &rng) {
            case 0: return QueryCondition(field: "homeID", op: .equal, value: .uuid(Self.pick(homes + [RecordID()], &rng).uuid))
            case 1: return QueryCondition(field: "category", op: Self.pick([.equal, .less, .greaterOrEqual], &rng), value: .string(Self.pick(["a", "b", "c"], &rng)))
            case 2: return QueryCondition(field: "wearCount", op: Self.pick(ops, &rng), value: .int(Int64.random(in: -1..<9, using: &rng)))
            case 3: return QueryCondition(field: "price", op: Self.pick(ops, &rng), value: .double(Self.pick([-3.25, 0, 0.5, 1, 9.99, 20], &rng)))
            case 4: return QueryCondition(field: "name", op: .equal, value: .string(Self.pick(["lamp", "desk", "Lamp"], &rng)))
            default: return QueryCondition(field: "id", op: .equal, value: .uuid(Self.pick(items, &rng).id.uuid))
            }
        }
        for round in 0..<150 {
            let conditions = (0..<Int.random(in: 1...3, using: &rng)).map { _ in randomCondition() }
            let context = "seed \(seed) round \(round): \(conditions)"
            let expected = Set(items.filter { item in conditions.allSatisfy { holds(item, $0) } }.map(\.id))
            let (got, count, plan) = try store.read { s throws in
                (try s.fetch(typeNamed: "Item", where: conditions), try s.count(typeNamed: "Item", where: conditions),
                 try s.explain(typeNamed: "Item", where: conditions))
            }
            #expect(Set(got.map(\.id)) == expected, "\(context); plan \(plan)")
            #expect(got.count == expected.count, "\(context): duplicates")
            #expect(count == expected.count, "\(context): count; plan \(plan)")
            let indexable = conditions.contains { c in
                c.field == "id" || c.field == "homeID" || (c.field == "wearCount")
            }
            #expect(plan.usesIndex == indexable, "\(context): \(plan)")
            // Generic records carry the same field values as the typed ones.
            for record in got.prefix(3) {
                let item = items.first { $0.id == record.id }!
                for field in ["homeID", "category", "name", "wearCount", "price"] {
                    #expect(record.fields[field] == value(item, field), "\(context): \(field)")
                }
            }
        }
        // A limit cuts the generic fetch.
        let all = [QueryCondition(field: "wearCount", op: .greaterOrEqual, value: .int(0))]
        #expect(try store.read { try $0.fetch(typeNamed: "Item", where: all, limit: 10) }.count == 10)
        // An unknown field is a clear error, not an empty result.
        let error = thrownError { _ = try store.read { try $0.count(typeNamed: "Item", where: [QueryCondition(field: "colour", op: .equal, value: .string("red"))]) } } as? StoreError
        #expect(error?.code == .unknownField)
        #expect(error?.message.contains("colour") == true)
    }

    /// A generic condition whose value kind differs from the field's kind (a JSON number
    /// `3.0` against an int field) must give the same answer through an index as a scan does.
    @Test func genericConditionWithOtherNumericKind() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = RecordID()
        try store.write { tx in
            for w in 0..<6 { for _ in 0...w { try tx.insert(Item(homeID: home, name: "n", category: "a", wearCount: w, price: Double(w))) } }
        }
        try store.read { s throws in
            let asInt = try s.count(typeNamed: "Item", where: [QueryCondition(field: "wearCount", op: .equal, value: .int(3))])
            #expect(asInt == 4)
            let asDouble = try s.count(typeNamed: "Item", where: [QueryCondition(field: "wearCount", op: .equal, value: .double(3))])
            #expect(asDouble == 4, "wearCount == 3.0 should count the four items with wearCount 3")
            #expect(try s.fetch(typeNamed: "Item", where: [QueryCondition(field: "wearCount", op: .equal, value: .double(3))]).count == 4)
            let above = try s.fetch(typeNamed: "Item", where: [QueryCondition(field: "wearCount", op: .greater, value: .double(3.5))])
            #expect(above.count == 5 + 6, "wearCount > 3.5")
            let below = try s.count(typeNamed: "Item", where: [QueryCondition(field: "wearCount", op: .less, value: .double(1.5))])
            #expect(below == 1 + 2, "wearCount < 1.5")
            // And an int against the double field price (no index: a scan).
            #expect(try s.count(typeNamed: "Item", where: [QueryCondition(field: "price", op: .equal, value: .int(2))]) == 3)
        }
    }

    struct Event: Record, Equatable {
        var id = RecordID()
        var at: Date
        var level: Int?
        var tag: String?
        static let indexes: [RecordIndex<Event>] = [.index(\.at), .index(\.level), .index(\.tag, \.at)]
    }

    /// Optional indexed fields (nil sorts first in keys) and dates, through the planner.
    @Test(arguments: [UInt64(4), 8])
    func optionalsAndDatesEqualOracle(seed: UInt64) throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Event.self])
        var rng = SeededGenerator(seed: seed)
        let base = Date(timeIntervalSince1970: 1_700_000_000)
        let levels: [Int?] = [nil, -1, 0, 1, 2]
        let tags: [String?] = [nil, "", "a", "b"]
        var events: [Event] = []
        try store.write { tx in
            events = []
            var local = SeededGenerator(seed: seed)
            for _ in 0..<200 {
                let event = Event(at: base.addingTimeInterval(Double(Int.random(in: -50..<50, using: &local)) * 0.5),
                                  level: Self.pick(levels, &local), tag: Self.pick(tags, &local))
                try tx.insert(event)
                events.append(event)
            }
        }
        let shapes: [Shape<Event>] = [
            Shape(name: "at >", expect: .range("at")) { rng, _ in
                let d = base.addingTimeInterval(Double(Int.random(in: -30..<30, using: &rng)))
                return #Predicate<Event> { $0.at > d }
            },
            Shape(name: "at between", expect: .range("at")) { rng, _ in
                let lo = base.addingTimeInterval(Double(Int.random(in: -30..<0, using: &rng)))
                let hi = base.addingTimeInterval(Double(Int.random(in: 0..<30, using: &rng)))
                return #Predicate<Event> { $0.at >= lo && $0.at < hi }
            },
            Shape(name: "at ==", expect: .equality("at")) { rng, events in
                let d = Self.pick(events, &rng).at
                return #Predicate<Event> { $0.at == d }
            },
            Shape(name: "level == (optional, maybe nil)", expect: .equality("level")) { rng, _ in
                let l = Self.pick(levels, &rng)
                return #Predicate<Event> { $0.level == l }
            },
            Shape(name: "level == nil", expect: .equality("level")) { _, _ in
                #Predicate<Event> { $0.level == nil }
            },
            Shape(name: "tag == && at <=", expect: .range("tag+at")) { rng, _ in
                let t = Self.pick(tags, &rng)
                let d = base.addingTimeInterval(Double(Int.random(in: -30..<30, using: &rng)))
                return #Predicate<Event> { $0.tag == t && $0.at <= d }
            },
            Shape(name: "tag ==", expect: .range("tag+at")) { rng, _ in
                let t = Self.pick(tags, &rng)
                return #Predicate<Event> { $0.tag == t }
            },
        ]
        let sorts: [[SortDescriptor<Event>]] = [[], [SortDescriptor(\.at, order: .reverse), SortDescriptor(\.id)]]
        try Self.compare(store, events, shapes, sorts: sorts, seed: seed, rounds: 8, rng: &rng)
        #expect(try store.verify().isClean)
    }

    /// NaN equals nothing, although its index key equals itself: an indexed `== .nan` must
    /// not count the NaN records, and ranges must not return them.
    @Test func nanIsNeverEqualThroughAnIndex() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Reading.self])
        let values: [Double] = [.nan, .nan, 1, -1, .infinity, -.infinity, 0]
        try store.write { tx in
            for (n, v) in values.enumerated() { try tx.insert(Reading(sensor: "s", at: n, value: v, flag: false)) }
        }
        let notANumber = Double.nan   // (a variable named `nan` draws an "always false" warning)
        let equal = FetchDescriptor<Reading>(predicate: #Predicate { $0.value == notANumber })
        #expect(try store.fetch(equal).isEmpty)
        #expect(try store.fetchCount(equal) == 0)
        let above = FetchDescriptor<Reading>(predicate: #Predicate { $0.value > 0 })
        #expect(try store.fetchCount(above) == 2)
        #expect(Set(try store.fetch(above).map(\.value)) == [1, .infinity])
        let below = FetchDescriptor<Reading>(predicate: #Predicate { $0.value <= 0 })
        #expect(try store.fetchCount(below) == 3)
        #expect(try store.explain(above).usesIndex)
        let generic = try store.read { try $0.count(typeNamed: "Reading", where: [QueryCondition(field: "value", op: .equal, value: .double(.nan))]) }
        #expect(generic == 0)
        // Counts by key path and through a handle counted the two stored NaNs.
        #expect(try store.count(Reading.self, where: \.value, equals: notANumber) == 0)
        let handle = try store.index(\Reading.value)
        #expect(try store.count(handle, equals: notANumber) == 0)
        #expect(try store.read { try $0.count(handle, equals: notANumber) } == 0)
        #expect(try store.write { try $0.count(Reading.self, where: \.value, equals: notANumber) } == 0)
        #expect(try store.count(handle, equals: 1) == 1 && store.count(Reading.self, where: \.value, equals: -1) == 1)
    }

    /// A date of NaN seconds equals nothing, as a NaN double: counts by key path and handle
    /// counted the stored ones, and generic conditions took it for equal to every date.
    @Test func nanDatesAreNeverEqual() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Event.self])
        let nanDate = Date(timeIntervalSinceReferenceDate: .nan)
        let day = Date(timeIntervalSinceReferenceDate: 86_400)
        try store.write { tx in for at in [nanDate, nanDate, day] { try tx.insert(Event(at: at)) } }
        #expect(try store.count(Event.self, where: \.at, equals: nanDate) == 0)
        let handle = try store.index(\Event.at)
        #expect(try store.count(handle, equals: nanDate) == 0 && store.count(handle, equals: day) == 1)
        #expect(try store.fetchCount(FetchDescriptor<Event>(predicate: #Predicate { $0.at == nanDate })) == 0)
        try store.read { s throws in
            for op: QueryCondition.Operator in [.equal, .lessOrEqual, .greaterOrEqual] {
                #expect(try s.count(typeNamed: "Event", where: [QueryCondition(field: "at", op: op, value: .date(nanDate))]) == 0, "\(op)")
            }
            #expect(try s.count(typeNamed: "Event", where: [QueryCondition(field: "at", op: .equal, value: .date(day))]) == 1)
        }
        // A handle counts in the store it was made by: another store's tags name other things.
        let elsewhere = TemporaryDirectory()
        let other = try Store.open(at: elsewhere.path, types: [Event.self])
        let error = thrownError { _ = try other.count(handle, equals: day) } as? StoreError
        #expect(error?.code == .invalidValue && error?.message.contains("another store") == true, "\(String(describing: error))")
    }

    /// `Int.max` as a limit (no limit) with an offset overflowed and trapped; a negative limit
    /// or offset trapped on the slice. Now the first means no limit and the others are refused.
    @Test func extremeLimitsAndOffsets() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Reading.self])
        try store.write { tx in for n in 0..<5 { try tx.insert(Reading(sensor: "s", at: n, value: Double(n), flag: false)) } }
        for sorted in [false, true] {
            var descriptor = FetchDescriptor<Reading>(sortBy: sorted ? [SortDescriptor(\.at)] : [])
            descriptor.fetchLimit = .max
            descriptor.fetchOffset = 2
            #expect(try store.fetch(descriptor).count == 3)
            descriptor.fetchOffset = .max
            #expect(try store.fetch(descriptor).isEmpty)
            for (limit, offset) in [(-1, 0), (1, -1)] {
                descriptor.fetchLimit = limit
                descriptor.fetchOffset = offset
                #expect { _ = try store.fetch(descriptor) } throws: { ($0 as? StoreError)?.code == .invalidValue }
            }
        }
        // The generic fetch returned one record for a limit of 0 (and for a negative one).
        try store.read { s throws in
            #expect(try s.fetch(typeNamed: "Reading", where: [], limit: 0).isEmpty)
            #expect(try s.fetch(typeNamed: "Reading", where: [], limit: 2).count == 2)
            #expect { _ = try s.fetch(typeNamed: "Reading", where: [], limit: -1) } throws: { ($0 as? StoreError)?.code == .invalidValue }
        }
    }

    /// A range on a type of the app's own ranked by its own `<` (a priority stored as its raw
    /// string) was answered by an index range in the stored (string) order: `>= .medium`
    /// missed `.high`, as "high" < "medium". Such ranges filter every record; equality, which
    /// the stored form decides as `==` does, and ranges on built-in types still use the index.
    @Test func aRangeOnATypeRankedByItsOwnOrderIsNotAnIndexRange() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Chore.self])
        try store.write { tx in
            for (n, priority) in Priority.allCases.enumerated() { try tx.insert(Chore(priority: priority, effort: n)) }
        }
        let least = Priority.medium
        let atLeast = FetchDescriptor<Chore>(predicate: #Predicate { $0.priority >= least })
        #expect(Set(try store.fetch(atLeast).map(\.priority)) == [.medium, .high])
        #expect(try store.fetchCount(atLeast) == 2)
        let below = FetchDescriptor<Chore>(predicate: #Predicate { $0.priority < least })
        #expect(try store.fetch(below).map(\.priority) == [.low])
        #expect(try store.read { try $0.fetchCount(below) } == 1)
        let equal = FetchDescriptor<Chore>(predicate: #Predicate { $0.priority == least })
        #expect(try store.explain(equal).usesIndex)
        #expect(try store.fetch(equal).map(\.priority) == [.medium])
        let effort = 1
        let busy = FetchDescriptor<Chore>(predicate: #Predicate { $0.effort >= effort })
        #expect(try store.explain(busy).usesIndex)
        #expect(Set(try store.fetch(busy).map(\.priority)) == [.medium, .high])
    }

    /// The planner judged whether an equality key was cut short without the index's 4-byte
    /// prefix: values filling 508 to 511 bytes fit in its probe, but the real key is cut, so
    /// the exact count also counted records differing in the last bytes.
    @Test func anExactCountNeverUsesAKeyCutShort() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Triple.self])
        // Each NUL takes two key bytes: 1 + 238 + 2 bytes for a and b, 1 + 26 + 2 for c: 511.
        let wide = String(repeating: "\0", count: 119)
        let stem = String(repeating: "x", count: 25)
        try store.write { tx in
            for last in ["A", "B"] { try tx.insert(Triple(a: wide, b: wide, c: stem + last)) }
        }
        let c = stem + "A"
        let one = FetchDescriptor<Triple>(predicate: #Predicate { $0.a == wide && $0.b == wide && $0.c == c })
        #expect(try store.fetch(one).count == 1)
        #expect(try store.fetchCount(one) == 1)
        let conditions = [QueryCondition(field: "a", op: .equal, value: .string(wide)), QueryCondition(field: "b", op: .equal, value: .string(wide)),
                          QueryCondition(field: "c", op: .equal, value: .string(c))]
        #expect(try store.read { try $0.count(typeNamed: "Triple", where: conditions) } == 1)
        #expect(try !store.read { try $0.explain(typeNamed: "Triple", where: conditions) }.isExactIndexCount)
    }

    /// Generic conditions compared an int and a double by converting the int: past 2^53 two
    /// different values compared equal (2^53 + 1 == 2^53, Int64.max == 2^63).
    @Test func intsAndDoublesCompareExactly() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Reading.self])
        let big = 9_007_199_254_740_993   // 2^53 + 1
        try store.write { tx in
            for at in [big, Int.max, Int.min, -3] { try tx.insert(Reading(sensor: "s", at: at, value: 0, flag: false)) }
        }
        func count(_ op: QueryCondition.Operator, _ value: Double) throws -> Int {
            try store.read { try $0.count(typeNamed: "Reading", where: [QueryCondition(field: "at", op: op, value: .double(value))]) }
        }
        #expect(try count(.equal, 9_007_199_254_740_992) == 0)
        #expect(try count(.greater, 9_007_199_254_740_992) == 2)
        #expect(try count(.equal, 9_223_372_036_854_775_808) == 0)     // 2^63: above Int.max
        #expect(try count(.less, 9_223_372_036_854_775_808) == 4)
        #expect(try count(.equal, -9_223_372_036_854_775_808) == 1)    // -2^63 is Int.min
        #expect(try count(.less, -3.5) == 1 && count(.lessOrEqual, -3) == 2 && count(.greater, -3.5) == 3)
    }

    /// The O(1) count path is used only when it is exact.
    @Test func exactIndexCountsAndExplainText() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.insert(home)
        let hid = home.id
        let equality = FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == hid })
        let plan = try store.explain(equality)
        #expect(plan.isExactIndexCount)
        #expect(!plan.hasFilter)
        #expect(plan.description.contains("homeID"))
        let filtered = try store.explain(FetchDescriptor<Item>(predicate: #Predicate { $0.homeID == hid && $0.price > 1 }))
        #expect(!filtered.isExactIndexCount)
        #expect(filtered.hasFilter)
        #expect(filtered.description.contains("filter"))
        let scan = try store.explain(FetchDescriptor<Item>(predicate: #Predicate { $0.price > 1 }))
        #expect(scan.access == .scan)
        #expect(scan.description.contains("scan"))
    }

    /// A lone `field == constant` is counted straight from the index, read through the
    /// expression's type; every spelling, in a snapshot, in a write transaction with pending
    /// writes, and for keys the index holds only in part (long strings), counts what the
    /// predicate itself says.
    @Test func soleEqualityCountsMatchThePredicateInEverySpelling() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Tagged.self])
        let long1 = String(repeating: "s", count: 130) + "1", long2 = String(repeating: "s", count: 130) + "2"
        var records = [Tagged(tag: long1, note: nil), Tagged(tag: long1, note: "x"), Tagged(tag: long2, note: nil),
                       Tagged(tag: long2, note: nil), Tagged(tag: long2, note: "y"), Tagged(tag: "a", note: "")]
        try store.write { tx in for r in records { try tx.insert(r) } }

        func check(_ reading: some StoreReading, _ records: [Tagged], _ context: String) throws {
            for tag in [long1, long2, "a", "zz"] {
                let expected = records.filter { $0.tag == tag }.count
                let fieldFirst = FetchDescriptor<Tagged>(predicate: #Predicate { $0.tag == tag })
                let constantFirst = FetchDescriptor<Tagged>(predicate: #Predicate { tag == $0.tag })
                #expect(try reading.fetchCount(fieldFirst) == expected, "\(context): $0.tag == \(tag.suffix(3))")
                #expect(try reading.fetchCount(constantFirst) == expected, "\(context): \(tag.suffix(3)) == $0.tag")
                #expect(try reading.count(Tagged.self, where: \.tag, equals: tag) == expected, "\(context): count(where:)")
            }
            for note in [nil, "", "x", "q"] as [String?] {
                let expected = records.filter { $0.note == note }.count
                let descriptor = FetchDescriptor<Tagged>(predicate: #Predicate { $0.note == note })
                #expect(try reading.fetchCount(descriptor) == expected, "\(context): $0.note == \(String(describing: note))")
            }
        }
        for tag in [long1, long2, "a", "zz"] {
            #expect(try store.fetchCount(FetchDescriptor<Tagged>(predicate: #Predicate { $0.tag == tag }))
                    == records.filter { $0.tag == tag }.count, "store: \(tag.suffix(3))")
        }
        try store.read { try check($0, records, "snapshot") }
        try store.write { tx in
            let more = [Tagged(tag: long1, note: nil), Tagged(tag: "zz", note: "q")]
            for r in more { try tx.insert(r) }
            try tx.delete(Tagged.self, id: records[2].id)
            var pending = records + more
            pending.remove(at: 2)
            try check(tx, pending, "write transaction")
            records = pending
        }
        try store.read { try check($0, records, "after commit") }
    }

    /// A value type of the app's own whose index component differs from its stored form: the
    /// counts must use the stored form (what the index holds), not the type's own component.
    @Test func countsOfAnAppsOwnIndexableTypeUseTheStoredForm() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Labelled.self])
        try store.write { tx in
            for name in ["Red", "Red", "red", "Blue"] { try tx.insert(Labelled(label: Label(name: name))) }
        }
        let red = Label(name: "Red")
        #expect(try store.count(Labelled.self, where: \.label, equals: red) == 2)
        #expect(try store.count(store.index(\Labelled.label), equals: red) == 2)
        #expect(try store.fetchCount(FetchDescriptor<Labelled>(predicate: #Predicate { $0.label == red })) == 2)
        try store.read { snapshot throws in
            #expect(try snapshot.count(Labelled.self, where: \.label, equals: red) == 2)
            #expect(try snapshot.fetchCount(FetchDescriptor<Labelled>(predicate: #Predicate { $0.label == red })) == 2)
        }
    }

    /// A value of the app's own that cannot be encoded: the count said only what Foundation's
    /// encoding error says, naming no store, type or field.
    @Test func aCountByAValueThatCannotBeEncodedNamesTheField() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Labelled.self])
        let error = thrownError { _ = try store.count(Labelled.self, where: \.label, equals: Label(name: "")) }
        let storeError = try #require(error as? StoreError, "\(String(describing: error))")
        #expect(storeError.code == .invalidValue)
        #expect(storeError.message.contains("Labelled.label") && storeError.message.contains(dir.path), "\(storeError.message)")
    }

    /// A record whose `encode(to:)` stores a property in another form than the property's type
    /// (a UUID as text, a date as seconds since 1970, as for a JSON API): the index holds that
    /// form, so a key built from the property's type finds nothing. Every count must agree
    /// with the fetch, which evaluates the predicate on the records.
    @Test func countsOfAPropertyStoredInAnotherFormAgreeWithTheFetch() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Visit.self])
        let owner = UUID(), other = UUID()
        let day = Date(timeIntervalSince1970: 1_700_000_000)
        try store.write { tx in
            try tx.insert(Visit(ownerID: owner, at: day))
            try tx.insert(Visit(ownerID: owner, at: day.addingTimeInterval(60)))
            try tx.insert(Visit(ownerID: other, at: day))
        }
        let byOwner = FetchDescriptor<Visit>(predicate: #Predicate { $0.ownerID == owner })
        let byDay = FetchDescriptor<Visit>(predicate: #Predicate { $0.at == day })
        #expect(try store.fetch(byOwner).count == 2)
        #expect(try store.fetch(byDay).count == 2)
        #expect(try store.count(Visit.self, where: \.ownerID, equals: owner) == 2)
        #expect(try store.count(Visit.self, where: \.at, equals: day) == 2)
        #expect(try store.fetchCount(byOwner) == 2)
        #expect(try store.fetchCount(byDay) == 2)
        #expect(try store.count(store.index(\Visit.ownerID), equals: owner) == 2)
        #expect(try store.count(store.index(\Visit.at), equals: day) == 2)
        try store.read { snapshot throws in
            #expect(try snapshot.count(Visit.self, where: \.ownerID, equals: owner) == 2)
            #expect(try snapshot.count(Visit.self, where: \.at, equals: day) == 2)
            #expect(try snapshot.fetchCount(byOwner) == 2)
            #expect(try snapshot.count(store.index(\Visit.ownerID), equals: owner) == 2)
        }
        try store.write { tx in
            try tx.insert(Visit(ownerID: owner, at: day))
            #expect(try tx.count(Visit.self, where: \.ownerID, equals: owner) == 3)
            #expect(try tx.fetchCount(byDay) == 3)
            #expect(try tx.count(store.index(\Visit.at), equals: day) == 3)
        }
    }
}

/// Stores its owner as text and its time as seconds since 1970, as a model shared with a JSON
/// API might; both are indexed.
struct Visit: Record, Equatable {
    var id = RecordID()
    var ownerID: UUID
    var at: Date
    static let indexes: [RecordIndex<Visit>] = [.index(\.ownerID), .index(\.at)]

    init(ownerID: UUID, at: Date) {
        self.ownerID = ownerID
        self.at = at
    }

    enum CodingKeys: String, CodingKey { case id, ownerID, at }

    init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: CodingKeys.self)
        id = try c.decode(RecordID.self, forKey: .id)
        let text = try c.decode(String.self, forKey: .ownerID)
        guard let owner = UUID(uuidString: text) else {
            throw DecodingError.dataCorruptedError(forKey: .ownerID, in: c, debugDescription: "not a UUID: \(text)")
        }
        ownerID = owner
        at = Date(timeIntervalSince1970: try c.decode(Double.self, forKey: .at))
    }

    func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: CodingKeys.self)
        try c.encode(id, forKey: .id)
        try c.encode(ownerID.uuidString, forKey: .ownerID)
        try c.encode(at.timeIntervalSince1970, forKey: .at)
    }
}

struct Tagged: Record, Equatable {
    var id = RecordID()
    var tag: String
    var note: String?
    static let indexes: [RecordIndex<Tagged>] = [.index(\.tag), .index(\.note)]
}

/// Stored as its name (a single string), but its own index component lowercases the name, as an
/// app might write one by mistake.
struct Label: IndexableValue, Codable, Hashable {
    var name: String
    init(name: String) { self.name = name }
    init(from decoder: any Decoder) throws { name = try decoder.singleValueContainer().decode(String.self) }
    /// An empty name cannot be stored (it throws, as a validating type of an app would).
    func encode(to encoder: any Encoder) throws {
        guard !name.isEmpty else {
            throw EncodingError.invalidValue(name, .init(codingPath: encoder.codingPath, debugDescription: "a label needs a name"))
        }
        var container = encoder.singleValueContainer()
        try container.encode(name)
    }
    func appendIndexComponent(to key: inout KeyBytes) { name.lowercased().appendIndexComponent(to: &key) }
}

struct Labelled: Record, Equatable {
    var id = RecordID()
    var label: Label
    static let indexes: [RecordIndex<Labelled>] = [.index(\.label)]
}

/// Ranked by its own `<`, not by its stored raw string ("high" < "low" < "medium").
enum Priority: String, Codable, Sendable, Comparable, CaseIterable, IndexableValue {
    case low, medium, high
    private var rank: Int { Self.allCases.firstIndex(of: self)! }
    static func < (a: Self, b: Self) -> Bool { a.rank < b.rank }
    func appendIndexComponent(to key: inout KeyBytes) { rank.appendIndexComponent(to: &key) }
}

struct Chore: Record, Equatable {
    var id = RecordID()
    var priority: Priority
    var effort: Int
    static let indexes: [RecordIndex<Chore>] = [.index(\.priority), .index(\.effort)]
}

struct Triple: Record, Equatable {
    var id = RecordID()
    var a: String
    var b: String
    var c: String
    static let indexes: [RecordIndex<Triple>] = [.index(\.a, \.b, \.c)]
}
