//! The columns of a backfill comparison and the SQL that follows from them: how each column's
//! published and staged values are compared (in a type that holds both, never the old type), the
//! `changes` view, the statistics, the slices and the samples.

use std::collections::BTreeMap;

use arrow::datatypes::{DataType, SchemaRef};
use datafusion::prelude::SessionContext;
use serde_json::Value;

use super::{ColumnDelta, CompareSpec, PartitionComparison, Side, SliceDelta, counts, numbers, texts};
use crate::df;
use crate::error::{Error, FileLocation, Result};

/// The most values of one slice column reported per partition (re-exported as
/// [`super::MAX_SLICE_VALUES`]).
const MAX_SLICE_VALUES: usize = super::MAX_SLICE_VALUES;

/// How one column's published and staged values are compared.
#[derive(Debug, Clone, PartialEq)]
enum Compared {
    /// As they are: both sides have this type (or only one side has the column).
    Native,
    /// Both cast to this type, which holds every value of either side's type.
    As(DataType),
    /// As the text of their exact value: an integer and a float that no Arrow type holds both
    /// of (int64 and float64). `1` and `1.0` read `1`; 2^53 + 1 and the float nearest it differ.
    NumberText,
    /// As text: types with nothing else in common (a string and a number).
    Text,
}

/// One compared column.
#[derive(Debug, Clone)]
pub(super) struct Column {
    pub(super) name: String,
    /// Its type in the published version; `None` when it was not there (read as null).
    before: Option<DataType>,
    /// Its type in the staged rows; `None` when they lack it (read as null).
    after: Option<DataType>,
    compared: Compared,
}

impl Column {
    fn new(name: &str, before: Option<&DataType>, after: Option<&DataType>) -> Column {
        let compared = match (before, after) {
            (Some(b), Some(a)) if b == a => Compared::Native,
            (Some(b), Some(a)) if holds(a, b) => Compared::As(a.clone()),
            (Some(b), Some(a)) if holds(b, a) => Compared::As(b.clone()),
            (Some(b), Some(a)) if b.is_numeric() && a.is_numeric() => Compared::NumberText,
            (Some(_), Some(_)) => Compared::Text,
            _ => Compared::Native,
        };
        Column { name: name.to_owned(), before: before.cloned(), after: after.cloned(), compared }
    }

    /// Whether both sides are numbers (sums, means and the like are reported).
    fn numeric(&self) -> bool {
        let mut types = self.before.iter().chain(&self.after);
        types.clone().next().is_some() && types.all(DataType::is_numeric)
    }

    /// The side's own type of the column; a side without it reads nulls of the other's type.
    fn own(&self, side: Side) -> &DataType {
        let (this, other) = match side {
            Side::Before => (&self.before, &self.after),
            Side::After => (&self.after, &self.before),
        };
        this.as_ref().or(other.as_ref()).unwrap_or(&DataType::Null)
    }

    /// `int64 -> float64` when the staged type differs from the published one.
    fn type_change(&self) -> Option<String> {
        match (&self.before, &self.after) {
            (Some(b), Some(a)) if b != a => {
                Some(format!("{} -> {}", crate::evolution::type_name(b), crate::evolution::type_name(a)))
            }
            _ => None,
        }
    }

    /// Whether the changes view also carries the side's own values (the compared ones are not).
    fn carries_own(&self) -> bool {
        self.compared != Compared::Native
    }

    /// The side's projection of the column in its own type: the column, or a typed null.
    fn projected(&self, side: Side) -> String {
        let c = df::ident(&self.name);
        let present = match side {
            Side::Before => self.before.is_some(),
            Side::After => self.after.is_some(),
        };
        if present { c } else { format!("{} AS {c}", typed_null(self.own(side))) }
    }

    /// The side's value of the column as it is compared (in the comparison's type).
    fn compared(&self, side: Side) -> String {
        let c = df::ident(&self.name);
        match &self.compared {
            Compared::Native => c,
            Compared::As(t) if t == self.own(side) => c,
            Compared::As(t) => format!("arrow_cast({c}, {})", df::literal(&t.to_string())),
            Compared::NumberText
                if matches!(self.own(side), DataType::Float16 | DataType::Float32 | DataType::Float64) =>
            {
                // An integral float in the int64 range reads as that integer; others as they print.
                format!(
                    "CASE WHEN {c} = trunc({c}) AND {c} >= -9223372036854775808.0 AND {c} < 9223372036854775808.0 \
                       THEN CAST(CAST({c} AS BIGINT) AS VARCHAR) ELSE CAST({c} AS VARCHAR) END"
                )
            }
            Compared::NumberText | Compared::Text => format!("CAST({c} AS VARCHAR)"),
        }
    }
}

