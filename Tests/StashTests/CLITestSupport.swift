import Foundation
import Testing
import StashTestSupport

/// The `stash` tool with a schema for the command-line tests.
enum StashCLI {
    typealias Result = StashExecutable.Result

    @discardableResult
    static func run(_ arguments: String..., stdin: String? = nil) throws -> Result {
        try StashExecutable.run(arguments, stdin: stdin)
    }

    @discardableResult
    static func run(_ arguments: [String], stdin: String? = nil) throws -> Result {
        try StashExecutable.run(arguments, stdin: stdin)
    }

    static func start(_ arguments: [String], stdin: String? = nil) throws -> (Process, Pipe, Pipe) {
        try StashExecutable.start(arguments, stdin: stdin)
    }

    static let schema = """
    {"types": [
      {"name": "Home", "fields": [{"name": "name", "kind": "string"}]},
      {"name": "Item", "fields": [{"name": "homeID", "kind": "uuid"}, {"name": "name", "kind": "string"},
                                  {"name": "wearCount", "kind": "int"}, {"name": "note", "kind": "string", "optional": true}],
       "indexes": [{"fields": ["homeID"]}, {"fields": ["name"], "unique": true}]},
      {"name": "Secret", "localOnly": true, "fields": [{"name": "value", "kind": "string"}]}
    ]}
    """

    /// `stash init` on a new store directory with `schema` (default ``schema``).
    static func makeStore(in dir: TemporaryDirectory, name: String = "store", schema: String = schema) throws -> String {
        let schemaPath = dir.sub("schema-\(name).json")
        try schema.write(toFile: schemaPath, atomically: true, encoding: .utf8)
        let store = dir.sub(name)
        let result = try run("init", store, "--schema", schemaPath)
        #expect(result.status == 0, "init failed: \(result.stderr)")
        return store
    }
}
