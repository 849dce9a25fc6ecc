//! Kubernetes resource quantities (`resource.Quantity`), as far as the plugins need them.
//!
//! # Where they appear
//!
//! Koordinator writes batch resources into pod annotations as quantity strings:
//! `kubernetes.io/batch-cpu: "500"` (a count of milli-CPUs, not CPUs) and
//! `kubernetes.io/batch-memory: "128Mi"` (bytes).
//!
//! # Syntax
//!
//! Every string Kubernetes' `ParseQuantity` accepts (after the `TrimSpace` of its JSON decoder)
//! is accepted here, with the same value:
//!
//! ```text
//! quantity = [sign] number [suffix]
//! number   = digits | digits "." [digits] | "." digits | ""   (no digits at all: zero, as
//!                                                              Kubernetes reads "-", "." or "Mi")
//! suffix   = binary: Ki Mi Gi Ti Pi Ei (powers of 1024)
//!          | decimal: n u m "" k M G T P E (powers of 1000)
//!          | exponent: e<int> or E<int>, <int> a signed 64-bit decimal, taken modulo 2³² as a
//!            signed 32-bit number as Kubernetes does (`1e4294967297` is 10)
//! ```
//!
//! Any number of digits is accepted.
//!
//! # Values
//!
//! Values are held as an integer count of nano-units (10⁻⁹), rounded **up** (away from zero) to a
//! whole nano-unit as Kubernetes rounds at parse, and read back the way Kubernetes'
//! `Quantity.Value()` and `MilliValue()` do: rounded up to a whole unit (resp. milli-unit). A
//! quantity beyond what 64 bits hold (`1e19`, `10E`, `8Ei`, a 40-digit number) **saturates**:
//! `value()` and `milli_value()` are `i64::MAX` (`i64::MIN` when negative), as current Kubernetes'
//! `ScaledValue` saturates (it caps binary-suffixed values at 2⁶³−1 when parsing, and older
//! versions wrapped the others around, which we never do).
//!
//! No input panics or takes more than linear time.

use std::fmt;
use std::str::FromStr;

/// A parsed quantity: a number of nano-units (1 unit = 10⁹ nano-units), exact up to
/// [`SATURATED`] in magnitude.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Quantity {
    nanos: i128,
}

/// Why a string is not a quantity.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid quantity {input:?}: {reason}")]
pub struct QuantityError {
    input: String,
    reason: &'static str,
}

const NANO: i128 = 1_000_000_000;

/// The magnitude (in nano-units) at which a quantity is held as "too large": 10²⁸ nano-units,
/// 10¹⁹ units, above `i64::MAX` units, so `value()` and `milli_value()` both saturate.
pub const SATURATED: i128 = 10_000_000_000_000_000_000_000_000_000;

impl Quantity {
    /// The value in whole units, rounded up (Kubernetes `Value()`): `"1.5"` → 2, `"500m"` → 1;
    /// saturating at `i64::MAX` / `i64::MIN`.
    pub fn value(&self) -> i64 {
        clamp(ceil_div(self.nanos, NANO))
    }

    /// The value in milli-units, rounded up (Kubernetes `MilliValue()`): `"0.5"` → 500;
    /// saturating at `i64::MAX` / `i64::MIN`.
    pub fn milli_value(&self) -> i64 {
        clamp(ceil_div(self.nanos, NANO / 1000))
    }

    /// True when the quantity is below zero.
    pub fn is_negative(&self) -> bool {
        self.nanos < 0
    }

    /// True when the quantity is exactly zero (Kubernetes `IsZero`; `"1n"` is not zero).
    pub fn is_zero(&self) -> bool {
        self.nanos == 0
    }
}

fn ceil_div(a: i128, b: i128) -> i128 {
    let q = a / b;
    if a % b > 0 {
        q + 1
    } else {
        q
    }
}

fn clamp(v: i128) -> i64 {
    v.clamp(i64::MIN as i128, i64::MAX as i128) as i64
}

