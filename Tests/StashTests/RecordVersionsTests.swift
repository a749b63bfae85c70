import Foundation
@testable import Stash
import Testing
import StashTestSupport

/// Writes skip work by trusting what they have just built: the versions of an insert are
/// encoded without their field table, and the encoder hands over the record's field table
/// instead of it being parsed again. Both must equal the general path byte for byte.
@Suite struct RecordVersionsTests {
    /// Field versions set one pair at a time, in the order given.
    func fieldVersions(_ pairs: [(UInt16, Version)]) -> FieldVersions {
        var result = FieldVersions()
        for (tag, version) in pairs { result[tag] = version }
        return result
    }

    /// `FieldVersions` keeps one version per tag in tag order: against a dictionary, through
    /// random sets, replacements and removals, the same lookups and the same pairs, sorted.
    @Test func fieldVersionsActLikeADictionaryKeptInTagOrder() {
        let seed: UInt64 = 0xF1E1D
        var rng = SeededGenerator(seed: seed)
        for round in 0..<200 {
            var model: [UInt16: Version] = [:]
            var versions = FieldVersions()
            for step in 0..<Int.random(in: 0...60, using: &rng) {
                let tag = UInt16.random(in: 0...24, using: &rng)
                let version: Version? = Int.random(in: 0..<4, using: &rng) == 0
                    ? nil : Version(clock: UInt64(step), site: RecordID(high: 0, low: UInt64(round)))
                model[tag] = version
                versions[tag] = version
                let probe = UInt16.random(in: 0...25, using: &rng)
                #expect(versions[probe] == model[probe], "seed \(seed), round \(round), step \(step)")
            }
            #expect(versions.map(\.tag) == model.keys.sorted(), "seed \(seed), round \(round)")
            #expect(versions.map(\.version) == model.keys.sorted().map { model[$0]! }, "seed \(seed), round \(round)")
            #expect(versions.count == model.count && versions.isEmpty == model.isEmpty, "seed \(seed), round \(round)")
        }
    }

    /// A stored entry whose tags are not in order (none written here is, but the format allows
    /// it) reads as the same versions, and is written back in order.
    @Test func versionsStoredOutOfTagOrderReadInOrder() throws {
        let site = RecordID(high: 1, low: 2)
        let a = Version(clock: 5, site: site), b = Version(clock: 9, site: site)
        var w = ByteWriter(capacity: 64)
        w.bytes.append(1)
        w.bytes.append(1)   // an incarnation, no tombstone
        w.varint(2)
        for version in [a, b] {
            w.varint(version.clock)
            w.bigEndian(version.site.high)
            w.bigEndian(version.site.low)
        }
        w.varint(0)         // the incarnation: a
        w.varint(3)
        for (tag, index) in [(7, 1), (2, 0), (4, 1)] as [(UInt64, UInt64)] {
            w.varint(tag)
            w.varint(index)
        }
        let decoded = try RecordVersions(decoding: w.bytes)
        #expect(decoded.incarnation == a && decoded.tombstone == nil)
        #expect(decoded.fields.map(\.tag) == [2, 4, 7])
        #expect(decoded.fields[7] == b && decoded.fields[2] == a && decoded.fields[4] == b && decoded.fields[3] == nil)
        #expect(try RecordVersions(decoding: decoded.encoded()) == decoded)
    }

    /// Tags by name, in order of first use.
    final class Resolver: FieldTagResolver {
        var tags: [String: UInt16] = [:]
        func tag(for name: String, kind: FieldKind?, hint: Int) throws -> (tag: UInt16, slot: Int) {
            if let tag = tags[name] { return (tag, Int(tag) - 1) }
            let tag = UInt16(tags.count + 1)
            tags[name] = tag
            return (tag, Int(tag) - 1)
        }
    }

    @Test func theEncodersFieldTableEqualsTheParsedOne() throws {
        var rng = SeededGenerator(seed: 11)
        let resolver = Resolver()
        for n in 0..<100 {
            let item = Item(homeID: RecordID(), name: String(repeating: "é", count: n % 7) + "item \(n)", category: n % 2 == 0 ? "" : "c",
                            wearCount: Int.random(in: -1000...1000, using: &rng), price: Double(n) / 3,
                            note: n % 3 == 0 ? nil : String(repeating: "x", count: n))
            let encoded = try RecordEncoder.encode(item, resolver: resolver)
            let parsed = try EncodedRecord(encoded.bytes)
            #expect(encoded.fields.map(\.tag) == parsed.fields.map(\.tag), "item \(n)")
            #expect(encoded.fields.map(\.range) == parsed.fields.map(\.range), "item \(n)")
            let tagged = RecordEncoder.encode(tagged: try parsed.fields.map { ($0.tag, try parsed.value(of: $0.tag)!) })
            #expect(tagged.bytes == encoded.bytes, "item \(n)")
            #expect(try EncodedRecord(tagged.bytes).fields.map(\.range) == tagged.fields.map(\.range), "item \(n)")
        }
    }

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
                                         fields: fieldVersions(tags.map { ($0, incarnation) }))
            let fast = RecordVersions.encoded(incarnation: incarnation, tombstone: tombstone, fieldTags: tags)
            #expect(fast == general.encoded(), "seed \(seed), round \(round)")
            #expect(try RecordVersions(decoding: fast) == general, "seed \(seed), round \(round)")
        }
    }

    /// A merge reads `latestVersion` of every remote state and encodes the merged versions
    /// into a reused buffer: both must equal the plain definitions.
    @Test func latestVersionAndReusedBufferEqualThePlainDefinitions() throws {
        let seed: UInt64 = 0x1A7E
        var rng = SeededGenerator(seed: seed)
        func version() -> Version {
            Version(clock: UInt64.random(in: 0...40, using: &rng),
                    site: RecordID(high: 0, low: UInt64.random(in: 0...3, using: &rng)))
        }
        var reused = ByteWriter(capacity: 8)
        for round in 0..<300 {
            let incarnation: Version? = round % 4 == 0 ? nil : version()
            let tombstone: Version? = round % 3 == 0 ? nil : version()
            var fields: [String: FieldState] = [:]
            for f in 0..<Int.random(in: 0...6, using: &rng) { fields["f\(f)"] = FieldState(value: .int(Int64(f)), version: version()) }
            let state = RecordState(type: "T", id: RecordID(), incarnation: incarnation, tombstone: tombstone, fields: fields)
            let all = [incarnation, tombstone].compactMap { $0 } + fields.values.map(\.version)
            #expect(state.latestVersion == all.max(), "seed \(seed), round \(round)")

            let versions = RecordVersions(incarnation: incarnation, tombstone: tombstone,
                                          fields: fieldVersions(fields.values.enumerated().map { (UInt16($0.offset + 1), $0.element.version) }))
            reused.bytes.removeAll(keepingCapacity: true)
            reused.bytes.append(0xEE)
            versions.encode(into: &reused)
            #expect(reused.bytes == [0xEE] + versions.encoded(), "seed \(seed), round \(round)")
            #expect(try RecordVersions(decoding: Array(reused.bytes.dropFirst())) == versions, "seed \(seed), round \(round)")
        }
    }
}
