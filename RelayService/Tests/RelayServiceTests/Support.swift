import Foundation
#if canImport(FoundationNetworking)
import FoundationNetworking
#endif
import Stash
import StashSync
import Synchronization
import Testing

// MARK: Errors

struct HarnessError: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}

// MARK: Processes

/// Starts `executable` (as the `postgres` user when asked and this process is root:
/// PostgreSQL refuses to run as root), its standard output and error appended to the file
/// `output`, nothing else of this process open in it. With `posix_spawn`, not Foundation's
/// `Process`: a child that leaves a daemon behind (`pg_ctl start`) would hand it the socket by
/// which `Process` notices the child's end, and `waitUntilExit` would wait for the daemon.
func spawn(_ executable: String, _ arguments: [String], output: String, asPostgres: Bool = false) throws -> pid_t {
    var arguments = arguments
    var executable = executable
    if asPostgres && getuid() == 0 {
        arguments = ["-u", "postgres", "--", executable] + arguments
        executable = "/usr/sbin/runuser"
    }
    var actions = posix_spawn_file_actions_t()
    posix_spawn_file_actions_init(&actions)
    defer { posix_spawn_file_actions_destroy(&actions) }
    posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
    posix_spawn_file_actions_addopen(&actions, 1, output, O_WRONLY | O_CREAT | O_APPEND, 0o644)
    posix_spawn_file_actions_adddup2(&actions, 1, 2)
    closeFrom3(&actions)
    let argv = ([executable] + arguments).map { strdup($0) } + [nil]
    defer { for pointer in argv { free(pointer) } }
    var pid: pid_t = 0
    let status = posix_spawn(&pid, executable, &actions, nil, argv, environ)
    guard status == 0 else { throw HarnessError("cannot start \(executable): \(String(cString: strerror(status)))") }
    return pid
}

/// Adds "close every descriptor from 3 on" to `actions` (glibc's
/// posix_spawn_file_actions_addclosefrom_np, looked up at run time: Swift's Glibc module does
/// not declare it); without it, each descriptor open now.
private func closeFrom3(_ actions: inout posix_spawn_file_actions_t) {
    typealias CloseFrom = @convention(c) (UnsafeMutablePointer<posix_spawn_file_actions_t>, Int32) -> Int32
    if let symbol = dlsym(UnsafeMutableRawPointer(bitPattern: 0), "posix_spawn_file_actions_addclosefrom_np") {
        _ = unsafeBitCast(symbol, to: CloseFrom.self)(&actions, 3)
        return
    }
    for name in (try? FileManager.default.contentsOfDirectory(atPath: "/proc/self/fd")) ?? [] {
        if let fd = Int32(name), fd >= 3 { posix_spawn_file_actions_addclose(&actions, fd) }
    }
}

/// Waits for the child `pid` to end; its exit status (128 + the signal that ended it).
@discardableResult
func waitFor(_ pid: pid_t) -> Int32 {
    var status: Int32 = 0
    while waitpid(pid, &status, 0) < 0 && errno == EINTR {}
    return status & 0x7F == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
}

/// Runs a command to its end; throws with its output when it fails.
@discardableResult
func run(_ executable: String, _ arguments: [String], asPostgres: Bool = false) throws -> String {
    let output = NSTemporaryDirectory() + "stash-relay-run-" + UUID().uuidString
    defer { try? FileManager.default.removeItem(atPath: output) }
    let status = waitFor(try spawn(executable, arguments, output: output, asPostgres: asPostgres))
    let text = (try? String(contentsOfFile: output, encoding: .utf8)) ?? ""
    guard status == 0 else {
        throw HarnessError("\(executable) \(arguments.joined(separator: " ")) exited \(status): \(text)")
    }
    return text
}

