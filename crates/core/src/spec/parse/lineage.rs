//! `[lineage]`: where OpenLineage events go (a JSON-lines file, an HTTP receiver) and how the
//! receiver is reached. Settings that only make sense with `url` are refused without it.

use toml_span::value::ValueInner;

use super::reader::{Ctx, Obj, Path};
use crate::spec::{DEFAULT_LINEAGE_ENDPOINT, DEFAULT_LINEAGE_FILE, Lineage};

/// The longest a POST to the receiver may be given: five minutes.
const MAX_TIMEOUT_S: u32 = 300;
/// How long a POST may take unless `timeout_s` says otherwise.
const DEFAULT_TIMEOUT_S: u32 = 5;

const LINEAGE_KEYS: &[&str] = &["namespace", "file", "url", "endpoint", "timeout_s", "api_key_env"];
/// The settings that configure the HTTP transport, meaningless without `url`.
const HTTP_KEYS: &[&str] = &["endpoint", "timeout_s", "api_key_env"];

/// `[lineage]`, or its defaults when the file has none: events appended to
/// [`DEFAULT_LINEAGE_FILE`] in the namespace `project_name`.
pub(crate) fn lineage(ctx: &mut Ctx<'_>, root: &Obj<'_, '_>, project_name: &str) -> Lineage {
    let mut out = Lineage {
        namespace: project_name.to_owned(),
        file: Some(DEFAULT_LINEAGE_FILE.to_owned()),
        url: None,
        endpoint: DEFAULT_LINEAGE_ENDPOINT.to_owned(),
        timeout_s: DEFAULT_TIMEOUT_S,
        api_key_env: None,
    };
    let Some(obj) = root.get(ctx, "lineage").and_then(|f| f.obj(ctx)) else { return out };
    obj.allow_only(ctx, LINEAGE_KEYS);
    if let Some(namespace) = obj.get(ctx, "namespace").and_then(|f| f.non_empty_string(ctx)) {
        out.namespace = namespace;
    }
    if let Some(field) = obj.get(ctx, "file") {
        match field.value.as_ref() {
            ValueInner::Boolean(false) => out.file = None,
            ValueInner::Boolean(true) => field.invalid(
                ctx,
                true,
                "give the file's path, or false to write no file",
                Some(format!("file = \"{DEFAULT_LINEAGE_FILE}\" is the default")),
            ),
            _ => out.file = field.non_empty_string(ctx).or(out.file),
        }
    }
    out.url = obj.get(ctx, "url").and_then(|f| {
        let url = f.non_empty_string(ctx)?;
        let rest = url.strip_prefix("http://").or_else(|| url.strip_prefix("https://"));
        if rest.is_none_or(|r| r.trim_start_matches('/').is_empty()) {
            let help = Some("the receiver's base URL, such as url = \"http://localhost:5000\" for Marquez".to_owned());
            f.invalid(ctx, format!("\"{}\"", super::reader::clip(&url)), "must be an http:// or https:// URL", help);
            return None;
        }
        Some(url)
    });
    if let Some(field) = obj.get(ctx, "endpoint") {
        match field.non_empty_string(ctx) {
            Some(e) if e.contains("://") => {
                let help = Some(format!(
                    "put the host in url; endpoint is the path, \"{DEFAULT_LINEAGE_ENDPOINT}\" by default"
                ));
                field.invalid(ctx, format!("\"{}\"", super::reader::clip(&e)), "must be a path, not a URL", help);
            }
            Some(e) => out.endpoint = e.trim_start_matches('/').to_owned(),
            None => {}
        }
    }
    out.timeout_s = obj.u32_or(ctx, "timeout_s", DEFAULT_TIMEOUT_S, 1, MAX_TIMEOUT_S).unwrap_or(DEFAULT_TIMEOUT_S);
    out.api_key_env = obj.get(ctx, "api_key_env").and_then(|f| {
        let name = f.non_empty_string(ctx)?;
        let valid = name.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
        if !valid {
            let help = Some("the variable's name, such as api_key_env = \"MARQUEZ_API_KEY\"; never the key".to_owned());
            f.invalid(
                ctx,
                format!("\"{}\"", super::reader::clip(&name)),
                "must be an environment variable's name",
                help,
            );
            return None;
        }
        Some(name)
    });
    if !obj.has("url") {
        refuse_http_settings_without_url(ctx, &obj);
    }
    out
}

/// `endpoint`, `timeout_s` or `api_key_env` without `url` configure nothing: said, naming both.
fn refuse_http_settings_without_url(ctx: &mut Ctx<'_>, obj: &Obj<'_, '_>) {
    for key in HTTP_KEYS.iter().filter(|k| obj.has(k)) {
        let path: Path = obj.path.join(key);
        let Some(loc) = ctx.site(&path.full()) else { continue };
        let message = format!(
            "lineage.{key} is set but lineage.url is not: {key} configures the HTTP receiver, and there is none"
        );
        let help = Some("add url = \"http://localhost:5000\" (your receiver), or remove the setting".to_owned());
        ctx.report_at(loc, &path.full(), message, help);
    }
}
