import Foundation
import Synchronization

/// A stored field value, independent of any Swift type: what the generic paths
/// (command line, dump, verification, sync) read and write.
public enum FieldValue: Hashable, Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case bytes(Data)
    case uuid(UUID)
    case date(Date)
    case array([FieldValue])
    case map([String: FieldValue])

    /// The kind stored in the schema for this value (nil for `.null`).
    public var kind: FieldKind? {
        switch self {
        case .null: return nil
        case .bool: return .bool
        case .int: return .int
        case .double: return .double
        case .string: return .string
        case .bytes: return .bytes
        case .uuid: return .uuid
        case .date: return .date
        case .array: return .array
        case .map: return .map
        }
    }
}

extension FieldValue: Codable {
    // A one-key object: {"int": 3}, {"string": "x"}, {"null": true}; stable for the stored schema.
    // Dates are written as seconds since 2001 ({"dateSince2001": …}, every bit of a `Date`);
    // {"date": seconds since 1970}, what schema files give and format 1 wrote, still reads.
    private enum Key: String, CodingKey { case null, bool, int, double, string, bytes, uuid, date, dateSince2001, array, map }

    public init(from decoder: any Decoder) throws {
        let c = try decoder.container(keyedBy: Key.self)
        guard let key = c.allKeys.first else {
            throw DecodingError.dataCorrupted(.init(codingPath: decoder.codingPath, debugDescription: "empty field value"))
        }
        switch key {
        case .null: self = .null
        case .bool: self = .bool(try c.decode(Bool.self, forKey: key))
        case .int: self = .int(try c.decode(Int64.self, forKey: key))
        case .double: self = .double(try c.decode(Double.self, forKey: key))
        case .string: self = .string(try c.decode(String.self, forKey: key))
        case .bytes: self = .bytes(try c.decode(Data.self, forKey: key))
        case .uuid: self = .uuid(try c.decode(UUID.self, forKey: key))
        case .date: self = .date(Date(timeIntervalSince1970: try c.decode(Double.self, forKey: key)))
        case .dateSince2001: self = .date(Date(timeIntervalSinceReferenceDate: try c.decode(Double.self, forKey: key)))
        case .array: self = .array(try c.decode([FieldValue].self, forKey: key))
        case .map: self = .map(try c.decode([String: FieldValue].self, forKey: key))
        }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.container(keyedBy: Key.self)
        switch self {
        case .null: try c.encode(true, forKey: .null)
        case .bool(let v): try c.encode(v, forKey: .bool)
        case .int(let v): try c.encode(v, forKey: .int)
        case .double(let v): try c.encode(v, forKey: .double)
        case .string(let v): try c.encode(v, forKey: .string)
        case .bytes(let v): try c.encode(v, forKey: .bytes)
        case .uuid(let v): try c.encode(v, forKey: .uuid)
        case .date(let v): try c.encode(v.timeIntervalSinceReferenceDate, forKey: .dateSince2001)
        case .array(let v): try c.encode(v, forKey: .array)
        case .map(let v): try c.encode(v, forKey: .map)
        }
    }
}

/// The kind of a field, as recorded in the stored schema.
public enum FieldKind: String, Codable, Sendable, CaseIterable {
    case bool, int, double, string, bytes, uuid, date, array, map
}

// MARK: JSON

/// A JSON document as a value: what the command line reads and prints.
public enum JSONValue: Codable, Hashable, Sendable {
    case null
    case bool(Bool)
    case int(Int64)
    case double(Double)
    case string(String)
    case array([JSONValue])
    case object([String: JSONValue])

    public init(from decoder: any Decoder) throws {
        let c = try decoder.singleValueContainer()
        if c.decodeNil() { self = .null }
        else if let b = try? c.decode(Bool.self) { self = .bool(b) }
        else if let i = try? c.decode(Int64.self) {
            // "-0", "-0.0": an integer 0 to Int64, but a double with its sign (which `==`
            // cannot see): keep it, so that a dumped -0.0 loads back as -0.0.
            if i == 0, let d = try? c.decode(Double.self), d.sign == .minus { self = .double(d) } else { self = .int(i) }
        }
        else if let d = try? c.decode(Double.self) { self = .double(d) }
        else if let s = try? c.decode(String.self) { self = .string(s) }
        else if let a = try? c.decode([JSONValue].self) { self = .array(a) }
        else { self = .object(try c.decode([String: JSONValue].self)) }
    }

