//! Lossless conversion of staged values into a table's column types: the one path every input
//! takes (a CSV file's text, JSON lines, Parquet, a SQL task's rows). A value is converted only
//! when the table will hold exactly the value the task wrote; otherwise [`convert`] names the
//! first row that would change, its value and why. The rules, as docs/spec-reference.md states
//! them ("Values and types"):
//!
//! - Same type passes. Integers convert to integers when the value fits, to floats when the
//!   float holds it exactly. Floats convert to integers when whole and below 2^53 in magnitude
//!   (above it a float no longer holds every whole number, so it may already be rounded), and
//!   float64 to float32 when float32 holds the same value. Decimals keep every digit.
//! - Booleans never convert to or from numbers; nothing typed turns into text, and text in a
//!   typed input (a JSON string, a Parquet string column, a query's string) is never read as a
//!   number or a boolean. JSON has no date, time or decimal type, so text parses strictly into
//!   those.
//! - CSV is all text: each value is parsed strictly into its column's type. A whole number
//!   written without a point or exponent is exact; one written with them (`1.5`, `2e3`) is a
//!   decimal, stored as the nearest float (as precisely as float64 holds it).
//! - Dates and timestamps widen (a date is its midnight, milliseconds become microseconds) but
//!   never drop a time of day or digits below the column's unit.

use std::fmt::Display;
use std::sync::Arc;

use arrow::array::{
    Array, ArrayRef, AsArray as _, BinaryArray, BooleanArray, PrimitiveArray, StringArray, new_null_array,
};
use arrow::compute::kernels::cast_utils::{Parser as _, string_to_datetime};
use arrow::compute::{CastOptions, cast_with_options};
use arrow::datatypes::{
    ArrowPrimitiveType, DataType, Date32Type, Date64Type, Decimal128Type, Float32Type, Float64Type, Int8Type,
    Int16Type, Int32Type, Int64Type, TimeUnit, TimestampMicrosecondType, TimestampMillisecondType,
    TimestampNanosecondType, TimestampSecondType, UInt8Type, UInt16Type, UInt32Type, UInt64Type,
};
use chrono::{DateTime, Timelike as _, Utc};

use literal::Literal;

mod fast;
mod literal;

/// How an input writes its values.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Spelling {
    /// Every value is text, parsed into its column's type (CSV).
    Text,
    /// Values carry their own types (JSON lines, Parquet, a query's rows): a string is a string.
    Typed,
}

/// A value that cannot be stored in its column's type without loss.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Refusal {
    /// The row, 0-based in the array converted.
    pub(crate) row: usize,
    /// The value as the input holds it: `"1.5"` (text), `7.9 (float64)`.
    pub(crate) value: String,
    /// Why it cannot be stored.
    pub(crate) reason: String,
}

impl Refusal {
    /// The sentence an error shows: the value, the column's type and why.
    pub(crate) fn detail(&self, to: &DataType) -> String {
        format!(
            "{} cannot be stored as {}: {}; fix the task's output, or declare the column with a type that holds \
             it",
            self.value,
            type_name(to),
            self.reason
        )
    }
}

/// `array` converted into `to` without loss, or the first row that cannot be.
pub(crate) fn convert(array: &ArrayRef, to: &DataType, spelling: Spelling) -> Result<ArrayRef, Refusal> {
    if array.data_type() == to {
        return Ok(array.clone());
    }
    // Nothing but nulls (JSON's `null` alone is read as Arrow's `Null` type): nulls of `to`.
    if array.logical_null_count() == array.len() {
        return Ok(new_null_array(to, array.len()));
    }
    // A dictionary (a pandas categorical in Parquet) holds values of its value type.
    if let DataType::Dictionary(_, values) = array.data_type() {
        let Ok(plain) = cast_with_options(array, values, &CastOptions::default()) else {
            return by_value(array, to, spelling);
        };
        return convert(&plain, to, spelling);
    }
    if let Some(converted) = fast::convert(array, to, spelling) {
        return Ok(converted);
    }
    by_value(array, to, spelling)
}

/// [`convert`] one value at a time: the rules themselves.
fn by_value(array: &ArrayRef, to: &DataType, spelling: Spelling) -> Result<ArrayRef, Refusal> {
    let source = Source::of(array, spelling)?;
    let converted: ArrayRef = match to {
        DataType::Boolean => Arc::new(collect_bool(&source)?),
        DataType::Int8 => Arc::new(collect_int::<Int8Type>(&source, to)?),
        DataType::Int16 => Arc::new(collect_int::<Int16Type>(&source, to)?),
        DataType::Int32 => Arc::new(collect_int::<Int32Type>(&source, to)?),
        DataType::Int64 => Arc::new(collect_int::<Int64Type>(&source, to)?),
        DataType::UInt8 => Arc::new(collect_int::<UInt8Type>(&source, to)?),
        DataType::UInt16 => Arc::new(collect_int::<UInt16Type>(&source, to)?),
        DataType::UInt32 => Arc::new(collect_int::<UInt32Type>(&source, to)?),
        DataType::UInt64 => Arc::new(collect_int::<UInt64Type>(&source, to)?),
        DataType::Float32 => Arc::new(collect::<Float32Type>(&source, |v| to_f32(v, source.spelling))?),
        DataType::Float64 => Arc::new(collect::<Float64Type>(&source, |v| to_f64(v, source.spelling))?),
        DataType::Decimal128(precision, scale) => {
            let values = collect::<Decimal128Type>(&source, |v| to_decimal(v, *precision, *scale))?;
            Arc::new(values.with_precision_and_scale(*precision, *scale).map_err(|e| source.refuse_first(e))?)
        }
        DataType::Utf8 => Arc::new(collect_str(&source)?),
        DataType::Date32 => Arc::new(collect::<Date32Type>(&source, to_days)?),
        DataType::Timestamp(unit, zone) => timestamps(&source, *unit, zone.clone())?,
        DataType::Binary => Arc::new(collect_bytes(&source)?),
        other => return Err(source.refuse_first(format!("a {} column is not one staging writes", type_name(other)))),
    };
    Ok(converted)
}

