//! Partitions: logical intervals `[start, end)` on a time axis (hour, day, week, month; UTC unless a
//! zone is set) or static keys. A partition is never the wall-clock time a job ran.
//!
//! Interval arithmetic happens in the dataset's zone, so a day in `America/New_York` is 23 hours on
//! the spring-forward date and 25 on the fall-back date, and hours keep their UTC offset in the key.

use std::fmt;

use chrono::{
    DateTime, Datelike, Duration, FixedOffset, LocalResult, NaiveDate, NaiveDateTime, NaiveTime, Offset, TimeZone, Utc,
};
use chrono_tz::Tz;
use serde::{Deserialize, Serialize};

/// The width of a time partition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Grain {
    /// One hour; in a zone, keys carry the hour's UTC offset.
    Hour,
    /// One day, from local midnight to local midnight (23 or 25 hours across a DST change).
    Day,
    /// ISO weeks, Monday to Monday.
    Week,
    /// One calendar month, from local midnight on its first day.
    Month,
}

impl Grain {
    /// Every grain, from the shortest to the longest.
    pub const ALL: [Grain; 4] = [Grain::Hour, Grain::Day, Grain::Week, Grain::Month];

    /// The grain's name as written in the spec: `hour`, `day`, `week` or `month`.
    pub fn as_str(self) -> &'static str {
        match self {
            Grain::Hour => "hour",
            Grain::Day => "day",
            Grain::Week => "week",
            Grain::Month => "month",
        }
    }

    /// Reads a grain's name as written in the spec; `None` for anything else.
    pub fn parse(s: &str) -> Option<Grain> {
        Grain::ALL.into_iter().find(|g| g.as_str() == s)
    }
}

impl fmt::Display for Grain {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// A half-open logical interval `[start, end)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
pub struct Interval {
    /// The first instant inside the interval.
    pub start: DateTime<Utc>,
    /// The first instant after the interval (exclusive).
    pub end: DateTime<Utc>,
}

impl Interval {
    /// Whether the two intervals share at least one instant (touching ends do not overlap).
    pub fn overlaps(&self, other: &Interval) -> bool {
        self.start < other.end && other.start < self.end
    }

    /// Whether `other` lies entirely inside this interval.
    pub fn contains(&self, other: &Interval) -> bool {
        self.start <= other.start && other.end <= self.end
    }
}

/// One partition of a dataset: its key and, for time partitions, its interval.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Partition {
    /// The partition's key, such as `2024-01-05`, `2024-W01` or a static key like `eu`.
    pub key: String,
    /// The logical interval of a time partition; `None` for a static key.
    pub interval: Option<Interval>,
}

impl fmt::Display for Partition {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.key)
    }
}

/// Why a partition key or bound was not accepted.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The key is not written the way partitions of this grain are named.
    #[error("invalid partition key {key:?} for {grain} partitions: expected {expected}")]
    BadKey {
        /// The key as given.
        key: String,
        /// The grain of the axis the key was read against.
        grain: Grain,
        /// The form keys of this grain take, such as `YYYY-MM-DD`.
        expected: &'static str,
    },
    /// The key is well formed but names an instant inside an interval rather than its start.
    #[error("partition key {key:?} is not the start of a {grain} interval")]
    Unaligned {
        /// The key as given.
        key: String,
        /// The grain of the axis the key was read against.
        grain: Grain,
    },
    /// The partition starts before the dataset's first partition.
    #[error("partition {key:?} is before the dataset's first partition {first:?}")]
    BeforeStart {
        /// The key of the partition asked for.
        key: String,
        /// The key of the dataset's first partition.
        first: String,
    },
    /// The key is not one of the dataset's static partition keys.
    #[error("unknown static partition {key:?}; the keys are {known}")]
    UnknownStaticKey {
        /// The key as given.
        key: String,
        /// The declared keys, joined for the message.
        known: String,
    },
    /// A range bound is neither a partition key, a date nor a date-time.
    #[error("invalid date or time {value:?}: expected YYYY-MM-DD, YYYY-MM-DDTHH:MM[:SS] or a partition key")]
    BadBound {
        /// The bound as given.
        value: String,
    },
    /// The range's first partition comes after its last.
    #[error("--from {from} is after --to {to}")]
    EmptyRange {
        /// The key of the partition containing the lower bound.
        from: String,
        /// The key of the partition containing the upper bound.
        to: String,
    },
    /// The range expands to more than [`MAX_PARTITIONS_PER_RANGE`] partitions.
    #[error("the range holds {n} partitions, more than the limit of {limit}")]
    TooMany {
        /// How many partitions were counted before stopping (the limit plus one, not the range's size).
        n: usize,
        /// The limit, [`MAX_PARTITIONS_PER_RANGE`].
        limit: usize,
    },
}