/// The suffix's multiplier: (power of ten, power of two).
fn suffix(s: &str) -> Option<(i64, u32)> {
    Some(match s {
        "" => (0, 0),
        "n" => (-9, 0),
        "u" => (-6, 0),
        "m" => (-3, 0),
        "k" => (3, 0),
        "M" => (6, 0),
        "G" => (9, 0),
        "T" => (12, 0),
        "P" => (15, 0),
        "E" => (18, 0),
        "Ki" => (0, 10),
        "Mi" => (0, 20),
        "Gi" => (0, 30),
        "Ti" => (0, 40),
        "Pi" => (0, 50),
        "Ei" => (0, 60),
        e if e.len() > 1 && e.starts_with(['e', 'E']) => {
            // Go's strconv.ParseInt(_, 10, 64) takes an optional sign and ASCII digits, as
            // Rust's i64 parser does; Kubernetes then truncates to int32.
            let exp: i64 = e[1..].parse().ok()?;
            (i64::from(exp as i32), 0)
        }
        _ => return None,
    })
}

/// `digits × 2^shift` as decimal digits (most significant first, no leading zeros; empty for
/// zero). Linear in the number of digits.
fn times_pow2(digits: &[u8], shift: u32) -> Vec<u8> {
    let mut out = Vec::with_capacity(digits.len() + 19);
    let mut carry: u128 = 0;
    for d in digits.iter().rev() {
        let v = (u128::from(*d) << shift) + carry;
        out.push((v % 10) as u8);
        carry = v / 10;
    }
    while carry > 0 {
        out.push((carry % 10) as u8);
        carry /= 10;
    }
    while out.last() == Some(&0) {
        out.pop();
    }
    out.reverse();
    out
}

impl FromStr for Quantity {
    type Err = QuantityError;

    fn from_str(input: &str) -> Result<Quantity, QuantityError> {
        let err = |reason| QuantityError { input: input.to_owned(), reason };
        let s = input.trim();
        if s.is_empty() {
            return Err(err("empty"));
        }
        let (negative, s) = match s.as_bytes()[0] {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let int_end = s.find(|c: char| !c.is_ascii_digit()).unwrap_or(s.len());
        let (int, rest) = s.split_at(int_end);
        let (frac, suffix_text) = match rest.strip_prefix('.') {
            Some(after) => after.split_at(after.find(|c: char| !c.is_ascii_digit()).unwrap_or(after.len())),
            None => ("", rest),
        };
        let (exp10, exp2) = suffix(suffix_text).ok_or_else(|| err("unknown suffix"))?;
        // value = digits × 10^(exp10 − |frac|) × 2^exp2; in nano-units one more 10^9.
        let digits: Vec<u8> = int.bytes().chain(frac.bytes()).map(|b| b - b'0').skip_while(|d| *d == 0).collect();
        let scaled = times_pow2(&digits, exp2);
        let frac_len = i64::try_from(frac.len()).unwrap_or(i64::MAX);
        let point = exp10.saturating_sub(frac_len).saturating_add(9); // nanos = scaled × 10^point
        let len = i64::try_from(scaled.len()).unwrap_or(i64::MAX);
        let magnitude = if scaled.is_empty() {
            0
        } else if len.saturating_add(point) > 29 {
            SATURATED // at least 10^29 nano-units
        } else {
            // The integer part of scaled × 10^point, then up by one if anything was cut off.
            let keep = usize::try_from(len.saturating_add(point.min(0)).max(0)).unwrap_or(0);
            let mut n: i128 = 0;
            for d in &scaled[..keep] {
                n = n * 10 + i128::from(*d);
            }
            for _ in 0..point.max(0) {
                n *= 10;
            }
            if scaled[keep..].iter().any(|d| *d != 0) {
                n += 1;
            }
            n.min(SATURATED)
        };
        Ok(Quantity { nanos: if negative { -magnitude } else { magnitude } })
    }
}

impl fmt::Display for Quantity {
    /// Plain decimal units, up to nine fractional digits (`1.5`, `134217728`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let (sign, abs) = if self.nanos < 0 { ("-", -self.nanos) } else { ("", self.nanos) };
        let (int, frac) = (abs / NANO, abs % NANO);
        if frac == 0 {
            write!(f, "{sign}{int}")
        } else {
            let frac = format!("{frac:09}");
            write!(f, "{sign}{int}.{}", frac.trim_end_matches('0'))
        }
    }
}

