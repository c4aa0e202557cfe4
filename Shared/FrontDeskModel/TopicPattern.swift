/// An AMQP topic binding pattern (`status.yemaya.#`, `status.*.*.replied`),
/// matched against routing keys the way RabbitMQ's topic exchange does.
public struct TopicPattern: Sendable, Equatable {
    public let words: [Substring]

    public init(_ pattern: String) {
        words = pattern.split(separator: ".", omittingEmptySubsequences: false)
    }

    public func matches(_ routingKey: String) -> Bool {
        Self.match(words[...], routingKey.split(separator: ".", omittingEmptySubsequences: false)[...])
    }

    private static func match(_ p: ArraySlice<Substring>, _ k: ArraySlice<Substring>) -> Bool {
        guard let first = p.first else { return k.isEmpty }
        if first == "#" {
            // `#` takes zero or more words.
            return (0...k.count).contains { match(p.dropFirst(), k.dropFirst($0)) }
        }
        guard let word = k.first else { return false }
        return (first == "*" || first == word) && match(p.dropFirst(), k.dropFirst())
    }
}
