import Foundation
import Stash
import StashSync
import StashTestSupport

// The record types and the seed deltas of the delta fuzz run (`DeltaFuzzTests`): realistic
// deltas exported by real stores, then made byte-for-byte the same in every run (fixed ids,
// clocks and site ids), so that a seed and an iteration name one mutated delta.

struct FuzzHome: Record, Equatable {
    static var recordType: String { "Home" }
    var id = RecordID()
    var name: String
    var rooms: Int
    var built: Date
    var note: String?
    var area: Double
    static var fieldDefaults: [String: FieldValue] { ["area": .double(0)] }
    static let indexes: [RecordIndex<FuzzHome>] = [.index(\.name)]
}

struct FuzzItem: Record, Equatable {
    static var recordType: String { "Item" }
    var id = RecordID()
    var homeID: RecordID
    var name: String
    var weight: Double
    var purchased: Date?
    var tags: [String]
    var attributes: [String: String]
    var photo: Data?
    var wearCount = 0
    static let indexes: [RecordIndex<FuzzItem>] = [.index(\.homeID), .index(\.homeID, \.name), .index(\.weight), .index(\.purchased)]
}

struct FuzzAccount: Record, Equatable {
    static var recordType: String { "Account" }
    var id = RecordID()
    var handle: String
    var credits = Counter()
    var joined: Date
    var limits: [String: Int]?
    static let indexes: [RecordIndex<FuzzAccount>] = [.unique(\.handle)]
}

struct FuzzReading: Record, Equatable {
    static var recordType: String { "Reading" }
    var id = RecordID()
    var sensor: String
    var value: Double
    var at: Date
    var samples: [Double]
    var flags: [Bool]?
    static let indexes: [RecordIndex<FuzzReading>] = [.index(\.sensor, \.value), .index(\.at)]
}

/// Never leaves its store: entries naming it are skipped by the merge.
struct FuzzDraft: Record, Equatable {
    static var recordType: String { "Draft" }
    var id = RecordID()
    var text: String
    static let isLocalOnly = true
}

let fuzzTypes: [any Record.Type] = [FuzzHome.self, FuzzItem.self, FuzzAccount.self, FuzzReading.self, FuzzDraft.self]
/// The synced types, by name.
let fuzzSyncedTypeNames = ["Account", "Home", "Item", "Reading"]

/// An id made from two numbers: the same in every run.
func fuzzID(_ kind: UInt64, _ n: UInt64) -> RecordID {
    RecordID(high: 0x0190_0000_0000_7000 | kind << 20 | n & 0xFFF, low: 0x8000_0000_0000_0000 | kind << 32 | n)
}

/// The fixed wall clock of the fuzz stores: 2026-01-01T00:00:00Z plus `offset` seconds.
func fuzzClock(_ offset: TimeInterval) -> @Sendable () -> Date {
    let date = Date(timeIntervalSince1970: 1_767_225_600 + offset)
    return { date }
}

/// A directory for throwaway stores: in memory (`/dev/shm`) where there is one, so that
/// parking a delta (which syncs a file) costs no disk write.
final class FuzzDirectory: @unchecked Sendable {
    let url: URL
    var path: String { url.path }

    init(_ name: String) {
        let shm = URL(fileURLWithPath: "/dev/shm")
        let base = FileManager.default.isWritableFile(atPath: shm.path) ? shm : FileManager.default.temporaryDirectory
        url = base.appendingPathComponent("\(name)-\(UUID().uuidString)")
        try! FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
    }

    func sub(_ name: String) -> String { url.appendingPathComponent(name).path }

    deinit { try? FileManager.default.removeItem(at: url) }
}

/// One delta a source store exported: the seed of mutations.
struct FuzzBase: Sendable {
    let name: String
    let delta: Delta
    let bytes: Data
}

/// The seed deltas, the family and key they are signed with, and the ids they hold.
struct FuzzCorpus: Sendable {
    static let family = fuzzID(0xF, 1)
    var family: RecordID { Self.family }
    let key: SyncKey
    let wrongKey: SyncKey
    /// The source sites as every run names them (the stores' own are random).
    static let siteA = fuzzID(0xA, 0xA)
    static let siteB = fuzzID(0xB, 0xB)
    static let siteC = fuzzID(0xC, 0xC)
    /// Small deltas (a few dozen entries).
    let bases: [FuzzBase]
    /// A delta large enough to be read on a thread of its own while the merge runs.
    let large: FuzzBase
    /// Runs of 1 to 4 consecutive entries of each small seed, encoded: most byte-level mutants
    /// damage one of these (fewer bytes to hash and read before the damage).
    let slices: [FuzzBase]
    /// The delta each receiver applies unmutated at its start.
    let initial: FuzzBase

