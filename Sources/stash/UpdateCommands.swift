import ArgumentParser
import Foundation
import Stash

struct Update: ParsableCommand {
    static let configuration = CommandConfiguration(
        abstract: "Change the named fields of one record; prints the record.",
        discussion: """
        The JSON object names the fields to change, with their new values (null clears an optional field); \
        every other field keeps its value, and, for sync, its version: a change made meanwhile to another \
        field on another device survives. A counter field is changed with `stash counter`, which counts the \
        change for this store's site.
        """)

    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The record type.") var type: String
    @Argument(help: "The record id.") var id: String
    @Argument(help: "The fields to change, as a JSON object: '{\"name\": \"Lamp\"}'.") var json: String

    func run() throws {
        try runCommand {
            let store = try openExisting(directory)
            let schema = try requireType(store, type)
            let recordID = try parseID(id)
            guard case .object(let members) = try JSONValue.parse(json), !members.isEmpty else {
                throw CommandFailure(message: "the changes must be a JSON object naming at least one field, like {\"name\": \"Lamp\"}")
            }
            var changes: [String: FieldValue] = [:]
            for (name, value) in members {
                guard name != "id" else {
                    throw CommandFailure(message: "a record's id cannot change; put a record with the new id and delete this one")
                }
                guard let field = schema.field(named: name) else {
                    let known = schema.fields.map(\.name).sorted().joined(separator: ", ")
                    throw StoreError(.unknownField, "\(type) has no field '\(name)' (fields: \(known))")
                }
                if field.counter == true {
                    throw CommandFailure(message: "\(type).\(name) is a counter: change it with `stash counter \(directory) \(type) \(id) \(name) +N` (or -N), which counts the change for this store's site")
                }
                changes[name] = try FieldValue.fromJSON(value, kind: field.kind, field: name)
            }
            let updated = try store.write(author: "cli") { tx -> GenericRecord in
                guard var record = try tx.get(typeNamed: type, id: recordID) else {
                    throw StoreError(.notFound, "store \(store.path): no \(type) with id \(id) to update")
                }
                for (name, value) in changes { record.fields[name] = value }
                try tx.put(record, replacing: true)
                return record
            }
            var object = updated.fieldsJSON(as: try requireType(store, type))
            object["id"] = .string(updated.id.description)
            printLine(JSONValue.object(object).text)
        }
    }
}

struct CounterChange: ParsableCommand {
    static let configuration = CommandConfiguration(
        commandName: "counter",
        abstract: "Add to (+N) or subtract from (-N) a counter field of one record; prints its new value.",
        discussion: """
        The change is counted for this store's site, as an app's `counter.add(n, site: tx.siteID)` is: \
        sync merges it with the changes made on every other device, none lost and none counted twice.
        """)

    @Argument(help: "The store directory.") var directory: String
    @Argument(help: "The record type.") var type: String
    @Argument(help: "The record id.") var id: String
    @Argument(help: "The counter field.") var field: String
    @Argument(parsing: .allUnrecognized, help: "The change: +N or -N (a whole number).") var amount: [String] = []

    func run() throws {
        try runCommand {
            guard amount.count == 1, let change = Int64(amount[0]) else {
                throw CommandFailure(message: "give the change as one whole number, +N or -N (such as +3 or -1), not '\(amount.joined(separator: " "))'")
            }
            let store = try openExisting(directory)
            _ = try requireType(store, type)
            let recordID = try parseID(id)
            let value = try store.write(author: "cli") { tx in try tx.addToCounter(typeNamed: type, id: recordID, field: field, change) }
            printLine("\(value)")
        }
    }
}
