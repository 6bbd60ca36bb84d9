//! Where a table's files go and what its partition column holds (decision 0005). Every data file
//! lives in its partition's folder, `<column>=<value>/part-<staging id>-<uuid>.<codec>.parquet`,
//! so readers that take partition values from paths (Polars) agree with those that read the
//! log's `partitionValues` (delta-rs, DuckDB, Spark). The staging id in the name proves whose file it is, as `staging/<id>/` did before.
//!
//! The partition column is typed: a `date` for day, week and month partitions (the partition's
//! first local day), a `timestamp` (UTC, microseconds) for hours (the hour's start), a `string` for
//! static keys. Tidegate itself still names partitions by their keys (`2024-W05`); this module
//! converts between keys and column values. A table records its partitioning in the table
//! property [`PARTITIONING_PROPERTY`]; a table without it was written by an earlier Tidegate (text
//! column, files under `staging/`): it stays readable, and publishing to it is refused.

use std::str::FromStr as _;
use std::sync::Arc;

use arrow::array::{ArrayRef, StringArray};
use arrow::compute::cast;
use arrow::datatypes::{DataType, TimeUnit};
use chrono::{DateTime, NaiveDate, NaiveDateTime, TimeZone as _, Utc};
use chrono_tz::Tz;
use deltalake_core::DeltaTable;
use tidegate_core::partition::{Grain, TimeAxis};
use tidegate_core::spec::model::{Dataset, Partitioning};

use crate::df;
use crate::error::{Error, Result};

/// The table property naming a table's partitioning: `static`, `day`, `week`, `month`, `hour`
/// or `hour@<IANA zone>`. Its presence marks the hive-style layout of this module.
pub const PARTITIONING_PROPERTY: &str = "tidegate.partitioning";

/// A partition value of one of the three types.
enum Scalar {
    String(String),
    /// Days since 1970-01-01.
    Date(i32),
    /// Microseconds since the Unix epoch, UTC.
    Timestamp(i64),
}

impl Scalar {
    /// As Delta writes it in `partitionValues` (and as delta-rs does).
    fn serialize(&self) -> String {
        match self {
            Scalar::String(s) => s.clone(),
            Scalar::Date(days) => {
                (epoch_day() + chrono::Duration::days(i64::from(*days))).format("%Y-%m-%d").to_string()
            }
            Scalar::Timestamp(us) => Utc
                .timestamp_micros(*us)
                .single()
                .map(|t| t.format("%Y-%m-%d %H:%M:%S%.6f").to_string())
                .unwrap_or_default(),
        }
    }

    /// As a folder name's value: the value itself. Dates and static keys (letters, digits, `_`,
    /// `-`, `.`) need no escaping. An hour's value holds a space and colons, kept as they are
    /// (`hour=2024-01-05 07:00:00.000000/`): the delta-rs Tidegate reads with finds a file from
    /// its logged path when the folder is named so, and Polars, `deltalake`, pandas and DuckDB
    /// read the value from it (`crates/lake/tests/lake/readers.rs`, the hourly table).
    fn serialize_encoded(&self) -> String {
        self.serialize()
    }
}

/// What a partition column holds.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PartitionKind {
    /// Static keys, as text.
    Key,
    /// The first local day of a day, week or month partition.
    Date(Grain),
    /// The start of an hour partition (UTC); keys of hours in a zone carry the zone's offset.
    Hour(Option<Tz>),
}

/// A table's partition column: its name and what it holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PartitionColumn {
    /// The column's name (`partitioning.column`, default `tg_partition`).
    pub name: String,
    /// What the column holds, and so its type.
    pub kind: PartitionKind,
    /// Whether the table was written by an earlier Tidegate: a text column, files under `staging/`.
    pub legacy: bool,
}

impl PartitionColumn {
    /// The partition column a dataset's spec asks for.
    pub fn of_dataset(dataset: &Dataset) -> PartitionColumn {
        let kind = match &dataset.partitioning {
            Partitioning::Time { grain: Grain::Hour, time_zone, .. } => PartitionKind::Hour(*time_zone),
            Partitioning::Time { grain, .. } => PartitionKind::Date(*grain),
            Partitioning::Static { .. } => PartitionKind::Key,
        };
        PartitionColumn { name: dataset.partition_column.clone(), kind, legacy: false }
    }

