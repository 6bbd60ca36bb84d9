//! Parsers for the small languages inside string settings: input mappings, schedules (including
//! 5-field cron), partition start instants and time zones. They return a reason in words, which the
//! walker turns into a diagnostic; they know nothing of files or positions.

use chrono::{DateTime, Datelike, NaiveDate, NaiveDateTime, SecondsFormat, TimeZone, Utc};
use chrono_tz::Tz;

use super::reader::closest;
use crate::partition::{Grain, TimeAxis};
use crate::spec::{Mapping, Schedule};

/// The widest window an input mapping may read, in partitions, so a typo cannot fan out a step.
pub(crate) const MAX_WINDOW_PARTITIONS: i64 = 1_000;
/// The furthest a window may reach from the step's own partition.
pub(crate) const MAX_WINDOW_OFFSET: i32 = 10_000;
/// Partition starts outside these years are almost certainly typos.
const MIN_START_YEAR: i32 = 1900;
const MAX_START_YEAR: i32 = 2999;

pub(crate) const MAPPING_HELP: &str = "a mapping is \"same\" (the default), \"all\", \"latest\" or \
    \"window(-N..M)\"; \"window(-6..0)\" reads the step's partition and the 6 before it";

/// Reads `"same" | "all" | "latest" | "window(-N..M)"`.
pub(crate) fn mapping(s: &str) -> Result<Mapping, String> {
    match s {
        "same" => return Ok(Mapping::Same),
        "all" => return Ok(Mapping::All),
        "latest" => return Ok(Mapping::Latest),
        _ => {}
    }
    let Some(inner) = s.strip_prefix("window(").and_then(|r| r.strip_suffix(')')) else {
        return Err(match closest(s, ["same", "all", "latest", "window"]) {
            Some(k) => format!("unknown mapping; did you mean \"{k}\"?"),
            None => "unknown mapping".to_owned(),
        });
    };
    let (from, to) = inner.split_once("..").ok_or("a window is written window(-N..M), with two dots")?;
    let parse = |v: &str| v.trim().parse::<i32>().map_err(|_| format!("\"{}\" is not a whole number", v.trim()));
    let (from, to) = (parse(from)?, parse(to)?);
    if from > to {
        return Err(format!("the window starts at {from}, after its end {to}; write window({to}..{from})"));
    }
    if from.abs() > MAX_WINDOW_OFFSET || to.abs() > MAX_WINDOW_OFFSET {
        return Err(format!("a window may reach at most {MAX_WINDOW_OFFSET} partitions away"));
    }
    if i64::from(to) - i64::from(from) + 1 > MAX_WINDOW_PARTITIONS {
        return Err(format!(
            "a window may cover at most {MAX_WINDOW_PARTITIONS} partitions; use \"all\" to read everything"
        ));
    }
    Ok(Mapping::Window { from, to })
}

pub(crate) const CRON_HELP: &str =
    "a cron expression has 5 fields, minute hour day-of-month month day-of-week, such as \"0 3 * * *\"";

/// Reads `"@hourly" | "@daily" | "<5-field cron>"`: each field is checked here first, for a message
/// that names it, then the whole pattern by the cron library the scheduler computes fire times with.
pub(crate) fn schedule(s: &str) -> Result<Schedule, String> {
    match s {
        "@hourly" => return Ok(Schedule::Hourly),
        "@daily" => return Ok(Schedule::Daily),
        _ => {}
    }
    if let Some(name) = s.strip_prefix('@') {
        let equivalent = match name {
            "weekly" => "; write the cron expression \"0 0 * * 1\" for Mondays at midnight",
            "monthly" => "; write the cron expression \"0 0 1 * *\"",
            "yearly" | "annually" => "; write the cron expression \"0 0 1 1 *\"",
            "midnight" => "; write \"@daily\"",
            _ => "",
        };
        return Err(format!("unknown shortcut @{name}: only @hourly and @daily exist{equivalent}"));
    }
    cron(s)?;
    let schedule = Schedule::Cron(s.split_whitespace().collect::<Vec<_>>().join(" "));
    // The fields are in range; the library that computes the fire times has the last word, and a
    // pattern no date matches (the 31st of February) is refused rather than never running.
    let fires = crate::schedule::FireTimes::new(&schedule, None).map_err(|e| match e {
        crate::schedule::Error::BadCron { reason, .. } => format!("the cron library refuses it: {reason}"),
    })?;
    let from = DateTime::from_timestamp(1_704_067_200, 0).unwrap_or_default(); // 2024-01-01T00:00:00Z
    if fires.at_or_after(from).is_none() {
        return Err("no date matches it, so it would never fire".to_owned());
    }
    Ok(schedule)
}

