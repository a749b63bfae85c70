import Foundation

/// An error from gating: a rejected snapshot, a denied action, a refused credit spend.
///
/// ```swift
/// do { try gate.apply(signedSnapshot) }
/// catch let error as GateError where error.code == .replayedSnapshot { … }   // keep the cached one
/// ```
/// `Code` is an extensible struct: new codes never break a `switch` with a `default`.
/// Evaluations (``FeatureGate/entitlement()``, ``FeatureGate/check(_:)``) never throw; these
/// errors come from operations that change something.
public struct GateError: Error, CustomStringConvertible, Sendable {
    public struct Code: Hashable, Sendable, CustomStringConvertible {
        private let name: String
        private init(_ name: String) { self.name = name }
        public var description: String { name }

        /// The signature does not match the payload (a changed byte, or the wrong key).
        public static let badSignature = Code("badSignature")
        /// The snapshot names a key id the verifier does not know.
        public static let unknownKey = Code("unknownKey")
        /// The envelope or payload is not a snapshot (bad JSON, missing members).
        public static let malformedSnapshot = Code("malformedSnapshot")
        /// The snapshot's sequence number is lower than the cached one (or equal with
        /// different contents): an old snapshot replayed.
        public static let replayedSnapshot = Code("replayedSnapshot")
        /// The gate's state in the store was removed or changed outside the gate (an edit with
        /// a database tool, a value from another store): the snapshot cached then is not
        /// trusted, and premium waits for a newer one.
        public static let untrustedState = Code("untrustedState")
        /// The snapshot belongs to another user.
        public static let wrongUser = Code("wrongUser")
        /// ``FeatureGate/authorize(_:in:)`` refused the action; ``GateError/decision`` says why.
        public static let denied = Code("denied")
        /// A credit spend with no credits left.
        public static let insufficientCredits = Code("insufficientCredits")
        /// A creation names a parent that does not exist, for a per-parent limit that knows
        /// its parent type (``LimitRule/maxRecords(_:_:per:of:)``).
        public static let parentNotFound = Code("parentNotFound")
        /// The gate's configuration cannot work with this store (missing index, unknown type).
        public static let invalidConfiguration = Code("invalidConfiguration")
        /// The store failed; ``GateError/underlying`` holds the cause.
        public static let storage = Code("storage")
    }

    /// What went wrong, to switch on.
    public let code: Code
    /// The full explanation, for logs and users (also the ``description``).
    public let message: String
    /// For `.denied`: the decision with its reason.
    public let decision: GateDecision?
    /// The error behind it, when there is one (for `.storage`, the store's error).
    public let underlying: (any Error & Sendable)?

    /// An error of `code`, with the decision of a denial.
    public init(_ code: Code, _ message: String, decision: GateDecision? = nil, underlying: (any Error & Sendable)? = nil) {
        self.code = code
        self.message = message
        self.decision = decision
        self.underlying = underlying
    }

    public var description: String { message }
}
