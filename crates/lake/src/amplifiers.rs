//! Functions whose output can be far larger than their input (`repeat`, `lpad`, `rpad`,
//! `replace`, `regexp_replace`, `array_repeat`, the list-building `range` and `generate_series`),
//! bounded in a user session. Each call first estimates the bytes it would build for its batch
//! and refuses, as over the memory limit, what the query's memory pool cannot hold; and none is
//! folded into a constant while planning, where one huge value would later be copied once per
//! row past what Arrow holds (`tidegate sql "SELECT count(*) FROM (SELECT repeat('x', 1e8) FROM
//! generate_series(1, 30))"` once built 3 GB and panicked with "offset overflow").

use std::sync::Arc;

use arrow::array::{Array, ArrayRef, AsArray as _};
use arrow::compute::cast;
use arrow::datatypes::{DataType, FieldRef, Int64Type};
use datafusion::common::Result as DfResult;
use datafusion::error::DataFusionError;
use datafusion::execution::memory_pool::MemoryPool;
use datafusion::logical_expr::registry::FunctionRegistry as _;
use datafusion::logical_expr::{
    ColumnarValue, Documentation, ReturnFieldArgs, ScalarFunctionArgs, ScalarUDF, ScalarUDFImpl, Signature, Volatility,
};
use datafusion::prelude::SessionContext;

/// What begins the message of a call refused by its estimate, so [`what_of`] finds it.
const REFUSED: &str = "tidegate: ";

/// The bounded functions and how each estimates the bytes it builds.
const AMPLIFIERS: &[(&str, Estimate)] = &[
    ("repeat", Estimate::Repeat),
    ("lpad", Estimate::Padded),
    ("rpad", Estimate::Padded),
    ("replace", Estimate::Replaced),
    ("regexp_replace", Estimate::RegexpReplaced),
    ("array_repeat", Estimate::ArrayRepeated),
    ("range", Estimate::Ranged),
    ("generate_series", Estimate::Ranged),
];

/// How a function's output size follows from its arguments.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
enum Estimate {
    Repeat,
    Padded,
    Replaced,
    RegexpReplaced,
    ArrayRepeated,
    Ranged,
}

impl Estimate {
    /// The bytes a call would build from `args` for a batch of `n_rows` rows.
    fn bytes(self, args: &[ColumnarValue], n_rows: usize) -> DfResult<u64> {
        match self {
            Estimate::Repeat => repeat(args, n_rows),
            Estimate::Padded => padded(args, n_rows),
            Estimate::Replaced => replaced(args, n_rows),
            Estimate::RegexpReplaced => regexp_replaced(args, n_rows),
            Estimate::ArrayRepeated => array_repeated(args, n_rows),
            Estimate::Ranged => ranged(args, n_rows),
        }
    }
}

/// Replaces the session's amplifying functions with bounded ones, checked against `pool`, which
/// holds at most `limit_bytes`.
pub(crate) fn bound(ctx: &SessionContext, pool: Arc<dyn MemoryPool>, limit_bytes: u64) {
    for (name, estimate) in AMPLIFIERS {
        // A function this DataFusion build lacks needs no bound.
        let Ok(inner) = ctx.udf(name) else { continue };
        let signature = Signature { volatility: Volatility::Volatile, ..inner.signature().clone() };
        let bounded =
            Bounded { inner: (*inner).clone(), signature, pool: Pool(pool.clone()), limit_bytes, estimate: *estimate };
        ctx.register_udf(ScalarUDF::new_from_impl(bounded));
    }
}

/// `repeat (2.8 GiB for one batch of 30 rows)` from a refusal's message, for the error that names
/// what went over the memory limit.
pub(crate) fn what_of(message: &str) -> Option<String> {
    let at = message.find(REFUSED)?;
    Some(message[at + REFUSED.len()..].to_owned())
}

/// The query's memory pool, compared by identity (a UDF must be comparable and hashable).
#[derive(Debug, Clone)]
struct Pool(Arc<dyn MemoryPool>);

