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

extension FieldValue: CustomStringConvertible {
    /// The value as compact JSON (``json``): dates as ISO 8601, and NaN, the infinities and
    /// dates out of the calendar's range in the tagged forms `dump` prints. Safe for any value,
    /// so error messages can name what a damaged or hostile input holds.
    public var description: String { json.text }
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
        let data = Data(text.utf8)
        do { return try JSONDecoder().decode(JSONValue.self, from: data) }
        catch { throw StoreError(.invalidValue, "malformed JSON: \(jsonSyntaxError(data) ?? describe(error))") }
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

/// Whole-second ISO 8601 dates in the proleptic Gregorian calendar, as ISO 8601 (and
/// Python, JavaScript, PostgreSQL) count: Foundation's formatter switches to the Julian
/// calendar before 1582-10-15, so 0001-01-01 printed as 0001-01-03. Years 0001 to 9999.
enum InternetDateTime {
    /// "YYYY-MM-DDTHH:MM:SSZ" of whole seconds since 1970; nil outside years 1...9999.
    static func string(secondsSince1970 seconds: Int64) -> String? {
        let (days, secondOfDay) = seconds.quotientAndRemainder(dividingBy: 86_400)
        let day = secondOfDay < 0 ? days - 1 : days
        let second = secondOfDay < 0 ? secondOfDay + 86_400 : secondOfDay
        let (y, m, d) = civil(fromDays: day)
        guard (1...9999).contains(y) else { return nil }
        func two(_ n: Int64) -> String { n < 10 ? "0\(n)" : "\(n)" }
        let year = String(repeating: "0", count: 4 - String(y).count) + String(y)
        return "\(year)-\(two(m))-\(two(d))T\(two(second / 3600)):\(two(second / 60 % 60)):\(two(second % 60))Z"
    }

    /// Whole seconds since 1970 of "YYYY-MM-DDTHH:MM:SS" and "Z" or "±HH:MM"; nil for any
    /// other text or an impossible date.
    static func seconds(_ text: String) -> Int64? {
        let u = Array(text.utf8)
        guard u.count == 20 || u.count == 25 else { return nil }
        func number(_ range: Range<Int>) -> Int64? {
            var n: Int64 = 0
            for i in range {
                guard (48...57).contains(u[i]) else { return nil }
                n = n * 10 + Int64(u[i] - 48)
            }
            return n
        }
        guard u[4] == 45, u[7] == 45, u[10] == 84 || u[10] == 116, u[13] == 58, u[16] == 58,
              let y = number(0..<4), let m = number(5..<7), let d = number(8..<10),
              let hour = number(11..<13), let minute = number(14..<16), let second = number(17..<19),
              y >= 1, (1...12).contains(m), d >= 1, d <= daysIn(month: m, year: y), hour < 24, minute < 60, second < 60 else { return nil }
        var offset: Int64 = 0
        if u.count == 20 {
            guard u[19] == 90 || u[19] == 122 else { return nil }
        } else {
            guard u[19] == 43 || u[19] == 45, u[22] == 58, let oh = number(20..<22), let om = number(23..<25), oh < 24, om < 60 else { return nil }
            offset = (oh * 3600 + om * 60) * (u[19] == 45 ? -1 : 1)
        }
        return days(fromCivil: y, m, d) * 86_400 + hour * 3600 + minute * 60 + second - offset
    }

    private static func daysIn(month m: Int64, year y: Int64) -> Int64 {
        switch m {
        case 2: return y % 4 == 0 && (y % 100 != 0 || y % 400 == 0) ? 29 : 28
        case 4, 6, 9, 11: return 30
        default: return 31
        }
    }

    /// Days since 1970-01-01 of a proleptic Gregorian date (H. Hinnant's days_from_civil).
    private static func days(fromCivil year: Int64, _ m: Int64, _ d: Int64) -> Int64 {
        let y = m <= 2 ? year - 1 : year
        let era = (y >= 0 ? y : y - 399) / 400
        let yoe = y - era * 400
        let doy = (153 * (m > 2 ? m - 3 : m + 9) + 2) / 5 + d - 1
        let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy
        return era * 146_097 + doe - 719_468
    }