/// A null of `data_type`, for a side that lacks a column.
fn typed_null(data_type: &DataType) -> String {
    format!("arrow_cast(NULL, {})", df::literal(&data_type.to_string()))
}

/// Whether every value of `narrow` is exactly a value of `wide` (so both compare in `wide`).
pub(super) fn holds(wide: &DataType, narrow: &DataType) -> bool {
    use DataType::{
        Date32, Decimal128, Float16, Float32, Float64, Int8, Int16, Int32, Int64, LargeUtf8, Timestamp, UInt8, UInt16,
        UInt32, Utf8, Utf8View,
    };
    let digits = |t: &DataType| match t {
        Int8 | UInt8 => Some(3),
        Int16 | UInt16 => Some(5),
        Int32 | UInt32 => Some(10),
        Int64 => Some(19),
        _ => None,
    };
    match (narrow, wide) {
        (n, w) if n == w => true,
        (Int8 | UInt8, Int16 | Int32 | Int64 | Float32 | Float64) => true,
        (Int16 | UInt16, Int32 | Int64 | Float32 | Float64) => true,
        (Int32 | UInt32, Int64 | Float64) => true,
        (Float16, Float32 | Float64) | (Float32, Float64) => true,
        (Date32, Timestamp(..)) => true,
        (Utf8 | LargeUtf8 | Utf8View, Utf8 | LargeUtf8 | Utf8View) => true,
        (Decimal128(p, s), Decimal128(wp, ws)) => {
            ws >= s && i16::from(*wp) - i16::from(*ws) >= i16::from(*p) - i16::from(*s)
        }
        (int, Decimal128(p, s)) => digits(int).is_some_and(|d| i16::from(*p) - i16::from(*s) >= d),
        _ => false,
    }
}

/// The columns of a comparison and the SQL that follows from them. In the `changes` view, column
/// `i` of `columns` appears as `b{i}` (its published value) and `a{i}` (its staged value), both in
/// the type it is compared in, and, when that is not either side's own type, also as `bv{i}` and
/// `av{i}` (each side's own value, for the samples).
#[derive(Debug)]
pub(super) struct Layout {
    /// Every column but the partition column, sorted by name.
    pub(super) columns: Vec<Column>,
    keys: Vec<String>,
    pub(super) slices: Vec<String>,
    /// The partition column's name.
    partition: String,
}

impl Layout {
    /// The columns of `table` (the dataset's latest schema) and of `after` (the staged rows'),
    /// with their types in `before` (the published version's; `None`: nothing published) and
    /// `after`. A column on neither side cannot differ and is left out.
    pub(super) fn new(
        dataset: &str,
        table: &SchemaRef,
        before: Option<&SchemaRef>,
        after: &SchemaRef,
        spec: &CompareSpec<'_>,
        partition: &str,
    ) -> Result<Layout> {
        let type_in = |schema: Option<&SchemaRef>, name: &str| {
            schema.and_then(|s| s.field_with_name(name).ok()).map(|f| f.data_type().clone())
        };
        let mut columns: Vec<Column> = Vec::new();
        for field in table.fields().iter().chain(after.fields().iter()) {
            let name = field.name();
            if name == partition || columns.iter().any(|c| &c.name == name) {
                continue;
            }
            let (b, a) = (type_in(before, name), type_in(Some(after), name));
            if b.is_some() || a.is_some() {
                columns.push(Column::new(name, b.as_ref(), a.as_ref()));
            }
        }
        columns.sort_by(|x, y| x.name.cmp(&y.name));
        for (name, role) in spec
            .keys
            .iter()
            .map(|k| (k, "a comparison key"))
            .chain(spec.slice_columns.iter().map(|s| (s, "a slice column")))
        {
            if name == partition || !columns.iter().any(|c| &c.name == name) {
                return Err(Error::SchemaMismatch {
                    dataset: dataset.to_owned(),
                    location: FileLocation::Table,
                    column: name.clone(),
                    detail: format!("named as {role} but not a column of the dataset"),
                });
            }
        }
        let mut slices = spec.slice_columns.to_vec();
        slices.sort();
        slices.dedup();
        Ok(Layout { columns, keys: spec.keys.to_vec(), slices, partition: partition.to_owned() })
    }

