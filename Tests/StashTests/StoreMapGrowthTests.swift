import Foundation
import Stash
import Testing
import StashTestSupport

struct Blob: Record, Equatable {
    var id = RecordID()
    var owner: RecordID
    var part: Int
    var payload: Data
    static let indexes: [RecordIndex<Blob>] = [.index(\.owner)]
}

@Suite struct StoreMapGrowthTests {
    /// A 1 MiB initial map still takes 200 MB of records. Write closures rerun while the map
    /// grows; counts, indexes and history must still count every record and transaction once.
    @Test func tinyInitialMapStores200MBOfRecords() throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.initialMapSize = 1 << 20
        options.durability = .none
        let store = try Store.open(at: dir.path, types: [Blob.self], options: options)
        let owners = (0..<4).map { _ in RecordID() }
        let payloadSize = 100_000
        let transactions = 20, perTransaction = 100
        var runs = 0
        var ids: [RecordID] = []
        for t in 0..<transactions {
            var batch: [Blob] = []
            for i in 0..<perTransaction {
                let n = t * perTransaction + i
                var payload = Data(repeating: UInt8(truncatingIfNeeded: n), count: payloadSize)
                payload[0] = UInt8(t)
                batch.append(Blob(owner: owners[n % owners.count], part: n, payload: payload))
            }
            try store.write { tx in
                runs += 1
                for blob in batch { try tx.insert(blob) }
            }
            ids += batch.map(\.id)
        }
        #expect(runs > transactions, "the map had to grow (closures ran \(runs) times for \(transactions) transactions)")
        let stats = try store.statistics()
        #expect(stats.mapSize >= transactions * perTransaction * payloadSize, "map \(stats.mapSize)")
        #expect(try store.count(Blob.self) == transactions * perTransaction)
        for owner in owners {
            #expect(try store.count(Blob.self, where: \.owner, equals: owner) == transactions * perTransaction / owners.count)
        }
        #expect(try store.history().count == transactions, "one history entry per committed transaction, reruns included")
        for n in [0, 1, 999, 1999] {
            let blob = try #require(try store.get(Blob.self, id: ids[n]))
            #expect(blob.part == n)
            #expect(blob.payload.count == payloadSize)
            #expect(blob.payload[0] == UInt8(n / perTransaction))
            #expect(blob.payload[payloadSize - 1] == UInt8(truncatingIfNeeded: n))
        }
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
    }

    /// `afterCommit` actions run once per committed write, after the commit, on the caller's
    /// thread: not for a write that throws, and not once per rerun when the map grows.
    @Test func afterCommitActionsRunOncePerCommittedWrite() throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.initialMapSize = 1 << 20
        options.durability = .none
        let store = try Store.open(at: dir.path, types: [Blob.self], options: options)
        let owner = RecordID()
        var ran: [String] = []
        #expect(throws: Rollback.self) {
            try store.write { tx in
                try tx.insert(Blob(owner: owner, part: 0, payload: Data([1])))
                tx.afterCommit { ran.append("rolled back") }
                throw Rollback()
            }
        }
        var runs = 0
        try store.write { tx in
            runs += 1
            for part in 0..<40 { try tx.insert(Blob(owner: owner, part: part, payload: Data(count: 100_000))) }
            tx.afterCommit { ran.append("committed, count \((try? store.count(Blob.self)) ?? -1)") }
        }
        #expect(runs > 1, "the map had to grow")
        #expect(ran == ["committed, count 40"], "\(ran)")
    }
}
