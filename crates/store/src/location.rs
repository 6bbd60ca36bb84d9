//! Where a state store lives, parsed once from what a user wrote (`[project] state`,
//! `TIDEGATE_STATE`): a SQLite file path or `sqlite://PATH`, a `postgres://` or `postgresql://`
//! URL, or a libpq `key=value` connection string (`host=db user=ana password=...`), parsed by the
//! `postgres` crate's own `Config`. A [`Location`]'s `Display` and `Debug` never show a secret,
//! whatever form it came in: a URL's password (`user:password@`), and the value of every setting
//! not known to be harmless (`password`, `sslpassword`, a setting this build does not know) are
//! shown as `***`. Everything that shows or logs a store's location goes through it, and so does
//! a refused one ([`Error::BadUrl`]).

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;

use crate::{Backend, Error, Result};

/// What a hidden value is shown as.
const HIDDEN: &str = "***";

/// The connection settings whose values are shown; every other setting's value is hidden.
const SHOWN_SETTINGS: &[&str] = &[
    "host",
    "hostaddr",
    "port",
    "dbname",
    "user",
    "options",
    "application_name",
    "sslmode",
    "sslnegotiation",
    "connect_timeout",
    "tcp_user_timeout",
    "keepalives",
    "keepalives_idle",
    "keepalives_interval",
    "keepalives_retries",
    "target_session_attrs",
    "channel_binding",
    "load_balance_hosts",
];

/// A state store's location: what to open, and how to show it.
#[derive(Clone)]
pub struct Location {
    place: Place,
    /// The location as written, its secrets hidden.
    shown: String,
}

/// What a location names.
#[derive(Clone)]
pub(crate) enum Place {
    /// A SQLite file.
    Sqlite(PathBuf),
    /// A PostgreSQL database, as its connection settings.
    Postgres(Box<postgres::Config>),
}

impl Location {
    /// Parses a location in any of its forms; [`Error::BadUrl`] (the text shown with its
    /// secrets hidden) for an unknown scheme, an empty path, or a PostgreSQL URL or `key=value`
    /// string the `postgres` crate refuses. A `key=value` string is never taken for a file name.
    pub fn parse(text: &str) -> Result<Self> {
        let text = text.trim();
        let lower = text.to_ascii_lowercase();
        if lower.starts_with("postgres://") || lower.starts_with("postgresql://") {
            return Self::postgres(text, redact_url(text));
        }
        if looks_like_key_value(text) {
            return Self::postgres(text, redact_key_value(text));
        }
        let path = match text.strip_prefix("sqlite://") {
            Some(path) => path,
            None if text.contains("://") => {
                return Err(bad(
                    redact_url(text),
                    "unknown scheme; expected a file path, sqlite://PATH, postgres://, postgresql:// or a libpq key=value string",
                ));
            }
            None => text,
        };
        if path.is_empty() {
            return Err(bad(text.to_owned(), "the SQLite path is empty"));
        }
        Ok(Self { place: Place::Sqlite(PathBuf::from(path)), shown: path.to_owned() })
    }

    fn postgres(text: &str, shown: String) -> Result<Self> {
        match postgres::Config::from_str(text) {
            Ok(config) => Ok(Self { place: Place::Postgres(Box::new(config)), shown }),
            Err(e) => {
                let hint = if looks_like_key_value(text) {
                    " (read as a libpq key=value connection string; for a SQLite file whose name holds '=', write sqlite://PATH)"
                } else {
                    ""
                };
                Err(bad(shown, &format!("{}{hint}", crate::postgres::describe(&e))))
            }
        }
    }

    /// The same location with a relative SQLite path taken from `root` (a workspace's folder).
    #[must_use]
    pub fn resolved_against(self, root: &Path) -> Self {
        match &self.place {
            Place::Sqlite(path) if path.is_relative() => {
                let path = root.join(path);
                Self { shown: path.display().to_string(), place: Place::Sqlite(path) }
            }
            _ => self,
        }
    }

    /// The backend the location names.
    pub fn backend(&self) -> Backend {
        match self.place {
            Place::Sqlite(_) => Backend::Sqlite,
            Place::Postgres(_) => Backend::Postgres,
        }
    }