    public func encode(to encoder: any Encoder) throws {
        var c = encoder.singleValueContainer()
        switch self {
        case .null: try c.encodeNil()
        case .bool(let b): try c.encode(b)
        case .int(let i): try c.encode(i)
        case .double(let d) where !d.isFinite: try c.encode(Self.nonFiniteNames[d.isNaN ? 0 : d < 0 ? 2 : 1])
        case .double(let d): try c.encode(d)
        case .string(let s): try c.encode(s)
        case .array(let a): try c.encode(a)
        case .object(let o): try c.encode(o)
        }
    }

    /// How NaN and the infinities print (JSON has no numbers for them): as these strings,
    /// which ``FieldValue/fromJSON(_:kind:field:)`` reads back for a double field.
    static let nonFiniteNames = ["NaN", "Infinity", "-Infinity"]

    /// Parses JSON text.
    /// - Throws: ``StoreError`` (`.invalidValue`) with the parser's reason.
    public static func parse(_ text: String) throws -> JSONValue {
        do { return try JSONDecoder().decode(JSONValue.self, from: Data(text.utf8)) }
        catch { throw StoreError(.invalidValue, "malformed JSON: \(describe(error))") }
    }

    /// Compact JSON text with sorted keys (stable output for dumps and diffs). NaN and the
    /// infinities print as "NaN", "Infinity" and "-Infinity" (before, the whole value
    /// printed as null).
    public var text: String {
        let encoder = JSONEncoder()
        encoder.outputFormatting = [.sortedKeys, .withoutEscapingSlashes]
        return String(decoding: (try? encoder.encode(self)) ?? Data("null".utf8), as: UTF8.self)
    }
}

extension FieldValue {
    /// Converts JSON to a field value of `kind` (nil: infer, for nested values and fields of
    /// no kind yet). Reads what ``json(as:)`` prints, so a printed record reads back equal.
    ///
    /// Without a kind, a one-key object whose key is a tag reads as the tagged value:
    /// `{"$date": "2026-11-24T02:45:00.25Z"}`, `{"$dateSince2001": 785555100.25}`,
    /// `{"$bytes": "<base64>"}`, `{"$uuid": "…"}`, `{"$double": 3}` (a double that JSON would
    /// read as an integer, or "NaN"), and `{"$map": {…}}` (a map whose only key starts with
    /// "$"). Any other object is a map, any other string a string. A field of a known kind
    /// also reads its own kind's tag.
    /// - Throws: ``StoreError`` (`.invalidValue`) naming `field` when the JSON does not fit.
    public static func fromJSON(_ json: JSONValue, kind: FieldKind?, field: String) throws -> FieldValue {
        func bad(_ expected: String) -> StoreError {
            StoreError(.invalidValue, "field '\(field)' expects \(expected), got \(json.text)")
        }
        if case .null = json { return .null }
        if case .object(let members) = json, members.count == 1, let (tag, inner) = members.first, tag.hasPrefix("$"),
           let tagged = try taggedValue(tag, inner, field: field), kind == nil || tagged.kind == kind {
            return tagged
        }
        switch (kind, json) {
        case (.bool, .bool(let b)): return .bool(b)
        case (.bool, _): throw bad("true or false")
        case (.int, .int(let i)): return .int(i)
        case (.int, .double(let d)) where d.rounded() == d && abs(d) < 9e18: return .int(Int64(d))
        case (.int, _): throw bad("an integer")
        case (.double, .int(let i)): return .double(Double(i))
        case (.double, .double(let d)): return .double(d)
        case (.double, .string(let s)) where JSONValue.nonFiniteNames.contains(s):
            return .double(s == "NaN" ? .nan : s == "Infinity" ? .infinity : -.infinity)
        case (.double, _): throw bad("a number")
        case (.string, .string(let s)): return .string(s)
        case (.string, _): throw bad("a string")
        case (.bytes, .string(let s)):
            guard let d = Data(base64Encoded: s) else { throw bad("base64 text") }
            return .bytes(d)
        case (.bytes, _): throw bad("base64 text")
        case (.uuid, .string(let s)):
            guard let u = UUID(uuidString: s) else { throw bad("a UUID") }
            return .uuid(u)
        case (.uuid, _): throw bad("a UUID")
        case (.date, .string(let s)):
            guard let d = parseISO8601(s) else { throw bad("an ISO 8601 date") }
            return .date(d)
        case (.date, .int(let i)): return .date(Date(timeIntervalSince1970: Double(i)))
        case (.date, .double(let d)): return .date(Date(timeIntervalSince1970: d))
        case (.date, _): throw bad("an ISO 8601 date or seconds since 1970")
        case (.array, .array(let a)), (nil, .array(let a)):
            return .array(try a.map { try fromJSON($0, kind: nil, field: field) })
        case (.array, _): throw bad("an array")
        case (.map, .object(let o)), (nil, .object(let o)):
            return .map(try o.mapValues { try fromJSON($0, kind: nil, field: field) })
        case (.map, _): throw bad("an object")
        case (nil, .bool(let b)): return .bool(b)
        case (nil, .int(let i)): return .int(i)
        case (nil, .double(let d)): return .double(d)
        case (nil, .string(let s)): return .string(s)
        case (nil, .null): return .null
        }
    }

