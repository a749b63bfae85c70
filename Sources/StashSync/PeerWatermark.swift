import Foundation
import Stash

/// What this store knows about one peer: how far its own history has been delivered to
/// that peer, and how far that peer's history has been applied here.
/// Kept in the store's metadata (`sync.peer.<site>`), updated in the same transaction as
/// the changes it describes.
public struct PeerWatermark: Codable, Sendable, Equatable {
    /// The peer's site id, or ``relaySite`` for the shared relay medium.
    public var site: String
    /// Our history sequence numbers up to here have been delivered to the peer.
    public var sentThrough: UInt64 = 0
    /// The peer's history sequence numbers up to here have been applied here.
    public var receivedThrough: UInt64 = 0
    public var lastSent: Date?
    public var lastReceived: Date?

    /// The key of the relay pseudo-peer (a broadcast medium, not a store).
    public static let relaySite = "relay"

    static func key(_ site: String) -> String { "sync.peer.\(site)" }

    static func load(_ site: String, in reader: some StoreReading) throws -> PeerWatermark {
        guard let bytes = try reader.metadata(for: key(site)) else { return PeerWatermark(site: site) }
        return (try? JSONDecoder().decode(PeerWatermark.self, from: Data(bytes))) ?? PeerWatermark(site: site)
    }

    func save(in tx: StoreTransaction) throws {
        try tx.setMetadata(Array(try JSONEncoder().encode(self)), for: Self.key(site))
    }

    static func all(in reader: some StoreReading) throws -> [PeerWatermark] {
        try reader.metadata(withPrefix: "sync.peer.").compactMap { try? JSONDecoder().decode(PeerWatermark.self, from: Data($0.value)) }
    }
}
