//! The typed model of `tidegate.toml`: what a valid spec means once parsing and validation are done.
//!
//! Every value here has already been checked by [`super::parse`]; code that consumes a [`Spec`] never
//! re-validates. Items that later stages may need to point at (datasets, tasks, inputs) carry the
//! [`Loc`] of their declaration so a planner error can still name the file and line.

use std::collections::BTreeMap;

use chrono::{DateTime, Utc};
use chrono_tz::Tz;
use serde::Serialize;

use crate::partition::Grain;

/// A position in the spec file, 1-based, for messages that point back at the source.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize)]
pub struct Loc {
    /// The 1-based line.
    pub line: u32,
    /// The 1-based column, counted in characters.
    pub col: u32,
}

/// A parsed and validated workspace specification.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Spec {
    /// The file the spec came from, as given to the parser (used in messages).
    pub file: String,
    /// blake3 of the exact file text, hex: the spec hash that runs and backfills record.
    pub hash: String,
    /// `[project]`: the workspace's name, state and lake locations, and lease settings.
    pub project: Project,
    /// `[pools]` by name, always including [`DEFAULT_POOL`].
    pub pools: BTreeMap<String, Pool>,
    /// `[datasets]` and `[external]` by name, managed and external in one map.
    pub datasets: BTreeMap<String, Dataset>,
    /// `[tasks]` by name.
    pub tasks: BTreeMap<String, Task>,
    /// `[lineage]`: where OpenLineage events go.
    pub lineage: Lineage,
    /// `[alerts]` by name.
    pub alerts: BTreeMap<String, AlertRule>,
    /// `[receivers]` by name.
    pub receivers: BTreeMap<String, Receiver>,
}

/// `[project]`: names and where state and tables live.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Project {
    /// `name` (required): names the workspace in the Delta commits it makes and its lineage events.
    pub name: String,
    /// `state` (default `.tidegate/state.db`): a SQLite path or a `postgres://` URL.
    pub state_url: String,
    /// `lake` (default `.tidegate/lake`): a folder or an object-store URL such as `s3://bucket/prefix`.
    pub lake_url: String,
    /// `lease_ttl_s` (default 30): how long a worker's claim lives without a heartbeat.
    pub lease_ttl_s: u32,
    /// `heartbeat_s` (default 10): how often a worker renews its lease; must be below `lease_ttl_s`.
    pub heartbeat_s: u32,
    /// `allow_self_approval` (default false): whether a backfill's requester may approve it.
    pub allow_self_approval: bool,
    /// `idempotency_ttl_h` (default 24): how long client idempotency keys are remembered.
    pub idempotency_ttl_h: u32,
    /// `log_max_bytes` (default [`DEFAULT_LOG_MAX_BYTES`]): the cap on each log of an attempt,
    /// for tasks that set none.
    pub log_max_bytes: u64,
}

/// `[lineage]`: where the OpenLineage events derived from the journal go. A file by default; an
/// HTTP endpoint (Marquez, or any OpenLineage receiver) when `url` is set.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Lineage {
    /// `namespace` (default: the project's name): the OpenLineage namespace of Tidegate's jobs.
    pub namespace: String,
    /// `file` (default [`DEFAULT_LINEAGE_FILE`], relative to the workspace): where events are
    /// appended as JSON lines; `None` when the spec says `file = false`.
    pub file: Option<String>,
    /// `url` (optional): an OpenLineage receiver's base URL, `http://` or `https://`.
    pub url: Option<String>,
    /// `endpoint` (default [`DEFAULT_LINEAGE_ENDPOINT`]): the path under `url` events are POSTed to.
    pub endpoint: String,
    /// `timeout_s` (default 5, at most 300): how long one POST may take.
    pub timeout_s: u32,
    /// `api_key_env` (optional): the environment variable holding the receiver's API key, sent as
    /// a bearer token. The key itself never appears in the spec, the journal or a message.
    pub api_key_env: Option<String>,
}

/// Where OpenLineage events are appended unless `[lineage] file` says otherwise.
pub const DEFAULT_LINEAGE_FILE: &str = ".tidegate/openlineage.jsonl";
/// The path OpenLineage receivers (Marquez) accept events on, as the OpenLineage clients use it.
pub const DEFAULT_LINEAGE_ENDPOINT: &str = "api/v1/lineage";

