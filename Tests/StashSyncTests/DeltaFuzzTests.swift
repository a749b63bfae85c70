import Foundation
import Stash
import StashSync
import StashTestSupport
import Synchronization
import Testing

/// A structure-aware fuzz run of the delta reader and the merge (issue 34, point 5).
///
/// Seed deltas exported by real stores (`DeltaFuzzCorpus`) are mutated in two layers
/// (`DeltaFuzzMutator`): structured (a decoded `Delta` changed, then encoded and signed with
/// the family key, so it passes checksum and HMAC and reaches the merge) and byte level (bytes
/// of the signed region changed, HMAC and checksum made again, so the reader's deep paths run).
/// Each mutant is applied to a real receiving store (a fresh one every 120 iterations, and
/// after a broken invariant that leaves its state in doubt), which must then hold:
/// - the process does not die;
/// - the outcome is applied, duplicate, parked, or a thrown `SyncError` / `StoreError`;
/// - a refused or duplicate delta changed nothing (history, counts, schema, metadata, parked
///   files); a parked one changed no record and not the schema;
/// - after an applied one: `verify()` is clean; the stored schema is the one the store opened
///   with; every record the import changed reads back through its Swift type, would be taken
///   again by a generic `put`, holds no date that is not finite (at any depth), and carries no
///   version past `Version.maximumClock` but this store's own (a local write adds 1 to the
///   clock it overwrites).
///
/// Environment: `STASH_FUZZ_SEED` (default 34005), `STASH_FUZZ_ITERATIONS` (default 100,000),
/// `STASH_FUZZ_FROM` (the first iteration), `STASH_FUZZ_SHARDS` (threads, default 2: the
/// iterations are split between them), `STASH_FUZZ_LOG=1` (each mutation and its outcome). A
/// failure names the environment that replays it (one thread, from the iteration its
/// receiving store was made at); a crash prints the same for each thread before the backtrace.
/// `STASH_FUZZ_SKIP`, a comma-separated list of ``FuzzSkipClass`` names, leaves out the
/// mutants of those classes, to explore past a crash that is not fixed yet. It is empty by
/// default and must stay so: CI skips nothing.
@Suite("DeltaFuzz")
struct DeltaFuzzTests {
    @Test("Mutated, correctly signed deltas: no crash, refusals change nothing, what applies verifies")
    func mutatedSignedDeltas() async throws {
        let environment = ProcessInfo.processInfo.environment
        let seed = UInt64(environment["STASH_FUZZ_SEED"] ?? "") ?? 34_005
        let count = Int(environment["STASH_FUZZ_ITERATIONS"] ?? "") ?? 100_000
        let first = Int(environment["STASH_FUZZ_FROM"] ?? "") ?? 0
        let shards = min(max(Int(environment["STASH_FUZZ_SHARDS"] ?? "") ?? 2, 1), FuzzCrashNote.shards)
        let skip = try FuzzSkipClass.parse(environment["STASH_FUZZ_SKIP"] ?? "")
        let log = environment["STASH_FUZZ_LOG"] != nil
        let corpus = try await FuzzCorpus()
        let started = Date()
        // The iterations split in `shards` stretches, each run on a thread of its own with
        // receiving stores of its own (a replay gives STASH_FUZZ_SHARDS=1).
        let results = Mutex<[Int: (FuzzTotals, [String: (first: FuzzViolation, count: Int)])]>([:])
        let failures = Failures()
        FuzzCrashNote.install()
        defer { FuzzCrashNote.uninstall() }
        onThreads(shards) { shard in
            FuzzCrashNote.enter(shard: shard)
            let run = DeltaFuzzRun(seed: seed, corpus: corpus, shard: shard, skip: skip, log: log)
            do {
                try run.run(first + count * shard / shards..<first + count * (shard + 1) / shards)
            } catch {
                failures.add("shard \(shard) stopped: \(error)")
            }
            results.withLock { $0[shard] = (run.totals, run.violations) }
        }
        for failure in failures.all { Issue.record(Comment(rawValue: failure)) }
        var t = FuzzTotals()
        var violations: [String: (first: FuzzViolation, count: Int)] = [:]
        for (_, (totals, found)) in results.withLock({ $0 }).sorted(by: { $0.key < $1.key }) {
            t.add(totals)
            for (kind, v) in found { violations[kind] = violations[kind].map { ($0.first, $0.count + v.count) } ?? v }
        }
        t.started = started
        print(t.summary(seed: seed, skip: skip, shards: shards))
        for (kind, found) in violations.sorted(by: { $0.key < $1.key }) {
            Issue.record(Comment(rawValue: "\(kind) (\(found.count) times); first: \(found.first.text(seed: seed))"))
        }
        // The run reaches the merge: a fuzzer whose mutants all fail at the checksum, the HMAC
        // or the reader would pass without testing the merge at all.
        if count >= 10_000 {
            #expect(t.mutations == count - t.skipped)
            #expect(t.applied * 20 >= t.mutations, "fewer than 5% of the mutants applied: \(t.outcomes)")
            #expect(t.bytesSampledRead * 50 >= t.bytesSampled, "fewer than 2% of the byte-level mutants sampled pass the reader")
            #expect(t.largeApplied > 0, "no large (streamed) delta applied")
            #expect(t.changedRecords > 0)
        }
    }
}