    /// The SQLite file, for a SQLite location.
    pub fn sqlite_path(&self) -> Option<&Path> {
        match &self.place {
            Place::Sqlite(path) => Some(path),
            Place::Postgres(_) => None,
        }
    }

    /// What the location names.
    pub(crate) fn place(&self) -> &Place {
        &self.place
    }

    /// The connection settings, for a PostgreSQL location.
    pub(crate) fn postgres_config(&self) -> Option<&postgres::Config> {
        match &self.place {
            Place::Postgres(config) => Some(config),
            Place::Sqlite(_) => None,
        }
    }
}

impl FromStr for Location {
    type Err = Error;

    fn from_str(text: &str) -> Result<Self> {
        Self::parse(text)
    }
}

impl fmt::Display for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.shown)
    }
}

impl fmt::Debug for Location {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_tuple("Location").field(&self.shown).finish()
    }
}

fn bad(shown: String, reason: &str) -> Error {
    Error::BadUrl { url: shown, reason: reason.to_owned() }
}

/// Whether `text` starts like a libpq `key=value` string: a setting's name, then `=`.
fn looks_like_key_value(text: &str) -> bool {
    let name_end = text.find(|c: char| !(c.is_ascii_alphanumeric() || c == '_')).unwrap_or(text.len());
    name_end > 0
        && text.starts_with(|c: char| c.is_ascii_alphabetic() || c == '_')
        && text[name_end..].trim_start().starts_with('=')
}

fn shown_value(key: &str, value: &str) -> String {
    if SHOWN_SETTINGS.contains(&key) { value.to_owned() } else { HIDDEN.to_owned() }
}

/// A URL with its password and every setting not in [`SHOWN_SETTINGS`] hidden. The user part
/// runs to the last `@`, so that a password holding `@`, `/`, `?` or `#` unescaped is hidden
/// whole, whatever a parser would make of it.
pub(crate) fn redact_url(url: &str) -> String {
    let Some((scheme, rest)) = url.split_once("://") else { return HIDDEN.to_owned() };
    let (credentials, rest) = match rest.rsplit_once('@') {
        Some((credentials, rest)) => {
            let user = match credentials.split_once(':') {
                Some((user, _)) => format!("{user}:{HIDDEN}@"),
                None => format!("{credentials}@"),
            };
            (user, rest)
        }
        None => (String::new(), rest),
    };
    let (place, query) = rest.split_once('?').map_or((rest, None), |(place, query)| (place, Some(query)));
    let mut out = format!("{scheme}://{credentials}{place}");
    if let Some(query) = query {
        let settings: Vec<String> = query
            .split('&')
            .map(|pair| match pair.split_once('=') {
                Some((key, value)) => format!("{key}={}", shown_value(key, value)),
                None => pair.to_owned(),
            })
            .collect();
        out.push('?');
        out.push_str(&settings.join("&"));
    }
    out
}

/// A `key=value` string with the value of every setting not in [`SHOWN_SETTINGS`] hidden, read
/// with libpq's rules (values unquoted up to a space, or in single quotes with `\` escapes).
/// What cannot be read that way is hidden whole.
pub(crate) fn redact_key_value(text: &str) -> String {
    let mut shown = Vec::new();
    let mut rest = text.trim_start();
    while !rest.is_empty() {
        let Some((key, value, after)) = next_setting(rest) else {
            shown.push(HIDDEN.to_owned());
            break;
        };
        let value = shown_value(key, &value);
        let needs_quotes = value.is_empty() || value.contains(|c: char| c.is_whitespace() || c == '\'' || c == '\\');
        let value =
            if needs_quotes { format!("'{}'", value.replace('\\', "\\\\").replace('\'', "\\'")) } else { value };
        shown.push(format!("{key}={value}"));
        rest = after.trim_start();
    }
    shown.join(" ")
}

