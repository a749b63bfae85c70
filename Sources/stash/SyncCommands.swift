import ArgumentParser
import Foundation
import Stash
import StashSync

/// Options shared by the sync commands.
struct SyncOptions: ParsableArguments {
    @Option(name: .long, help: "A file whose bytes, every one, are the shared sync key (HMAC-SHA256; at least 16, e.g. `head -c 32 /dev/urandom > sync.key`). Every store of the family must use the same key: copy the file, never retype it (a newline more or less is another key). A store remembers its family's key (its fingerprint, in `stash peers`) at its first exchange with it, and refuses every command without it from then on.")
    var keyFile: String?

    func key() throws -> SyncKey? {
        guard let keyFile else { return nil }
        let data = try readWholeFile(keyFile, "key file ")
        guard data.count >= 16 else { throw CommandFailure(message: "key file \(keyFile) holds \(data.count) bytes; use at least 16 random bytes") }
        return try SyncKey(data)
    }
}

/// An engine for a store opened by the CLI; the family is adopted when given. `say` prints
/// what opening it did (standard error where standard output carries a delta).
func syncEngine(_ store: Store, family: RecordID?, key: SyncKey?, say: (String) -> Void = printLine) throws -> SyncEngine {
    let engine: SyncEngine
    var configuration = SyncConfiguration(family: family, key: key)
    configuration.progress = syncProgress()   // a first sync or a full snapshot of a big store takes a while
    do { engine = try openSync(store, configuration, say: say) }
    catch let error as SyncError where error.code == .noFamily {
        throw CommandFailure(message: "\(store.path) has no sync family yet; pass --family UUID (the same for every store that syncs together)")
    }
    guard engine.isEnabled else {
        throw CommandFailure(message: "sync is off for \(store.path) (its preference); nothing was exchanged and every change stays local")
    }
    return engine
}

/// `SyncEngine(store:configuration:)`. Opening sync retries the parked deltas: those the
/// schema reads now are applied there, before the command's own exchange (which then finds
/// them applied), so `say` is told which.
func openSync(_ store: Store, _ configuration: SyncConfiguration, say: (String) -> Void) throws -> SyncEngine {
    let parkedBefore = SyncEngine.parkedDeltas(of: store)
    let engine = try SyncEngine(store: store, configuration: configuration)
    let stillParked = Set(engine.parkedDeltas())
    let applied = parkedBefore.filter { !stillParked.contains($0) }
    if !applied.isEmpty {
        say("\(store.path): applied \(applied.count) parked delta(s) that its schema reads now: \(applied.joined(separator: ", "))")
    }
    return engine
}

func syncProgress() -> @Sendable (SyncProgress) -> Void {
    { progress in printError("\(progress)") }
}

