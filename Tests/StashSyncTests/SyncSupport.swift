import Foundation
import Stash
import StashSync
import Testing
import StashTestSupport

struct Note: Record, Equatable {
    var id = RecordID()
    var title: String
    var body: String
    var pinned = false
    var tag: String?
    static let indexes: [RecordIndex<Note>] = [.index(\.pinned)]
}

/// ``Note`` as an older app version declares it: no `tag`.
struct NoteWithoutTag: Record, Equatable {
    static var recordType: String { "Note" }
    var id = RecordID()
    var title: String
    var body: String
    var pinned = false
    static let indexes: [RecordIndex<NoteWithoutTag>] = [.index(\.pinned)]
}

/// A memo as a first app version stores it.
struct Memo: Record, Equatable {
    var id = RecordID()
    var title: String
}

/// The next version: `starred`, false for memos stored before it.
struct MemoStarred: Record, Equatable {
    static var recordType: String { "Memo" }
    var id = RecordID()
    var title: String
    var starred: Bool
    static var fieldDefaults: [String: FieldValue] { ["starred": .bool(false)] }
}

/// A label whose color reads "blue" for labels stored before it existed, and may be cleared.
struct Label: Record, Equatable {
    var id = RecordID()
    var text: String
    var color: String?
    static var fieldDefaults: [String: FieldValue] { ["color": .string("blue")] }
}

struct Wallet: Record, Equatable {
    var id = RecordID()
    var credits = Counter()
}

/// ``Wallet`` as an app version that merges `credits` as a plain map, not as a counter: a
/// delta whose source merges it as a counter cannot merge here (the stores would never agree
/// on the value), and waits, parked, until this app declares it as the source does.
struct PlainWallet: Record, Equatable {
    static var recordType: String { "Wallet" }
    var id = RecordID()
    var credits: [String: [String: Counter.Totals]]?
}

/// ``Note`` as an app version that requires a `priority` (no default): a note from a version
/// without it cannot be stored here, so a delta holding one waits, parked.
struct NoteRequiringPriority: Record, Equatable {
    static var recordType: String { "Note" }
    var id = RecordID()
    var title: String
    var body: String
    var pinned = false
    var tag: String?
    var priority: Int
}

struct UserProfile: Record, Equatable {
    var id = RecordID()
    var kind = "profile"
    var displayName: String
    static let indexes: [RecordIndex<UserProfile>] = [.unique(\.kind)]
}

/// A setting whose value is any JSON.
struct Setting: Record, Equatable {
    var id = RecordID()
    var value: JSONValue
}

/// Never leaves the device.
struct DeviceSecret: Record, Equatable {
    var id = RecordID()
    var value: String
    static let isLocalOnly = true
}

let syncTypes: [any Record.Type] = [Note.self, Wallet.self, UserProfile.self, DeviceSecret.self]

/// A settable wall clock for simulated devices.
final class TestClock: @unchecked Sendable {
    private let lock = NSLock()
    private var offset: TimeInterval
    init(offset: TimeInterval = 0) { self.offset = offset }
    func advance(_ seconds: TimeInterval) { lock.lock(); offset += seconds; lock.unlock() }
    var now: Date { lock.lock(); defer { lock.unlock() }; return Date().addingTimeInterval(offset) }
}

/// One simulated device: a store directory and its engine.
struct Device {
    let path: String
    let store: Store
    let engine: SyncEngine

    static func open(_ path: String, family: RecordID, key: SyncKey? = nil, clock: TestClock? = nil,
                     enabled: Bool? = nil, types: [any Record.Type] = syncTypes) throws -> Device {
        var options = StoreOptions()
        options.durability = .none     // throwaway test stores
        if let clock { options.clock = { clock.now } }
        let store = try Store.open(at: path, types: types, options: options)
        let engine = try SyncEngine(store: store, configuration: SyncConfiguration(family: family, key: key, enabled: enabled))
        return Device(path: path, store: store, engine: engine)
    }

    /// Both ways, directly.
    @discardableResult
    func sync(with other: Device) async throws -> SyncReport {
        try await engine.sync(via: DirectTransport(to: other.engine))
    }
}

/// A canonical dump of the synced types: sorted records with their field values (versions
/// may legitimately differ; values may not).
func canonicalDump(_ store: Store, types: [String] = ["Note", "Wallet", "UserProfile"]) throws -> [String] {
    try store.read { snapshot in
        var lines: [String] = []
        for type in types {
            try snapshot.forEachRecord(typeNamed: type) { record in
                lines.append("\(type) \(record.id) \(JSONValue.object(record.fields.mapValues(\.json)).text)")
                return true
            }
        }
        return lines.sorted()
    }
}

/// Total of a wallet's counter as this store sees it.
func credits(_ store: Store, _ id: RecordID) throws -> Int64? {
    try store.get(Wallet.self, id: id)?.credits.value
}

/// A relay that notes, for each fetch through it, whether it ran inside a Swift task (on a
/// thread of the concurrency pool).
final class ThreadRecordingTransport: SyncTransport, @unchecked Sendable {
    let relay: RelayTransport
    private let lock = NSLock()
    private var inTask: [Bool] = []
    private var names: [String] = []
    init(_ relay: RelayTransport) { self.relay = relay }

    /// The OS name of the thread of each fetch (Linux: `/proc/thread-self/comm`).
    var fetchThreadNames: [String] {
        lock.lock()
        defer { lock.unlock() }
        return names
    }

    var fetchesInATask: [Bool] {
        lock.lock()
        defer { lock.unlock() }
        return inTask
    }

    var peer: RecordID? { relay.peer }
    func deliver(_ data: Data, delta: Delta, from engine: SyncEngine) async throws { try await relay.deliver(data, delta: delta, from: engine) }
    func incoming(for engine: SyncEngine) async throws -> [IncomingDelta] {
        note(inTask: withUnsafeCurrentTask { $0 != nil },
             name: (try? String(contentsOfFile: "/proc/thread-self/comm", encoding: .utf8))?.trimmingCharacters(in: .newlines) ?? "?")
        return try await relay.incoming(for: engine)
    }
    private func note(inTask task: Bool, name: String) {
        lock.lock()
        inTask.append(task)
        names.append(name)
        lock.unlock()
    }
    func fullSnapshotRequested(by engine: SyncEngine) async throws -> Bool { try await relay.fullSnapshotRequested(by: engine) }
    func requestFullSnapshot(from source: RecordID, for engine: SyncEngine) async throws { try await relay.requestFullSnapshot(from: source, for: engine) }
    func watermarkSite(for engine: SyncEngine) async throws -> String { try await relay.watermarkSite(for: engine) }
}
