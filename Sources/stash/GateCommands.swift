import ArgumentParser
import Foundation
import Stash
import StashGate

/// `stash gate …`: the verbs on a store (`stash gate DIR VERB`, the default) and the two that
/// need none, `keygen` and `sign-snapshot`, so that a snapshot can be made and applied from
/// the command line alone.
struct Gate: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Entitlements and free-tier limits; keys and signed snapshots.",
        discussion: """
        stash gate DIR VERB …          a store's entitlement, limits, credits
                                       (stash gate on-store --help)
        stash gate keygen NAME         an Ed25519 key pair: NAME.private for
                                       the server, NAME.public for the app
        stash gate sign-snapshot FILE  sign a snapshot's JSON into the
                                       envelope apply-snapshot takes
        """,
        subcommands: [GateOnStore.self, GateKeygen.self, GateSignSnapshot.self],
        defaultSubcommand: GateOnStore.self)
}

/// `stash gate DIR VERB …`: entitlements and free-tier limits on any store.
///
/// The command works on generic stores, so the free-tier limits are named: a top-level type
/// (`--home-type`, default Home, at most `--max-homes`) and a child type (`--item-type`,
/// default Item) counted per value of its parent field (`--parent-field`, default homeID, at
/// most `--max-items` per parent). A limit whose type the store lacks is left out.
struct GateOnStore: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "on-store",
        abstract: "Entitlements and free-tier limits of a store: stash gate DIR VERB.",
        usage: "stash gate <directory> <verb> [<operands> ...] [<options>]",
        discussion: """
        Verbs:
          status                    entitlement, tier, trial, sync policy, limit usage,
                                    credits
          can-create TYPE [--in ID] would creating a TYPE (in parent ID) be allowed?
                                    exit 0 yes, 3 no; the per-parent limited type
                                    needs --in
          create TYPE JSON          authorize and insert in ONE write transaction
                                    (prints created ID); with --repeat N, N transactions,
                                    "{n}" in JSON replaced by 0..N-1; exit 3 when a
                                    creation was denied
          apply-snapshot FILE       verify a signed snapshot envelope and cache it
          credits                   the user's credits, and the debt of an overspend
          spend-credit OPERATION    spend one credit for OPERATION (an id: spending it
                                    again, here or on a synced device, spends nothing);
                                    exit 3 with no credit left
          demo                      the gating story in DIR (a new or empty
                                    directory; two device stores inside)
        Every verb opens the store for writing: the gate records the first launch and
        the highest time seen (its clock guard), and declares its own record types
        (credits, trials), which sync between stores like any other.

        Keys: --public-key-file names a file of Ed25519 public keys (stash gate keygen
        writes one: NAME.public), --key-file a file of HMAC-SHA256 secret keys; both
        hold one key per line as KEYID=BASE64 (or a bare BASE64 key, whose id is
        "default"); lines starting with # are ignored. Snapshot envelopes are JSON:
        {"keyID": …, "payload": BASE64, "signature": BASE64} (stash gate sign-snapshot
        makes them). Without a key, cached snapshots cannot be verified and the user
        is free (reason error).
        """)

    enum Verb: String, ExpressibleByArgument, CaseIterable {
        case status
        case canCreate = "can-create"
        case create
        case applySnapshot = "apply-snapshot"
        case credits
        case spendCredit = "spend-credit"
        case demo
    }

    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "status | can-create | create | apply-snapshot | credits | spend-credit | demo") var verb: Verb
    @Argument(help: "The verb's operands (TYPE, JSON, FILE, OPERATION).") var operands: [String] = []

    @Option(help: "The signed-in user id.") var user = "default"
    @Option(name: .customLong("public-key-file"), help: "A file of Ed25519 public keys (KEYID=BASE64 per line, as keygen writes NAME.public; repeatable).") var publicKeyFiles: [String] = []
    @Option(name: .customLong("key-file"), help: "A file of HMAC-SHA256 secret keys (KEYID=BASE64 per line; repeatable).") var keyFiles: [String] = []
    @Option(name: .customLong("in"), help: "can-create: the parent record id (e.g. the home); required for the per-parent limited type.") var parent: String?
    @Option(name: .customLong("home-type"), help: "The top-level limited type.") var homeType = "Home"
    @Option(name: .customLong("item-type"), help: "The per-parent limited type.") var itemType = "Item"
    @Option(name: .customLong("parent-field"), help: "The item type's parent field.") var parentField = "homeID"
    @Option(name: .customLong("max-homes"), help: "Free limit on the top-level type.") var maxHomes = 1
    @Option(name: .customLong("max-items"), help: "Free limit per parent.") var maxItems = 10
    @Option(name: .customLong("entitlement"), help: "The entitlement that unlocks premium.") var entitlement = "pro"
    @Option(name: .customLong("max-offline-days"), help: "Days a cached snapshot keeps subscriptions of every period alive (default: by period, 3 days weekly to 30 yearly).") var maxOfflineDays: Double?
    @Option(name: .customLong("trial-days"), help: "A local trial from the first launch, in days.") var trialDays: Double?
    @Flag(name: .customLong("hard-gate"), help: "Only the paywall once the trial is over without a subscription.") var hardGate = false
    @Option(help: "Test override: free or pro.") var force: String?
    @Option(help: "Use this instant as the wall clock (ISO 8601 or ms since 1970). It is saved as the highest time seen: a future instant sticks.") var now: String?
    @Option(name: .customLong("repeat"), help: "create: this many creations, one transaction each.") var repetitions = 1
    @Option(name: .customLong("start-when"), help: "create: open the store, then wait until this file exists (lines up racing processes).") var startSignal: String?

    func validate() throws {
        for (name, value) in [("--max-offline-days", maxOfflineDays ?? 0), ("--trial-days", trialDays ?? 0)] where value.isNaN || value < 0 {
            throw ValidationError("\(name) must be a number of days, 0 or more (inf: no limit), not \(value)")
        }
        for (name, value) in [("--max-homes", maxHomes), ("--max-items", maxItems), ("--repeat", repetitions)] where value < 0 {
            throw ValidationError("\(name) must be 0 or more, not \(value)")
        }
    }

    func run() async throws {
        try await runCommand {
            if verb == .demo {
                try requireNewOrEmptyDirectory(directory)
                try await gatingStory(in: directory, say: printLine)
                return
            }
            let expected = [.status: 0, .canCreate: 1, .create: 2, .applySnapshot: 1, .credits: 0, .spendCredit: 1][verb] ?? 0
            if operands.count > expected {
                throw CommandFailure(message: "gate \(verb.rawValue) takes \(expected) operand(s), not \(operands.count) (\(operands.dropFirst(expected).map { "'\($0)'" }.joined(separator: ", ")) left over); quote a JSON record as one argument")
            }
            let store = try openExisting(directory, types: FeatureGate.recordTypes)
            let gate = try FeatureGate.open(store, configuration: try configuration(for: store))
            switch verb {
            case .status: try status(gate)
            case .canCreate: try canCreate(gate)
            case .create: try create(gate)
            case .applySnapshot: try applySnapshot(gate)
            case .credits: try credits(gate)
            case .spendCredit: try spendCredit(gate)
            case .demo: break
            }
        }
    }

    private func operand(_ index: Int, _ name: String) throws -> String {
        guard index < operands.count else { throw CommandFailure(message: "gate \(verb.rawValue) needs \(name)") }
        return operands[index]
    }

    func configuration(for store: Store) throws -> GateConfiguration {
        var config = GateConfiguration(userID: user, verifier: try KeyRing(publicKeyFiles: publicKeyFiles, secretKeyFiles: keyFiles))
        config.premiumEntitlement = entitlement
        if let maxOfflineDays { config.maxOfflineAge = maxOfflineDays * 86_400 }
        config.trialLength = trialDays.map { $0 * 86_400 }
        if hardGate {
            config.accessModel = .hardGate
            if config.trialLength == nil { config.trialLength = 7 * 86_400 }
        }
        switch force {
        case nil: break
        case "free": config.override = .forceFree
        case "pro": config.override = .forcePro
        case let other?: throw CommandFailure(message: "--force takes free or pro, not '\(other)'")
        }
        if let now {
            let instant = try parseInstant(now)
            config.clock = { instant }
        }
        if store.schema.type(named: homeType) != nil {
            config.limits.append(.maxRecords(typeNamed: homeType, maxHomes))
        }
        if let type = store.schema.type(named: itemType) {
            guard type.field(named: parentField) != nil else {
                throw CommandFailure(message: "\(itemType) has no field '\(parentField)' (use --parent-field)")
            }
            // The parent is a home: a creation in a home that does not exist is refused.
            let parentType = store.schema.type(named: homeType) != nil ? homeType : nil
            config.limits.append(.maxRecords(typeNamed: itemType, maxItems, perField: parentField, parentType: parentType))
        }
        return config
    }

    // MARK: Verbs

    private func status(_ gate: FeatureGate) throws {
        let change = gate.currentChange()
        let entitlement = change.entitlement
        printLine("user        \(user)")
        if let sequence = entitlement.snapshotSequence, let time = entitlement.snapshotServerTime {
            printLine("snapshot    #\(sequence) from \(formatInstant(time))")
        } else {
            printLine("snapshot    none" + (entitlement.error.map { " (rejected: \($0))" } ?? ""))
        }
        printLine("entitlement \(entitlement)")
        printLine("tier        \(change.tier.rawValue) (\(change.reason.summary))")
        printLine("reference   \(formatInstant(entitlement.referenceTime))")
        printLine("first launch \(formatInstant(gate.firstLaunch))")
        let trial = gate.trialStatus()
        switch trial.state {
        case .none: printLine("trial       none")
        case .active: printLine("trial       active until \(formatInstant(trial.endsAt!)), \(formatDuration(trial.remaining)) left (\(trial.source!.rawValue))")
        case .expired: printLine("trial       expired at \(formatInstant(trial.endsAt!)) (\(trial.source!.rawValue))")
        }
        printLine("sync        \(gate.syncPolicy)")
        printLine("credits     \(try creditBalance(gate))")
        try gate.store.read { snapshot in
            if snapshot.schema.type(named: homeType) != nil {
                let homes = try snapshot.count(typeNamed: homeType)
                printLine("limit       \(homeType): \(homes) of \(maxHomes)\(homes > maxHomes ? " (over the free limit)" : "")")
            }
            if snapshot.schema.type(named: itemType) != nil {
                do {
                    let largest = try largestGroup(snapshot)
                    printLine("limit       \(itemType) per \(parentField): largest \(largest) of \(maxItems)\(largest > maxItems ? " (over the free limit)" : "")")
                } catch let error as StoreError {
                    printLine("limit       \(itemType) per \(parentField): cannot be counted: \(error.message)")
                }
            }
        }
        // In a parent that holds none yet: whether creating is allowed at all (its per-parent
        // limit needs a parent to count; `can-create --in` asks for one).
        let decision = gate.check(.create(typeNamed: itemType, in: RecordID()))
        printLine("creation    \(decision.isAllowed ? "allowed" : "denied: \(decision.denial!)") (of \(itemType), in a parent below its limit)" + (decision.error.map { "; \($0)" } ?? ""))
    }

    /// The most items one parent holds, as the gate counts them: through the index on the
    /// parent field when there is one (no record read), otherwise from every record; a record
    /// without a parent id is in no group.
    private func largestGroup(_ snapshot: StoreSnapshot) throws -> Int {
        if let groups = try snapshot.groups(typeNamed: itemType, field: parentField, largerThan: 0) {
            return groups.map(\.count).max() ?? 0
        }
        var groups: [UUID: Int] = [:]
        try snapshot.forEachRecord(typeNamed: itemType) { record in
            if case .uuid(let parent)? = record.fields[parentField] { groups[parent, default: 0] += 1 }
            return true
        }
        return groups.values.max() ?? 0
    }

    private func canCreate(_ gate: FeatureGate) throws {
        let type = try operand(0, "a TYPE")
        guard gate.store.schema.type(named: type) != nil else {
            throw StoreError(.unknownType, "store \(gate.store.path) has no record type '\(type)'")
        }
        let decision = gate.check(.create(typeNamed: type, in: try parent.map { try parseID($0) }))
        printLine(decision.description)
        if !decision.isAllowed { Foundation.exit(3) }
    }

    private func create(_ gate: FeatureGate) throws {
        let type = try operand(0, "a TYPE")
        let template = try operand(1, "a JSON record")
        guard let typeSchema = gate.store.schema.type(named: type) else {
            throw StoreError(.unknownType, "store \(gate.store.path) has no record type '\(type)'")
        }
        guard repetitions >= 1 else { throw CommandFailure(message: "--repeat must be at least 1") }
        if let startSignal {
            let deadline = Date().addingTimeInterval(60)
            while !FileManager.default.fileExists(atPath: startSignal) {
                guard Date() < deadline else { throw CommandFailure(message: "--start-when: \(startSignal) did not appear within 60 s") }
                usleep(1000)
            }
        }
        var denied = 0
        for n in 0..<repetitions {
            let record = try genericRecord(type: typeSchema, json: try JSONValue.parse(template.replacingOccurrences(of: "{n}", with: "\(n)")))
            var parentID: RecordID?
            if type == itemType, case .uuid(let uuid)? = record.fields[parentField] { parentID = RecordID(uuid) }
            do {
                try gate.store.write(author: "cli") { tx in
                    try gate.authorize(.create(typeNamed: type, in: parentID), in: tx)
                    try tx.put(record, replacing: false)
                }
                printLine("created \(record.id)")
            } catch let error as GateError where error.code == .denied {
                denied += 1
                printLine("denied \(error.decision!.denial!)")
                if repetitions == 1 { printError("stash: \(error.message)") }
            }
        }
        if denied > 0 { Foundation.exit(3) }
    }

    private func credits(_ gate: FeatureGate) throws {
        printLine("credits     \(try creditBalance(gate))")
    }

    private func creditBalance(_ gate: FeatureGate) throws -> CreditBalance {
        do { return try gate.store.read { try gate.creditBalance(in: $0) } }
        catch let error as GateError { throw CommandFailure(message: error.message) }
    }

    private func spendCredit(_ gate: FeatureGate) throws {
        let operation = try operand(0, "an OPERATION id")
        do {
            switch try gate.spendCredit(operationID: operation) {
            case .spent(let remaining): printLine("spent 1 credit for \(operation): \(remaining) left")
            case .alreadySpent(let remaining): printLine("\(operation) was spent before: nothing spent, \(remaining) left")
            }
        } catch let error as GateError where error.code == .insufficientCredits {
            printLine("denied: no credits left (\(try creditBalance(gate)))")
            printError("stash: \(error.message)")
            Foundation.exit(3)
        }
    }

    private func applySnapshot(_ gate: FeatureGate) throws {
        let file = try operand(0, "a snapshot FILE")
        let data = try readWholeFile(file)
        do {
            let decision = try gate.apply(signedBytes: Array(data))
            printLine("applied snapshot #\(decision.snapshotSequence ?? 0): \(decision)")
        } catch let error as GateError {
            throw CommandFailure(message: "snapshot \(file) rejected (\(error.code)): \(error.message)")
        }
    }
}

/// An instant given as ISO 8601 (`2026-01-01T00:00:00Z`, fractions allowed) or milliseconds since 1970.
func parseInstant(_ text: String) throws -> Date {
    if let ms = Int64(text) { return Date(timeIntervalSince1970: Double(ms) / 1000) }
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    if let date = formatter.date(from: text) { return date }
    formatter.formatOptions = [.withInternetDateTime]
    if let date = formatter.date(from: text) { return date }
    throw CommandFailure(message: "'\(text)' is not an instant (ISO 8601 such as 2026-01-01T00:00:00Z, or milliseconds since 1970)")
}

func formatInstant(_ date: Date) -> String {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime, .withFractionalSeconds]
    return formatter.string(from: date)
}

func formatDuration(_ seconds: TimeInterval) -> String {
    let total = Int(seconds)
    let days = total / 86_400, hours = total % 86_400 / 3600, minutes = total % 3600 / 60
    if days > 0 { return "\(days)d \(hours)h" }
    if hours > 0 { return "\(hours)h \(minutes)m" }
    return "\(minutes)m \(total % 60)s"
}
