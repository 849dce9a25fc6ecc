//! Kubernetes resource quantities (`resource.Quantity`), as far as the plugins need them.
//!
//! Koordinator writes batch resources into pod annotations as quantity strings:
//! `kubernetes.io/batch-cpu: "500"` (a count of milli-CPUs, not CPUs) and
//! `kubernetes.io/batch-memory: "128Mi"` (bytes). The grammar accepted here is Kubernetes':
//!
//! ```text
//! quantity = [sign] number [suffix]
//! number   = digits | digits "." [digits] | "." digits
//! suffix   = binary: Ki Mi Gi Ti Pi Ei (powers of 1024)
//!          | decimal: n u m "" k M G T P E (powers of 1000)
//!          | exponent: e<int> or E<int> (e.g. 1e3)
//! ```
//!
//! Values are held exactly, as an integer count of nano-units (10⁻⁹), and read back the way
//! Kubernetes' `Quantity.Value()` and `MilliValue()` do: rounded **up** to a whole unit (resp.
//! milli-unit). Anything above `i64::MAX` units is an error, never a wrap.

use std::fmt;
use std::str::FromStr;

/// A parsed quantity: an exact number of nano-units (1 unit = 10⁹ nano-units).
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

impl Quantity {
    /// The value in whole units, rounded up (Kubernetes `Value()`): `"1.5"` → 2, `"500m"` → 1.
    pub fn value(&self) -> i64 {
        clamp(ceil_div(self.nanos, NANO))
    }

    /// The value in milli-units, rounded up (Kubernetes `MilliValue()`): `"0.5"` → 500.
    pub fn milli_value(&self) -> i64 {
        clamp(ceil_div(self.nanos, NANO / 1000))
    }

    /// True when the quantity is below zero.
    pub fn is_negative(&self) -> bool {
        self.nanos < 0
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
        let num_end = s.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(s.len());
        let (number, suffix) = s.split_at(num_end);
        let (int, frac) = number.split_once('.').unwrap_or((number, ""));
        if int.is_empty() && frac.is_empty() {
            return Err(err("no digits"));
        }
        if frac.contains('.') {
            return Err(err("more than one decimal point"));
        }
        if int.len() + frac.len() > 30 {
            return Err(err("too many digits"));
        }
        // mantissa × 10^(-frac.len()) × multiplier
        let mut mantissa: i128 = 0;
        for d in int.bytes().chain(frac.bytes()) {
            mantissa = mantissa * 10 + i128::from(d - b'0');
        }
        let (mul_num, mul_den): (i128, i128) = match suffix {
            "" => (1, 1),
            "n" => (1, 1_000_000_000),
            "u" => (1, 1_000_000),
            "m" => (1, 1000),
            "k" => (1000, 1),
            "M" => (1_000_000, 1),
            "G" => (1_000_000_000, 1),
            "T" => (1_000_000_000_000, 1),
            "P" => (1_000_000_000_000_000, 1),
            "E" => (1_000_000_000_000_000_000, 1),
            "Ki" => (1 << 10, 1),
            "Mi" => (1 << 20, 1),
            "Gi" => (1 << 30, 1),
            "Ti" => (1 << 40, 1),
            "Pi" => (1 << 50, 1),
            "Ei" => (1 << 60, 1),
            e if e.starts_with(['e', 'E']) => {
                let exp: i32 = e[1..].parse().map_err(|_| err("bad exponent"))?;
                if !(-9..=18).contains(&exp) {
                    return Err(err("exponent out of range (-9..=18)"));
                }
                if exp >= 0 {
                    (10i128.pow(exp as u32), 1)
                } else {
                    (1, 10i128.pow((-exp) as u32))
                }
            }
            _ => return Err(err("unknown suffix")),
        };
        // nanos = mantissa × NANO × mul_num / (10^frac × mul_den), rounded up (Kubernetes rounds
        // sub-nano precision up too).
        let frac_den = 10i128.checked_pow(frac.len() as u32).ok_or_else(|| err("too precise"))?;
        let num = mantissa.checked_mul(NANO).and_then(|v| v.checked_mul(mul_num)).ok_or_else(|| err("too large"))?;
        let den = frac_den.checked_mul(mul_den).ok_or_else(|| err("too precise"))?;
        let nanos = ceil_div(num, den);
        if nanos > i128::from(i64::MAX) * NANO {
            return Err(err("too large"));
        }
        Ok(Quantity { nanos: if negative { -nanos } else { nanos } })
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
        for bad in ["", " ", "abc", "1.2.3", "1 Mi", "1mi", "1KB", "--1", ".", "1e", "1e99", "99999999999999999999999999999999", "1Ei1"] {
            assert!(bad.parse::<Quantity>().is_err(), "{bad:?} accepted");
        }
        let e = "12x".parse::<Quantity>().unwrap_err().to_string();
        assert!(e.contains("\"12x\"") && e.contains("suffix"), "{e}");
    }

    #[test]
    fn huge_values_are_errors_not_wraps() {
        assert_eq!(q("7Ei").value(), 7 << 60);
        assert!("8Ei".parse::<Quantity>().is_err(), "above i64::MAX");
        assert!("100000000000000000000E".parse::<Quantity>().is_err());
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