/// A type as the spec's vocabulary names it (`int64`, `timestamp`), or Arrow's name otherwise.
pub(crate) fn type_name(data_type: &DataType) -> String {
    match data_type {
        DataType::Utf8 | DataType::LargeUtf8 | DataType::Utf8View => "string".to_owned(),
        DataType::Boolean => "bool".to_owned(),
        DataType::Int8 => "int8".to_owned(),
        DataType::Int16 => "int16".to_owned(),
        DataType::Int32 => "int32".to_owned(),
        DataType::Int64 => "int64".to_owned(),
        DataType::UInt8 => "uint8".to_owned(),
        DataType::UInt16 => "uint16".to_owned(),
        DataType::UInt32 => "uint32".to_owned(),
        DataType::UInt64 => "uint64".to_owned(),
        DataType::Float16 => "float16".to_owned(),
        DataType::Float32 => "float32".to_owned(),
        DataType::Float64 => "float64".to_owned(),
        DataType::Date32 | DataType::Date64 => "date".to_owned(),
        DataType::Timestamp(..) => "timestamp".to_owned(),
        DataType::Decimal128(p, s) => format!("decimal({p},{s})"),
        DataType::Binary | DataType::LargeBinary | DataType::BinaryView => "binary".to_owned(),
        other => other.to_string(),
    }
}

/// One value of a source column, as the conversion rules see it.
#[derive(Debug, Clone, Copy)]
enum Value<'a> {
    Bool(bool),
    Int(i128),
    Float(f64),
    Decimal {
        unscaled: i128,
        scale: i8,
    },
    Str(&'a str),
    /// Days since the Unix epoch.
    Date(i32),
    /// A count of `TimeUnit`s since the Unix epoch, UTC (Arrow's `Date64` is milliseconds).
    Time(i64, TimeUnit),
    Bytes(&'a [u8]),
}

/// A source column in one of the few Arrow types [`Value`] reads, and how its input spells values.
struct Source {
    array: ArrayRef,
    /// The type the input gave the column, for messages.
    input_type: DataType,
    spelling: Spelling,
}

impl Source {
    /// `array` with every type widened losslessly to one [`Source::value`] reads: integers to
    /// `Int64` (except `UInt64`), floats to `Float64`, strings to `Utf8`, binaries to `Binary`,
    /// decimals to `Decimal128`. A type nothing converts from (a nested value) is refused at its
    /// first value.
    fn of(array: &ArrayRef, spelling: Spelling) -> Result<Source, Refusal> {
        use DataType as T;
        let input_type = array.data_type().clone();
        let spelling =
            if matches!(input_type, T::Utf8 | T::LargeUtf8 | T::Utf8View) { spelling } else { Spelling::Typed };
        let canonical = match &input_type {
            T::Int8 | T::Int16 | T::Int32 | T::UInt8 | T::UInt16 | T::UInt32 => Some(T::Int64),
            T::Float16 | T::Float32 => Some(T::Float64),
            T::LargeUtf8 | T::Utf8View => Some(T::Utf8),
            T::LargeBinary | T::BinaryView => Some(T::Binary),
            T::Decimal32(p, s) | T::Decimal64(p, s) => Some(T::Decimal128(*p, *s)),
            T::Boolean
            | T::Int64
            | T::UInt64
            | T::Float64
            | T::Utf8
            | T::Binary
            | T::Decimal128(..)
            | T::Date32
            | T::Date64
            | T::Timestamp(..) => None,
            other => {
                let source = Source { array: array.clone(), input_type: other.clone(), spelling };
                return Err(source.refuse_first(unsupported(other)));
            }
        };
        let array = match canonical {
            Some(to) => cast_with_options(array, &to, &CastOptions::default()).map_err(|e| {
                Source { array: array.clone(), input_type: input_type.clone(), spelling }.refuse_first(e)
            })?,
            None => array.clone(),
        };
        Ok(Source { array, input_type, spelling })
    }

    fn len(&self) -> usize {
        self.array.len()
    }

    /// The value at `row`, `None` for a null.
    fn value(&self, row: usize) -> Option<Value<'_>> {
        let a = &self.array;
        if a.is_null(row) {
            return None;
        }
        Some(match a.data_type() {
            DataType::Boolean => Value::Bool(a.as_boolean().value(row)),
            DataType::Int64 => Value::Int(a.as_primitive::<Int64Type>().value(row).into()),
            DataType::UInt64 => Value::Int(a.as_primitive::<UInt64Type>().value(row).into()),
            DataType::Float64 => Value::Float(a.as_primitive::<Float64Type>().value(row)),
            DataType::Decimal128(_, scale) => {
                Value::Decimal { unscaled: a.as_primitive::<Decimal128Type>().value(row), scale: *scale }
            }
            DataType::Utf8 => Value::Str(a.as_string::<i32>().value(row)),
            DataType::Binary => Value::Bytes(a.as_binary::<i32>().value(row)),
            DataType::Date32 => Value::Date(a.as_primitive::<Date32Type>().value(row)),
            DataType::Date64 => Value::Time(a.as_primitive::<Date64Type>().value(row), TimeUnit::Millisecond),
            DataType::Timestamp(unit, _) => Value::Time(timestamp_value(a, *unit, row), *unit),
            // `Source::of` leaves no other type.
            _ => return None,
        })
    }

    /// `value` as a message shows it: text quoted, a typed value with the input's type.
    fn shown(&self, value: Value<'_>) -> String {
        let text = match value {
            Value::Bool(b) => b.to_string(),
            Value::Int(i) => i.to_string(),
            Value::Float(x) => x.to_string(),
            Value::Decimal { unscaled, scale } => Literal::of_decimal(unscaled, scale).to_string(),
            Value::Str(s) => format!("{:?}", clip(s)),
            Value::Date(days) => show_date(days),
            Value::Time(count, unit) => show_time(count, unit),
            Value::Bytes(b) => format!("{} bytes", b.len()),
        };
        match (value, self.spelling) {
            (Value::Str(_), Spelling::Text) => text,
            _ => format!("{text} ({})", type_name(&self.input_type)),
        }
    }

    /// A refusal at the first non-null value.
    fn refuse_first(&self, reason: impl Display) -> Refusal {
        let row = (0..self.array.len()).find(|&i| self.array.is_valid(i)).unwrap_or_default();
        let value = self.value(row).map_or_else(|| format!("a value of type {}", self.input_type), |v| self.shown(v));
        Refusal { row, value, reason: reason.to_string() }
    }
}

