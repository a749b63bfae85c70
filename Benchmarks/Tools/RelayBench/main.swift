// The relay service under load (`make bench-relay`): a throwaway PostgreSQL cluster (PostgreSQL's
// default durability: fsync and synchronous commit on), `stash-relay serve` processes (release
// builds), and in this one process 1,000 simulated devices on loopback, in families of 4, each
// pushing small sealed deltas and long-polling its family's log, plus real stores (Stash stores
// with SyncEngine and HTTPRelayTransport) that measure when a record written on one device is
// readable in another device's store. Everything on 127.0.0.1; every loop is bounded in time.
//
// Prints a Markdown report: accepted deltas/s at saturation (every device uploading back to
// back), propagation p50/p99 at a fixed offered rate (on the wire for the simulated devices,
// store to store for the real ones), the servers' RSS, and PostgreSQL's bytes per delta (table,
// index and WAL).
import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Stash
import StashSync
import Synchronization

// MARK: Options

struct Options {
    var server = ""
    var commit = "?"
    var devices = 1000
    var familySize = 4
    var servers = 1
    var saturationSeconds = 20.0
    var steadySeconds = 20.0
    var rate = 5000.0
    var realPairs = 4
    var payloadBytes = 200

    init() {
        var arguments = CommandLine.arguments.dropFirst().makeIterator()
        while let argument = arguments.next() {
            let value = arguments.next() ?? ""
            switch argument {
            case "--server": server = value
            case "--commit": commit = value
            case "--devices": devices = Int(value) ?? devices
            case "--family-size": familySize = Int(value) ?? familySize
            case "--servers": servers = Int(value) ?? servers
            case "--saturation-seconds": saturationSeconds = Double(value) ?? saturationSeconds
            case "--steady-seconds": steadySeconds = Double(value) ?? steadySeconds
            case "--rate": rate = Double(value) ?? rate
            case "--real-pairs": realPairs = Int(value) ?? realPairs
            default: fail("unknown option \(argument) (--server PATH --devices N --family-size N --servers N --saturation-seconds S --steady-seconds S --rate R --real-pairs N --commit C)")
            }
        }
        let environment = ProcessInfo.processInfo.environment
        if let value = environment["STASH_RELAY_BENCH_DEVICES"].flatMap(Int.init) { devices = value }
        if let value = environment["STASH_RELAY_BENCH_SECONDS"].flatMap(Double.init) { saturationSeconds = value; steadySeconds = value }
        if let value = environment["STASH_RELAY_BENCH_SERVERS"].flatMap(Int.init) { servers = value }
        if let value = environment["STASH_RELAY_BENCH_RATE"].flatMap(Double.init) { rate = value }
        guard FileManager.default.isExecutableFile(atPath: server) else { fail("--server: no stash-relay at \(server)") }
    }
}

func fail(_ message: String) -> Never {
    FileHandle.standardError.write(Data("RelayBench: \(message)\n".utf8))
    exit(1)
}

func say(_ message: String) {
    FileHandle.standardError.write(Data("RelayBench: \(message)\n".utf8))
}

// MARK: Processes

/// Runs a command to its end, its output in a file, and returns that output (fails the run
/// when the command fails). With `posix_spawn` and every other descriptor closed, not
/// Foundation's `Process`: `pg_ctl start` leaves a daemon behind, which would inherit the pipe
/// and the socket by which `Process` notices the child's end, and the wait would last as long
/// as PostgreSQL. As the `postgres` user when asked and this process is root (PostgreSQL
/// refuses to run as root).
@discardableResult
func run(_ executable: String, _ arguments: [String], asPostgres: Bool = false) -> String {
    var arguments = arguments, executable = executable
    if asPostgres && getuid() == 0 {
        arguments = ["-u", "postgres", "--", executable] + arguments
        executable = "/usr/sbin/runuser"
    }
    let output = NSTemporaryDirectory() + "relay-bench-run-" + UUID().uuidString
    defer { try? FileManager.default.removeItem(atPath: output) }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
    posix_spawn_file_actions_adddup2(&actions, 1, 2)
    for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [] {
        if let fd = Int32(name), fd >= 3 { posix_spawn_file_actions_addclose(&actions, fd) }
    }
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    var pid: pid_t = 0
    let spawned = posix_spawn(&pid, executable, &actions, nil, argv, environ)
    guard spawned == 0 else { fail("cannot run \(executable): \(String(cString: strerror(spawned)))") }
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    let text = ((try? String(contentsOfFile: output, encoding: .utf8)) ?? "").trimmingCharacters(in: .whitespacesAndNewlines)
    if status != 0 { fail("\(executable) \(arguments.joined(separator: " ")) exited with status \(status): \(text)") }
    return text
}

