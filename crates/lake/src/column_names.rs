//! Column names a Delta table can hold: checked at staging, for the columns a dataset without
//! declared columns takes from its data, so a name the table would refuse is named with its file
//! before anything is written, never found at publication. Delta compares column names ignoring
//! case, and without column mapping (which Tidegate does not use) a name may not be empty nor hold
//! a character of Parquet's schema syntax; the Delta kernel refuses such a schema, and delta-rs
//! refuses case-insensitive duplicates only when it commits.

use std::collections::{HashMap, HashSet};

use arrow::datatypes::{Schema, SchemaRef};
use tidegate_core::spec::model::{COLUMN_NAME_FORBIDDEN_CHARS as FORBIDDEN_CHARS, Dataset};

use crate::error::{Error, FileLocation, Result};

/// Refuses a name that `data` (the schemas of the rows or files a step stages, each with where it
/// came from) would add to `dataset`'s table (`table`: its schema, `None` before it exists) and
/// that the table could not hold: one that differs from another only in case (within one input,
/// across inputs, against the table's columns and its partition column), an empty one, one with a
/// character Delta forbids ([`FORBIDDEN_CHARS`]), or one an input names twice.
pub(crate) fn check_new_columns(
    dataset: &Dataset,
    table: Option<&Schema>,
    data: &[(FileLocation, SchemaRef)],
) -> Result<()> {
    let refuse = |location: &FileLocation, column: &str, detail: String| Error::SchemaMismatch {
        dataset: dataset.name.clone(),
        location: location.clone(),
        column: column.to_owned(),
        detail,
    };
    // Every name the table will hold, by its case-folded form: the name as spelled, and whose it is.
    let mut taken: HashMap<String, (String, Owner<'_>)> = HashMap::new();
    let partition = &dataset.partition_column;
    taken.insert(partition.to_lowercase(), (partition.clone(), Owner::Partition));
    for field in table.iter().flat_map(|t| t.fields().iter()) {
        let owner = if field.name() == partition { Owner::Partition } else { Owner::Table };
        taken.insert(field.name().to_lowercase(), (field.name().clone(), owner));
    }
    for (location, schema) in data {
        let mut here = HashSet::new();
        for name in schema.fields().iter().map(|f| f.name().as_str()) {
            if !here.insert(name) {
                return Err(refuse(location, name, "named twice; a table holds one column of a name".to_owned()));
            }
            match taken.get(&name.to_lowercase()) {
                Some((spelled, _)) if spelled == name => {}
                Some((spelled, owner)) => return Err(refuse(location, name, owner.collision(spelled, location))),
                None => {
                    if let Some(why) = unholdable(name) {
                        // A query names an expression after itself: `count(*)`.
                        let hint = match location {
                            FileLocation::Batches => "; in the query, name the column with AS",
                            _ => "",
                        };
                        return Err(refuse(location, name, format!("{why}{hint}")));
                    }
                    taken.insert(name.to_lowercase(), (name.to_owned(), Owner::Input(location)));
                }
            }
        }
    }
    Ok(())
}

/// Whose a column name is: the table's, its partition column's, or an input's.
enum Owner<'a> {
    Table,
    Partition,
    Input(&'a FileLocation),
}

impl Owner<'_> {
    /// Why a name that differs from `spelled` (this owner's) only in case, found at `at`, is refused.
    fn collision(&self, spelled: &str, at: &FileLocation) -> String {
        let whose = match self {
            Owner::Table => format!("the table's column \"{spelled}\""),
            Owner::Partition => format!("the partition column \"{spelled}\""),
            Owner::Input(location) if *location == at => format!("column \"{spelled}\" of the same input"),
            Owner::Input(FileLocation::File(file)) => format!("column \"{spelled}\" of {file}"),
            Owner::Input(_) => format!("column \"{spelled}\" of the same rows"),
        };
        format!(
            "differs from {whose} only in case; Delta compares column names ignoring case, so one table cannot \
             hold both: write \"{spelled}\" for the same column, or give this one another name"
        )
    }
}