const MONTHS: [&str; 12] = ["jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"];
const WEEKDAYS: [&str; 7] = ["sun", "mon", "tue", "wed", "thu", "fri", "sat"];

/// One cron field: its name, range and the names allowed for its values.
struct CronField {
    name: &'static str,
    min: u32,
    max: u32,
    names: &'static [&'static str],
}

const CRON_FIELDS: [CronField; 5] = [
    CronField { name: "minute", min: 0, max: 59, names: &[] },
    CronField { name: "hour", min: 0, max: 23, names: &[] },
    CronField { name: "day-of-month", min: 1, max: 31, names: &[] },
    CronField { name: "month", min: 1, max: 12, names: &MONTHS },
    // 7 is Sunday as well as 0, as in most cron implementations.
    CronField { name: "day-of-week", min: 0, max: 7, names: &WEEKDAYS },
];

fn cron(s: &str) -> Result<(), String> {
    let fields: Vec<&str> = s.split_whitespace().collect();
    if fields.len() != CRON_FIELDS.len() {
        let seconds = if fields.len() == 6 { " (a seconds field is not supported)" } else { "" };
        return Err(format!("a cron expression has 5 fields, this one has {}{seconds}", fields.len()));
    }
    for (text, field) in fields.iter().zip(&CRON_FIELDS) {
        for part in text.split(',') {
            cron_part(part, field).map_err(|why| format!("the {} field \"{text}\" {why}", field.name))?;
        }
    }
    Ok(())
}

/// `*`, `N`, `N-M`, each optionally followed by `/STEP`.
fn cron_part(part: &str, field: &CronField) -> Result<(), String> {
    let (range, step) = match part.split_once('/') {
        Some((r, s)) => (r, Some(s)),
        None => (part, None),
    };
    if let Some(step) = step {
        match step.parse::<u32>() {
            Ok(n) if n >= 1 && n <= field.max => {}
            _ => return Err(format!("has an invalid step \"{step}\": expected 1 to {}", field.max)),
        }
    }
    if range == "*" {
        return Ok(());
    }
    let (lo, hi) = match range.split_once('-') {
        Some((a, b)) => (cron_value(a, field)?, cron_value(b, field)?),
        None => {
            let v = cron_value(range, field)?;
            (v, v)
        }
    };
    if lo > hi {
        return Err(format!("has a range {range} that runs backwards"));
    }
    Ok(())
}

fn cron_value(v: &str, field: &CronField) -> Result<u32, String> {
    let lower = v.to_ascii_lowercase();
    if let Some(i) = field.names.iter().position(|n| *n == lower) {
        let first = if field.min == 0 { 0 } else { 1 };
        return u32::try_from(i).map(|i| i + first).map_err(|_| "has an invalid name".to_owned());
    }
    match v.parse::<u32>() {
        Ok(n) if (field.min..=field.max).contains(&n) => Ok(n),
        Ok(n) => Err(format!("has {n}, outside {}-{}", field.min, field.max)),
        Err(_) if v.is_empty() => Err("has an empty value".to_owned()),
        Err(_) => Err(format!("has \"{v}\", which is not a number in {}-{}", field.min, field.max)),
    }
}

/// What a partition start means: a calendar date (local midnight) or an exact instant.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Start {
    Date(NaiveDate),
    Instant(DateTime<Utc>),
}

pub(crate) const START_HELP: &str = "write a date such as \"2024-01-01\", meaning midnight in the dataset's \
    time zone, or an instant such as \"2024-01-01T00:00:00Z\"";