func freePort() -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    _ = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    return Int(UInt16(bigEndian: address.sin_port))
}

/// A throwaway cluster with PostgreSQL's default durability (the tests' turns fsync off; this
/// one does not).
final class Cluster: Sendable {
    let directory: String
    let port = freePort()
    let bin: String

    init() {
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? []).compactMap(Int.init).sorted()
        guard let version = versions.last else { fail("PostgreSQL's server is not installed: make bench-relay installs postgresql") }
        bin = "/usr/lib/postgresql/\(version)/bin"
        var template = Array("/tmp/stash-relay-bench-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { fail("mkdtemp failed") }
        directory = String(cString: made)
        if getuid() == 0 { run("/bin/chown", ["postgres:postgres", directory]) }
        run("\(bin)/initdb", ["-D", "\(directory)/data", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-instructions"], asPostgres: true)
        run("\(bin)/pg_ctl", ["-D", "\(directory)/data", "-l", "\(directory)/log", "-w", "-t", "60", "-o",
                              "-p \(port) -k \(directory) -c listen_addresses=127.0.0.1 -c max_connections=200 -c shared_buffers=256MB "
                                + (ProcessInfo.processInfo.environment["STASH_RELAY_BENCH_PG_OPTIONS"] ?? ""),
                              "start"], asPostgres: true)
        run("\(bin)/createdb", ["-h", "127.0.0.1", "-p", String(port), "-U", "postgres", "bench"], asPostgres: true)
    }

    var url: String { "postgres://postgres@127.0.0.1:\(port)/bench" }

    func sql(_ statement: String) -> String {
        run("\(bin)/psql", ["-h", "127.0.0.1", "-p", String(port), "-U", "postgres", "-d", "bench", "-At", "-c", statement], asPostgres: true)
    }

    func destroy() {
        run("\(bin)/pg_ctl", ["-D", "\(directory)/data", "-m", "immediate", "-w", "stop"], asPostgres: true)
        try? FileManager.default.removeItem(atPath: directory)
    }
}

final class Server: @unchecked Sendable {
    let process = Process()
    let port = freePort()

    init(binary: String, postgres: String) {
        process.executableURL = URL(fileURLWithPath: binary)
        process.arguments = ["serve", "--postgres", postgres, "--port", String(port), "--rate-per-family", "0", "--connections", "24"]
        process.standardError = FileHandle(forWritingAtPath: "/dev/null")
        process.environment = ProcessInfo.processInfo.environment.merging(["LOG_LEVEL": "warning"]) { $1 }
        do { try process.run() } catch { fail("cannot start \(binary): \(error)") }
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            if let data = try? Data(contentsOf: URL(string: "http://127.0.0.1:\(port)/health")!), String(decoding: data, as: UTF8.self).hasPrefix("ok") { return }
            usleep(100_000)
        }
        fail("stash-relay did not start")
    }

    var url: URL { URL(string: "http://127.0.0.1:\(port)")! }

    /// Resident set now and at its highest (kB, from /proc).
    var memory: (rss: Int, peak: Int) {
        let status = (try? String(contentsOfFile: "/proc/\(process.processIdentifier)/status", encoding: .utf8)) ?? ""
        func field(_ name: String) -> Int {
            status.split(separator: "\n").first { $0.hasPrefix(name) }.flatMap { $0.split(separator: " ").dropFirst().first.flatMap { Int($0) } } ?? 0
        }
        return (field("VmRSS:"), field("VmHWM:"))
    }

    func stop() {
        kill(process.processIdentifier, SIGTERM)
        process.waitUntilExit()
    }
}

// MARK: Measurements

/// Latencies in seconds, kept whole (a run holds at most a few hundred thousand).
final class Samples: Sendable {
    private let values = Mutex<[Double]>([])
    func add(_ value: Double) { values.withLock { $0.append(value) } }
    var count: Int { values.withLock { $0.count } }
    func percentile(_ p: Double) -> Double {
        let sorted = values.withLock { $0.sorted() }
        guard !sorted.isEmpty else { return .nan }
        return sorted[min(sorted.count - 1, Int((Double(sorted.count - 1) * p).rounded()))]
    }
}

final class Counter: Sendable {
    private let value = Atomic<Int>(0)
    func add(_ n: Int = 1) { value.add(n, ordering: .relaxed) }
    var current: Int { value.load(ordering: .relaxed) }
}

func ms(_ seconds: Double) -> String { seconds.isNaN ? "–" : String(format: "%.1f ms", seconds * 1000) }

// MARK: Simulated devices

/// One simulated device: a site of a family, uploading sealed deltas (a valid envelope of kind
/// 1 around random bytes: the server checks the header, never the sealed payload) and
/// long-polling its family's log for the other devices' files.
struct SimulatedFamily: Sendable {
    let id = RecordID()
    let token: String
    let sites: [RecordID]

