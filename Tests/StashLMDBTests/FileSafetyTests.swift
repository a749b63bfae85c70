import Foundation
import StashLMDB
import Testing
import StashTestSupport

/// What StashLMDB checks before LMDB maps a file (a data file cut short, a damaged meta page,
/// a lock file on a full file system), full file systems reported as such, and the checksum
/// the store layer keeps in its values.
@Suite struct FileSafetyTests {
    @Test func crc32cGivesTheStandardValues() {
        #expect(Checksum.crc32c(Array("123456789".utf8)) == 0xE306_9283)
        #expect(Checksum.crc32c([UInt8]()) == 0)
        #expect(Checksum.crc32c([UInt8](repeating: 0, count: 32)) == 0x8A91_36AA)
        #expect(Checksum.crc32c([UInt8](repeating: 0xFF, count: 32)) == 0x62A8_AB43)
        // From an offset, and from a slice, over every length around the 8-byte steps.
        let bytes = (0..<300).map { UInt8(truncatingIfNeeded: $0 &* 31 &+ 7) }
        for start in [0, 1, 7, 8, 9, 150, 299, 300] {
            #expect(Checksum.crc32c(bytes, from: start) == Checksum.crc32c(bytes[start...]))
            #expect(Checksum.crc32c(bytes, from: start) == Checksum.crc32c(Array(bytes[start...])))
        }
        #if arch(x86_64)
        #expect(Checksum.usesHardware)
        #endif
    }

    /// Writes a few hundred values into a new environment in `path` and closes it.
    static func makeEnvironment(_ path: String) throws {
        let env = try openEnvironment(path)
        let main = try env.database("main")
        try env.write { txn in
            for n in 0..<400 { try txn.put(main, key: id16(UInt64(n)), value: [UInt8](repeating: UInt8(n & 0xFF), count: 200)) }
        }
    }

    /// A data file cut short (a copy that stopped, a disk that filled) made the first read past
    /// its end a SIGBUS: the open refuses it, saying so.
    @Test func aDataFileCutShortIsRefusedBeforeItIsMapped() throws {
        let dir = TemporaryDirectory()
        try Self.makeEnvironment(dir.path)
        let file = dir.sub("data.mdb")
        let size = try #require(try FileManager.default.attributesOfItem(atPath: file)[.size] as? Int)
        #expect(truncate(file, off_t(size / 2)) == 0)
        let error = thrownError { _ = try openEnvironment(dir.path) } as? LMDBError
        #expect(error?.code == .damaged, "\(String(describing: error))")
        #expect(error?.detail?.contains("cut short") == true && error?.detail?.contains("data.mdb (\(size / 2) bytes)") == true, "\(String(describing: error))")
        // Cut inside the meta pages.
        #expect(truncate(file, 6_000) == 0)
        #expect((thrownError { _ = try openEnvironment(dir.path) } as? LMDBError)?.code == .damaged)
    }

    /// A meta page whose page size or roots were damaged would have LMDB map or read wherever
    /// they point.
    @Test func aDamagedMetaPageIsRefused() throws {
        let dir = TemporaryDirectory()
        try Self.makeEnvironment(dir.path)
        let pristine = try DataFile(store: dir.path)
        var file = pristine
        file.setU16(0x1003, at: 40)   // the page size (md_pad of the free database)
        try file.write()
        #expect((thrownError { _ = try openEnvironment(dir.path) } as? LMDBError)?.detail?.contains("page size of 4099") == true)
        // The main database's root past the last page, in both meta pages.
        file = pristine
        for meta in [0, pristine.pageSize] { for i in 0..<8 { file.bytes[meta + 128 + i] = 0x7F } }
        try file.write()
        let error = thrownError { _ = try openEnvironment(dir.path) } as? LMDBError
        #expect(error?.code == .damaged && error?.detail?.contains("root of LMDB's main database") == true, "\(String(describing: error))")
        try pristine.write()
        let env = try openEnvironment(dir.path)
        #expect(try env.read { txn in try txn.statistics(try env.database("main")).entries } == 400)
    }

