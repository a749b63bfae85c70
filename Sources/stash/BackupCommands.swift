import ArgumentParser
import Foundation
import Stash

struct Backup: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Copy a store into a new directory, consistent while writers run.",
        discussion: """
        The copy is one committed state of the store (LMDB's mdb_env_copy2), taken while the app \
        goes on writing; DEST must not hold a store yet (it is made when missing). With --compact, \
        free pages are left out: the copy is as small as what the store holds. Opened, the copy \
        is a new replica (a site of its own), as every copy of a store is. The store is read, \
        never written.
        """)
    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The directory to copy it into.") var destination: String
    @Flag(help: "Leave free pages out of the copy.") var compact = false

    func run() throws {
        try runCommand {
            let store = try openExisting(directory, readOnly: true)
            let report = try store.backup(to: destination, compact: compact)
            printLine("backup of \(store.path) in \(report)")
        }
    }
}

struct Compact: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Shrink a store in place: its data rewritten without free pages.",
        discussion: """
        LMDB reuses the pages deletes free but never shrinks its file: a store that grew and \
        then lost most of its records keeps its size until it is compacted. The compacted copy \
        is made beside the data file (room for it is needed) and renamed over it. No process may \
        have the store open meanwhile. The store keeps its site and history.
        """)
    @Argument(help: "The store directory.") var directory: String

    func run() throws {
        try runCommand {
            var isDirectory: ObjCBool = false
            guard FileManager.default.fileExists(atPath: directory, isDirectory: &isDirectory), isDirectory.boolValue else {
                throw CommandFailure(message: "no store directory at \(directory)")
            }
            let report = try Store.compact(at: directory)
            printLine("compacted \(report)")
        }
    }
}