/// The first `key=value` of `text` (which starts with the key), its value unescaped, and what
/// follows it; `None` when it is not a setting.
fn next_setting(text: &str) -> Option<(&str, String, &str)> {
    let key_end = text.find(|c: char| c == '=' || c.is_whitespace())?;
    let key = &text[..key_end];
    let after_key = text[key_end..].trim_start().strip_prefix('=')?.trim_start();
    let mut value = String::new();
    let mut chars = after_key.char_indices();
    let quoted = after_key.starts_with('\'');
    if quoted {
        chars.next();
    }
    while let Some((i, c)) = chars.next() {
        match c {
            '\\' => value.push(chars.next()?.1),
            '\'' if quoted => return Some((key, value, &after_key[i + 1..])),
            c if c.is_whitespace() && !quoted => return Some((key, value, &after_key[i..])),
            c => value.push(c),
        }
    }
    (!quoted && !key.is_empty()).then_some((key, value, ""))
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `text` as a location is shown as `shown`, whether it parsed or was refused.
    fn check(text: &str, shown: &str) {
        let displayed = match Location::parse(text) {
            Ok(location) => {
                assert_eq!(format!("{location:?}"), format!("Location({shown:?})"), "Debug of {text}");
                location.to_string()
            }
            Err(Error::BadUrl { url, .. }) => url,
            Err(e) => panic!("{text}: {e}"),
        };
        assert_eq!(displayed, shown, "{text}");
        assert!(!displayed.contains("s3cr3t"), "{displayed}");
    }

    #[test]
    fn a_url_shows_no_password_in_its_user_part_or_its_settings() {
        check("postgres://ana:s3cr3t@db:5432/tidegate", "postgres://ana:***@db:5432/tidegate");
        check("postgresql://ana@db/tidegate?password=s3cr3t", "postgresql://ana@db/tidegate?password=***");
        check(
            "postgres://db/t?sslmode=disable&sslpassword=s3cr3t&application_name=tg",
            "postgres://db/t?sslmode=disable&sslpassword=***&application_name=tg",
        );
        check(
            "postgres://u@h/db?options=-c%20search_path%3Dteam_a&pass%77ord=s3cr3t",
            "postgres://u@h/db?options=-c%20search_path%3Dteam_a&pass%77ord=***",
        );
        // A password with a '/' or a '?' in it: the user part runs to the first '@'.
        check("postgres://ana:s3cr3t/x?y@db/tidegate", "postgres://ana:***@db/tidegate");
        check("postgres://ana:s3cr3t@h1:5432,h2:5433/db", "postgres://ana:***@h1:5432,h2:5433/db");
        check("postgres://ana:s3@cr#3t@db/tidegate", "postgres://ana:***@db/tidegate");
    }

    #[test]
    fn a_key_value_string_is_postgres_and_shows_no_secret_value() {
        let location = Location::parse("host=db port=5432 user=ana password=s3cr3t dbname=tidegate").expect("parses");
        assert_eq!(location.backend(), Backend::Postgres);
        assert_eq!(location.postgres_config().and_then(|c| c.get_password()), Some(&b"s3cr3t"[..]));
        check(
            "host=db port=5432 user=ana password=s3cr3t dbname=tidegate",
            "host=db port=5432 user=ana password=*** dbname=tidegate",
        );
        check(
            "host = db password = 's3cr3t with \\' quote' options='-c search_path=a'",
            "host=db password=*** options='-c search_path=a'",
        );
        // Refused by the postgres crate (it knows no passfile), still shown hidden, never a file.
        check("host=db passfile=/home/ana/s3cr3t sslpassword=s3cr3t", "host=db passfile=*** sslpassword=***");
        check("host=db password='s3cr3t", "host=db ***");
        let refused = Location::parse("host=db passfile=/x").expect_err("an unknown setting");
        assert!(refused.to_string().contains("passfile"), "{refused}");
    }

    #[test]
    fn a_file_path_is_sqlite_shown_as_it_is() {
        let location = Location::parse(".tidegate/state.db").expect("a path");
        assert_eq!(location.backend(), Backend::Sqlite);
        let resolved = location.resolved_against(Path::new("/srv/ws"));
        assert_eq!(resolved.sqlite_path(), Some(Path::new("/srv/ws/.tidegate/state.db")));
        check("/srv/ws/.tidegate/state.db", "/srv/ws/.tidegate/state.db");
        check("sqlite:///var/lib/state.db", "/var/lib/state.db");
        check("mysql://ana:s3cr3t@db/x?password=s3cr3t", "mysql://ana:***@db/x?password=***");
        assert!(matches!(Location::parse("sqlite://"), Err(Error::BadUrl { .. })));
    }
}
