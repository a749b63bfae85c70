// BenchReport: turns one package-benchmark run of StoreBench (exported with `--format jmh`)
// into the markdown tables of BENCHMARKS.md, with the ratios Stash/raw-LMDB and Stash/GRDB
// computed from that same run and a verdict for each goal of issue 6.
//
//     swift run -c release BenchReport .build/results/Current_run.jmh.json [--commit abc123]
//
// Benchmark names are `group/engine/variant/N` (see StoreBench.swift). Only Foundation is used.
import Foundation

// MARK: Input

struct Result {
    let group: String, engine: String, variant: String, size: String
    /// Wall-clock statistics in µs: mean, p50, p99 (nil for benchmarks without wall clock).
    var mean: Double?, p50: Double?, p99: Double?
    var samples = 0
    var mallocs: Double?
    var diskApparent: Double?, diskAllocated: Double?
    /// `delta/…/export`: the encoded delta's size in bytes.
    var deltaBytes: Double?
}

func load(_ path: String) throws -> [Result] {
    let data = try Data(contentsOf: URL(fileURLWithPath: path))
    guard let elements = try JSONSerialization.jsonObject(with: data) as? [[String: Any]] else {
        throw ReportError("\(path) is not a JMH export (a JSON array)")
    }
    var results: [Result] = []
    for element in elements {
        guard var name = element["benchmark"] as? String else { continue }
        if let range = name.range(of: "StoreBench.") { name = String(name[range.upperBound...]) }
        let parts = name.replacingOccurrences(of: "_", with: " ").split(separator: "/").map(String.init)
        guard parts.count == 4 else { continue }
        var result = Result(group: parts[0], engine: parts[1], variant: parts[2], size: parts[3])
        // package-benchmark 1.38 carries secondary metrics over from earlier benchmarks in the
        // JMH export, so read only the metric that belongs to each group.
        let secondary = element["secondaryMetrics"] as? [String: [String: Any]] ?? [:]
        func stats(_ metric: String) -> (mean: Double, p50: Double, p99: Double, max: Double, samples: Int)? {
            guard let m = secondary[metric], let mean = m["score"] as? Double ?? (m["score"] as? Int).map(Double.init),
                  let pct = m["scorePercentiles"] as? [String: Any] else { return nil }
            func p(_ key: String) -> Double { pct[key] as? Double ?? (pct[key] as? Int).map(Double.init) ?? .nan }
            let raw = (m["rawData"] as? [[Any]])?.first?.count ?? 0
            let highest = p("100.0")
            return (mean, p("50.0"), p("99.0"), highest.isNaN ? p("99.0") : highest, raw)
        }
        // Interleaved benchmarks: one custom metric per engine, in nanoseconds; the writes run
        // all three engines (`all`), the paired reads two (`Stash+LMDB`).
        let interleaved = result.engine == "all" ? ["Stash", "LMDB", "GRDB"] : result.engine.split(separator: "+").map(String.init)
        if interleaved.count > 1 {
            for engine in interleaved {
                guard let s = stats("\(engine) ns") else { continue }
                var r = Result(group: result.group, engine: engine, variant: result.variant, size: result.size)
                r.mean = s.mean / 1_000; r.p50 = s.p50 / 1_000; r.p99 = s.p99 / 1_000; r.samples = s.samples
                results.append(r)
            }
            continue
        }
        switch result.group {
        case "allocs", "gateallocs":
            // The most any iteration allocated: the targets alternate (full and empty homes),
            // so an allocation on every other call would leave the median at 0.
            result.mallocs = stats("Malloc (total)")?.max
        case "disk":
            result.diskApparent = stats("disk bytes (file size)")?.mean
            result.diskAllocated = stats("disk bytes (allocated)")?.mean
        default:
            if let s = stats("Time (wall clock)") {
                result.mean = s.mean; result.p50 = s.p50; result.p99 = s.p99; result.samples = s.samples
            }
            if result.group == "delta", result.variant == "export" { result.deltaBytes = stats("delta bytes")?.mean }
        }
        results.append(result)
    }
    return results
}

