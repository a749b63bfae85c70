import ArgumentParser
import Foundation
import Stash

@main
struct StashCommand: AsyncParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "stash",
        abstract: "Inspect and edit Stash stores (typed records on LMDB).",
        discussion: "Every command takes the store directory first. Errors print one line on stderr and exit non-zero.",
        subcommands: [Demo.self, Init.self, Put.self, Update.self, CounterChange.self, Load.self, Get.self, Delete.self, Count.self, Dump.self,
                      Stat.self, Verify.self, CollectBlobs.self, History.self, Backup.self, Compact.self,
                      Sync.self, ExportDelta.self, ImportDelta.self, Peers.self, ForgetPeer.self, Gate.self]
    )

    static func main() async {
        openStandardDescriptors()
        refuseArgumentsNotUTF8()
        let arguments = Array(CommandLine.arguments.dropFirst())
        if Guarded.needsChild(arguments) { Guarded.runInChild(arguments) }
        do {
            var command = try parseAsRoot()
            if var asynchronous = command as? any AsyncParsableCommand {
                try await asynchronous.run()
            } else {
                try command.run()
            }
        } catch {
            exit(withError: error)
        }
    }
}

/// Opens /dev/null on standard input, output or error when the tool was started with it
/// closed. The store's files would otherwise take the lowest free descriptors, and what the
/// tool prints (results, progress, errors) would be written into `data.mdb` or `lock.mdb`.
func openStandardDescriptors() {
    for descriptor: Int32 in 0...2 where fcntl(descriptor, F_GETFD) == -1 {
        let opened = open("/dev/null", descriptor == 0 ? O_RDONLY : O_WRONLY)
        if opened >= 0 && opened != descriptor { close(opened) }   // the lowest free one is `descriptor`
    }
}

/// The one-line error and exit code every command uses.
struct CommandFailure: Error, CustomStringConvertible {
    let message: String
    var description: String { message }
}

/// ``runCommand(_:)`` for a body that awaits (a sync through a transport).
func runCommand(_ body: () async throws -> Void) async throws {
    do { try await body() } catch { fail(error) }
}

/// Runs a command body; any error becomes `stash: <message>` on stderr and exit code 1.
func runCommand(_ body: () throws -> Void) throws {
    do { try body() } catch { fail(error) }
}

/// Ends the tool with `error` as one line: our errors by their message.
func fail(_ error: any Error) -> Never {
    switch error {
    case let error as CommandFailure: fail(error.message)
    case let error as StoreError: fail(error.message)
    default: fail("\(error)")
    }
}

func fail(_ message: String) -> Never {
    printError("stash: \(message)")
    Foundation.exit(1)
}

/// Writes `text` and a newline to standard output. A failed write (a full disk, a closed
/// pipe) ends the tool with one line on stderr and exit 1: Foundation's `FileHandle.write`
/// traps instead, after a command may have committed.
func printLine(_ text: String) {
    if !writeAll(STDOUT_FILENO, text + "\n") {
        let reason = String(cString: strerror(errno))
        printError("stash: cannot write to standard output: \(reason)")
        Foundation.exit(1)
    }
}

/// Writes `text` and a newline to standard error (progress, errors); a failure there has no
/// one to tell, and is ignored.
func printError(_ text: String) {
    _ = writeAll(STDERR_FILENO, text + "\n")
}

/// `write(2)` until every byte is out; false (with `errno`) on an error.
private func writeAll(_ descriptor: Int32, _ text: String) -> Bool {
    writeAll(descriptor, Array(text.utf8))
}

/// `write(2)` of `data` until every byte is out; false (with `errno`) on an error.
func writeAll(_ descriptor: Int32, _ data: [UInt8]) -> Bool {
    var bytes = data[...]
    while !bytes.isEmpty {
        let written = bytes.withUnsafeBytes { write(descriptor, $0.baseAddress, $0.count) }
        if written < 0 {
            if errno == EINTR { continue }
            return false
        }
        bytes = bytes.dropFirst(written)
    }
    return true
}


