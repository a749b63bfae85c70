import Foundation
import Logging
import PostgresNIO
import ServiceLifecycle
import Synchronization

/// The long-polls waiting for a family's log to grow, woken by PostgreSQL's `NOTIFY` (sent by
/// every upload, whichever server took it), so that a device waiting on one server hears an
/// upload to another at once.
final class LogWaiters: Sendable {
    /// One wait: registered before the log is read, so that an upload committed between the
    /// read and the wait is not missed (it marks the ticket woken).
    final class Ticket: Sendable {
        fileprivate let state = Mutex<(woken: Bool, continuation: CheckedContinuation<Void, Never>?)>((false, nil))

        fileprivate func wake() {
            let continuation = state.withLock { state -> CheckedContinuation<Void, Never>? in
                state.woken = true
                defer { state.continuation = nil }
                return state.continuation
            }
            continuation?.resume()
        }
    }

    private let tickets = Mutex<[UUID: [ObjectIdentifier: Ticket]]>([:])

    /// Long-polls waiting now, for the metrics.
    var count: Int { tickets.withLock { $0.values.reduce(0) { $0 + $1.count } } }

    /// A ticket for the next change of `family`'s log.
    func register(_ family: UUID) -> Ticket {
        let ticket = Ticket()
        tickets.withLock { $0[family, default: [:]][ObjectIdentifier(ticket)] = ticket }
        return ticket
    }

    /// Waits until the ticket is woken, `timeout` passes, the task is cancelled or the
    /// server shuts down (a long-poll must not hold a graceful shutdown for its whole wait);
    /// the ticket is then withdrawn.
    func wait(_ ticket: Ticket, family: UUID, timeout: Duration) async {
        defer { withdraw(ticket, family: family) }
        if Task.isShuttingDownGracefully { return }
        let timer = Task {
            try? await Task.sleep(for: timeout)
            ticket.wake()
        }
        defer { timer.cancel() }
        await withGracefulShutdownHandler {
            await waitCancellably(ticket)
        } onGracefulShutdown: {
            ticket.wake()
        }
    }

    private func waitCancellably(_ ticket: Ticket) async {
        await withTaskCancellationHandler {
            await withCheckedContinuation { (continuation: CheckedContinuation<Void, Never>) in
                let resumeNow = ticket.state.withLock { state -> Bool in
                    if state.woken { return true }
                    state.continuation = continuation
                    return false
                }
                if resumeNow { continuation.resume() }
            }
        } onCancel: {
            ticket.wake()
        }
    }

    func withdraw(_ ticket: Ticket, family: UUID) {
        tickets.withLock { all in
            all[family]?[ObjectIdentifier(ticket)] = nil
            if all[family]?.isEmpty == true { all[family] = nil }
        }
    }

    /// Wakes the waits of `family`.
    func notify(_ family: UUID) {
        let woken = tickets.withLock { $0[family].map { Array($0.values) } ?? [] }
        for ticket in woken { ticket.wake() }
    }

    /// Wakes every wait (the listening connection was re-established: notifications may have
    /// been missed meanwhile, so every long-poll reads its log again).
    func notifyAll() {
        let woken = tickets.withLock { $0.values.flatMap(\.values) }
        for ticket in woken { ticket.wake() }
    }
}

/// Listens on PostgreSQL's `stash_relay` channel on a connection of its own and wakes the
/// long-polls of the family each notification names; reconnects with backoff when PostgreSQL
/// goes away (waking every long-poll once it is back).
struct NotificationListener: Service {
    let url: PostgresURL
    let waiters: LogWaiters
    let logger: Logger
    static let channel = "stash_relay"

