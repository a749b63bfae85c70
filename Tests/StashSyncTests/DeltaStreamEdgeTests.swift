import Crypto
import Foundation
import Stash
@testable import StashLMDB
@testable import StashSync
import Synchronization
import Testing
import StashTestSupport

/// A record of 70 optional fields, declared in the reverse of their names' order: its tags
/// run against the name order a delta lists fields in, and a record holds any subset of them.
struct Wide: Record, Equatable {
    var id = RecordID()
    var f69: String?
    var f68: Int?
    var f67: String?
    var f66: Int?
    var f65: String?
    var f64: Int?
    var f63: String?
    var f62: Int?
    var f61: String?
    var f60: Int?
    var f59: String?
    var f58: Int?
    var f57: String?
    var f56: Int?
    var f55: String?
    var f54: Int?
    var f53: String?
    var f52: Int?
    var f51: String?
    var f50: Int?
    var f49: String?
    var f48: Int?
    var f47: String?
    var f46: Int?
    var f45: String?
    var f44: Int?
    var f43: String?
    var f42: Int?
    var f41: String?
    var f40: Int?
    var f39: String?
    var f38: Int?
    var f37: String?
    var f36: Int?
    var f35: String?
    var f34: Int?
    var f33: String?
    var f32: Int?
    var f31: String?
    var f30: Int?
    var f29: String?
    var f28: Int?
    var f27: String?
    var f26: Int?
    var f25: String?
    var f24: Int?
    var f23: String?
    var f22: Int?
    var f21: String?
    var f20: Int?
    var f19: String?
    var f18: Int?
    var f17: String?
    var f16: Int?
    var f15: String?
    var f14: Int?
    var f13: String?
    var f12: Int?
    var f11: String?
    var f10: Int?
    var f09: String?
    var f08: Int?
    var f07: String?
    var f06: Int?
    var f05: String?
    var f04: Int?
    var f03: String?
    var f02: Int?
    var f01: String?
    var f00: Int?

    static var ints: [WritableKeyPath<Wide, Int?>] { [\.f00, \.f02, \.f04, \.f06, \.f08, \.f10, \.f12, \.f14, \.f16, \.f18, \.f20, \.f22, \.f24, \.f26, \.f28, \.f30, \.f32, \.f34, \.f36, \.f38, \.f40, \.f42, \.f44, \.f46, \.f48, \.f50, \.f52, \.f54, \.f56, \.f58, \.f60, \.f62, \.f64, \.f66, \.f68] }
    static var strings: [WritableKeyPath<Wide, String?>] { [\.f01, \.f03, \.f05, \.f07, \.f09, \.f11, \.f13, \.f15, \.f17, \.f19, \.f21, \.f23, \.f25, \.f27, \.f29, \.f31, \.f33, \.f35, \.f37, \.f39, \.f41, \.f43, \.f45, \.f47, \.f49, \.f51, \.f53, \.f55, \.f57, \.f59, \.f61, \.f63, \.f65, \.f67, \.f69] }

    /// Sets each field, with probability `share`, to a value from a small range (so that
    /// replicas often write equal values) or to nil.
    mutating func scramble(_ share: Double, _ rng: inout SeededGenerator) {
        for path in Self.ints where Double.random(in: 0..<1, using: &rng) < share {
            self[keyPath: path] = Bool.random(using: &rng) ? Int.random(in: 0..<4, using: &rng) : nil
        }
        for path in Self.strings where Double.random(in: 0..<1, using: &rng) < share {
            self[keyPath: path] = Bool.random(using: &rng) ? "v\(Int.random(in: 0..<4, using: &rng))" : nil
        }
    }
}

/// A record whose decoding reads its id and text only, so that the open's probe never sees
/// `extra`: the store learns that field (its schema grows) from the first record written with it.
struct Scribble: Record, Equatable {
    var id = RecordID()
    var text: String
    var extra: String?

    init(id: RecordID = RecordID(), text: String, extra: String? = nil) {
        self.id = id
        self.text = text
        self.extra = extra
    }

