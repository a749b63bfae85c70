import Foundation
#if canImport(Glibc)
import Glibc
#endif

// A crash kills the whole test process before any `Issue` is reported: each shard of the fuzz
// run keeps a note of the mutant under way, and a signal handler writes the notes to standard
// error, then lets the previous handler (the runtime's backtrace) or the default action go on.

private let noteCapacity = 8192
private let maximumShards = 8
nonisolated(unsafe) private let notes = UnsafeMutablePointer<UInt8>.allocate(capacity: noteCapacity * maximumShards)
nonisolated(unsafe) private let noteLengths: UnsafeMutablePointer<Int> = {
    let lengths = UnsafeMutablePointer<Int>.allocate(capacity: maximumShards)
    lengths.initialize(repeating: 0, count: maximumShards)
    return lengths
}()
nonisolated(unsafe) private let savedActions = UnsafeMutablePointer<sigaction>.allocate(capacity: 65)
private let handledSignals: [Int32] = [SIGILL, SIGTRAP, SIGSEGV, SIGBUS, SIGFPE, SIGABRT]

private func writeNote(_ shard: Int) {
    if noteLengths[shard] > 0 { _ = write(2, notes + shard * noteCapacity, noteLengths[shard]) }
}

private func fuzzSignalHandler(_ signal: Int32) {
    // Every shard's note: the one that died is among them (a replay of each tells which).
    let text = "\n*** delta fuzz: the process died on a signal; the fuzz threads were at:\n"
    _ = text.utf8CString.withUnsafeBufferPointer { write(2, $0.baseAddress, $0.count - 1) }
    for shard in 0..<maximumShards { writeNote(shard) }
    _ = sigaction(signal, savedActions + Int(signal), nil)
    // A fault runs its instruction again on return, now under the previous handler; a raised
    // signal (abort, a trap instruction) must be raised again.
    if signal == SIGABRT || signal == SIGTRAP { raise(signal) }
}

enum FuzzCrashNote {
    static let shards = maximumShards

    /// Installs the handler for the whole process.
    static func install() {
        for signal in handledSignals {
            var action = sigaction()
            action.__sigaction_handler.sa_handler = fuzzSignalHandler
            sigemptyset(&action.sa_mask)
            action.sa_flags = Int32(SA_ONSTACK)
            _ = sigaction(signal, &action, savedActions + Int(signal))
        }
    }

    /// Puts the previous handlers back and forgets the notes.
    static func uninstall() {
        for signal in handledSignals { _ = sigaction(signal, savedActions + Int(signal), nil) }
        for shard in 0..<maximumShards { noteLengths[shard] = 0 }
    }

    /// Called on the thread of shard `shard` before its first note: the handler runs on an
    /// alternate stack there (so that a stack overflow is reported too).
    static func enter(shard: Int) {
        precondition(shard < maximumShards)
        var current = stack_t()
        if sigaltstack(nil, &current) == 0, current.ss_flags & Int32(SS_DISABLE) != 0 {
            var stack = stack_t()
            stack.ss_sp = UnsafeMutableRawPointer.allocate(byteCount: 1 << 16, alignment: 16)   // kept for the thread's life
            stack.ss_size = 1 << 16
            stack.ss_flags = 0
            _ = sigaltstack(&stack, nil)
        }
    }

    /// The note written if shard `shard`'s thread dies now.
    static func set(shard: Int, _ text: String) {
        var text = text
        text.withUTF8 { utf8 in
            let n = min(utf8.count, noteCapacity)
            if let base = utf8.baseAddress { (notes + shard * noteCapacity).update(from: base, count: n) }
            noteLengths[shard] = n
        }
    }
}