impl PartialEq for Pool {
    fn eq(&self, other: &Self) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Eq for Pool {}

impl std::hash::Hash for Pool {
    fn hash<H: std::hash::Hasher>(&self, state: &mut H) {
        std::ptr::hash(Arc::as_ptr(&self.0).cast::<()>(), state);
    }
}

/// A function that refuses a call whose estimated output the pool cannot hold; otherwise the
/// function itself. Volatile, so never folded into a constant while planning.
#[derive(Debug, PartialEq, Eq, Hash)]
struct Bounded {
    inner: ScalarUDF,
    signature: Signature,
    pool: Pool,
    limit_bytes: u64,
    estimate: Estimate,
}

impl Bounded {
    fn check(&self, args: &ScalarFunctionArgs) -> DfResult<()> {
        let estimate = self.estimate.bytes(&args.args, args.number_rows)?;
        let held = self.pool.0.reserved() as u64;
        if held.saturating_add(estimate) > self.limit_bytes {
            let in_use = if held > 0 { format!(", with {} of the limit in use", size(held)) } else { String::new() };
            return Err(DataFusionError::ResourcesExhausted(format!(
                "{REFUSED}{} ({} for one batch of {} rows{in_use})",
                self.inner.name(),
                size(estimate),
                args.number_rows
            )));
        }
        Ok(())
    }
}

impl ScalarUDFImpl for Bounded {
    fn name(&self) -> &str {
        self.inner.name()
    }

    fn aliases(&self) -> &[String] {
        self.inner.aliases()
    }

    fn signature(&self) -> &Signature {
        &self.signature
    }

    fn return_type(&self, arg_types: &[DataType]) -> DfResult<DataType> {
        self.inner.return_type(arg_types)
    }

    fn return_field_from_args(&self, args: ReturnFieldArgs) -> DfResult<FieldRef> {
        self.inner.return_field_from_args(args)
    }

    fn coerce_types(&self, arg_types: &[DataType]) -> DfResult<Vec<DataType>> {
        self.inner.coerce_types(arg_types)
    }

    fn invoke_with_args(&self, args: ScalarFunctionArgs) -> DfResult<ColumnarValue> {
        self.check(&args)?;
        self.inner.invoke_with_args(args)
    }

