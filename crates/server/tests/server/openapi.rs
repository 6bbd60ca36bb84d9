//! The OpenAPI document describes every success body with the schema of the type the operation
//! returns: a client generated from it gets real types, and Schemathesis checks the bodies
//! against them. A schema that accepts any value is allowed only where the payload is free-form
//! by nature, and those places are listed here.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

use crate::common::Response;

/// Where a success body holds a value of any shape, as `Schema.property`, `[]` for an array's
/// items and `{}` for a map's values: data rows, event payloads and stored documents whose shape
/// is the data's, the event's or an older build's, not the API's.
const FREE_FORM: &[&str] = &[
    // The frozen spec and the last comparison as stored: JSON a build of any age wrote. (A page's
    // schema holds its items' schema inline: utoipa composes generic schemas so.)
    "BackfillRecord.comparison",
    "BackfillRecord.spec",
    "Page_BackfillRecord.items[].comparison",
    "Page_BackfillRecord.items[].spec",
    // What the lake reported of a staged version: its files with their sizes, and per-column
    // statistics with the checks' results (a partition's steps, `GET /api/datasets/{name}/partitions/{key}`).
    "VersionRecord.files",
    "VersionRecord.stats",
    // The metadata a commit carries: Tidegate's keys, and whatever other writers of the table put.
    "Commit.metadata{}",
    // The scheduler's last gauge, as the scheduler wrote it.
    "Debt.scheduler",
    // An event's details: each kind of entry has its own.
    "JournalEntry.payload",
    "Page_JournalEntry.items[].payload",
    // Sample rows of the dataset compared.
    "PartitionComparison.sample_added[]",
    "PartitionComparison.sample_changed[]",
    "PartitionComparison.sample_removed[]",
    // A dataset's rows or a query's result.
    "Rows.rows[]",
];

#[test]
fn every_success_body_has_a_real_schema_and_is_free_form_only_where_listed() {
    let document = serde_json::to_value(tidegate_server::document()).expect("the document serialises");
    let schemas = document["components"]["schemas"].as_object().expect("components.schemas");
    let mut walk = Walk { schemas, seen: BTreeSet::new(), free_form: BTreeSet::new() };
    let mut n_bodies = 0;
    for (path, item) in document["paths"].as_object().expect("paths") {
        for (method, operation) in item.as_object().expect("a path item") {
            for (status, response) in operation["responses"].as_object().expect("responses") {
                if !status.starts_with('2') {
                    continue;
                }
                let at = format!("{method} {path} {status}");
                let content = response["content"].as_object().unwrap_or_else(|| panic!("{at}: no body"));
                // `/metrics` answers in the Prometheus text formats; every other body is JSON.
                let Some(json) = content.get("application/json") else {
                    assert!(content.keys().all(|media| media.starts_with("text/") || media.contains("openmetrics")));
                    continue;
                };
                walk.schema(&json["schema"], &at);
                n_bodies += 1;
            }
        }
    }
    assert!(n_bodies >= 30, "only {n_bodies} JSON success bodies");
    let expected: BTreeSet<String> = FREE_FORM.iter().map(|s| (*s).to_owned()).collect();
    assert_eq!(walk.free_form, expected, "free-form schemas (left) against the listed ones (right)");
}

/// Every schema reachable from the success bodies, each component once.
struct Walk<'a> {
    schemas: &'a Map<String, Value>,
    seen: BTreeSet<String>,
    free_form: BTreeSet<String>,
}

impl Walk<'_> {
    fn schema(&mut self, schema: &Value, at: &str) {
        let schema = schema.as_object().unwrap_or_else(|| panic!("{at}: a schema is an object"));
        if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
            let name = reference.strip_prefix("#/components/schemas/").expect("a component reference");
            if self.seen.insert(name.to_owned()) {
                let component = self.schemas.get(name).unwrap_or_else(|| panic!("{at}: no component {name}"));
                self.schema(component, name);
            }
            return;
        }
        const SHAPES: [&str; 7] = ["type", "allOf", "oneOf", "anyOf", "enum", "const", "properties"];
        if !SHAPES.iter().any(|shape| schema.contains_key(*shape)) {
            self.free_form.insert(at.to_owned());
            return;
        }
        for combined in ["allOf", "oneOf", "anyOf"] {
            for part in schema.get(combined).and_then(Value::as_array).into_iter().flatten() {
                self.schema(part, at);
            }
        }
        for (name, property) in schema.get("properties").and_then(Value::as_object).into_iter().flatten() {
            self.schema(property, &format!("{at}.{name}"));
        }
        if let Some(items) = schema.get("items") {
            self.schema(items, &format!("{at}[]"));
        }
        match schema.get("additionalProperties") {
            Some(Value::Bool(true)) => {
                self.free_form.insert(format!("{at}{{}}"));
            }
            Some(values @ Value::Object(_)) => self.schema(values, &format!("{at}{{}}")),
            _ => {}
        }
    }
}