    /// The partition column a table has: its metadata's partition column and the partitioning
    /// recorded in [`PARTITIONING_PROPERTY`] (a table without it, another tool's or an earlier
    /// Tidegate's, is `legacy`, its values compared as text).
    pub(crate) fn of_table(table: &DeltaTable) -> Result<PartitionColumn> {
        let snapshot = table.snapshot()?;
        let metadata = snapshot.metadata();
        // A table with no partition column (an external table) has no partition to filter on.
        let Some(name) = metadata.partition_columns().first().cloned() else {
            return Ok(PartitionColumn {
                name: crate::PARTITION_COLUMN.to_owned(),
                kind: PartitionKind::Key,
                legacy: true,
            });
        };
        let property = metadata.configuration().get(PARTITIONING_PROPERTY).cloned();
        match property {
            None => Ok(PartitionColumn { name, kind: PartitionKind::Key, legacy: true }),
            Some(text) => {
                let kind = parse_property(&text)
                    .ok_or_else(|| Error::internal(format!("unknown {PARTITIONING_PROPERTY} {text:?}")))?;
                Ok(PartitionColumn { name, kind, legacy: false })
            }
        }
    }

    /// The column's Arrow type.
    pub fn data_type(&self) -> DataType {
        match self.kind {
            PartitionKind::Key => DataType::Utf8,
            PartitionKind::Date(_) => DataType::Date32,
            PartitionKind::Hour(_) => DataType::Timestamp(TimeUnit::Microsecond, Some("UTC".into())),
        }
    }

    /// The value of [`PARTITIONING_PROPERTY`] for this column.
    pub(crate) fn property(&self) -> String {
        match self.kind {
            PartitionKind::Key => "static".to_owned(),
            PartitionKind::Date(grain) => grain.as_str().to_owned(),
            PartitionKind::Hour(None) => "hour".to_owned(),
            PartitionKind::Hour(Some(tz)) => format!("hour@{}", tz.name()),
        }
    }

    /// The partition key as a Delta scalar of the column's type.
    fn scalar(&self, key: &str) -> Result<Scalar> {
        let bad = |e: String| Error::InvalidName { what: "partition key", value: key.to_owned(), reason: e };
        Ok(match self.kind {
            PartitionKind::Key => Scalar::String(key.to_owned()),
            PartitionKind::Date(grain) => {
                let start = axis(grain, None).parse_key(key).map_err(|e| bad(e.to_string()))?;
                let days = start.date_naive().signed_duration_since(epoch_day()).num_days();
                Scalar::Date(i32::try_from(days).map_err(|e| bad(e.to_string()))?)
            }
            PartitionKind::Hour(zone) => {
                let start = axis(Grain::Hour, zone).parse_key(key).map_err(|e| bad(e.to_string()))?;
                Scalar::Timestamp(start.timestamp_micros())
            }
        })
    }

    /// The key's value as Delta writes it in `partitionValues` (`2024-01-05`,
    /// `2024-01-05 07:00:00.000000`, `eu`).
    pub fn value(&self, key: &str) -> Result<String> {
        Ok(self.scalar(key)?.serialize())
    }

    /// The key's partition folder, `<column>=<value>` (`tg_partition=2024-01-05
    /// 07:00:00.000000` for an hour).
    pub fn folder(&self, key: &str) -> Result<String> {
        Ok(format!("{}={}", self.name, self.scalar(key)?.serialize_encoded()))
    }

    /// The key of a value of this column, given as Delta writes it or as Arrow prints it
    /// (`2024-01-05T07:00:00Z`); `None` when it is not one.
    pub fn key_of(&self, value: &str) -> Option<String> {
        match self.kind {
            PartitionKind::Key => Some(value.to_owned()),
            PartitionKind::Date(grain) => {
                let date = NaiveDate::parse_from_str(value, "%Y-%m-%d").ok()?;
                let at = Utc.from_utc_datetime(&date.and_hms_opt(0, 0, 0)?);
                Some(axis(grain, None).key(at))
            }
            PartitionKind::Hour(zone) => {
                let at = parse_instant(value)?;
                let axis = axis(Grain::Hour, zone);
                (axis.floor(at) == at).then(|| axis.key(at))
            }
        }
    }

    /// A SQL condition, for DataFusion, selecting the rows of `keys`: `"col" IN (...)` with each
    /// value as a literal DataFusion casts to the column's type (so partitions are pruned).
    pub(crate) fn sql_in(&self, keys: &[String]) -> Result<String> {
        let values = keys.iter().map(|k| self.sql_value(k)).collect::<Result<Vec<_>>>()?;
        Ok(format!("{} IN {}", df::ident(&self.name), df::literal_list(&values)))
    }

    /// The key's value as a SQL string literal's text that casts to the column's type.
    pub(crate) fn sql_value(&self, key: &str) -> Result<String> {
        Ok(match self.kind {
            PartitionKind::Hour(_) => match self.scalar(key)? {
                Scalar::Timestamp(us) => {
                    let at = Utc.timestamp_micros(us).single().ok_or_else(|| Error::internal("hour out of range"))?;
                    at.format("%Y-%m-%dT%H:%M:%SZ").to_string()
                }
                _ => return Err(Error::internal("an hour partition that is not a timestamp")),
            },
            _ => self.value(key)?,
        })
    }