/// The most partitions one range may expand to, so a typo in a year cannot plan a million steps.
pub const MAX_PARTITIONS_PER_RANGE: usize = 200_000;

/// A time axis: grain, first interval and zone. All interval arithmetic lives here.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TimeAxis {
    /// The width of each interval.
    pub grain: Grain,
    /// The start of the first interval, aligned to the grain by [`TimeAxis::new`].
    pub first: DateTime<Utc>,
    /// The zone whose local days, weeks and months the intervals follow; `None` for UTC.
    pub zone: Option<Tz>,
}

impl TimeAxis {
    /// An axis whose first interval is the one containing `start`.
    pub fn new(grain: Grain, start: DateTime<Utc>, zone: Option<Tz>) -> Self {
        let mut axis = Self { grain, first: start, zone };
        axis.first = axis.floor(start);
        axis
    }

    fn offset_at(&self, t: DateTime<Utc>) -> FixedOffset {
        match self.zone {
            Some(tz) => tz.offset_from_utc_datetime(&t.naive_utc()).fix(),
            None => FixedOffset::east_opt(0).expect("zero offset is valid"),
        }
    }

    fn local(&self, t: DateTime<Utc>) -> NaiveDateTime {
        t.naive_utc() + Duration::seconds(i64::from(self.offset_at(t).local_minus_utc()))
    }

    /// The instant of local midnight starting `date`; when midnight falls in a DST gap, the first
    /// instant that exists that day.
    fn midnight(&self, date: NaiveDate) -> DateTime<Utc> {
        let naive = date.and_time(NaiveTime::MIN);
        let Some(tz) = self.zone else {
            return Utc.from_utc_datetime(&naive);
        };
        let mut probe = naive;
        for _ in 0..48 {
            match tz.from_local_datetime(&probe) {
                LocalResult::Single(t) => return t.with_timezone(&Utc),
                LocalResult::Ambiguous(early, _) => return early.with_timezone(&Utc),
                LocalResult::None => probe += Duration::minutes(30),
            }
        }
        // No zone has a gap of a whole day except historical date-line moves; fall back to UTC.
        Utc.from_utc_datetime(&naive)
    }

    /// The start of the interval containing `t`.
    pub fn floor(&self, t: DateTime<Utc>) -> DateTime<Utc> {
        match self.grain {
            Grain::Hour => {
                let offset = i64::from(self.offset_at(t).local_minus_utc());
                let local = t.timestamp() + offset;
                Utc.timestamp_opt(local - local.rem_euclid(3600) - offset, 0)
                    .single()
                    .expect("an hour boundary is a valid instant")
            }
            Grain::Day => self.midnight(self.local(t).date()),
            Grain::Week => {
                let d = self.local(t).date();
                let monday = d - Duration::days(i64::from(d.weekday().num_days_from_monday()));
                self.midnight(monday)
            }
            Grain::Month => {
                let d = self.local(t).date();
                self.midnight(d.with_day(1).expect("day 1 exists in every month"))
            }
        }
    }

