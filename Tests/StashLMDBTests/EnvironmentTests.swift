import Foundation
import StashLMDB
import Testing
import StashTestSupport

@Suite struct EnvironmentTests {
    // MARK: Basic operations

    @Test func putGetDeleteRoundTrip() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        try env.write { txn throws in
            try txn.put(main, key: b("alpha"), value: b("1"))
            try txn.put(main, key: b("beta"), value: [0, 255, 7])
            try txn.put(main, key: b("gamma"), value: [UInt8]())
        }
        try env.read { txn throws in
            #expect(try txn.get(main, key: b("alpha")) == b("1"))
            #expect(try txn.get(main, key: b("beta")) == [0, 255, 7])
            #expect(try txn.get(main, key: b("gamma")) == [])
            #expect(try txn.get(main, key: b("delta")) == nil)
            #expect(try txn.contains(main, key: b("gamma")))
            #expect(try !txn.contains(main, key: b("delta")))
            #expect(try txn.statistics(main).entries == 3)
        }
        // Replace, then delete; a second delete reports that nothing was there.
        try env.write { txn throws in
            try txn.put(main, key: b("alpha"), value: b("2"))
            #expect(try txn.get(main, key: b("alpha")) == b("2"), "a write transaction reads its own writes")
            #expect(try txn.delete(main, key: b("beta")))
            #expect(try !txn.delete(main, key: b("beta")))
        }
        try env.read { txn throws in
            #expect(try txn.get(main, key: b("alpha")) == b("2"))
            #expect(try txn.get(main, key: b("beta")) == nil)
            #expect(try txn.statistics(main).entries == 2)
        }
        // noOverwrite refuses an existing key with keyExists.
        do {
            try env.write { txn in try txn.put(main, key: b("alpha"), value: b("3"), flags: .noOverwrite) }
            Issue.record("noOverwrite put of an existing key succeeded")
        } catch let error as LMDBError {
            #expect(error.code == .keyExists)
        }
        #expect(try env.read { try $0.get(main, key: b("alpha")) } == b("2"))
        // removeAll empties the database; the handle stays usable.
        try env.write { txn in try txn.removeAll(main) }
        try env.write { txn in try txn.put(main, key: b("again"), value: b("x")) }
        try env.read { txn throws in
            #expect(try txn.statistics(main).entries == 1)
            #expect(try txn.get(main, key: b("again")) == b("x"))
        }
    }

    /// The data file's identity stays with the file (a reopen) and differs for a copy; a
    /// missing birth time (a sandbox refusing `statx`) matches on the inode alone.
    @Test func dataFileIdentityTellsAFileFromItsCopy() throws {
        let dir = TemporaryDirectory()
        let first = try openEnvironment(dir.sub("a")).dataFileIdentity()
        #expect(try openEnvironment(dir.sub("a")).dataFileIdentity() == first)
        try FileManager.default.copyItem(atPath: dir.sub("a"), toPath: dir.sub("b"))
        let copy = try openEnvironment(dir.sub("b")).dataFileIdentity()
        #expect(!copy.isSameFile(as: first))

        let unknownBirth = FileIdentity(inode: first.inode, birth: nil)
        #expect(unknownBirth.isSameFile(as: first) && first.isSameFile(as: unknownBirth))
        let otherBirth = FileIdentity(inode: first.inode, birth: (first.birthSeconds + 1, 0))
        #expect(!first.hasBirth || !otherBirth.isSameFile(as: first))
        #expect(!FileIdentity(inode: first.inode &+ 1, birth: nil).isSameFile(as: first))
    }

    /// A second open of a directory this process has open shares its environment. It kept the
    /// first open's sync flags: a store opened for `.full` durability after a `.none` open of
    /// the same directory committed without syncing. The strongest durability asked for wins.
    @Test func aSecondOpenNeverGetsLessDurabilityThanItAskedFor() throws {
        let dir = TemporaryDirectory()
        let first = try Environment.open(path: dir.path, configuration: EnvironmentConfiguration(databases: [DatabaseSpec("main")], durability: .none))
        #expect(first.durability == .none)
        let second = try Environment.open(path: dir.path, configuration: EnvironmentConfiguration(durability: .relaxed))
        #expect(second.durability == .relaxed && first.durability == .relaxed)
        let third = try Environment.open(path: dir.path, configuration: EnvironmentConfiguration(durability: .full))
        #expect(third.durability == .full)
        let fourth = try Environment.open(path: dir.path, configuration: EnvironmentConfiguration(durability: .none))
        #expect(fourth.durability == .full, "never lowered")
        let main = try fourth.database("main")
        try fourth.write { txn in try txn.put(main, key: [1], value: [2]) }
        #expect(try first.read { try $0.get(main, key: [1]) } == [2])
    }

    @Test func dataSurvivesReopen() throws {
        let dir = TemporaryDirectory()
        do {
            let env = try openEnvironment(dir.path)
            let main = try env.database("main")
            try env.write { txn throws in
                for i in 0..<100 { try txn.put(main, key: b("k\(i)"), value: b("v\(i)")) }
            }
        }
        // The last reference is gone: the registry closed the environment; a new open reads the file.
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        try env.read { txn throws in
            #expect(try txn.statistics(main).entries == 100)
            for i in 0..<100 { #expect(try txn.get(main, key: b("k\(i)")) == b("v\(i)")) }
        }
    }

    @Test func unknownDatabaseIsATypedError() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        do {
            _ = try env.database("nope")
            Issue.record("an undeclared database was returned")
        } catch {
            #expect(error.code == .unknownDatabase)
            #expect(error.description.contains(env.path))
            #expect(error.description.contains("nope"))
        }
    }

    // MARK: DUPSORT

    @Test func duplicateSortOperations() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let dups = try env.database("dups")
        let values = [id16(5), id16(1), id16(3), id16(2), id16(4)]
        try env.write { txn throws in
            for v in values { try txn.put(dups, key: b("k"), value: v) }
            try txn.put(dups, key: b("k"), value: id16(3))   // the same pair again: still one
            try txn.put(dups, key: b("other"), value: id16(9))
        }
        try env.read { txn throws in
            #expect(try txn.duplicateCount(dups, key: b("k")) == 5)
            #expect(try txn.duplicateCount(dups, key: b("other")) == 1)
            #expect(try txn.duplicateCount(dups, key: b("missing")) == 0)
            #expect(try txn.containsDuplicate(dups, key: b("k"), value: id16(4)))
            #expect(try !txn.containsDuplicate(dups, key: b("k"), value: id16(9)))
            #expect(try !txn.containsDuplicate(dups, key: b("missing"), value: id16(1)))
            var seen: [[UInt8]] = []
            try txn.forEachDuplicate(dups, key: b("k")) { seen.append($0); return true }
            #expect(seen == (1...5).map { id16(UInt64($0)) }, "duplicates come back sorted")
            var firstTwo: [[UInt8]] = []
            try txn.forEachDuplicate(dups, key: b("k")) { firstTwo.append($0); return firstTwo.count < 2 }
            #expect(firstTwo == [id16(1), id16(2)], "returning false stops the walk")
            var none = 0
            try txn.forEachDuplicate(dups, key: b("missing")) { _ in none += 1; return true }
            #expect(none == 0)
            // get on a DUPSORT database is the first duplicate.
            #expect(try txn.get(dups, key: b("k")) == id16(1))
            #expect(try txn.statistics(dups).entries == 6)
        }
        try env.write { txn throws in
            #expect(try txn.delete(dups, key: b("k"), value: id16(3)))
            #expect(try !txn.delete(dups, key: b("k"), value: id16(3)))
            #expect(try txn.duplicateCount(dups, key: b("k")) == 4)
            // Without a value, every duplicate of the key goes.
            #expect(try txn.delete(dups, key: b("other")))
        }
        try env.read { txn throws in
            #expect(try txn.duplicateCount(dups, key: b("k")) == 4)
            #expect(try txn.duplicateCount(dups, key: b("other")) == 0)
            #expect(try !txn.containsDuplicate(dups, key: b("k"), value: id16(3)))
        }
    }

    // MARK: Scans

    @Test func scansByPrefixFromKeyAndBackward() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        var rng = SeededGenerator(seed: 11)
        var expected: [String: [UInt8]] = [:]
        for group in ["a", "b", "ba", "c"] {
            for i in 0..<20 { expected["\(group)/\(String(format: "%03d", i))"] = [UInt8.random(in: 0...255, using: &rng)] }
        }
        try env.write { txn throws in
            // Insert in a shuffled order: scans must come back sorted anyway.
            for key in expected.keys.shuffled(using: &rng) { try txn.put(main, key: b(key), value: expected[key]!) }
        }
        let sortedKeys = expected.keys.sorted { b($0).lexicographicallyPrecedes(b($1)) }
        try env.read { txn throws in
            var all: [String] = []
            try txn.scan(main, from: ScanStart<[UInt8]>.first) { key, value in
                all.append(String(decoding: key, as: UTF8.self))
                #expect(value == expected[all.last!])
                return true
            }
            #expect(all == sortedKeys)

            var bOnly: [String] = []
            try txn.scan(main, prefix: b("b/")) { key, _ in bOnly.append(String(decoding: key, as: UTF8.self)); return true }
            #expect(bOnly == sortedKeys.filter { $0.hasPrefix("b/") })
            #expect(bOnly.count == 20)

            var none = 0
            try txn.scan(main, prefix: b("zz")) { _, _ in none += 1; return true }
            #expect(none == 0)

            var from: [String] = []
            try txn.scan(main, from: .atOrAfter(b("b/010"))) { key, _ in
                from.append(String(decoding: key, as: UTF8.self))
                return from.count < 15
            }
            #expect(from == Array(sortedKeys.drop { $0 < "b/010" }.prefix(15)))

            // A start key that is absent begins at the next key.
            var between: [String] = []
            try txn.scan(main, from: .atOrAfter(b("b/0105"))) { key, _ in between.append(String(decoding: key, as: UTF8.self)); return false }
            #expect(between == ["b/011"])

            var backward: [String] = []
            try txn.scanBackward(main) { key, _ in backward.append(String(decoding: key, as: UTF8.self)); return true }
            #expect(backward == sortedKeys.reversed())

            let last = try txn.last(main)
            #expect(last.map { String(decoding: $0.key, as: UTF8.self) } == sortedKeys.last)
            #expect(last?.value == expected[sortedKeys.last!])
        }
    }

    @Test func scanVisitsEveryDuplicate() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let dups = try env.database("dups")
        try env.write { txn throws in
            for k in 0..<5 { for v in 0..<7 { try txn.put(dups, key: b("key\(k)"), value: id16(UInt64(v))) } }
        }
        try env.read { txn throws in
            var pairs: [(String, [UInt8])] = []
            try txn.scan(dups, prefix: b("key")) { key, value in pairs.append((String(decoding: key, as: UTF8.self), value)); return true }
            #expect(pairs.count == 35)
            #expect(pairs.map(\.0) == (0..<5).flatMap { k in Array(repeating: "key\(k)", count: 7) })
            #expect(pairs.map(\.1) == (0..<5).flatMap { _ in (0..<7).map { id16(UInt64($0)) } })
            var backward = 0
            try txn.scanBackward(dups) { _, _ in backward += 1; return true }
            #expect(backward == 35)
        }
    }

    // MARK: Limits and errors

    @Test func keyLengthLimitIsATypedErrorNamingThePath() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        let dups = try env.database("dups")
        let maxKey = [UInt8](repeating: 7, count: LMDBLimits.maxKeySize)
        try env.write { txn in try txn.put(main, key: maxKey, value: b("fits")) }
        #expect(try env.read { try $0.get(main, key: maxKey) } == b("fits"))

        let tooLong = [UInt8](repeating: 7, count: LMDBLimits.maxKeySize + 1)
        for (operation, body) in [
            ("put", { (txn: WriteTransaction) throws -> Void in try txn.put(main, key: tooLong, value: b("x")) }),
            ("get", { txn in _ = try txn.get(main, key: tooLong) }),
            ("delete", { txn in try txn.delete(main, key: tooLong) }),
            ("put duplicate value", { txn in try txn.put(dups, key: b("k"), value: tooLong) }),
        ] as [(String, (WriteTransaction) throws -> Void)] {
            do {
                try env.write { txn in try body(txn) }
                Issue.record("\(operation) with a \(tooLong.count)-byte key succeeded")
            } catch let error as LMDBError {
                #expect(error.code == .keyTooLong, "\(operation): \(error)")
                #expect(error.path == env.path)
                #expect(error.description.contains(env.path), "\(operation): \(error)")
                #expect(error.description.contains("512"), "the message gives the size: \(error)")
            }
        }
        do {
            try env.write { txn in try txn.put(main, key: [UInt8](), value: b("x")) }
            Issue.record("an empty key was accepted")
        } catch let error as LMDBError {
            #expect(error.code == .badValueSize)
        }
        // Nothing of the failed writes is there.
        try env.read { txn throws in #expect(try txn.statistics(main).entries == 1) }
        try env.read { txn throws in #expect(try txn.statistics(dups).entries == 0) }
    }

    @Test func nestedWriteOnOneThreadThrowsInsteadOfDeadlocking() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        var inner: LMDBError?
        try env.write { txn throws in
            try txn.put(main, key: b("outer"), value: b("1"))
            do {
                try env.write { inner in try inner.put(main, key: b("inner"), value: b("1")) }
            } catch let error as LMDBError {
                inner = error
            }
        }
        #expect(inner?.code == .nestedWrite)
        #expect(inner?.description.contains(env.path) == true)
        try env.read { txn throws in
            #expect(try txn.get(main, key: b("outer")) == b("1"), "the outer write still commits")
            #expect(try txn.get(main, key: b("inner")) == nil)
        }
        // The writer lock was released: later writes work.
        try env.write { txn in try txn.put(main, key: b("after"), value: b("1")) }
        #expect(try env.read { try $0.get(main, key: b("after")) } == b("1"))
        // An uncaught nested write aborts the outer one.
        #expect(throws: LMDBError.self) {
            try env.write { txn throws in
                try txn.put(main, key: b("lost"), value: b("1"))
                try env.write { _ in }
            }
        }
        #expect(try env.read { try $0.get(main, key: b("lost")) } == nil)
    }

    @Test func writersOnSeveralThreadsAreSerialized() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, durability: .none)
        let main = try env.database("main")
        let failures = Failures()
        // Each writer increments a shared counter with read-modify-write: lost updates would
        // show if two write transactions overlapped.
        onThreads(4) { _ in
            for _ in 0..<50 {
                do {
                    try env.write { txn throws in
                        let old = try txn.get(main, key: b("counter")).map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
                        try txn.put(main, key: b("counter"), value: b(String(old + 1)))
                    }
                } catch {
                    failures.add("write failed: \(error)")
                }
            }
        }
        #expect(failures.all.isEmpty, "\(failures.all)")
        #expect(try env.read { try $0.get(main, key: b("counter")) } == b("200"))
    }

    @Test func throwingWriteCommitsNothing() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        let dups = try env.database("dups")
        try env.write { txn in try txn.put(main, key: b("keep"), value: b("old")) }
        var ran = false
        #expect(throws: TestAbort.self) {
            try env.write { txn throws in
                try txn.put(main, key: b("keep"), value: b("new"))
                try txn.put(main, key: b("added"), value: b("1"))
                try txn.put(dups, key: b("k"), value: id16(1))
                #expect(try txn.delete(main, key: b("keep")))
                ran = true
                throw TestAbort()
            }
        }
        #expect(ran)
        try env.read { txn throws in
            #expect(try txn.get(main, key: b("keep")) == b("old"))
            #expect(try txn.get(main, key: b("added")) == nil)
            #expect(try txn.duplicateCount(dups, key: b("k")) == 0)
            #expect(try txn.statistics(main).entries == 1)
        }
        // The write returns its closure's value.
        let value = try env.write { txn -> Int in
            try txn.put(main, key: b("n"), value: b("1"))
            return 42
        }
        #expect(value == 42)
    }

    // MARK: Registry

    @Test func onePathOneEnvironment() throws {
        let dir = TemporaryDirectory()
        let path = dir.sub("store")
        let first = try openEnvironment(path)
        let second = try openEnvironment(path)
        #expect(first === second)
        // Other spellings of the same directory resolve to the same instance.
        let dotted = try openEnvironment(path + "/./")
        #expect(dotted === first)
        let link = dir.sub("link")
        try FileManager.default.createSymbolicLink(atPath: link, withDestinationPath: path)
        let viaLink = try openEnvironment(link)
        #expect(viaLink === first)
        #expect(first.path == viaLink.path)
        // A different directory is a different environment.
        let other = try openEnvironment(dir.sub("other"))
        #expect(other !== first)
        // Writes through one handle are seen through the other.
        let main = try first.database("main")
        try second.write { txn in try txn.put(main, key: b("shared"), value: b("1")) }
        #expect(try first.read { try $0.get(main, key: b("shared")) } == b("1"))
    }

    /// A read-only open writes nothing: no directory, no database created (a missing one is
    /// named), data.mdb unchanged. Where the files can be written, a writable open in this
    /// process shares its environment (one per directory per process). Where they cannot (here
    /// an immutable data.mdb, as on read-only media), it is `MDB_RDONLY`: reads work, writes
    /// throw `.readOnly`, and a writable open is refused while it lives.
    @Test func aReadOnlyEnvironmentWritesNothing() throws {
        let dir = TemporaryDirectory()
        let path = dir.sub("store")
        do {
            let env = try openEnvironment(path, [DatabaseSpec("main")])
            try env.write { txn in try txn.put(try env.database("main"), key: b("k"), value: b("v")) }
        }
        var config = EnvironmentConfiguration(databases: [DatabaseSpec("main")])
        config.readOnly = true
        let bytes = { try Data(contentsOf: URL(fileURLWithPath: path + "/data.mdb")) }
        let before = try bytes()
        var more = config
        more.databases.append(DatabaseSpec("added"))
        let missing = thrownError { _ = try Environment.open(path: path, configuration: more) } as? LMDBError
        #expect(missing?.code == .notFound && missing?.operation.contains("added") == true, "\(String(describing: missing))")
        #expect(thrownError { _ = try Environment.open(path: dir.sub("absent"), configuration: config) } is LMDBError)
        #expect(!FileManager.default.fileExists(atPath: dir.sub("absent")))
        do {
            let env = try Environment.open(path: path, configuration: config)
            #expect(!env.isReadOnly)
            #expect(try env.read { try $0.get(try env.database("main"), key: b("k")) } == b("v"))
            #expect(try bytes() == before, "a read-only open changed data.mdb")
            // The read-only opener asked for no durability: the writable one gets what it asks.
            let writable = try openEnvironment(path, [DatabaseSpec("main")], durability: .relaxed)
            #expect(writable === env && writable.durability == .relaxed)
        }
        // Files that cannot be written: MDB_RDONLY.
        guard makeImmutable(path + "/data.mdb", true) else { return }   // chattr needs ext4-like file systems
        defer { _ = makeImmutable(path + "/data.mdb", false) }
        do {
            let env = try Environment.open(path: path, configuration: config)
            #expect(env.isReadOnly)
            let main = try env.database("main")
            #expect(try env.read { try $0.get(main, key: b("k")) } == b("v"))
            let write = thrownError { try env.write { txn in try txn.put(main, key: b("k"), value: b("w")) } } as? LMDBError
            #expect(write?.code == .readOnly && write?.path == env.path, "\(String(describing: write))")
            try env.sync()
            let writable = thrownError { _ = try openEnvironment(path, [DatabaseSpec("main")]) } as? LMDBError
            #expect(writable?.code == .readOnly && writable?.detail?.contains("read-only") == true, "\(String(describing: writable))")
        }
        #expect(try bytes() == before)
    }

    /// `chattr +i`/`-i` (even root cannot write an immutable file); false when it fails.
    private func makeImmutable(_ file: String, _ on: Bool) -> Bool {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: "/usr/bin/chattr")
        process.arguments = [on ? "+i" : "-i", file]
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        guard (try? process.run()) != nil else { return false }
        process.waitUntilExit()
        return process.terminationStatus == 0
    }

    @Test func openingConcurrentlyFromManyThreadsYieldsOneEnvironment() throws {
        let dir = TemporaryDirectory()
        let path = dir.sub("store")
        let seen = Failures()
        let opened = OpenedEnvironments()
        onThreads(8) { _ in
            do { opened.add(try openEnvironment(path)) } catch { seen.add("\(error)") }
        }
        #expect(seen.all.isEmpty, "\(seen.all)")
        let all = opened.all
        #expect(all.count == 8)
        #expect(all.allSatisfy { $0 === all[0] })
    }

    @Test func openingAFileThatIsNotADirectoryFails() throws {
        let dir = TemporaryDirectory()
        let file = dir.sub("file")
        try Data("not a store".utf8).write(to: URL(fileURLWithPath: file))
        #expect(throws: LMDBError.self) { try openEnvironment(file) }
    }

    // MARK: Map growth

    /// Opening a directory whose write lock another process holds waits for it (the
    /// databases open in a write transaction); it held the process's registry lock meanwhile,
    /// so opens of every other directory, and closes, waited too.
    @Test func anOpenWaitingForAnotherProcessDoesNotHoldUpOtherDirectories() throws {
        let dir = TemporaryDirectory()
        let busy = dir.sub("busy")
        do { _ = try openEnvironment(busy) }
        let load = try LMDBTool.holdWriteLock(on: busy)
        defer { LMDBTool.kill(load) }
        let busyOpened = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            _ = try? openEnvironment(busy)
            busyOpened.signal()
        }
        Thread.sleep(forTimeInterval: 0.3)   // that open is waiting inside LMDB now
        let otherOpened = DispatchSemaphore(value: 0)
        Thread.detachNewThread {
            _ = try? openEnvironment(dir.sub("other"))
            otherOpened.signal()
        }
        let inTime = otherOpened.wait(timeout: .now() + 10) == .success
        #expect(inTime, "the open of another directory waited for the busy one")
        LMDBTool.kill(load)
        busyOpened.wait()
        if !inTime { otherOpened.wait() }
    }

    /// A negative (or zero) reader count trapped converting it for LMDB: refused with a message.
    @Test func impossibleLimitsAreRefusedAtOpen() throws {
        let dir = TemporaryDirectory()
        for (readers, databases) in [(-1, 16), (0, 16), (126, -1)] {
            var config = EnvironmentConfiguration(databases: [DatabaseSpec("main")])
            config.maxReaders = readers
            config.maxDatabases = databases
            let error = thrownError { _ = try Environment.open(path: dir.path, configuration: config) } as? LMDBError
            #expect(error?.code == .invalid, "\(readers) readers, \(databases) databases: \(String(describing: error))")
        }
    }

    /// A process that cannot map the grown size (an address-space limit: `ulimit -v`, a
    /// container, iOS) got an error from the resize, and LMDB had unmapped the file: the next
    /// transaction read freed memory and the process crashed. The resize is refused before
    /// LMDB unmaps anything, and the environment goes on at its size. Run in a child process
    /// (an exit test), whose address space is limited to a little more than it uses.
    @Test func aMapThatCannotGrowLeavesTheEnvironmentUsable() async {
        await #expect(processExitsWith: .success) {
            let dir = TemporaryDirectory()
            let env = try openEnvironment(dir.path, mapSize: 16 << 20, durability: .none)
            let main = try env.database("main")
            let status = try String(contentsOfFile: "/proc/self/status", encoding: .utf8)
            let kib = status.split(separator: "\n").first { $0.hasPrefix("VmSize:") }
                .flatMap { $0.split(separator: " ").dropFirst().first }.flatMap { Int($0) } ?? 0
            var limit = rlimit()
            getrlimit(Int32(RLIMIT_AS.rawValue), &limit)
            limit.rlim_cur = rlim_t(kib * 1024 + (160 << 20))
            guard kib > 0, setrlimit(Int32(RLIMIT_AS.rawValue), &limit) == 0 else { throw TestAbort() }
            var failure: LMDBError?
            for n in 0..<200 where failure == nil {
                do {
                    try env.write { txn throws in
                        try txn.put(main, key: b(String(format: "blob%04d", n)), value: [UInt8](repeating: 7, count: 4 << 20))
                    }
                } catch let error as LMDBError {
                    failure = error
                }
            }
            guard let failure, failure.code == .mapLimit else { throw TestAbort() }
            // Still usable: reads, and writes that fit.
            let first = try env.read { txn throws in try txn.get(main, key: b("blob0000")) }
            guard first?.count == 4 << 20 else { throw TestAbort() }
            try env.write { txn throws in try txn.put(main, key: b("small"), value: b("fits")) }
        }
    }

    @Test func tinyInitialMapStillStores200MB() throws {
        let dir = TemporaryDirectory()
        let oneMiB = 1 << 20
        let env = try openEnvironment(dir.path, mapSize: oneMiB, durability: .none)
        let main = try env.database("main")
        #expect(env.info().mapSize == oneMiB)
        // 200 values of 1 MiB in 10 transactions: each transaction alone is 20× the first map.
        let valueSize = oneMiB
        var runs = 0
        for batch in 0..<10 {
            try env.write { txn throws in
                runs += 1
                for i in 0..<20 {
                    let n = batch * 20 + i
                    var value = [UInt8](repeating: UInt8(truncatingIfNeeded: n), count: valueSize)
                    value[0] = UInt8(batch); value[valueSize - 1] = UInt8(i)
                    try txn.put(main, key: b(String(format: "blob%04d", n)), value: value)
                }
            }
        }
        #expect(runs > 10, "the map had to grow, so some closures ran again (ran \(runs) times)")
        let info = env.info()
        #expect(info.mapSize >= 200 * oneMiB, "map is \(info.mapSize)")
        #expect(info.usedBytes >= 200 * oneMiB)
        try env.read { txn throws in
            #expect(try txn.statistics(main).entries == 200)
            for n in [0, 1, 57, 133, 199] {
                let value = try txn.get(main, key: b(String(format: "blob%04d", n)))
                #expect(value?.count == valueSize)
                #expect(value?[0] == UInt8(n / 20))
                #expect(value?[valueSize / 2] == UInt8(truncatingIfNeeded: n))
                #expect(value?[valueSize - 1] == UInt8(n % 20))
            }
        }
        // Reopening keeps the grown map (a smaller configured size does not shrink it).
        let grown = info.mapSize
        _ = consume env
        let again = try openEnvironment(dir.path, mapSize: oneMiB, durability: .none)
        #expect(again.info().mapSize >= grown)
        #expect(try again.read { try $0.statistics(try again.database("main")).entries } == 200)
    }

    /// A closure that swallows the map-full error still gets a bigger map: the write reruns.
    @Test func swallowedMapFullStillGrowsAndReruns() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
        let main = try env.database("main")
        var attempts = 0
        var swallowed = 0
        try env.write { txn in
            attempts += 1
            do { try txn.put(main, key: b("big"), value: [UInt8](repeating: 3, count: 3 << 20)) }
            catch let error as LMDBError where error.code == .mapFull { swallowed += 1 }
            try? txn.put(main, key: b("small"), value: b("s"))
        }
        #expect(swallowed >= 1 && attempts == swallowed + 1, "attempts \(attempts), swallowed \(swallowed)")
        try env.read { txn throws in
            #expect(try txn.get(main, key: b("big"))?.count == 3 << 20, "the last run stored the value")
            #expect(try txn.get(main, key: b("small")) == b("s"))
        }
    }

    /// A write started inside a read on the same thread cannot grow the map (the thread's own
    /// snapshot keeps a transaction open). It must fail with a typed error, not hang.
    @Test func writeNeedingGrowthInsideAReadDoesNotDeadlock() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
        let main = try env.database("main")
        let big = [UInt8](repeating: 1, count: 4 << 20)
        let outcome = Failures()
        let finished = DispatchSemaphore(value: 0)
        let thread = Thread {
            do {
                try env.read { _ in
                    try env.write { txn in try txn.put(main, key: b("big"), value: big) }
                }
                outcome.add("committed")
            } catch let error as LMDBError {
                outcome.add("LMDBError \(error.code.rawValue): \(error)")
            } catch {
                outcome.add("other error: \(error)")
            }
            finished.signal()
        }
        thread.start()
        let result = finished.wait(timeout: .now() + 20)
        #expect(result == .success, "a write inside a read deadlocked while growing the map")
        guard result == .success else { return }
        let text = outcome.all.first ?? ""
        #expect(text.hasPrefix("LMDBError") || text == "committed", "\(text)")
        if text.hasPrefix("LMDBError") { #expect(text.contains(env.path), "\(text)") }
        // Outside the read, the same write grows the map and commits.
        try env.write { txn in try txn.put(main, key: b("big"), value: big) }
        #expect(try env.read { try $0.get(main, key: b("big")) }?.count == big.count)
    }

    /// A thread inside a read starts a write while another thread's write waits to grow the
    /// map for that read to end. The queued write waits for the growing one, which waits for
    /// the read: the queued write must be refused with a typed error instead, and the growing
    /// write must commit once the read ends.
    @Test func writeInsideAReadWhileAnotherThreadGrowsTheMapDoesNotDeadlock() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
        let main = try env.database("main")
        let readOpen = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        let outcomes = Failures()
        let reader = Thread {
            do {
                try env.read { _ in
                    readOpen.signal()
                    Thread.sleep(forTimeInterval: 0.3)   // the writer now waits to grow the map
                    do {
                        try env.write { txn in try txn.put(main, key: b("small"), value: b("s")) }
                        outcomes.add("reader: committed")
                    } catch let error as LMDBError {
                        outcomes.add("reader: LMDBError \(error.code == .mapFull) \(error)")
                    }
                }
            } catch { outcomes.add("reader: other error \(error)") }
            finished.signal()
        }
        let writer = Thread {
            readOpen.wait()
            do {
                try env.write { txn in try txn.put(main, key: b("big"), value: [UInt8](repeating: 2, count: 4 << 20)) }
                outcomes.add("writer: committed")
            } catch { outcomes.add("writer: \(error)") }
            finished.signal()
        }
        reader.start()
        writer.start()
        let first = finished.wait(timeout: .now() + 20)
        let second = finished.wait(timeout: .now() + 20)
        #expect(first == .success && second == .success, "a write inside a read deadlocked with a map resize: \(outcomes.all)")
        guard first == .success && second == .success else { return }
        let all = outcomes.all
        #expect(all.contains("writer: committed"), "\(all)")
        let readerOutcome = all.first { $0.hasPrefix("reader:") } ?? ""
        try env.read { txn throws in
            #expect(try txn.get(main, key: b("big"))?.count == 4 << 20)
            if readerOutcome == "reader: committed" {
                #expect(try txn.get(main, key: b("small")) == b("s"))
            } else {
                #expect(readerOutcome.hasPrefix("reader: LMDBError true") && readerOutcome.contains(env.path), "\(readerOutcome)")
                #expect(try txn.get(main, key: b("small")) == nil, "a refused write left its change")
            }
        }
    }

    /// A write from a thread inside a read joins a group with a write that needs a bigger
    /// map. Whichever thread leads the group, the other writer's change must commit (before,
    /// the group either deadlocked or failed it with the reader's error), and the write of
    /// the thread inside the read is refused without leaving its change.
    @Test func groupWithAWriteFromInsideAReadStillGrowsTheMap() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
        let main = try env.database("main")
        let slowStarted = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        let outcomes = Failures()
        let slow = Thread {
            do {
                try env.write { txn in
                    try txn.put(main, key: b("slow"), value: b("w"))
                    slowStarted.signal()
                    slowStarted.signal()
                    Thread.sleep(forTimeInterval: 0.3)   // the two others queue meanwhile
                }
            } catch { outcomes.add("slow: \(error)") }
            finished.signal()
        }
        let reader = Thread {
            slowStarted.wait()
            do {
                try env.read { _ in
                    do {
                        try env.write { txn in try txn.put(main, key: b("small"), value: b("s")) }
                        outcomes.add("reader: committed")
                    } catch let error as LMDBError where error.code == .mapFull {
                        outcomes.add("reader: refused")
                    }
                    Thread.sleep(forTimeInterval: 0.1)
                }
            } catch { outcomes.add("reader: other error \(error)") }
            finished.signal()
        }
        let grower = Thread {
            slowStarted.wait()
            Thread.sleep(forTimeInterval: 0.05)
            do {
                try env.write { txn in try txn.put(main, key: b("big"), value: [UInt8](repeating: 2, count: 4 << 20)) }
                outcomes.add("grower: committed")
            } catch { outcomes.add("grower: \(error)") }
            finished.signal()
        }
        slow.start()
        reader.start()
        grower.start()
        let results = (0..<3).map { _ in finished.wait(timeout: .now() + 20) }
        #expect(results.allSatisfy { $0 == .success }, "a group with a write from inside a read deadlocked: \(outcomes.all)")
        guard results.allSatisfy({ $0 == .success }) else { return }
        let all = outcomes.all
        #expect(all.contains("grower: committed"), "\(all)")
        #expect(all.contains("reader: committed") || all.contains("reader: refused"), "\(all)")
        try env.read { txn throws in
            #expect(try txn.get(main, key: b("slow")) == b("w"))
            #expect(try txn.get(main, key: b("big"))?.count == 4 << 20)
            #expect((try txn.get(main, key: b("small")) == b("s")) == all.contains("reader: committed"))
        }
    }

    /// A group whose shared transaction fails (here a closure reports a full transaction) runs
    /// each write alone. A write from a thread inside a read, committed alone first, kept its
    /// caller waiting until the whole group ended, while a later write of the group waited for
    /// that read to grow the map: a deadlock. Its caller is let go as soon as it commits.
    @Test func groupFallbackLetsACommittedWriteGoBeforeGrowingTheMap() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
        let main = try env.database("main")
        let slowStarted = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        let outcomes = Failures()
        let slow = Thread {
            do {
                try env.write { txn in
                    try txn.put(main, key: b("slow"), value: b("w"))
                    for _ in 0..<3 { slowStarted.signal() }
                    Thread.sleep(forTimeInterval: 0.3)   // the three others queue meanwhile
                }
            } catch { outcomes.add("slow: \(error)") }
            finished.signal()
        }
        let reader = Thread {
            slowStarted.wait()
            do {
                try env.read { _ in
                    try env.write { txn in try txn.put(main, key: b("small"), value: b("s")) }
                    outcomes.add("reader: committed")
                }
            } catch { outcomes.add("reader: \(error)") }
            finished.signal()
        }
        let failing = Thread {
            slowStarted.wait()
            Thread.sleep(forTimeInterval: 0.03)
            do {
                try env.write { _ in throw LMDBError(code: .transactionFull, operation: "test", path: env.path) }
                outcomes.add("failing: committed")
            } catch let error as LMDBError where error.code == .transactionFull {
                outcomes.add("failing: refused")
            } catch { outcomes.add("failing: \(error)") }
            finished.signal()
        }
        let grower = Thread {
            slowStarted.wait()
            Thread.sleep(forTimeInterval: 0.06)
            do {
                try env.write { txn in try txn.put(main, key: b("big"), value: [UInt8](repeating: 2, count: 4 << 20)) }
                outcomes.add("grower: committed")
            } catch { outcomes.add("grower: \(error)") }
            finished.signal()
        }
        for thread in [slow, reader, failing, grower] { thread.start() }
        let results = (0..<4).map { _ in finished.wait(timeout: .now() + 20) }
        #expect(results.allSatisfy { $0 == .success }, "the fallback of a failed group deadlocked: \(outcomes.all)")
        guard results.allSatisfy({ $0 == .success }) else { return }
        let all = outcomes.all
        #expect(all.contains("grower: committed") && all.contains("failing: refused"), "\(all)")
        #expect(all.contains("reader: committed") || all.contains { $0.hasPrefix("reader: ") && $0.contains("inside a read") }, "\(all)")
        try env.read { txn throws in
            #expect(try txn.get(main, key: b("big"))?.count == 4 << 20)
            #expect((try txn.get(main, key: b("small")) == b("s")) == all.contains("reader: committed"))
        }
    }

    /// A thread inside a read opens a nested read while another thread waits to grow the
    /// map (for that outer read to end): the nested read must not wait for the growth.
    @Test func nestedReadWhileAnotherThreadGrowsTheMapDoesNotDeadlock() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
        let main = try env.database("main")
        try env.write { txn in try txn.put(main, key: b("k"), value: b("v")) }
        let outerOpen = DispatchSemaphore(value: 0)
        let finished = DispatchSemaphore(value: 0)
        let failures = Failures()
        let reader = Thread {
            do {
                try env.read { outer in
                    outerOpen.signal()
                    Thread.sleep(forTimeInterval: 0.3)   // the writer is now waiting to grow the map
                    let nested = try env.read { inner in try inner.get(main, key: b("k")) }
                    if nested != b("v") { failures.add("nested read saw \(String(describing: nested))") }
                    if try outer.get(main, key: b("k")) != b("v") { failures.add("outer read changed") }
                }
            } catch { failures.add("reader: \(error)") }
            finished.signal()
        }
        let writer = Thread {
            outerOpen.wait()
            do {
                try env.write { txn in try txn.put(main, key: b("big"), value: [UInt8](repeating: 2, count: 4 << 20)) }
            } catch { failures.add("writer: \(error)") }
            finished.signal()
        }
        reader.start()
        writer.start()
        let first = finished.wait(timeout: .now() + 20)
        let second = finished.wait(timeout: .now() + 20)
        #expect(first == .success && second == .success, "deadlock between a nested read and a map resize")
        #expect(failures.all.isEmpty, "\(failures.all)")
        if first == .success && second == .success {
            #expect(try env.read { try $0.get(main, key: b("big")) }?.count == 4 << 20)
        }
    }

    @Test func mapGrowsWhileReadersRunOnOtherThreads() throws {
        let dir = TemporaryDirectory()
        let env = try openEnvironment(dir.path, mapSize: 1 << 20, durability: .none)
        let main = try env.database("main")
        let failures = Failures()
        let done = DoneFlag()
        onThreads(4) { i in
            if i == 0 {
                defer { done.set() }
                do {
                    for batch in 0..<12 {
                        try env.write { txn throws in
                            for j in 0..<40 {
                                try txn.put(main, key: b(String(format: "k%03d-%02d", batch, j)), value: [UInt8](repeating: UInt8(batch), count: 64 << 10))
                            }
                            try txn.put(main, key: b("batches"), value: b(String(batch + 1)))
                        }
                    }
                } catch { failures.add("writer: \(error)") }
            } else {
                while !done.isSet {
                    do {
                        try env.read { txn throws in
                            let batches = try txn.get(main, key: b("batches")).map { Int(String(decoding: $0, as: UTF8.self))! } ?? 0
                            var n = 0
                            try txn.scan(main, prefix: b("k")) { _, value in
                                n += 1
                                if value.count != 64 << 10 { failures.add("reader saw a value of \(value.count) bytes") }
                                return true
                            }
                            if n != batches * 40 { failures.add("reader saw \(n) values for \(batches) batches") }
                        }
                    } catch { failures.add("reader: \(error)") }
                }
            }
        }
        #expect(failures.all.isEmpty, "\(failures.all.prefix(5))")
        #expect(env.info().mapSize > 1 << 20)
        #expect(try env.read { try $0.statistics(main).entries } == 12 * 40 + 1)
    }
}

final class OpenedEnvironments: @unchecked Sendable {
    private let lock = NSLock()
    private var list: [Environment] = []
    func add(_ env: Environment) { lock.lock(); list.append(env); lock.unlock() }
    var all: [Environment] { lock.lock(); defer { lock.unlock() }; return list }
}

final class DoneFlag: @unchecked Sendable {
    private let lock = NSLock()
    private var value = false
    func set() { lock.lock(); value = true; lock.unlock() }
    var isSet: Bool { lock.lock(); defer { lock.unlock() }; return value }
}