    fn idx(&self, name: &str) -> usize {
        self.columns.iter().position(|c| c.name == name).expect("validated column names are in the layout")
    }

    fn is_key(&self, name: &str) -> bool {
        self.keys.iter().any(|k| k == name)
    }

    /// The columns whose statistics are reported: all but the keys.
    fn measured(&self) -> impl Iterator<Item = &Column> {
        self.columns.iter().filter(|c| !self.is_key(&c.name))
    }

    /// One side's rows of `from` (which has that side's own columns) with every column of the
    /// layout, a missing one as a typed null, and the partition column.
    pub(super) fn side_sql(&self, side: Side, from: &str) -> String {
        let mut select: Vec<String> = self.columns.iter().map(|c| c.projected(side)).collect();
        select.push(df::ident(&self.partition));
        format!("SELECT {} FROM {from}", select.join(", "))
    }

    /// A partition with no rows on either side yet.
    pub(super) fn empty(&self, partition: &str) -> PartitionComparison {
        let columns = self
            .measured()
            .map(|c| ColumnDelta {
                column: c.name.clone(),
                type_change: c.type_change(),
                sum_before: None,
                sum_after: None,
                min_before: None,
                min_after: None,
                max_before: None,
                max_after: None,
                mean_before: None,
                mean_after: None,
                null_rate_before: 0.0,
                null_rate_after: 0.0,
            })
            .collect();
        PartitionComparison {
            partition: partition.to_owned(),
            rows_before: 0,
            rows_after: 0,
            n_added: 0,
            n_removed: 0,
            n_changed: 0,
            columns,
            slices: Vec::new(),
            sample_changed: Vec::new(),
            sample_added: Vec::new(),
            sample_removed: Vec::new(),
            flagged: Vec::new(),
        }
    }

    /// One side of `from` (`published` or `staged`) as `(p, c0, c1, ..., v{i}...)`: each column
    /// renamed `c{i}` (so any name works below) in the type it is compared in, and its own value
    /// as `v{i}` where that differs.
    fn renamed(&self, side: Side, from: &str) -> String {
        let mut select = vec![format!("{} AS \"p\"", df::ident(&self.partition))];
        for (i, c) in self.columns.iter().enumerate() {
            select.push(format!("{} AS \"c{i}\"", c.compared(side)));
            if c.carries_own() {
                select.push(format!("{} AS \"v{i}\"", df::ident(&c.name)));
            }
        }
        format!("SELECT {} FROM {from}", select.join(", "))
    }

