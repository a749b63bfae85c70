import ArgumentParser
import Foundation
import Stash

/// The demo's record types: the home-inventory app from the design.
struct DemoHome: Record {
    static let recordType = "Home"
    var id = RecordID()
    var name: String
    var createdAt: Date
}

struct DemoItem: Record {
    static let recordType = "Item"
    var id = RecordID()
    var homeID: RecordID
    var name: String
    var category: String
    var wearCount: Int
    static let indexes: [RecordIndex<DemoItem>] = [.index(\.homeID), .index(\.homeID, \.category), .index(\.wearCount)]
}

struct Demo: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Run the built-in story on a store in a temporary directory and print what happens.")

    @Option(help: "Use this directory instead of a temporary one (kept afterwards).") var directory: String?
    @Option(help: "Items in the first home (each further home gets 5 more).") var items: Int = 40

    func validate() throws {
        guard (0...1_000_000).contains(items) else { throw ValidationError("--items must be 0...1000000, not \(items)") }
    }

    func run() async throws {
        try await runCommand {
            let temporary = directory == nil
            if let directory { try requireNewOrEmptyDirectory(directory) }
            let path = directory ?? FileManager.default.temporaryDirectory
                .appendingPathComponent("stash-demo-\(UUID().uuidString.prefix(8))").path
            defer { if temporary { try? FileManager.default.removeItem(atPath: path) } }
            try await story(path)
        }
    }

    private func story(_ path: String) async throws {
        func say(_ text: String) { printLine(text) }
        say("== Stash demo: a home-inventory store in \(path)")
        let store = try Store.open(at: path, types: [DemoHome.self, DemoItem.self])
        let now = Date()
        let homes = ["Flat", "Cabin", "Studio"].map { DemoHome(name: $0, createdAt: now) }
        let categories = ["kitchen", "tools", "books", "garden"]
        try store.write(author: "demo", isolation: #isolation) { tx in
            for (h, home) in homes.enumerated() {
                try tx.insert(home)
                for i in 0..<(items + h * 5) {
                    try tx.insert(DemoItem(homeID: home.id, name: "\(home.name) item \(i)",
                                           category: categories[i % categories.count], wearCount: (i * 7) % 23))
                }
            }
        }
        say("loaded \(try store.count(DemoHome.self)) homes and \(try store.count(DemoItem.self)) items in one transaction")

        let byHome = try store.index(\DemoItem.homeID)
        for home in homes {
            say("  \(home.name): \(try store.count(byHome, equals: home.id)) items (O(1): one mdb_cursor_count)")
        }

        let flat = homes[0].id
        let query = FetchDescriptor<DemoItem>(
            predicate: #Predicate { $0.homeID == flat && $0.category == "tools" && $0.wearCount > 5 },
            sortBy: [SortDescriptor(\.wearCount, order: .reverse)])
        let plan = try store.explain(query)
        let found = try store.fetch(query)
        say("query: Flat tools worn more than 5 times")
        say("  plan: \(plan)")
        say("  \(found.count) found; most worn: \(found.first.map { "\($0.name) (\($0.wearCount))" } ?? "none")")
        let worn = FetchDescriptor<DemoItem>(predicate: #Predicate { $0.wearCount >= 20 })
        say("  plan for wearCount >= 20: \(try store.explain(worn))")
        let titled = FetchDescriptor<DemoItem>(predicate: #Predicate { $0.name.contains("item 1") })
        say("  plan for name.contains(\"item 1\"): \(try store.explain(titled)) → \(try store.fetchCount(titled)) found")

        if let first = found.first {
            try store.update(DemoItem.self, id: first.id) { $0.wearCount += 1 }
            say("updated \(first.name): wearCount \(first.wearCount) → \(first.wearCount + 1)")
        }
        let cabinItems = try store.fetch(FetchDescriptor<DemoItem>(predicate: #Predicate { $0.homeID == flat }))
        try store.write(author: "demo", isolation: #isolation) { tx in
            for item in cabinItems.prefix(3) { try tx.delete(DemoItem.self, id: item.id) }
        }
        say("deleted 3 Flat items: Flat now has \(try store.count(byHome, equals: flat)) items, \(try store.count(DemoItem.self)) in all")

        let report = try store.verify()
        say("verify: \(report)")
        let history = try store.history()
        say("history: \(history.count) committed transactions")
        for entry in history {
            let ops = Dictionary(grouping: entry.changes, by: { "\($0.operation)" }).map { "\($1.count) \($0)" }.sorted().joined(separator: ", ")
            say("  #\(entry.sequence) by \(entry.author ?? "-"): \(ops)")
        }
        let stats = try store.statistics()
        say("store file: \(stats.fileSize / 1024) KiB, map \(stats.mapUsed / 1024) KiB used")
        try await syncStory(in: path, say: say)
        try await gatingStory(in: (path as NSString).appendingPathComponent("gating"), say: say)
    }
}

/// Refuses a directory that holds anything, or a file: the demos write stores and records,
/// never into the user's data.
func requireNewOrEmptyDirectory(_ directory: String) throws {
    var isDirectory: ObjCBool = false
    guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory) else { return }
    guard isDirectory.boolValue else {
        throw CommandFailure(message: "\(directory) is a file; give the demo a new or empty directory")
    }
    if let contents = try? FileManager.default.contentsOfDirectory(atPath: directory), !contents.isEmpty {
        throw CommandFailure(message: "\(directory) is not empty; give the demo a new or empty directory")
    }
}