/// The whole content of the file at `path` (`what` names it in errors: "schema file "), or
/// of standard input for `-`; a failure is one line that says why (no such file, a
/// directory, permissions).
func readWholeFile(_ path: String, _ what: String = "") throws -> Data {
    let descriptor = path == "-" ? STDIN_FILENO : open(path, O_RDONLY | O_CLOEXEC)
    let name = path == "-" ? "standard input" : "\(what)\(path)"
    guard descriptor >= 0 else { throw CommandFailure(message: "cannot read \(name): \(String(cString: strerror(errno)))") }
    defer { if descriptor != STDIN_FILENO { close(descriptor) } }
    var status = stat()
    if fstat(descriptor, &status) == 0 && status.st_mode & S_IFMT == S_IFDIR {
        throw CommandFailure(message: "cannot read \(name): it is a directory; give a file")
    }
    var data = Data()
    var chunk = [UInt8](repeating: 0, count: 1 << 16)
    while true {
        let count = chunk.withUnsafeMutableBytes { read(descriptor, $0.baseAddress, $0.count) }
        if count < 0 && errno == EINTR { continue }
        guard count >= 0 else { throw CommandFailure(message: "cannot read \(name): \(String(cString: strerror(errno)))") }
        if count == 0 { return data }
        data.append(contentsOf: chunk[..<count])
    }
}

/// Opens an existing store (never creates one).
/// `readOnly`: for commands that only look (nothing is written: a backup stays as it is, a
/// copy keeps its site).
/// `types`: Swift record types to declare as well (the gate's own, for `stash gate`).
func openExisting(_ directory: String, readOnly: Bool = false, types: [any Record.Type] = []) throws -> Store {
    var options = StoreOptions()
    options.createIfMissing = false
    options.readOnly = readOnly
    options.progress = progressReporter()
    var isDirectory: ObjCBool = false
    guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
        throw CommandFailure(message: "no store directory at \(directory)")
    }
    do {
        if !types.isEmpty { return try Store.open(at: directory, types: types, options: options) }
        return try Store.open(at: directory, declaration: SchemaDeclaration(types: []), options: options)
    } catch let error as StoreError where readOnly && error.code == .readOnly {
        // A store in an older format can only be read once upgraded, which writes.
        printError("stash: \(directory) is in an older format (or has a migration to run); upgrading it in place, which writes, to read it")
        options.readOnly = false
        return try Store.open(at: directory, declaration: SchemaDeclaration(types: []), options: options)
    }
}

/// Progress lines on stderr for long work (index backfill, migrations).
func progressReporter() -> @Sendable (StoreProgress) -> Void {
    { progress in
        printError("\(progress.phase): \(progress.done)/\(progress.total)")
    }
}

/// `text` as an id; `what` names it in the error ("a family id", "a site id").
func parseID(_ text: String, as what: String = "a record id") throws -> RecordID {
    guard let id = RecordID(string: text) else {
        throw CommandFailure(message: "'\(text)' is not \(what) (expected a UUID such as 0192f1c2-7b3a-7000-8000-000000000001)")
    }
    return id
}

/// ``parseID(_:as:)`` of a `--family`.
func parseFamily(_ text: String) throws -> RecordID { try parseID(text, as: "a family id") }

/// Parses a command-line scalar for a field of `kind`: strings as given, others as JSON;
/// `null` is no value. A value in JSON double quotes is that string exactly, so that a string
/// with spaces at its ends, or the string "null", can be asked for: `name=" padded "`.
func parseScalar(_ text: String, kind: FieldKind?, field: String) throws -> FieldValue {
    if text == "null" { return .null }
    if text.count >= 2, text.hasPrefix("\""), text.hasSuffix("\""), case .string(let quoted)? = try? JSONValue.parse(text) {
        return kind == .string || kind == nil ? .string(quoted) : try FieldValue.fromJSON(.string(quoted), kind: kind, field: field)
    }
    switch kind {
    case .string:
        return .string(text)
    case .uuid, .date, .bytes:
        return try FieldValue.fromJSON(.string(text), kind: kind, field: field)
    default:
        let json: JSONValue
        do { json = try JSONValue.parse(text) } catch {
            if kind == nil { return .string(text) }
            throw StoreError(.invalidValue, "field '\(field)' expects \(kind!.rawValue), got '\(text)'")
        }
        return try FieldValue.fromJSON(json, kind: kind, field: field)
    }
}
