import Foundation

/// The input of `stash load`, readable from its start as often as needed, without holding it
/// in memory.
///
/// `load` reads its input twice (a check of every line, then the writes), and a write that
/// reruns because the map grew reads its lines again. A regular file is read where it is
/// (standard input redirected from a file too, from its offset). Anything else (standard
/// input from a pipe, a FIFO, `<(…)`) can be read only once, so it is first copied to a
/// temporary file in the system's temporary directory (`TMPDIR`). That file is unlinked as
/// soon as it is made: it goes away when the tool ends, however it ends.
final class JSONLinesInput {
    /// The input as the user named it (`-` for standard input), for messages.
    let name: String
    /// A readable, seekable descriptor (read with `pread`, so its offset never matters).
    private let descriptor: Int32
    /// Where the input starts in `descriptor`.
    private let start: off_t
    private let ownsDescriptor: Bool

    /// Bytes read per `read(2)`.
    static let chunkSize = 1 << 20

    /// Opens `path`, or standard input for `-`.
    /// - Throws: ``CommandFailure`` when it cannot be opened or read, or cannot be copied to
    ///   a temporary file.
    init(path: String) throws {
        name = path
        let opened: Int32
        if path == "-" {
            opened = STDIN_FILENO
        } else {
            opened = open(path, O_RDONLY | O_CLOEXEC)
            guard opened >= 0 else { throw CommandFailure(message: "cannot read \(path): \(String(cString: strerror(errno)))") }
        }
        var status = stat()
        guard fstat(opened, &status) == 0 else {
            let reason = String(cString: strerror(errno))
            if opened != STDIN_FILENO { close(opened) }
            throw CommandFailure(message: "cannot read \(path): \(reason)")
        }
        let kind = status.st_mode & S_IFMT
        if kind == S_IFDIR {
            if opened != STDIN_FILENO { close(opened) }
            throw CommandFailure(message: "cannot read \(path): it is a directory; give a JSON-lines file")
        }
        if kind == S_IFREG {
            descriptor = opened
            start = path == "-" ? max(lseek(opened, 0, SEEK_CUR), 0) : 0
            ownsDescriptor = path != "-"
            return
        }
        defer { if opened != STDIN_FILENO { close(opened) } }
        descriptor = try Self.spool(opened, name: path == "-" ? "standard input" : path)
        start = 0
        ownsDescriptor = true
    }

    deinit {
        if ownsDescriptor { close(descriptor) }
    }

    /// A reader of the lines from `position` on (default: the first line), reading no byte
    /// at or past `end` (default: to the end of the input).
    func lines(from position: JSONLinePosition = .start, upTo end: JSONLinePosition? = nil) -> JSONLineReader {
        JSONLineReader(input: self, from: position, upTo: end?.offset)
    }

    /// Up to `count` bytes at `offset` (relative to the input's start) into `buffer`; 0 at the end.
    /// - Throws: ``CommandFailure`` naming the input when the read fails.
    func readBytes(into buffer: UnsafeMutableRawBufferPointer, at offset: Int) throws -> Int {
        while true {
            let got = pread(descriptor, buffer.baseAddress, buffer.count, start + off_t(offset))
            if got >= 0 { return got }
            if errno == EINTR { continue }
            throw CommandFailure(message: "cannot read \(name): \(String(cString: strerror(errno)))")
        }
    }

    /// Copies all of `source` to a new, already unlinked file in the temporary directory and
    /// returns that file's descriptor.
    private static func spool(_ source: Int32, name: String) throws -> Int32 {
        let directory = FileManager.default.temporaryDirectory.path
        var template = Array("\(directory)/stash-load-XXXXXX".utf8CString)
        let spooled = template.withUnsafeMutableBufferPointer { mkstemp($0.baseAddress!) }
        guard spooled >= 0 else {
            throw CommandFailure(message: "cannot make a temporary copy of \(name) in \(directory): \(String(cString: strerror(errno))); set TMPDIR to a writable directory")
        }
        unlink(template)
        do {
            var chunk = [UInt8](repeating: 0, count: chunkSize)
            while true {
                let got = chunk.withUnsafeMutableBytes { read(source, $0.baseAddress, $0.count) }
                if got < 0 {
                    if errno == EINTR { continue }
                    throw CommandFailure(message: "cannot read \(name): \(String(cString: strerror(errno)))")
                }
                if got == 0 { return spooled }
                var written = 0
                while written < got {
                    let n = chunk.withUnsafeBytes { write(spooled, $0.baseAddress! + written, got - written) }
                    if n < 0 {
                        if errno == EINTR { continue }
                        throw CommandFailure(message: "cannot copy \(name) to a temporary file in \(directory): \(String(cString: strerror(errno))); set TMPDIR to a directory with room for it, or give a file instead of \(name)")
                    }
                    written += n
                }
            }
        } catch {
            close(spooled)
            throw error
        }
    }
}

/// Where a line of a ``JSONLinesInput`` starts: its byte offset and its number (from 1).
struct JSONLinePosition: Equatable {
    var offset: Int
    var line: Int
    static let start = JSONLinePosition(offset: 0, line: 1)
}

