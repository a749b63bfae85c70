import Foundation

extension StashExecutable {
    /// Runs `stash` with arguments given as raw bytes (each without its terminating 0), so
    /// that one can be what no Swift `String` holds: bytes that are not UTF-8.
    public static func run(rawArguments: [[UInt8]]) throws -> Result {
        let program = Array(url.path.utf8)
        let all = [program] + rawArguments
        // NUL-terminated copies, alive until the child is spawned.
        let cStrings: [UnsafeMutablePointer<CChar>] = all.map { bytes in
            let pointer = UnsafeMutablePointer<CChar>.allocate(capacity: bytes.count + 1)
            for (i, byte) in bytes.enumerated() { pointer[i] = CChar(bitPattern: byte) }
            pointer[bytes.count] = 0
            return pointer
        }
        defer { for pointer in cStrings { pointer.deallocate() } }
        var argv: [UnsafeMutablePointer<CChar>?] = cStrings + [nil]
        var out: [Int32] = [0, 0], err: [Int32] = [0, 0]
        guard pipe(&out) == 0, pipe(&err) == 0 else { throw POSIXError(.EMFILE) }
        var actions = posix_spawn_file_actions_t()
        posix_spawn_file_actions_init(&actions)
        defer { posix_spawn_file_actions_destroy(&actions) }
        posix_spawn_file_actions_addopen(&actions, 0, "/dev/null", O_RDONLY, 0)
        posix_spawn_file_actions_adddup2(&actions, out[1], 1)
        posix_spawn_file_actions_adddup2(&actions, err[1], 2)
        posix_spawn_file_actions_addclose(&actions, out[0])
        posix_spawn_file_actions_addclose(&actions, err[0])
        var pid: pid_t = 0
        let rc = posix_spawn(&pid, cStrings[0], &actions, nil, &argv, environ)
        close(out[1])
        close(err[1])
        guard rc == 0 else {
            close(out[0])
            close(err[0])
            throw POSIXError(POSIXErrorCode(rawValue: rc) ?? .EINVAL)
        }
        let outData = FileHandle(fileDescriptor: out[0], closeOnDealloc: true).readDataToEndOfFile()
        let errData = FileHandle(fileDescriptor: err[0], closeOnDealloc: true).readDataToEndOfFile()
        var status: Int32 = 0
        while waitpid(pid, &status, 0) == -1 && errno == EINTR {}
        // WIFEXITED: the low 7 bits are 0; then the status is bits 8-15. Otherwise 128 + signal.
        let code = status & 0x7F == 0 ? (status >> 8) & 0xFF : 128 + (status & 0x7F)
        return Result(status: code, stdout: String(decoding: outData, as: UTF8.self), stderr: String(decoding: errData, as: UTF8.self),
                      signal: status & 0x7F == 0 ? nil : status & 0x7F)
    }
}