    /// Every differing row as `(p, status, n, b0, a0, b1, a1, ...)`, `status` being `added`,
    /// `removed` or `changed` and `n` how many rows it stands for. With keys, rows are matched
    /// by partition and key; without, identical rows are grouped and their counts compared.
    pub(super) fn changes_sql(&self) -> String {
        let mut sides: Vec<String> = Vec::new();
        for (i, c) in self.columns.iter().enumerate() {
            sides.push(format!("b.\"c{i}\" AS b{i}, a.\"c{i}\" AS a{i}"));
            if c.carries_own() {
                sides.push(format!("b.\"v{i}\" AS bv{i}, a.\"v{i}\" AS av{i}"));
            }
        }
        let sides = sides.join(", ");
        let matched = |names: &mut dyn Iterator<Item = String>| {
            let mut on = vec!["(b.\"p\" IS NOT DISTINCT FROM a.\"p\")".to_owned()];
            on.extend(names.map(|c| format!("(b.{c} IS NOT DISTINCT FROM a.{c})")));
            // Every condition is IS NOT DISTINCT FROM, so DataFusion plans a hash join that
            // matches null keys instead of a nested loop. The parentheses are needed: the parser
            // binds `x IS NOT DISTINCT FROM y AND z` as `x IS NOT DISTINCT FROM (y AND z)`.
            on.join(" AND ")
        };
        if self.keys.is_empty() {
            let all: Vec<String> = (0..self.columns.len()).map(|i| format!("\"c{i}\"")).collect();
            // A side's own values of one group compare equal; the smallest stands for them.
            let own: Vec<String> = (0..self.columns.len())
                .filter(|i| self.columns[*i].carries_own())
                .map(|i| format!(", min(\"v{i}\") AS \"v{i}\""))
                .collect();
            let grouped = |side: Side, from: &str| {
                format!(
                    "(SELECT \"p\", {cols}{own}, count(*) AS \"n\" FROM ({renamed}) GROUP BY \"p\", {cols})",
                    cols = all.join(", "),
                    own = own.concat(),
                    renamed = self.renamed(side, from),
                )
            };
            let on = matched(&mut all.iter().cloned());
            format!(
                "SELECT CAST(coalesce(a.\"p\", b.\"p\") AS VARCHAR) AS p, \
                   CASE WHEN coalesce(a.\"n\", 0) > coalesce(b.\"n\", 0) THEN 'added' ELSE 'removed' END AS status, \
                   CASE WHEN coalesce(a.\"n\", 0) > coalesce(b.\"n\", 0) \
                     THEN coalesce(a.\"n\", 0) - coalesce(b.\"n\", 0) \
                     ELSE coalesce(b.\"n\", 0) - coalesce(a.\"n\", 0) END AS n, \
                   {sides} \
                 FROM {b} b FULL JOIN {a} a ON {on} \
                 WHERE coalesce(a.\"n\", 0) <> coalesce(b.\"n\", 0)",
                b = grouped(Side::Before, "published"),
                a = grouped(Side::After, "staged"),
            )
        } else {
            let side =
                |side: Side, from: &str| format!("(SELECT *, true AS \"in\" FROM ({}))", self.renamed(side, from));
            let on = matched(&mut self.keys.iter().map(|k| format!("\"c{}\"", self.idx(k))));
            let differs: Vec<String> = (0..self.columns.len())
                .filter(|i| !self.is_key(&self.columns[*i].name))
                .map(|i| format!("(b.\"c{i}\" IS DISTINCT FROM a.\"c{i}\")"))
                .collect();
            let differs = if differs.is_empty() { "false".to_owned() } else { differs.join(" OR ") };
            format!(
                "SELECT CAST(coalesce(a.\"p\", b.\"p\") AS VARCHAR) AS p, \
                   CASE WHEN b.\"in\" IS NULL THEN 'added' WHEN a.\"in\" IS NULL THEN 'removed' \
                     ELSE 'changed' END AS status, \
                   CAST(1 AS BIGINT) AS n, {sides} \
                 FROM {b} b FULL JOIN {a} a ON {on} \
                 WHERE b.\"in\" IS NULL OR a.\"in\" IS NULL OR {differs}",
                b = side(Side::Before, "published"),
                a = side(Side::After, "staged"),
            )
        }
    }

    /// The slim `differing` table the counts and slices are computed from: `(p, status, n, s0, s1, ...)`,
    /// `s{j}` being slice column `j` as text (published value for removed rows, else staged).
    pub(super) fn differing_sql(&self) -> String {
        let mut select = vec!["p".to_owned(), "status".to_owned(), "n".to_owned()];
        for (j, slice) in self.slices.iter().enumerate() {
            let i = self.idx(slice);
            select.push(format!("CAST(CASE WHEN status = 'removed' THEN b{i} ELSE a{i} END AS VARCHAR) AS s{j}"));
        }
        format!("SELECT {} FROM changes", select.join(", "))
    }