    init(size: Int) {
        let key = try! SyncKey((0..<32).map { _ in UInt8.random(in: 0...255) })
        token = "Bearer " + FamilyKeys(key: key, family: id).relayToken.map { String(format: "%02x", $0) }.joined()
        sites = (0..<size).map { _ in RecordID() }
    }
}

func envelope(family: RecordID, source: RecordID, sequence: UInt64, payload: Int) -> Data {
    var bytes = Array("STSR".utf8) + [1, 1, 1]
    bytes += family.bytes + source.bytes
    for value in [sequence, sequence, UInt64(payload)] { withUnsafeBytes(of: value.littleEndian) { bytes += $0 } }
    bytes.append(0)                                                  // no coverage
    bytes += (0..<(12 + payload + 16)).map { _ in UInt8.random(in: 0...255) }   // nonce, "ciphertext", tag
    return Data(bytes)
}

/// When each upload started, by family, source and sequence, for the receivers.
final class UploadTimes: Sendable {
    private let times = Mutex<[String: ContinuousClock.Instant]>([:])
    func started(_ key: String, at instant: ContinuousClock.Instant) { times.withLock { $0[key] = instant } }
    func take(_ key: String) -> ContinuousClock.Instant? { times.withLock { $0[key] } }
}

enum Phase: Int { case idle, saturation, steady, done }

final class Load: Sendable {
    let options: Options
    let servers: [URL]
    let sessions: [URLSession]
    let families: [SimulatedFamily]
    let phase = Atomic<Int>(Phase.idle.rawValue)
    let accepted = Counter(), failed = Counter(), received = Counter()
    let acceptedSaturation = Counter(), acceptedSteady = Counter()
    let propagation = Samples()
    let uploadLatency = Samples()
    let times = UploadTimes()
    let start = ContinuousClock.now

    init(options: Options, servers: [URL]) {
        self.options = options
        self.servers = servers
        // A few sessions (each a connection pool): one device's long-poll and upload each hold
        // a connection.
        sessions = (0..<8).map { _ in
            let configuration = URLSessionConfiguration.ephemeral
            configuration.httpMaximumConnectionsPerHost = 2 * options.devices / 8 + 16
            configuration.timeoutIntervalForRequest = 60
            configuration.urlCache = nil
            return URLSession(configuration: configuration)
        }
        families = (0..<(options.devices / options.familySize)).map { _ in SimulatedFamily(size: options.familySize) }
    }

    var currentPhase: Phase { Phase(rawValue: phase.load(ordering: .relaxed))! }