struct ReportError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

// MARK: Formatting

func us(_ v: Double?) -> String {
    guard let v, v.isFinite else { return "–" }
    if v >= 1000 { return String(format: "%.2f ms", v / 1000) }
    if v >= 100 { return String(format: "%.0f µs", v) }
    if v >= 10 { return String(format: "%.1f µs", v) }
    return String(format: "%.2f µs", v)
}

func rate(_ v: Double?) -> String {
    guard let v, v.isFinite, v > 0 else { return "–" }
    if v >= 1_000_000 { return String(format: "%.2f M/s", v / 1_000_000) }
    if v >= 1_000 { return String(format: "%.1f k/s", v / 1_000) }
    return String(format: "%.0f /s", v)
}

func ratio(_ v: Double?) -> String {
    guard let v, v.isFinite else { return "–" }
    return v >= 10 ? String(format: "%.0f×", v) : String(format: "%.2f×", v)
}

/// A ratio shown next to a threshold: with three decimals when two would round it across.
func ratio(_ v: Double?, threshold: Double) -> String {
    guard let v, v.isFinite else { return "–" }
    let shown = ratio(v)
    if v < 10, (v >= threshold) != ((Double(String(format: "%.2f", v)) ?? v) >= threshold) {
        return String(format: "%.3f×", v)
    }
    return shown
}

func bytes(_ v: Double?) -> String {
    guard let v, v.isFinite else { return "–" }
    if v >= Double(1 << 30) { return String(format: "%.2f GiB", v / Double(1 << 30)) }
    if v >= Double(1 << 20) { return String(format: "%.1f MiB", v / Double(1 << 20)) }
    return String(format: "%.0f KiB", v / 1024)
}

func sizeValue(_ label: String) -> Int {
    if label.hasSuffix("M") { return (Int(label.dropLast()) ?? 0) * 1_000_000 }
    if label.hasSuffix("k") { return (Int(label.dropLast()) ?? 0) * 1_000 }
    return Int(label) ?? 0
}

nonisolated(unsafe) var out = ""
func line(_ s: String = "") { out += s + "\n" }
func table(_ header: [String], _ rows: [[String]]) {
    line("| " + header.joined(separator: " | ") + " |")
    line("|" + header.enumerated().map { $0.offset == 0 ? "---" : "---:" }.joined(separator: "|") + "|")
    for row in rows { line("| " + row.joined(separator: " | ") + " |") }
    line()
}

// MARK: Goals

struct Goal {
    let text: String
    let met: Bool?
    let detail: String
}
nonisolated(unsafe) var goals: [String: [Goal]] = [:]
func verdict(_ met: Bool?) -> String { met.map { $0 ? "**met**" : "**missed**" } ?? "not measured" }

// MARK: Main

var arguments = Array(CommandLine.arguments.dropFirst())
var commit: String?
if let i = arguments.firstIndex(of: "--commit"), i + 1 < arguments.count {
    commit = arguments[i + 1]
    arguments.removeSubrange(i...(i + 1))
}
// --check-allocations: exit 1 when the index-handle count or the gate check allocates in any iteration
// (malloc counts are deterministic, so CI can hold this line even on a noisy machine).
var checkAllocations = false
if let i = arguments.firstIndex(of: "--check-allocations") {
    checkAllocations = true
    arguments.remove(at: i)
}
var infoFile: String?
if let i = arguments.firstIndex(of: "--info"), i + 1 < arguments.count {
    infoFile = arguments[i + 1]
    arguments.removeSubrange(i...(i + 1))
}
guard let path = arguments.first else {
    FileHandle.standardError.write(Data("usage: BenchReport <run.jmh.json> [--commit SHA] [--info run-info.txt] [--check-allocations]\n".utf8))
    exit(2)
}
let results: [Result]
do { results = try load(path) } catch {
    FileHandle.standardError.write(Data("BenchReport: \(error)\n".utf8))
    exit(1)
}

