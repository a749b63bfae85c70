import Foundation
@testable import Stash
import Testing

/// New ids: time-ordered, strictly increasing within the process, and with random bits that
/// come from buffered system entropy without ever repeating a word, nor reusing a buffer
/// across a fork.
@Suite struct RecordIDTests {
    @Test func newIDsIncreaseAndTheirRandomBitsNeverRepeat() {
        let before = UInt64(Date().timeIntervalSince1970 * 1000)
        // 5,000 ids draw about ten blocks of entropy.
        let ids = (0..<5_000).map { _ in RecordID() }
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
}