    func request(_ method: String, _ url: URL, token: String, body: Data? = nil, session: URLSession) async throws -> (Data, Int) {
        var request = URLRequest(url: url)
        request.httpMethod = method
        request.setValue(token, forHTTPHeaderField: "Authorization")
        request.httpBody = body
        let (data, response) = try await session.data(for: request)
        return (data, (response as? HTTPURLResponse)?.statusCode ?? 0)
    }

    /// A device's upload loop: back to back during the saturation phase, at its share of the
    /// offered rate (with jitter) during the steady one.
    func uploads(family: SimulatedFamily, site: Int, index: Int) async {
        let server = servers[index % servers.count]
        let session = sessions[index % sessions.count]
        let source = family.sites[site]
        var sequence: UInt64 = 0
        let interval = Double(options.devices) / options.rate
        while true {
            let phase = currentPhase
            if phase == .done { return }
            if phase == .idle { try? await Task.sleep(for: .milliseconds(50)); continue }
            if phase == .steady { try? await Task.sleep(for: .milliseconds(Int64(interval * Double.random(in: 0.5...1.5) * 1000))) }
            sequence += 1
            let body = envelope(family: family.id, source: source, sequence: sequence, payload: options.payloadBytes)
            let url = URL(string: "\(server.absoluteString)/v1/families/\(family.id)/sites/\(source)/deltas?from=\(sequence)&to=\(sequence)&full=0&current=\(sequence)")!
            let began = ContinuousClock.now
            times.started("\(family.id) \(source) \(sequence)", at: began)
            do {
                let (_, status) = try await request("POST", url, token: family.token, body: body, session: session)
                if status == 201 || status == 200 {
                    accepted.add()
                    switch currentPhase {
                    case .saturation: acceptedSaturation.add()
                    case .steady:
                        acceptedSteady.add()
                        uploadLatency.add(Double(began.duration(to: .now).components.attoseconds) / 1e18 + Double(began.duration(to: .now).components.seconds))
                    default: break
                    }
                } else {
                    failed.add()
                }
            } catch {
                failed.add()
                try? await Task.sleep(for: .milliseconds(100))
            }
        }
    }