impl<'de> serde::Deserialize<'de> for Quantity {
    /// A quantity is a JSON string (`"128Mi"`) or, as Kubernetes also accepts, a JSON number.
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Quantity, D::Error> {
        #[derive(serde::Deserialize)]
        #[serde(untagged)]
        enum Raw {
            S(String),
            I(i64),
            F(f64),
        }
        let text = match Raw::deserialize(d)? {
            Raw::S(s) => s,
            Raw::I(i) => i.to_string(),
            Raw::F(x) => x.to_string(),
        };
        text.parse().map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn q(s: &str) -> Quantity {
        s.parse().unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn plain_and_decimal_suffixes() {
        assert_eq!(q("500").value(), 500);
        assert_eq!(q("1k").value(), 1000);
        assert_eq!(q("1.5k").value(), 1500);
        assert_eq!(q("2M").value(), 2_000_000);
        assert_eq!(q("3G").value(), 3_000_000_000);
        assert_eq!(q("1T").value(), 1_000_000_000_000);
        assert_eq!(q("+7").value(), 7);
        assert_eq!(q(" 42 ").value(), 42);
    }

    #[test]
    fn zero_is_exact() {
        for z in ["0", "0m", "-0", "0Gi", ".", "0e9"] {
            assert!(q(z).is_zero(), "{z}");
        }
        for nz in ["1n", "1m", "-1", "0.000000001"] {
            assert!(!q(nz).is_zero(), "{nz}");
        }
    }

    #[test]
    fn binary_suffixes() {
        assert_eq!(q("128Mi").value(), 134_217_728);
        assert_eq!(q("1Ki").value(), 1024);
        assert_eq!(q("1Gi").value(), 1 << 30);
        assert_eq!(q("0.5Gi").value(), 1 << 29);
        assert_eq!(q("2Ti").value(), 2 << 40);
    }

    #[test]
    fn milli_and_rounding_up() {
        assert_eq!(q("500m").milli_value(), 500);
        assert_eq!(q("500m").value(), 1, "Value() rounds up");
        assert_eq!(q("0.5").milli_value(), 500);
        assert_eq!(q("1").milli_value(), 1000);
        assert_eq!(q("1.0001").milli_value(), 1001);
        assert_eq!(q("100u").milli_value(), 1);
        assert_eq!(q("0").value(), 0);
        assert_eq!(q("-1").value(), -1);
        assert!(q("-1").is_negative());
    }

    #[test]
    fn exponents() {
        assert_eq!(q("1e3").value(), 1000);
        assert_eq!(q("12E2").value(), 1200);
        assert_eq!(q("5e-3").milli_value(), 5);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            " ",
            "abc",
            "1.2.3",
            "1 Mi",
            "1mi",
            "1KB",
            "1K",
            "--1",
            "1e",
            "1e+",
            "1ee5",
            "1Ei1",
            "1e99999999999999999999",
            "0x10",
            "1,5",
        ] {
            assert!(bad.parse::<Quantity>().is_err(), "{bad:?} accepted");
        }
        let e = "12x".parse::<Quantity>().unwrap_err().to_string();
        assert!(e.contains("\"12x\"") && e.contains("suffix"), "{e}");
    }

    /// What Kubernetes' ParseQuantity reads as zero: a number without digits.
    #[test]
    fn no_digits_is_zero_as_in_kubernetes() {
        for zero in [".", "-", "+", "Mi", "k", "-.", "0.", "+0e5", "e5"] {
            assert_eq!(q(zero).value(), 0, "{zero:?}");
            assert!(!q(zero).is_negative(), "{zero:?}");
        }
        assert_eq!(q("1.G").value(), 1_000_000_000, "Kubernetes takes a bare decimal point");
    }

    /// Quantities Kubernetes accepts that do not fit in 64 bits saturate instead of failing.
    #[test]
    fn huge_values_saturate() {
        assert_eq!(q("7Ei").value(), 7 << 60);
        for huge in [
            "8Ei",
            "10E",
            "1e19",
            "1e99",
            "9223372036854775808",
            "99999999999999999999999999999999",
            "1e2147483647",
            "100000000000000000000E",
        ] {
            assert_eq!(q(huge).value(), i64::MAX, "{huge:?}");
            assert_eq!(q(huge).milli_value(), i64::MAX, "{huge:?}");
            assert_eq!(q(&format!("-{huge}")).value(), i64::MIN, "-{huge:?}");
        }
        assert_eq!(q("9223372036854775807").value(), i64::MAX);
        assert_eq!(q("9223372036854775806").value(), i64::MAX - 1, "exact just below the bound");
        assert_eq!(q("9223372036854775807").milli_value(), i64::MAX, "milli saturates first");
        assert_eq!(q("9223372036854775m").milli_value(), 9_223_372_036_854_775);
        // Long inputs are exact where it matters: leading zeros, tiny fractions rounded up.
        assert_eq!(q(&format!("{}5", "0".repeat(10_000))).value(), 5);
        assert_eq!(q(&format!("0.{}1", "0".repeat(10_000))).milli_value(), 1, "rounded up, never to zero");
        assert_eq!(q("1e-2147483648").milli_value(), 1);
        assert_eq!(q("1e-9223372036854775807").value(), 10, "the exponent modulo 2^32 is 1");
        assert_eq!(q("1.5Gi").value(), 3 << 29);
        assert_eq!(q("0.1Ki").milli_value(), 102_400);
        assert_eq!(q("0.001Ki").value(), 2, "1.024 rounded up");
    }

    /// Kubernetes reads the exponent as int64 and truncates it to int32.
    #[test]
    fn exponent_truncated_to_32_bits() {
        assert_eq!(q("1e4294967297").value(), 10);
        assert_eq!(q("1e+3").value(), 1000);
        assert_eq!(q("1E-0").value(), 1);
    }

    #[test]
    fn display_and_serde() {
        assert_eq!(q("1.5k").to_string(), "1500");
        assert_eq!(q("500m").to_string(), "0.5");
        let from_json: std::collections::BTreeMap<String, Quantity> =
            serde_json::from_str(r#"{"a": "128Mi", "b": 500, "c": 1.5}"#).unwrap();
        assert_eq!(from_json["a"].value(), 134_217_728);
        assert_eq!(from_json["b"].value(), 500);
        assert_eq!(from_json["c"].milli_value(), 1500);
        assert!(serde_json::from_str::<Quantity>(r#""lots""#).is_err());
    }

    proptest! {
        /// Whatever the input, parsing never panics.
        #[test]
        fn never_panics(s in "\\PC{0,40}") {
            let _ = s.parse::<Quantity>();
        }

        /// Any sign, digits, point and suffix Kubernetes accepts parses, and never wraps: a
        /// positive quantity's value is positive or zero, a negative one's negative or zero.
        #[test]
        fn every_kubernetes_form_parses_without_wrapping(
            sign in "[-+]?", int in "[0-9]{0,40}", frac in proptest::option::of("[0-9]{0,40}"),
            suffix in "(|n|u|m|k|M|G|T|P|E|Ki|Mi|Gi|Ti|Pi|Ei|[eE][-+]?[0-9]{1,12})",
        ) {
            let text = format!("{sign}{int}{}{suffix}", frac.map(|f| format!(".{f}")).unwrap_or_default());
            // Every part may come out empty: the empty string is the one form Kubernetes refuses.
            prop_assume!(!text.is_empty());
            let v = text.parse::<Quantity>();
            prop_assert!(v.is_ok(), "{text:?}: {v:?}");
            let v = v.unwrap();
            if sign == "-" {
                prop_assert!(v.value() <= 0 && v.milli_value() <= 0, "{text:?}");
            } else {
                prop_assert!(v.value() >= 0 && v.milli_value() >= 0, "{text:?}");
            }
            prop_assert!(v.milli_value() >= v.value() || v.value() == i64::MAX || v.is_negative(), "{text:?}");
            // Printed as a plain decimal, it parses back to itself (saturated ones included).
            prop_assert_eq!(v.to_string().parse::<Quantity>().ok(), Some(v), "{:?} printed as {}", text, v);
        }

        /// Exponent forms against integer arithmetic: `m × 10^e`, rounded up.
        #[test]
        fn exponents_match_integer_arithmetic(m in 0i64..1_000_000, e in -12i32..=12) {
            let text = format!("{m}e{e}");
            let scale = 10i64.pow(e.unsigned_abs());
            let want = if e >= 0 { m * scale } else { (m + scale - 1) / scale };
            prop_assert_eq!(q(&text).value(), want, "{}", text);
        }

        /// Integers with decimal and binary suffixes scale exactly.
        #[test]
        fn integers_scale(n in 0i64..1_000_000) {
            prop_assert_eq!(q(&n.to_string()).value(), n);
            prop_assert_eq!(q(&format!("{n}k")).value(), n * 1000);
            prop_assert_eq!(q(&format!("{n}Mi")).value(), n << 20);
            prop_assert_eq!(q(&format!("{n}m")).milli_value(), n);
        }
    }
}