/// The cap on each of an attempt's logs when neither the task nor the project sets one: 10 MiB.
pub const DEFAULT_LOG_MAX_BYTES: u64 = 10 * 1024 * 1024;

/// `[pools.NAME]`: a shared resource that caps concurrency, start rate and retries.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Pool {
    /// `slots` (required, >= 1): attempts that may run at once.
    pub slots: u32,
    /// `rate_per_s` (optional, > 0): token-bucket cap on attempt starts per second.
    pub rate_per_s: Option<f64>,
    /// `retry_budget_ratio` (default 0.2): retries allowed as a share of first attempts.
    pub retry_budget_ratio: f64,
    /// `retry_budget_burst` (default 5): retries allowed before the ratio applies.
    pub retry_budget_burst: u32,
    /// `time_zone` (default UTC): the zone the `windows` are read in.
    #[serde(skip_serializing_if = "Option::is_none", serialize_with = "serialize_tz")]
    pub time_zone: Option<Tz>,
    /// `windows` (optional): times of the week when the pool has other `slots`, the first that
    /// holds winning.
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub windows: Vec<PoolWindow>,
}

/// `windows = [{ days = "mon-fri", from = "09:00", to = "18:00", slots = 1 }]`: while the
/// pool's local time is on one of `days` and in `[from, to)`, the pool has `slots` slots.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct PoolWindow {
    /// The days it holds on, Monday first (`days`: `"mon-fri"`, `"sat,sun"`, `"mon"`).
    pub days: [bool; 7],
    /// When it starts each of those days (`from`, `"HH:MM"`).
    pub from: chrono::NaiveTime,
    /// When it ends each of those days, exclusive (`to`, `"HH:MM"`, after `from`; `"24:00"` is
    /// the end of the day).
    pub to: Option<chrono::NaiveTime>,
    /// The pool's slots while it holds (0 holds every start back).
    pub slots: u32,
}

impl Pool {
    /// The pool's slots at `now`: the first window that holds in the pool's zone, else `slots`.
    pub fn slots_at(&self, now: DateTime<Utc>) -> u32 {
        use chrono::{Datelike as _, Timelike as _};
        if self.windows.is_empty() {
            return self.slots;
        }
        let local = now.with_timezone(&self.time_zone.unwrap_or(Tz::UTC)).naive_local();
        let (day, time) = (local.weekday().num_days_from_monday() as usize, local.time());
        let time = time.with_nanosecond(0).unwrap_or(time);
        self.windows
            .iter()
            .find(|w| w.days[day] && time >= w.from && w.to.is_none_or(|to| time < to))
            .map_or(self.slots, |w| w.slots)
    }
}

/// The name of the pool every task uses unless it names another; it always exists.
pub const DEFAULT_POOL: &str = "default";

/// `[datasets.NAME]` or `[external.NAME]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dataset {
    /// The dataset's name: its key under `[datasets]` or `[external]`.
    pub name: String,
    /// Where the dataset is declared.
    pub loc: Loc,
    /// `partitioning`: how the dataset is cut into partitions.
    pub partitioning: Partitioning,
    /// `partitioning.column` (default [`DEFAULT_PARTITION_COLUMN`]): the name of the table's
    /// partition column, a `date` (day, week, month), `timestamp` (hour) or `string` (static keys).
    pub partition_column: String,
    /// Whether Tidegate writes the dataset (and how) or only reads it.
    pub kind: DatasetKind,
    /// `consumers`: who reads it (teams, jobs, dashboards); shown in a backfill's blast radius.
    pub consumers: Vec<String>,
    /// `slice_columns`: columns a backfill comparison breaks differences down by.
    pub slice_columns: Vec<String>,
    /// `columns`: the schema contract, if declared.
    pub columns: Vec<Column>,
    /// `[[datasets.NAME.checks]]`: run on staged data before publication.
    pub checks: Vec<Check>,
    /// `review_flags`: when a backfill comparison flags a partition of this dataset.
    pub review_flags: ReviewFlags,
    /// `rewrites` (default `"review"`): whether a run may replace a partition published by other
    /// code without a governed backfill.
    pub rewrites: Rewrites,
    /// `stale` (default `"report"`): what the scheduler does with a partition built on inputs that
    /// changed since (invariant 14).
    pub stale: StalePolicy,
}