    /// Fills one side's row counts and column statistics from one grouped query.
    pub(super) async fn add_column_stats(
        &self,
        ctx: &SessionContext,
        table: &str,
        by_partition: &mut BTreeMap<String, PartitionComparison>,
        side: Side,
    ) -> Result<()> {
        let mut select = vec![df::ident(&self.partition), "count(*)".to_owned()];
        for column in self.measured() {
            let c = df::ident(&column.name);
            select.push(format!("count({c})"));
            if column.numeric() {
                for f in ["sum", "min", "max", "avg"] {
                    select.push(format!("{f}(CAST({c} AS DOUBLE))"));
                }
            }
        }
        let sql = format!("SELECT {} FROM {table} GROUP BY {}", select.join(", "), df::ident(&self.partition));
        for batch in &df::query(ctx, &sql).await? {
            let keys = texts(batch, 0)?;
            let n_rows = counts(batch, 1)?;
            let mut col_idx = 2;
            let mut measures = Vec::new();
            for column in self.measured() {
                let n_values = counts(batch, col_idx)?;
                let aggregates = if column.numeric() {
                    let found: Vec<Vec<Option<f64>>> =
                        (1..=4).map(|k| numbers(batch, col_idx + k)).collect::<Result<_>>()?;
                    col_idx += 4;
                    Some(found)
                } else {
                    None
                };
                col_idx += 1;
                measures.push((n_values, aggregates));
            }
            for (row, key) in keys.iter().enumerate() {
                let Some(partition) = key.as_ref().and_then(|k| by_partition.get_mut(k)) else { continue };
                let n = n_rows[row];
                match side {
                    Side::Before => partition.rows_before = n,
                    Side::After => partition.rows_after = n,
                }
                for (delta, (n_values, aggregates)) in partition.columns.iter_mut().zip(&measures) {
                    let null_rate = if n == 0 { 0.0 } else { n.saturating_sub(n_values[row]) as f64 / n as f64 };
                    let get = |k: usize| aggregates.as_ref().and_then(|a| a[k][row]);
                    let (sum, min, max, mean) = (get(0), get(1), get(2), get(3));
                    match side {
                        Side::Before => {
                            delta.null_rate_before = null_rate;
                            (delta.sum_before, delta.min_before, delta.max_before, delta.mean_before) =
                                (sum, min, max, mean);
                        }
                        Side::After => {
                            delta.null_rate_after = null_rate;
                            (delta.sum_after, delta.min_after, delta.max_after, delta.mean_after) =
                                (sum, min, max, mean);
                        }
                    }
                }
            }
        }
        Ok(())
    }

    /// Column `i` of the changes view as a side's own value, for samples.
    fn own_value(&self, prefix: char, i: usize) -> String {
        if self.columns[i].carries_own() { format!("{prefix}v{i}") } else { format!("{prefix}{i}") }
    }

    /// Up to `limit` sample rows per partition and kind, ordered by key, then by every column.
    pub(super) async fn add_samples(
        &self,
        ctx: &SessionContext,
        limit: usize,
        by_partition: &mut BTreeMap<String, PartitionComparison>,
    ) -> Result<()> {
        let named = |prefix: char, names: &mut dyn Iterator<Item = &Column>| {
            let fields: Vec<String> = names
                .map(|c| format!("{}, {}", df::literal(&c.name), self.own_value(prefix, self.idx(&c.name))))
                .collect();
            format!("named_struct({})", fields.join(", "))
        };
        let mut order: Vec<String> =
            self.keys.iter().map(|k| self.idx(k)).map(|i| format!("coalesce(a{i}, b{i})")).collect();
        for i in (0..self.columns.len()).filter(|i| !self.is_key(&self.columns[*i].name)) {
            order.push(format!("a{i}"));
            order.push(format!("b{i}"));
        }
        let all = || self.columns.iter();
        let key = if self.keys.is_empty() {
            "CAST(NULL AS VARCHAR)".to_owned()
        } else {
            let fields: Vec<String> = self
                .keys
                .iter()
                .map(|k| {
                    let i = self.idx(k);
                    format!("{}, coalesce({}, {})", df::literal(k), self.own_value('a', i), self.own_value('b', i))
                })
                .collect();
            format!("named_struct({})", fields.join(", "))
        };
        let sql = format!(
            "SELECT p, status, {key} AS \"key\", {before} AS \"before\", {after} AS \"after\" \
             FROM (SELECT *, row_number() OVER (PARTITION BY p, status ORDER BY {order}) AS \"rank\" FROM changes) \
             WHERE \"rank\" <= {limit} ORDER BY p, status, \"rank\"",
            before = named('b', &mut all()),
            after = named('a', &mut all()),
            order = order.join(", "),
        );
        for batch in &df::query(ctx, &sql).await? {
            let keys = texts(batch, 0)?;
            let statuses = texts(batch, 1)?;
            let objects = df::sample_rows(&[batch.project(&[2, 3, 4])?], usize::MAX)?;
            for ((key, status), object) in keys.into_iter().zip(statuses).zip(objects) {
                let Some(partition) = key.and_then(|k| by_partition.get_mut(&k)) else { continue };
                let field = |name: &str| object.get(name).cloned().unwrap_or_else(|| Value::Object(Default::default()));
                match status.as_deref() {
                    Some("added") => partition.sample_added.push(field("after")),
                    Some("removed") => partition.sample_removed.push(field("before")),
                    Some("changed") => {
                        let without_keys = |mut row: Value| {
                            if let Some(map) = row.as_object_mut() {
                                map.retain(|c, _| !self.is_key(c));
                            }
                            row
                        };
                        partition.sample_changed.push(serde_json::json!({
                            "key": field("key"),
                            "before": without_keys(field("before")),
                            "after": without_keys(field("after")),
                        }));
                    }
                    other => return Err(Error::internal(format!("unexpected change status {other:?}"))),
                }
            }
        }
        Ok(())
    }

