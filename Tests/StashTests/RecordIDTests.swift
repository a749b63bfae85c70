import Foundation
@testable import Stash
import Testing
import StashTestSupport

/// New ids: time-ordered, strictly increasing within the process, and with random bits that
/// come from buffered system entropy without ever repeating a word, nor reusing a buffer
/// across a fork.
@Suite struct RecordIDTests {
    @Test func newIDsIncreaseAndTheirRandomBitsNeverRepeat() {
        // A generator of its own: tests running in parallel that make ids through the shared
        // one may push its clock ahead (see below) by more than this test allows.
        let generator = RecordIDGenerator()
        let before = UInt64(Date().timeIntervalSince1970 * 1000)
        // 5,000 ids draw about ten blocks of entropy.
        let ids = (0..<5_000).map { _ in generator.next() }
        let after = UInt64(Date().timeIntervalSince1970 * 1000)
        for (a, b) in zip(ids, ids.dropFirst()) { #expect(a < b, "\(a) then \(b)") }
        for id in ids {
            #expect(id.high >> 12 & 0xF == 7, "version 7: \(id)")
            #expect(id.low >> 62 == 0b10, "variant: \(id)")
            // The counter may run ahead of the clock by a few milliseconds when ids are made
            // faster than 4,096 per millisecond.
            #expect(id.timestampMilliseconds >= before && id.timestampMilliseconds <= after + 8, "\(id)")
        }
        let randomBits = Set(ids.map { $0.low & ((1 << 62) - 1) })
        #expect(randomBits.count == ids.count, "\(ids.count - randomBits.count) repeated random parts")
    }

    @Test func aPoolDrawsBlocksAndDropsItsBufferAfterAFork() {
        var pool = EntropyPool()
        let first = pool.next()
        let perBlock = EntropyPool.blockSize / 8
        #expect(pool.buffered == perBlock - 1)
        var words: Set<UInt64> = [first]
        for _ in 0..<(perBlock + 10) { words.insert(pool.next()) }
        #expect(words.count == perBlock + 11, "a word repeated within or across blocks")
        #expect(pool.buffered == perBlock - 11)
        // What the child's fork handler does: the pool must not hand out its parent's words.
        EntropyPool.noteFork()
        _ = pool.next()
        #expect(pool.buffered == perBlock - 1)
    }

    /// A block that cannot be read (the device missing, or a regular file in its place) means
    /// a block's worth of words from the system generator, then another try: never a
    /// permanent switch to the slow path, never bits from a file.
    @Test func aPoolFallsBackForABlockThenReadsAgain() throws {
        let perBlock = EntropyPool.blockSize / 8
        #expect(EntropyPool.readBlock()?.count == perBlock)
        let dir = TemporaryDirectory()
        let fake = dir.path + "/urandom"
        #expect(FileManager.default.createFile(atPath: fake, contents: Data(count: EntropyPool.blockSize)))
        #expect(EntropyPool.readBlock(from: fake) == nil)

        var pool = EntropyPool()
        pool.install(nil)
        let fallingBack = pool.canDraw(2)
        #expect(fallingBack)
        var words: Set<UInt64> = []
        for _ in 0..<perBlock { words.insert(pool.take()) }
        #expect(words.count == perBlock, "the system generator repeated a word")
        #expect(pool.buffered == 0)
        let stillFallingBack = pool.canDraw(1)
        #expect(!stillFallingBack, "still falling back after a block's worth of words")
        _ = pool.next()
        #expect(pool.buffered == perBlock - 1)
    }
}
