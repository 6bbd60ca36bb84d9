//! External sources' per-partition locations: a `location` holding `{...}` fields is a template
//! that names one folder (or object-store prefix) per partition, such as
//! `landing/events/{yyyy}/{mm}/{dd}`. Rendering is pure; looking at what is there is the
//! engine's (`engine::source`).

use crate::partition::Partition;

/// The fields a template may name: the partition's key, and its interval's start in the
/// dataset's partitioning (UTC) for time partitions.
pub const FIELDS: &[&str] = &["partition", "date", "yyyy", "mm", "dd", "hh"];
/// The fields that need a time partition.
const TIME_FIELDS: &[&str] = &["date", "yyyy", "mm", "dd", "hh"];

/// A location as Tidegate reads it: a URL (`s3://...`) or an absolute path as written; a relative
/// path relative to the workspace folder. Pure: nothing is looked at.
pub fn resolve(workspace: &std::path::Path, location: &str) -> String {
    if location.contains("://") || std::path::Path::new(location).is_absolute() {
        location.to_owned()
    } else {
        workspace.join(location).display().to_string()
    }
}

/// Whether `location` is a template (it names at least one `{field}`).
pub fn is_template(location: &str) -> bool {
    location.contains('{')
}

/// What is wrong with a template, in words for `validate`; `time` says whether the dataset is
/// partitioned by time.
pub fn check_template(location: &str, time: bool) -> Result<(), String> {
    let fields = fields(location)?;
    if fields.is_empty() {
        return Err(format!(
            "a template must name a partition field, one of {}",
            FIELDS.iter().map(|f| format!("{{{f}}}")).collect::<Vec<_>>().join(", ")
        ));
    }
    for f in &fields {
        if !FIELDS.contains(&f.as_str()) {
            return Err(format!(
                "unknown field {{{f}}}; a template names {}",
                FIELDS.iter().map(|f| format!("{{{f}}}")).collect::<Vec<_>>().join(", ")
            ));
        }
        if !time && TIME_FIELDS.contains(&f.as_str()) {
            return Err(format!("{{{f}}} needs a time partitioning; a dataset of static keys names {{partition}}"));
        }
    }
    Ok(())
}

/// The `{field}` names of a template, in order; an error for an unclosed or nested brace.
fn fields(location: &str) -> Result<Vec<String>, String> {
    let mut out = Vec::new();
    let mut rest = location;
    while let Some(open) = rest.find(['{', '}']) {
        if rest[open..].starts_with('}') {
            return Err("a '}' closes no '{'".to_owned());
        }
        let after = &rest[open + 1..];
        let close = after.find('}').ok_or_else(|| "a '{' is never closed".to_owned())?;
        let name = &after[..close];
        if name.contains('{') {
            return Err("braces do not nest".to_owned());
        }
        out.push(name.to_owned());
        rest = &after[close + 1..];
    }
    Ok(out)
}

/// The location of one partition: every `{field}` replaced. A template checked by
/// [`check_template`] renders every partition of its dataset.
pub fn render(location: &str, partition: &Partition) -> String {
    let start = partition.interval.map(|i| i.start);
    let value = |field: &str| -> String {
        match (field, start) {
            ("partition", _) => partition.key.clone(),
            ("date", Some(t)) => t.format("%Y-%m-%d").to_string(),
            ("yyyy", Some(t)) => t.format("%Y").to_string(),
            ("mm", Some(t)) => t.format("%m").to_string(),
            ("dd", Some(t)) => t.format("%d").to_string(),
            ("hh", Some(t)) => t.format("%H").to_string(),
            (other, _) => format!("{{{other}}}"),
        }
    };
    let mut out = String::with_capacity(location.len());
    let mut rest = location;
    while let Some(open) = rest.find('{') {
        out.push_str(&rest[..open]);
        let after = &rest[open + 1..];
        let Some(close) = after.find('}') else {
            out.push_str(&rest[open..]);
            return out;
        };
        out.push_str(&value(&after[..close]));
        rest = &after[close + 1..];
    }
    out.push_str(rest);
    out
}

#[cfg(test)]
mod tests {
    use chrono::{TimeZone as _, Utc};

    use super::*;
    use crate::partition::Interval;

    fn hour() -> Partition {
        let start = Utc.with_ymd_and_hms(2024, 3, 9, 7, 0, 0).single().expect("a time");
        Partition { key: "2024-03-09T07".to_owned(), interval: Some(Interval { start, end: start }) }
    }

    #[test]
    fn a_template_renders_each_field_of_the_partition() {
        assert_eq!(render("s3://b/land/{yyyy}/{mm}/{dd}/{hh}", &hour()), "s3://b/land/2024/03/09/07");
        assert_eq!(render("in/{date}/x-{partition}", &hour()), "in/2024-03-09/x-2024-03-09T07");
        let eu = Partition { key: "eu".to_owned(), interval: None };
        assert_eq!(render("in/{partition}", &eu), "in/eu");
    }

    #[test]
    fn a_template_must_name_a_known_partition_field() {
        assert!(check_template("in/{date}", true).is_ok());
        assert!(check_template("in/data", true).expect_err("refused").contains("must name a partition field"));
        assert!(check_template("in/{day}", true).expect_err("refused").contains("unknown field {day}"));
        assert!(check_template("in/{date", true).expect_err("refused").contains("never closed"));
        assert!(check_template("in/date}", true).expect_err("refused").contains("closes no"));
        assert!(check_template("in/{yyyy}", false).expect_err("refused").contains("needs a time partitioning"));
        assert!(check_template("in/{partition}", false).is_ok());
    }
}
