import Foundation
@testable import Stash
import Testing
import StashTestSupport

/// An insert encodes its versions without building the field table; the bytes must be those
/// of the general encoder for the same versions, or replication would read them differently.
@Suite struct RecordVersionsTests {
    @Test func insertEncodingEqualsTheGeneralOne() throws {
        let seed: UInt64 = 0x7E25
        var rng = SeededGenerator(seed: seed)
        func version() -> Version {
            Version(clock: UInt64.random(in: 0 ... 1 << 50, using: &rng),
                    site: RecordID(high: UInt64.random(in: .min ... .max, using: &rng), low: UInt64.random(in: .min ... .max, using: &rng)))
        }
        for round in 0..<300 {
            let incarnation = version()
            let tombstone: Version? = switch round % 3 {
            case 0: nil
            case 1: version()
            default: incarnation
            }
            let tags = Array(Set((0..<Int.random(in: 0...20, using: &rng)).map { _ in UInt16.random(in: 1...400, using: &rng) })).shuffled(using: &rng)
            let general = RecordVersions(incarnation: incarnation, tombstone: tombstone,
                                         fields: Dictionary(uniqueKeysWithValues: tags.map { ($0, incarnation) }))
            let fast = RecordVersions.encoded(incarnation: incarnation, tombstone: tombstone, fieldTags: tags)
            #expect(fast == general.encoded(), "seed \(seed), round \(round)")
            #expect(try RecordVersions(decoding: fast) == general, "seed \(seed), round \(round)")
        }
    }
}