func find(_ group: String, _ engine: String, _ variant: String, _ size: String) -> Result? {
    results.first { $0.group == group && $0.engine == engine && $0.variant == variant && $0.size == size }
}
/// The table of a read benchmark measured per operation: p50, p99 and mallocs per operation (the most of any iteration)
/// (from `allocations`) for each (engine, variant, label) row, with p99 ratios to the raw
/// LMDB row `lmdb` and the GRDB row `grdb`. Returns those two reference p99s.
@discardableResult
func latencyTable(group: String, allocations: String, per unit: String, rows: [(String, String, String)], size: String,
                  lmdb lmdbVariant: String, grdb grdbVariant: String) -> (lmdb: Double?, grdb: Double?) {
    let lmdb = find(group, "LMDB", lmdbVariant, size)?.p99
    let grdb = find(group, "GRDB", grdbVariant, size)?.p99
    table(["way", "p50", "p99", "mallocs / \(unit)", "p99 ÷ raw LMDB p99", "GRDB p99 ÷ p99"], rows.map { engine, variant, label in
        let r = find(group, engine, variant, size)
        let a = find(allocations, engine, variant, size)
        return [label, us(r?.p50), us(r?.p99), a?.mallocs.map { String(format: "%.0f", $0) } ?? "–",
                engine == "LMDB" ? "" : ratio(r?.p99.flatMap { p in lmdb.map { p / $0 } }),
                engine == "GRDB" ? "" : ratio(r?.p99.flatMap { p in grdb.map { $0 / p } })]
    })
    return (lmdb, grdb)
}

/// Operations per second from the mean wall-clock time of one operation (µs).
func opsPerSecond(_ r: Result?) -> Double? { r?.mean.map { 1_000_000 / $0 } }

/// Stash ÷ raw LMDB in operations per second (from mean times) of a read group, where
/// `stash` and `lmdb` are the two engines' variants; nil unless both were measured.
func readRatio(_ group: String, _ stash: String, _ lmdb: String, _ size: String) -> Double? {
    opsPerSecond(find(group, "Stash", stash, size)).flatMap { s in opsPerSecond(find(group, "LMDB", lmdb, size)).map { s / $0 } }
}

/// Stash p99 ÷ raw LMDB p99 of a read group, as `readRatio`.
func p99Ratio(_ group: String, _ stash: String, _ lmdb: String, _ size: String) -> Double? {
    find(group, "Stash", stash, size)?.p99.flatMap { s in find(group, "LMDB", lmdb, size)?.p99.map { s / $0 } }
}

/// The goal detail of an isolated ratio, with the paired row's ratio beside it when that row ran.
func withPaired(_ isolated: String, _ paired: Double?, threshold: Double) -> String {
    guard let paired else { return isolated }
    return "\(isolated) (paired row: \(ratio(paired, threshold: threshold)))"
}

/// The small table of a paired read group (`pairedget`, `pairedcount`, the read `what`) under
/// the isolated table: both engines' p50 / p99 from the same iterations, their ratio `title` (`paired`) and,
/// beside it, the same ratio from the isolated rows of this run. Prints nothing when the group
/// did not run.
func pairedTable(_ group: String, variant: String, size: String, what: String, title: String, paired: Double?, isolated: Double?) {
    guard let s = find(group, "Stash", variant, size), let l = find(group, "LMDB", variant, size) else { return }
    line("**Paired with raw LMDB** (\(what); same iteration, same target, alternating order; each read timed on its own; \(s.samples) pairs):")
    line()
    table(["Stash p50 / p99", "raw LMDB p50 / p99", title, "the same, isolated rows above"],
          [["\(us(s.p50)) / \(us(s.p99))", "\(us(l.p50)) / \(us(l.p99))", ratio(paired), ratio(isolated)]])
}