/// A class of mutated deltas the run can be told not to apply (`STASH_FUZZ_SKIP`), while a
/// crash they cause is explored; each is judged on the decoded delta.
enum FuzzSkipClass: String, CaseIterable {
    /// A NaN date (`Date(timeIntervalSinceReferenceDate: .nan)`) anywhere in a field's value.
    case nanDates
    /// A NaN date inside the value of a counter field (`Account.credits`).
    case nanDatesInCounters
    /// A counter field (`Account.credits`) whose value is not a well-formed `Counter` state
    /// (a map `sites` of site id → whole `increments` and `decrements` of at least 0).
    case malformedCounters

    static func parse(_ text: String) throws -> Set<FuzzSkipClass> {
        var classes = Set<FuzzSkipClass>()
        for name in text.split(separator: ",").map({ $0.trimmingCharacters(in: .whitespaces) }) where !name.isEmpty {
            guard let c = FuzzSkipClass(rawValue: name) else {
                throw FuzzSetupError(message: "STASH_FUZZ_SKIP: unknown class \(name); known: \(allCases.map(\.rawValue).joined(separator: ", "))")
            }
            classes.insert(c)
        }
        return classes
    }

    func matches(_ delta: Delta) -> Bool {
        switch self {
        case .nanDates:
            return delta.entries.contains { $0.fields.values.contains { fuzzContains($0.value, fuzzIsNaNDate) } }
        case .nanDatesInCounters:
            return delta.entries.contains { e in e.type == "Account" && e.fields["credits"].map { fuzzContains($0.value, fuzzIsNaNDate) } ?? false }
        case .malformedCounters:
            return delta.entries.contains { e in e.type == "Account" && e.fields["credits"].map { !fuzzIsCounterState($0.value) } ?? false }
        }
    }
}

func fuzzIsNaNDate(_ value: FieldValue) -> Bool {
    if case .date(let d) = value { d.timeIntervalSinceReferenceDate.isNaN } else { false }
}

struct FuzzSetupError: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}

/// Whether `value` or anything nested in it satisfies `test`.
func fuzzContains(_ value: FieldValue, _ test: (FieldValue) -> Bool) -> Bool {
    if test(value) { return true }
    switch value {
    case .array(let items): return items.contains { fuzzContains($0, test) }
    case .map(let entries): return entries.values.contains { fuzzContains($0, test) }
    default: return false
    }
}

