import Foundation

/// The plaintext header of a relay file (docs/relay-format.md, "Envelope"), as the server reads
/// it to check a body before storing it. The server never holds a family key: it checks the
/// header against the request (family, source, range, kind), and the body's length against
/// the header's payload length; the sealed payload is opaque to it.
struct EnvelopeHeader: Equatable, Sendable {
    enum Kind: UInt8, Sendable {
        case delta = 1, checkpoint = 2, note = 3, blob = 4
    }

    static let magic: [UInt8] = Array("STSR".utf8)
    static let version: UInt8 = 1
    /// Nonce (12) and tag (16) around a sealed payload.
    static let sealOverhead = 28

    var kind: Kind
    var sealed: Bool
    var family: UUID
    var source: UUID
    var from: UInt64
    var to: UInt64
    var payloadLength: UInt64
    /// For a checkpoint: each source's site and how far of its history the checkpoint holds.
    var coverage: [UUID: UInt64]
    /// The header's bytes (everything before the nonce).
    var headerLength: Int

    /// Why `body` is not a relay file of the format, or the header it holds.
    /// - Throws: ``BodyProblem`` naming what is wrong.
    init(parsing body: some Collection<UInt8>) throws(BodyProblem) {
        let bytes = Array(body)
        guard bytes.count >= 7 + 32 + 24 + 1, Array(bytes[0..<4]) == Self.magic else {
            throw BodyProblem("the body is not a relay file (no STSR header; see docs/relay-format.md)")
        }
        guard bytes[4] == Self.version else {
            throw BodyProblem("the body is a relay file of version \(bytes[4]); this server stores version \(Self.version)")
        }
        guard let kind = Kind(rawValue: bytes[5]) else { throw BodyProblem("the body's kind \(bytes[5]) is unknown") }
        self.kind = kind
        sealed = bytes[6] & 1 != 0
        var offset = 7
        func uuid() -> UUID {
            defer { offset += 16 }
            let b = bytes[offset..<offset + 16].map { $0 }
            return UUID(uuid: (b[0], b[1], b[2], b[3], b[4], b[5], b[6], b[7], b[8], b[9], b[10], b[11], b[12], b[13], b[14], b[15]))
        }
        func fixed() throws(BodyProblem) -> UInt64 {
            guard offset + 8 <= bytes.count else { throw BodyProblem("the body's header is cut short") }
            defer { offset += 8 }
            return bytes[offset..<offset + 8].reversed().reduce(UInt64(0)) { $0 << 8 | UInt64($1) }
        }
        family = uuid()
        source = uuid()
        from = try fixed()
        to = try fixed()
        payloadLength = try fixed()
        var count: UInt64 = 0, shift: UInt64 = 0
        while true {
            guard offset < bytes.count else { throw BodyProblem("the body's header is cut short") }
            let b = bytes[offset]
            offset += 1
            count |= UInt64(b & 0x7F) << shift
            if b < 0x80 { break }
            shift += 7
            guard shift <= 63 else { throw BodyProblem("the body's coverage count is not a varint") }
        }
        guard count <= UInt64(bytes.count - offset) / 24 else { throw BodyProblem("the body's coverage is cut short") }
        var coverage: [UUID: UInt64] = [:]
        for _ in 0..<count {
            let site = uuid()
            coverage[site] = try fixed()
        }
        self.coverage = coverage
        headerLength = offset
        let expected = UInt64(offset) + (sealed ? UInt64(Self.sealOverhead) : 0)
        guard payloadLength <= UInt64(Int.max) - expected, UInt64(bytes.count) == expected + payloadLength else {
            throw BodyProblem("the body holds \(bytes.count) bytes, and its header says \(expected + min(payloadLength, UInt64(Int.max) - expected)) (cut short, or with bytes after its end)")
        }
    }
}

/// What is wrong with a body: the message a 400 answer carries.
struct BodyProblem: Error, CustomStringConvertible {
    let description: String
    init(_ description: String) { self.description = description }
}
