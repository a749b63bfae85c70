import Foundation
import Stash
import StashSync

/// The demo's second act: two devices of one family edit concurrently and converge.
func syncStory(in directory: String, say: (String) -> Void) async throws {
    say("")
    say("== Sync: a phone and a tablet of one account, edited concurrently")
    let family = RecordID()
    func device(_ name: String) throws -> (Store, SyncEngine) {
        let store = try Store.open(at: (directory as NSString).appendingPathComponent(name), types: [DemoHome.self, DemoItem.self])
        return (store, try SyncEngine(store: store, configuration: SyncConfiguration(family: family)))
    }
    let (phone, phoneSync) = try device("phone")
    let (tablet, tabletSync) = try device("tablet")
    let home = DemoHome(name: "Flat", createdAt: Date())
    let lamp = DemoItem(homeID: home.id, name: "Lamp", category: "living", wearCount: 0)
    let desk = DemoItem(homeID: home.id, name: "Desk", category: "office", wearCount: 0)
    let chair = DemoItem(homeID: home.id, name: "Chair", category: "office", wearCount: 0)
    try phone.write(isolation: #isolation) { tx in
        try tx.insert(home)
        for item in [lamp, desk, chair] { try tx.insert(item) }
    }
    let first = try await phoneSync.sync(via: DirectTransport(to: tabletSync))
    say("phone → tablet: \(first)")
    say("tablet now has \(try tablet.count(DemoItem.self)) items")

    // Offline on both sides:
    try phone.update(DemoItem.self, id: lamp.id) { $0.name = "Reading lamp" }      // phone renames
    try tablet.update(DemoItem.self, id: lamp.id) { $0.wearCount = 7 }            // tablet counts uses
    try phone.update(DemoItem.self, id: desk.id) { $0.category = "study" }        // both edit one field…
    try tablet.update(DemoItem.self, id: desk.id) { $0.category = "workshop" }    // …the later write wins
    try tablet.delete(DemoItem.self, id: chair.id)                               // tablet deletes…
    try phone.update(DemoItem.self, id: chair.id) { $0.wearCount = 1 }            // …while the phone edits it
    say("offline: phone renamed the lamp, tablet counted its uses; both recategorized the desk; tablet deleted the chair the phone was editing")
    say("pending on the phone: \(try phoneSync.status(peer: tablet.siteID))")

    let second = try await phoneSync.sync(via: DirectTransport(to: tabletSync))
    say("sync: \(second)")
    for (name, store) in [("phone", phone), ("tablet", tablet)] {
        let items = try store.fetch(FetchDescriptor<DemoItem>(sortBy: [SortDescriptor(\.name)]))
        say("  \(name): " + items.map { "\($0.name) [\($0.category), worn \($0.wearCount)]" }.joined(separator: "; "))
    }
    let converged = try phone.fetch(FetchDescriptor<DemoItem>(sortBy: [SortDescriptor(\.name)])).map(\.name)
        == tablet.fetch(FetchDescriptor<DemoItem>(sortBy: [SortDescriptor(\.name)])).map(\.name)
    say("converged: \(converged ? "yes" : "NO"); both edits to the lamp survived; the delete won over the concurrent edit")
    say("phone status: \(try phoneSync.status(peer: tablet.siteID)); verify phone: \(try phone.verify().isClean ? "clean" : "PROBLEMS"), tablet: \(try tablet.verify().isClean ? "clean" : "PROBLEMS")")
}