/// `stale = "report" | "rebuild"`: whether stale partitions are only reported (`tidegate stale`,
/// `status`, `/metrics`) or also rebuilt by each tick, below live work. A rebuild that would
/// replace history with other code is never made by a tick: that stays a governed backfill.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum StalePolicy {
    /// Reported only.
    #[default]
    Report,
    /// Reported, and rebuilt by each tick (as a catch-up run) when the rebuild runs the same code.
    Rebuild,
}

/// `rewrites = "review" | "free"`: who may replace a published partition of a dataset with the
/// output of other code (decision 0020). A partition never published, or published by the same
/// code version, is never a rewrite.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum Rewrites {
    /// Only a governed backfill (plan, compare, approve, publish) may: a run is refused.
    #[default]
    Review,
    /// Any run may (scratch data); each such replacement is journaled (`free_rewrite`).
    Free,
}

impl Rewrites {
    /// Every value, as a spec spells it.
    pub const NAMES: [&str; 2] = ["review", "free"];

    /// The value as a spec spells it.
    pub fn as_str(self) -> &'static str {
        match self {
            Rewrites::Review => "review",
            Rewrites::Free => "free",
        }
    }
}

/// A threshold of [`ReviewFlags`]: a limit, or `None` when that statistic never flags (`"off"`).
pub type Limit = Option<f64>;

/// `review_flags = { row_count_pct = 10, mean_pct = 10, null_rise_points = 5, ... }`: when a
/// backfill comparison flags a partition for a closer look. A partition is flagged when any one
/// statistic passes its limit; a partition with no published rows has nothing to move from and is
/// flagged only for a schema change.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct ReviewFlags {
    /// `row_count_pct` (default 10): the row count moved (up or down) by more than this percentage
    /// of the published rows.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>))]
    pub row_count_pct: Limit,
    /// `rows_changed_pct` (default off): rows added, removed or changed, together, exceed this
    /// percentage of the published rows. Off by default: rewriting rows is what most backfills are
    /// for.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>))]
    pub rows_changed_pct: Limit,
    /// `mean_pct` (default 10): a numeric column's mean moved (up or down) by more than this
    /// percentage of its published mean.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>))]
    pub mean_pct: Limit,
    /// `null_rise_points` (default 5): a column's null rate rose by more than this many percentage
    /// points. Only a rise flags: a falling null rate is data filled in, what backfills are for.
    #[cfg_attr(feature = "openapi", schema(value_type = Option<f64>))]
    pub null_rise_points: Limit,
    /// `schema_change` (default true): the staged data's schema differs from the published one.
    pub schema_change: bool,
}

impl ReviewFlags {
    /// The defaults for a dataset whose spec sets no `review_flags`.
    pub const DEFAULT: ReviewFlags = ReviewFlags {
        row_count_pct: Some(10.0),
        rows_changed_pct: None,
        mean_pct: Some(10.0),
        null_rise_points: Some(5.0),
        schema_change: true,
    };

    /// The settings of `review_flags`, as a spec and a command line spell them.
    pub const KEYS: [&str; 5] = ["row_count_pct", "rows_changed_pct", "mean_pct", "null_rise_points", "schema_change"];

    /// A limit as a spec or command line writes it: a number of at least 0, or `off`.
    pub fn parse_limit(text: &str) -> Result<Limit, String> {
        if text == "off" {
            return Ok(None);
        }
        match text.parse::<f64>() {
            Ok(n) if n.is_finite() && n >= 0.0 => Ok(Some(n)),
            Ok(_) => Err("must be a number of at least 0, or \"off\"".to_owned()),
            Err(_) => Err(format!("{text:?} is not a number: write a number of at least 0, or \"off\"")),
        }
    }

    /// Every percentage limit set to `pct` (the single `--flag-change-pct` knob); `schema_change`
    /// is kept.
    pub fn all_pct(self, pct: f64) -> ReviewFlags {
        let pct = Some(pct);
        ReviewFlags { row_count_pct: pct, rows_changed_pct: pct, mean_pct: pct, null_rise_points: pct, ..self }
    }
}

