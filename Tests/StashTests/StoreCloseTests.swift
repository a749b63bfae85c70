import Foundation
import Stash
import Testing
import StashTestSupport

/// `store.close()`: later calls throw `.closed`, the LMDB environment's files are closed once
/// no open store of the directory uses them, and opening again works.
@Suite struct StoreCloseTests {
    /// This process's open file descriptors on files of `directory`.
    private func openFiles(in directory: String) -> Int {
        let canonical = URL(fileURLWithPath: directory).resolvingSymlinksInPath().path
        let fds = (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? []
        return fds.filter { fd in
            ((try? FileManager.default.destinationOfSymbolicLink(atPath: "/proc/self/fd/\(fd)")) ?? "").hasPrefix(canonical + "/")
        }.count
    }

    @Test func everyLaterCallThrowsClosedNamingTheStore() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self, Item.self])
        let home = Home(name: "h")
        try store.insert(home)
        let byHome = try store.index(\Item.homeID)
        try store.close()
        #expect(store.isClosed)
        let calls: [(String, () throws -> Void)] = [
            ("write", { try store.write { try $0.insert(Home(name: "x")) } }),
            ("insert", { try store.insert(Home(name: "x")) }),
            ("read", { _ = try store.read { try $0.count(Home.self) } }),
            ("get", { _ = try store.get(Home.self, id: home.id) }),
            ("count", { _ = try store.count(Home.self) }),
            ("count where", { _ = try store.count(Item.self, where: \.homeID, equals: home.id) }),
            ("count through a handle", { _ = try store.count(byHome, equals: home.id) }),
            ("fetch", { _ = try store.fetch(FetchDescriptor<Home>()) }),
            ("history", { _ = try store.history() }),
            ("verify", { _ = try store.verify() }),
        ]
        for (name, call) in calls {
            let error = #expect(throws: StoreError.self, "\(name)") { try call() }
            #expect(error?.code == .closed, "\(name)")
            #expect(error?.message.contains(store.path) == true, "\(name): \(error?.message ?? "")")
        }
        let asyncError = await #expect(throws: StoreError.self) { try await store.write { try $0.insert(Home(name: "x")) } }
        #expect(asyncError?.code == .closed)
        try store.close()   // twice: nothing more
    }

    /// The environment's files are closed at `close()` (no other store of the directory is
    /// open), and a new open reads what was committed.
    @Test func closeReleasesTheFilesAndOpeningAgainWorks() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        try store.insert(Home(name: "kept"))
        #expect(openFiles(in: dir.path) >= 2)   // data.mdb, lock.mdb
        try store.close()
        #expect(openFiles(in: dir.path) == 0)
        let again = try Store.open(at: dir.path, types: [Home.self])
        #expect(try again.fetch(FetchDescriptor<Home>()).map(\.name) == ["kept"])
        #expect(try again.verify().isClean)
        withExtendedLifetime(store) {}
    }

    /// A backup restored over the directory after `close()` is what the next open reads,
    /// although the closed store value is still alive (before `close()`, the open refused:
    /// the process held the replaced file).
    @Test func aDirectoryRestoredAfterCloseOpensAsItNowIs() throws {
        let dir = TemporaryDirectory()
        let path = dir.sub("store"), backup = dir.sub("backup")
        let store = try Store.open(at: path, types: [Home.self])
        try store.insert(Home(name: "in the backup"))
        try store.flush()
        try FileManager.default.copyItem(atPath: path, toPath: backup)
        try store.insert(Home(name: "after the backup"))
        let refused = #expect(throws: StoreError.self) {
            try FileManager.default.removeItem(atPath: path)
            try FileManager.default.copyItem(atPath: backup, toPath: path)
            _ = try Store.open(at: path, types: [Home.self])
        }
        #expect(refused?.message.contains("replaced") == true)
        try store.close()
        let restored = try Store.open(at: path, types: [Home.self])
        #expect(try restored.fetch(FetchDescriptor<Home>()).map(\.name) == ["in the backup"])
        withExtendedLifetime(store) {}
    }

    /// Two stores of one directory share its environment: closing one leaves the other
    /// working; the files close with the last.
    @Test func theEnvironmentClosesWithTheLastStoreOfTheDirectory() throws {
        let dir = TemporaryDirectory()
        let first = try Store.open(at: dir.path, types: [Home.self])
        let second = try Store.open(at: dir.path, types: [Home.self])
        try first.close()
        try second.insert(Home(name: "still open"))
        #expect(openFiles(in: dir.path) >= 2)
        #expect(throws: StoreError.self) { try first.count(Home.self) }
        try second.close()
        #expect(openFiles(in: dir.path) == 0)
        // A store released without close() gives its environment back the same way.
        do {
            let third = try Store.open(at: dir.path, types: [Home.self])
            #expect(try third.count(Home.self) == 1)
        }
        #expect(openFiles(in: dir.path) == 0)
    }

    /// Async writes called before `close()` finish (their callers get their results); the
    /// close waits for them.
    @Test func closeWaitsForTheAsyncWritesCalledBeforeIt() async throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        let writes = (0..<20).map { n in Task { try await store.write { tx in try tx.insert(Home(name: "\(n)")) } } }
        try await Task.sleep(for: .milliseconds(1))
        try store.close()
        var written = 0, refused = 0
        for write in writes {
            do {
                try await write.value
                written += 1
            } catch let error as StoreError where error.code == .closed {
                refused += 1   // called (queued on the pool) only after close()
            }
        }
        #expect(written + refused == 20)
        let again = try Store.open(at: dir.path, types: [Home.self])
        #expect(try again.count(Home.self) == written)
    }

    /// A close inside a read of the store would wait for itself: refused, nothing closed.
    @Test func closeInsideAReadIsRefused() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Home.self])
        try store.read { _ in
            let error = #expect(throws: StoreError.self) { try store.close() }
            #expect(error?.code == .nestedWrite)
        }
        #expect(!store.isClosed)
        try store.insert(Home(name: "fine"))
    }

    /// Closing while other threads read and write: each call either completes or throws
    /// `.closed`; nothing crashes, and what was committed is there after a new open.
    @Test func closeWhileOtherThreadsReadAndWrite() throws {
        let dir = TemporaryDirectory()
        var options = StoreOptions()
        options.durability = .none
        let store = try Store.open(at: dir.path, types: [Home.self], options: options)
        let failures = Failures()
        let committed = Tally()
        let started = Tally(), stopped = Tally()
        let closer = Thread {
            while started.value < 4 { usleep(100) }
            usleep(5_000)
            do { try store.close() } catch { failures.add("close: \(error)") }
        }
        closer.start()
        onThreads(4) { t in
            started.add()
            for n in 0..<10_000_000 {   // until the close
                do {
                    if n % 2 == 0 {
                        try store.insert(Home(name: "\(t)-\(n)"))
                        committed.add()
                    } else {
                        _ = try store.count(Home.self)
                    }
                } catch let error as StoreError where error.code == .closed {
                    stopped.add()
                    return
                } catch {
                    failures.add("\(t): \(error)")
                    return
                }
            }
        }
        while !store.isClosed { usleep(1_000) }
        #expect(failures.all.isEmpty, "\(failures.all)")
        #expect(stopped.value == 4, "every thread ran until the close stopped it")
        let again = try Store.open(at: dir.path, types: [Home.self], options: options)
        #expect(try again.count(Home.self) == committed.value)
        #expect(try again.verify().isClean)
    }
}