    func run() async throws {
        var delay = Duration.milliseconds(100)
        while !Task.isCancelled && !Task.isShuttingDownGracefully {
            let listened = Atomic<Bool>(false)
            do {
                try await cancelWhenGracefulShutdown {
                    let connection = try await PostgresConnection.connect(configuration: try url.connectionConfiguration(),
                                                                          id: 1, logger: logger)
                    defer { Task { try? await connection.close() } }
                    try await connection.listen(on: Self.channel) { notifications in
                        logger.info("listening for new deltas", metadata: ["channel": "\(Self.channel)"])
                        listened.store(true, ordering: .relaxed)
                        waiters.notifyAll()
                        for try await notification in notifications {
                            // "<family> <server>": this server's own long-polls were woken already.
                            let parts = notification.payload.split(separator: " ")
                            if parts.count > 1, parts[1] == UploadNotifier.serverID { continue }
                            if let family = parts.first.flatMap({ UUID(uuidString: String($0)) }) {
                                waiters.notify(family)
                            }
                        }
                    }
                }
            } catch {
                if Task.isCancelled || Task.isShuttingDownGracefully { break }
                logger.warning("the connection listening for new deltas failed; reconnecting", metadata: ["error": "\(error)", "retryIn": "\(delay)"])
            }
            // Whatever was missed meanwhile: every long-poll reads its log again.
            waiters.notifyAll()
            if listened.load(ordering: .relaxed) { delay = .milliseconds(100) }
            try? await Task.sleep(for: delay)
            delay = min(delay * 2, .seconds(5))
        }
    }
}

/// Sends the `NOTIFY` of stored uploads, after their transactions, batched: one statement names
/// every family that stored something since the last one. Not inside the upload's transaction:
/// PostgreSQL takes a lock of the whole cluster at the commit of a transaction that notifies,
/// and holds it through the commit's WAL flush, which would make every upload's commit wait for
/// the one before (a few hundred uploads a second) instead of sharing flushes. A notification
/// is sent once the upload is committed, so a listener that reads the log then sees it. The
/// long-polls of this server are woken at once, without the round trip. Should the server stop
/// between a commit and its notification, the other servers' long-polls see the file at their
/// next read (their wait's end, or another notification of the family).
final class UploadNotifier: Service, Sendable {
    let client: PostgresClient
    let waiters: LogWaiters
    let logger: Logger
    private let pending = Mutex<Set<UUID>>([])
    /// This process's mark in its notifications, by which its listener skips them.
    static let serverID = Substring(UUID().uuidString.lowercased().prefix(8))
    private let signal: AsyncStream<Void>.Continuation
    private let signals: AsyncStream<Void>

    init(client: PostgresClient, waiters: LogWaiters, logger: Logger) {
        self.client = client
        self.waiters = waiters
        self.logger = logger
        (signals, signal) = AsyncStream.makeStream(of: Void.self, bufferingPolicy: .bufferingNewest(1))
    }

    /// `family` stored a file (committed): wake its long-polls here, and on every server.
    func stored(_ family: UUID) {
        waiters.notify(family)
        pending.withLock { _ = $0.insert(family) }
        signal.yield()
    }

    func run() async throws {
        await cancelWhenGracefulShutdown {
            for await _ in self.signals {
                var delay = Duration.milliseconds(50)
                while true {
                    let batch = self.pending.withLock { pending -> [String] in
                        defer { pending.removeAll() }
                        return pending.map { $0.uuidString.lowercased() + " " + Self.serverID }
                    }
                    if batch.isEmpty { break }
                    do {
                        try await self.client.query("SELECT pg_notify('\(unescaped: NotificationListener.channel)', f) FROM unnest(\(batch)::text[]) f",
                                                    logger: self.logger)
                        delay = .milliseconds(50)
                    } catch {
                        if Task.isCancelled { return }
                        // Kept for the next try: PostgreSQL restarting, say.
                        self.pending.withLock { $0.formUnion(batch.compactMap { UUID(uuidString: String($0.prefix(36))) }) }
                        self.logger.warning("cannot notify the other servers of new deltas; retrying", metadata: ["error": "\(error)"])
                        try? await Task.sleep(for: delay)
                        delay = min(delay * 2, .seconds(2))
                    }
                }
            }
        }
    }
}
