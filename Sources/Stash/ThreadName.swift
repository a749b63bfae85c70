import CThreadName
import Foundation

/// Names the calling thread for the OS (`top -H`, `ps -T`, debuggers), as the library's own
/// threads do first thing (background sync, delta reader, gate updates). Linux keeps the first
/// 15 bytes. Foundation's `Thread.name`, set before the start, names only the `Thread` object
/// on Linux, and set from the thread itself it did not always reach the OS thread.
package func nameThisThread(_ name: String) {
    _ = stash_name_this_thread(name)
}

/// Starts a thread of the library's own, named `name` for the OS (``nameThisThread(_:)``)
/// before it runs `body`. `stackSize`: bytes, nil for Foundation's default.
package func startNamedThread(_ name: String, stackSize: Int? = nil, _ body: @escaping @Sendable () -> Void) {
    let thread = Thread {
        nameThisThread(name)
        body()
    }
    if let stackSize { thread.stackSize = stackSize }
    thread.start()
}