/// Whether `value` is a `Counter` state as `Counter` encodes it (null: no value).
func fuzzIsCounterState(_ value: FieldValue) -> Bool {
    if value == .null { return true }
    guard case .map(let counter) = value, counter.count == 1, case .map(let sites)? = counter["sites"] else { return false }
    return sites.allSatisfy { site, totals in
        guard RecordID(string: site) != nil, case .map(let t) = totals, t.count == 2,
              case .int(let i)? = t["increments"], case .int(let d)? = t["decrements"] else { return false }
        return i >= 0 && d >= 0
    }
}

/// One broken invariant, with what it takes to replay it.
struct FuzzViolation {
    let iteration: Int
    let mutation: String
    let detail: String
    /// The environment that replays it (from the iteration its receiving store was made at).
    let replay: String

    func text(seed: UInt64) -> String {
        "seed \(seed) iteration \(iteration) (replay: \(replay) STASH_FUZZ_LOG=1): \(mutation) → \(detail)"
    }
}

/// The run's figures, for the summary.
struct FuzzTotals {
    var mutations = 0
    var structuredMutations = 0
    var byteMutations = 0
    var largeMutations = 0
    var skipped = 0
    /// Byte-level mutants read with `Delta(decoding:key:name:)` (one in ten), and those it took.
    var bytesSampled = 0
    var bytesSampledRead = 0
    /// Applied, whether or not they changed a record.
    var applied = 0
    var outcomes: [String: Int] = [:]
    var changedRecords = 0
    var largeApplied = 0
    var verifies = 0
    var receivers = 0
    var farFutureStored = 0
    var started = Date()
    /// Seconds spent per phase (making mutants, digests, applying, checking, new receivers).
    var seconds: [String: Double] = [:]

    mutating func count(_ outcome: String) { outcomes[outcome, default: 0] += 1 }

    /// Adds another shard's figures.
    mutating func add(_ o: FuzzTotals) {
        mutations += o.mutations
        structuredMutations += o.structuredMutations
        byteMutations += o.byteMutations
        largeMutations += o.largeMutations
        skipped += o.skipped
        bytesSampled += o.bytesSampled
        bytesSampledRead += o.bytesSampledRead
        applied += o.applied
        outcomes.merge(o.outcomes, uniquingKeysWith: +)
        changedRecords += o.changedRecords
        largeApplied += o.largeApplied
        verifies += o.verifies
        receivers += o.receivers
        farFutureStored += o.farFutureStored
        seconds.merge(o.seconds, uniquingKeysWith: +)
    }

    func summary(seed: UInt64, skip: Set<FuzzSkipClass>, shards: Int) -> String {
        let elapsed = Date().timeIntervalSince(started)
        let outcomesText = outcomes.sorted { $0.key < $1.key }.map { "\($0.key) \($0.value)" }.joined(separator: ", ")
        return """
        delta fuzz (seed \(seed)\(skip.isEmpty ? "" : ", SKIPPING \(skip.map(\.rawValue).sorted().joined(separator: ","))")): \
        \(mutations) mutations in \(String(format: "%.1f", elapsed)) s on \(shards) thread(s) (\(structuredMutations) structured, \(byteMutations) byte level, \
        \(largeMutations) of a streamed delta); of \(bytesSampled) byte-level mutants sampled, \(bytesSampledRead) pass the reader; \
        outcomes: \(outcomesText); \(changedRecords) record merges changed the store; \(largeApplied) streamed deltas applied; \(verifies) verifies; \(receivers) receiving stores; \
        \(farFutureStored) applied deltas stored a version more than 2 min ahead of the receiver's clock; \(skipped) skipped; \
        thread time: \(seconds.sorted { $0.key < $1.key }.map { "\($0.key) \(String(format: "%.1f", $0.value)) s" }.joined(separator: ", "))
        """
    }
}