    enum CodingKeys: String, CodingKey { case id, text, extra }

    init(from decoder: any Decoder) throws {
        let container = try decoder.container(keyedBy: CodingKeys.self)
        id = try container.decode(RecordID.self, forKey: .id)
        text = try container.decode(String.self, forKey: .text)
        extra = nil
    }

    func encode(to encoder: any Encoder) throws {
        var container = encoder.container(keyedBy: CodingKeys.self)
        try container.encode(id, forKey: .id)
        try container.encode(text, forKey: .text)
        try container.encodeIfPresent(extra, forKey: .extra)
    }
}

/// A type whose field name holds an accented letter, precomposed (NFC) in this file: another
/// source may name it decomposed (NFD), the same name to Swift's `==`.
struct Creme: Record, Equatable {
    var id = RecordID()
    var note: String?
    var crème: String
}

/// Deltas at the edges of their reading on a thread of its own (``DeltaEntryStream``: 512
/// entries or more, a first batch of 64, then 256): an entry that cannot be read at a batch's
/// edge, a write that fails while the reader still runs, a map that grows mid-import, a rerun of
/// the import's closure that sees another schema, an import whose task is cancelled; round trips
/// of records whose field sets differ from entry to entry (a delta reuses the previous entry's
/// string numbers by position) and concurrent edits of wide records; a field named in another
/// Unicode form.
@Suite struct DeltaStreamEdgeTests {
    let family = RecordID()

    /// A store of `count` notes and the delta of all of them (no key, for any store).
    private func source(_ path: String, count: Int, body: Int = 40) throws -> (Device, Delta) {
        let a = try Device.open(path, family: family)
        try a.store.write { tx in
            for n in 0..<count {
                try tx.insert(Note(title: "note \(n)", body: String(repeating: "b", count: n % body), tag: n % 3 == 0 ? "t" : nil))
            }
        }
        let delta = try a.engine.makeDelta(for: nil)
        #expect(delta.entries.count == count)
        return (a, delta)
    }

    /// Replaces the versions entry of record `id` in the store at `path` with `value`, or
    /// deletes it (nil), behind the store's back: a damaged store.
    static func replaceVersions(of id: RecordID, in path: String, with value: [UInt8]?) throws {
        try StoredEntries.replace("versions", keyEndingWith: id.bytes, at: path, with: value)
    }

    /// `delta` with entry `index`'s title replaced by a marker, encoded, and where the marker's
    /// value starts (its kind byte, 5 for a string, then a one-byte length).
    private func marked(_ delta: Delta, at index: Int) throws -> (bytes: [UInt8], value: Int) {
        var delta = delta
        let marker = "marker of entry \(index) ".padding(toLength: 40, withPad: "#", startingAt: 0)
        let title = try #require(delta.entries[index].fields["title"])
        delta.entries[index].fields["title"] = FieldState(value: .string(marker), version: title.version)
        let bytes = [UInt8](delta.encoded())
        let needle = Array(marker.utf8)
        let at = try #require((0...(bytes.count - needle.count)).first { bytes[$0..<($0 + needle.count)].elementsEqual(needle) })
        #expect(bytes[at - 2] == 5 && bytes[at - 1] == UInt8(needle.count), "the marker is not stored as a string value")
        return (bytes, at - 2)
    }

    /// `bytes` (an encoded delta without HMAC) with a checksum made for them.
    private func sealed(_ bytes: some Sequence<UInt8>) -> Data {
        var sealed = Array(bytes)
        sealed.append(contentsOf: SHA256.hash(data: sealed))
        return Data(sealed)
    }