impl Default for ReviewFlags {
    fn default() -> Self {
        Self::DEFAULT
    }
}

/// Whether Tidegate writes the dataset or only reads it.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum DatasetKind {
    /// Written by exactly one task in this workspace, with a write mode.
    Managed {
        /// `write`: how a step's output replaces or adds to the published table.
        write: WriteMode,
    },
    /// Produced outside the workspace (`[external.NAME]`); `location` is a Delta table URI or
    /// folder, or a path template naming one folder (or prefix) per partition.
    External {
        /// `location` (optional): the table's URI or folder, or a template, as written in the spec.
        location: Option<String>,
        /// How Tidegate tells that a partition of the source has arrived (`ready`).
        ready: SourceReadiness,
    },
}

/// `ready`, `ready_timeout_s`, `ready_poll_s`: when a partition of an external source counts as
/// arrived, and how long a step that reads it waits (invariant 13).
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct SourceReadiness {
    /// What is looked at.
    pub check: ReadyCheck,
    /// How long a step waits for the partition before it fails.
    pub timeout_s: u64,
    /// How often a waiting step looks again.
    pub poll_s: u64,
}

/// What tells that a source's partition has arrived.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReadyCheck {
    /// `ready = "none"`: nothing is looked at; steps run whether or not the data is there (the
    /// default without a `location`, and said so by `validate`).
    None,
    /// `ready = "location"` (the default with one): the partition has at least one file at
    /// `location` (a file whose name does not start with `.` or `_`, under the template's folder
    /// or prefix), or, for a Delta table, a data file in the partition.
    Location,
    /// `ready = { command = [...] }`: the command, run from argv with the partition in its
    /// environment, exits 0. It is killed after `timeout_s`, which counts as not ready.
    Command {
        /// The program and its arguments.
        argv: Vec<String>,
        /// `command_timeout_s`: how long one run of it may take.
        timeout_s: u64,
    },
}

/// Default `ready_timeout_s`: a day.
pub const DEFAULT_READY_TIMEOUT_S: u64 = 86_400;
/// Default `ready_poll_s`.
pub const DEFAULT_READY_POLL_S: u64 = 30;
/// Default `ready.command_timeout_s`.
pub const DEFAULT_READY_COMMAND_TIMEOUT_S: u64 = 60;

/// The partition column's name when `partitioning.column` is not set (decision 0005).
pub const DEFAULT_PARTITION_COLUMN: &str = "tg_partition";

/// Characters a column name may not hold in a Delta table without column mapping (Tidegate's
/// tables have none): Parquet's schema syntax uses them, and the Delta kernel refuses such names.
/// Delta also compares column names ignoring case, so two names of one table must differ in more
/// than case.
pub const COLUMN_NAME_FORBIDDEN_CHARS: &[char] = &[' ', ',', ';', '{', '}', '(', ')', '\n', '\t', '='];

/// The partition column's type for a partitioning, as a declared column type: `date` for day, week
/// and month grains (the interval's first local day), `timestamp` for hours (the hour's start, UTC),
/// `string` for static keys.
pub fn partition_column_type(partitioning: &Partitioning) -> &'static str {
    match partitioning {
        Partitioning::Time { grain: Grain::Hour, .. } => "timestamp",
        Partitioning::Time { .. } => "date",
        Partitioning::Static { .. } => "string",
    }
}

/// `partitioning = { grain = "day", start = "2024-01-01", time_zone = "Europe/Paris" }` or
/// `partitioning = { keys = ["eu", "us"] }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Partitioning {
    /// Partitioned by time: consecutive `[start, end)` intervals of one grain from `start` on.
    Time {
        /// `grain`: the length of one interval (hour, day, week or month).
        grain: Grain,
        /// The first interval's start, as an instant (local midnight in `time_zone` when set).
        start: DateTime<Utc>,
        /// `time_zone` (default UTC): an IANA name; day, week and month boundaries follow it.
        #[serde(serialize_with = "serialize_tz")]
        time_zone: Option<Tz>,
    },
    /// Partitioned by a fixed list of keys, such as regions.
    Static {
        /// `keys`: the partition keys, unique and usable as folder names (at most 64 characters).
        keys: Vec<String>,
    },
}

