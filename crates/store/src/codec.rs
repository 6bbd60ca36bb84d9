//! How values are written to and read from the portable columns: timestamps as RFC 3339 text
//! with milliseconds (fixed width, so text order is time order and `<` works in SQL on both
//! backends) and JSON as text.

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::{Error, Result};

/// `2024-01-01T00:00:00.000Z`.
pub(crate) fn fmt_ts(at: DateTime<Utc>) -> String {
    at.to_rfc3339_opts(SecondsFormat::Millis, true)
}

pub(crate) fn parse_ts(text: &str) -> Result<DateTime<Utc>> {
    DateTime::parse_from_rfc3339(text)
        .map(|t| t.with_timezone(&Utc))
        .map_err(|e| Error::Corrupt(format!("timestamp {text:?} is not RFC 3339: {e}")))
}

pub(crate) fn parse_opt_ts(text: Option<String>) -> Result<Option<DateTime<Utc>>> {
    text.as_deref().map(parse_ts).transpose()
}

pub(crate) fn to_json<T: Serialize + ?Sized>(value: &T) -> Result<String> {
    // Our records serialize infallibly (no maps with non-string keys, no failing Serialize impls);
    // an error here is a bug, reported as such.
    serde_json::to_string(value).map_err(|e| Error::Corrupt(format!("serializing to JSON: {e}")))
}

pub(crate) fn from_json<T: DeserializeOwned>(what: &str, text: &str) -> Result<T> {
    serde_json::from_str(text).map_err(|e| Error::Corrupt(format!("{what} holds invalid JSON: {e}")))
}

/// Database integers are signed; counters and epochs are not.
pub(crate) fn to_u64(what: &str, v: i64) -> Result<u64> {
    u64::try_from(v).map_err(|_| Error::Corrupt(format!("{what} is negative ({v})")))
}

pub(crate) fn to_u32(what: &str, v: i64) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Corrupt(format!("{what} is out of range ({v})")))
}

pub(crate) fn to_i64(what: &str, v: u64) -> Result<i64> {
    i64::try_from(v).map_err(|_| Error::InvalidRequest(format!("{what} {v} does not fit in a signed 64-bit integer")))
}

#[cfg(test)]
mod tests {
    use super::*;
    use chrono::TimeZone;

    #[test]
    fn timestamps_are_fixed_width_and_round_trip_to_the_millisecond() {
        let at = Utc.with_ymd_and_hms(2024, 1, 2, 3, 4, 5).single().expect("valid date")
            + chrono::Duration::microseconds(678_999);
        let text = fmt_ts(at);
        assert_eq!(text, "2024-01-02T03:04:05.678Z");
        assert_eq!(parse_ts(&text).expect("parses"), at - chrono::Duration::microseconds(999));
    }
}