    /// The value of a one-key tag object (see ``fromJSON(_:kind:field:)``); nil for a key that
    /// is no tag (the object is then a map).
    private static func taggedValue(_ tag: String, _ inner: JSONValue, field: String) throws -> FieldValue? {
        func bad(_ expected: String) -> StoreError {
            StoreError(.invalidValue, "field '\(field)': \(tag) expects \(expected), got \(inner.text)")
        }
        func number() -> Double? {
            switch inner {
            case .int(let i): return Double(i)
            case .double(let d): return d
            case .string(let s) where JSONValue.nonFiniteNames.contains(s): return s == "NaN" ? .nan : s == "Infinity" ? .infinity : -.infinity
            default: return nil
            }
        }
        switch tag {
        case "$double":
            guard let d = number() else { throw bad("a number") }
            return .double(d)
        case "$dateSince2001":
            guard let d = number() else { throw bad("seconds since 2001") }
            return .date(Date(timeIntervalSinceReferenceDate: d))
        case "$date":
            guard case .string(let s) = inner, let d = parseISO8601(s) else { throw bad("an ISO 8601 date") }
            return .date(d)
        case "$bytes":
            guard case .string(let s) = inner, let d = Data(base64Encoded: s) else { throw bad("base64 text") }
            return .bytes(d)
        case "$uuid":
            guard case .string(let s) = inner, let u = UUID(uuidString: s) else { throw bad("a UUID") }
            return .uuid(u)
        case "$map":
            guard case .object(let o) = inner else { throw bad("an object") }
            return .map(try o.mapValues { try fromJSON($0, kind: nil, field: field) })
        default:
            return nil
        }
    }

    /// JSON for this value as a field of its own kind (see ``json(as:)``).
    public var json: JSONValue { json(as: kind) }

    /// JSON for this value as a field of `kind`, which ``fromJSON(_:kind:field:)`` with the same
    /// kind reads back equal (every bit of a date or a double included).
    ///
    /// A value of `kind` prints plainly: bytes as base64, UUIDs as lowercase text, dates as
    /// ISO 8601 with as many decimals as the date needs to read back exactly (none for a
    /// whole second), NaN and the infinities as "NaN", "Infinity", "-Infinity". Values JSON
    /// cannot tell apart without a kind (inside arrays and maps, in a field of no kind or
    /// of another kind) print as a tag object: `{"$date": …}`, `{"$bytes": …}`,
    /// `{"$uuid": …}`, `{"$double": …}` for a whole or non-finite double, `{"$map": …}` for
    /// a map whose only key starts with "$".
    public func json(as kind: FieldKind?) -> JSONValue {
        let plain = kind != nil && kind == self.kind
        switch self {
        case .null: return .null
        case .bool(let b): return .bool(b)
        case .int(let i): return .int(i)
        case .double(let d):
            return plain || (d.isFinite && d.rounded() != d) ? .double(d) : .object(["$double": .double(d)])
        case .string(let s): return .string(s)
        case .bytes(let d): return plain ? .string(d.base64EncodedString()) : .object(["$bytes": .string(d.base64EncodedString())])
        case .uuid(let u): return plain ? .string(u.uuidString.lowercased()) : .object(["$uuid": .string(u.uuidString.lowercased())])
        case .date(let d):
            guard let text = exactISO8601(d) else { return .object(["$dateSince2001": .double(d.timeIntervalSinceReferenceDate)]) }
            return plain ? .string(text) : .object(["$date": .string(text)])
        case .array(let a): return .array(a.map { $0.json(as: nil) })
        case .map(let m):
            let object = JSONValue.object(m.mapValues { $0.json(as: nil) })
            return m.count == 1 && m.keys.first!.hasPrefix("$") ? .object(["$map": object]) : object
        }
    }
}