fn serialize_tz<S: serde::Serializer>(tz: &Option<Tz>, s: S) -> Result<S::Ok, S::Error> {
    match tz {
        Some(tz) => s.serialize_some(tz.name()),
        None => s.serialize_none(),
    }
}

/// `write = { mode = "merge", keys = [...], order_by = "...", delete_marker = "..." }`.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "mode", rename_all = "snake_case")]
pub enum WriteMode {
    /// A step's output is the complete contents of its partitions; publication swaps them.
    Replace,
    /// A step's output is changed rows keyed by `keys`; duplicates resolve by `order_by`.
    Merge {
        /// `keys`: the columns that identify a row; a staged row replaces the published row with equal
        /// keys.
        keys: Vec<String>,
        /// `order_by`: among staged rows with equal keys, the one with the greatest value wins.
        order_by: Option<String>,
        /// `delete_marker`: a boolean column; a winning row with it true deletes its key instead.
        delete_marker: Option<String>,
    },
    /// A step's output is a complete new version of the whole dataset.
    Snapshot,
    /// A step's output is new rows; `dedup_key` makes a replay add nothing.
    Append {
        /// `dedup_key`: the columns that identify a row. Each key is published once within a
        /// partition and the `dedup_lookback` partitions either side of it, whatever the grouping
        /// of publications into commits: a key twice in one delivery keeps the row of its
        /// earliest partition; a key already published nearby is not added again. Within one
        /// partition, rows of one key must be identical (they collapse to one) or be told apart
        /// by `order_by`; otherwise the delivery is refused, naming the key. A row with a null
        /// key refuses the delivery.
        dedup_key: Vec<String>,
        /// `dedup_lookback` (default 0, at most [`MAX_DEDUP_LOOKBACK`]): how many time partitions
        /// before and after a partition a key is also looked for in, for late re-deliveries.
        dedup_lookback: u32,
        /// `order_by`: among one partition's rows of a key in a delivery, the one with the
        /// greatest value is published (nulls lowest); different rows sharing the greatest value
        /// refuse the delivery.
        order_by: Option<String>,
    },
}

/// The most earlier partitions `dedup_lookback` may name.
pub const MAX_DEDUP_LOOKBACK: u32 = 1_000;

/// One column of a dataset's schema contract.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Column {
    /// `name`: the column's name in the table schema.
    pub name: String,
    /// One of `string`, `int64`, `int32`, `float64`, `bool`, `date`, `timestamp`.
    pub data_type: String,
    /// `nullable` (default true): whether the column may hold nulls.
    pub nullable: bool,
}

/// A data-quality check on staged output. `blocking` (default true) failures publish nothing.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Check {
    /// `name`, or a default that says what the check does, such as `not_null(user_id)`.
    pub name: String,
    /// `blocking` (default true): whether a failure stops publication, or is only reported.
    pub blocking: bool,
    /// `type` and its settings: what the check asserts.
    pub rule: CheckRule,
}

/// What a check asserts.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "type", rename_all = "snake_case")]
pub enum CheckRule {
    /// No row has a null in any of `columns`.
    NotNull {
        /// `columns`: the columns that must hold a value in every row.
        columns: Vec<String>,
    },
    /// No two rows share the same values in `columns` together.
    Unique {
        /// `columns`: the columns whose values together identify a row.
        columns: Vec<String>,
    },
    /// Every non-null value of `column` is one of `values`.
    AcceptedValues {
        /// `column`: the column checked, compared as text.
        column: String,
        /// `values`: the accepted values, as text.
        values: Vec<String>,
    },
    /// The staged row count lies within `min` and `max`, inclusive (at least one is set).
    RowCount {
        /// `min`: the fewest rows a step may stage; `None` for no lower bound.
        min: Option<u64>,
        /// `max`: the most rows a step may stage (at least `min`); `None` for no upper bound.
        max: Option<u64>,
    },
    /// `aggregate` of `column` may move at most `tolerance_pct` percent from the published version.
    AggregateTolerance {
        /// `column`: the numeric column aggregated.
        column: String,
        /// `aggregate`: the aggregate compared between the staged and the published partitions.
        aggregate: Aggregate,
        /// `tolerance_pct`: the largest change allowed, in percent of the published value.
        tolerance_pct: f64,
    },
    /// The newest `column` value must be at most `max_age_s` older than the partition end.
    Freshness {
        /// `column`: the timestamp column whose newest value is checked.
        column: String,
        /// `max_age_s`: the largest age allowed, in seconds, measured back from the partition end
        /// (from the current time for static partitions).
        max_age_s: u64,
    },
    /// A query over the staged table `staged` that returns the failing rows.
    Sql {
        /// `query`: a read-only SQL query; every row it returns is a failure.
        query: String,
    },
}

