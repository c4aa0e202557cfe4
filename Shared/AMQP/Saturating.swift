extension UInt64 {
    /// `self − other`, or 0 where that would go below zero: for ages and
    /// windows computed from timestamps that come off the wire (a
    /// `timestamp` of 2^64 − 1 must not trap).
    public func subtractingClamped(_ other: UInt64) -> UInt64 { self >= other ? self - other : 0 }
}