/// Why a value of a type staging does not convert from is refused.
fn unsupported(data_type: &DataType) -> String {
    let kind = if data_type.is_nested() { "a nested value (a JSON object or list)" } else { "a value of this type" };
    format!(
        "{kind} is never stored in a table column, which holds strings, numbers, booleans, dates, timestamps, \
         decimals or binary"
    )
}

fn timestamp_value(array: &ArrayRef, unit: TimeUnit, row: usize) -> i64 {
    match unit {
        TimeUnit::Second => array.as_primitive::<TimestampSecondType>().value(row),
        TimeUnit::Millisecond => array.as_primitive::<TimestampMillisecondType>().value(row),
        TimeUnit::Microsecond => array.as_primitive::<TimestampMicrosecondType>().value(row),
        TimeUnit::Nanosecond => array.as_primitive::<TimestampNanosecondType>().value(row),
    }
}

/// The longest text a message quotes whole.
const SHOWN_TEXT_CHARS: usize = 64;

fn clip(s: &str) -> String {
    match s.char_indices().nth(SHOWN_TEXT_CHARS) {
        Some((at, _)) => format!("{}...", &s[..at]),
        None => s.to_owned(),
    }
}

fn show_date(days: i32) -> String {
    DateTime::from_timestamp(i64::from(days) * SECONDS_PER_DAY, 0)
        .map_or_else(|| format!("day {days}"), |d| d.format("%Y-%m-%d").to_string())
}

fn show_time(count: i64, unit: TimeUnit) -> String {
    let per_second = per_second(unit);
    let (seconds, part) = (count.div_euclid(per_second), count.rem_euclid(per_second));
    let nanos = u32::try_from(part * (1_000_000_000 / per_second)).unwrap_or_default();
    DateTime::from_timestamp(seconds, nanos)
        .map_or_else(|| format!("{count} {unit:?}s"), |t| t.to_rfc3339_opts(chrono::SecondsFormat::AutoSi, true))
}

