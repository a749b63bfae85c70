import Foundation

extension StashExecutable {
    /// What ``runMeasuringMemory(_:stdin:stdout:stderr:)`` saw of a finished `stash`.
    public struct MeasuredRun: Sendable {
        public let status: Int32
        /// The child's peak resident set size in bytes (`ru_maxrss` from `wait4`).
        public let peakMemory: Int
    }

    /// Runs `stash arguments…` to completion with standard input from the file `stdin`
    /// (default /dev/null) and its output into the files `stdout` and `stderr`, and reports
    /// its peak memory.
    ///
    /// The child is started with `posix_spawn` and reaped with `wait4` on its own pid, so the
    /// figure is this child's alone: `getrusage(RUSAGE_CHILDREN)` gives the largest of every
    /// child the test runner has reaped, and `Process` reaps its child itself.
    public static func runMeasuringMemory(_ arguments: [String], stdin: String = "/dev/null",
                                          stdout: String, stderr: String) throws -> MeasuredRun {
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, stdin, O_RDONLY, 0)
        posix_spawn_file_actions_addopen(&actions, 1, stdout, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        posix_spawn_file_actions_addopen(&actions, 2, stderr, O_WRONLY | O_CREAT | O_TRUNC, 0o644)
        let argv: [UnsafeMutablePointer<CChar>?] = ([url.path] + arguments).map { strdup($0) } + [nil]
        defer { for pointer in argv { free(pointer) } }
        var pid = pid_t()
        let spawned = posix_spawn(&pid, url.path, &actions, nil, argv, environ)
        guard spawned == 0 else {
            throw CocoaError(.executableLoad, userInfo: [NSLocalizedDescriptionKey: "cannot start \(url.path): \(String(cString: strerror(spawned)))"])
        }
        var status: Int32 = 0
        var usage = rusage()
        while wait4(pid, &status, 0, &usage) == -1 {
            guard errno == EINTR else {
                throw CocoaError(.executableLoad, userInfo: [NSLocalizedDescriptionKey: "wait4 for \(url.path): \(String(cString: strerror(errno)))"])
            }
        }
        // A normal exit carries its code in bits 8-15; a signal is reported as 128 + signal.
        let exitStatus = status & 0x7f == 0 ? (status >> 8) & 0xff : 128 + (status & 0x7f)
        #if os(Linux)
        let peak = usage.ru_maxrss * 1024   // kilobytes on Linux
        #else
        let peak = usage.ru_maxrss          // bytes on Darwin
        #endif
        return MeasuredRun(status: exitStatus, peakMemory: peak)
    }
}
