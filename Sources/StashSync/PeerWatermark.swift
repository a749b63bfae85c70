import Foundation
import Stash

/// What this store knows about one peer: how far its own history has been delivered to
/// that peer, and how far that peer's history has been applied here.
/// Kept in the store's metadata (`sync.peer.<site>`), updated in the same transaction as
/// the changes it describes.
public struct PeerWatermark: Codable, Sendable, Equatable {
    /// The peer's site id; for a relay directory, ``relaySite`` + `.` + the relay's own id
    /// (``RelayTransport/identity()``); ``relaySite`` alone for a transport to a shared medium
    /// that names none.
    public var site: String
    /// Our history sequence numbers up to here have been delivered to the peer.
    public var sentThrough: UInt64 = 0
    /// The peer's history sequence numbers up to here have been applied here.
    public var receivedThrough: UInt64 = 0
    /// This store's clock when a delivery to the peer was last recorded
    /// (``SyncEngine/acknowledge(peer:through:)``, after each send); nil before the first.
    public var lastSent: Date?
    /// This store's clock when a delta of the peer was last applied here (not a duplicate or
    /// a parked one); nil before the first.
    public var lastReceived: Date?
    /// When ``SyncEngine/forget(site:)`` let history go that this peer has not received;
    /// nil while the store keeps it. Cleared when changes reach the peer again.
    public var forgotten: Date?

    /// The key of the relay pseudo-peer (a broadcast medium, not a store). Before each relay
    /// directory had its own watermark, every relay shared this one.
    public static let relaySite = "relay"

    /// The watermark name of the relay directory whose id is `relay`.
    static func relay(_ relay: RecordID) -> String { "\(relaySite).\(relay)" }

    static func key(_ site: String) -> String { "sync.peer.\(site)" }

    /// The watermark of `site`. A relay directory's own that is not kept yet is the one
    /// every relay shared before (``relaySite``), if there is one: a store that synced
    /// through one relay directory goes on where it was (``SyncEngine/acknowledge(peer:through:)``
    /// then moves it to the relay's own name).
    static func load(_ site: String, in reader: some StoreReading) throws -> PeerWatermark {
        guard let bytes = try reader.metadata(for: key(site)) else {
            if site.hasPrefix(relaySite + "."), let shared = try reader.metadata(for: key(relaySite)),
               var watermark = try? JSONDecoder().decode(PeerWatermark.self, from: Data(shared)) {
                watermark.site = site
                return watermark
            }
            return PeerWatermark(site: site)
        }
        return (try? JSONDecoder().decode(PeerWatermark.self, from: Data(bytes))) ?? PeerWatermark(site: site)
    }

    func save(in tx: StoreTransaction) throws {
        try tx.setMetadata(Array(try JSONEncoder().encode(self)), for: Self.key(site))
    }

    static func all(in reader: some StoreReading) throws -> [PeerWatermark] {
        try reader.metadata(withPrefix: "sync.peer.").compactMap { try? JSONDecoder().decode(PeerWatermark.self, from: Data($0.value)) }
    }
}