/// The receiving store of a stretch of iterations: opened fresh, given the first seed delta and
/// a few local writes of its own (among them a unique handle the mutants may clash with).
final class FuzzReceiver {
    let store: Store
    let engine: SyncEngine
    /// The schema the store opened with (or, after an import changed it, holds since).
    var schema: StoreSchema
    let now: Date
    let since: Int
    let directory: FuzzDirectory

    /// `verified`: check the new store (the same at every start: once a run is enough).
    init(_ corpus: FuzzCorpus, since: Int, verified: Bool) throws {
        self.since = since
        let directory = FuzzDirectory("stash-fuzz-receiver")
        self.directory = directory
        var options = StoreOptions()
        options.durability = .none
        options.initialMapSize = 8 << 20
        options.clock = fuzzClock(3600)
        let now = options.clock()
        self.now = now
        store = try Store.open(at: directory.sub("r"), types: fuzzTypes, options: options)
        engine = try SyncEngine(store: store, configuration: SyncConfiguration(family: corpus.family, key: corpus.key))
        guard case .applied = try engine.apply(corpus.initial.bytes, name: "first") else {
            throw FuzzSetupError(message: "the first seed delta did not apply")
        }
        try store.write { tx in
            try tx.insert(FuzzAccount(id: FuzzCorpus.localAccount, handle: "clash", joined: now, limits: ["homes": 1]))
            try tx.insert(FuzzHome(id: FuzzCorpus.localHome, name: "Local", rooms: 1, built: now, note: nil, area: 1))
            try tx.update(FuzzHome.self, id: FuzzCorpus.homes[1]) { $0.note = "local" }
            try tx.update(FuzzAccount.self, id: FuzzCorpus.accounts[2]) { $0.credits.add(1, site: tx.siteID) }
        }
        schema = try store.read { $0.schema }
        if verified {
            let report = try store.verify()
            guard report.isClean else { throw FuzzSetupError(message: "receiver not clean at start: \(report)") }
        }
    }

    /// The digest taken after the last iteration, if it was (nil after an import).
    var lastDigest: Digest?

    /// What a refused delta must leave as it was.
    struct Digest: Equatable {
        var history: UInt64
        var counts: [Int]
        var schema: StoreSchema
        var metadata: [String: [UInt8]]
        var parked: [String]

        /// The part about records (what a parked delta must leave as it was).
        var records: [UInt64] { [history] + counts.map { UInt64($0) } }
    }

    func digest() throws -> Digest {
        try store.read { snapshot in
            var metadata: [String: [UInt8]] = [:]
            for (key, value) in try snapshot.metadata(withPrefix: "") { metadata[key] = value }
            return Digest(history: try snapshot.historyBounds().current.sequence,
                          counts: try fuzzSyncedTypeNames.map { try snapshot.count(typeNamed: $0) },
                          schema: snapshot.schema, metadata: metadata, parked: engine.parkedDeltas())
        }
    }
}

struct FuzzRollback: Error {}

/// The fuzz loop: mutants, their outcomes, and the checks after each.
final class DeltaFuzzRun {
    let seed: UInt64
    let shard: Int
    let skip: Set<FuzzSkipClass>
    let log: Bool
    let corpus: FuzzCorpus
    var totals = FuzzTotals()
    var violations: [String: (first: FuzzViolation, count: Int)] = [:]
    private var receiver: FuzzReceiver?

    /// Iterations per receiving store (its state grows with what it merges).
    static let receiverLife = 120
    /// Of the receiving stores, one in this many ends with a mutant of the large seed delta.
    static let largeEvery = 8
    /// Structured mutants, in percent; the others are damaged bytes of a seed delta. A
    /// structured mutant mostly reaches the merge and a full verify (a few milliseconds in a
    /// debug build); a damaged one mostly stops in the reader (a fraction of one).
    static let structuredPercent = 25

    init(seed: UInt64, corpus: FuzzCorpus, shard: Int, skip: Set<FuzzSkipClass>, log: Bool) {
        self.seed = seed
        self.corpus = corpus
        self.shard = shard
        self.skip = skip
        self.log = log
    }