    /// An entry that cannot be read, at either edge of every batch and of the streaming
    /// threshold, and at the last entry: the import fails naming the delta and what is wrong,
    /// and applies nothing (records, history, watermark); the intact delta then applies in
    /// full. A delta cut short in transit fails its checksum, one cut by its writer (sealed
    /// after the cut) is unreadable: both apply nothing either.
    @Test func anUnreadableEntryAtABatchEdgeAppliesNothing() throws {
        let dir = TemporaryDirectory()
        let (a, full) = try source(dir.sub("a"), count: 1_500)
        let cases: [(count: Int, bad: [Int])] = [
            (600, [0, 63, 64, 65, 319, 320, 511, 512, 513, 599]),
            (512, [0, 511]),
            (513, [512]),
            (511, [0, 510]),     // below the threshold: read whole before the merge
            (1_500, [575, 576, 1_499]),
        ]
        let everything = try canonicalDump(a.store)
        for (count, bad) in cases {
            var delta = full
            delta.entries = Array(full.entries.prefix(count))
            let ids = Set(delta.entries.map { "\($0.id)" })
            for index in bad {
                let context = "\(count) entries, entry \(index)"
                let b = try Device.open(dir.sub("b-\(count)-\(index)"), family: family)
                try b.store.insert(Note(title: "b's own", body: ""))
                let before = try canonicalDump(b.store)
                let historyBefore = try b.store.history().count
                let peersBefore = try b.engine.peers().map { "\($0.site) \($0.receivedThrough)" }

                let (bytes, value) = try marked(delta, at: index)
                var unknownKind = Array(bytes.dropLast(32))
                unknownKind[value] = 0xEE
                let attempts: [(String, Data, SyncError.Code, String)] = [
                    ("unknown kind", sealed(unknownKind), .unreadableDelta, "unknown value kind 238"),
                    ("cut by its writer", sealed(bytes[..<(value + 12)]), .unreadableDelta, "cannot read it"),
                    ("cut in transit", Data(bytes[..<(value + 12)]), .corruptDelta, "checksum mismatch"),
                ]
                for (what, data, code, message) in attempts {
                    let name = "edge-\(count)-\(index).delta"
                    do {
                        let outcome = try b.engine.apply(data, name: name)
                        Issue.record("\(context), \(what): applied (\(outcome))")
                    } catch let error as SyncError {
                        #expect(error.code == code, "\(context), \(what): \(error)")
                        #expect(error.message.contains(name) && error.message.contains(message), "\(context), \(what): \(error)")
                    }
                    #expect(try canonicalDump(b.store) == before, "\(context), \(what)")
                    #expect(try b.store.history().count == historyBefore, "\(context), \(what)")
                    #expect(try b.engine.peers().map { "\($0.site) \($0.receivedThrough)" } == peersBefore, "\(context), \(what)")
                }

                #expect(try b.engine.apply(delta.encoded()) == .applied(entries: count, changed: count), "\(context)")
                let mine = try canonicalDump(b.store).filter { !$0.contains("b's own") }
                #expect(mine == everything.filter { line in ids.contains { line.contains($0) } }, "\(context)")
            }
        }
    }

    /// An entry naming one field twice (only a faulty or hostile writer makes one: the
    /// encoder names each field once) was read with the last value winning, silently. It is
    /// unreadable now, naming the field and the record, and nothing of the delta applies.
    @Test func anEntryNamingAFieldTwiceIsUnreadable() throws {
        let dir = TemporaryDirectory()
        let (_, full) = try source(dir.sub("a"), count: 3)
        var delta = full
        // A field whose name differs from `title` in its last letter: renamed in the string
        // table afterwards, the entry names `title` twice.
        let title = try #require(delta.entries[1].fields["title"])
        delta.entries[1].fields["titlf"] = FieldState(value: .string("second value"), version: title.version)
        var bytes = Array([UInt8](delta.encoded()).dropLast(32))
        let needle = Array("titlf".utf8)
        let at = try #require((0...(bytes.count - needle.count)).first { bytes[$0..<($0 + needle.count)].elementsEqual(needle) })
        bytes[at + 4] = UInt8(ascii: "e")
        let b = try Device.open(dir.sub("b"), family: family)
        let before = try canonicalDump(b.store)
        do {
            let outcome = try b.engine.apply(sealed(bytes), name: "twice.delta")
            Issue.record("applied (\(outcome))")
        } catch let error as SyncError {
            #expect(error.code == .unreadableDelta, "\(error)")
            #expect(error.message.contains("twice.delta") && error.message.contains("field 'title' named twice in Note \(delta.entries[1].id)"), "\(error)")
        }
        #expect(try canonicalDump(b.store) == before)
        #expect(try b.engine.peers().isEmpty)
    }