    /// The start of the interval `n` intervals after the one starting at `start` (n may be negative).
    pub fn shift(&self, start: DateTime<Utc>, n: i32) -> DateTime<Utc> {
        match self.grain {
            Grain::Hour => self.floor(start + Duration::hours(i64::from(n))),
            Grain::Day | Grain::Week => {
                let days = if self.grain == Grain::Day { 1 } else { 7 };
                let d = self.local(start).date() + Duration::days(i64::from(n) * days);
                self.midnight(d)
            }
            Grain::Month => {
                let d = self.local(start).date();
                let months = i64::from(d.year()) * 12 + i64::from(d.month0()) + i64::from(n);
                let year = i32::try_from(months.div_euclid(12)).unwrap_or(i32::MAX);
                let month0 = u32::try_from(months.rem_euclid(12)).unwrap_or(0);
                let first = NaiveDate::from_ymd_opt(year, month0 + 1, 1).unwrap_or(NaiveDate::MAX);
                self.midnight(first)
            }
        }
    }

    /// How many intervals lie from the one starting at `from` to the one starting at `to` (both
    /// aligned): the `n` with `shift(from, n) == to`, negative when `to` is earlier. Counted by
    /// arithmetic on the calendar, not by walking the intervals, so it costs the same for a day or
    /// a century; the estimate is then checked with [`shift`](Self::shift) and corrected, which
    /// keeps it exact for zones whose offsets change by less than an hour.
    pub fn intervals_between(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> i64 {
        let (a, b) = (self.local(from).date(), self.local(to).date());
        let mut n = match self.grain {
            Grain::Hour => (to - from).num_hours(),
            Grain::Day => (b - a).num_days(),
            Grain::Week => (b - a).num_days().div_euclid(7),
            Grain::Month => {
                let months = |d: NaiveDate| i64::from(d.year()) * 12 + i64::from(d.month0());
                months(b) - months(a)
            }
        };
        let at = |n: i64| self.shift(from, i32::try_from(n).unwrap_or(if n < 0 { i32::MIN } else { i32::MAX }));
        // Each correction moves one interval; an estimate off by more than a few is a bug, so the
        // loops are bounded rather than trusted.
        for _ in 0..4 {
            match at(n).cmp(&to) {
                std::cmp::Ordering::Less => n += 1,
                std::cmp::Ordering::Greater => n -= 1,
                std::cmp::Ordering::Equal => break,
            }
        }
        n
    }

    /// The interval starting at `start` (which must be aligned).
    pub fn interval(&self, start: DateTime<Utc>) -> Interval {
        Interval { start, end: self.shift(start, 1) }
    }

    /// The partition starting at `start` (which must be aligned).
    pub fn partition(&self, start: DateTime<Utc>) -> Partition {
        Partition { key: self.key(start), interval: Some(self.interval(start)) }
    }

    /// The key of the interval starting at `start`: `2024-01-05T07` (hour, UTC),
    /// `2024-11-03T01-0400` (hour in a zone), `2024-01-05` (day), `2024-W01` (week), `2024-01` (month).
    pub fn key(&self, start: DateTime<Utc>) -> String {
        let local = self.local(start);
        match self.grain {
            Grain::Hour => match self.zone {
                None => local.format("%Y-%m-%dT%H").to_string(),
                Some(_) => {
                    let secs = self.offset_at(start).local_minus_utc();
                    let sign = if secs < 0 { '-' } else { '+' };
                    let (h, m) = (secs.abs() / 3600, secs.abs() % 3600 / 60);
                    format!("{}{sign}{h:02}{m:02}", local.format("%Y-%m-%dT%H"))
                }
            },
            Grain::Day => local.format("%Y-%m-%d").to_string(),
            Grain::Week => {
                let w = local.date().iso_week();
                format!("{}-W{:02}", w.year(), w.week())
            }
            Grain::Month => local.format("%Y-%m").to_string(),
        }
    }

    fn expected(&self) -> &'static str {
        match (self.grain, self.zone) {
            (Grain::Hour, None) => "YYYY-MM-DDTHH",
            (Grain::Hour, Some(_)) => "YYYY-MM-DDTHH+hhmm (the hour with its UTC offset)",
            (Grain::Day, _) => "YYYY-MM-DD",
            (Grain::Week, _) => "YYYY-Www (an ISO week such as 2024-W05)",
            (Grain::Month, _) => "YYYY-MM",
        }
    }