/// Collects `each` value converted into an array of `T`, stopping at the first refusal.
fn collect<T: ArrowPrimitiveType>(
    source: &Source,
    each: impl Fn(Value<'_>) -> Result<T::Native, String>,
) -> Result<PrimitiveArray<T>, Refusal> {
    (0..source.len())
        .map(|row| match source.value(row) {
            None => Ok(None),
            Some(v) => each(v).map(Some).map_err(|reason| Refusal { row, value: source.shown(v), reason }),
        })
        .collect()
}

fn collect_int<T: ArrowPrimitiveType>(source: &Source, to: &DataType) -> Result<PrimitiveArray<T>, Refusal>
where
    T::Native: TryFrom<i128>,
{
    collect::<T>(source, |v| {
        let whole = to_whole(v, source.spelling)?;
        T::Native::try_from(whole).map_err(|_| format!("it is outside {}'s range", type_name(to)))
    })
}

fn collect_bool(source: &Source) -> Result<BooleanArray, Refusal> {
    (0..source.len())
        .map(|row| match source.value(row) {
            None => Ok(None),
            Some(v) => {
                to_bool(v, source.spelling).map(Some).map_err(|reason| Refusal { row, value: source.shown(v), reason })
            }
        })
        .collect()
}

fn collect_str(source: &Source) -> Result<StringArray, Refusal> {
    (0..source.len())
        .map(|row| match source.value(row) {
            None => Ok(None),
            Some(Value::Str(s)) => Ok(Some(s)),
            Some(v) => Err(Refusal { row, value: source.shown(v), reason: never_text(v) }),
        })
        .collect()
}

fn collect_bytes(source: &Source) -> Result<BinaryArray, Refusal> {
    (0..source.len())
        .map(|row| match source.value(row) {
            None => Ok(None),
            Some(Value::Bytes(b)) => Ok(Some(b)),
            Some(v) => Err(Refusal { row, value: source.shown(v), reason: never(v, "binary") }),
        })
        .collect()
}

fn timestamps(source: &Source, unit: TimeUnit, zone: Option<Arc<str>>) -> Result<ArrayRef, Refusal> {
    let each = |v: Value<'_>| to_time(v, unit);
    Ok(match unit {
        TimeUnit::Second => Arc::new(collect::<TimestampSecondType>(source, each)?.with_timezone_opt(zone)),
        TimeUnit::Millisecond => Arc::new(collect::<TimestampMillisecondType>(source, each)?.with_timezone_opt(zone)),
        TimeUnit::Microsecond => Arc::new(collect::<TimestampMicrosecondType>(source, each)?.with_timezone_opt(zone)),
        TimeUnit::Nanosecond => Arc::new(collect::<TimestampNanosecondType>(source, each)?.with_timezone_opt(zone)),
    })
}

// ---- one value ----------------------------------------------------------------------------------

const NOT_WHOLE: &str = "it is not a whole number";
const NOT_NUMBER: &str = "it is not a number";
const STRING_NOT_NUMBER: &str =
    "a string is never read as a number (only a CSV file's text is): write the number unquoted";
const BOOL_NOT_NUMBER: &str = "a boolean is never stored as a number";

/// The largest magnitude below which a float64 holds every whole number exactly (2^53).
const FLOAT_EXACT_INTEGERS: f64 = 9_007_199_254_740_992.0;

const SECONDS_PER_DAY: i64 = 86_400;

fn to_whole(v: Value<'_>, spelling: Spelling) -> Result<i128, String> {
    match v {
        Value::Int(i) => Ok(i),
        Value::Float(x) if !x.is_finite() => Err("it is not a finite number".to_owned()),
        Value::Float(x) if x.fract() != 0.0 => Err(NOT_WHOLE.to_owned()),
        Value::Float(x) if x.abs() >= FLOAT_EXACT_INTEGERS => {
            Err("from 2^53 up a float no longer holds every whole number, so it may already be rounded; write it as \
             an integer"
                .to_owned())
        }
        // Whole and below 2^53: exact.
        Value::Float(x) => Ok(x as i128),
        Value::Decimal { unscaled, scale } => Literal::of_decimal(unscaled, scale).whole(),
        Value::Str(s) if spelling == Spelling::Text => match s.trim_ascii().parse::<i64>() {
            Ok(i) => Ok(i.into()),
            Err(_) => Literal::parse(s.trim_ascii()).ok_or_else(|| NOT_NUMBER.to_owned())?.whole(),
        },
        Value::Str(_) => Err(STRING_NOT_NUMBER.to_owned()),
        Value::Bool(_) => Err(BOOL_NOT_NUMBER.to_owned()),
        other => Err(never(other, "a number")),
    }
}

fn to_f64(v: Value<'_>, spelling: Spelling) -> Result<f64, String> {
    match v {
        Value::Int(i) => exact_float(i, |i| i as f64, |x| x as i128, "float64"),
        Value::Float(x) => Ok(x),
        Value::Decimal { unscaled, scale } => {
            let literal = Literal::of_decimal(unscaled, scale);
            let x: f64 = literal.to_string().parse().map_err(|_| NOT_NUMBER.to_owned())?;
            if Literal::of_float(x).as_ref() == Some(&literal) {
                Ok(x)
            } else {
                Err(format!("float64 cannot hold it exactly (it would become {x})"))
            }
        }
        Value::Str(s) if spelling == Spelling::Text => text_to_float(s.trim_ascii(), "float64"),
        other => Err(not_a_float(other)),
    }
}

fn to_f32(v: Value<'_>, spelling: Spelling) -> Result<f32, String> {
    match v {
        Value::Int(i) => exact_float(i, |i| i as f32, |y| y as i128, "float32"),
        Value::Str(s) if spelling == Spelling::Text && is_integer_text(s.trim_ascii()) => {
            let i = s
                .trim_ascii()
                .parse::<i128>()
                .map_err(|_| "float32 cannot hold this whole number exactly".to_owned())?;
            exact_float(i, |i| i as f32, |y| y as i128, "float32")
        }
        Value::Float(x) => narrow(x),
        Value::Str(s) if spelling == Spelling::Text => narrow(text_to_float(s.trim_ascii(), "float64")?),
        Value::Decimal { unscaled, scale } => {
            let literal = Literal::of_decimal(unscaled, scale);
            let y: f32 = literal.to_string().parse().map_err(|_| NOT_NUMBER.to_owned())?;
            if Literal::of_float(y).as_ref() == Some(&literal) {
                Ok(y)
            } else {
                Err(format!("float32 cannot hold it exactly (it would become {y})"))
            }
        }
        other => Err(not_a_float(other)),
    }
}

/// `i` as a float, if the float holds it exactly.
fn exact_float<F: Display + Copy>(
    i: i128,
    to: impl Fn(i128) -> F,
    back: impl Fn(F) -> i128,
    name: &str,
) -> Result<F, String> {
    let x = to(i);
    if back(x) == i {
        Ok(x)
    } else {
        Err(format!("{name} cannot hold this whole number exactly (it would become {x})"))
    }
}

/// A float64 as float32, when float32 holds the same value: exactly, or as the same shortest
/// decimal (0.1 is 0.1 in both).
fn narrow(x: f64) -> Result<f32, String> {
    let y = x as f32;
    if x.is_nan() || f64::from(y) == x || y.to_string() == x.to_string() {
        return Ok(y);
    }
    if y.is_infinite() {
        return Err("it is outside float32's range".to_owned());
    }
    Err(format!("float32 cannot hold it exactly (it would become {y})"))
}

/// CSV text as a float: a whole number written as one must be held exactly; a number written
/// with a point or an exponent is stored as the nearest float, unless it overflows or vanishes.
fn text_to_float(s: &str, name: &str) -> Result<f64, String> {
    if is_integer_text(s) {
        let i = s.parse::<i128>().map_err(|_| format!("{name} cannot hold this whole number exactly"))?;
        return exact_float(i, |i| i as f64, |x| x as i128, name);
    }
    let x: f64 = s.parse().map_err(|_| NOT_NUMBER.to_owned())?;
    let written_infinite = || s.trim_start_matches(['+', '-']).get(..3).is_some_and(|i| i.eq_ignore_ascii_case("inf"));
    if x.is_infinite() && !written_infinite() {
        return Err(format!("it is outside {name}'s range"));
    }
    if x == 0.0 && Literal::parse(s).is_some_and(|l| !l.is_zero()) {
        return Err(format!("it is too small for {name} (it would become 0)"));
    }
    Ok(x)
}

/// Whether `s` is a whole number written as one: an optional sign, then only digits.
fn is_integer_text(s: &str) -> bool {
    let digits = s.strip_prefix(['+', '-']).unwrap_or(s);
    !digits.is_empty() && digits.bytes().all(|b| b.is_ascii_digit())
}

fn not_a_float(v: Value<'_>) -> String {
    match v {
        Value::Str(_) => STRING_NOT_NUMBER.to_owned(),
        Value::Bool(_) => BOOL_NOT_NUMBER.to_owned(),
        other => never(other, "a number"),
    }
}

fn to_decimal(v: Value<'_>, precision: u8, scale: i8) -> Result<i128, String> {
    let literal = match v {
        Value::Int(i) => Literal::of_decimal(i, 0),
        Value::Float(x) => Literal::of_float(x).ok_or_else(|| "it is not a finite number".to_owned())?,
        Value::Decimal { unscaled, scale } => Literal::of_decimal(unscaled, scale),
        // Text (CSV's, or a JSON string: JSON has no decimal type) parses strictly.
        Value::Str(s) => Literal::parse(s.trim_ascii()).ok_or_else(|| NOT_NUMBER.to_owned())?,
        Value::Bool(_) => return Err(BOOL_NOT_NUMBER.to_owned()),
        other => return Err(never(other, "a number")),
    };
    let unscaled = literal.scaled(scale)?;
    let limit = 10_i128.checked_pow(u32::from(precision)).unwrap_or(i128::MAX);
    if unscaled.abs() >= limit {
        let before = i32::from(precision) - i32::from(scale);
        return Err(format!("it has more than {before} digits before the decimal point"));
    }
    Ok(unscaled)
}

fn to_bool(v: Value<'_>, spelling: Spelling) -> Result<bool, String> {
    match v {
        Value::Bool(b) => Ok(b),
        Value::Str(s) if spelling == Spelling::Text => {
            let s = s.trim_ascii();
            if s.eq_ignore_ascii_case("true") {
                Ok(true)
            } else if s.eq_ignore_ascii_case("false") {
                Ok(false)
            } else {
                Err("it is neither true nor false".to_owned())
            }
        }
        Value::Str(_) => Err("a string is never read as a boolean; write true or false unquoted".to_owned()),
        Value::Int(_) | Value::Float(_) | Value::Decimal { .. } => {
            Err("a number is never stored as a boolean".to_owned())
        }
        other => Err(never(other, "a boolean")),
    }
}

fn to_days(v: Value<'_>) -> Result<i32, String> {
    const TIME_OF_DAY: &str = "it has a time of day, which a date column would drop";
    let v = match v {
        Value::Str(s) => Value::Str(s.trim_ascii()),
        other => other,
    };
    match v {
        Value::Date(days) => Ok(days),
        Value::Time(count, unit) => {
            let per_day = SECONDS_PER_DAY * per_second(unit);
            if count.rem_euclid(per_day) != 0 {
                return Err(TIME_OF_DAY.to_owned());
            }
            i32::try_from(count.div_euclid(per_day)).map_err(|_| "it is outside a date's range".to_owned())
        }
        Value::Str(s) if s.len() <= 10 || s.starts_with(['+', '-']) => {
            Date32Type::parse(s).ok_or_else(|| "it is not a date (YYYY-MM-DD)".to_owned())
        }
        Value::Str(s) => {
            let t = string_to_datetime(&Utc, s).map_err(|_| "it is not a date (YYYY-MM-DD)".to_owned())?;
            if t.num_seconds_from_midnight() != 0 || t.nanosecond() != 0 {
                return Err(TIME_OF_DAY.to_owned());
            }
            i32::try_from(t.timestamp().div_euclid(SECONDS_PER_DAY))
                .map_err(|_| "it is outside a date's range".to_owned())
        }
        Value::Int(_) | Value::Float(_) | Value::Decimal { .. } => {
            Err("a number is never read as a date; write the date as text (YYYY-MM-DD)".to_owned())
        }
        other => Err(never(other, "a date")),
    }
}

fn to_time(v: Value<'_>, unit: TimeUnit) -> Result<i64, String> {
    match v {
        Value::Time(count, from) => rescale(count, from, unit),
        Value::Date(days) => rescale(i64::from(days) * SECONDS_PER_DAY, TimeUnit::Second, unit),
        Value::Str(s) => text_to_time(s.trim_ascii(), unit),
        Value::Int(_) | Value::Float(_) | Value::Decimal { .. } => {
            Err("a number is never read as a timestamp (its unit and epoch are unknown); write it as text, such as \
             2024-01-01T12:00:00Z"
                .to_owned())
        }
        other => Err(never(other, "a timestamp")),
    }
}

/// Units of `unit` in one second.
fn per_second(unit: TimeUnit) -> i64 {
    match unit {
        TimeUnit::Second => 1,
        TimeUnit::Millisecond => 1_000,
        TimeUnit::Microsecond => 1_000_000,
        TimeUnit::Nanosecond => 1_000_000_000,
    }
}

fn unit_name(unit: TimeUnit) -> &'static str {
    match unit {
        TimeUnit::Second => "second",
        TimeUnit::Millisecond => "millisecond",
        TimeUnit::Microsecond => "microsecond",
        TimeUnit::Nanosecond => "nanosecond",
    }
}