// Store sizes N; the delta group's last component is the number of changes K instead, and the
// async and livequery groups (fresh stores, AsyncBench.swift) have none.
let sizes = Set(results.filter { !["overhead", "delta", "async", "livequery"].contains($0.group) }.map(\.size)).sorted { sizeValue($0) < sizeValue($1) }

// Machine: what `nproc`, /proc/cpuinfo and /proc/meminfo say, plus the run's own notes.
let cpu = (try? String(contentsOfFile: "/proc/cpuinfo", encoding: .utf8))?
    .split(separator: "\n").first { $0.hasPrefix("model name") }
    .map { $0.split(separator: ":", maxSplits: 1).last!.trimmingCharacters(in: .whitespaces) } ?? "unknown CPU"
let memory = String(format: "%.1f GiB", Double(ProcessInfo.processInfo.physicalMemory) / Double(1 << 30))
line("Machine: \(ProcessInfo.processInfo.activeProcessorCount) cores (`nproc`), \(cpu), \(memory) RAM, \(ProcessInfo.processInfo.operatingSystemVersionString).")
if let commit { line("Stash commit: `\(commit)`.") }
if let infoFile, let info = try? String(contentsOfFile: infoFile, encoding: .utf8) {
    for entry in info.split(separator: "\n") where !entry.isEmpty { line("\(entry.prefix(1).uppercased())\(entry.dropFirst()).") }
}
line()

if let overhead = find("overhead", "harness", "empty", "0") {
    line("Harness floor (an empty benchmark body): p50 \(us(overhead.p50)), p99 \(us(overhead.p99)) — included in every isolated per-operation time below (not in the interleaved write rows or the paired rows, which time the operation alone). A constant on both sides pulls a ratio toward 1×: the count goals are judged on the ratio with the floor taken off both sides as well (the detail shows it).")
    line()
}

