//! Numbers as written: a decimal literal parsed exactly (`7.0` is the whole number 7, `12.30`
//! has two decimal places at most), so text and decimals convert without a float in between.

use std::fmt::Display;

use super::NOT_WHOLE;

/// A decimal number exactly: `±digits × 10^exp`, `digits` without leading or trailing zeros
/// (empty for zero), so two equal numbers are equal literals however they were written.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(super) struct Literal {
    negative: bool,
    digits: String,
    exp: i64,
}

/// The most digits an `i128` holds whatever they are.
const I128_DIGITS: i64 = 38;

impl Literal {
    /// Parses `[+-]digits[.digits][(e|E)[+-]digits]` (a point with digits on one side at least);
    /// `None` for anything else, `inf` and `NaN` included.
    pub(super) fn parse(s: &str) -> Option<Literal> {
        let (negative, rest) = match s.as_bytes().first()? {
            b'-' => (true, &s[1..]),
            b'+' => (false, &s[1..]),
            _ => (false, s),
        };
        let (mantissa, exp) = match rest.find(['e', 'E']) {
            Some(at) => (&rest[..at], parse_exponent(&rest[at + 1..])?),
            None => (rest, 0),
        };
        let (whole, fraction) = mantissa.split_once('.').unwrap_or((mantissa, ""));
        let all_digits = |t: &str| t.bytes().all(|b| b.is_ascii_digit());
        if whole.len() + fraction.len() == 0 || !all_digits(whole) || !all_digits(fraction) {
            return None;
        }
        let exp = exp.checked_sub(i64::try_from(fraction.len()).ok()?)?;
        Some(Literal::normalized(negative, format!("{whole}{fraction}"), exp))
    }

    fn normalized(negative: bool, digits: String, exp: i64) -> Literal {
        let trimmed = digits.trim_start_matches('0');
        let significant = trimmed.trim_end_matches('0');
        let zeros = i64::try_from(trimmed.len() - significant.len()).unwrap_or_default();
        if significant.is_empty() {
            return Literal { negative: false, digits: String::new(), exp: 0 };
        }
        Literal { negative, digits: significant.to_owned(), exp: exp.saturating_add(zeros) }
    }

    pub(super) fn of_decimal(unscaled: i128, scale: i8) -> Literal {
        Literal::normalized(unscaled < 0, unscaled.unsigned_abs().to_string(), -i64::from(scale))
    }

    /// The decimal a float stands for: its shortest form that reads back as the same float.
    pub(super) fn of_float(x: impl Display) -> Option<Literal> {
        Literal::parse(&x.to_string())
    }

    pub(super) fn is_zero(&self) -> bool {
        self.digits.is_empty()
    }

    /// The number as an integer, if it is whole and an `i128` holds it.
    pub(super) fn whole(&self) -> Result<i128, String> {
        if self.exp < 0 {
            return Err(NOT_WHOLE.to_owned());
        }
        self.scaled(0)
    }

    /// The number times 10^`scale`, if that is whole (`scale` decimal places hold it) and an
    /// `i128` holds it.
    pub(super) fn scaled(&self, scale: i8) -> Result<i128, String> {
        if self.is_zero() {
            return Ok(0);
        }
        let exp = self.exp + i64::from(scale);
        if exp < 0 {
            return Err(match scale {
                0 => NOT_WHOLE.to_owned(),
                1 => "it has more than 1 decimal place".to_owned(),
                _ => format!("it has more than {scale} decimal places"),
            });
        }
        let too_large = || "it is too large for any column of its kind".to_owned();
        if i64::try_from(self.digits.len()).unwrap_or(i64::MAX).saturating_add(exp) > I128_DIGITS {
            return Err(too_large());
        }
        let digits: i128 = self.digits.parse().map_err(|_| too_large())?;
        let power = 10_i128.checked_pow(u32::try_from(exp).map_err(|_| too_large())?).ok_or_else(too_large)?;
        let magnitude = digits.checked_mul(power).ok_or_else(too_large)?;
        Ok(if self.negative { -magnitude } else { magnitude })
    }
}

fn parse_exponent(s: &str) -> Option<i64> {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    s.parse().ok()
}

impl std::fmt::Display for Literal {
    /// Plain decimal notation (`-12.5`, `0.001`, `1200`).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.is_zero() {
            return f.write_str("0");
        }
        let sign = if self.negative { "-" } else { "" };
        let n = i64::try_from(self.digits.len()).unwrap_or(i64::MAX);
        if self.exp >= 0 {
            let zeros = "0".repeat(usize::try_from(self.exp).unwrap_or_default());
            return write!(f, "{sign}{}{zeros}", self.digits);
        }
        let point = n + self.exp;
        if point > 0 {
            let (whole, fraction) = self.digits.split_at(usize::try_from(point).unwrap_or_default());
            write!(f, "{sign}{whole}.{fraction}")
        } else {
            let zeros = "0".repeat(usize::try_from(-point).unwrap_or_default());
            write!(f, "{sign}0.{zeros}{}", self.digits)
        }
    }
}