struct Sync: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Exchange changes between two stores, or between a store and a relay directory.",
        discussion: """
        stash sync DIR_A DIR_B        both ways, directly
        stash sync DIR --relay RELAY  send to and fetch from a shared relay folder
        Stores of one family sync; the first sync gives both stores a family when neither has one.
        A new store synced with a relay (--family, and --key-file for a family with a key)
        restores the family's data from the relay's checkpoint and the files after it.
        """)
    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The other store directory (direct sync).") var other: String?
    @Option(help: "A relay directory shared by the stores (stands for a cloud container); it must exist.") var relay: String?
    @Option(help: "The family id to adopt (a UUID), for a store that has none.") var family: String?
    @Flag(help: "With --relay: publish a checkpoint (the store's whole synced state) after the exchange, whether one is due or not.")
    var checkpoint = false
    @OptionGroup var options: SyncOptions

    func validate() throws {
        guard (other == nil) != (relay == nil) else { throw ValidationError("give either a second store directory or --relay DIR") }
        if checkpoint && relay == nil { throw ValidationError("--checkpoint goes with --relay (a direct peer keeps no checkpoints)") }
    }

    func run() async throws {
        try await runCommand {
            let key = try options.key()
            let store = try openExisting(directory)
            let wanted = try family.map(parseFamily)
            if let other {
                let peerStore = try openExisting(other)
                if peerStore.path == store.path {
                    throw CommandFailure(message: "\(directory) and \(other) are the same store (\(store.path)); give two stores, or --relay DIR")
                }
                let mine = try SyncEngine.family(of: store), theirs = try SyncEngine.family(of: peerStore)
                if let mine, let theirs, mine != theirs {
                    throw CommandFailure(message: "\(directory) belongs to family \(mine) and \(other) to \(theirs); stores of different families never sync")
                }
                let shared = wanted ?? mine ?? theirs ?? RecordID()
                let a = try syncEngine(store, family: shared, key: key)
                let b = try syncEngine(peerStore, family: shared, key: key)
                let parkedBefore = Set(SyncEngine.parkedDeltas(of: peerStore))
                let there = try await a.sync(via: DirectTransport(to: b))
                printLine("\(directory) → \(other): \(there)")
                // What the peer parked (a type or field its schema lacks) it has not applied.
                let parked = SyncEngine.parkedReasons(of: peerStore).filter { entry in !parkedBefore.contains(where: { entry.hasPrefix($0 + " ") }) }
                if !parked.isEmpty {
                    printLine("\(other) parked \(parked.count) delta(s) until its schema can merge them (`stash peers \(other)` lists them): \(parked.joined(separator: "; "))")
                }
                printLine("status: \(try a.status(peer: b.site)); peer: \(try b.status(peer: a.site))")
                try failOnRefusals(there)
            } else if let relay {
                if FileManager.default.fileExists(atPath: (relay as NSString).appendingPathComponent("data.mdb")) {
                    throw CommandFailure(message: "\(relay) is a store, not a relay directory; give a folder the stores share (or sync two stores directly: stash sync \(directory) \(relay))")
                }
                let engine = try syncEngine(store, family: wanted, key: key)
                let transport = RelayTransport(directory: URL(fileURLWithPath: relay))
                let report = try await engine.sync(via: transport)
                printLine("\(directory) ⇄ relay \(relay): \(report)")
                if checkpoint, report.checkpointEntries == nil {
                    printLine("published a checkpoint of \(try await engine.publishCheckpoint(via: transport)) record states")
                }
                printLine("status: \(try await engine.status(via: transport))")
                try failOnRefusals(report)
            }
        }
    }
}

/// A sync that refused deltas did not finish: the command fails after printing its report.
private func failOnRefusals(_ report: SyncReport) throws {
    if let first = report.refused.first {
        throw CommandFailure(message: "\(report.refused.count) delta(s) refused, first: \(first)")
    }
}

struct ExportDelta: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "export-delta",
        abstract: "Write the changes a peer has not received to a delta file.",
        discussion: "The peer's watermark moves only when the peer imports the file and syncs back; exporting twice is harmless.")
    @Argument(help: "The store directory.") var directory: String
    @Option(help: "The peer's site id (from `stash peers` or `stash stat` on the peer).") var peer: String
    @Option(name: .shortAndLong, help: "The delta file to write (replaced atomically), or - for standard output.") var output: String
    @Option(help: "The family id to adopt (a UUID), for a store that has none.") var family: String?
    @OptionGroup var options: SyncOptions

    func run() throws {
        try runCommand {
            // Checked before the engine, which may adopt the family (a write).
            var isDirectory: ObjCBool = false
            if output != "-", FileManager.default.fileExists(atPath: output, isDirectory: &isDirectory), isDirectory.boolValue {
                throw CommandFailure(message: "cannot write \(output): it is a directory; name the delta file to write")
            }
            let store = try openExisting(directory)
            let peerSite = try parseID(peer, as: "a site id (the peer's, as `stash peers` or `stash stat` shows it)")
            let engine = try syncEngine(store, family: try family.map(parseFamily), key: try options.key(),
                                        say: output == "-" ? printError : printLine)
            let delta = try engine.makeDelta(for: peerSite)
            let data = delta.encoded(key: try options.key())
            let summary = "\(delta.entries.count) record states, history \(delta.from)...\(delta.to)\(delta.isFullSnapshot ? " (full snapshot)" : ""), \(data.count) bytes"
            if output == "-" {
                // The delta is standard output; what was written goes to standard error.
                guard writeAll(STDOUT_FILENO, Array(data)) else { throw CommandFailure(message: "cannot write the delta to standard output: \(String(cString: strerror(errno)))") }
                printError("wrote \(summary) to standard output")
                return
            }
            do { try data.write(to: URL(fileURLWithPath: output), options: .atomic) }
            catch { throw CommandFailure(message: "cannot write \(output): \(error.localizedDescription)") }
            printLine("wrote \(output): \(summary)")
        }
    }
}