/// Reads `"2024-01-01"` or an RFC 3339 instant such as `"2024-01-01T00:00:00Z"`.
pub(crate) fn start(s: &str) -> Result<Start, String> {
    let start = if let Ok(d) = NaiveDate::parse_from_str(s, "%Y-%m-%d") {
        Start::Date(d)
    } else if let Ok(t) = DateTime::parse_from_rfc3339(s) {
        Start::Instant(t.with_timezone(&Utc))
    } else if NaiveDateTime::parse_from_str(s, "%Y-%m-%dT%H:%M:%S").is_ok() {
        return Err("a date and time needs a UTC offset, such as a final Z for UTC".to_owned());
    } else if looks_like_date(s) {
        return Err("no such day in the calendar".to_owned());
    } else {
        return Err("not a date or an instant".to_owned());
    };
    let year = match start {
        Start::Date(d) => d.year(),
        Start::Instant(t) => t.year(),
    };
    if !(MIN_START_YEAR..=MAX_START_YEAR).contains(&year) {
        return Err(format!("the year must be between {MIN_START_YEAR} and {MAX_START_YEAR}"));
    }
    Ok(start)
}

/// `NNNN-NN-NN`: shaped like a date, whether or not the day exists.
fn looks_like_date(s: &str) -> bool {
    s.len() == 10 && s.bytes().enumerate().all(|(i, b)| if i == 4 || i == 7 { b == b'-' } else { b.is_ascii_digit() })
}

/// The instant a start means in `zone`; a date is the first instant of that local day.
pub(crate) fn start_instant(start: Start, zone: Option<Tz>) -> DateTime<Utc> {
    match start {
        Start::Instant(t) => t,
        Start::Date(d) => {
            // Noon always exists locally; flooring it to the day handles midnights lost to DST.
            let noon = d.and_hms_opt(12, 0, 0).unwrap_or_default();
            let noon_utc = match zone {
                Some(tz) => tz.from_local_datetime(&noon).earliest().map(|t| t.with_timezone(&Utc)),
                None => None,
            };
            let noon_utc = noon_utc.unwrap_or_else(|| Utc.from_utc_datetime(&noon));
            TimeAxis::new(Grain::Day, noon_utc, zone).first
        }
    }
}

/// `Err(aligned start)` when `start` is not the beginning of a `grain` interval.
pub(crate) fn aligned(start: DateTime<Utc>, grain: Grain, zone: Option<Tz>) -> Result<(), String> {
    let first = TimeAxis::new(grain, start, zone).first;
    if first == start {
        return Ok(());
    }
    Err(match grain {
        Grain::Hour => first.to_rfc3339_opts(SecondsFormat::Secs, true),
        _ => match zone {
            Some(tz) => first.with_timezone(&tz).date_naive().to_string(),
            None => first.date_naive().to_string(),
        },
    })
}

/// Reads an IANA time zone name; the error suggests the closest name.
pub(crate) fn zone(s: &str) -> Result<Tz, Option<String>> {
    if let Ok(tz) = s.parse::<Tz>() {
        return Ok(tz);
    }
    if let Some(tz) = chrono_tz::TZ_VARIANTS.iter().find(|tz| tz.name().eq_ignore_ascii_case(s)) {
        return Err(Some(tz.name().to_owned()));
    }
    Err(closest(s, chrono_tz::TZ_VARIANTS.iter().map(|tz| tz.name())).map(str::to_owned))
}