for size in sizes {
    let n = sizeValue(size)
    line("### N = \(size) items (\(max(1, n / 100)) homes)")
    line()

    // Bulk insert
    let bulk = ["Stash", "LMDB", "GRDB"].map { find("bulk", $0, "1000 per txn", size) }
    if bulk.contains(where: { $0 != nil }) {
        line("**Bulk insert**, 1,000 items per transaction, full durability, into stores growing from 0 to N (engines interleaved batch by batch; one sample per transaction):")
        line()
        let rps = bulk.map { r in r?.mean.map { 1_000 * 1_000_000 / $0 } }
        table(["engine", "records/s", "txn p50", "txn p99", "Stash ÷ engine"],
              zip(["Stash", "raw LMDB", "GRDB"], zip(bulk, rps)).map { name, pair in
                  [name, rate(pair.1), us(pair.0?.p50), us(pair.0?.p99),
                   name == "Stash" ? "" : ratio(rps[0].flatMap { s in pair.1.map { s / $0 } })]
              })
        let vsLMDB = rps[0].flatMap { s in rps[1].map { s / $0 } }
        let vsGRDB = rps[0].flatMap { s in rps[2].map { s / $0 } }
        goals[size, default: []].append(Goal(text: "bulk insert ≥ 0.5× raw LMDB", met: vsLMDB.map { $0 >= 0.5 }, detail: ratio(vsLMDB, threshold: 0.5)))
        goals[size, default: []].append(Goal(text: "bulk insert ≥ 1.5× GRDB", met: vsGRDB.map { $0 >= 1.5 }, detail: ratio(vsGRDB, threshold: 1.5)))
    }

    // Single insert
    let levels = [("full", "full / FULL"), ("relaxed", "relaxed / NORMAL"), ("none", "none / OFF")]
    if levels.contains(where: { find("insert1", "Stash", $0.0, size) != nil }) {
        line("**Single insert**, one commit per item, engines interleaved commit by commit (Stash and raw LMDB durability / GRDB `synchronous`):")
        line()
        var rows: [[String]] = []
        for (level, label) in levels {
            let s = find("insert1", "Stash", level, size), l = find("insert1", "LMDB", level, size), g = find("insert1", "GRDB", level, size)
            let sv = opsPerSecond(s), lv = opsPerSecond(l), gv = opsPerSecond(g)
            rows.append([label, "\(us(s?.p50)) / \(us(s?.p99))", rate(sv), "\(us(l?.p50)) / \(us(l?.p99))", rate(lv),
                         "\(us(g?.p50)) / \(us(g?.p99))", rate(gv),
                         ratio(sv.flatMap { a in lv.map { a / $0 } }), ratio(sv.flatMap { a in gv.map { a / $0 } })])
            if level != "none" {
                let r = sv.flatMap { a in gv.map { a / $0 } }
                goals[size, default: []].append(Goal(text: "durable single insert ≥ GRDB at equal durability (\(label))",
                                                     met: r.map { $0 >= 1 }, detail: "\(ratio(r, threshold: 1)) (ops/s)"))
            }
        }
        table(["durability", "Stash p50 / p99", "Stash ops/s", "LMDB p50 / p99", "LMDB ops/s", "GRDB p50 / p99", "GRDB ops/s",
               "Stash ÷ LMDB", "Stash ÷ GRDB"], rows)
    }

    // Concurrent single inserts (group commit) from threads, then from tasks; the variant is
    // "<level> <writers>x<per writer>".
    for (group, writers) in [("concurrent", "threads"), ("concurrenttasks", "Swift tasks (each on a thread of its own)")] {
        let shapes = Set(results.filter { $0.group == group && $0.size == size }.map { String($0.variant.split(separator: " ").last ?? "") })
        for shape in shapes.sorted() {
            let parts = shape.split(separator: "x").compactMap { Int($0) }
            guard parts.count == 2 else { continue }
            let commits = Double(parts[0] * parts[1])
            func perSecond(_ r: Result?) -> Double? { r?.mean.map { commits * 1_000_000 / $0 } }
            let inTasksNote = group == "concurrent" ? "" : " A grouped Stash closure of a caller in a task runs on its caller's thread (its `@TaskLocal` values and cancellation): a thread switch per grouped write."
            line("**Concurrent single inserts**: \(parts[0]) \(writers) × \(parts[1]) items, one commit per item, on each engine in turn (Stash and raw LMDB through StashLMDB commit the writers queued behind a commit together: group commit; GRDB serializes its writers).\(inTasksNote) One sample = all \(Int(commits)) commits, thread start included; ops/s = \(Int(commits)) ÷ mean:")
            line()
            var rows: [[String]] = []
            for (level, label) in levels.prefix(2) {
                let variant = "\(level) \(shape)"
                let sv = perSecond(find(group, "Stash", variant, size)), lv = perSecond(find(group, "LMDB", variant, size))
                let gv = perSecond(find(group, "GRDB", variant, size))
                guard sv != nil || gv != nil else { continue }
                rows.append([label, rate(sv), rate(lv), rate(gv), ratio(sv.flatMap { a in lv.map { a / $0 } }),
                             ratio(sv.flatMap { a in gv.map { a / $0 } })])
                let r = sv.flatMap { a in gv.map { a / $0 } }
                let from = group == "concurrent" ? "" : " in tasks"
                goals[size, default: []].append(Goal(text: "durable insert ≥ GRDB at equal durability, \(parts[0]) concurrent writers\(from) (\(label))",
                                                     met: r.map { $0 >= 1 }, detail: "\(ratio(r, threshold: 1)) (ops/s)"))
            }
            table(["durability", "Stash ops/s", "LMDB ops/s", "GRDB ops/s", "Stash ÷ LMDB", "Stash ÷ GRDB"], rows)
        }
    }

    // Point read
    let gets = [("Stash", "typed", "Stash `get`"), ("LMDB", "typed", "raw LMDB + hand decode"),
                ("GRDB", "typed", "GRDB `fetchOne(key:)`"), ("GRDB", "cached SQL", "GRDB cached SQL statement")]
    let pairedGet = readRatio("pairedget", "typed", "typed", size)
    if gets.contains(where: { find("get", $0.0, $0.1, size) != nil }) {
        line("**Point read** by id, decoded into `Item`:")
        line()
        let stash = opsPerSecond(find("get", "Stash", "typed", size))
        table(["engine", "p50", "p99", "ops/s", "Stash ÷ engine (ops/s)"], gets.map { engine, variant, label in
            let r = find("get", engine, variant, size)
            let v = opsPerSecond(r)
            return [label, us(r?.p50), us(r?.p99), rate(v), engine == "Stash" ? "" : ratio(stash.flatMap { s in v.map { s / $0 } })]
        })
        let vsLMDB = readRatio("get", "typed", "typed", size)
        // Judged on the isolated rows; the paired ratio is shown beside.
        goals[size, default: []].append(Goal(text: "typed point read ≥ 0.5× raw LMDB", met: vsLMDB.map { $0 >= 0.5 },
                                             detail: withPaired(ratio(vsLMDB, threshold: 0.5), pairedGet, threshold: 0.5)))
    }
    pairedTable("pairedget", variant: "typed", size: size, what: "point read", title: "Stash ÷ raw LMDB (ops/s, from the mean)",
                paired: pairedGet, isolated: readRatio("get", "typed", "typed", size))

    // Counts
    let counts = [("Stash", "fast path", "Stash `count(Item.self, where: \\.homeID, equals:)`"),
                  ("Stash", "index handle", "Stash `count(handle, equals:)`"),
                  ("Stash", "predicate", "Stash `fetchCount(#Predicate { $0.homeID == x })`"),
                  ("LMDB", "dup count", "raw LMDB `mdb_cursor_count`"),
                  ("GRDB", "fetchCount", "GRDB `filter(homeID == x).fetchCount`"),
                  ("GRDB", "cached SQL", "GRDB cached `SELECT COUNT(*)`")]
    // The paired count pairs the fast path with `mdb_cursor_count`.
    let pairedCount = p99Ratio("pairedcount", "fast path", "fast path", size)
    if counts.contains(where: { find("count", $0.0, $0.1, size) != nil }) {
        line("**Indexed count** of the items of one home (~100), and heap allocations per count (malloc counter):")
        line()
        let (lmdb, grdb) = latencyTable(group: "count", allocations: "allocs", per: "count", rows: counts, size: size,
                                        lmdb: "dup count", grdb: "fetchCount")
        for (variant, label) in [("fast path", "fast path"), ("index handle", "index handle"), ("predicate", "#Predicate")] {
            let p99 = find("count", "Stash", variant, size)?.p99
            let vsLMDB = p99.flatMap { p in lmdb.map { p / $0 } }
            let vsGRDB = p99.flatMap { p in grdb.map { $0 / p } }
            // The harness floor taken off both sides (a p99 less a p99: approximate).
            let floor = find("overhead", "harness", "empty", "0")?.p99 ?? 0
            let withoutFloor = p99.flatMap { p in lmdb.flatMap { l in l > floor ? (p - floor) / (l - floor) : nil } }
            // Judged on the isolated rows, with and without the floor; the fast path's paired ratio is shown beside.
            var detail = ratio(vsLMDB, threshold: 2)
            if floor > 0 { detail += " (floor off: \(ratio(withoutFloor, threshold: 2)))" }
            if variant == "fast path" { detail = withPaired(detail, pairedCount, threshold: 2) }
            let met = vsLMDB.map { $0 <= 2 && (withoutFloor ?? $0) <= 2 }
            goals[size, default: []].append(Goal(text: "indexed count p99 ≤ 2× raw LMDB (\(label))", met: met, detail: detail))
            goals[size, default: []].append(Goal(text: "indexed count ≥ 10× faster than GRDB at p99 (\(label))", met: vsGRDB.map { $0 >= 10 }, detail: ratio(vsGRDB, threshold: 10)))
            if let m = find("allocs", "Stash", variant, size)?.mallocs {
                goals[size, default: []].append(Goal(text: "0 allocations per indexed count (\(label))", met: m == 0, detail: String(format: "%.0f", m)))
            }
        }
    }

    pairedTable("pairedcount", variant: "fast path", size: size, what: "count, fast path and `mdb_cursor_count`", title: "Stash p99 ÷ raw LMDB p99",
                paired: pairedCount, isolated: p99Ratio("count", "fast path", "dup count", size))

    // Update
    if levels.contains(where: { find("update", "Stash", $0.0, size) != nil }) {
        line("**Update one field + commit**, engines interleaved (`wearCount += 1`; Stash `update(_:id:)` reads, decodes, re-encodes; raw LMDB patches 8 bytes; GRDB runs `UPDATE … SET wearCount = wearCount + 1`):")
        line()
        var rows: [[String]] = []
        for (level, label) in levels.prefix(2) {
            let s = find("update", "Stash", level, size), l = find("update", "LMDB", level, size), g = find("update", "GRDB", level, size)
            let sv = opsPerSecond(s), lv = opsPerSecond(l), gv = opsPerSecond(g)
            rows.append([label, "\(us(s?.p50)) / \(us(s?.p99))", rate(sv), "\(us(l?.p50)) / \(us(l?.p99))", rate(lv),
                         "\(us(g?.p50)) / \(us(g?.p99))", rate(gv),
                         ratio(sv.flatMap { a in lv.map { a / $0 } }), ratio(sv.flatMap { a in gv.map { a / $0 } })])
        }
        table(["durability", "Stash p50 / p99", "Stash ops/s", "LMDB p50 / p99", "LMDB ops/s", "GRDB p50 / p99", "GRDB ops/s",
               "Stash ÷ LMDB", "Stash ÷ GRDB"], rows)
    }

    // Disk
    let disks = ["Stash", "LMDB", "GRDB"].map { find("disk", $0, "files", size) }
    if disks.contains(where: { $0 != nil }) {
        line("**On-disk size** after loading N items and N/100 homes (data files: LMDB `data.mdb`; SQLite database + WAL after a checkpoint):")
        line()
        table(["engine", "file size", "allocated", "bytes / item", "Stash ÷ engine"],
              zip(["Stash", "raw LMDB", "GRDB"], disks).map { name, r in
                  [name, bytes(r?.diskApparent), bytes(r?.diskAllocated),
                   r?.diskApparent.map { String(format: "%.0f", $0 / Double(max(1, n))) } ?? "–",
                   name == "Stash" ? "" : ratio(disks[0]?.diskApparent.flatMap { s in r?.diskApparent.map { s / $0 } })]
              })
    }

    // Gate check
    let gates = [("Stash", "check", "Stash `gate.check(.create(Item.self, in: home))`"),
                 ("Stash", "check after a move", "Stash, the first check after a commit that moved an item"),
                 ("LMDB", "by hand", "raw LMDB: value in place + `mdb_stat` + `mdb_cursor_count`"),
                 ("GRDB", "query interface", "GRDB query interface (row + 2 × `fetchCount`)"),
                 ("GRDB", "cached SQL", "GRDB cached statements (row + 2 × `SELECT COUNT(*)`)")]
    if gates.contains(where: { find("gate", $0.0, $0.1, size) != nil || find("gateallocs", $0.0, $0.1, size) != nil }) {
        line("**Gate check**, \"may the user create one more item in this home?\": the entitlement (a lapsed paid subscription: free tier), the number of homes and the number of items in the home, in one read transaction ⇒ decision; homes alternate between full ones (denied, item limit) and new ones (allowed):")
        line()
        latencyTable(group: "gate", allocations: "gateallocs", per: "check", rows: gates, size: size,
                     lmdb: "by hand", grdb: "query interface")
        if let p99 = find("gate", "Stash", "check", size)?.p99 {
            goals[size, default: []].append(Goal(text: "gate check p99 ≤ 5 µs (required at 1M)", met: p99 <= 5, detail: us(p99)))
        }
        if let p99 = find("gate", "Stash", "check after a move", size)?.p99 {
            goals[size, default: []].append(Goal(text: "gate check p99 ≤ 5 µs right after a commit (required at 1M)", met: p99 <= 5, detail: us(p99)))
        }
        if let m = find("gateallocs", "Stash", "check", size)?.mallocs {
            goals[size, default: []].append(Goal(text: "0 allocations per gate check", met: m == 0, detail: String(format: "%.0f", m)))
        }
        if let m = find("gateallocs", "Stash", "check after a move", size)?.mallocs {
            goals[size, default: []].append(Goal(text: "0 allocations per gate check right after a commit", met: m == 0, detail: String(format: "%.0f", m)))
        }
    }
}