struct ImportDelta: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "import-delta",
        abstract: "Validate a delta file completely, then apply it in one transaction.")
    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The delta file.") var file: String
    @Option(help: "The family id to adopt (a UUID), for a store that has none.") var family: String?
    @OptionGroup var options: SyncOptions

    func run() throws {
        try runCommand {
            let store = try openExisting(directory)
            let data = try readWholeFile(file)
            var configuration = SyncConfiguration(family: try family.map(parseFamily), key: try options.key())
            configuration.progress = syncProgress()
            if try SyncEngine.family(of: store) == nil {
                // A first import joins the delta's family; a file that is no delta (or needs a
                // key, or is of another family than --family) says so here, before the family
                // is written.
                let family = try Delta(decoding: data, key: configuration.key, name: file).family
                if let given = configuration.family, given != family {
                    throw CommandFailure(message: "\(file) belongs to family \(family), not \(given) (--family); nothing was changed")
                }
                configuration.family = family
            }
            let engine = try openSync(store, configuration, say: printLine)
            guard engine.isEnabled else { throw CommandFailure(message: "sync is off for \(store.path); the delta was not applied") }
            switch try engine.apply(data, name: (file as NSString).lastPathComponent) {
            case .applied(let entries, let changed, let clashes):
                printLine("applied \(entries) record states (\(changed) changed)")
                for clash in clashes { printLine("deleted for a unique value another record holds: \(clash)") }
            case .duplicate: printLine("already applied; nothing to do")
            case .parked(let reason): printLine("parked until the schema catches up: \(reason)")
            }
        }
    }
}

struct Peers: ParsableCommand {
    static let configuration = CommandConfiguration(abstract: "List the peers a store has synced with and its pending changes.")
    @Argument(help: "The store directory.") var directory: String

    func run() throws {
        try runCommand {
            // Read-only: looking at a copy must not give it a site of its own.
            let store = try openExisting(directory, readOnly: true)
            let key = try SyncEngine.keyFingerprint(of: store).map { "sync key \($0)" } ?? "no sync key (relay files unencrypted)"
            printLine("site \(store.siteID)  family \(try SyncEngine.family(of: store).map(\.description) ?? "none")  \(key)  sync preference \(store.syncPreferenceAtOpen ? "on" : "off")")
            guard try SyncEngine.family(of: store) != nil else { return }
            for peer in try SyncEngine.peers(of: store).sorted(by: { $0.site < $1.site }) {
                let pending = try SyncEngine.status(of: store, site: peer.site, enabled: store.syncPreferenceAtOpen).pendingOutgoing
                let forgotten = peer.forgotten.map { " (forgotten \(ISO8601DateFormatter().string(from: $0)): history it lacks may be purged)" } ?? ""
                printLine("peer \(peer.site): sent through \(peer.sentThrough), received through \(peer.receivedThrough), \(pending) changes pending\(forgotten)")
            }
            let parked = SyncEngine.parkedReasons(of: store)
            if !parked.isEmpty { printLine("parked deltas: \(parked.joined(separator: "; "))") }
            let parkedElsewhere = try SyncEngine.status(of: store, enabled: store.syncPreferenceAtOpen).parkedAtPeer
            if !parkedElsewhere.isEmpty { printLine("deltas of this store parked at peers: \(parkedElsewhere.joined(separator: "; "))") }
        }
    }
}

struct ForgetPeer: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "forget-peer",
        abstract: "Stop keeping history for a peer or relay that is gone (a retired device).",
        discussion: """
            History a peer has not received is kept for it, and purging it is refused naming the peer. \
            After this, it may be purged. Should the peer come back, its changes still apply, and it gets \
            what it lacks (a full snapshot once that history is purged).
            """)
    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The peer's name as `stash peers` lists it (a site id, or relay.<id>).") var site: String

    func run() throws {
        try runCommand {
            let store = try openExisting(directory)
            guard try SyncEngine.family(of: store) != nil else {
                throw CommandFailure(message: "\(store.path) has never synced (no sync family): it has no peers to forget")
            }
            guard try SyncEngine(store: store).forget(site: site) else {
                let known = try SyncEngine.peers(of: store).map(\.site).sorted()
                throw CommandFailure(message: "\(store.path) has no peer '\(site)' (peers: \(known.isEmpty ? "none" : known.joined(separator: ", ")))")
            }
            printLine("forgot peer \(site): history it has not received may now be purged")
        }
    }
}
