import Crypto
import Foundation
import Stash
@testable import StashSync
import Testing
import StashTestSupport

/// The worked example of `docs/delta-format.md` is what ``Delta/encoded(key:)`` writes: its
/// hex dump, and every row of its byte-by-byte table (which must cover each byte once, in
/// order). A change to the delta writer fails here until the document says the same.
///
/// `STASH_PRINT_DELTA_EXAMPLE=1 swift test --filter DeltaFormatDocTests` prints the dump.
@Suite struct DeltaFormatDocTests {
    /// `Note` as the example's source and receiver declare it.
    struct ExampleNote: Record, Equatable {
        static var recordType: String { "Note" }
        var id: RecordID
        var title: String
        var pinned: Bool
    }

    static let key = try! SyncKey(Array("example-sync-key-0123456789".utf8))
    static let source = RecordID(string: "019af3a0-0000-7000-8000-00000000000a")!
    static let family = RecordID(string: "019af3a0-0000-7000-8000-0000000000fa")!
    static let noteID = RecordID(string: "019af3a0-0000-7000-8000-000000000001")!
    /// 2026-12-06 12:00:00 UTC in milliseconds, shifted into the high 48 bits; logical part 0.
    static let clock: UInt64 = 1_796_558_400_000 << 16
    static let created = Date(timeIntervalSince1970: 1_796_558_400)
    /// The fingerprint text of a synced schema holding `ExampleNote` alone.
    static let fingerprintText = "Note{pinned:bool,title:string,}"

    /// One new `Note` {title "Hi", pinned true} from site `source`, history entry 1, for any
    /// store of the family (a relay delta).
    static func exampleDelta() -> Delta {
        let version = Version(clock: clock, site: source)
        let state = RecordState(type: "Note", id: noteID, incarnation: version, tombstone: nil, fields: [
            "title": FieldState(value: .string("Hi"), version: version),
            "pinned": FieldState(value: .bool(true), version: version),
        ])
        return Delta(source: source, recipient: nil, family: family,
                     schemaFingerprint: Array(SHA256.hash(data: Data(fingerprintText.utf8))),
                     from: 1, to: 1, isFullSnapshot: false, created: created, entries: [state], counterFields: [:])
    }

    static var document: String {
        get throws {
            let root = URL(fileURLWithPath: #filePath).deletingLastPathComponent().deletingLastPathComponent().deletingLastPathComponent()
            return try String(contentsOf: root.appendingPathComponent("docs/delta-format.md"), encoding: .utf8)
        }
    }

    /// 16 bytes a line, each line led by its offset (4 hex digits).
    static func hexDump(_ bytes: [UInt8]) -> String {
        stride(from: 0, to: bytes.count, by: 16).map { start in
            let line = bytes[start..<min(start + 16, bytes.count)].map { hex($0) }.joined(separator: " ")
            return hex(UInt16(start)) + "  " + line
        }.joined(separator: "\n")
    }

    static func hex<T: FixedWidthInteger>(_ value: T) -> String {
        let digits = String(value, radix: 16)
        return String(repeating: "0", count: max(0, MemoryLayout<T>.size * 2 - digits.count)) + digits
    }

    /// The lines between `<!-- begin NAME -->` and `<!-- end NAME -->`.
    static func block(_ name: String, in text: String) -> [Substring]? {
        let lines = text.split(separator: "\n", omittingEmptySubsequences: false)
        guard let start = lines.firstIndex(of: "<!-- begin \(name) -->"),
              let end = lines[start...].firstIndex(of: "<!-- end \(name) -->") else { return nil }
        return Array(lines[(start + 1)..<end])
    }

    @Test func theDocumentedBytesAreWhatTheWriterWrites() throws {
        let bytes = [UInt8](Self.exampleDelta().encoded(key: Self.key))
        let dump = Self.hexDump(bytes)
        if ProcessInfo.processInfo.environment["STASH_PRINT_DELTA_EXAMPLE"] != nil { print(dump) }
        let document = try Self.document
        let shown = try #require(Self.block("delta-example-dump", in: document), "docs/delta-format.md lacks its dump block")
            .filter { !$0.hasPrefix("```") }.joined(separator: "\n")
        #expect(shown == dump, "docs/delta-format.md's example dump is not what Delta.encoded(key:) writes now; the bytes now:\n\(dump)")

        // The table: | offset | bytes | meaning |, offsets in hex, every byte once, in order.
        let rows = try #require(Self.block("delta-example-table", in: document), "docs/delta-format.md lacks its byte table")
            .filter { $0.hasPrefix("| ") && !$0.hasPrefix("| offset") }
        var next = 0
        for row in rows {
            let cells = row.split(separator: "|").map { $0.trimmingCharacters(in: .whitespaces) }
            let offset = try #require(Int(cells[0], radix: 16), "row \(row): offset")
            let expected = cells[1].split(separator: " ").compactMap { UInt8($0, radix: 16) }
            #expect(offset == next, "row \(row): expected offset \(Self.hex(UInt16(next)))")
            #expect(offset + expected.count <= bytes.count && Array(bytes[offset..<offset + expected.count]) == expected,
                    "row \(row): the bytes there are \(bytes[min(offset, bytes.count)..<min(offset + expected.count, bytes.count)].map { Self.hex($0) }.joined(separator: " "))")
            next = offset + expected.count
        }
        #expect(next == bytes.count, "the table ends at \(next); the delta has \(bytes.count) bytes")
    }

    @Test func theExampleReadsBackAndAStoreAppliesIt() throws {
        let data = Self.exampleDelta().encoded(key: Self.key)
        #expect(try Delta(decoding: data, key: Self.key) == Self.exampleDelta())
        let dir = TemporaryDirectory("delta-doc")
        var options = StoreOptions()
        options.durability = .none
        let store = try Store.open(at: dir.path, types: [ExampleNote.self], options: options)
        #expect(SchemaFingerprint.of(store.schema) == Array(SHA256.hash(data: Data(Self.fingerprintText.utf8))),
                "the documented fingerprint text is not what SchemaFingerprint computes for this schema")
        let engine = try SyncEngine(store: store, configuration: SyncConfiguration(family: Self.family, key: Self.key))
        #expect(try engine.apply(data) == .applied(entries: 1, changed: 1))
        #expect(try store.get(ExampleNote.self, id: Self.noteID) == ExampleNote(id: Self.noteID, title: "Hi", pinned: true))
        #expect(try store.verify().isClean)
    }
}
