import Foundation

extension StashExecutable {
    /// What ``runMeasuringMemory(_:stdin:stdout:stderr:)`` saw of a finished `stash`.
    public struct MeasuredRun: Sendable {
        public let status: Int32
        /// The child's peak resident set size in bytes: on Linux its own high-water mark
        /// (`VmHWM`, read while it runs), elsewhere `ru_maxrss` from `wait4`.
        public let peakMemory: Int
    }

    /// Runs `stash arguments…` to completion with standard input from the file `stdin`
    /// (default /dev/null) and its output into the files `stdout` and `stderr`, and reports
    /// its peak memory.
    ///
    /// The child is started with `posix_spawn` and reaped with `wait4` on its own pid:
    /// `getrusage(RUSAGE_CHILDREN)` gives the largest of every child the test runner has
    /// reaped, and `Process` reaps its child itself. On Linux the figure is the child's own
    /// `VmHWM`, read while it runs (see the note in the body on `ru_maxrss`).
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
        #if os(Linux)
        // `ru_maxrss` is no measure of the child on Linux: posix_spawn runs the child in the
        // test runner's memory until it execs (vfork), and exec keeps that memory's high-water
        // mark as the process's. A `/bin/true` spawned by a 400 MiB process reports 400 MiB, so
        // a test runner larger than the child (many tests in parallel) was measured instead of
        // the child: growths read as 0, or as what other tests allocated meanwhile. The child's
        // own `VmHWM` is read while it runs instead; it only grows, so the last reading, at
        // most a millisecond before the exit, is its peak up to then.
        let highWater = HighWaterWatch(pid: pid)
        #endif
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
        let peak = highWater.stop() ?? usage.ru_maxrss * 1024   // kilobytes on Linux
        #else
        let peak = usage.ru_maxrss          // bytes on Darwin
        #endif
        return MeasuredRun(status: exitStatus, peakMemory: peak)
    }
}

#if os(Linux)
/// Reads a process's `VmHWM` (`/proc/PID/status`) every millisecond on a thread of its own
/// until ``stop()``, keeping the highest value seen.
private final class HighWaterWatch: @unchecked Sendable {
    private let lock = NSLock()
    private var highest: Int?
    private var stopped = false
    private let done = DispatchSemaphore(value: 0)

    init(pid: pid_t) {
        let path = "/proc/\(pid)/status"
        Thread { [self] in
            while !isStopped {
                if let value = Self.read(path) { record(value) }
                usleep(1000)
            }
            done.signal()
        }.start()
    }

    private var isStopped: Bool { lock.lock(); defer { lock.unlock() }; return stopped }

    private func record(_ value: Int) {
        lock.lock()
        highest = max(highest ?? 0, value)
        lock.unlock()
    }

    /// Stops the watch; the highest `VmHWM` seen in bytes, nil when none was read.
    func stop() -> Int? {
        lock.lock()
        stopped = true
        lock.unlock()
        done.wait()
        lock.lock()
        defer { lock.unlock() }
        return highest
    }

    /// `VmHWM` of the status file at `path`, in bytes; nil when it cannot be read (the process
    /// has exited). `posix_spawn` returns once the child has exec'd, so every reading is of the
    /// child's own memory, never of the runner's it started in.
    private static func read(_ path: String) -> Int? {
        guard let text = try? String(contentsOfFile: path, encoding: .utf8),
              let line = text.split(separator: "\n").first(where: { $0.hasPrefix("VmHWM:") }),
              let kilobytes = Int(line.dropFirst("VmHWM:".count).split(whereSeparator: \.isWhitespace).first ?? "") else { return nil }
        return kilobytes * 1024
    }
}
#endif