// Delta exchange: K changes per delta, independent of N; Stash only.
var deltaGoals: [(k: String, goal: Goal)] = []
let changes = Set(results.filter { $0.group == "delta" }.map(\.size)).sorted { sizeValue($0) < sizeValue($1) }
if !changes.isEmpty {
    line("### Delta exchange")
    line()
    line("**Delta export and import** with StashSync, K changes (K new items) per delta, Stash only (neither peer has sync). Export: `makeDelta` + `encoded(key:)` (HMAC); import: `apply` into a fresh, empty store (validation, merge, watermark; one durable transaction). Records/s count the K records of one delta:")
    line()
    var rows: [[String]] = []
    for k in changes {
        let count = Double(sizeValue(k))
        let export = find("delta", "Stash", "export", k), importing = find("delta", "Stash", "import", k)
        let exportRate = export?.mean.map { count * 1_000_000 / $0 }
        let importRate = importing?.mean.map { count * 1_000_000 / $0 }
        let perChange = export?.deltaBytes.map { $0 / count }
        rows.append([k, rate(exportRate), "\(us(export?.p50)) / \(us(export?.p99))", rate(importRate),
                     "\(us(importing?.p50)) / \(us(importing?.p99))",
                     perChange.map { String(format: "%.0f", $0) } ?? "–", bytes(export?.deltaBytes),
                     "\(export?.samples ?? 0) / \(importing?.samples ?? 0)"])
        for (way, value) in [("export", exportRate), ("import", importRate)] {
            deltaGoals.append((k, Goal(text: "delta exchange ≥ 100k records/s (\(way))", met: value.map { $0 >= 100_000 }, detail: rate(value))))
        }
    }
    table(["changes K", "export records/s", "export p50 / p99", "import records/s", "import p50 / p99",
           "delta bytes / change", "delta size", "deltas timed (export / import)"], rows)
}

