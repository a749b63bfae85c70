import Foundation
import Stash
import Testing
import StashTestSupport

/// A type with a plain index declared before its unique one, so that a unique violation is
/// found after the plain index has already been visited.
struct Account: Record, Equatable {
    var id = RecordID()
    var team: String
    var handle: String
    static let indexes: [RecordIndex<Account>] = [.index(\.team), .unique(\.handle)]
}

/// A unique value that may be missing.
struct Member: Record, Equatable {
    var id = RecordID()
    var name: String
    var email: String?
    static let indexes: [RecordIndex<Member>] = [.unique(\.email)]
}

/// A unique field added later with a default: records stored before it lack the value.
struct Page: Record, Equatable {
    var id = RecordID()
    var title: String
    var slug: String
    static let fieldDefaults: [String: FieldValue] = ["slug": .string("")]
    static let indexes: [RecordIndex<Page>] = [.unique(\.slug)]
}

/// `Account` in the version of the app before its handle became unique.
private struct AccountBeforeUniqueHandles: Record, Equatable {
    static let recordType = "Account"
    var id = RecordID()
    var team: String
    var handle: String
    static let indexes: [RecordIndex<AccountBeforeUniqueHandles>] = [.index(\.team), .index(\.handle)]
}

@Suite struct UniqueIndexTests {
    /// An index that becomes unique was dropped and built under a new tag: a process still
    /// holding the older schema (here a second `Store` of the same directory) then counted
    /// and queried its old, empty tag and found nothing. It is rebuilt under its own tag now.
    @Test func anIndexBecomingUniqueKeepsAnsweringForOlderSchemas() throws {
        let dir = TemporaryDirectory()
        let older = try Store.open(at: dir.path, types: [AccountBeforeUniqueHandles.self])
        try older.write { tx in for n in 0..<10 { try tx.insert(AccountBeforeUniqueHandles(team: "t", handle: "h\(n)")) } }
        let byHandle = try older.index(\AccountBeforeUniqueHandles.handle)
        let newer = try Store.open(at: dir.path, types: [Account.self])
        #expect(newer.schema.type(named: "Account")?.index(named: "handle")?.unique == true)
        #expect(try older.count(byHandle, equals: "h3") == 1)
        #expect(try older.count(AccountBeforeUniqueHandles.self, where: \.handle, equals: "h3") == 1)
        #expect(try older.fetch(FetchDescriptor<AccountBeforeUniqueHandles>(predicate: #Predicate { $0.handle == "h4" })).count == 1)
        #expect { try older.insert(AccountBeforeUniqueHandles(team: "t", handle: "h5")) } throws: { ($0 as? StoreError)?.code == .uniqueViolation }
        #expect(try newer.verify().isClean)
    }

    /// An older version of the app (or an extension not updated yet) declaring the index
    /// plain rebuilt it plain: the newer version's inserts of duplicates then succeeded, and at
    /// its next launch the unique rebuild failed, so it could not open its store. A unique
    /// index now stays unique unless the opener asks to relax it.
    @Test func anOlderOpenerDoesNotRelaxAUniqueIndex() throws {
        let dir = TemporaryDirectory()
        do {
            let newer = try Store.open(at: dir.path, types: [Account.self])
            try newer.insert(Account(team: "t", handle: "ann"))
        }
        let older = try Store.open(at: dir.path, types: [AccountBeforeUniqueHandles.self])
        #expect(older.schema.type(named: "Account")?.index(named: "handle")?.unique == true)
        let violation = thrownError { try older.insert(AccountBeforeUniqueHandles(team: "u", handle: "ann")) } as? StoreError
        #expect(violation?.code == .uniqueViolation && violation?.message.contains("relaxesUniqueIndexes") == true, "\(String(describing: violation))")
        #expect(try Store.open(at: dir.path, types: [Account.self]).count(Account.self) == 1)
        var relaxing = StoreOptions()
        relaxing.relaxesUniqueIndexes = true
        let relaxed = try Store.open(at: dir.path, types: [AccountBeforeUniqueHandles.self], options: relaxing)
        #expect(relaxed.schema.type(named: "Account")?.index(named: "handle")?.unique == false)
        try relaxed.insert(AccountBeforeUniqueHandles(team: "u", handle: "ann"))
        #expect(try relaxed.count(AccountBeforeUniqueHandles.self, where: \.handle, equals: "ann") == 2)
        #expect(try relaxed.verify().isClean)
    }

