extension UInt64 {
    /// `self − other`, or 0 where that would go below zero: for ages and
    /// windows computed from timestamps that come off the wire (a
    /// `timestamp` of 2^64 − 1 must not trap).
    public func subtractingClamped(_ other: UInt64) -> UInt64 { self >= other ? self - other : 0 }

    /// `self + other`, or `UInt64.max` where that would overflow.
    public func addingClamped(_ other: UInt64) -> UInt64 {
        let (sum, overflow) = addingReportingOverflow(other)
        return overflow ? .max : sum
    }

    /// `self × other`, or `UInt64.max` where that would overflow.
    public func multipliedClamped(by other: UInt64) -> UInt64 {
        let (product, overflow) = multipliedReportingOverflow(by: other)
        return overflow ? .max : product
    }
}