    /// One value of the column's type per key, in order.
    pub(crate) fn values(&self, keys: &[String]) -> Result<ArrayRef> {
        let text: Vec<String> = keys.iter().map(|k| self.sql_value(k)).collect::<Result<_>>()?;
        let text: ArrayRef = Arc::new(StringArray::from(text));
        Ok(cast(&text, &self.data_type())?)
    }

    /// Each key's value as Arrow (and DataFusion's `CAST(.. AS VARCHAR)`) prints it: how the keys
    /// are recognised in query results.
    pub(crate) fn shown(&self, keys: &[String]) -> Result<Vec<String>> {
        let text = cast(&self.values(keys)?, &DataType::Utf8)?;
        use arrow::array::AsArray as _;
        Ok(text.as_string::<i32>().iter().map(|v| v.unwrap_or_default().to_owned()).collect())
    }

    /// `n` copies of the key's value, in the column's type.
    pub(crate) fn repeated(&self, key: &str, n: usize) -> Result<ArrayRef> {
        let text: ArrayRef = Arc::new(StringArray::from(vec![self.sql_value(key)?; n]));
        Ok(cast(&text, &self.data_type())?)
    }
}

/// The partitioning a [`PARTITIONING_PROPERTY`] value names.
fn parse_property(text: &str) -> Option<PartitionKind> {
    if text == "static" {
        return Some(PartitionKind::Key);
    }
    if let Some(zone) = text.strip_prefix("hour@") {
        return Tz::from_str(zone).ok().map(|tz| PartitionKind::Hour(Some(tz)));
    }
    match Grain::parse(text)? {
        Grain::Hour => Some(PartitionKind::Hour(None)),
        grain => Some(PartitionKind::Date(grain)),
    }
}

/// An axis of `grain` reaching back far enough for any key.
fn axis(grain: Grain, zone: Option<Tz>) -> TimeAxis {
    let early = Utc.with_ymd_and_hms(1000, 1, 6, 0, 0, 0).single().unwrap_or(DateTime::<Utc>::MIN_UTC);
    TimeAxis::new(grain, early, zone)
}

fn epoch_day() -> NaiveDate {
    NaiveDate::from_ymd_opt(1970, 1, 1).unwrap_or_default()
}

/// An instant written as Delta writes timestamps (`2024-01-05 07:00:00.000000`, UTC) or as
/// RFC 3339 (`2024-01-05T07:00:00Z`).
fn parse_instant(value: &str) -> Option<DateTime<Utc>> {
    if let Ok(at) = DateTime::parse_from_rfc3339(value) {
        return Some(at.with_timezone(&Utc));
    }
    ["%Y-%m-%d %H:%M:%S%.f", "%Y-%m-%dT%H:%M:%S%.f", "%Y-%m-%d %H:%M:%S", "%Y-%m-%dT%H:%M:%S"]
        .iter()
        .find_map(|f| NaiveDateTime::parse_from_str(value, f).ok())
        .map(|naive| Utc.from_utc_datetime(&naive))
}

/// The object-store path of a path as listings and delta-rs' file views spell it (a `%` in it
/// is already an escape, which `Path::from` would escape a second time).
pub(crate) fn object_path(path: &str) -> object_store::path::Path {
    object_store::path::Path::parse(path).unwrap_or_else(|_| object_store::path::Path::from(path))
}

/// A path as an `add` action in the log's JSON spells it, in the form listings and Tidegate's
/// records use (the object store's: un-escaped once as a URI, then escaped as a path part), as
/// delta-rs does to find the file.
pub(crate) fn path_of_logged(raw: &str) -> String {
    object_store::path::Path::from(decoded(raw).as_str()).to_string()
}

