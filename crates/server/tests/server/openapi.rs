//! The OpenAPI document describes every success body with the schema of the type the operation
//! returns: a client generated from it gets real types, and Schemathesis checks the bodies
//! against them. A schema that accepts any value is allowed only where the payload is free-form
//! by nature, and those places are listed here.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

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
