//! What people type, read the same way by every front end: an instant to decide at, a duration
//! (`30d`), a reason for the journal, a table version. Each returns a message fit to show as it
//! is (front ends add the flag or field it came from).

use chrono::{DateTime, Duration, Utc};

/// An instant: RFC 3339 (`2024-01-31T00:05:00Z`), or a date, read as its midnight UTC.
pub fn instant(text: &str) -> Result<DateTime<Utc>, String> {
    if let Ok(t) = DateTime::parse_from_rfc3339(text) {
        return Ok(t.with_timezone(&Utc));
    }
    let day = chrono::NaiveDate::parse_from_str(text, "%Y-%m-%d")
        .map_err(|e| format!("{text:?} is neither an RFC 3339 instant nor a date: {e}"))?;
    Ok(day.and_hms_opt(0, 0, 0).unwrap_or_default().and_utc())
}

/// A duration for people (`humantime`): `90m`, `36h`, `30d`, `2w`, `45s`, or several parts such
/// as `1d 12h`.
pub fn duration(text: &str) -> Result<Duration, String> {
    let hint = "for example 30d, 36h, 90m or 2w";
    let parsed = humantime::parse_duration(text).map_err(|e| format!("{text:?} is not a duration ({e}); {hint}"))?;
    Duration::from_std(parsed).map_err(|_| format!("{text:?} is too long a duration"))
}

/// A reason for a decision: the journal keeps it as the why, so it must say something; trimmed.
pub fn reason(text: &str) -> Result<String, String> {
    let trimmed = text.trim();
    if trimmed.is_empty() {
        return Err("a reason must say why, in words; it is recorded in the journal".to_owned());
    }
    Ok(trimmed.to_owned())
}

/// Refuses (as invalid input) a reason that says nothing: what every operation that journals a
/// reason checks, whichever adapter (CLI, HTTP) it came through.
pub fn require_reason(text: &str) -> anyhow::Result<()> {
    match reason(text) {
        Ok(_) => Ok(()),
        Err(e) => crate::refusal::refuse(crate::refusal::Kind::Invalid, e),
    }
}

/// A Delta table version: a whole number, never negative, at most `i64::MAX`.
pub fn table_version(text: &str) -> Result<u64, String> {
    match text.parse::<i64>().ok().and_then(|v| u64::try_from(v).ok()) {
        Some(version) => Ok(version),
        None => Err(format!("a table version is a whole number in 0..={}", i64::MAX)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_take_units() {
        assert_eq!(duration("90m").map(|d| d.num_seconds()), Ok(5_400));
        assert_eq!(duration("30d").map(|d| d.num_days()), Ok(30));
        assert_eq!(duration("2w").map(|d| d.num_days()), Ok(14));
        assert_eq!(duration("1d 12h").map(|d| d.num_hours()), Ok(36));
        assert_eq!(duration("0s").map(|d| d.num_seconds()), Ok(0));
        let missing_unit = duration("30").expect_err("a number alone is refused");
        assert!(
            missing_unit.contains("\"30\" is not a duration") && missing_unit.contains("for example 30d"),
            "{missing_unit}"
        );
        assert!(duration("d").is_err());
        assert!(duration("30 days ago").is_err());
        assert!(duration("99999999999999999w").is_err());
    }

    #[test]
    fn instants_are_rfc_3339_or_dates() {
        assert_eq!(
            instant("2024-01-31T00:05:00+01:00").map(|t| t.to_rfc3339()),
            Ok("2024-01-30T23:05:00+00:00".into())
        );
        assert_eq!(instant("2024-06-01").map(|t| t.to_rfc3339()), Ok("2024-06-01T00:00:00+00:00".into()));
        assert!(instant("yesterday").is_err_and(|e| e.starts_with("\"yesterday\" is neither")));
    }

    #[test]
    fn reasons_say_something_and_versions_are_not_negative() {
        assert_eq!(reason("  wrong range "), Ok("wrong range".to_owned()));
        assert!(reason(" \t").is_err());
        assert_eq!(table_version("3"), Ok(3));
        assert!(table_version("-1").is_err() && table_version("x").is_err());
    }
}