/// A free TCP port on 127.0.0.1 (bound, read, released).
func freePort() throws -> Int {
    let fd = socket(AF_INET, Int32(SOCK_STREAM.rawValue), 0)
    guard fd >= 0 else { throw HarnessError("socket: \(String(cString: strerror(errno)))") }
    defer { close(fd) }
    var address = sockaddr_in()
    address.sin_family = sa_family_t(AF_INET)
    address.sin_port = 0
    address.sin_addr.s_addr = inet_addr("127.0.0.1")
    var length = socklen_t(MemoryLayout<sockaddr_in>.size)
    let bound = withUnsafeMutablePointer(to: &address) {
        $0.withMemoryRebound(to: sockaddr.self, capacity: 1) { bind(fd, $0, length) == 0 && getsockname(fd, $0, &length) == 0 }
    }
    guard bound else { throw HarnessError("bind: \(String(cString: strerror(errno)))") }
    return Int(UInt16(bigEndian: address.sin_port))
}

// MARK: PostgreSQL

/// A throwaway PostgreSQL cluster: `initdb` in a temporary directory, `pg_ctl` on a loopback
/// port, removed at ``destroy()``. Debian's `postgresql` package (`make test` installs it).
final class PostgresCluster: Sendable {
    let directory: String
    let port: Int
    let bin: String

    init() throws {
        let versions = ((try? FileManager.default.contentsOfDirectory(atPath: "/usr/lib/postgresql")) ?? [])
            .compactMap(Int.init).sorted()
        guard let version = versions.last, FileManager.default.isExecutableFile(atPath: "/usr/lib/postgresql/\(version)/bin/initdb") else {
            throw HarnessError("PostgreSQL's server is not installed (no /usr/lib/postgresql/N/bin/initdb): `make test` installs Debian's postgresql package, or run `apt-get install -y postgresql`")
        }
        bin = "/usr/lib/postgresql/\(version)/bin"
        var template = Array("/tmp/stash-relay-pg-XXXXXX".utf8CString)
        guard let made = mkdtemp(&template) else { throw HarnessError("mkdtemp: \(String(cString: strerror(errno)))") }
        directory = String(cString: made)
        port = try freePort()
        if getuid() == 0 { try run("/bin/chown", ["postgres:postgres", directory]) }
        try run("\(bin)/initdb", ["-D", "\(directory)/data", "-A", "trust", "-U", "postgres", "-E", "UTF8", "--no-sync", "--no-instructions"],
                asPostgres: true)
        try start()
    }

    /// Starts the cluster (and waits until it takes connections).
    func start() throws {
        // fsync off: a test cluster lives for one run; the benchmark keeps PostgreSQL's defaults.
        try run("\(bin)/pg_ctl", ["-D", "\(directory)/data", "-l", "\(directory)/log", "-w", "-t", "60", "-o",
                                  "-p \(port) -k \(directory) -c listen_addresses=127.0.0.1 -c fsync=off -c max_connections=200",
                                  "start"], asPostgres: true)
    }

    /// Stops the cluster (`fast`: disconnects every client, as a restart does).
    func stop(mode: String = "fast") throws {
        try run("\(bin)/pg_ctl", ["-D", "\(directory)/data", "-w", "-t", "60", "-m", mode, "stop"], asPostgres: true)
    }

    func destroy() {
        try? stop(mode: "immediate")
        try? FileManager.default.removeItem(atPath: directory)
    }

    /// A new empty database, for one test.
    func createDatabase() throws -> String {
        let name = "t_" + UUID().uuidString.lowercased().replacingOccurrences(of: "-", with: "").prefix(16)
        try run("\(bin)/createdb", ["-h", "127.0.0.1", "-p", String(port), "-U", "postgres", String(name)], asPostgres: true)
        return String(name)
    }

    func url(_ database: String) -> String { "postgres://postgres@127.0.0.1:\(port)/\(database)" }

    /// Runs SQL in `database` and returns psql's unaligned output.
    @discardableResult
    func sql(_ database: String, _ statement: String) throws -> String {
        try run("\(bin)/psql", ["-h", "127.0.0.1", "-p", String(port), "-U", "postgres", "-d", database, "-At", "-v", "ON_ERROR_STOP=1", "-c", statement],
                asPostgres: true).trimmingCharacters(in: .whitespacesAndNewlines)
    }
}

