import Foundation

/// Running the commands that walk a store's pages (`get`, `dump`, `stat`, `verify`, `backup`,
/// `compact`) in a child process: LMDB keeps no checksums, and some damage makes liblmdb itself crash
/// (an assertion, a page read past the map), which no check in this process can catch. The
/// child is this executable again, run with the same arguments and ``childMarker`` in its
/// environment; its standard input and output are this process's, its standard error passes
/// through here. A child that dies of such a crash is reported as damage, on one line, with
/// exit status 1.
enum Guarded {
    /// Set in a child's environment: the command runs in this process.
    static let childMarker = "STASH_GUARDED_CHILD"
    /// The subcommands that run in a child.
    static let commands: Set<String> = ["get", "dump", "stat", "verify", "backup", "compact"]

    /// Whether this process must run `arguments` (without the program name) in a child.
    static func needsChild(_ arguments: [String]) -> Bool {
        guard let command = arguments.first, commands.contains(command) else { return false }
        if arguments.contains(where: { $0 == "--help" || $0 == "-h" }) { return false }
        return ProcessInfo.processInfo.environment[childMarker] == nil
    }

    /// Runs `arguments` in a child and exits as it did: with its status; for a crash, with
    /// one line naming the store's damage and status 1; for a signal from outside (an
    /// interrupt, a closed pipe), by the same signal.
    static func runInChild(_ arguments: [String]) -> Never {
        let process = Process()
        let me = FileManager.default.fileExists(atPath: "/proc/self/exe") ? "/proc/self/exe" : (Bundle.main.executablePath ?? CommandLine.arguments[0])
        process.executableURL = URL(fileURLWithPath: me)
        process.arguments = arguments
        var environment = ProcessInfo.processInfo.environment
        environment[childMarker] = "1"
        // A crash in the child is reported here on one line, not as a backtrace.
        environment["SWIFT_BACKTRACE"] = "enable=no"
        process.environment = environment
        process.standardInput = FileHandle.standardInput
        process.standardOutput = FileHandle.standardOutput
        let errors = Pipe()
        process.standardError = errors
        do { try process.run() } catch {
            fail("cannot start the \(arguments[0]) of \(storeName(arguments)) in a child process: \(error)")
        }
        // The child's standard error, line by line as it comes (progress), except LMDB's
        // assertion message, which goes into the one line below.
        var assertion: String?
        var pending: [UInt8] = []
        let reader = errors.fileHandleForReading
        func forward(_ line: ArraySlice<UInt8>) {
            let text = String(decoding: line, as: UTF8.self)
            if text.contains("Assertion '") && text.contains("' failed in ") {
                assertion = text
            } else {
                _ = writeAll(STDERR_FILENO, Array(line) + [UInt8(ascii: "\n")])
            }
        }
        while true {
            let chunk = reader.availableData
            if chunk.isEmpty { break }
            pending.append(contentsOf: chunk)
            while let newline = pending.firstIndex(of: UInt8(ascii: "\n")) {
                forward(pending[..<newline])
                pending.removeSubrange(...newline)
            }
        }
        if !pending.isEmpty { forward(pending[...]) }
        process.waitUntilExit()
        if process.terminationReason == .exit { exit(process.terminationStatus) }
        let signal = process.terminationStatus
        switch signal {
        case SIGBUS, SIGSEGV, SIGABRT, SIGILL, SIGTRAP, SIGFPE, SIGSYS:
            let name = String(cString: strsignal(signal))
            var cause = "reading it crashed the \(arguments[0]) (\(name), signal \(signal))"
            if let assertion { cause += " at an LMDB assertion (\(assertion))" }
            fail("store \(storeName(arguments)) is damaged: \(cause), which its checks could not prevent; restore the store from a backup (`stash backup` makes one) or a peer")
        default:
            // Killed from outside, or a closed pipe: end the same way.
            Foundation.signal(signal, SIG_DFL)
            raise(signal)
            exit(128 + signal)
        }
    }

    /// The store directory of a command line: its first argument after the command that is
    /// no option.
    private static func storeName(_ arguments: [String]) -> String {
        arguments.dropFirst().first { !$0.hasPrefix("-") } ?? "?"
    }
}

/// Refuses an argument that is not UTF-8, as `load` refuses such a line: read as text, it
/// would be changed (each bad byte replaced by U+FFFD) and name another store, type or value.
func refuseArgumentsNotUTF8() {
    for index in 1..<Int(CommandLine.argc) {
        guard let argument = CommandLine.unsafeArgv[index], String(validatingCString: argument) == nil else { continue }
        let shown = String(decoding: UnsafeBufferPointer(start: UnsafeRawPointer(argument).assumingMemoryBound(to: UInt8.self), count: strlen(argument)),
                           as: UTF8.self)
        fail("argument \(index) ('\(shown)', with U+FFFD for each byte that is not) is not UTF-8 text; give it in UTF-8 (convert it first, e.g. with iconv -f latin1 -t utf-8); nothing was done")
    }
}