    /// `body`, its time added to `phase`'s.
    private func time<T>(_ phase: String, _ body: () throws -> T) rethrows -> T {
        let start = DispatchTime.now().uptimeNanoseconds
        let result = try body()
        totals.seconds[phase, default: 0] += Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
        return result
    }

    /// The generator of iteration `i`: every iteration replays alone from the seed.
    private func generator(_ i: Int) -> SeededGenerator {
        var mixer = SeededGenerator(seed: seed ^ (UInt64(i) &* 0x9E37_79B9_7F4A_7C15))
        return SeededGenerator(seed: mixer.next())
    }

    func run(_ iterations: Range<Int>) throws {
        totals.started = Date()
        for i in iterations {
            if receiver == nil || i - receiver!.since >= Self.receiverLife {
                receiver = nil
                receiver = try time("receivers") { try FuzzReceiver(corpus, since: i, verified: totals.receivers == 0) }
                totals.receivers += 1
            }
            let start = DispatchTime.now().uptimeNanoseconds
            let structured = try iteration(i, receiver!)
            totals.seconds[structured ? "iterations structured" : "iterations byte level", default: 0] += Double(DispatchTime.now().uptimeNanoseconds - start) / 1e9
        }
        receiver = nil
    }

    /// One mutant: its bytes, and what was done, in words.
    struct Mutant {
        var data: Data
        /// The delta the data encodes, when the mutant is structured and not damaged after.
        var delta: Delta?
        var description: String
        var structured: Bool
        var large: Bool
    }

    /// The mutant of iteration `i` for receiver `r`.
    func mutant(_ i: Int, for r: FuzzReceiver) -> Mutant {
        var rng = generator(i)
        let large = i - r.since == Self.receiverLife - 1 && (r.since / Self.receiverLife) % Self.largeEvery == 0
        let target = FuzzTarget(receiver: r.store.siteID, fingerprint: corpus.initial.delta.schemaFingerprint, now: r.now, corpus: corpus)
        // The seed, from a source the receiver has not heard of (its deltas are then neither
        // duplicates nor after a gap, unless a mutation says so).
        let base = large ? corpus.large : corpus.bases[rng.pick([0, 1, 1, 2, 2, 3, 3])]
        let source = fuzzID(0x5, UInt64(i))
        var mutation = ["base \(base.name)"]
        // A large delta mostly structured: damaged bytes of it stop in the reader, where the
        // small ones go too.
        let structured = rng.chance(large ? 75 : Self.structuredPercent)
        if structured {
            var delta = base.delta
            delta.source = source
            delta.from = 1
            // Mostly a few of the seed's entries, as most deltas carry: the merge of each entry
            // costs, and a mutation touches one or two.
            if !large && rng.chance(70) && delta.entries.count > 4 {
                let count = 1 + rng.below(4)
                let start = rng.below(delta.entries.count - count + 1)
                delta.entries = Array(delta.entries[start..<start + count])
                mutation.append("entries \(start)..<\(start + count) of \(base.delta.entries.count)")
            }
            mutation += FuzzStructured.mutate(&delta, &rng, target)
            var key: SyncKey? = corpus.key
            if rng.chance(2) {
                key = rng.chance(50) ? nil : corpus.wrongKey
                mutation.append(key == nil ? "not signed" : "signed with another key")
            }
            var data = delta.encoded(key: key)
            var intact: Delta? = delta
            if key != nil && rng.chance(10) {
                let (mutated, done) = FuzzBytes.mutate(data, &rng, key: FuzzKeyBytes.family)
                data = mutated
                intact = nil
                mutation += done
            }
            return Mutant(data: data, delta: intact, description: mutation.joined(separator: "; "), structured: true, large: large)
        }
        // The seed's bytes (mostly of a few of its entries) from the new source and from history
        // sequence 1 (header bytes 6..<22 and 70..<78), then damaged and signed again.
        let damaged = large || rng.chance(30) ? base : rng.pick(corpus.slices)
        if damaged.name != base.name { mutation = ["base \(damaged.name)"] }
        var bytes = [UInt8](damaged.bytes)
        bytes.replaceSubrange(6..<22, with: source.bytes)
        bytes.replaceSubrange(70..<78, with: [1, 0, 0, 0, 0, 0, 0, 0])
        let (data, done) = FuzzBytes.mutate(Data(bytes), &rng, key: FuzzKeyBytes.family)
        mutation += done
        return Mutant(data: data, delta: nil, description: mutation.joined(separator: "; "), structured: false, large: large)
    }