line("### Goals of issue 6")
line()
var goalRows: [[String]] = []
for size in sizes {
    for goal in goals[size] ?? [] { goalRows.append([goal.text, size, goal.detail, verdict(goal.met)]) }
}
for (k, goal) in deltaGoals { goalRows.append([goal.text, "K = \(k)", goal.detail, verdict(goal.met)]) }
table(["goal", "N", "measured", "verdict"], goalRows)

var header = "Run: \(path)"
if let commit { header += ", Stash commit \(commit)" }
print("<!-- generated by BenchReport; \(header) -->")
print(out, terminator: "")

if checkAllocations {
    // (group, variant, what it is, per what): each must allocate nothing at every N.
    let checks = [("allocs", "index handle", "count through an index handle", "count"),
                  ("gateallocs", "check", "the gate check", "check")]
    for (group, variant, what, unit) in checks {
        let measured = results.filter { $0.group == group && $0.engine == "Stash" && $0.variant == variant }
        if measured.isEmpty {
            FileHandle.standardError.write(Data("BenchReport: no \(group)/Stash/\(variant) result to check\n".utf8))
            exit(1)
        }
        for r in measured where (r.mallocs ?? 1) != 0 {
            FileHandle.standardError.write(Data("BenchReport: \(what) allocates (\(r.mallocs ?? .nan) mallocs per \(unit) at N = \(r.size)); it must not\n".utf8))
            exit(1)
        }
    }
}