    /// A node whose data size was damaged (2 GiB where 200 bytes are): LMDB hands the size out
    /// as it is, and copying it read past the file and the map (SIGSEGV). The value is checked
    /// to lie in the file first: `damaged`, naming the database, for a get and for a scan.
    @Test func aValueRunningPastTheFileIsRefusedBeforeItIsCopied() throws {
        let dir = TemporaryDirectory()
        try Self.makeEnvironment(dir.path)
        var file = try DataFile(store: dir.path)
        let victim = id16(123)
        let node = try #require((2..<file.pageCount).lazy.flatMap { file.nodes(ofPage: $0) }.first { $0.key == victim && $0.dataSize == 200 })
        file.setU16(0xFFFF, at: node.offset)       // mn_lo
        file.setU16(0x7FFF, at: node.offset + 2)   // mn_hi
        try file.write()
        let env = try openEnvironment(dir.path)
        let main = try env.database("main")
        let error = thrownError { _ = try env.read { txn in try txn.get(main, key: victim) } } as? LMDBError
        #expect(error?.code == .damaged && error?.operation == "read main" && error?.detail?.contains("2147483647 bytes") == true, "\(String(describing: error))")
        let scanned = thrownError { try env.read { txn in try txn.scan(main, from: ScanStart<[UInt8]>.first) { _, _ in true } } } as? LMDBError
        #expect(scanned?.code == .damaged, "\(String(describing: scanned))")
        #expect(try env.read { txn in try txn.get(main, key: id16(122)) }?.count == 200, "the other values read")
    }

    /// On a full file system, making an environment died of SIGBUS inside liblmdb (the lock
    /// file it maps had no blocks) and left `lock.mdb` behind. Now: `noSpace` naming the path,
    /// nothing left; and a commit that does not fit is `noSpace`, not "Input/output error",
    /// and commits once space is freed.
    @Test(.enabled(if: SmallFileSystem.isAvailable, "needs root to mount a small tmpfs"))
    func aFullFileSystemIsReportedAndNothingIsLeftBehind() throws {
        let fs = try SmallFileSystem(bytes: 4 << 20)
        let existing = (fs.path as NSString).appendingPathComponent("existing")
        try Self.makeEnvironment(existing)
        fs.fill()
        let fresh = (fs.path as NSString).appendingPathComponent("fresh")
        let error = thrownError { _ = try openEnvironment(fresh) } as? LMDBError
        #expect(error?.code == .noSpace, "\(String(describing: error))")
        #expect(error.map { "\($0)" }?.contains("no space left on device") == true && error?.path.hasSuffix("fresh") == true, "\(String(describing: error))")
        #expect(!FileManager.default.fileExists(atPath: fresh), "the directory it made is gone: \((try? FileManager.default.contentsOfDirectory(atPath: fresh)) ?? [])")
        // A write to the existing environment that needs new pages.
        let env = try openEnvironment(existing)
        let main = try env.database("main")
        let big = [UInt8](repeating: 7, count: 1 << 20)
        let refused = thrownError { try env.write { txn in try txn.put(main, key: b("big"), value: big) } } as? LMDBError
        #expect(refused?.code == .noSpace, "\(String(describing: refused))")
        #expect(try env.read { txn in try txn.get(main, key: b("big")) } == nil)
        // Some room, less than the write needs: LMDB's write is cut short, which it reports as
        // EIO ("Input/output error"); with the file system full, that is no space too.
        fs.free(bytes: 256 << 10)
        let cut = thrownError { try env.write { txn in try txn.put(main, key: b("big"), value: big) } } as? LMDBError
        #expect(cut?.code == .noSpace, "\(String(describing: cut))")
        #expect(try env.read { txn in try txn.get(main, key: b("big")) } == nil)
        fs.free()
        try env.write { txn in try txn.put(main, key: b("big"), value: big) }
        #expect(try env.read { txn in try txn.get(main, key: b("big")) } == big)
        #expect(try env.read { txn in try txn.get(main, key: id16(399)) }?.count == 200)
        let made = try openEnvironment(fresh)
        #expect(try made.read { txn in try txn.get(try made.database("main"), key: b("x")) } == nil)
    }
}