    /// Runs iteration `i`; returns whether its mutant was structured.
    private func iteration(_ i: Int, _ r: FuzzReceiver) throws -> Bool {
        let replay = "STASH_FUZZ_SEED=\(seed) STASH_FUZZ_FROM=\(r.since) STASH_FUZZ_ITERATIONS=\(i - r.since + 1) STASH_FUZZ_SHARDS=1\(skipText)"
        FuzzCrashNote.set(shard: shard, "\nshard \(shard): making (encoding) the mutant of seed \(seed), iteration \(i); replay: \(replay) STASH_FUZZ_LOG=1\n")
        let m = time("mutate") { mutant(i, for: r) }
        func note(_ phase: String) {
            FuzzCrashNote.set(shard: shard, """

            shard \(shard): \(phase) the mutant of seed \(seed), iteration \(i) (receiving store made at iteration \(r.since)):
                \(m.description)
                replay: \(replay) STASH_FUZZ_LOG=1 swift test --skip-build --filter DeltaFuzz
                explore past it (never in CI): STASH_FUZZ_SKIP=<class> (\(Self.skipClassNames))

            """)
        }
        note("applying")

        if !skip.isEmpty, let decoded = m.delta ?? (try? Delta(decoding: m.data, key: corpus.key, name: "mutant")), skip.contains(where: { $0.matches(decoded) }) {
            totals.skipped += 1
            return m.structured
        }
        totals.mutations += 1
        if !m.structured && i % 10 == 0 {
            totals.bytesSampled += 1
            if (try? Delta(decoding: m.data, key: corpus.key, name: "mutant")) != nil { totals.bytesSampledRead += 1 }
        }
        if m.large { totals.largeMutations += 1 }
        if m.structured { totals.structuredMutations += 1 } else { totals.byteMutations += 1 }

        // The state after the previous iteration, when it was taken (nothing writes in between).
        let before = try r.lastDigest ?? time("digest") { try r.digest() }
        r.lastDigest = nil
        let outcome: String
        var detail = ""
        var applied = false
        do {
            switch try time("apply", { try r.engine.apply(m.data, name: "mutant-\(i)") }) {
            case .applied(_, let changed, _):
                outcome = changed == 0 ? "applied (no change)" : "applied"
                applied = true
                totals.changedRecords += changed
                if m.large { totals.largeApplied += 1 }
            case .duplicate:
                outcome = "duplicate"
            case .parked(let reason):
                outcome = "parked"
                detail = reason
            }
        } catch let error as SyncError {
            outcome = "SyncError.\(error.code)"
            detail = error.message
        } catch let error as StoreError {
            outcome = "StoreError.\(error.code)"
            detail = error.message
        } catch {
            outcome = "untyped \(type(of: error))"
            detail = "\(error)"
        }
        totals.count(outcome)
        if applied { totals.applied += 1 }
        if log { print("fuzz \(i): \(m.description) → \(outcome) \(detail.prefix(300))") }

        // Each broken invariant, and whether the store is still a base for the next mutants.
        var broken: [(kind: String, text: String, recycle: Bool)] = []
        if outcome.hasPrefix("untyped") { broken.append(("untypedError", "\(outcome): \(detail)", false)) }
        if applied {
            note("checking the store after importing")
            broken += try time("checks") { try checkApplied(r, before: before) }
        } else {
            let after = try time("digest") { try r.digest() }
            r.lastDigest = after
            if outcome == "parked" {
                if after.records != before.records || after.schema != before.schema {
                    broken.append(("parkedChangedRecords", "history/counts \(before.records) → \(after.records)\(after.schema != before.schema ? ", schema changed" : "")", true))
                }
            } else if after != before {
                broken.append(("refusalChangedStore", "\(outcome) (\(detail.prefix(200))) yet \(difference(before, after))", true))
            }
        }
        for (kind, text, _) in broken {
            let violation = FuzzViolation(iteration: i, mutation: m.description, detail: text, replay: replay)
            let key = kind + Self.variety(of: kind, text)
            if let known = violations[key] { violations[key] = (known.first, known.count + 1) } else { violations[key] = (violation, 1) }
        }
        if broken.contains(where: \.recycle) { receiver = nil }
        return m.structured
    }