    /// Fills the breakdown by slice column `idx`: per partition and value, the rows on each side
    /// and the rows counted in the `differing` table. Values are the compared ones, as text, so
    /// a value reads the same on both sides.
    pub(super) async fn add_slices(
        &self,
        ctx: &SessionContext,
        idx: usize,
        by_partition: &mut BTreeMap<String, PartitionComparison>,
    ) -> Result<()> {
        let name = &self.slices[idx];
        let column = &self.columns[self.idx(name)];
        let p = df::ident(&self.partition);
        let side = |side: Side, table: &str, before: &str, after: &str| {
            let c = column.compared(side);
            format!(
                "SELECT CAST({p} AS VARCHAR) AS p, CAST({c} AS VARCHAR) AS v, {before} AS nb, {after} AS na, \
                   CAST(0 AS BIGINT) AS added, CAST(0 AS BIGINT) AS removed, CAST(0 AS BIGINT) AS changed \
                 FROM {table} GROUP BY {p}, {c}"
            )
        };
        let n_of = |status: &str| format!("sum(CASE WHEN status = '{status}' THEN n ELSE 0 END)");
        let sql = format!(
            "SELECT p, v, sum(nb), sum(na), sum(added), sum(removed), sum(changed) FROM (\
               {before} UNION ALL {after} UNION ALL \
               SELECT p, s{idx} AS v, CAST(0 AS BIGINT), CAST(0 AS BIGINT), {added}, {removed}, {changed} \
               FROM differing GROUP BY p, s{idx}) \
             GROUP BY p, v",
            before = side(Side::Before, "published", "count(*)", "CAST(0 AS BIGINT)"),
            after = side(Side::After, "staged", "CAST(0 AS BIGINT)", "count(*)"),
            added = n_of("added"),
            removed = n_of("removed"),
            changed = n_of("changed"),
        );
        let mut found: BTreeMap<String, Vec<SliceDelta>> = BTreeMap::new();
        for batch in &df::query(ctx, &sql).await? {
            let values: Vec<Vec<u64>> = (2..7).map(|i| counts(batch, i)).collect::<Result<_>>()?;
            for (row, (key, value)) in texts(batch, 0)?.into_iter().zip(texts(batch, 1)?).enumerate() {
                let Some(key) = key else { continue };
                found.entry(key).or_default().push(SliceDelta {
                    column: name.clone(),
                    value: value.unwrap_or_else(|| super::NULL_SLICE_VALUE.to_owned()),
                    rows_before: values[0][row],
                    rows_after: values[1][row],
                    n_added: values[2][row],
                    n_removed: values[3][row],
                    n_changed: values[4][row],
                });
            }
        }
        for (key, mut slices) in found {
            let Some(partition) = by_partition.get_mut(&key) else { continue };
            // Keep the values that moved most, then report them by value.
            let churn = |s: &SliceDelta| s.n_added + s.n_removed + s.n_changed;
            slices.sort_by(|x, y| churn(y).cmp(&churn(x)).then_with(|| x.value.cmp(&y.value)));
            slices.truncate(MAX_SLICE_VALUES);
            slices.sort_by(|x, y| x.value.cmp(&y.value));
            partition.slices.extend(slices);
        }
        Ok(())
    }
}
