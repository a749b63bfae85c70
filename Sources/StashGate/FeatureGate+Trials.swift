import Foundation
import Stash

/// When a user's local trial (``GateConfiguration/trialLength``) started: one record per user
/// that syncs, so that a second device, or one restored from sync, continues the same trial.
///
/// Each store where the user opens a gate with a local trial creates it once, at the store's
/// first launch. The record id is a UUIDv7 of the start instant, and the user is a unique
/// field: when two devices' records meet in a merge, the record with the smaller id stays
/// (Stash's rule for unique keys), which is the earlier start. So the earliest start wins,
/// on every device, however the records travel. Until a device has synced it counts its own
/// start; a trial never starts later than the first launch of the store either.
public struct UserTrial: Record, Equatable {
    public static let recordType = "GateUserTrial"
    /// A UUIDv7 whose time is ``startedAt`` (the rest derives from the user).
    public var id: RecordID
    /// A digest of the user id (the id itself never leaves the gate's keys).
    public var user: String
    /// When the trial started.
    public var startedAt: Date
    public static let indexes: [RecordIndex<UserTrial>] = [.unique(\.user)]

    /// The start (ms): the earlier of ``startedAt`` and the id's time, which agree unless
    /// the record was written by something else than a gate.
    var start: Int64 { min(milliseconds(startedAt), Int64(clamping: id.timestampMilliseconds)) }

    /// The record of a trial started at `start` (ms) by the user `digest` names: ordered by
    /// start, then by user.
    init(start: Int64, userDigest digest: [UInt8]) {
        let time = UInt64(max(0, min(start, Int64(1) << 47)))
        let tail = digest16("stash.gate.trial", hex(digest))
        let randA = UInt64(tail[0]) << 4 | UInt64(tail[1] >> 4)
        let low = tail[2..<10].reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        id = RecordID(high: time << 16 | 0x7000 | randA, low: low & 0x3FFF_FFFF_FFFF_FFFF | 0x8000_0000_0000_0000)
        user = hex(digest)
        startedAt = dateFromMilliseconds(Int64(time))
    }
}

extension FeatureGate {
    /// The start (ms) of this user's trial as the synced record in `tx` says; when there is
    /// none and the gate has a local trial, creates the record with `start`. nil when the
    /// store keeps no trial records (opened without ``FeatureGate/recordTypes``).
    func userTrialStart(in tx: StoreTransaction, creatingWith start: Int64) throws -> Int64? {
        guard trialsSync else { return nil }
        if let record = try userTrial(in: tx) { return record.start }
        guard trialLength != nil else { return nil }
        let record = UserTrial(start: start, userDigest: userDigest)
        try tx.insert(record)
        return record.start
    }

    /// The user's trial record in `reading` (one lookup through the unique index).
    func userTrial<S: StoreReading>(in reading: S) throws -> UserTrial? {
        let user = hex(userDigest)
        return try reading.fetch(FetchDescriptor<UserTrial>(predicate: #Predicate { $0.user == user })).first
    }

    /// Takes up a trial start that arrived by sync (an earlier device's): after any commit
    /// since the last look, reads the user's record (one history read otherwise).
    func refreshTrial<S: StoreReading>(from reading: S) throws {
        guard trialsSync, trialLength != nil else { return }
        let sequence = try reading.historySequence()
        guard trialCheckedAt.exchange(sequence, ordering: .acquiringAndReleasing) != sequence,
              let start = try userTrial(in: reading)?.start else { return }
        hot.withLock { $0.trialStart = min($0.trialStart, start) }
    }
}