    static let skipClassNames = FuzzSkipClass.allCases.map(\.rawValue).joined(separator: ", ")
    /// The classes skipped, as a replay must give them (empty when none are).
    var skipText: String { skip.isEmpty ? "" : " STASH_FUZZ_SKIP=" + skip.map(\.rawValue).sorted().joined(separator: ",") }

    private func difference(_ a: FuzzReceiver.Digest, _ b: FuzzReceiver.Digest) -> String {
        var parts: [String] = []
        if a.records != b.records { parts.append("history/counts \(a.records) → \(b.records)") }
        if a.schema != b.schema { parts.append("schema changed") }
        if a.parked != b.parked { parts.append("parked files \(a.parked.count) → \(b.parked.count)") }
        let keys = Set(a.metadata.keys).union(b.metadata.keys).filter { a.metadata[$0] != b.metadata[$0] }
        if !keys.isEmpty { parts.append("metadata changed: \(keys.sorted().joined(separator: ", "))") }
        return parts.joined(separator: "; ")
    }

    /// The checks after an applied delta, on the records its import changed (the history
    /// entries after `before`'s).
    private func checkApplied(_ r: FuzzReceiver, before: FuzzReceiver.Digest) throws -> [(kind: String, text: String, recycle: Bool)] {
        var broken: [(kind: String, text: String, recycle: Bool)] = []
        totals.verifies += 1
        let report = try time("verify") { try r.store.verify() }
        if !report.isClean { broken.append(("verifyNotClean", report.problems.prefix(3).joined(separator: " | "), true)) }
        let schema = try r.store.read { $0.schema }
        if schema != r.schema {
            broken.append(("schemaChangedByImport", schemaDifference(r.schema, schema), false))
            // Later imports are judged against what the store holds now.
            r.schema = schema
        }

        var keys: [(String, RecordID)] = []
        var seen = Set<String>()
        for entry in try r.store.read({ try $0.history(after: HistoryToken(sequence: before.history)) }) {
            for change in entry.changes where seen.insert("\(change.type) \(change.id)").inserted { keys.append((change.type, change.id)) }
        }
        let clockLimit = UInt64((r.now.timeIntervalSince1970 + 120) * 1000) << 16
        var farFuture = false
        try r.store.read { snapshot in
            for (type, id) in keys {
                do {
                    switch type {
                    case "Home": _ = try snapshot.get(FuzzHome.self, id: id)
                    case "Item": _ = try snapshot.get(FuzzItem.self, id: id)
                    case "Account": _ = try snapshot.get(FuzzAccount.self, id: id)
                    case "Reading": _ = try snapshot.get(FuzzReading.self, id: id)
                    default:
                        // A type the receiver does not declare is carried for other replicas
                        // (never a record here): anything else is a change it should not make.
                        if !snapshot.carriedTypeNames.contains(type) {
                            broken.append(("importChangedOtherType", "the import changed \(type) \(id)", false))
                        }
                    }
                } catch {
                    broken.append(("typedReadFails", "\(type) \(id): \(error)", false))
                }
                // Past the clock range, only this store's own writes (each adds 1 to the clock
                // it overwrites): a merged version there is refused.
                let state = try snapshot.recordState(typeNamed: type, id: id)
                for (what, version) in [("incarnation", state.incarnation), ("tombstone", state.tombstone)] + state.fields.map({ ($0.key, $0.value.version) }) {
                    guard let version else { continue }
                    if !version.isWithinClockRange && version.site != r.store.siteID {
                        broken.append(("mergedVersionPastClockRange", "\(type) \(id) \(what) stored at \(version.clock) from site \(version.site)", false))
                    }
                    if version.clock > clockLimit { farFuture = true }
                }
            }
        }
        if farFuture { totals.farFutureStored += 1 }
        // What a generic put (the CLI's `stash put`) would refuse must not be stored either:
        // each record put again, in a write that is rolled back.
        var refusals: [String] = []
        do {
            try r.store.write { tx in
                refusals = []
                for (type, id) in keys {
                    // A carried type (not declared here) has no records to put.
                    guard tx.schema.type(named: type) != nil, let record = try tx.get(typeNamed: type, id: id) else { continue }
                    do { try tx.put(record) } catch { refusals.append("\(type) \(id): \(error)") }
                }
                throw FuzzRollback()
            }
        } catch is FuzzRollback {}
        for refusal in refusals.prefix(3) { broken.append(("storedWhatPutRefuses", refusal, false)) }
        return broken
    }