    /// The reader hands its batches over in order, the first of 64 entries and then 256, and
    /// they are the entries a whole read gives, at the counts around those edges.
    @Test func theReaderHandsOverEveryEntryInBatchesOf64Then256() throws {
        let dir = TemporaryDirectory()
        let (_, full) = try source(dir.sub("a"), count: 700)
        for count in [0, 1, 63, 64, 65, 320, 321, 576, 577, 700] {
            var delta = full
            delta.entries = Array(full.entries.prefix(count))
            let data = delta.encoded()
            let stream = DeltaEntryStream(try DeltaReader(data, key: nil, name: "d"))
            var sizes: [Int] = []
            var entries: [RecordState] = []
            while let batch = try stream.nextBatch() {
                sizes.append(batch.count)
                entries.append(contentsOf: batch)
            }
            #expect(try stream.nextBatch() == nil, "\(count): the end is not kept")
            let (rest, counters) = try stream.rest()
            stream.stop()
            var expected: [Int] = count > 0 ? [min(count, DeltaEntryStream.firstBatchSize)] : []
            var left = count - (expected.first ?? 0)
            while left > 0 { expected.append(min(left, DeltaEntryStream.batchSize)); left -= expected.last! }
            #expect(sizes == expected, "\(count) entries")
            #expect(entries == delta.entries, "\(count) entries")
            #expect(rest.isEmpty && counters == delta.counterFields, "\(count) entries")
        }
    }

    /// A write that fails while the reader still runs (a record here whose versions cannot be
    /// read, met at entry 700 of 1,500) fails the import with the store's error: nothing of the
    /// delta stays and the watermark does not move.
    @Test func aMergeThatFailsMidStreamAppliesNothing() throws {
        let dir = TemporaryDirectory()
        let (a, first) = try source(dir.sub("a"), count: 1_500)
        let b = try Device.open(dir.sub("b"), family: family)
        #expect(try b.engine.apply(first.encoded()) == .applied(entries: 1_500, changed: 1_500))
        try a.store.write { tx in
            for entry in first.entries { try tx.update(Note.self, id: entry.id) { $0.pinned = true } }
        }
        let second = try a.engine.makeDelta(for: nil)
        #expect(second.entries.count == 1_500)
        let victim = second.entries[700].id
        // The victim's versions entry, damaged in place (unknown versions format).
        try Self.replaceVersions(of: victim, in: b.path, with: [0xFF])
        let before = try canonicalDump(b.store)
        let historyBefore = try b.store.history().count
        let peersBefore = try b.engine.peers().map { "\($0.site) \($0.receivedThrough)" }
        let error = thrownError { _ = try b.engine.apply(second.encoded()) }
        let storeError = try #require(error as? StoreError, "\(String(describing: error))")
        #expect(storeError.code == .corrupted && storeError.message.contains("\(victim)"), "\(storeError)")
        #expect(try canonicalDump(b.store) == before)
        #expect(try b.store.history().count == historyBefore)
        #expect(try b.engine.peers().map { "\($0.site) \($0.receivedThrough)" } == peersBefore)
        #expect(try b.store.fetch(FetchDescriptor<Note>()).allSatisfy { !$0.pinned })
    }

