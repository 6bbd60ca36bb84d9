//! Answers per dataset that only move when the dataset's releases do ([`Memo`]): what each
//! visible partition was built from, and which partitions are published. The web UI's overview,
//! `/metrics`, the alerts and the scheduler's every tick ask them of every dataset again and
//! again; each answer is a pass over the dataset's release items, and those only ever grow, so an
//! unchanged stamp is an unchanged answer.

use std::collections::{BTreeSet, HashMap};
use std::sync::{Arc, Mutex, PoisonError};

use crate::sql::Tx;
use crate::{Result, VisiblePartition};

/// What changes whenever a dataset's release items do: their count (they are only ever added,
/// never changed or removed: a rollback adds its own) and the newest table version they name.
/// The steps they join are published, and a published step's pins and code version no longer
/// change.
type Stamp = (i64, Option<i64>);

/// The most datasets one kind of answer keeps; past it, it starts again empty.
const DATASETS_MAX: usize = 4_096;

/// The store's remembered answers, one kind per field.
#[derive(Debug, Default)]
pub(crate) struct Memo {
    /// [`crate::Store::visible_builds`].
    pub(crate) builds: Answers<Vec<VisiblePartition>>,
    /// [`crate::Store::published_partitions`].
    pub(crate) published: Answers<BTreeSet<String>>,
}

/// The last answer per dataset, with the stamp it was read at.
#[derive(Debug)]
pub(crate) struct Answers<T>(Mutex<HashMap<String, (Stamp, Arc<T>)>>);

impl<T> Default for Answers<T> {
    fn default() -> Self {
        Answers(Mutex::new(HashMap::new()))
    }
}

impl<T> Answers<T> {
    /// `dataset`'s answer: the one held when its stamp has not moved (one indexed count instead
    /// of a pass over every item), else `compute`'s, read in the same transaction as the stamp
    /// and held from then on.
    pub(crate) fn get(
        &self,
        tx: &mut dyn Tx,
        dataset: &str,
        compute: impl FnOnce(&mut dyn Tx, &str) -> Result<T>,
    ) -> Result<Arc<T>> {
        let stamp = stamp(tx, dataset)?;
        let answers = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if let Some((held, answer)) = answers.get(dataset)
            && *held == stamp
        {
            return Ok(Arc::clone(answer));
        }
        drop(answers);
        let answer = Arc::new(compute(tx, dataset)?);
        let mut answers = self.0.lock().unwrap_or_else(PoisonError::into_inner);
        if answers.len() >= DATASETS_MAX {
            answers.clear();
        }
        answers.insert(dataset.to_owned(), (stamp, Arc::clone(&answer)));
        Ok(answer)
    }
}

fn stamp(tx: &mut dyn Tx, dataset: &str) -> Result<Stamp> {
    let rows =
        tx.query("SELECT COUNT(*), MAX(delta_version) FROM release_versions WHERE dataset = ?1", &[dataset.into()])?;
    Ok(match rows.first() {
        Some(row) => (row.int(0)?, row.opt_int(1)?),
        None => (0, None),
    })
}