    /// Which of the ways to break invariant `kind` its message `text` tells of, for the report
    /// (each way reported with its first example).
    static func variety(of kind: String, _ text: String) -> String {
        func has(_ part: String) -> Bool { text.contains(part) }
        switch kind {
        case "schemaChangedByImport":
            if has("field") && has(".'id' added") { return " (a field named id added)" }
            if has(".'' added") { return " (a field with an empty name added)" }
            if has(" bytes) added") { return " (a field with a long name added)" }
            if has("type ") && has(" added") && !has("field") { return " (a type added)" }
            if has(" changed") { return " (a field or index changed)" }
            return " (a field added)"
        case "storedWhatPutRefuses":
            if has(" lacks field ") { return " (a required field missing)" }
            if has(" has null for field ") { return " (a required field null)" }
            if has(" is a counter") { return " (a malformed counter state)" }
            if has(" values, so ") { return " (a value of another kind)" }
            if has(" has no field ") { return " (a field the schema lacks)" }
            return " (other)"
        case "typedReadFails":
            if has("missing field") { return " (a required field missing)" }
            if has("expected ") { return " (a value of another type)" }
            if has("does not fit") { return " (a number out of range)" }
            return " (other)"
        case "nonFiniteDateStored":
            return has(" = date(") ? " (as a field's value)" : " (nested in an array, map or counter state)"
        default:
            return ""
        }
    }

    private func schemaDifference(_ a: StoreSchema, _ b: StoreSchema) -> String {
        var parts: [String] = []
        for type in b.types {
            guard let old = a.type(named: type.name) else { parts.append("type \(type.name) added"); continue }
            for field in type.fields where old.field(named: field.name) != field {
                let name = field.name.utf8.count > 40 ? "(\(field.name.utf8.count) bytes)" : "'\(field.name)'"
                parts.append(old.field(named: field.name) == nil ? "field \(type.name).\(name) added (\(field.kind?.rawValue ?? "no kind"))" : "field \(type.name).\(name) changed")
            }
            if type.indexes != old.indexes { parts.append("indexes of \(type.name) changed") }
        }
        return parts.isEmpty ? "schema differs (version or order)" : parts.joined(separator: ", ")
    }
}
