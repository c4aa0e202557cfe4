extension Duration {
    /// The duration in seconds, as a Double (for metrics and smoothed estimates).
    public var inSeconds: Double { Double(components.seconds) + Double(components.attoseconds) / 1e18 }
}