    static let homes = (0..<4).map { fuzzID(1, UInt64($0)) }
    static let items = (0..<8).map { fuzzID(2, UInt64($0)) }
    static let accounts = (0..<5).map { fuzzID(3, UInt64($0)) }
    static let readings = (0..<6).map { fuzzID(4, UInt64($0)) }
    /// Records only receivers hold (written locally at their start).
    static let localAccount = fuzzID(5, 0)
    static let localHome = fuzzID(5, 1)
    static let handles = ["ada", "bob", "cy", "dora", "eve", "clash"]

    init() async throws {
        let key = try SyncKey(FuzzKeyBytes.family), family = Self.family
        self.key = key
        wrongKey = try SyncKey(FuzzKeyBytes.wrong)
        let dir = FuzzDirectory("stash-fuzz-corpus")
        func open(_ name: String, clock: TimeInterval) throws -> (Store, SyncEngine) {
            var options = StoreOptions()
            options.durability = .none
            options.clock = fuzzClock(clock)
            let store = try Store.open(at: dir.sub(name), types: fuzzTypes, options: options)
            return (store, try SyncEngine(store: store, configuration: SyncConfiguration(family: family, key: key)))
        }
        let (a, engineA) = try open("a", clock: 0)
        let (b, engineB) = try open("b", clock: 10)
        let (c, engineC) = try open("c", clock: 20)
        let t0 = Date(timeIntervalSince1970: 1_767_225_600)
        let homes = Self.homes, items = Self.items, accounts = Self.accounts, readings = Self.readings

        // 1. A creates everything.
        try a.write(isolation: #isolation) { tx in
            for (n, id) in homes.enumerated() {
                try tx.insert(FuzzHome(id: id, name: "Home \(n)", rooms: n + 1, built: t0.addingTimeInterval(-Double(n) * 86_400 * 365),
                                       note: n % 2 == 0 ? "note \(n)" : nil, area: 40.5 + Double(n)))
            }
            for (n, id) in items.enumerated() {
                try tx.insert(FuzzItem(id: id, homeID: homes[n / 2], name: "Item \(n)", weight: 0.25 * Double(n), purchased: n % 3 == 0 ? nil : t0.addingTimeInterval(Double(n) * 3600.5),
                                       tags: (0..<(n % 4)).map { "tag\($0)" }, attributes: n % 2 == 0 ? ["color": "red", "size": "\(n)"] : [:],
                                       photo: n == 5 ? Data((0..<300).map { UInt8($0 & 0xFF) }) : nil, wearCount: n))
            }
            for (n, id) in accounts.prefix(3).enumerated() {
                var credits = Counter()
                credits.add(Int64(5 + n), site: tx.siteID)
                try tx.insert(FuzzAccount(id: id, handle: Self.handles[n], credits: credits, joined: t0.addingTimeInterval(Double(n)),
                                          limits: n == 1 ? nil : ["homes": n + 1, "items": 10 * n]))
            }
            for (n, id) in readings.enumerated() {
                try tx.insert(FuzzReading(id: id, sensor: "s\(n % 2)", value: Double(n) / 3, at: t0.addingTimeInterval(Double(n) * 0.001),
                                          samples: (0..<n).map { Double($0) * 1.5 }, flags: n % 2 == 0 ? [true, false] : nil))
            }
            try tx.insert(FuzzDraft(id: fuzzID(6, 0), text: "draft"))
        }
        let first = try engineA.makeDelta(for: nil)
        try engineA.acknowledge(peer: nil, through: first.to)

        // 2. B receives it; concurrent edits on both, counters on both sites, a delete, a
        //    delete and re-insert of the same id, a cleared optional; then both sync.
        try await engineA.sync(via: DirectTransport(to: engineB))
        try b.write(isolation: #isolation) { tx in
            try tx.update(FuzzHome.self, id: homes[0]) { $0.name = "Home zero (B)" }
            try tx.update(FuzzItem.self, id: items[1]) { $0.tags = ["b1", "b2"] }
            try tx.update(FuzzAccount.self, id: accounts[0]) { $0.credits.add(-2, site: tx.siteID) }
            try tx.update(FuzzAccount.self, id: accounts[1]) { $0.credits.add(7, site: tx.siteID) }
            try tx.delete(FuzzReading.self, id: readings[2])
            try tx.insert(FuzzAccount(id: accounts[3], handle: Self.handles[3], joined: t0.addingTimeInterval(3), limits: nil))
        }
        try a.write(isolation: #isolation) { tx in
            try tx.update(FuzzHome.self, id: homes[0]) { $0.rooms = 9 }
            try tx.update(FuzzItem.self, id: items[1]) { $0.weight = 12.75 }
            try tx.update(FuzzAccount.self, id: accounts[0]) { $0.credits.add(3, site: tx.siteID) }
            try tx.delete(FuzzItem.self, id: items[3])
            try tx.delete(FuzzHome.self, id: homes[3])
        }
        try a.write(isolation: #isolation) { tx in
            try tx.insert(FuzzHome(id: homes[3], name: "Home 3 again", rooms: 2, built: t0, note: nil, area: 12))
            try tx.update(FuzzReading.self, id: readings[4]) { $0.samples = [-0.5, 1e-300, 2.5e300] }
            try tx.update(FuzzItem.self, id: items[5]) { $0.purchased = nil; $0.attributes = ["k": "v"] }
            try tx.insert(FuzzAccount(id: accounts[4], handle: Self.handles[4], joined: t0.addingTimeInterval(4), limits: [:]))
        }
        try await engineA.sync(via: DirectTransport(to: engineB))
        let second = try engineA.makeDelta(for: nil)
        let full = try engineA.makeDelta(for: nil, fullSnapshot: true)
        let fromB = try engineB.makeDelta(for: nil)

        // 3. C: many records, for a delta read on a thread of its own.
        try c.write(isolation: #isolation) { tx in
            for n in 0..<600 {
                try tx.insert(FuzzReading(id: fuzzID(7, UInt64(n)), sensor: "c\(n % 7)", value: Double(n), at: t0.addingTimeInterval(Double(n)),
                                          samples: [Double(n)], flags: nil))
            }
        }
        let large = try engineC.makeDelta(for: nil)

        // The sites as every run names them, here and in the counters' site lists.
        let sites = [a.siteID: Self.siteA, b.siteID: Self.siteB, c.siteID: Self.siteC]
        func canonical(_ name: String, _ delta: Delta) -> FuzzBase {
            var d = delta
            d.source = sites[d.source] ?? d.source
            d.created = t0
            d.entries = d.entries.map { Self.renamingSites($0, sites) }
            return FuzzBase(name: name, delta: d, bytes: d.encoded(key: key))
        }
        let initial = canonical("first", first)
        self.initial = initial
        bases = [initial, canonical("second", second), canonical("full", full), canonical("fromB", fromB)]
        self.large = canonical("large", large)
        var slices: [FuzzBase] = []
        for base in bases where base.name != "first" {
            for start in stride(from: 0, to: base.delta.entries.count, by: 2) {
                var d = base.delta
                let end = min(d.entries.count, start + 1 + start % 4)
                d.entries = Array(d.entries[start..<end])
                slices.append(FuzzBase(name: "\(base.name)[\(start)..<\(end)]", delta: d, bytes: d.encoded(key: key)))
            }
        }
        self.slices = slices
        withExtendedLifetime(dir) {}
    }

    /// `state` with every site of `sites` renamed: in versions, and in the site lists of counters.
    static func renamingSites(_ state: RecordState, _ sites: [RecordID: RecordID]) -> RecordState {
        func rename(_ v: Version?) -> Version? { v.map { Version(clock: $0.clock, site: sites[$0.site] ?? $0.site) } }
        var s = state
        s.incarnation = rename(s.incarnation)
        s.tombstone = rename(s.tombstone)
        for (name, field) in s.fields {
            var value = field.value
            if case .map(var counter) = value, case .map(let perSite)? = counter["sites"] {
                var renamed: [String: FieldValue] = [:]
                for (site, totals) in perSite {
                    let id = RecordID(string: site).flatMap { sites[$0] }
                    renamed[id?.description ?? site] = totals
                }
                counter["sites"] = .map(renamed)
                value = .map(counter)
            }
            s.fields[name] = FieldState(value: value, version: rename(field.version)!)
        }
        return s
    }
}