    fn documentation(&self) -> Option<&Documentation> {
        self.inner.documentation()
    }
}

/// `2.8 GiB`, `512.0 MiB`.
fn size(bytes: u64) -> String {
    #[allow(clippy::cast_precision_loss, reason = "a size in a message")]
    let b = bytes as f64;
    if b >= 1024.0 * 1024.0 * 1024.0 {
        format!("{:.1} GiB", b / 1073741824.0)
    } else {
        format!("{:.1} MiB", b / 1048576.0)
    }
}

/// One number per row: the same for every row (a scalar argument) or one each.
enum PerRow {
    Same(u64),
    Each(Vec<u64>),
}

impl PerRow {
    fn at(&self, row: usize) -> u64 {
        match self {
            PerRow::Same(v) => *v,
            PerRow::Each(values) => values.get(row).copied().unwrap_or_default(),
        }
    }
}

/// `arg` as an array (a scalar as one row).
fn array_of(arg: &ColumnarValue) -> DfResult<(ArrayRef, bool)> {
    Ok(match arg {
        ColumnarValue::Array(a) => (a.clone(), false),
        ColumnarValue::Scalar(s) => (s.to_array_of_size(1)?, true),
    })
}

/// Each value's length in bytes (null, or a type without lengths, as 0: an estimate it cannot
/// make never fails the query).
fn lengths(arg: &ColumnarValue) -> DfResult<PerRow> {
    let (array, scalar) = array_of(arg)?;
    let Ok(lengths) = arrow::compute::kernels::length::length(&array) else { return Ok(PerRow::Same(0)) };
    let lengths = cast(&lengths, &DataType::Int64)?;
    let values: Vec<u64> =
        lengths.as_primitive::<Int64Type>().iter().map(|v| v.unwrap_or(0).max(0).unsigned_abs()).collect();
    Ok(if scalar { PerRow::Same(values.first().copied().unwrap_or(0)) } else { PerRow::Each(values) })
}

/// Each value as a count (null, negative or not a number as 0).
fn numbers(arg: &ColumnarValue) -> DfResult<PerRow> {
    let (array, scalar) = array_of(arg)?;
    let Ok(ints) = cast(&array, &DataType::Int64) else { return Ok(PerRow::Same(0)) };
    let values: Vec<u64> =
        ints.as_primitive::<Int64Type>().iter().map(|v| v.unwrap_or(0).max(0).unsigned_abs()).collect();
    Ok(if scalar { PerRow::Same(values.first().copied().unwrap_or(0)) } else { PerRow::Each(values) })
}

/// The sum over `n_rows` rows of `f(row)`, saturating.
fn total(n_rows: usize, f: impl Fn(usize) -> u64) -> u64 {
    (0..n_rows).fold(0_u64, |sum, row| sum.saturating_add(f(row)))
}

/// `repeat(text, n)`: each text `n` times.
fn repeat(args: &[ColumnarValue], n_rows: usize) -> DfResult<u64> {
    let [text, n, ..] = args else { return Ok(0) };
    let (text, n) = (lengths(text)?, numbers(n)?);
    Ok(total(n_rows, |r| text.at(r).saturating_mul(n.at(r))))
}

/// `lpad(text, n[, fill])`, `rpad`: `n` characters, a byte each at least.
fn padded(args: &[ColumnarValue], n_rows: usize) -> DfResult<u64> {
    let [_, n, ..] = args else { return Ok(0) };
    let n = numbers(n)?;
    Ok(total(n_rows, |r| n.at(r)))
}

/// `replace(text, from, to)`: at most every `from` becomes `to`.
fn replaced(args: &[ColumnarValue], n_rows: usize) -> DfResult<u64> {
    let [text, from, to, ..] = args else { return Ok(0) };
    let (text, from, to) = (lengths(text)?, lengths(from)?, lengths(to)?);
    Ok(total(n_rows, |r| {
        let occurrences = text.at(r) / from.at(r).max(1) + 1;
        text.at(r).saturating_add(occurrences.saturating_mul(to.at(r)))
    }))
}

/// `regexp_replace(text, pattern, replacement[, flags])`: at most a replacement at every position.
fn regexp_replaced(args: &[ColumnarValue], n_rows: usize) -> DfResult<u64> {
    let [text, _, replacement, ..] = args else { return Ok(0) };
    let (text, replacement) = (lengths(text)?, lengths(replacement)?);
    Ok(total(n_rows, |r| text.at(r).saturating_add((text.at(r) + 1).saturating_mul(replacement.at(r)))))
}

/// `array_repeat(element, n)`: `n` elements of at least 8 bytes, or of the element's own size.
fn array_repeated(args: &[ColumnarValue], n_rows: usize) -> DfResult<u64> {
    let [element, n, ..] = args else { return Ok(0) };
    let (array, _) = array_of(element)?;
    let per_element = (array.get_array_memory_size() / array.len().max(1)).max(8) as u64;
    let n = numbers(n)?;
    Ok(total(n_rows, |r| n.at(r).saturating_mul(per_element)))
}

/// `range(start, stop[, step])` as a list of integers: 8 bytes an element (other kinds of
/// ranges, of dates, are not estimated).
fn ranged(args: &[ColumnarValue], n_rows: usize) -> DfResult<u64> {
    let integers = |a: &ColumnarValue| a.data_type().is_integer();
    let (start, stop, step) = match args {
        [stop] if integers(stop) => (None, stop, None),
        [start, stop] if integers(start) && integers(stop) => (Some(start), stop, None),
        [start, stop, step] if [start, stop, step].iter().all(|a| integers(a)) => (Some(start), stop, Some(step)),
        _ => return Ok(0),
    };
    let signed = |a: &ColumnarValue| -> DfResult<Vec<Option<i64>>> {
        let (array, scalar) = array_of(a)?;
        let ints = cast(&array, &DataType::Int64)?;
        let values: Vec<Option<i64>> = ints.as_primitive::<Int64Type>().iter().collect();
        Ok(if scalar { vec![values.first().copied().flatten(); n_rows] } else { values })
    };
    let (starts, stops) = (start.map(signed).transpose()?, signed(stop)?);
    let steps = step.map(signed).transpose()?;
    Ok(total(n_rows, |r| {
        let from = starts.as_ref().and_then(|s| s.get(r).copied().flatten()).unwrap_or(0);
        let to = stops.get(r).copied().flatten().unwrap_or(0);
        let by = steps.as_ref().and_then(|s| s.get(r).copied().flatten()).unwrap_or(1).unsigned_abs().max(1);
        let n = (i128::from(to) - i128::from(from)).unsigned_abs() / u128::from(by) + 1;
        u64::try_from(n).unwrap_or(u64::MAX).saturating_mul(8)
    }))
}
