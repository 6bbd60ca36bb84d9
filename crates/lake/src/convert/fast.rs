//! Vectorised conversions for the common cases (integers narrowed or widened, whole floats to
//! integers, CSV text to integers, floats, dates and timestamps), taken only when Arrow's cast
//! provably gives what the value-by-value rules of [`super`] give for every value of the column.
//! Anything else (a value that would be refused, or one these checks cannot vouch for) returns
//! `None`, and the column takes the value-by-value path, which also names the row to refuse.

use arrow::array::{Array, ArrayRef, AsArray as _, StringArray};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{DataType, Float32Type, Float64Type, Int64Type, TimeUnit, UInt64Type};

use super::{FLOAT_EXACT_INTEGERS, Spelling, fraction_digits, per_second};

/// `array` converted into `to` by Arrow's kernels, when that is exactly what the rules give.
pub(super) fn convert(array: &ArrayRef, to: &DataType, spelling: Spelling) -> Option<ArrayRef> {
    use DataType as T;
    let text = spelling == Spelling::Text;
    match (array.data_type(), to) {
        // Arrow's integer casts check the range: a value that does not fit becomes a null.
        (from, to) if is_int(from) && is_int(to) => checked_cast(array, to),
        (from, T::Float64) if is_int(from) && ints_below_2_53(array) => checked_cast(array, to),
        (T::Float64 | T::Float32, to) if is_int(to) && whole_floats_below_2_53(array) => checked_cast(array, to),
        // Arrow's integer parser refuses a point and an exponent: what it parses, it parses exactly.
        (T::Utf8, to) if text && is_int(to) => checked_cast(array, to),
        (T::Utf8, T::Float64) if text => text_to_float64(array),
        // Arrow's date parser reads the date of a longer timestamp text, dropping its time of day.
        (T::Utf8, T::Date32) if all_strings(array, |s| s.len() == 10) => checked_cast(array, to),
        (T::Utf8, T::Timestamp(unit, _)) if all_strings(array, |s| within_unit(s, *unit)) => checked_cast(array, to),
        _ => None,
    }
}

fn is_int(data_type: &DataType) -> bool {
    data_type.is_integer()
}

/// Arrow's cast into `to`, unless a value does not parse or fit (then the cast fails, not
/// turning the value into a null).
fn checked_cast(array: &ArrayRef, to: &DataType) -> Option<ArrayRef> {
    cast_with_options(array, to, &CastOptions { safe: false, ..Default::default() }).ok()
}

/// Whether every integer is below 2^53 in magnitude (so a float64 holds it exactly). Null slots
/// are read too: a stray value under a null only sends the column down the value-by-value path.
fn ints_below_2_53(array: &ArrayRef) -> bool {
    const LIMIT: u64 = 1 << 53;
    match array.data_type() {
        DataType::Int64 => array.as_primitive::<Int64Type>().values().iter().all(|v| v.unsigned_abs() < LIMIT),
        DataType::UInt64 => array.as_primitive::<UInt64Type>().values().iter().all(|v| *v < LIMIT),
        // Narrower integers always fit.
        _ => true,
    }
}

/// Whether every float is whole and below 2^53 in magnitude.
fn whole_floats_below_2_53(array: &ArrayRef) -> bool {
    let whole = |x: f64| x.fract() == 0.0 && x.abs() < FLOAT_EXACT_INTEGERS;
    match array.data_type() {
        DataType::Float64 => array.as_primitive::<Float64Type>().values().iter().all(|x| whole(*x)),
        DataType::Float32 => array.as_primitive::<Float32Type>().values().iter().all(|x| whole(f64::from(*x))),
        _ => false,
    }
}

fn all_strings(array: &ArrayRef, each: impl Fn(&str) -> bool) -> bool {
    array.as_string::<i32>().iter().flatten().all(each)
}

/// Whether a timestamp text has no digit below `unit` (Arrow's cast would drop it).
fn within_unit(s: &str, unit: TimeUnit) -> bool {
    let kept = usize::try_from(per_second(unit).ilog10()).unwrap_or(9);
    fraction_digits(s).len() <= kept
}

/// CSV text as float64 by Arrow's parser (correctly rounded, as the rules' is), when no value is
/// one the rules look at closer: an overflow, an underflow to zero, a whole number from 2^53 up
/// (which must be exact), a non-finite value.
fn text_to_float64(array: &ArrayRef) -> Option<ArrayRef> {
    let out = checked_cast(array, &DataType::Float64)?;
    let texts: &StringArray = array.as_string::<i32>();
    let plain = texts.iter().zip(out.as_primitive::<Float64Type>().iter()).all(|pair| match pair {
        (Some(s), Some(0.0)) => {
            !s.split(['e', 'E']).next().unwrap_or(s).bytes().any(|b| b.is_ascii_digit() && b != b'0')
        }
        (Some(_), Some(x)) => x.is_finite() && x.abs() < FLOAT_EXACT_INTEGERS,
        _ => true,
    });
    plain.then_some(out)
}
