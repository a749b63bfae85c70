import Crypto
import Foundation
import Synchronization

/// Who may use a family: the hash of its token (SHA-256 of the token a device derives from the
/// family key with HKDF, purpose "stash relay token v1"), kept by PostgreSQL and cached here.
/// The server never sees the family key, and keeps no token: only its hash. A family is
/// registered by the first device that reaches the server with its token.
final class Families: Sendable {
    private let database: RelayDatabase
    private let known = Mutex<[UUID: (hash: [UInt8], relay: UUID)]>([:])

    init(database: RelayDatabase) { self.database = database }

    static func hash(_ token: [UInt8]) -> [UInt8] { Array(SHA256.hash(data: token)) }

    /// The family's relay id when `tokenHash` is its token's hash; nil when it is another's.
    func authorize(_ family: UUID, tokenHash: [UInt8]) async throws -> UUID? {
        let cached = known.withLock { $0[family] }
        let entry: (hash: [UInt8], relay: UUID)
        if let cached {
            entry = cached
        } else {
            let (hash, relay) = try await database.family(family, registering: tokenHash)
            entry = (hash, relay)
            known.withLock { $0[family] = entry }
        }
        // Compared whole, whatever the first difference: the time says nothing of the hash.
        guard entry.hash.count == tokenHash.count else { return nil }
        var difference: UInt8 = 0
        for (a, b) in zip(entry.hash, tokenHash) { difference |= a ^ b }
        return difference == 0 ? entry.relay : nil
    }
}

/// Requests per family and second, per server process: a token bucket of `burst` requests
/// refilled at `rate` a second. Over it, a request gets 429 with Retry-After.
final class RateLimiter: Sendable {
    let rate: Double
    let burst: Double
    private let buckets = Mutex<(all: [UUID: (tokens: Double, updated: ContinuousClock.Instant)], pruneAt: Int)>(([:], 4096))

    init(rate: Double, burst: Double) {
        self.rate = rate
        self.burst = burst
    }

    /// Nil when the request may go; else the seconds after which one would.
    func take(_ family: UUID) -> Int? {
        guard rate > 0 else { return nil }
        let now = ContinuousClock.now
        return buckets.withLock { state in
            // A bucket untouched for burst / rate seconds is full again: forgetting it changes
            // nothing, and keeps the table to the families active lately.
            if state.all.count >= state.pruneAt {
                let full = Duration.milliseconds(Int64(burst / rate * 1000) + 1)
                state.all = state.all.filter { $0.value.updated.duration(to: now) < full }
                state.pruneAt = max(4096, 2 * state.all.count)
            }
            var bucket = state.all[family] ?? (burst, now)
            let elapsed = bucket.updated.duration(to: now)
            let seconds = Double(elapsed.components.seconds) + Double(elapsed.components.attoseconds) / 1e18
            bucket.tokens = min(burst, bucket.tokens + seconds * rate)
            bucket.updated = now
            defer { state.all[family] = bucket }
            if bucket.tokens >= 1 {
                bucket.tokens -= 1
                return nil
            }
            return max(1, Int(((1 - bucket.tokens) / rate).rounded(.up)))
        }
    }
}