    /// The proleptic Gregorian date of a day since 1970-01-01 (civil_from_days).
    private static func civil(fromDays days: Int64) -> (Int64, Int64, Int64) {
        let z = days + 719_468
        let era = (z >= 0 ? z : z - 146_096) / 146_097
        let doe = z - era * 146_097
        let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365
        let doy = doe - (365 * yoe + yoe / 4 - yoe / 100)
        let mp = (5 * doy + 2) / 153
        let d = doy - (153 * mp + 2) / 5 + 1
        let m = mp < 10 ? mp + 3 : mp - 9
        return (yoe + era * 400 + (m <= 2 ? 1 : 0), m, d)
    }
}

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
    guard let since1970 = InternetDateTime.seconds(wholeText) else { return nil }
    let whole = Date(timeIntervalSince1970: Double(since1970))
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
    guard var text = InternetDateTime.string(secondsSince1970: Int64(whole + Date.timeIntervalBetween1970AndReferenceDate)) else { return nil }
    if fraction != 0 {
        let digits = fraction.description.drop { $0 != "." }.dropFirst()
        guard !digits.isEmpty, text.hasSuffix("Z") else { return nil }
        text.removeLast()
        text += "." + digits + "Z"
    }
    return parseISO8601(text)?.timeIntervalSinceReferenceDate.bitPattern == seconds.bitPattern ? text : nil
}

/// One line for an error of any kind: our own messages verbatim, Codable errors summarized
/// with the path of the value at fault (`types[0].fields[1].kind`).
/// `json`: the text a decoder read, if any; a syntax error then says where it is (Foundation's
/// `JSONDecoder` says only that the data is not valid JSON).
package func describe(_ error: any Error, in json: Data? = nil) -> String {
    switch error {
    case let e as DecodingError:
        switch e {
        case .dataCorrupted(let c) where c.codingPath.isEmpty:
            return json.flatMap(jsonSyntaxError).map { "not valid JSON: \($0)" } ?? c.debugDescription
        case .dataCorrupted(let c): return "\(c.debugDescription) (at \(codingPathText(c.codingPath)))"
        case .keyNotFound(let k, let c):
            // The path of the value that lacks the key (a decoder may end it with the key).
            var path = c.codingPath
            if let last = path.last, last.stringValue == k.stringValue, last.intValue == k.intValue { path.removeLast() }
            let place = path.isEmpty ? "" : " in \(codingPathText(path))"
            // Foundation's and our JSON decoders' own wording says nothing more than the key.
            let boilerplate = c.debugDescription.isEmpty || c.debugDescription.hasPrefix("No value associated with key")
                || c.debugDescription.hasPrefix("no value for '")
            return "missing field '\(k.stringValue)'\(place)\(boilerplate ? "" : ": \(c.debugDescription)")"
        case .typeMismatch(let t, let c): return "expected \(kindName(t)) at \(codingPathText(c.codingPath)) (\(c.debugDescription))"
        case .valueNotFound(let t, let c): return "expected \(kindName(t)) at \(codingPathText(c.codingPath)), found null"
        @unknown default: return "\(e)"
        }
    case let e as EncodingError:
        switch e {
        case .invalidValue(_, let c):
            return c.codingPath.isEmpty ? c.debugDescription : "\(c.debugDescription) (at '\(codingPathText(c.codingPath))')"
        @unknown default: return "\(e)"
        }
    case let e as StoreError: return e.message
    default: return "\(error)"
    }
}

/// `types[0].fields[1].kind` for a coding path (array positions in brackets); `the top
/// level` for none.
private func codingPathText(_ path: [any CodingKey]) -> String {
    guard !path.isEmpty else { return "the top level" }
    var text = ""
    for key in path {
        if let index = key.intValue, key.stringValue.hasPrefix("Index ") || key.stringValue == "\(index)" {
            text += "[\(index)]"
        } else {
            text += text.isEmpty ? key.stringValue : ".\(key.stringValue)"
        }
    }
    return text
}

/// What a decoding error's expected type is, in JSON's words.
private func kindName(_ type: Any.Type) -> String {
    switch type {
    case is String.Type: "a string"
    case is Bool.Type: "a boolean"
    case is any BinaryInteger.Type: "an integer"
    case is any BinaryFloatingPoint.Type: "a number"
    case is [Any].Type: "an array"
    case is [String: Any].Type: "an object"
    default: "\(type)"
    }
}

/// Where and why `data` is not JSON, from Foundation's parser (which says where, unlike
/// `JSONDecoder`): "invalid value around character 15"; nil if it parses.
private func jsonSyntaxError(_ data: Data) -> String? {
    do {
        _ = try JSONSerialization.jsonObject(with: data, options: [.fragmentsAllowed])
        return nil
    } catch {
        guard var reason = (error as NSError).userInfo[NSDebugDescriptionErrorKey] as? String, !reason.isEmpty else {
            return "not valid JSON"
        }
        if reason.hasSuffix(".") { reason.removeLast() }
        return reason.prefix(1).lowercased() + reason.dropFirst()
    }
}