/// `raw` with its `%XX` escapes decoded.
fn decoded(raw: &str) -> String {
    let bytes = raw.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: u8| char::from(b).to_digit(16);
        if bytes[i] == b'%'
            && let (Some(hi), Some(lo)) =
                (bytes.get(i + 1).copied().and_then(hex), bytes.get(i + 2).copied().and_then(hex))
        {
            out.push(u8::try_from(hi * 16 + lo).unwrap_or(b'%'));
            i += 3;
            continue;
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// The name of a data file Tidegate writes for staging id `staging_id`, keeping the writer's
/// extension (`.snappy.parquet`): `part-<staging id>-<uuid>.snappy.parquet`.
pub(crate) fn file_name(staging_id: &str, written: &str) -> String {
    let extension = written.find('.').map_or(".parquet", |i| &written[i..]);
    format!("part-{staging_id}-{}{extension}", uuid::Uuid::now_v7().simple())
}

/// The staging id in a data file's name, when it is named as [`file_name`] names files and lies
/// in a partition folder (`<column>=<value>/`).
pub(crate) fn staging_id_in_name(path: &str) -> Option<&str> {
    let (folder, name) = path.rsplit_once('/')?;
    if folder.is_empty() || !folder.split('/').all(|segment| segment.contains('=') && !segment.starts_with(['_', '.']))
    {
        return None;
    }
    // The id may hold `-` and `.`; the uuid and the extension (`.snappy.parquet`) hold no `-`.
    let (id, rest) = name.strip_prefix("part-")?.rsplit_once('-')?;
    let (uuid, extension) = rest.split_at_checked(32)?;
    let is_uuid = uuid.bytes().all(|b| b.is_ascii_hexdigit() && !b.is_ascii_uppercase());
    (is_uuid && !id.is_empty() && extension.starts_with('.') && extension.ends_with(".parquet")).then_some(id)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn column(kind: PartitionKind) -> PartitionColumn {
        PartitionColumn { name: "p".to_owned(), kind, legacy: false }
    }

    #[test]
    fn keys_and_values_convert_both_ways() {
        let day = column(PartitionKind::Date(Grain::Day));
        assert_eq!(day.value("2024-01-05").expect("a day"), "2024-01-05");
        assert_eq!(day.folder("2024-01-05").expect("a day"), "p=2024-01-05");
        assert_eq!(day.key_of("2024-01-05").as_deref(), Some("2024-01-05"));
        let week = column(PartitionKind::Date(Grain::Week));
        assert_eq!(week.value("2024-W02").expect("a week"), "2024-01-08");
        assert_eq!(week.key_of("2024-01-08").as_deref(), Some("2024-W02"));
        let month = column(PartitionKind::Date(Grain::Month));
        assert_eq!(month.value("2024-02").expect("a month"), "2024-02-01");
        assert_eq!(month.key_of("2024-02-01").as_deref(), Some("2024-02"));
        let hour = column(PartitionKind::Hour(None));
        assert_eq!(hour.value("2024-01-05T07").expect("an hour"), "2024-01-05 07:00:00.000000");
        assert_eq!(hour.folder("2024-01-05T07").expect("an hour"), "p=2024-01-05 07:00:00.000000");
        assert_eq!(hour.key_of("2024-01-05 07:00:00.000000").as_deref(), Some("2024-01-05T07"));
        assert_eq!(hour.key_of("2024-01-05T07:00:00Z").as_deref(), Some("2024-01-05T07"));
        let zoned = column(PartitionKind::Hour(Some(chrono_tz::America::New_York)));
        assert_eq!(zoned.value("2024-11-03T01-0400").expect("an hour"), "2024-11-03 05:00:00.000000");
        assert_eq!(zoned.key_of("2024-11-03 06:00:00.000000").as_deref(), Some("2024-11-03T01-0500"));
        assert!(day.value("2024-W02").is_err());
        assert_eq!(parse_property(&zoned.property()), Some(zoned.kind));
        assert_eq!(parse_property("week"), Some(PartitionKind::Date(Grain::Week)));
        // As stored, listed and logged: the value as Delta writes it.
        let stored = object_store::path::Path::from(format!(
            "{}/part-x-0.parquet",
            hour.folder("2024-01-05T07").expect("an hour")
        ));
        assert_eq!(stored.to_string(), "p=2024-01-05 07:00:00.000000/part-x-0.parquet");
        assert_eq!(path_of_logged(stored.as_ref()), stored.to_string());
        // What Python deltalake logs for the same file.
        assert_eq!(
            path_of_logged("p=2024-01-05%252007%253A00%253A00.000000/part-x-0.parquet"),
            "p=2024-01-05%252007%253A00%253A00.000000/part-x-0.parquet"
        );
    }

    #[test]
    fn staging_ids_are_read_from_file_names_in_partition_folders() {
        let name = file_name("daily-2024-01-05-1.x", "part-00000-abc-c000.snappy.parquet");
        assert!(name.ends_with(".snappy.parquet"));
        let path = format!("p=2024-01-05/{name}");
        assert_eq!(staging_id_in_name(&path), Some("daily-2024-01-05-1.x"));
        assert_eq!(staging_id_in_name(&format!("a=1/b=2/{name}")), Some("daily-2024-01-05-1.x"));
        // Not in a partition folder, or named as another writer names files: no id.
        assert_eq!(staging_id_in_name(&name), None);
        assert_eq!(staging_id_in_name(&format!("other/{name}")), None);
        assert_eq!(staging_id_in_name("p=1/part-00000-6f1c2a1e-0b7e-4e55-9d9c-0a1b2c3d4e5f-c000.snappy.parquet"), None);
        assert_eq!(staging_id_in_name("p=1/notes.txt"), None);
    }
}