/// Asserts that `response` (a success) is what the document says `method template` answers with
/// its status: the operation's own body, checked against the schema the route declares. Used by
/// stories whose routes Schemathesis reaches only with ids that name nothing.
pub fn assert_conforms(method: &str, template: &str, response: &Response) {
    if let Err(e) = check(method, template, response) {
        panic!("{method} {template} {}: {e}\n{}", response.status, response.body);
    }
}

fn check(method: &str, template: &str, response: &Response) -> Result<(), String> {
    let document = serde_json::to_value(tidegate_server::document()).expect("the document serialises");
    let operation = &document["paths"][template][method.to_lowercase()];
    let schema = &operation["responses"][response.status.to_string()]["content"]["application/json"]["schema"];
    if !schema.is_object() {
        return Err("the document declares no JSON body".to_owned());
    }
    let schemas = document["components"]["schemas"].as_object().expect("components.schemas");
    conforms(&response.json(), schema, schemas, "$")
}

#[test]
fn a_body_unlike_its_schema_is_told_apart() {
    let page = |items: Value| Response {
        status: 200,
        headers: Vec::new(),
        body: serde_json::json!({ "items": items, "next_cursor": null }).to_string(),
    };
    assert_eq!(check("GET", "/api/runs", &page(serde_json::json!([]))), Ok(()));
    let run = serde_json::json!([{ "id": "r1", "steps": {} }]);
    assert_eq!(check("GET", "/api/runs", &page(run)), Err("$.items[0]: no `request`".to_owned()));
    let entry = serde_json::json!([{ "seq": -1 }]);
    assert_eq!(check("GET", "/api/journal/entries", &page(entry)), Err("$.items[0]: no `prev_hash`".to_owned()));
}

/// The subset of JSON Schema utoipa emits: references, `allOf`/`oneOf`/`anyOf`, `type`, `enum`,
/// `required`, `properties`, `additionalProperties`, `items` and `minimum`.
fn conforms(value: &Value, schema: &Value, schemas: &Map<String, Value>, at: &str) -> Result<(), String> {
    let Some(schema) = schema.as_object() else { return Ok(()) };
    if let Some(reference) = schema.get("$ref").and_then(Value::as_str) {
        let name = reference.trim_start_matches("#/components/schemas/");
        return conforms(value, &schemas[name], schemas, at);
    }
    let parts = |key: &str| schema.get(key).and_then(Value::as_array).cloned().unwrap_or_default();
    for part in parts("allOf") {
        conforms(value, &part, schemas, at)?;
    }
    for (key, wanted) in [("oneOf", Some(1)), ("anyOf", None)] {
        let options = parts(key);
        if options.is_empty() {
            continue;
        }
        let n_ok = options.iter().filter(|o| conforms(value, o, schemas, at).is_ok()).count();
        if wanted.map_or(n_ok == 0, |n| n_ok != n) {
            return Err(format!("{at}: {n_ok} of the {key} schemas match {value}"));
        }
    }
    if let Some(types) = schema.get("type") {
        let types: Vec<&str> = match types {
            Value::Array(many) => many.iter().filter_map(Value::as_str).collect(),
            one => one.as_str().into_iter().collect(),
        };
        if !types.iter().any(|t| is_type(value, t)) {
            return Err(format!("{at}: {value} is not {}", types.join(" or ")));
        }
    }
    if let Some(allowed) = schema.get("enum").and_then(Value::as_array)
        && !allowed.contains(value)
    {
        return Err(format!("{at}: {value} is not one of {allowed:?}"));
    }
    if let (Some(minimum), Some(n)) = (schema.get("minimum").and_then(Value::as_f64), value.as_f64())
        && n < minimum
    {
        return Err(format!("{at}: {n} is below {minimum}"));
    }
    if let Some(object) = value.as_object() {
        for name in parts("required") {
            let name = name.as_str().unwrap_or_default();
            if !object.contains_key(name) {
                return Err(format!("{at}: no `{name}`"));
            }
        }
        let properties = schema.get("properties").and_then(Value::as_object);
        for (name, field) in object {
            let at = format!("{at}.{name}");
            match (properties.and_then(|p| p.get(name)), schema.get("additionalProperties")) {
                (Some(property), _) => conforms(field, property, schemas, &at)?,
                (None, Some(Value::Bool(false))) => return Err(format!("{at}: not a property")),
                (None, Some(values @ Value::Object(_))) => conforms(field, values, schemas, &at)?,
                (None, _) => {}
            }
        }
    }
    if let (Some(items), Some(array)) = (schema.get("items"), value.as_array()) {
        for (i, item) in array.iter().enumerate() {
            conforms(item, items, schemas, &format!("{at}[{i}]"))?;
        }
    }
    Ok(())
}

fn is_type(value: &Value, name: &str) -> bool {
    match name {
        "null" => value.is_null(),
        "boolean" => value.is_boolean(),
        "integer" => value.is_i64() || value.is_u64(),
        "number" => value.is_number(),
        "string" => value.is_string(),
        "array" => value.is_array(),
        "object" => value.is_object(),
        _ => false,
    }
}
