import Foundation
import StashLMDB
import Testing
import StashTestSupport

@Suite struct ReaderConcurrencyTests {
    /// A read that finds every reader slot taken says how many there are and how many idle
    /// ones this process keeps (it said "up to 8" whatever maxReaders was).
    @Test func aFullReaderTableIsReportedWithItsSize() throws {
        let dir = TemporaryDirectory()
        var config = EnvironmentConfiguration(databases: [DatabaseSpec("main")], durability: .none)
        config.maxReaders = 4
        let env = try Environment.open(path: dir.path, configuration: config)
        let holding = DispatchSemaphore(value: 0)
        let release = DispatchSemaphore(value: 0)
        let failures = Failures()
        let done = DispatchGroup()
        for _ in 0..<4 {
            done.enter()
            Thread {
                do { try env.read { _ in holding.signal(); release.wait() } } catch { failures.add("holder: \(error)"); holding.signal() }
                done.leave()
            }.start()
        }
        for _ in 0..<4 { holding.wait() }
        let error = #expect(throws: LMDBError.self) { try env.read { _ in } }
        for _ in 0..<4 { release.signal() }
        done.wait()
        #expect(failures.all.isEmpty, "\(failures.all)")
        #expect(error?.code == .readersFull)
        let message = "\(error.map { "\($0)" } ?? "")"
        #expect(message.contains("all 4 reader slots"), "\(message)")
        #expect(message.contains("up to 1 here"), "\(message)")
        #expect(message.contains("StoreOptions.maxReaders"), "\(message)")
        // Once the reads end, reading works again.
        #expect(throws: Never.self) { try env.read { _ in } }
    }

    /// One writer commits generations: every key of a generation gets the same value and the
    /// `generation` key names it. Readers on other threads must always see one whole
    /// generation (a consistent snapshot), and never an older one than they saw before.
    @Test func readersSeeWholeSnapshotsWhileOneWriterCommits() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let main = try env.database("main")
        let dups = try env.database("dups")
        let keys = 50
        try env.write { txn throws in
            for k in 0..<keys { try txn.put(main, key: b("key\(k)"), value: b("0")) }
            try txn.put(main, key: b("generation"), value: b("0"))
        }
        let generations = 150
        let failures = Failures()
        let done = DoneFlag()
        let readCounts = Failures()
        onThreads(6) { thread in
            if thread == 0 {
                defer { done.set() }
                do {
                    for g in 1...generations {
                        try env.write { txn throws in
                            for k in 0..<keys { try txn.put(main, key: b("key\(k)"), value: b(String(g))) }
                            try txn.put(dups, key: b("gen"), value: id16(UInt64(g)))
                            try txn.put(main, key: b("generation"), value: b(String(g)))
                        }
                    }
                } catch { failures.add("writer: \(error)") }
                return
            }
            var lastSeen = 0
            var reads = 0
            while !done.isSet || reads < 20 {
                do {
                    try env.read { txn throws in
                        let g = Int(String(decoding: try txn.get(main, key: b("generation")) ?? [], as: UTF8.self)) ?? -1
                        if g < lastSeen { failures.add("reader \(thread) went back from \(lastSeen) to \(g)") }
                        lastSeen = g
                        var n = 0
                        try txn.scan(main, prefix: b("key")) { _, value in
                            n += 1
                            if value != b(String(g)) { failures.add("reader \(thread): generation \(g) but a key holds \(String(decoding: value, as: UTF8.self))") }
                            return true
                        }
                        if n != keys { failures.add("reader \(thread): \(n) keys") }
                        let dupCount = try txn.duplicateCount(dups, key: b("gen"))
                        if dupCount != g { failures.add("reader \(thread): generation \(g) with \(dupCount) duplicates") }
                    }
                    reads += 1
                } catch { failures.add("reader \(thread): \(error)") }
            }
            readCounts.add("\(reads)")
        }
        #expect(failures.all.isEmpty, "\(failures.all.prefix(10))")
        #expect(readCounts.all.count == 5)
        try env.read { txn throws in
            #expect(try txn.get(main, key: b("generation")) == b(String(generations)))
            #expect(try txn.duplicateCount(dups, key: b("gen")) == generations)
        }
    }

    /// More concurrent readers than the handle pool keeps: extra handles are made and freed.
    @Test func manyShortReadersOnManyThreads() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let main = try env.database("main")
        try env.write { txn throws in
            for k in 0..<100 { try txn.put(main, key: b(String(format: "k%03d", k)), value: b(String(k))) }
        }
        let failures = Failures()
        onThreads(40) { thread in
            for i in 0..<50 {
                do {
                    let k = (thread * 7 + i) % 100
                    let value = try env.read { txn in try txn.get(main, key: b(String(format: "k%03d", k))) }
                    if value != b(String(k)) { failures.add("thread \(thread): k\(k) = \(String(describing: value))") }
                    // A nested read inside a read works too (two snapshots on one thread).
                    if i % 10 == 0 {
                        let total = try env.read { outer throws in
                            try env.read { inner throws in
                                try outer.statistics(main).entries + inner.statistics(main).entries
                            }
                        }
                        if total != 200 { failures.add("nested reads saw \(total)") }
                    }
                } catch { failures.add("thread \(thread): \(error)") }
            }
        }
        #expect(failures.all.isEmpty, "\(failures.all.prefix(10))")
    }

    /// A read inside a write (on the same thread) sees the last committed state, not the
    /// write's own uncommitted changes.
    @Test func readInsideWriteSeesCommittedSnapshot() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        try env.write { txn in try txn.put(main, key: b("k"), value: b("committed")) }
        try env.write { txn throws in
            try txn.put(main, key: b("k"), value: b("pending"))
            #expect(try txn.get(main, key: b("k")) == b("pending"))
            #expect(try env.read { try $0.get(main, key: b("k")) } == b("committed"))
        }
        #expect(try env.read { try $0.get(main, key: b("k")) } == b("pending"))
    }
}
