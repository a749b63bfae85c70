/// The error `body` throws, or nil.
public func thrownError(_ body: () throws -> Void) -> (any Error)? {
    do {
        try body()
        return nil
    } catch {
        return error
    }
}

/// The error `body` throws, or nil (for a body that awaits).
public func thrownError(_ body: () async throws -> Void) async -> (any Error)? {
    do {
        try await body()
        return nil
    } catch {
        return error
    }
}