/// One formatter of whole-second ISO 8601 dates for the process (making one per date made a
/// dump of many records slow); formatters are not safe to share between threads unguarded.
private let internetDateTime: Mutex<ISO8601DateFormatter> = {
    let formatter = ISO8601DateFormatter()
    formatter.formatOptions = [.withInternetDateTime]
    return Mutex(formatter)
}()

/// Parses an ISO 8601 date and time with a zone ("Z" or "+01:00") and any number of decimals
/// of a second, to the `Date` nearest to what it says (exactly what ``exactISO8601(_:)`` printed).
func parseISO8601(_ text: String) -> Date? {
    // The decimals are read apart: the formatter keeps only milliseconds.
    var wholeText = text
    var decimals = ""
    if let t = text.firstIndex(where: { $0 == "T" || $0 == "t" }), let dot = text[t...].firstIndex(where: { $0 == "." || $0 == "," }) {
        let digitsEnd = text[text.index(after: dot)...].firstIndex(where: { !$0.isASCII || !$0.isNumber }) ?? text.endIndex
        decimals = String(text[text.index(after: dot)..<digitsEnd])
        guard !decimals.isEmpty else { return nil }
        wholeText = String(text[..<dot] + text[digitsEnd...])
    }
    guard let whole = internetDateTime.withLock({ $0.date(from: wholeText) }) else { return nil }
    let seconds = whole.timeIntervalSinceReferenceDate   // whole seconds: zones are whole minutes
    guard !decimals.isEmpty else { return whole }
    guard let exact = Decimal(string: "0." + decimals).map({ Decimal(Int64(seconds)) + $0 }),
          let value = Double(exact.description) else { return nil }
    return Date(timeIntervalSinceReferenceDate: value)
}

/// ISO 8601 in UTC with the fewest decimals of a second that read back as exactly `date`
/// (``parseISO8601(_:)``); nil when the date has no such form (not finite, or out of the
/// calendar's range).
func exactISO8601(_ date: Date) -> String? {
    let seconds = date.timeIntervalSinceReferenceDate
    guard seconds.isFinite, abs(seconds) < 1e14 else { return nil }
    let whole = seconds.rounded(.down)
    // The shortest decimal that reads back as `seconds`, minus its whole seconds: exact in Decimal.
    guard let shortest = Decimal(string: "\(seconds)") else { return nil }
    let fraction = shortest - Decimal(Int64(whole))
    var text = internetDateTime.withLock { $0.string(from: Date(timeIntervalSinceReferenceDate: whole)) }
    if fraction != 0 {
        let digits = fraction.description.drop { $0 != "." }.dropFirst()
        guard !digits.isEmpty, text.hasSuffix("Z") else { return nil }
        text.removeLast()
        text += "." + digits + "Z"
    }
    return parseISO8601(text)?.timeIntervalSinceReferenceDate.bitPattern == seconds.bitPattern ? text : nil
}

/// One line for an error of any kind: our own messages verbatim, Codable errors summarized.
func describe(_ error: any Error) -> String {
    switch error {
    case let e as DecodingError:
        switch e {
        case .dataCorrupted(let c): return c.debugDescription
        case .keyNotFound(let k, let c): return "missing field '\(k.stringValue)' \(c.debugDescription)"
        case .typeMismatch(let t, let c): return "expected \(t) at '\(c.codingPath.map(\.stringValue).joined(separator: "."))'"
        case .valueNotFound(let t, let c): return "missing \(t) at '\(c.codingPath.map(\.stringValue).joined(separator: "."))'"
        @unknown default: return "\(e)"
        }
    case let e as EncodingError:
        switch e {
        case .invalidValue(_, let c):
            let path = c.codingPath.map(\.stringValue).joined(separator: ".")
            return path.isEmpty ? c.debugDescription : "\(c.debugDescription) (at '\(path)')"
        @unknown default: return "\(e)"
        }
    case let e as StoreError: return e.message
    default: return "\(error)"
    }
}