/// The cluster every test of the suite shares, started once before them and stopped after.
struct SharedPostgres: SuiteTrait, TestScoping {
    @TaskLocal static var cluster: PostgresCluster?

    func provideScope(for test: Test, testCase: Test.Case?, performing function: @Sendable () async throws -> Void) async throws {
        let cluster = try PostgresCluster()
        defer { cluster.destroy() }
        try await Self.$cluster.withValue(cluster) { try await function() }
    }

    /// The shared cluster and a new empty database of it, for one test.
    static func newDatabase() throws -> (PostgresCluster, String) {
        let cluster = try current
        return (cluster, try cluster.createDatabase())
    }

    static var current: PostgresCluster {
        get throws {
            guard let cluster else { throw HarnessError("no PostgreSQL cluster: run the test inside RelayServiceTests (its trait starts one)") }
            return cluster
        }
    }
}

// MARK: Relay server processes

/// A `stash-relay serve` process on a loopback port.
final class RelayServerProcess: @unchecked Sendable {
    let port: Int
    let postgres: String
    let arguments: [String]
    let logPath: String
    private(set) var pid: pid_t = 0
    private var running = false

    /// Where the test binary's build put `stash-relay` (STASH_RELAY_BIN overrides).
    static var binary: String {
        if let path = ProcessInfo.processInfo.environment["STASH_RELAY_BIN"] { return path }
        var directory = URL(fileURLWithPath: CommandLine.arguments[0]).deletingLastPathComponent()
        // Linux: .build/debug/StashRelayServicePackageTests.xctest; macOS: …xctest/Contents/MacOS/…
        while !FileManager.default.isExecutableFile(atPath: directory.appendingPathComponent("stash-relay").path), directory.path != "/" {
            directory.deleteLastPathComponent()
        }
        return directory.appendingPathComponent("stash-relay").path
    }

    init(postgres: String, port: Int? = nil, arguments: [String] = []) throws {
        self.postgres = postgres
        self.port = try port ?? freePort()
        self.arguments = arguments
        logPath = NSTemporaryDirectory() + "stash-relay-\(self.port)-\(UUID().uuidString.prefix(8)).log"
        try start()
    }

    var url: URL { URL(string: "http://127.0.0.1:\(port)")! }

    /// Starts the process and waits until `/health` answers 200.
    func start() throws {
        guard FileManager.default.isExecutableFile(atPath: Self.binary) else {
            throw HarnessError("no stash-relay at \(Self.binary): build the package first (swift build --build-tests)")
        }
        pid = try spawn(Self.binary, ["serve", "--postgres", postgres, "--port", String(port)] + arguments, output: logPath)
        running = true
        let deadline = Date().addingTimeInterval(60)
        while Date() < deadline {
            var status: Int32 = 0
            if waitpid(pid, &status, WNOHANG) == pid {
                running = false
                throw HarnessError("stash-relay exited at start: \(self.log)")
            }
            if (try? httpStatus(url.appendingPathComponent("health"))) == 200 { return }
            usleep(50_000)
        }
        throw HarnessError("stash-relay did not answer /health within 60 s: \(self.log)")
    }

    var log: String { (try? String(contentsOfFile: logPath, encoding: .utf8)) ?? "" }

    /// kill -9, then wait for the process to be gone.
    func kill9() {
        guard running else { return }
        kill(pid, SIGKILL)
        waitFor(pid)
        running = false
    }

    /// SIGTERM: a graceful shutdown. Returns the exit status.
    func terminate() -> Int32 {
        guard running else { return -1 }
        kill(pid, SIGTERM)
        running = false
        return waitFor(pid)
    }

    deinit {
        kill9()
        try? FileManager.default.removeItem(atPath: logPath)
    }
}

