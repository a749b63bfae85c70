import Foundation
@testable import Stash
import StashLMDB
import Testing
import StashTestSupport

/// Opens that fail, or that must not create: what they leave behind (found by a new user of
/// the command line: a failed `stash init` left a directory every later command called "not
/// a Stash store", and `stash stat` / `stash put` wrote into an empty data.mdb).
@Suite struct UnfinishedStoreTests {
    private func declaration(_ fields: [FieldDeclaration], indexes: [IndexDeclaration] = []) -> SchemaDeclaration {
        SchemaDeclaration(types: [TypeDeclaration(name: "X", fields: fields, indexes: indexes)])
    }

    /// A declaration naming a field twice was merged field by field, the second taken for a
    /// change of the first ("X.a is stored as string but declared int"), after the open had
    /// created the store's files: the directory was left without a store in it. Such a
    /// declaration, and one with an index of no fields or a type twice, is refused first.
    @Test(arguments: [0, 1, 2])
    func aMalformedDeclarationIsRefusedBeforeAnyFileIsMade(variant: Int) throws {
        let dir = TemporaryDirectory()
        let path = dir.sub("store")
        let bad: SchemaDeclaration
        let named: String
        switch variant {
        case 0:
            bad = declaration([FieldDeclaration(name: "a", kind: .string), FieldDeclaration(name: "a", kind: .int)])
            named = "field 'a' twice"
        case 1:
            bad = declaration([FieldDeclaration(name: "a", kind: .string)], indexes: [IndexDeclaration(fields: [])])
            named = "lists no fields"
        default:
            bad = SchemaDeclaration(types: [TypeDeclaration(name: "X"), TypeDeclaration(name: "X")])
            named = "type X is declared twice"
        }
        let error = thrownError { _ = try Store.open(at: path, declaration: bad) } as? StoreError
        #expect(error?.code == .incompatibleSchema)
        #expect(error?.message.contains(named) == true, "\(String(describing: error))")
        #expect(!FileManager.default.fileExists(atPath: path), "nothing was created")
        // The directory can then hold the store meant.
        let store = try Store.open(at: path, declaration: declaration([FieldDeclaration(name: "a", kind: .string)]))
        #expect(store.schema.type(named: "X")?.fields.map(\.name) == ["a"])
    }

    /// The same Record type listed twice declares it once (it is one type).
    @Test func theSameRecordTypeTwiceIsDeclaredOnce() throws {
        let dir = TemporaryDirectory()
        let store = try Store.open(at: dir.sub("store"), types: [Home.self, Home.self])
        try store.insert(Home(name: "h"))
        #expect(try store.count(Home.self) == 1)
    }

    /// An empty data.mdb (a touched file, a copy cut short) is no store: an open that must
    /// not create one wrote LMDB's first pages and Stash's databases into it, read-only opens
    /// too, and a writing one then made a store of it. It is refused, the file left as it was.
    @Test(arguments: [false, true])
    func anEmptyDataFileIsNoStoreAndStaysUntouched(readOnly: Bool) throws {
        let dir = TemporaryDirectory()
        let path = dir.sub("store")
        try FileManager.default.createDirectory(atPath: path, withIntermediateDirectories: true)
        #expect(FileManager.default.createFile(atPath: path + "/data.mdb", contents: Data()))
        var options = StoreOptions()
        options.createIfMissing = false
        options.readOnly = readOnly
        let error = thrownError { _ = try Store.open(at: path, declaration: SchemaDeclaration(types: []), options: options) } as? StoreError
        #expect(error?.code == .notAStore)
        #expect(error?.message.contains("data.mdb is empty") == true, "\(String(describing: error))")
        #expect(try FileManager.default.attributesOfItem(atPath: path + "/data.mdb")[.size] as? Int == 0)
        #expect(!FileManager.default.fileExists(atPath: path + "/lock.mdb"))
        // An open that may create stores makes one there.
        let store = try Store.open(at: path, types: [Home.self])
        try store.insert(Home(name: "h"))
        #expect(try store.count(Home.self) == 1)
    }

    /// A store whose first open stopped after making its databases (a crash there, or an
    /// error the open found later) has no identity yet. Opens that read only, or must not
    /// create, say so and what to do (they said "not a Stash store", or made it a store); an
    /// open that may create finishes it.
    @Test func aStoreWhoseCreationDidNotFinishIsFinishedOnlyByAnOpenThatMayCreate() throws {
        let dir = TemporaryDirectory()
        let path = dir.sub("store")
        do {
            // The first transaction of a first open: Stash's databases, nothing else.
            let env = try Environment.open(path: path, configuration: EnvironmentConfiguration(databases: StoreDatabases.specs))
            _ = env
        }
        let before = try Data(contentsOf: URL(fileURLWithPath: path + "/data.mdb"))
        for readOnly in [true, false] {
            var options = StoreOptions()
            options.createIfMissing = false
            options.readOnly = readOnly
            let error = thrownError { _ = try Store.open(at: path, types: [Home.self], options: options) } as? StoreError
            #expect(error?.code == .notAStore)
            #expect(error?.message.contains("its creation did not finish") == true, "\(String(describing: error))")
            #expect(try Data(contentsOf: URL(fileURLWithPath: path + "/data.mdb")) == before, "the store was changed")
        }
        let store = try Store.open(at: path, types: [Home.self])
        try store.insert(Home(name: "h"))
        var options = StoreOptions()
        options.createIfMissing = false
        options.readOnly = true
        #expect(try Store.open(at: path, types: [Home.self], options: options).count(Home.self) == 1)
    }
}