/// One line of JSON-lines input that holds something: its text without the line end and
/// the spaces around it (tabs and Unicode's space separators, `CharacterSet.whitespaces`).
struct JSONLine {
    let number: Int
    let text: String
}

/// A line of the input that is not UTF-8. Decoding it would put U+FFFD in place of every bad
/// byte, silently.
struct NotUTF8Line: Error, CustomStringConvertible {
    let number: Int
    var description: String { "not UTF-8 text (convert it first, e.g. iconv -f latin1 -t utf-8)" }
}

/// Reads the lines of a ``JSONLinesInput`` in chunks of ``JSONLinesInput/chunkSize`` bytes.
///
/// Lines end at "\n" or "\r\n" (a last line may have no end); lines that are empty or hold
/// only spaces are skipped but counted. Memory: a chunk and the longest line, at most twice.
struct JSONLineReader {
    private let input: JSONLinesInput
    private let end: Int?
    /// Bytes read and not yet returned start at `buffer[consumed]`; `buffer[consumed..<scanned]`
    /// holds no "\n".
    private var buffer: [UInt8] = []
    private var consumed = 0
    private var scanned = 0
    /// The input offset of `buffer[0]` + `buffer.count`: where the next read starts.
    private var readOffset: Int
    private var exhausted = false
    /// Where the next line starts: after the last line returned, and every skipped line.
    private(set) var position: JSONLinePosition

    init(input: JSONLinesInput, from position: JSONLinePosition, upTo end: Int?) {
        self.input = input
        self.end = end
        self.position = position
        readOffset = position.offset
    }

    /// The next line that holds something, or nil at the end of the input.
    /// - Throws: ``NotUTF8Line``; ``CommandFailure`` when the input cannot be read.
    mutating func next() throws -> JSONLine? {
        while let (range, length) = try nextRawLine() {
            let number = position.line
            position = JSONLinePosition(offset: position.offset + length, line: number + 1)
            let decoded = buffer.withUnsafeBufferPointer { String(validating: UnsafeBufferPointer(rebasing: $0[range]), as: UTF8.self) }
            guard let text = decoded else { throw NotUTF8Line(number: number) }
            // Foundation's trimming reads the whole line as UTF-16 (slow on long lines): only
            // a line that starts or ends with a space needs it.
            let spaces = CharacterSet.whitespaces
            guard let first = text.unicodeScalars.first, let last = text.unicodeScalars.last else { continue }
            let trimmed = spaces.contains(first) || spaces.contains(last) ? text.trimmingCharacters(in: spaces) : text
            if !trimmed.isEmpty { return JSONLine(number: number, text: trimmed) }
        }
        return nil
    }

    /// Where the next line's bytes are in `buffer` (without its line end), and its length
    /// with the line end.
    private mutating func nextRawLine() throws -> (Range<Int>, Int)? {
        while true {
            let newline = buffer.withUnsafeBytes { bytes -> Int? in
                guard scanned < bytes.count,
                      let found = memchr(bytes.baseAddress! + scanned, Int32(UInt8(ascii: "\n")), bytes.count - scanned) else { return nil }
                return UnsafeRawPointer(found) - bytes.baseAddress!
            }
            if let newline {
                // "\r\n" is one line end, as Swift reads it; a lone "\r" is kept.
                let lineEnd = newline > consumed && buffer[newline - 1] == UInt8(ascii: "\r") ? newline - 1 : newline
                let line = (consumed..<lineEnd, newline + 1 - consumed)
                consumed = newline + 1
                scanned = consumed
                return line
            }
            scanned = buffer.count
            if exhausted {
                guard consumed < buffer.count else { return nil }
                let line = (consumed..<buffer.count, buffer.count - consumed)
                consumed = buffer.count
                scanned = consumed
                return line
            }
            try fill()
        }
    }

    /// Drops the bytes returned so far and appends the next chunk (none at the end).
    private mutating func fill() throws {
        // A line longer than a chunk doubles the buffer, so that it is copied O(1) times per byte.
        var wanted = max(JSONLinesInput.chunkSize, buffer.count - consumed)
        if let end { wanted = min(wanted, end - readOffset) }
        guard wanted > 0 else { exhausted = true; return }
        // A new array of the bytes still wanted and room for a chunk, filled with memcpy and
        // pread: appending element by element is slow, above all in a debug build.
        let kept = buffer.count - consumed
        let offset = readOffset
        var got = 0
        buffer = try buffer.withUnsafeBytes { old in
            try [UInt8](unsafeUninitializedCapacity: kept + wanted) { bytes, count in
                let raw = UnsafeMutableRawBufferPointer(bytes)
                if kept > 0 { raw.baseAddress!.copyMemory(from: old.baseAddress! + consumed, byteCount: kept) }
                count = kept
                got = try input.readBytes(into: UnsafeMutableRawBufferPointer(rebasing: raw[kept...]), at: offset)
                count = kept + got
            }
        }
        scanned -= consumed
        consumed = 0
        readOffset += got
        if got == 0 { exhausted = true }
    }
}