    /// An import's closure may run again (its group commit reruns every closure when one
    /// throws; a map that grows reruns it too, after another process may have written) and then
    /// see another schema than its first run did: here a write grouped before it learns a new
    /// field on its second run only. The first run merged the streamed batches; the second,
    /// no longer streaming (the schemas differ), must still check and merge every entry, not
    /// only those the reader had not handed over: it merged none and moved the watermark past
    /// the whole delta.
    @Test func aRerunThatSeesAnotherSchemaStillMergesEveryEntry() throws {
        let dir = TemporaryDirectory()
        let types = syncTypes + [Scribble.self]
        let a = try Device.open(dir.sub("a"), family: family, types: types)
        try a.store.write { tx in
            for n in 0..<1_500 { try tx.insert(Note(title: "note \(n)", body: "")) }
        }
        let delta = try a.engine.makeDelta(for: nil).encoded()
        let b = try Device.open(dir.sub("b"), family: family, types: types)
        let env = try Environment.open(path: b.path)
        let release = DoneFlag(), entered = DoneFlag()
        Thread {
            try? b.store.write { tx in
                try tx.insert(Note(title: "held", body: ""))
                entered.set()
                while !release.isSet { Thread.sleep(forTimeInterval: 0.001) }
            }
        }.start()
        while !entered.isSet { Thread.sleep(forTimeInterval: 0.001) }
        func waitFor(_ writes: Int) {
            let deadline = Date().addingTimeInterval(10)
            while env.waitingWrites < writes, Date() < deadline { Thread.sleep(forTimeInterval: 0.001) }
        }
        let runs = Atomic<Int>(0)
        let outcome = Mutex<String>("not run")
        let done = DispatchGroup()
        done.enter()
        Thread {
            try? b.store.write { tx in
                // The second run writes the field the schema does not know yet.
                let run = runs.add(1, ordering: .relaxed).newValue
                try tx.insert(Scribble(text: "run \(run)", extra: run > 1 ? "new field" : nil))
            }
            done.leave()
        }.start()
        waitFor(1)
        done.enter()
        Thread {
            outcome.withLock { $0 = (try? b.engine.apply(delta)).map { "\($0)" } ?? "failed" }
            done.leave()
        }.start()
        waitFor(2)
        done.enter()
        Thread {
            struct Refused: Error {}
            _ = try? b.store.write { _ in throw Refused() }
            done.leave()
        }.start()
        waitFor(3)
        #expect(env.waitingWrites == 3, "the three writes did not queue behind the held one")
        release.set()
        done.wait()

        #expect(runs.load(ordering: .relaxed) == 2, "the group did not run again")
        #expect(b.store.schema.type(named: "Scribble")?.field(named: "extra") != nil, "the rerun did not change the schema")
        #expect(outcome.withLock { $0 } == "\(ApplyOutcome.applied(entries: 1_500, changed: 1_500))")
        #expect(try b.store.count(Note.self) == 1_501)
        let imported = try canonicalDump(b.store).filter { !$0.contains("\"held\"") }
        #expect(imported == (try canonicalDump(a.store)))
    }

    /// A delta naming a field in another Unicode form than this store (decomposed, where this
    /// store's name is precomposed: equal names to `String`'s `==`, which the schema check
    /// uses) merges into that field, as it did when a merge found fields through a dictionary;
    /// it must not add a second field of the same name, under which typed reads never look.
    @Test func aFieldNamedInAnotherUnicodeFormMergesIntoThatField() throws {
        let dir = TemporaryDirectory()
        let types = syncTypes + [Creme.self]
        let a = try Device.open(dir.sub("a"), family: family, types: types)
        let b = try Device.open(dir.sub("b"), family: family, types: types)
        let precomposed = "cr\u{E8}me", decomposed = "cre\u{300}me"
        #expect(precomposed == decomposed && !precomposed.utf8.elementsEqual(decomposed.utf8))
        let record = Creme(note: nil, crème: "brûlée")
        try a.store.insert(record)
        var delta = try a.engine.makeDelta(for: nil)
        for n in delta.entries.indices {
            if let field = delta.entries[n].fields.removeValue(forKey: precomposed) { delta.entries[n].fields[decomposed] = field }
        }
        let data = delta.encoded()
        #expect(data.range(of: Data(decomposed.utf8)) != nil, "the delta does not name the field decomposed")
        #expect(try b.engine.apply(data) == .applied(entries: 1, changed: 1))
        #expect(try b.store.get(Creme.self, id: record.id) == record)
        #expect(b.store.schema.type(named: "Creme")?.fields.count == a.store.schema.type(named: "Creme")?.fields.count)
        #expect(try b.store.verify().problems.isEmpty)
    }