/// The status of a plain GET (no token), synchronously.
func httpStatus(_ url: URL) throws -> Int {
    let result = Mutex<Result<Int, any Error>?>(nil)
    let done = DispatchSemaphore(value: 0)
    var request = URLRequest(url: url)
    request.timeoutInterval = 2
    let task = URLSession.shared.dataTask(with: request) { _, response, error in
        result.withLock { $0 = error.map { .failure($0) } ?? .success((response as? HTTPURLResponse)?.statusCode ?? 0) }
        done.signal()
    }
    task.resume()
    done.wait()
    return try result.withLock { $0! }.get()
}

/// One HTTP request with a chosen token (hex), for the tests of the API itself.
func request(_ method: String, _ url: URL, token: String?, body: Data? = nil, headers: [String: String] = [:]) async throws -> (Int, Data, HTTPURLResponse) {
    var request = URLRequest(url: url)
    request.httpMethod = method
    request.timeoutInterval = 30
    if let token { request.setValue("Bearer \(token)", forHTTPHeaderField: "Authorization") }
    for (name, value) in headers { request.setValue(value, forHTTPHeaderField: name) }
    request.httpBody = body
    let (data, response) = try await URLSession.shared.data(for: request)
    let http = response as! HTTPURLResponse
    return (http.statusCode, data, http)
}

func hex(_ bytes: [UInt8]) -> String { bytes.map { String(format: "%02x", $0) }.joined() }

// MARK: Stores

struct Note: Record, Equatable {
    var id = RecordID()
    var title: String
    var body: String
    var author: String
    static let indexes: [RecordIndex<Note>] = [.index(\.author)]
}

struct Wallet: Record, Equatable {
    var id = RecordID()
    var credits = Counter()
}

struct Garment: Record, Equatable {
    var id = RecordID()
    var name: String
    var image: ExternalData?
}

let allTypes: [any Record.Type] = [Note.self, Wallet.self, Garment.self]

/// A temporary directory removed when the value goes.
final class Scratch: Sendable {
    let path: String
    init() {
        path = NSTemporaryDirectory() + "stash-relay-test-" + UUID().uuidString
        try? FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
    }
    func sub(_ name: String) -> String { path + "/" + name }
    deinit { try? FileManager.default.removeItem(atPath: path) }
}

/// A store of the family and its engine.
struct Device {
    let name: String
    let store: Store
    let engine: SyncEngine

    init(_ path: String, family: RecordID, key: SyncKey?) throws {
        name = (path as NSString).lastPathComponent
        var options = StoreOptions()
        options.durability = .none
        store = try Store.open(at: path, types: allTypes, options: options)
        engine = try SyncEngine(store: store, configuration: SyncConfiguration(family: family, key: key))
    }

    /// Every note, by id.
    func notes() throws -> [RecordID: Note] {
        Dictionary(uniqueKeysWithValues: try store.fetch(FetchDescriptor<Note>()).map { ($0.id, $0) })
    }
}

/// A family: its id and key, and a transport to a server with short retries.
struct Family {
    let id = RecordID()
    let key: SyncKey
    init() { key = try! SyncKey((0..<32).map { _ in UInt8.random(in: 0...255) }) }
    var token: String { hex(FamilyKeys(key: key, family: id).relayToken) }
}

func transport(_ server: RelayServerProcess, giveUpAfter: Duration = .seconds(20)) -> HTTPRelayTransport {
    HTTPRelayTransport(server: server.url, retry: .init(initialDelay: .milliseconds(50), maximumDelay: .milliseconds(500), giveUpAfter: giveUpAfter),
                       requestTimeout: 15)
}

/// A flag one task sets and another reads.
final class Flag: Sendable {
    private let value = Mutex(false)
    func set() { value.withLock { $0 = true } }
    var isSet: Bool { value.withLock { $0 } }
}

/// Polls `condition` until it holds or `seconds` pass.
func eventually(_ seconds: Double = 20, _ condition: () async throws -> Bool) async throws -> Bool {
    let deadline = Date().addingTimeInterval(seconds)
    while Date() < deadline {
        if try await condition() { return true }
        try await Task.sleep(for: .milliseconds(50))
    }
    return try await condition()
}