/// Aggregates usable in tolerance checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregate {
    /// The sum of the column's values.
    Sum,
    /// The arithmetic mean of the column's non-null values.
    Mean,
    /// The smallest value.
    Min,
    /// The largest value.
    Max,
    /// The number of non-null values.
    Count,
}

/// `[tasks.NAME]`: one unit of work.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Task {
    /// The task's name, the key under `[tasks]`; part of every step's identity.
    pub name: String,
    /// Where the task is declared.
    pub loc: Loc,
    /// `command` or `sql`: how the task computes its output.
    pub run: TaskRun,
    /// `inputs`: the datasets the task reads and which of their partitions each step reads.
    pub inputs: Vec<Input>,
    /// `outputs`: the datasets this task writes (at least one); all share one partitioning.
    pub outputs: Vec<String>,
    /// `schedule`: the scheduler runs the task's intervals as they end; `None` for a task that only
    /// runs when asked, or one started by its sources' arrival (`on_arrival`).
    pub schedule: Option<Schedule>,
    /// `schedule = "on_arrival"`: a sensor. Each tick starts every partition not yet published
    /// whose external sources have arrived (their `ready` check says so), instead of following
    /// a clock.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub on_arrival: bool,
    /// `catchup`: whether intervals missed during downtime are run (off by default).
    pub catchup: Catchup,
    /// `retry`: how many attempts a step gets and how long to wait between them.
    pub retry: RetryPolicy,
    /// `exit_codes`: which exit codes of the command are worth retrying.
    pub exit_codes: ExitCodes,
    /// `timeout_s` (default 3600).
    pub timeout_s: u32,
    /// `pool` (default `"default"`).
    pub pool: String,
    /// `secrets`: names of environment variables passed to the task and redacted from its logs
    /// and from what its attempts record.
    pub secrets: Vec<String>,
    /// `log_max_bytes`: the cap on each of an attempt's logs (stdout, stderr), the project's
    /// when the task sets none; beyond it the middle of the log is dropped.
    pub log_max_bytes: u64,
    /// `params`: string parameters, part of the step's idempotency key.
    pub params: BTreeMap<String, String>,
}

/// How a task computes its output.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum TaskRun {
    /// `command = ["python3", "features.py"]`: argv, never a shell string. `files` are hashed
    /// into the code version.
    Command {
        /// `command`: the program and its arguments, run without a shell.
        argv: Vec<String>,
        /// `files`: paths relative to the workspace folder (no `..`) whose contents are hashed into the
        /// code version.
        files: Vec<String>,
    },
    /// `sql = "SELECT ..."`: a DataFusion query over the task's inputs.
    Sql {
        /// `sql`: the query text, read-only; its result is the step's output.
        query: String,
    },
}

/// `inputs = [{ dataset = "clicks", mapping = "window(-1..0)" }]` or `inputs = ["clicks"]`.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Input {
    /// The name of the dataset read, managed or external.
    pub dataset: String,
    /// `mapping` (default `same`): which of the input's partitions one step reads.
    pub mapping: Mapping,
    /// Where the input is listed, for messages about it.
    pub loc: Loc,
}

/// Which partitions of an input one step of the task reads.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Mapping {
    /// The input partitions covering the same interval (or the same static key). The default.
    Same,
    /// `window(-N..M)`: the task's own partitions from N before to M after, mapped to the input.
    Window {
        /// The first partition read, as an offset from the step's own (0; negative is earlier).
        from: i32,
        /// The last partition read, as an offset (at least `from`); a window spans at most 1000.
        to: i32,
    },
    /// Every partition of the input up to the end of the step's interval.
    All,
    /// The whole published version of the input, pinned when the step becomes ready.
    Latest,
}

