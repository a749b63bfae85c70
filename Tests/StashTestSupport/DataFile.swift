import Foundation

/// The bytes of a store's `data.mdb`, read whole, for tests that damage the file as a disk
/// would (a flipped byte, a cut) and then look at what the store makes of it. Knows just
/// enough of LMDB 0.9's page layout on a 64-bit machine to find pages and leaf nodes.
public struct DataFile {
    public let path: String
    public var bytes: [UInt8]

    /// `data.mdb` in store directory `directory`.
    public init(store directory: String) throws {
        path = (directory as NSString).appendingPathComponent("data.mdb")
        bytes = Array(try Data(contentsOf: URL(fileURLWithPath: path)))
    }

    /// Writes the bytes back (the store must not be open in this process).
    public func write() throws {
        try Data(bytes).write(to: URL(fileURLWithPath: path))
    }

    /// The page size, from the first meta page.
    public var pageSize: Int { Int(u32(at: 40)) }
    public var pageCount: Int { bytes.count / pageSize }

    /// Where `needle` starts in the file, each place.
    public func offsets(of needle: [UInt8]) -> [Int] {
        guard !needle.isEmpty, bytes.count >= needle.count else { return [] }
        var found: [Int] = []
        var at = 0
        while at <= bytes.count - needle.count {
            if bytes[at] == needle[0], bytes[at..<(at + needle.count)].elementsEqual(needle) { found.append(at) }
            at += 1
        }
        return found
    }

    public func u16(at offset: Int) -> UInt16 { UInt16(bytes[offset]) | UInt16(bytes[offset + 1]) << 8 }
    public func u32(at offset: Int) -> UInt32 { (0..<4).reduce(UInt32(0)) { $0 | UInt32(bytes[offset + $1]) << (8 * $1) } }
    public mutating func setU16(_ value: UInt16, at offset: Int) {
        bytes[offset] = UInt8(truncatingIfNeeded: value)
        bytes[offset + 1] = UInt8(truncatingIfNeeded: value >> 8)
    }

    /// A page's flags (`P_BRANCH` 1, `P_LEAF` 2, `P_OVERFLOW` 4, `P_META` 8, `P_LEAF2` 0x20).
    public func flags(ofPage page: Int) -> UInt16 { u16(at: page * pageSize + 10) }

    /// One node of a leaf page.
    public struct Node {
        /// Offset in the file of the node's header (flags at +4, key size at +6, key at +8).
        public let offset: Int
        public let flags: UInt16
        public let key: [UInt8]
        /// Offset in the file of the node's data, and its size (for a node whose data is on
        /// the page).
        public let dataOffset: Int
        public let dataSize: Int
    }

    /// The nodes of leaf page `page` (none for another kind of page).
    public func nodes(ofPage page: Int) -> [Node] {
        let start = page * pageSize
        guard flags(ofPage: page) & 0x7F == 0x02 else { return [] }
        let lower = Int(u16(at: start + 12))
        guard lower >= 16, lower <= pageSize else { return [] }
        return (0..<((lower - 16) / 2)).compactMap { i in
            let at = start + Int(u16(at: start + 16 + 2 * i))
            guard at + 8 <= start + pageSize else { return nil }
            let size = Int(u16(at: at)) | Int(u16(at: at + 2)) << 16
            let keySize = Int(u16(at: at + 6))
            guard at + 8 + keySize <= bytes.count else { return nil }
            return Node(offset: at, flags: u16(at: at + 4), key: Array(bytes[(at + 8)..<(at + 8 + keySize)]),
                        dataOffset: at + 8 + keySize, dataSize: size)
        }
    }
}

/// A small tmpfs mounted for a test that needs a file system that fills up (root only; see
/// ``isAvailable``), unmounted when the last reference goes.
public final class SmallFileSystem: @unchecked Sendable {
    public let path: String
    private let filler: String

    /// Whether this process may mount one (it runs as root, and `mount` works here).
    public static let isAvailable: Bool = {
        guard getuid() == 0 else { return false }
        guard let probe = try? SmallFileSystem(bytes: 1 << 20) else { return false }
        _ = probe
        return true
    }()

    public struct Failed: Error, CustomStringConvertible { public let description: String }

    /// Mounts a tmpfs of `bytes` on a new temporary directory.
    public init(bytes: Int) throws {
        path = FileManager.default.temporaryDirectory.appendingPathComponent("stash-fs-\(UUID().uuidString)").path
        filler = (path as NSString).appendingPathComponent("filler")
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        let status = Self.run("/bin/mount", ["-t", "tmpfs", "-o", "size=\(bytes)", "tmpfs", path])
        guard status == 0 else {
            try? FileManager.default.removeItem(atPath: path)
            throw Failed(description: "mount -t tmpfs on \(path) failed (status \(status))")
        }
    }

    /// Writes a file until the file system has no byte left. Returns its size.
    @discardableResult
    public func fill() -> Int {
        let fd = open(filler, O_WRONLY | O_CREAT | O_APPEND, 0o644)
        guard fd >= 0 else { return 0 }
        defer { close(fd) }
        let chunk = [UInt8](repeating: 0xAB, count: 4096)
        var total = 0
        while true {
            let written = chunk.withUnsafeBytes { write(fd, $0.baseAddress, $0.count) }
            if written <= 0 { break }
            total += written
        }
        // The last partial block, byte by byte.
        while (chunk.withUnsafeBytes { write(fd, $0.baseAddress, 1) }) == 1 { total += 1 }
        return total
    }

    /// Removes what ``fill()`` wrote.
    public func free() { unlink(filler) }

    /// Gives back `bytes` of what ``fill()`` wrote (fewer than a write then needs: the write is
    /// cut short, where a full file system refuses it at once).
    public func free(bytes: Int) {
        var status = stat()
        guard stat(filler, &status) == 0 else { return }
        _ = truncate(filler, max(0, status.st_size - off_t(bytes)))
    }

    /// Bytes still free.
    public var available: Int {
        var info = statvfs()
        guard statvfs(path, &info) == 0 else { return 0 }
        return Int(info.f_bavail) * Int(info.f_frsize)
    }

    deinit {
        _ = Self.run("/bin/umount", ["-l", path])
        try? FileManager.default.removeItem(atPath: path)
    }

    private static func run(_ tool: String, _ arguments: [String]) -> Int32 {
        let process = Process()
        process.executableURL = URL(fileURLWithPath: tool)
        process.arguments = arguments
        process.standardOutput = FileHandle.nullDevice
        process.standardError = FileHandle.nullDevice
        do { try process.run() } catch { return -1 }
        process.waitUntilExit()
        return process.terminationStatus
    }
}