    /// The start instant named by a partition key, checked to be aligned and not before the axis start.
    pub fn parse_key(&self, key: &str) -> Result<DateTime<Utc>, Error> {
        let bad = || Error::BadKey { key: key.to_owned(), grain: self.grain, expected: self.expected() };
        let start = match self.grain {
            Grain::Hour => {
                let (hour_part, offset) = match self.zone {
                    None => (key, None),
                    Some(_) if key.len() == 18 => {
                        let (h, o) = key.split_at(13);
                        (h, Some(o))
                    }
                    Some(_) => return Err(bad()),
                };
                let naive =
                    NaiveDateTime::parse_from_str(&format!("{hour_part}:00"), "%Y-%m-%dT%H:%M").map_err(|_| bad())?;
                let secs = match offset {
                    None => 0,
                    Some(o) => parse_offset(o).ok_or_else(bad)?,
                };
                let t = Utc.from_utc_datetime(&(naive - Duration::seconds(i64::from(secs))));
                if self.key(self.floor(t)) != key {
                    return Err(Error::Unaligned { key: key.to_owned(), grain: self.grain });
                }
                t
            }
            Grain::Day => self.midnight(NaiveDate::parse_from_str(key, "%Y-%m-%d").map_err(|_| bad())?),
            Grain::Week => {
                let (y, w) = key.split_once("-W").ok_or_else(bad)?;
                let (y, w) = (y.parse::<i32>().map_err(|_| bad())?, w.parse::<u32>().map_err(|_| bad())?);
                let monday = NaiveDate::from_isoywd_opt(y, w, chrono::Weekday::Mon).ok_or_else(bad)?;
                self.midnight(monday)
            }
            Grain::Month => {
                let first = NaiveDate::parse_from_str(&format!("{key}-01"), "%Y-%m-%d").map_err(|_| bad())?;
                if key.len() != 7 {
                    return Err(bad());
                }
                self.midnight(first)
            }
        };
        if start < self.first {
            return Err(Error::BeforeStart { key: key.to_owned(), first: self.key(self.first) });
        }
        Ok(start)
    }

    /// Reads a range bound: a partition key, a date (local midnight) or a local date-time.
    pub fn parse_bound(&self, value: &str) -> Result<DateTime<Utc>, Error> {
        if let Ok(t) = self.parse_key(value) {
            return Ok(t);
        }
        if let Ok(d) = NaiveDate::parse_from_str(value, "%Y-%m-%d") {
            return Ok(self.floor(self.midnight(d)));
        }
        if let Ok(t) = DateTime::parse_from_rfc3339(value) {
            return Ok(self.floor(t.with_timezone(&Utc)));
        }
        for fmt in ["%Y-%m-%dT%H:%M:%S", "%Y-%m-%dT%H:%M", "%Y-%m-%d %H:%M:%S", "%Y-%m-%d %H:%M"] {
            if let Ok(naive) = NaiveDateTime::parse_from_str(value, fmt) {
                let t = match self.zone {
                    None => Utc.from_utc_datetime(&naive),
                    Some(tz) => match tz.from_local_datetime(&naive) {
                        LocalResult::Single(t) | LocalResult::Ambiguous(t, _) => t.with_timezone(&Utc),
                        LocalResult::None => return Err(Error::BadBound { value: value.to_owned() }),
                    },
                };
                return Ok(self.floor(t));
            }
        }
        if let Err(e @ Error::BeforeStart { .. }) = self.parse_key(value) {
            return Err(e);
        }
        Err(Error::BadBound { value: value.to_owned() })
    }