/// `schedule = "@hourly" | "@daily" | "0 3 * * *"`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "expr", rename_all = "snake_case")]
pub enum Schedule {
    /// `@hourly`: once an hour.
    Hourly,
    /// `@daily`: once a day.
    Daily,
    /// A 5-field cron expression (minute hour day-of-month month day-of-week), single-spaced.
    Cron(String),
}

/// `catchup = { enabled = true, max_active_runs = 4 }`; off unless asked for.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Default)]
pub struct Catchup {
    /// `enabled` (default false): whether missed intervals are run after downtime, or only shown as debt.
    pub enabled: bool,
    /// `max_active_runs`: how many catch-up runs may be active at once; required when enabled.
    pub max_active_runs: Option<u32>,
}

/// `retry = { attempts = 3, backoff_base_ms = 1000, backoff_max_ms = 60000 }`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, serde::Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct RetryPolicy {
    /// Total attempts including the first (>= 1; default 3).
    pub attempts: u32,
    /// `backoff_base_ms` (default 1000, at most one day): the cap on the first retry's delay, in ms.
    pub backoff_base_ms: u64,
    /// `backoff_max_ms` (default 60000, at most one day): the cap on any retry's delay, in ms.
    pub backoff_max_ms: u64,
}

impl Default for RetryPolicy {
    fn default() -> Self {
        Self { attempts: 3, backoff_base_ms: 1_000, backoff_max_ms: 60_000 }
    }
}

/// `exit_codes = { transient = [75], deterministic = [65, 78] }`; others are deterministic.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct ExitCodes {
    /// `transient` (default `[75]`): exit codes retried as transient failures.
    pub transient: Vec<i32>,
    /// `deterministic` (default `[65, 78]`): exit codes never retried; may not overlap `transient`.
    pub deterministic: Vec<i32>,
}

impl Default for ExitCodes {
    fn default() -> Self {
        Self { transient: vec![75], deterministic: vec![65, 78] }
    }
}

/// `[alerts.NAME]`: a condition on the workspace watched over time (issue 34, decision 0023). It
/// fires only once the condition has held for `for_s`, once per episode, and resolves when the
/// condition clears.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct AlertRule {
    /// The rule's name: its key under `[alerts]`.
    pub name: String,
    /// `when` and its settings: what is watched, and the limit.
    pub condition: AlertCondition,
    /// `for` (default `"0s"`): how long the condition must hold before the alert fires.
    pub for_s: u64,
    /// `receivers` (optional): the `[receivers]` told when it fires and resolves.
    pub receivers: Vec<String>,
    /// `severity` (default `page`): `page` or `ticket`, passed on to receivers and Prometheus.
    pub severity: Severity,
}

/// How urgent an alert is, as receivers and Prometheus see it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Severity {
    /// Someone acts now.
    Page,
    /// Someone acts in working hours.
    Ticket,
}

impl Severity {
    /// The word in the spec, a notification and a Prometheus label.
    pub fn as_str(self) -> &'static str {
        match self {
            Severity::Page => "page",
            Severity::Ticket => "ticket",
        }
    }
}

