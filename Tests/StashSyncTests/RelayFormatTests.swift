import Crypto
import Foundation
import Stash
import StashSync
import Testing
import StashTestSupport

/// The directory transport follows docs/relay-format.md: what it writes reads back by the
/// page alone (keys derived and envelopes opened here with swift-crypto, not through the
/// library), and a file made by the page alone is applied.
@Suite struct RelayFormatTests {
    let family = RecordID()
    let keyBytes = Array("the family key of the format tests".utf8)

    /// The sealing key, derived as the page says.
    var sealingKey: SymmetricKey {
        HKDF<SHA256>.deriveKey(inputKeyMaterial: SymmetricKey(data: keyBytes), salt: family.bytes,
                               info: Data("stash relay encryption v1".utf8), outputByteCount: 32)
    }

    struct Header {
        var kind: UInt8, flags: UInt8, family: RecordID, source: RecordID, from: UInt64, to: UInt64, length: UInt64
        var coverage: [RecordID: UInt64]
        var end: Int
    }

    func littleEndian(_ bytes: ArraySlice<UInt8>) -> UInt64 { bytes.reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) } }

    /// The header as the page lays it out.
    func header(_ bytes: [UInt8]) throws -> Header {
        #expect(Array(bytes[0..<4]) == Array("STSR".utf8))
        #expect(bytes[4] == 1)
        var offset = 47
        func id(_ at: Int) throws -> RecordID { try #require(RecordID(bytes: bytes[at..<at + 16])) }
        var h = Header(kind: bytes[5], flags: bytes[6], family: try id(7), source: try id(23), from: littleEndian(bytes[39..<47]),
                       to: 0, length: 0, coverage: [:], end: 0)
        h.to = littleEndian(bytes[offset..<offset + 8]); offset += 8
        h.length = littleEndian(bytes[offset..<offset + 8]); offset += 8
        var count = 0, shift = 0
        while true {
            let byte = bytes[offset]; offset += 1
            count |= Int(byte & 0x7F) << shift
            if byte < 0x80 { break }
            shift += 7
        }
        for _ in 0..<count {
            h.coverage[try id(offset)] = littleEndian(bytes[offset + 16..<offset + 24])
            offset += 24
        }
        h.end = offset
        return h
    }

    /// The payload of a sealed envelope, opened as the page says.
    func open(_ bytes: [UInt8], _ h: Header) throws -> Data {
        #expect(h.flags & 1 == 1)
        let box = try ChaChaPoly.SealedBox(combined: bytes[h.end...])
        return try ChaChaPoly.open(box, using: sealingKey, authenticating: bytes[0..<h.end])
    }

    @Test func filesReadBackByThePageAlone() async throws {
        let dir = TemporaryDirectory()
        let url = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        let relay = RelayTransport(directory: url)
        let key = try SyncKey(keyBytes)
        let a = try Device.open(dir.sub("a"), family: family, key: key)
        let b = try Device.open(dir.sub("b"), family: family, key: key)
        let note = Note(title: "by the page", body: "")
        try a.store.insert(note)
        try await a.engine.sync(via: relay)
        try await b.engine.sync(via: relay)
        try await b.engine.publishCheckpoint(via: relay)

        let site = a.store.siteID.description
        // The layout.
        let relayID = try String(contentsOf: url.appendingPathComponent("relay-id"), encoding: .utf8)
        #expect(RecordID(string: relayID.trimmingCharacters(in: .whitespacesAndNewlines)) != nil)
        let seen = try String(contentsOf: url.appendingPathComponent(b.store.siteID.description).appendingPathComponent("seen"), encoding: .utf8)
        #expect(seen.split(separator: " ").count == 2 && Double(seen.split(separator: " ")[0]) != nil && seen.hasSuffix(family.description))
        #expect(try String(contentsOf: url.appendingPathComponent(site).appendingPathComponent("acks").appendingPathComponent(b.store.siteID.description), encoding: .utf8) == "1")

        // A delta: named by its range, an envelope whose header says the same, sealed.
        let name = String(format: "%020d-%020d.delta", 1, 1)
        let deltaBytes = [UInt8](try Data(contentsOf: url.appendingPathComponent(site).appendingPathComponent(name)))
        let h = try header(deltaBytes)
        #expect(h.kind == 1 && h.family == family && h.source == a.store.siteID && h.from == 1 && h.to == 1 && h.coverage.isEmpty)
        let payload = try open(deltaBytes, h)
        #expect(UInt64(payload.count) == h.length && payload.prefix(4) == Data("STSD".utf8))
        let delta = try Delta(decoding: payload, key: key)
        #expect(delta.entries.map(\.id) == [note.id])

        // A checkpoint: named by its maker and `to`, covering each source.
        let checkpoints = try FileManager.default.contentsOfDirectory(atPath: url.appendingPathComponent("checkpoints").path)
        let checkpointName = try #require(checkpoints.first)
        #expect(checkpoints.count == 1)
        let to = try b.store.read(isolation: #isolation) { try $0.historyBounds().current.sequence }
        #expect(checkpointName == String(format: "%@-%020llu.checkpoint", b.store.siteID.description, to))
        let checkpointBytes = [UInt8](try Data(contentsOf: url.appendingPathComponent("checkpoints").appendingPathComponent(checkpointName)))
        let c = try header(checkpointBytes)
        #expect(c.kind == 2 && c.source == b.store.siteID && c.from == 1 && c.to == to)
        #expect(c.coverage == [a.store.siteID: 1, b.store.siteID: to])
        let snapshot = try Delta(decoding: try open(checkpointBytes, c), key: key)
        #expect(snapshot.isFullSnapshot && snapshot.entries.map(\.id) == [note.id])
    }

    @Test func aFileMadeByThePageAloneIsApplied() async throws {
        let dir = TemporaryDirectory()
        let url = dir.url.appendingPathComponent("relay")
        try FileManager.default.createDirectory(at: url, withIntermediateDirectories: true)
        let key = try SyncKey(keyBytes)
        let source = try Device.open(dir.sub("source"), family: family, key: key)
        let note = Note(title: "hand-sealed", body: "")
        try source.store.insert(note)
        let inner = try source.engine.makeDelta(for: nil).encoded(key: key)
        // The envelope, byte by byte.
        var header: [UInt8] = Array("STSR".utf8) + [1, 1, 1] + family.bytes + source.store.siteID.bytes
        for value in [UInt64(1), 1, UInt64(inner.count)] { header += (0..<8).map { UInt8(truncatingIfNeeded: value >> (8 * $0)) } }
        header.append(0)   // no coverage
        let sealed = try ChaChaPoly.seal(inner, using: sealingKey, authenticating: header)
        let folder = url.appendingPathComponent(source.store.siteID.description)
        try FileManager.default.createDirectory(at: folder, withIntermediateDirectories: true)
        try (Data(header) + sealed.combined).write(to: folder.appendingPathComponent(String(format: "%020d-%020d.delta", 1, 1)))

        let reader = try Device.open(dir.sub("reader"), family: family, key: key)
        let report = try await reader.engine.fetchChanges(via: RelayTransport(directory: url))
        #expect(report.refused.isEmpty && report.receivedEntries == 1, "\(report)")
        #expect(try reader.store.get(Note.self, id: note.id) == note)
    }
}