    /// Every partition from the one containing `from` to the one containing `to`, both included.
    /// A range starting before the axis is refused, not clipped: the user asked for partitions
    /// that cannot exist, and silently planning fewer hides the mistake.
    pub fn range_inclusive(&self, from: DateTime<Utc>, to: DateTime<Utc>) -> Result<Vec<Partition>, Error> {
        let (from, to) = (self.floor(from), self.floor(to));
        if from < self.first {
            return Err(Error::BeforeStart { key: self.key(from), first: self.key(self.first) });
        }
        if from > to {
            return Err(Error::EmptyRange { from: self.key(from), to: self.key(to) });
        }
        let mut out = Vec::new();
        let mut t = from;
        while t <= to {
            if out.len() == MAX_PARTITIONS_PER_RANGE {
                return Err(Error::TooMany { n: out.len() + 1, limit: MAX_PARTITIONS_PER_RANGE });
            }
            let next = self.shift(t, 1);
            out.push(Partition { key: self.key(t), interval: Some(Interval { start: t, end: next }) });
            t = next;
        }
        Ok(out)
    }

    /// The partitions of this axis that overlap `interval`.
    pub fn overlapping(&self, interval: Interval) -> Vec<Partition> {
        if interval.end <= self.first || interval.end <= interval.start {
            return Vec::new();
        }
        let mut out = Vec::new();
        let mut t = self.floor(interval.start).max(self.first);
        while t < interval.end && out.len() < MAX_PARTITIONS_PER_RANGE {
            let next = self.shift(t, 1);
            out.push(Partition { key: self.key(t), interval: Some(Interval { start: t, end: next }) });
            t = next;
        }
        out
    }
}

fn parse_offset(s: &str) -> Option<i32> {
    let bytes = s.as_bytes();
    if bytes.len() != 5 || !matches!(bytes[0], b'+' | b'-') {
        return None;
    }
    let h: i32 = s.get(1..3)?.parse().ok()?;
    let m: i32 = s.get(3..5)?.parse().ok()?;
    let secs = h * 3600 + m * 60;
    Some(if bytes[0] == b'-' { -secs } else { secs })
}