/// What an alert rule watches (`when`). A rule without its optional subject (`task`, `pool`,
/// `dataset`) watches every task, pool or dataset of its kind, each an episode of its own.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "when", rename_all = "snake_case")]
pub enum AlertCondition {
    /// `failure_rate`: of the attempts that ended in the last `window`, the share that failed is
    /// above `above` (0 to 1), once at least `min_attempts` ended.
    FailureRate {
        /// `task` or `pool` (optional): whose attempts; every task when neither is set.
        scope: FailureScope,
        /// `above`: the share, between 0 and 1.
        above: f64,
        /// `window` (default `"1h"`): how far back attempts count.
        window_s: u64,
        /// `min_attempts` (default 3): fewer ended attempts say nothing.
        min_attempts: u32,
    },
    /// `consecutive_failures`: a task's last `at_least` ended attempts all failed.
    ConsecutiveFailures {
        /// `task` (optional): every task when absent.
        task: Option<String>,
        /// `at_least` (default 3).
        at_least: u32,
    },
    /// `freshness_lag`: the end of a scheduled dataset's newest published partition is more than
    /// `above` behind now.
    FreshnessLag {
        /// `dataset` (optional): every dataset a scheduled task writes when absent.
        dataset: Option<String>,
        /// `above`: a duration.
        above_s: u64,
    },
    /// `backlog_eta`: at the scheduler's recent pace, the backlog takes more than `above`.
    BacklogEta {
        /// `above`: a duration.
        above_s: u64,
    },
    /// `retry_budget_exhausted`: a pool's retry budget allows no retry now.
    RetryBudgetExhausted {
        /// `pool` (optional): every pool when absent.
        pool: Option<String>,
    },
    /// `source_waiting`: a step has waited for a source of `dataset` longer than `above`.
    SourceWaiting {
        /// `dataset` (optional, an `[external]` one): any source when absent.
        dataset: Option<String>,
        /// `above`: a duration.
        above_s: u64,
    },
    /// `stale_partitions`: a dataset holds more than `above` partitions built on inputs changed
    /// since.
    StalePartitions {
        /// `dataset` (optional): every dataset Tidegate writes when absent.
        dataset: Option<String>,
        /// `above` (default 0).
        above: u64,
    },
    /// `approval_waiting`: a compared backfill has waited for its approval longer than `above`.
    ApprovalWaiting {
        /// `above`: a duration.
        above_s: u64,
    },
}

/// Whose attempts a `failure_rate` rule counts.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum FailureScope {
    /// One task.
    Task(String),
    /// Every task, each on its own.
    EveryTask,
    /// The tasks of one pool, together.
    Pool(String),
}

impl AlertCondition {
    /// The `when` word.
    pub fn when(&self) -> &'static str {
        match self {
            AlertCondition::FailureRate { .. } => "failure_rate",
            AlertCondition::ConsecutiveFailures { .. } => "consecutive_failures",
            AlertCondition::FreshnessLag { .. } => "freshness_lag",
            AlertCondition::BacklogEta { .. } => "backlog_eta",
            AlertCondition::RetryBudgetExhausted { .. } => "retry_budget_exhausted",
            AlertCondition::SourceWaiting { .. } => "source_waiting",
            AlertCondition::StalePartitions { .. } => "stale_partitions",
            AlertCondition::ApprovalWaiting { .. } => "approval_waiting",
        }
    }
}

/// `[receivers.NAME]`: where notifications go: alerts that name it, and publications of the
/// datasets whose `consumers` name it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Receiver {
    /// The receiver's name: its key under `[receivers]`.
    pub name: String,
    /// `kind` and its settings.
    pub kind: ReceiverKind,
    /// `timeout_s` (default 10, at most 300): how long one delivery may take.
    pub timeout_s: u32,
}

/// How a receiver is reached.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum ReceiverKind {
    /// `kind = "webhook"`: a JSON POST, signed with HMAC-SHA256 when `secret_env` is set.
    Webhook {
        /// `url` or `url_env`: where to POST.
        url: Endpoint,
        /// `secret_env` (optional): the variable holding the signing key.
        secret_env: Option<String>,
    },
    /// `kind = "slack"`: a Slack-compatible incoming webhook (`{"text": ...}`).
    Slack {
        /// `url` or `url_env` (Slack's URLs hold their secret: prefer `url_env`).
        url: Endpoint,
    },
    /// `kind = "email"`: a mail over SMTP.
    Email {
        /// `smtp`: `host:port` of the mail server.
        smtp: String,
        /// `tls` (default `"starttls"`): `none`, `starttls` or `tls`.
        tls: SmtpTls,
        /// `from`: the sender's address.
        from: String,
        /// `to`: the recipients' addresses.
        to: Vec<String>,
        /// `username_env` and `password_env` (optional, together): the variables holding the
        /// SMTP login.
        login_env: Option<(String, String)>,
    },
}

/// A URL written in the spec, or the environment variable that holds it (for URLs that carry
/// their own secret). Messages show neither an `_env` URL nor a password.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Endpoint {
    /// `url = "..."`.
    Url(String),
    /// `url_env = "VAR"`.
    Env(String),
}

/// How the SMTP connection is secured.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum SmtpTls {
    /// Plain text (a relay on the same machine or network only).
    None,
    /// Upgraded with STARTTLS, which the server must offer.
    Starttls,
    /// TLS from the first byte (port 465).
    Tls,
}