/// Why `sql` is not one read-only query, or `None` when it is: its first keyword (after comments
/// and opening parentheses) must be SELECT, WITH or VALUES, it must not select INTO a table, and
/// nothing but comments may follow a `;`. A lexical check that names the mistake at the setting;
/// when the query runs, the lake refuses anything but reading again, by its plan.
pub(crate) fn query_problem(sql: &str) -> Option<String> {
    let chars: Vec<char> = sql.chars().collect();
    let (mut i, mut first, mut ended) = (0, None::<String>, false);
    let is_word = |c: &char| c.is_alphanumeric() || *c == '_';
    let is_query_keyword = |w: &str| matches!(w, "SELECT" | "WITH" | "VALUES");
    while i < chars.len() {
        let (c, next) = (chars[i], chars.get(i + 1).copied());
        if c == '-' && next == Some('-') {
            i = chars[i..].iter().position(|&c| c == '\n').map_or(chars.len(), |n| i + n);
        } else if c == '/' && next == Some('*') {
            i = chars[i + 2..].windows(2).position(|w| w == ['*', '/']).map_or(chars.len(), |n| i + 2 + n + 2);
        } else if c.is_whitespace() || (c == '(' && first.is_none()) {
            i += 1;
        } else if ended {
            return Some("holds more than one statement; write a single query".to_owned());
        } else if c == ';' {
            (ended, i) = (true, i + 1);
        } else if matches!(c, '\'' | '"' | '`') {
            // A quoted string or name, skipped whole so that a `;` or a keyword in it counts not.
            i = chars[i + 1..].iter().position(|&q| q == c).map_or(chars.len(), |n| i + 1 + n + 1);
            first.get_or_insert_with(String::new);
        } else if is_word(&c) {
            let word: String = chars[i..].iter().take_while(|c| is_word(c)).collect();
            i += word.chars().count();
            if first.is_none() {
                first = Some(word.to_uppercase());
            } else if word.eq_ignore_ascii_case("into") && first.as_deref().is_some_and(is_query_keyword) {
                return Some("SELECT ... INTO writes a table; select the rows without INTO".to_owned());
            }
        } else {
            first.get_or_insert_with(String::new);
            i += 1;
        }
    }
    match first.as_deref() {
        Some(word) if is_query_keyword(word) => None,
        Some(word) if !word.is_empty() => Some(format!(
            "{word} is not a query; Tidegate runs user SQL read-only, so it must start with SELECT, WITH or VALUES"
        )),
        _ => Some("is not a query; it must start with SELECT, WITH or VALUES".to_owned()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn mappings_read_windows_and_reject_backwards_ones() {
        assert_eq!(mapping("window(-6..0)"), Ok(Mapping::Window { from: -6, to: 0 }));
        assert_eq!(mapping("latest"), Ok(Mapping::Latest));
        assert!(mapping("window(0..-1)").is_err());
        assert!(mapping("window(-5000..0)").is_err());
        assert!(mapping("window(-1,0)").is_err());
    }

    #[test]
    fn cron_checks_field_count_and_ranges() {
        assert_eq!(schedule("0 3 * * *"), Ok(Schedule::Cron("0 3 * * *".to_owned())));
        assert!(schedule("*/15 0-6,22 1 jan-mar mon-fri").is_ok());
        for bad in ["0 3 * *", "60 * * * *", "0 24 * * *", "0 0 0 * *", "*/0 * * * *", "5-1 * * * *", "0 0 * * 8"] {
            assert!(schedule(bad).is_err(), "{bad:?} should be rejected");
        }
    }

    #[test]
    fn a_date_start_is_local_midnight() {
        let paris: Tz = "Europe/Paris".parse().expect("known zone");
        let start = start_instant(Start::Date(NaiveDate::from_ymd_opt(2024, 1, 1).expect("valid date")), Some(paris));
        assert_eq!(start.to_rfc3339(), "2023-12-31T23:00:00+00:00");
        assert!(aligned(start, Grain::Day, Some(paris)).is_ok());
        assert_eq!(aligned(start, Grain::Day, None), Err("2023-12-31".to_owned()));
    }

    #[test]
    fn only_one_read_only_query_is_accepted() {
        for ok in [
            "select 1",
            "  (WITH a AS (SELECT 1) SELECT * FROM a);  -- done",
            "/* why */ VALUES (1)",
            "SELECT 'a;b -- c', \"x;y\" FROM t WHERE s = 'it''s; into'",
        ] {
            assert_eq!(query_problem(ok), None, "{ok:?}");
        }
        for (bad, says) in [
            ("INSERT INTO t SELECT 1", "INSERT is not a query"),
            ("-- SELECT\nCOPY (SELECT 1) TO '/tmp/x'", "COPY is not a query"),
            ("SELECT 1; DROP TABLE t", "more than one statement"),
            ("SELECT * INTO t FROM s", "INTO"),
            ("'SELECT'", "is not a query"),
            ("", "is not a query"),
        ] {
            let problem = query_problem(bad).unwrap_or_default();
            assert!(problem.contains(says), "{bad:?}: {problem:?}");
        }
    }

    #[test]
    fn zone_suggests_the_closest_name() {
        assert_eq!(zone("Europe/Pari"), Err(Some("Europe/Paris".to_owned())));
        assert_eq!(zone("europe/paris"), Err(Some("Europe/Paris".to_owned())));
    }
}