fn below_unit(unit: TimeUnit) -> String {
    let name = unit_name(unit);
    format!(
        "it has digits below the {name}, which a timestamp column (in {name}s) would drop; truncate it in the \
         task (in SQL, date_trunc('{name}', ...))"
    )
}

/// `count` of `from` in `to`, if nothing below `to` is lost.
fn rescale(count: i64, from: TimeUnit, to: TimeUnit) -> Result<i64, String> {
    let (from_n, to_n) = (per_second(from), per_second(to));
    if to_n >= from_n {
        return count.checked_mul(to_n / from_n).ok_or_else(|| "it is outside a timestamp's range".to_owned());
    }
    let factor = from_n / to_n;
    if count % factor != 0 {
        return Err(below_unit(to));
    }
    Ok(count / factor)
}

/// Text as a timestamp in `unit`: RFC 3339 and its usual variants (a space for the `T`, no
/// offset for UTC, a date alone for its midnight), refusing digits below the unit.
fn text_to_time(s: &str, unit: TimeUnit) -> Result<i64, String> {
    let not_a_timestamp = || "it is not a timestamp (RFC 3339, such as 2024-01-01T12:00:00Z)".to_owned();
    let t = string_to_datetime(&Utc, s).map_err(|_| not_a_timestamp())?;
    // The parser reads at most nanoseconds and drops any digit after them.
    let kept = usize::try_from(per_second(unit).ilog10()).unwrap_or(9);
    if fraction_digits(s).bytes().skip(kept).any(|b| b != b'0') {
        return Err(below_unit(unit));
    }
    let nanos = i64::from(t.timestamp_subsec_nanos());
    let seconds = t.timestamp().checked_mul(per_second(unit)).ok_or_else(not_a_timestamp)?;
    Ok(seconds + nanos / (1_000_000_000 / per_second(unit)))
}