    /// A merge over a record this (damaged) store keeps without versions, of a type with a
    /// unique index: the put for an id without versions refuses to overwrite the record after
    /// the index entries are written (unique types write them first), and the merge then loads
    /// the record and writes again. Nothing of the refused attempt may stay: the index holds
    /// the merged value once, the old one no more, and `verify` finds nothing wrong.
    @Test func aMergeOverAUniqueRecordWithoutVersionsLeavesItsIndexExact() async throws {
        for changesKind in [true, false] {
            let dir = TemporaryDirectory()
            let a = try Device.open(dir.sub("a"), family: family)
            let b = try Device.open(dir.sub("b"), family: family)
            let profile = UserProfile(kind: "k1", displayName: "first")
            try a.store.insert(profile)
            try await a.sync(with: b)
            try Self.replaceVersions(of: profile.id, in: b.path, with: nil)
            let updated = try a.store.update(UserProfile.self, id: profile.id) { p in
                p.displayName = "second"
                if changesKind { p.kind = "k2" }
            }
            try await a.sync(with: b)
            let context = changesKind ? "kind changed" : "kind kept"
            #expect(try b.store.get(UserProfile.self, id: profile.id) == updated, "\(context)")
            #expect(try b.store.count(UserProfile.self) == 1, "\(context)")
            #expect(try b.store.count(UserProfile.self, where: \.kind, equals: updated.kind) == 1, "\(context)")
            if changesKind { #expect(try b.store.count(UserProfile.self, where: \.kind, equals: "k1") == 0, "\(context)") }
            let problems = try b.store.verify().problems
            #expect(problems.isEmpty, "\(context): \(problems)")
        }
    }

    /// A store whose map starts small grows it several times during a streamed import: each
    /// grow runs the import's closure again, which must merge again the batches the reader
    /// handed to the attempt before.
    @Test func aMapThatGrowsDuringAStreamedImportLosesNothing() throws {
        let dir = TemporaryDirectory()
        let (a, delta) = try source(dir.sub("a"), count: 1_500, body: 1_200)
        var options = StoreOptions()
        options.durability = .none
        options.initialMapSize = 1 << 18
        let store = try Store.open(at: dir.sub("b"), types: syncTypes, options: options)
        let b = Device(path: dir.sub("b"), store: store, engine: try SyncEngine(store: store, configuration: SyncConfiguration(family: family)))
        let mapBefore = try b.store.statistics().mapSize
        #expect(try b.engine.apply(delta.encoded()) == .applied(entries: 1_500, changed: 1_500))
        #expect(try b.store.statistics().mapSize > mapBefore, "the map never grew: the test did not run the import again")
        #expect(try canonicalDump(b.store) == (try canonicalDump(a.store)))
        #expect(try b.engine.apply(delta.encoded()) == .duplicate)
    }

    /// A background sync cancelled while it imports a streamed delta: the import under way ends
    /// (the task waits for it), and it applied all of the delta or none of it, at any moment
    /// of cancellation. A sync run again afterwards brings the rest.
    @Test func aCancelledSyncImportsAllOrNothing() async throws {
        let dir = TemporaryDirectory()
        let (a, _) = try source(dir.sub("a"), count: 1_500)
        let all = try canonicalDump(a.store)
        for (round, delay) in [0, 1, 3, 10, 30].enumerated() {
            let b = try Device.open(dir.sub("b\(round)"), family: family)
            let task = b.engine.startBackgroundSync(via: DirectTransport(to: a.engine), every: .seconds(3_600))
            if delay > 0 { try await Task.sleep(for: .milliseconds(delay)) }
            task.cancel()
            await task.value
            let count = try b.store.count(Note.self)
            #expect(count == 0 || count == 1_500, "cancelled after \(delay) ms: \(count) of 1,500 notes")
            try await Task.sleep(for: .milliseconds(100))
            #expect(try b.store.count(Note.self) == count, "cancelled after \(delay) ms: the sync went on after its task ended")
            let received = try b.engine.peers().first { $0.site == a.store.siteID.description }?.receivedThrough ?? 0
            #expect((count == 1_500) == (received > 0), "cancelled after \(delay) ms: \(count) notes, watermark \(received)")
            try await b.sync(with: a)
            #expect(try canonicalDump(b.store) == all, "cancelled after \(delay) ms, synced again")
        }
    }

    /// Deltas round-trip whatever the field sets of consecutive entries: fields added, removed
    /// or renamed from one entry to the next (the writer reuses the previous entry's string
    /// numbers by position), empty records, tombstones, more than 64 fields, several types and
    /// sites; read whole and streamed alike.
    @Test func deltasOfChangingFieldSetsRoundTrip() throws {
        let names = ["a", "b", "c", "aa", "ab", "b0", "é", "z", "Z", "title", "body", "_", "a b", "ß"]
            + (0..<80).map { "f\($0)" }
        let types = ["Note", "Wide", "Ω"]
        for seed in UInt64(1)...40 {
            var rng = SeededGenerator(seed: seed)
            let sites = (0..<3).map { _ in RecordID() }
            func version() -> Version {
                Version(clock: UInt64.random(in: 0...(1 << 50), using: &rng), site: sites.randomElement(using: &rng)!)
            }
            func value() -> FieldValue {
                switch Int.random(in: 0..<6, using: &rng) {
                case 0: return .null
                case 1: return .int(Int64.random(in: -3...3, using: &rng))
                case 2: return .string(names.randomElement(using: &rng)!)
                case 3: return .bool(Bool.random(using: &rng))
                case 4: return .array([.int(1), .string("x")])
                default: return .map(["k": .double(1.5)])
                }
            }
            var previous: [String] = []
            let entries: [RecordState] = (0..<Int.random(in: 500...700, using: &rng)).map { _ in
                // Mostly the previous entry's fields with a few added, dropped or replaced.
                var fieldNames: [String]
                switch Int.random(in: 0..<6, using: &rng) {
                case 0: fieldNames = []
                case 1: fieldNames = Array(names.shuffled(using: &rng).prefix(Int.random(in: 60...names.count, using: &rng)))
                case 2: fieldNames = Array(names.shuffled(using: &rng).prefix(Int.random(in: 0...8, using: &rng)))
                default:
                    fieldNames = previous.filter { _ in Int.random(in: 0..<8, using: &rng) > 0 }
                    for _ in 0..<Int.random(in: 0...2, using: &rng) { fieldNames.append(names.randomElement(using: &rng)!) }
                }
                previous = fieldNames
                var fields: [String: FieldState] = [:]
                for name in fieldNames { fields[name] = FieldState(value: value(), version: version()) }
                return RecordState(type: types.randomElement(using: &rng)!, id: RecordID(),
                                   incarnation: Bool.random(using: &rng) || fields.isEmpty ? version() : nil,
                                   tombstone: Int.random(in: 0..<4, using: &rng) == 0 ? version() : nil, fields: fields)
            }
            let delta = Delta(source: sites[0], recipient: nil, family: family, schemaFingerprint: Array(repeating: 7, count: 32),
                              from: 1, to: 9, isFullSnapshot: false, created: Date(timeIntervalSince1970: 1_000),
                              entries: entries, counterFields: ["Note": ["credits", "z"]])
            let data = delta.encoded()
            #expect(try Delta(decoding: data, key: nil) == delta, "seed \(seed): read whole")
            let stream = DeltaEntryStream(try DeltaReader(data, key: nil, name: "seed \(seed)"))
            defer { stream.stop() }
            let (streamed, counters) = try stream.rest()
            #expect(streamed == entries && counters == delta.counterFields, "seed \(seed): streamed")
        }
    }

    /// Two stores with one frozen wall clock (their versions tie on the clock and differ by
    /// site) edit the same records of 70 fields concurrently: fields set, changed, cleared,
    /// records emptied, deleted and inserted again, most records at once (deltas of 512 entries
    /// or more, streamed). After an exchange in either order both hold the same state of every
    /// record, field by field, versions included.
    @Test func concurrentEditsOfWideRecordsConvergeInEitherOrder() async throws {
        let types: [any Record.Type] = syncTypes + [Wide.self]
        let frozen = Date()
        for seed in UInt64(1)...4 {
            var rng = SeededGenerator(seed: seed)
            let dir = TemporaryDirectory()
            func open(_ name: String) throws -> Device {
                var options = StoreOptions()
                options.durability = .none
                options.clock = { frozen }
                let store = try Store.open(at: dir.sub(name), types: types, options: options)
                return Device(path: dir.sub(name), store: store,
                              engine: try SyncEngine(store: store, configuration: SyncConfiguration(family: family)))
            }
            let a = try open("a"), b = try open("b")
            var ids: [RecordID] = []
            try a.store.write(isolation: #isolation) { tx in
                for n in 0..<600 {
                    var wide = Wide()
                    if n % 7 != 0 { wide.scramble(Double.random(in: 0...1, using: &rng), &rng) }
                    ids.append(wide.id)
                    try tx.insert(wide)
                    if n % 50 == 0 { try tx.insert(Note(title: "n\(n)", body: "")) }
                }
            }
            try await a.sync(with: b)
            func compare(_ context: String) throws {
                #expect(try canonicalDump(a.store, types: ["Wide", "Note"]) == canonicalDump(b.store, types: ["Wide", "Note"]), "seed \(seed), \(context)")
                for type in ["Wide", "Note"] {
                    var states: [[RecordID: RecordState]] = [[:], [:]]
                    for (n, device) in [a, b].enumerated() {
                        try device.store.read { snapshot in
                            try snapshot.forEachRecordState(typeNamed: type) { states[n][$0.id] = $0; return true }
                        }
                    }
                    #expect(states[0].count == states[1].count, "seed \(seed), \(context): \(type) ids differ")
                    for (id, state) in states[0] where states[1][id] != state {
                        Issue.record("seed \(seed), \(context): \(type) \(id) differs:\n\(state)\n\(String(describing: states[1][id]))")
                        break
                    }
                }
            }
            try compare("after the first exchange")
            for round in 0..<4 {
                // The same number of writes on both sides, so that their clocks tie.
                let writes = Int.random(in: 1...3, using: &rng)
                for device in [a, b] {
                    for _ in 0..<writes {
                        let share = [0.02, 0.3, 1.0].randomElement(using: &rng)!
                        let fieldShare = Double.random(in: 0...0.5, using: &rng)
                        try device.store.write(isolation: #isolation) { tx in
                            for id in ids where Double.random(in: 0..<1, using: &rng) < share {
                                switch Int.random(in: 0..<20, using: &rng) {
                                case 0: try tx.delete(Wide.self, id: id)
                                case 1:
                                    if try tx.get(Wide.self, id: id) == nil { try tx.insert(Wide(id: id)) }
                                case 2:
                                    if try tx.get(Wide.self, id: id) != nil { try tx.update(Wide.self, id: id) { $0 = Wide(id: id) } }
                                default:
                                    if try tx.get(Wide.self, id: id) != nil { try tx.update(Wide.self, id: id) { $0.scramble(fieldShare, &rng) } }
                                }
                            }
                        }
                    }
                }
                if Bool.random(using: &rng) {
                    try await a.sync(with: b)
                    try await a.sync(with: b)
                    try compare("round \(round), a with b")
                } else {
                    try await b.sync(with: a)
                    try await b.sync(with: a)
                    try compare("round \(round), b with a")
                }
            }
        }
    }
}