/// True when `key` is safe to use as a static partition key and as a path segment.
pub fn is_valid_static_key(key: &str) -> bool {
    let mut chars = key.chars();
    matches!(chars.next(), Some(c) if c.is_ascii_alphanumeric())
        && key.len() <= 64
        && chars.all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.'))
        && !key.contains("..")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn utc(s: &str) -> DateTime<Utc> {
        DateTime::parse_from_rfc3339(s).expect("valid test instant").with_timezone(&Utc)
    }

    fn axis(grain: Grain, zone: Option<Tz>) -> TimeAxis {
        TimeAxis::new(grain, utc("2020-01-01T00:00:00Z"), zone)
    }

    #[test]
    fn utc_keys_round_trip_for_every_grain() {
        let t = utc("2024-03-10T07:45:00Z");
        for (grain, key) in [
            (Grain::Hour, "2024-03-10T07"),
            (Grain::Day, "2024-03-10"),
            (Grain::Week, "2024-W10"),
            (Grain::Month, "2024-03"),
        ] {
            let a = axis(grain, None);
            let start = a.floor(t);
            assert_eq!(a.key(start), key);
            assert_eq!(a.parse_key(key), Ok(start));
        }
    }

    #[test]
    fn new_york_days_are_23_and_25_hours_across_dst() {
        let a = axis(Grain::Day, Some(chrono_tz::America::New_York));
        let spring = a.parse_key("2024-03-10").expect("valid key");
        assert_eq!(a.interval(spring).end - spring, Duration::hours(23));
        let fall = a.parse_key("2024-11-03").expect("valid key");
        assert_eq!(a.interval(fall).end - fall, Duration::hours(25));
        assert_eq!(spring, utc("2024-03-10T05:00:00Z"));
    }

    #[test]
    fn new_york_fall_back_hour_appears_twice_with_distinct_keys() {
        let a = axis(Grain::Hour, Some(chrono_tz::America::New_York));
        let day = a.parse_key("2024-11-03T00-0400").expect("valid key");
        let keys: Vec<String> = (0..4).map(|n| a.key(a.shift(day, n))).collect();
        assert_eq!(keys, ["2024-11-03T00-0400", "2024-11-03T01-0400", "2024-11-03T01-0500", "2024-11-03T02-0500"]);
        for k in &keys {
            assert_eq!(a.key(a.parse_key(k).expect("round trip")), *k);
        }
    }

    #[test]
    fn intervals_between_counts_by_arithmetic_for_every_grain_and_zone() {
        let zones = [None, Some(chrono_tz::America::New_York), Some(chrono_tz::Europe::London)];
        for zone in zones {
            for grain in Grain::ALL {
                let a = axis(grain, zone);
                // Walk a stretch that crosses DST changes and compare with the count.
                let from = a.shift(a.first, 3);
                let n_max = if grain == Grain::Hour { 20_000 } else { 400 };
                let mut t = from;
                for n in 0..n_max {
                    assert_eq!(a.intervals_between(from, t), n, "{grain} {zone:?} {}", a.key(t));
                    assert_eq!(a.intervals_between(t, from), -n, "{grain} {zone:?} {}", a.key(t));
                    t = a.shift(t, 1);
                }
            }
        }
        // A century of hours is counted, not walked.
        let h = axis(Grain::Hour, None);
        let later = h.parse_key("2120-01-01T00").expect("valid key");
        assert_eq!(h.intervals_between(h.first, later), 36_524 * 24);
    }

    #[test]
    fn unaligned_and_malformed_keys_are_rejected() {
        let a = axis(Grain::Month, None);
        assert!(matches!(a.parse_key("2024-1"), Err(Error::BadKey { .. })));
        let h = axis(Grain::Hour, Some(chrono_tz::America::New_York));
        assert!(matches!(h.parse_key("2024-11-03T01-0600"), Err(Error::Unaligned { .. })));
        assert!(matches!(axis(Grain::Day, None).parse_key("2019-12-31"), Err(Error::BeforeStart { .. })));
    }

    #[test]
    fn range_is_inclusive_and_months_have_their_lengths() {
        let a = axis(Grain::Month, None);
        let r = a.range_inclusive(utc("2024-01-15T00:00:00Z"), utc("2024-03-01T00:00:00Z")).expect("range");
        let keys: Vec<&str> = r.iter().map(|p| p.key.as_str()).collect();
        assert_eq!(keys, ["2024-01", "2024-02", "2024-03"]);
        let feb = r[1].interval.expect("time partition");
        assert_eq!(feb.end - feb.start, Duration::days(29));
    }

    #[test]
    fn overlapping_maps_a_day_to_its_24_hours() {
        let hours = axis(Grain::Hour, None);
        let day = axis(Grain::Day, None).interval(utc("2024-02-01T00:00:00Z"));
        let covered = hours.overlapping(day);
        assert_eq!(covered.len(), 24);
        assert_eq!(covered[0].key, "2024-02-01T00");
        assert_eq!(covered[23].key, "2024-02-01T23");
    }

    #[test]
    fn static_keys_must_be_path_safe() {
        assert!(is_valid_static_key("eu-west_1.a"));
        for bad in ["", "../etc", "a/b", ".hidden", "_delta_log", "a..b", "é"] {
            assert!(!is_valid_static_key(bad), "{bad:?} should be rejected");
        }
    }
}