    /// Duplicates found while a unique index is built at open were reported as for an insert:
    /// one record named, "update that record instead" (impossible while the store will not
    /// open). The error names both records and the ways out, and the open changes nothing.
    @Test func duplicatesFoundBuildingAUniqueIndexAtOpenNameBothRecords() throws {
        let dir = TemporaryDirectory()
        let first = AccountBeforeUniqueHandles(team: "t", handle: "bob")
        let second = AccountBeforeUniqueHandles(team: "u", handle: "bob")
        do {
            let older = try Store.open(at: dir.path, types: [AccountBeforeUniqueHandles.self])
            try older.write { tx in try tx.insert(first); try tx.insert(second) }
        }
        let error = thrownError { _ = try Store.open(at: dir.path, types: [Account.self]) } as? StoreError
        #expect(error?.code == .uniqueViolation)
        let message = error?.message ?? ""
        for words in ["unique index Account(handle) at open", "\(first.id)", "\(second.id)", "handle = \"bob\"", "Migration (version 1)", ".index instead of .unique"] {
            #expect(message.contains(words), "\(words) missing from: \(message)")
        }
        let older = try Store.open(at: dir.path, types: [AccountBeforeUniqueHandles.self])
        #expect(older.schema.type(named: "Account")?.index(named: "handle")?.unique == false)
        #expect(try older.count(AccountBeforeUniqueHandles.self) == 2)
    }

    /// Records stored before a unique field existed read as its default: like records that
    /// hold the default, they have no value of their own and clash with none, so the index
    /// builds, and a typed update (which stores the default) changes nothing; records with
    /// other values still clash.
    @Test func recordsStoredBeforeAUniqueFieldWithADefaultNeverClash() throws {
        let dir = TemporaryDirectory()
        do {
            let store = try Store.open(at: dir.path, declaration: SchemaDeclaration(types: [
                TypeDeclaration(name: "Page", fields: [FieldDeclaration(name: "title", kind: .string)])]))
            for title in ["a", "b"] {
                try store.write { try $0.put(GenericRecord(type: "Page", id: RecordID(), fields: ["title": .string(title)])) }
            }
        }
        let store = try Store.open(at: dir.path, types: [Page.self])
        let legacy = try store.fetch(FetchDescriptor<Page>())
        #expect(legacy.map(\.slug) == ["", ""])
        for page in legacy { try store.update(Page.self, id: page.id) { $0.title += " (edited)" } }
        try store.insert(Page(title: "c", slug: ""))
        try store.insert(Page(title: "d", slug: "d"))
        #expect((thrownError { try store.insert(Page(title: "e", slug: "d")) } as? StoreError)?.code == .uniqueViolation)
        #expect(try store.count(Page.self) == 4)
        #expect(try store.verify().isClean)
    }