/// The digits after the decimal point of a timestamp's seconds, as written.
fn fraction_digits(s: &str) -> &str {
    let time = s.as_bytes().get(10..).unwrap_or_default();
    let Some(point) = time.iter().position(|b| *b == b'.') else { return "" };
    let digits = time[point + 1..].iter().take_while(|b| b.is_ascii_digit()).count();
    // ASCII digits after an ASCII point: a char boundary on both sides.
    s.get(10 + point + 1..10 + point + 1 + digits).unwrap_or_default()
}

/// Why a non-string value does not go into a string column.
fn never_text(v: Value<'_>) -> String {
    let what = match v {
        Value::Int(_) | Value::Float(_) | Value::Decimal { .. } => "a number",
        Value::Bool(_) => "a boolean",
        Value::Date(_) | Value::Time(..) => "a date or time",
        Value::Bytes(_) => "binary data",
        Value::Str(_) => "a string",
    };
    format!("{what} is never turned into text; write it as a string, or declare the column with its type")
}

fn never(v: Value<'_>, into: &str) -> String {
    let what = match v {
        Value::Bool(_) => "a boolean",
        Value::Int(_) | Value::Float(_) | Value::Decimal { .. } => "a number",
        Value::Str(_) => "a string",
        Value::Date(_) => "a date",
        Value::Time(..) => "a timestamp",
        Value::Bytes(_) => "binary data",
    };
    format!("{what} is never stored as {into}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use arrow::array::{Float64Array, Int8Array, Int64Array};

    /// Converts one value of `array` into `to`, as text for the assertion: the stored value, or
    /// `refused: <reason>`.
    fn check(array: ArrayRef, to: DataType, spelling: Spelling) -> String {
        match convert(&array, &to, spelling) {
            Ok(out) => arrow::util::display::array_value_to_string(&out, 0).expect("a value"),
            Err(refusal) => format!("refused: {}", refusal.reason),
        }
    }

    fn text(s: &str) -> ArrayRef {
        Arc::new(StringArray::from(vec![s]))
    }

    #[test]
    fn literals_are_exact_decimals() {
        let parsed = |s: &str| Literal::parse(s).map(|l| l.to_string());
        assert_eq!(parsed("7.0"), Some("7".to_owned()));
        assert_eq!(parsed("-0012.500"), Some("-12.5".to_owned()));
        assert_eq!(parsed("1e3"), Some("1000".to_owned()));
        assert_eq!(parsed("70E-1"), Some("7".to_owned()));
        assert_eq!(parsed(".5"), Some("0.5".to_owned()));
        assert_eq!(parsed("-0.0"), Some("0".to_owned()));
        assert_eq!(parsed("1.2e-5"), Some("0.000012".to_owned()));
        for bad in ["", "-", ".", "1e", "e3", "1.2.3", " 1", "1 ", "inf", "NaN", "0x10", "1_000", "--1"] {
            assert_eq!(parsed(bad), None, "{bad:?}");
        }
        assert_eq!(Literal::parse("7.9").map(|l| l.whole()), Some(Err(NOT_WHOLE.to_owned())));
        assert_eq!(Literal::parse("12.30").map(|l| l.scaled(2)), Some(Ok(1230)));
        assert!(Literal::parse("1.234").is_some_and(|l| l.scaled(2).is_err()));
        assert!(Literal::parse("1e40").is_some_and(|l| l.whole().is_err()));
        // A huge exponent is refused by its digit count, never by computing the power.
        assert!(Literal::parse("1e1000000000").is_some_and(|l| l.whole().is_err() && l.scaled(2).is_err()));
        assert!(Literal::parse("1e-1000000000").is_some_and(|l| l.scaled(2).is_err()));
        assert_eq!(Literal::parse("1e99999999999999999999"), None);
        assert_eq!(Literal::of_decimal(-12_345, 4).to_string(), "-1.2345");
        assert_eq!(Literal::of_float(0.1_f32), Literal::parse("0.1"));
    }

    #[test]
    fn numbers_convert_only_when_nothing_is_lost() {
        let floats = |x: f64| -> ArrayRef { Arc::new(Float64Array::from(vec![x])) };
        let ints = |i: i64| -> ArrayRef { Arc::new(Int64Array::from(vec![i])) };
        let typed = Spelling::Typed;
        assert_eq!(check(floats(7.0), DataType::Int64, typed), "7");
        assert_eq!(check(floats(7.9), DataType::Int64, typed), "refused: it is not a whole number");
        assert!(check(floats(9_007_199_254_740_992.0), DataType::Int64, typed).starts_with("refused: from 2^53"));
        assert_eq!(check(ints(2_147_483_648), DataType::Int32, typed), "refused: it is outside int32's range");
        assert_eq!(check(ints(1 << 53), DataType::Float64, typed), "9007199254740992.0");
        assert!(check(ints((1 << 53) + 1), DataType::Float64, typed).starts_with("refused: float64 cannot hold"));
        assert_eq!(check(floats(0.1), DataType::Float32, typed), "0.1");
        assert!(check(floats(16_777_217.0), DataType::Float32, typed).contains("16777216"));
        assert!(check(floats(1e300), DataType::Float32, typed).contains("range"));
        assert_eq!(check(floats(f64::NAN), DataType::Float32, typed), "NaN");
        assert_eq!(check(floats(12.5), DataType::Decimal128(10, 2), typed), "12.50");
        assert!(check(floats(0.125), DataType::Decimal128(10, 2), typed).contains("2 decimal places"));
        assert!(check(ints(123_456_789), DataType::Decimal128(10, 2), typed).contains("8 digits before"));
        assert!(check(ints(1), DataType::Boolean, typed).starts_with("refused: a number is never"));
        assert!(check(ints(1), DataType::Utf8, typed).starts_with("refused: a number is never turned into text"));
        assert!(check(text("7"), DataType::Int64, typed).starts_with("refused: a string is never read as a number"));
    }

    #[test]
    fn text_parses_strictly() {
        let csv = |s: &str, to: DataType| check(text(s), to, Spelling::Text);
        assert_eq!(csv("1e3", DataType::Int32), "1000");
        assert_eq!(csv("7.0", DataType::Int64), "7");
        assert_eq!(csv("1.5", DataType::Int64), "refused: it is not a whole number");
        assert_eq!(csv("abc", DataType::Int64), "refused: it is not a number");
        // Spaces around a value are not part of it.
        assert_eq!(csv(" 12 ", DataType::Int64), "12");
        assert_eq!(csv(" 1.5", DataType::Float64), "1.5");
        assert_eq!(csv(" true", DataType::Boolean), "true");
        assert_eq!(csv("2024-01-01 ", DataType::Date32), "2024-01-01");
        assert_eq!(csv("1 2", DataType::Int64), "refused: it is not a number");
        assert_eq!(csv("99999999999999999999", DataType::Int64), "refused: it is outside int64's range");
        assert_eq!(csv("-0.1", DataType::Float64), "-0.1");
        assert_eq!(csv("inf", DataType::Float64), "inf");
        assert_eq!(csv("1e400", DataType::Float64), "refused: it is outside float64's range");
        assert!(csv("1e-400", DataType::Float64).contains("too small"));
        assert!(csv("12345678901234567891", DataType::Float64).starts_with("refused: float64 cannot hold"));
        assert_eq!(csv("TRUE", DataType::Boolean), "true");
        assert_eq!(csv("1", DataType::Boolean), "refused: it is neither true nor false");
        assert_eq!(csv("2024-02-29", DataType::Date32), "2024-02-29");
        assert!(csv("2024-02-30", DataType::Date32).starts_with("refused: it is not a date"));
        assert!(csv("2024-01-01T12:00:00", DataType::Date32).contains("time of day"));
        assert_eq!(csv("2024-01-01T00:00:00Z", DataType::Date32), "2024-01-01");
        let micros = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        assert_eq!(csv("2024-01-01T12:00:00.123456Z", micros.clone()), "2024-01-01T12:00:00.123456Z");
        assert_eq!(csv("2024-01-01T12:00:00.123456000Z", micros.clone()), "2024-01-01T12:00:00.123456Z");
        assert!(csv("2024-01-01T12:00:00.1234567Z", micros.clone()).contains("below the microsecond"));
        assert!(csv("2024-01-01T12:00:00.1234560001Z", micros.clone()).contains("below the microsecond"));
        assert_eq!(csv("2024-01-01 01:00:00+01:00", micros.clone()), "2024-01-01T00:00:00Z");
        assert_eq!(csv("2024-01-01", micros), "2024-01-01T00:00:00Z");
        assert_eq!(check(text("0.01"), DataType::Decimal128(10, 2), Spelling::Typed), "0.01");
    }

    /// Whenever the vectorised path answers, it answers what the rules do, value for value.
    #[test]
    fn the_fast_path_agrees_with_the_rules() {
        use arrow::array::{Float32Array, Int32Array, UInt64Array};
        let strings = |v: &[Option<&str>]| -> ArrayRef { Arc::new(StringArray::from(v.to_vec())) };
        let micros = DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into()));
        let cases: Vec<(ArrayRef, DataType, Spelling)> = vec![
            (Arc::new(Int64Array::from(vec![Some(1), None, Some(-2_147_483_648)])), DataType::Int32, Spelling::Typed),
            (Arc::new(Int64Array::from(vec![2_147_483_648])), DataType::Int32, Spelling::Typed),
            (Arc::new(Int32Array::from(vec![7, -7])), DataType::Int64, Spelling::Typed),
            (Arc::new(UInt64Array::from(vec![u64::MAX])), DataType::Int64, Spelling::Typed),
            (Arc::new(Int64Array::from(vec![(1 << 53) - 1, 3])), DataType::Float64, Spelling::Typed),
            (Arc::new(Int64Array::from(vec![(1 << 53) + 1])), DataType::Float64, Spelling::Typed),
            (Arc::new(Float64Array::from(vec![Some(7.0), None, Some(-3.0)])), DataType::Int64, Spelling::Typed),
            (Arc::new(Float64Array::from(vec![7.9])), DataType::Int64, Spelling::Typed),
            (Arc::new(Float32Array::from(vec![1.5])), DataType::Int32, Spelling::Typed),
            (strings(&[Some("12"), None, Some("+5"), Some("-0")]), DataType::Int64, Spelling::Text),
            (strings(&[Some("1.0"), Some("1e3")]), DataType::Int64, Spelling::Text),
            (strings(&[Some(" 12"), Some("12 "), Some("\t-3\n"), Some("1 2")]), DataType::Int64, Spelling::Text),
            (strings(&[Some(" 1.5"), Some("2.5 ")]), DataType::Float64, Spelling::Text),
            (strings(&[Some(" 2024-01-01")]), DataType::Date32, Spelling::Text),
            (
                strings(&[Some(" 2024-01-01T00:00:00Z")]),
                DataType::Timestamp(TimeUnit::Microsecond, None),
                Spelling::Text,
            ),
            (strings(&[Some("12")]), DataType::Int64, Spelling::Typed),
            (
                strings(&[Some("0.1"), Some("-2.5e3"), Some("0"), Some("0.0e5"), None, Some("7")]),
                DataType::Float64,
                Spelling::Text,
            ),
            (strings(&[Some("1e-400"), Some("1e400"), Some("inf"), Some("NaN")]), DataType::Float64, Spelling::Text),
            (strings(&[Some("12345678901234567891")]), DataType::Float64, Spelling::Text),
            (strings(&[Some("2024-02-29"), None]), DataType::Date32, Spelling::Text),
            (strings(&[Some("2024-02-30")]), DataType::Date32, Spelling::Typed),
            (strings(&[Some("2024-01-01T12:00:00")]), DataType::Date32, Spelling::Text),
            (
                strings(&[Some("2024-01-01T12:00:00.123456Z"), Some("2024-01-01 01:00:00+01:00"), Some("2024-01-01")]),
                micros.clone(),
                Spelling::Text,
            ),
            (strings(&[Some("2024-01-01T12:00:00.1234567Z")]), micros.clone(), Spelling::Typed),
            (strings(&[Some("3000-01-01T00:00:00Z")]), micros, Spelling::Text),
        ];
        for (array, to, spelling) in cases {
            let rules = by_value(&array, &to, spelling);
            if let Some(fast) = fast::convert(&array, &to, spelling) {
                assert_eq!(rules.as_ref().ok(), Some(&fast), "{array:?} into {to}");
            }
            assert_eq!(convert(&array, &to, spelling), rules, "{array:?} into {to}");
        }
    }

    #[test]
    fn dictionaries_convert_as_their_values_and_other_types_are_named() {
        use arrow::array::{DictionaryArray, DurationSecondArray, Int32Array};
        use arrow::datatypes::Int8Type as Key;
        let categories: DictionaryArray<Key> = vec!["a", "b", "a"].into_iter().collect();
        let categories: ArrayRef = Arc::new(categories);
        let plain = convert(&categories, &DataType::Utf8, Spelling::Typed).expect("strings");
        assert_eq!(plain.as_string::<i32>().iter().collect::<Vec<_>>(), [Some("a"), Some("b"), Some("a")]);
        let keys = Int8Array::from(vec![0, 1]);
        let numbers = DictionaryArray::new(keys, Arc::new(Int32Array::from(vec![7, 2_000_000])));
        let refusal = convert(&(Arc::new(numbers) as ArrayRef), &DataType::Int8, Spelling::Typed).expect_err("too big");
        assert_eq!((refusal.row, refusal.reason.as_str()), (1, "it is outside int8's range"));
        let durations: ArrayRef = Arc::new(DurationSecondArray::from(vec![5]));
        let refusal = convert(&durations, &DataType::Int64, Spelling::Typed).expect_err("a duration");
        assert!(refusal.reason.starts_with("a value of this type is never stored"), "{}", refusal.reason);
        assert!(refusal.value.contains("Duration"), "{}", refusal.value);
    }

    #[test]
    fn a_refusal_names_the_first_row_that_does_not_fit() {
        let array: ArrayRef = Arc::new(Float64Array::from(vec![Some(1.0), None, Some(2.0), Some(2.5), Some(3.5)]));
        let refusal = convert(&array, &DataType::Int64, Spelling::Typed).expect_err("2.5 is not whole");
        assert_eq!((refusal.row, refusal.value.as_str()), (3, "2.5 (float64)"));
        let all_null: ArrayRef = Arc::new(Float64Array::from(vec![None, None]));
        assert_eq!(convert(&all_null, &DataType::Boolean, Spelling::Typed).expect("nulls convert").null_count(), 2);
        let null_type: ArrayRef = Arc::new(arrow::array::NullArray::new(2));
        assert_eq!(convert(&null_type, &DataType::Int64, Spelling::Typed).expect("nulls convert").null_count(), 2);
        let words: ArrayRef = Arc::new(StringArray::from(vec!["a".repeat(100)]));
        let refusal = convert(&words, &DataType::Int64, Spelling::Text).expect_err("not a number");
        assert_eq!(refusal.value, format!("\"{}...\"", "a".repeat(SHOWN_TEXT_CHARS)));
    }
}