/// Why a Delta table cannot hold a column named `name`, if it cannot.
fn unholdable(name: &str) -> Option<String> {
    if name.is_empty() {
        return Some("a column needs a name, and this one is empty (an empty header field or JSON key)".to_owned());
    }
    let mut found: Vec<char> = name.chars().filter(|c| FORBIDDEN_CHARS.contains(c)).collect();
    found.dedup();
    if found.is_empty() {
        return None;
    }
    let shown: Vec<String> = found.iter().map(|c| show_char(*c)).collect();
    Some(format!(
        "the name holds {}, which a Delta table cannot hold in a column name (Parquet's schema syntax uses \
         them: {}); rename the column",
        shown.join(", "),
        FORBIDDEN_CHARS.iter().map(|c| show_char(*c)).collect::<Vec<_>>().join(" ")
    ))
}

fn show_char(c: char) -> String {
    match c {
        ' ' => "' ' (a space)".to_owned(),
        '\t' => "a tab".to_owned(),
        '\n' => "a newline".to_owned(),
        other => format!("'{other}'"),
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use arrow::datatypes::{DataType, Field};
    use tidegate_core::spec::model::{DatasetKind, Loc, Partitioning, ReviewFlags, WriteMode};

    use super::*;

    fn free() -> Dataset {
        Dataset {
            name: "free".to_owned(),
            loc: Loc::default(),
            partitioning: Partitioning::Static { keys: vec![] },
            partition_column: "tg_partition".to_owned(),
            kind: DatasetKind::Managed { write: WriteMode::Replace },
            consumers: vec![],
            slice_columns: vec![],
            columns: vec![],
            checks: vec![],
            review_flags: ReviewFlags::DEFAULT,
            rewrites: tidegate_core::spec::Rewrites::Review,
            stale: tidegate_core::spec::StalePolicy::Report,
        }
    }

    fn schema(names: &[&str]) -> SchemaRef {
        Arc::new(Schema::new(names.iter().map(|n| Field::new(*n, DataType::Int64, true)).collect::<Vec<_>>()))
    }

    /// The column the check refuses, or `None`.
    fn refused(table: Option<&[&str]>, data: &[&[&str]]) -> Option<String> {
        let table = table.map(schema);
        let data: Vec<(FileLocation, SchemaRef)> = data
            .iter()
            .enumerate()
            .map(|(i, names)| (FileLocation::File(format!("f{i}.csv")), schema(names)))
            .collect();
        match check_new_columns(&free(), table.as_deref(), &data) {
            Ok(()) => None,
            Err(Error::SchemaMismatch { column, .. }) => Some(column),
            Err(other) => panic!("{other}"),
        }
    }

    #[test]
    fn names_a_table_could_not_hold_are_refused() {
        assert_eq!(refused(None, &[&["id", "value"], &["id", "extra"]]), None);
        assert_eq!(refused(Some(&["id", "tg_partition"]), &[&["id", "tg_partition"]]), None);
        assert_eq!(refused(None, &[&["id", "ID"]]), Some("ID".to_owned()));
        assert_eq!(refused(None, &[&["x"], &["X"]]), Some("X".to_owned()));
        assert_eq!(refused(Some(&["id", "tg_partition"]), &[&["Id"]]), Some("Id".to_owned()));
        assert_eq!(refused(None, &[&["TG_Partition"]]), Some("TG_Partition".to_owned()));
        assert_eq!(refused(None, &[&["Straße"], &["STRASSE"]]), None, "full case folding is not Delta's rule");
        assert_eq!(refused(None, &[&["Émile"], &["émile"]]), Some("émile".to_owned()));
        assert_eq!(refused(None, &[&["a", "a"]]), Some("a".to_owned()));
        assert_eq!(refused(None, &[&[""]]), Some(String::new()));
        for bad in ["my col", "a,b", "a;b", "{a}", "f(x)", "x=y", "a\tb", "a\nb"] {
            assert_eq!(refused(None, &[&[bad]]), Some(bad.to_owned()), "{bad:?}");
        }
        // A name the table already holds is the table's business, not the new data's.
        assert_eq!(refused(Some(&["my col", "tg_partition"]), &[&["my col"]]), None);
        for fine in ["a.b", "naïve", "_x", "x-y", "1st", "Ünïcode"] {
            assert_eq!(refused(None, &[&[fine]]), None, "{fine:?}");
        }
    }
}
