//! Exact integer arithmetic shared by the algorithms.
//!
//! Lua numbers are IEEE doubles, exact only below 2^53, while a product such as
//! `elapsed_us * refill_tokens` can exceed that. The scripts therefore compute `a * b / c` with a
//! long multiplication when the product is too large (see `muldiv` in `lua/muldiv.lua`); here
//! `u128` does the same job. Both give the exact floor and remainder, so answers never drift.

/// `(floor(a * b / c), a * b mod c)`, with the quotient saturated at `u64::MAX`.
pub fn muldiv(a: u64, b: u64, c: u64) -> (u64, u64) {
    debug_assert!(c > 0);
    let p = u128::from(a) * u128::from(b);
    let c = u128::from(c);
    let q = u64::try_from(p / c).unwrap_or(u64::MAX);
    // The remainder is below `c`, which is a u64.
    let r = (p % c) as u64;
    (q, r)
}

/// Greatest common divisor (Euclid).
pub fn gcd(mut a: u64, mut b: u64) -> u64 {
    while b != 0 {
        (a, b) = (b, a % b);
    }
    a
}

/// `ceil(a / b)` for `b > 0`.
pub fn div_ceil(a: u64, b: u64) -> u64 {
    a.div_ceil(b)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn muldiv_is_exact_beyond_two_to_the_fifty_three() {
        // 2_678_400_000_000 µs (31 days) times 999_999_937 does not fit in a double.
        let (q, r) = muldiv(2_678_400_000_000 - 1, 999_999_937, 2_678_400_000_000);
        assert_eq!(q, 999_999_936);
        assert_eq!(r, 2_678_400_000_000 - 999_999_937);
    }

    #[test]
    fn muldiv_saturates_instead_of_wrapping() {
        assert_eq!(muldiv(u64::MAX, u64::MAX, 1).0, u64::MAX);
    }

    #[test]
    fn gcd_reduces_rates() {
        assert_eq!(gcd(100, 60_000_000), 100);
        assert_eq!(gcd(7, 3_600_000_000), 1);
        assert_eq!(gcd(0, 5), 5);
    }
}