    /// Like SQL's NULL, a missing value is no value: any number of records may lack it, while
    /// equal values still clash, and `verify` agrees.
    @Test func recordsWithoutTheValueNeverClash() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Member.self])
        try store.insert(Member(name: "a", email: nil))
        try store.insert(Member(name: "b", email: nil))
        let c = Member(name: "c", email: "c@example.com")
        try store.insert(c)
        #expect((thrownError { try store.insert(Member(name: "d", email: "c@example.com")) } as? StoreError)?.code == .uniqueViolation)
        try store.update(Member.self, id: c.id) { $0.email = nil }
        try store.insert(Member(name: "d", email: "c@example.com"))
        #expect(try store.count(Member.self) == 4)
        #expect(try store.verify().isClean)
    }

    /// A unique index added to a type whose records lack the value builds without a clash.
    @Test func aUniqueIndexOnAFieldRecordsLackBuilds() throws {
        let dir = TemporaryDirectory()
        let declaration = SchemaDeclaration(types: [TypeDeclaration(name: "Member", fields: [
            FieldDeclaration(name: "name", kind: .string), FieldDeclaration(name: "email", kind: .string, optional: true)])])
        do {
            let store = try Store.open(at: dir.path, declaration: declaration)
            for name in ["a", "b"] {
                try store.write { try $0.put(GenericRecord(type: "Member", id: RecordID(), fields: ["name": .string(name)])) }
            }
        }
        let store = try Store.open(at: dir.path, types: [Member.self])
        #expect(try store.count(Member.self) == 2)
        #expect(try store.verify().isClean)
    }

    @Test func duplicateInsertNamesTypeFieldAndValue() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [UserProfile.self])
        let ada = UserProfile(email: "ada@example.com", displayName: "Ada")
        try store.insert(ada)
        let copycat = UserProfile(email: "ada@example.com", displayName: "Not Ada")
        let error = thrownError { try store.insert(copycat) } as? StoreError
        #expect(error?.code == .uniqueViolation)
        let message = error?.message ?? ""
        #expect(message.contains("UserProfile"), "\(message)")
        #expect(message.contains("email"), "\(message)")
        #expect(message.contains("ada@example.com"), "\(message)")
        #expect(try store.count(UserProfile.self) == 1)
        #expect(try store.get(UserProfile.self, id: copycat.id) == nil)
        // Upsert of a different record with the same value is refused as well.
        #expect((thrownError { try store.upsert(copycat) } as? StoreError)?.code == .uniqueViolation)
        #expect(try store.count(UserProfile.self, where: \.email, equals: "ada@example.com") == 1)
        #expect(try store.verify().isClean)
    }

    @Test func updatingTheSameRecordKeepsIt() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [UserProfile.self])
        var ada = UserProfile(email: "ada@example.com", displayName: "Ada")
        let bob = UserProfile(email: "bob@example.com", displayName: "Bob")
        try store.insert(ada)
        try store.insert(bob)
        ada.displayName = "Ada L."
        try store.update(ada)                     // same email, same record: fine
        try store.upsert(ada)
        #expect(try store.get(UserProfile.self, id: ada.id) == ada)
        // Moving the email to a free value frees the old one.
        ada.email = "ada@lovelace.org"
        try store.update(ada)
        try store.insert(UserProfile(email: "ada@example.com", displayName: "New Ada"))
        // Taking another record's value is refused and leaves both records as they were.
        var thief = bob
        thief.email = "ada@lovelace.org"
        let error = thrownError { try store.update(thief) } as? StoreError
        #expect(error?.code == .uniqueViolation)
        #expect(try store.get(UserProfile.self, id: bob.id) == bob)
        #expect(try store.get(UserProfile.self, id: ada.id) == ada)
        #expect(try store.count(UserProfile.self) == 3)
        #expect(try store.verify().isClean)
    }

    @Test func uniquenessWithinOneTransaction() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [UserProfile.self])
        // Two inserts of one value in a single transaction: the second sees the first.
        let error = thrownError {
            try store.write { tx in
                try tx.insert(UserProfile(email: "x@example.com", displayName: "1"))
                try tx.insert(UserProfile(email: "x@example.com", displayName: "2"))
            }
        } as? StoreError
        #expect(error?.code == .uniqueViolation)
        #expect(try store.count(UserProfile.self) == 0, "the whole transaction was aborted")
        // Delete then re-insert of the value in one transaction is fine.
        let first = UserProfile(email: "y@example.com", displayName: "1")
        try store.insert(first)
        let second = UserProfile(email: "y@example.com", displayName: "2")
        try store.write { tx in
            try tx.delete(UserProfile.self, id: first.id)
            try tx.insert(second)
        }
        #expect(try store.fetch(FetchDescriptor<UserProfile>()) == [second])
        #expect(try store.verify().isClean)
    }

    @Test func longValuesSharingAPrefixAreDistinguished() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [UserProfile.self])
        // Index keys keep 120 UTF-8 bytes of a string; these differ only after that.
        let prefix = String(repeating: "p", count: 119)
        let emails = [prefix + "é-one@example.com",      // "é" straddles the 120-byte cut
                      prefix + "é-two@example.com",
                      prefix + "x" + String(repeating: "q", count: 50) + "@a",
                      prefix + "x" + String(repeating: "q", count: 50) + "@b",
                      prefix + "x"]                        // exactly 120 bytes: not shortened
        var profiles: [UserProfile] = []
        for (n, email) in emails.enumerated() {
            let profile = UserProfile(email: email, displayName: "user \(n)")
            try store.insert(profile)
            profiles.append(profile)
        }
        #expect(try store.count(UserProfile.self) == emails.count)
        let handle = try store.index(\UserProfile.email)
        for (n, email) in emails.enumerated() {
            #expect(try store.count(UserProfile.self, where: \.email, equals: email) == 1, "\(n)")
            #expect(try store.count(handle, equals: email) == 1, "\(n)")
            let found = try store.fetch(FetchDescriptor<UserProfile>(predicate: #Predicate { $0.email == email }))
            #expect(found == [profiles[n]], "\(n)")
            // A real duplicate of a long value is still refused, naming the value.
            let error = thrownError { try store.insert(UserProfile(email: email, displayName: "dup")) } as? StoreError
            #expect(error?.code == .uniqueViolation, "\(n)")
            #expect(error?.message.contains(email) == true, "\(n): \(String(describing: error))")
        }
        #expect(try store.count(UserProfile.self, where: \.email, equals: prefix + "é-three@example.com") == 0)
        // Updating a long-valued record in place keeps it.
        var renamed = profiles[0]
        renamed.displayName = "renamed"
        try store.update(renamed)
        #expect(try store.get(UserProfile.self, id: renamed.id) == renamed)
        #expect(try store.count(UserProfile.self) == emails.count)
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
    }

    /// A failed write inside a transaction that the caller catches must not leave half of
    /// its index changes behind when the transaction then commits.
    @Test func caughtUniqueViolationLeavesNoPartialIndexEntries() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.path, types: [Account.self])
        let ann = Account(team: "red", handle: "ann")
        var bea = Account(team: "blue", handle: "bea")
        try store.insert(ann)
        try store.insert(bea)
        var caught = 0
        try store.write { tx in
            // An import that skips duplicates: insert a clash, catch, go on.
            do { try tx.insert(Account(team: "green", handle: "ann")) } catch let error as StoreError where error.code == .uniqueViolation { caught += 1 }
            // An update that would take another's handle and change the team too.
            var moved = bea
            moved.team = "red"
            moved.handle = "ann"
            do { try tx.update(moved) } catch let error as StoreError where error.code == .uniqueViolation { caught += 1 }
            try tx.insert(Account(team: "green", handle: "cid"))
        }
        #expect(caught == 2)
        #expect(try store.count(Account.self) == 3)
        #expect(try store.count(Account.self, where: \.team, equals: "green") == 1, "only cid is green")
        #expect(try store.count(Account.self, where: \.team, equals: "blue") == 1, "bea is still blue")
        #expect(try store.count(Account.self, where: \.team, equals: "red") == 1, "only ann is red")
        #expect(try store.get(Account.self, id: bea.id) == bea)
        let report = try store.verify()
        #expect(report.isClean, "\(report)")
        // And bea can still move for real.
        bea.team = "red"
        try store.update(bea)
        #expect(try store.count(Account.self, where: \.team, equals: "red") == 2)
        #expect(try store.verify().isClean)
    }
}