    /// A device's long-poll loop: the family's files after its cursor (others' only), with
    /// their bytes; each one's propagation is the time since its upload began.
    func longPolls(family: SimulatedFamily, site: Int, index: Int) async {
        let server = servers[(index + 1) % servers.count]
        let session = sessions[(index + 3) % sessions.count]
        let me = family.sites[site]
        var cursor: UInt64 = 0
        while currentPhase != .done {
            let url = URL(string: "\(server.absoluteString)/v1/families/\(family.id)/log?after=\(cursor)&wait=5s&exclude=\(me)&bodies=1&limit=512")!
            guard let (data, status) = try? await request("GET", url, token: family.token, session: session), status == 200 else {
                failed.add()
                try? await Task.sleep(for: .milliseconds(100))
                continue
            }
            let arrived = ContinuousClock.now
            let bytes = [UInt8](data)
            var offset = 0
            // position u64, source (16), from u64, to u64, full u8, length u32, bytes
            while offset + 45 <= bytes.count {
                let position = bytes[offset..<offset + 8].reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
                let source = RecordID(bytes: bytes[offset + 8..<offset + 24])!
                let to = bytes[offset + 32..<offset + 40].reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
                let length = Int(bytes[offset + 41..<offset + 45].reversed().reduce(UInt32(0)) { $0 << 8 | UInt32($1) })
                offset += 45 + length
                cursor = max(cursor, position)
                received.add()
                if currentPhase == .steady, let began = times.take("\(family.id) \(source) \(to)") {
                    let elapsed = began.duration(to: arrived)
                    propagation.add(Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
                }
            }
        }
    }
}

// MARK: Real stores

struct Note: Record {
    var id = RecordID()
    var text: String
}

/// Pairs of real stores (a writer and a reader of one family, each on a server): the writer
/// inserts a note and syncs every 200 ms; the reader long-polls (`changes`) and fetches when
/// woken; a note's propagation is from the start of the writer's sync to the end of the fetch
/// that made it readable in the reader's store.
func realPairs(_ options: Options, servers: [URL], directory: String, load: Load) async -> Samples {
    let samples = Samples()
    await withTaskGroup(of: Void.self) { group in
        for pair in 0..<options.realPairs {
            let family = RecordID()
            let key = try! SyncKey((0..<32).map { _ in UInt8.random(in: 0...255) })
            func open(_ name: String) -> SyncEngine {
                var storeOptions = StoreOptions()
                storeOptions.durability = .none
                let store = try! Store.open(at: "\(directory)/\(name)", types: [Note.self], options: storeOptions)
                return try! SyncEngine(store: store, configuration: SyncConfiguration(family: family, key: key))
            }
            let writer = open("w\(pair)"), reader = open("r\(pair)")
            let retry = HTTPRelayTransport.RetryPolicy(giveUpAfter: .seconds(20))
            let writerRelay = HTTPRelayTransport(server: servers[pair % servers.count], retry: retry)
            let readerRelay = HTTPRelayTransport(server: servers[(pair + 1) % servers.count], retry: retry)
            let written = UploadTimes()
            _ = try? await writer.sync(via: writerRelay)
            _ = try? await reader.sync(via: readerRelay)
            group.addTask {
                while load.currentPhase != .done {
                    try? await Task.sleep(for: .milliseconds(200))
                    guard load.currentPhase == .steady else { continue }
                    let note = Note(text: "n")
                    try? writer.store.insert(note)
                    written.started(note.id.description, at: .now)
                    _ = try? await writer.sync(via: writerRelay)
                }
            }
            group.addTask {
                var position: Int64 = 0
                var seen = Set<RecordID>()
                while load.currentPhase != .done {
                    position = (try? await readerRelay.changes(for: reader, after: position, wait: .seconds(2))) ?? position
                    _ = try? await reader.fetchChanges(via: readerRelay)
                    let now = ContinuousClock.now
                    for note in (try? reader.store.fetch(FetchDescriptor<Note>())) ?? [] where seen.insert(note.id).inserted {
                        if let began = written.take(note.id.description) {
                            let elapsed = began.duration(to: now)
                            samples.add(Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18)
                        }
                    }
                }
            }
        }
    }
    return samples
}

// MARK: Run

let options = Options()
let info = ProcessInfo.processInfo
say("starting PostgreSQL")
let cluster = Cluster()
let servers = (0..<options.servers).map { _ in Server(binary: options.server, postgres: cluster.url) }
say("\(servers.count) server(s) up; \(options.devices) devices in families of \(options.familySize)")
let load = Load(options: options, servers: servers.map(\.url))
let scratch = NSTemporaryDirectory() + "stash-relay-bench-stores-" + UUID().uuidString
try? FileManager.default.createDirectory(atPath: scratch, withIntermediateDirectories: true)
let loadAverageBefore = (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8))?.split(separator: " ").prefix(3).joined(separator: " ") ?? "?"

let walStart = cluster.sql("SELECT pg_current_wal_lsn()")
let results = await withTaskGroup(of: Samples?.self) { group -> (real: Samples, saturation: Double, steady: Double, rssPeak: [Int]) in
    for (n, family) in load.families.enumerated() {
        for site in 0..<options.familySize {
            let index = n * options.familySize + site
            group.addTask { await load.uploads(family: family, site: site, index: index); return nil }
            group.addTask { await load.longPolls(family: family, site: site, index: index); return nil }
        }
    }
    group.addTask { await realPairs(options, servers: servers.map(\.url), directory: scratch, load: load) }
    // Every device connected and long-polling first.
    try? await Task.sleep(for: .seconds(3))
    say("saturation phase: \(Int(options.saturationSeconds)) s, every device uploading back to back")
    load.phase.store(Phase.saturation.rawValue, ordering: .relaxed)
    let saturationStart = ContinuousClock.now
    try? await Task.sleep(for: .seconds(options.saturationSeconds))
    let saturationSeconds = saturationStart.duration(to: .now)
    let saturation = Double(load.acceptedSaturation.current) / (Double(saturationSeconds.components.seconds) + Double(saturationSeconds.components.attoseconds) / 1e18)
    say("steady phase: \(Int(options.steadySeconds)) s at \(Int(options.rate)) deltas/s offered")
    load.phase.store(Phase.steady.rawValue, ordering: .relaxed)
    let steadyStart = ContinuousClock.now
    try? await Task.sleep(for: .seconds(options.steadySeconds))
    let steadySeconds = steadyStart.duration(to: .now)
    let steady = Double(load.acceptedSteady.current) / (Double(steadySeconds.components.seconds) + Double(steadySeconds.components.attoseconds) / 1e18)
    let peaks = servers.map { $0.memory.peak }
    load.phase.store(Phase.done.rawValue, ordering: .relaxed)
    var real = Samples()
    for await result in group { if let result { real = result } }
    return (real, saturation, steady, peaks)
}
let serverMemory = servers.map(\.memory)
let stored = Int(cluster.sql("SELECT count(*) FROM stash_relay_files")) ?? 0
let tableBytes = Int(cluster.sql("SELECT pg_total_relation_size('stash_relay_files')")) ?? 0
let walBytes = Int(cluster.sql("SELECT pg_wal_lsn_diff(pg_current_wal_lsn(), '\(walStart)')")) ?? 0
let bodyBytes = Int(cluster.sql("SELECT coalesce(sum(size), 0) FROM stash_relay_files")) ?? 0
let loadAverageAfter = (try? String(contentsOfFile: "/proc/loadavg", encoding: .utf8))?.split(separator: " ").prefix(3).joined(separator: " ") ?? "?"
for server in servers { server.stop() }
cluster.destroy()
try? FileManager.default.removeItem(atPath: scratch)

let perDelta = { (bytes: Int) in stored > 0 ? "\(bytes / stored) B" : "–" }
let date = ISO8601DateFormatter().string(from: Date())
print("""
# Relay service under load

commit \(options.commit), \(date); \(info.activeProcessorCount) cores (shared with the other engineers' builds), load average before \(loadAverageBefore), after \(loadAverageAfter).
\(options.devices) simulated devices in families of \(options.familySize), \(options.servers) stash-relay server(s) (release), PostgreSQL \(cluster.bin.split(separator: "/").dropLast().last ?? "?") (fsync on, synchronous_commit on, shared_buffers 256MB), deltas of \(options.payloadBytes + 28 + 71) bytes; \(options.realPairs) pairs of real stores (SyncEngine + HTTPRelayTransport) alongside.

| measure | value | goal |
|---|---|---|
| accepted deltas/s, saturation (\(Int(options.saturationSeconds)) s, every device uploading back to back) | \(Int(results.saturation)) | ≥ 5,000 |
| accepted deltas/s, steady phase (\(Int(options.rate)) offered, \(Int(options.steadySeconds)) s) | \(Int(results.steady)) | |
| upload round trip p50 / p99, steady | \(ms(load.uploadLatency.percentile(0.5))) / \(ms(load.uploadLatency.percentile(0.99))) | |
| propagation on the wire p50 / p99, steady (upload begins → another device's long-poll has it; \(load.propagation.count) samples) | \(ms(load.propagation.percentile(0.5))) / \(ms(load.propagation.percentile(0.99))) | p99 < 250 ms |
| propagation store to store p50 / p99, steady (writer's sync begins → readable in the reader's store; \(results.real.count) samples) | \(ms(results.real.percentile(0.5))) / \(ms(results.real.percentile(0.99))) | p99 < 250 ms |
| failed requests (errors, non-2xx) | \(load.failed.current) | |
| server RSS at the end / peak | \(serverMemory.map { "\($0.rss / 1024) MiB" }.joined(separator: ", ")) / \(results.rssPeak.map { "\($0 / 1024) MiB" }.joined(separator: ", ")) | |
| PostgreSQL bytes per stored delta: table + indexes / WAL (body \(perDelta(bodyBytes))) | \(perDelta(tableBytes)) / \(perDelta(walBytes)) | |
| deltas stored / delivered to long-polls | \(stored) / \(load.received.current) | |
""")
