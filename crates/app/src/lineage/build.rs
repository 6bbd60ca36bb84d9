//! Journal entries to OpenLineage run events: a pure function of the entries, the records they
//! name (looked up by the exporter beforehand) and the workspace's names. No IO, no clock: the
//! same entries and records always give the same events, so a re-sent batch is byte for byte
//! what was sent before (consumers dedupe by runId, eventType and eventTime).
//!
//! Three kinds of OpenLineage run, each with a START and one of COMPLETE, FAIL or ABORT:
//! - a step attempt (job: the task), child of its Tidegate run;
//! - a Tidegate run (job `run.TARGET`), child of its backfill when it executes one;
//! - a backfill (job `backfill.TARGET`); and a rollback release (job `rollback`), child of the
//!   backfill or run it undoes.

use std::collections::{BTreeMap, BTreeSet};

use chrono::{DateTime, SecondsFormat, Utc};
use serde::Serialize;
use serde_json::{Map, Value, json};
use tidegate_core::idempotency::PinnedInput;
use tidegate_core::partition::Interval;
use tidegate_store::{
    AttemptRecord, BackfillRecord, JournalEntry, ReleaseItem, ReleaseRecord, RunRecord, RunRequest, StepRecord,
};
use uuid::Uuid;

/// The OpenLineage spec version the events follow (the vendored schemas' version).
pub const SCHEMA_URL: &str = "https://openlineage.io/spec/2-0-2/OpenLineage.json#/$defs/RunEvent";
/// The namespace of the UUIDv5 run ids Tidegate derives (attempts, backfills, rollbacks): fixed
/// forever, or re-sent events would stop matching the ones sent before.
pub const RUN_ID_NAMESPACE: Uuid = Uuid::from_u128(0x6f0e_2a1c_9b53_4c7e_a0d4_1f6b_8e2d_7c35);

/// Statuses in which an attempt is still open: an event taking a step out of one ends it.
const OPEN_ATTEMPT: &[&str] = &["running", "staged", "validating", "validated"];

/// A run event's transition.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum EventType {
    /// The run began.
    Start,
    /// The run ended well.
    Complete,
    /// The run ended with an error.
    Fail,
    /// The run was stopped before it ended (cancelled, superseded, its lease lost).
    Abort,
}

/// One OpenLineage `RunEvent`, as sent.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct RunEvent {
    /// START, COMPLETE, FAIL or ABORT.
    pub event_type: EventType,
    /// When the journal recorded the transition, RFC 3339 with milliseconds.
    pub event_time: String,
    /// Tidegate, at its version.
    pub producer: String,
    /// The OpenLineage schema the event follows.
    #[serde(rename = "schemaURL")]
    pub schema_url: &'static str,
    /// The run: its id and facets.
    pub run: Run,
    /// The job the run is an instance of.
    pub job: Job,
    /// The datasets read, with the Delta versions pinned.
    pub inputs: Vec<Dataset>,
    /// The datasets written, with the Delta versions published where known.
    pub outputs: Vec<Dataset>,
}

/// An event's run.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Run {
    /// A UUID: a Tidegate run's own id, or a UUIDv5 derived from what the run is.
    pub run_id: String,
    /// `parent`, `nominalTime`, `processing_engine`, `errorMessage`, `tidegate`.
    pub facets: Map<String, Value>,
}

/// An event's job.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Job {
    /// The workspace's lineage namespace.
    pub namespace: String,
    /// The task, `run.TARGET`, `backfill.TARGET` or `rollback`.
    pub name: String,
    /// `jobType`.
    pub facets: Map<String, Value>,
}

/// An input or output dataset, named by where its Delta table is (OpenLineage's naming).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Dataset {
    /// `file`, or the object store and bucket (`s3://bucket`).
    pub namespace: String,
    /// The table's path in that namespace.
    pub name: String,
    /// `version` (the Delta table version) and `symlinks` (the dataset's name in the spec).
    pub facets: BTreeMap<String, Value>,
}

/// An event and the journal entry it comes from.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Emitted {
    /// The entry's sequence number: a transport that took this event has taken the entry.
    pub seq: u64,
    /// The event.
    pub event: RunEvent,
}

/// Where a dataset's table is, as OpenLineage names it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Location {
    /// `file` or `s3://bucket`.
    pub namespace: String,
    /// The table's path.
    pub name: String,
}

/// What a task's events need from the spec.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TaskInfo {
    /// The datasets it writes.
    pub outputs: Vec<String>,
    /// `SQL` or `COMMAND`: what an error message of its attempts comes from.
    pub language: &'static str,
}

/// The workspace's names and Tidegate's identity: everything the events need that is not in the
/// journal or the store.
#[derive(Debug, Clone)]
pub struct Context {
    /// The jobs' namespace (`[lineage] namespace`).
    pub namespace: String,
    /// The events' `producer` and the facets' `_producer`.
    pub producer: String,
    /// The `_schemaURL` of the `tidegate` run facet.
    pub facet_schema_url: String,
    /// Tidegate's version, for `processing_engine`.
    pub version: String,
    /// Each dataset's table location.
    pub datasets: BTreeMap<String, Location>,
    /// Each task's outputs and language.
    pub tasks: BTreeMap<String, TaskInfo>,
}

/// The records a batch of entries names, looked up by the exporter (see [`Needs`]).
#[derive(Debug, Clone, Default)]
pub struct Records {
    /// Steps, by id.
    pub steps: BTreeMap<String, StepRecord>,
    /// Each step's attempts, by step id.
    pub attempts: BTreeMap<String, Vec<AttemptRecord>>,
    /// Each step's code version (its own, or for a step stored before it had one, its
    /// `step_planned` entry's), by step id.
    pub code_versions: BTreeMap<String, String>,
    /// Runs, by id.
    pub runs: BTreeMap<String, RunRecord>,
    /// Releases, by id.
    pub releases: BTreeMap<String, ReleaseRecord>,
    /// Backfills, by id.
    pub backfills: BTreeMap<String, BackfillRecord>,
}

/// The ids a batch of entries needs looked up before [`events`] can describe them.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Needs {
    /// Steps (with their attempts and code versions).
    pub steps: BTreeSet<String>,
    /// Runs.
    pub runs: BTreeSet<String>,
    /// Releases.
    pub releases: BTreeSet<String>,
    /// Backfills.
    pub backfills: BTreeSet<String>,
}

/// The step event kinds that start or end an attempt.
const ATTEMPT_KINDS: &[&str] = &[
    "claimed",
    "checks_passed",
    "published",
    "attempt_failed",
    "checks_failed",
    "lease_expired",
    "cancelled",
    "superseded",
    "refused",
];

/// What [`events`] will look up for `entries`.
pub fn needs(entries: &[JournalEntry]) -> Needs {
    let mut needs = Needs::default();
    for e in entries {
        let text = |key: &str| e.payload.get(key).and_then(Value::as_str).map(str::to_owned);
        match e.kind.as_str() {
            kind if e.step_id.is_some() && ATTEMPT_KINDS.contains(&kind) => {
                needs.steps.extend(e.step_id.clone());
                needs.runs.extend(e.run_id.clone());
                if kind == "published" {
                    needs.releases.extend(text("release"));
                }
            }
            "run_status" => needs.runs.extend(e.run_id.clone()),
            "backfill_planned" | "backfill_failed" | "backfill_cancelled" => {
                needs.backfills.extend(text("backfill_id"))
            }
            "backfill_published" => {
                needs.backfills.extend(text("backfill_id"));
                needs.releases.extend(text("release_id"));
            }
            "release_restored" => {
                needs.backfills.extend(text("backfill_id"));
                needs.runs.extend(text("run_id"));
            }
            _ => {}
        }
    }
    needs
}

/// The run events of `entries`, in journal order (one entry gives none, one or two).
pub fn events(entries: &[JournalEntry], ctx: &Context, records: &Records) -> Vec<Emitted> {
    let builder = Builder { ctx, records };
    entries
        .iter()
        .flat_map(|entry| builder.of(entry).into_iter().map(|event| Emitted { seq: entry.seq, event }))
        .collect()
}

/// The OpenLineage run id of attempt `attempt` of step `step_id`.
pub fn attempt_run_id(step_id: &str, attempt: u32) -> Uuid {
    Uuid::new_v5_compatible(&format!("attempt/{step_id}/{attempt}"))
}

/// The OpenLineage run id of backfill `id`.
pub fn backfill_run_id(id: &str) -> Uuid {
    Uuid::new_v5_compatible(&format!("backfill/{id}"))
}

/// A UUIDv5 in [`RUN_ID_NAMESPACE`] (uuid's `v5` feature would change the crate's features for
/// the whole dependency tree, so the SHA-1 comes from `sha1_smol`, as uuid's own does).
trait NewV5 {
    fn new_v5_compatible(name: &str) -> Uuid;
}

impl NewV5 for Uuid {
    fn new_v5_compatible(name: &str) -> Uuid {
        let mut hasher = sha1_smol::Sha1::new();
        hasher.update(RUN_ID_NAMESPACE.as_bytes());
        hasher.update(name.as_bytes());
        let digest = hasher.digest().bytes();
        let mut bytes = [0u8; 16];
        bytes.copy_from_slice(&digest[..16]);
        uuid::Builder::from_sha1_bytes(bytes).into_uuid()
    }
}

/// The `parent` facet's target: a run of a job.
struct RunRef {
    run_id: String,
    job: String,
}

struct Builder<'a> {
    ctx: &'a Context,
    records: &'a Records,
}

impl Builder<'_> {
    fn of(&self, e: &JournalEntry) -> Vec<RunEvent> {
        match e.kind.as_str() {
            "run_created" => self.run_started(e).into_iter().collect(),
            "run_status" => self.run_ended(e).into_iter().collect(),
            "backfill_planned" => self.backfill(e, EventType::Start).into_iter().collect(),
            "backfill_published" => self.backfill(e, EventType::Complete).into_iter().collect(),
            "backfill_failed" => self.backfill(e, EventType::Fail).into_iter().collect(),
            "backfill_cancelled" => self.backfill(e, EventType::Abort).into_iter().collect(),
            "release_restored" => self.rollback(e),
            kind if e.step_id.is_some() && ATTEMPT_KINDS.contains(&kind) => self.attempt(e).into_iter().collect(),
            _ => Vec::new(),
        }
    }

    // ----- Step attempts. -----

    /// The attempt event an entry of a step is, if it starts or ends an attempt.
    fn attempt(&self, e: &JournalEntry) -> Option<RunEvent> {
        let step = self.records.steps.get(e.step_id.as_deref()?)?;
        let to = e.to_status.as_deref()?;
        let from = e.from_status.as_deref().unwrap_or_default();
        let epoch = e.payload.get("epoch").and_then(Value::as_u64);
        let reason = e.payload.get("reason").and_then(Value::as_str);
        let (event_type, attempt) = match e.kind.as_str() {
            "claimed" => (EventType::Start, self.attempt_of(step, epoch?)?),
            "checks_passed" if to == "awaiting_approval" => (EventType::Complete, self.attempt_of(step, epoch?)?),
            // A backfill's step completed when it was staged and validated; its publication is the backfill's.
            "published" if !step.state.needs_approval => (EventType::Complete, self.attempt_of(step, epoch?)?),
            "attempt_failed" | "checks_failed" => (EventType::Fail, self.attempt_of(step, epoch?)?),
            "lease_expired" => (EventType::Abort, self.attempt_of(step, epoch?)?),
            // Terminal: the attempt they end is the step's last.
            "cancelled" | "superseded" if OPEN_ATTEMPT.contains(&from) => (EventType::Abort, step.state.attempt),
            // Refused at publication (decision 0020): the validated attempt's output is not published.
            "refused" if OPEN_ATTEMPT.contains(&from) => (EventType::Fail, step.state.attempt),
            _ => return None,
        };
        let run = self.records.runs.get(&step.run_id)?;
        let release = (e.kind == "published")
            .then(|| e.payload.get("release").and_then(Value::as_str))
            .flatten()
            .and_then(|id| self.records.releases.get(id));
        let mut facets = self.engine_facets();
        let mut tidegate = self.tidegate_facet(e, "attempt");
        facets.insert("parent".to_owned(), self.parent(&run_ref(run), backfill_of(run).as_ref()));
        if let Some(interval) = step.interval {
            facets.insert("nominalTime".to_owned(), self.nominal_time(interval));
        }
        let language = self.ctx.tasks.get(&step.task).map_or("COMMAND", |t| t.language);
        let message = match (event_type, e.kind.as_str(), reason) {
            (_, "lease_expired", _) => Some(format!("the lease of attempt {attempt} expired without a heartbeat")),
            (_, _, Some(reason)) => Some(reason.to_owned()),
            _ => None,
        };
        if let (EventType::Fail, Some(message)) = (event_type, &message) {
            facets.insert("errorMessage".to_owned(), self.error_message(message, language));
        }
        tidegate.insert("runId".to_owned(), json!(step.run_id));
        tidegate.insert("stepId".to_owned(), json!(step.id));
        tidegate.insert("step".to_owned(), json!(step.name));
        tidegate.insert("task".to_owned(), json!(step.task));
        tidegate.insert("partition".to_owned(), json!(step.partition));
        tidegate.insert("attempt".to_owned(), json!(attempt));
        tidegate.insert("stepKey".to_owned(), json!(step.step_key));
        if let Some(code) = self.records.code_versions.get(&step.id) {
            tidegate.insert("codeVersion".to_owned(), json!(code));
        }
        if let Some(release) = release {
            tidegate.insert("releaseId".to_owned(), json!(release.id));
        }
        if let Some(backfill) = &run.request.backfill_id {
            tidegate.insert("backfillId".to_owned(), json!(backfill));
        }
        if let (EventType::Abort, Some(message)) = (event_type, message) {
            tidegate.insert("reason".to_owned(), json!(message));
        }
        facets.insert("tidegate".to_owned(), Value::Object(tidegate));
        let outputs = match release {
            Some(release) => self.released(&release.items),
            None => self.unversioned(self.ctx.tasks.get(&step.task).map(|t| t.outputs.as_slice()).unwrap_or_default()),
        };
        Some(RunEvent {
            run: Run { run_id: attempt_run_id(&step.id, attempt).to_string(), facets },
            job: self.job(&step.task, "TASK"),
            inputs: self.pinned(&step.state.pinned, &BTreeSet::new()),
            outputs,
            ..self.envelope(event_type, e.at)
        })
    }

    /// The number of the attempt that ran under lease epoch `epoch`.
    fn attempt_of(&self, step: &StepRecord, epoch: u64) -> Option<u32> {
        self.records.attempts.get(&step.id)?.iter().find(|a| a.epoch == epoch).map(|a| a.attempt)
    }

    // ----- Tidegate runs. -----

    fn run_started(&self, e: &JournalEntry) -> Option<RunEvent> {
        let request: RunRequest = serde_json::from_value(e.payload.clone()).ok()?;
        let run_id = e.run_id.clone()?;
        Some(self.run_event(e, EventType::Start, &run_id, &request, None))
    }

    fn run_ended(&self, e: &JournalEntry) -> Option<RunEvent> {
        let (event_type, message) = match e.to_status.as_deref()? {
            "succeeded" => (EventType::Complete, None),
            "failed" => {
                let n_failed = e.payload.get("failed").and_then(Value::as_u64).unwrap_or(0);
                (EventType::Fail, Some(format!("{n_failed} of its steps failed")))
            }
            "cancelled" => (EventType::Abort, None),
            _ => return None,
        };
        let run = self.records.runs.get(e.run_id.as_deref()?)?;
        Some(self.run_event(e, event_type, &run.id, &run.request, message))
    }

    fn run_event(
        &self,
        e: &JournalEntry,
        event_type: EventType,
        run_id: &str,
        request: &RunRequest,
        message: Option<String>,
    ) -> RunEvent {
        let mut facets = self.engine_facets();
        let mut tidegate = self.tidegate_facet(e, "run");
        if let Some(backfill) = backfill_ref(request) {
            facets.insert("parent".to_owned(), self.parent(&backfill, None));
        }
        if let Some(message) = &message {
            facets.insert("errorMessage".to_owned(), self.error_message(message, "RUST"));
        }
        tidegate.insert("runId".to_owned(), json!(run_id));
        tidegate.insert("target".to_owned(), json!(request.target));
        tidegate.insert("trigger".to_owned(), json!(request.trigger));
        tidegate.insert("specHash".to_owned(), json!(request.spec_hash));
        if let Some(backfill) = &request.backfill_id {
            tidegate.insert("backfillId".to_owned(), json!(backfill));
        }
        facets.insert("tidegate".to_owned(), Value::Object(tidegate));
        RunEvent {
            run: Run { run_id: run_id.to_owned(), facets },
            job: self.job(&run_job(&request.target), "RUN"),
            ..self.envelope(event_type, e.at)
        }
    }

    // ----- Backfills and rollbacks. -----

    fn backfill(&self, e: &JournalEntry, event_type: EventType) -> Option<RunEvent> {
        let id = e.payload.get("backfill_id").and_then(Value::as_str)?;
        let record = self.records.backfills.get(id)?;
        let target = record.spec.get("target").and_then(Value::as_str)?;
        let release = e.payload.get("release_id").and_then(Value::as_str).and_then(|r| self.records.releases.get(r));
        let mut facets = self.engine_facets();
        let mut tidegate = self.tidegate_facet(e, "backfill");
        if event_type == EventType::Fail {
            facets.insert("errorMessage".to_owned(), self.error_message(&e.reason, "RUST"));
        }
        tidegate.insert("backfillId".to_owned(), json!(id));
        tidegate.insert("target".to_owned(), json!(target));
        tidegate.insert("specHash".to_owned(), json!(record.spec_hash));
        if let Some(run_id) = &record.run_id {
            tidegate.insert("runId".to_owned(), json!(run_id));
        }
        if let Some(release) = release {
            tidegate.insert("releaseId".to_owned(), json!(release.id));
        }
        if event_type == EventType::Abort {
            tidegate.insert("reason".to_owned(), json!(e.reason));
        }
        facets.insert("tidegate".to_owned(), Value::Object(tidegate));
        let (inputs, outputs) = match (event_type, release) {
            (EventType::Complete, Some(release)) => {
                let written: BTreeSet<&str> = release.items.iter().map(|i| i.dataset.as_str()).collect();
                (self.pinned(&frozen_inputs(record), &written), self.released(&release.items))
            }
            _ => (Vec::new(), Vec::new()),
        };
        Some(RunEvent {
            run: Run { run_id: backfill_run_id(id).to_string(), facets },
            job: self.job(&backfill_job(target), "BACKFILL"),
            inputs,
            outputs,
            ..self.envelope(event_type, e.at)
        })
    }

    /// A rollback release: a START and a COMPLETE at once (it is recorded once it is done), the
    /// versions it restored as outputs, a child of the backfill or run it undoes.
    fn rollback(&self, e: &JournalEntry) -> Vec<RunEvent> {
        let Ok(release) = serde_json::from_value::<ReleaseRecord>(e.payload.clone()) else { return Vec::new() };
        let parent = match (&release.backfill_id, &release.run_id) {
            (Some(id), _) => self
                .records
                .backfills
                .get(id)
                .and_then(|b| b.spec.get("target").and_then(Value::as_str))
                .map(|target| RunRef { run_id: backfill_run_id(id).to_string(), job: backfill_job(target) }),
            (None, Some(run_id)) => self.records.runs.get(run_id).map(run_ref),
            (None, None) => None,
        };
        let mut facets = self.engine_facets();
        let mut tidegate = self.tidegate_facet(e, "rollback");
        if let Some(parent) = &parent {
            facets.insert("parent".to_owned(), self.parent(parent, None));
        }
        tidegate.insert("releaseId".to_owned(), json!(release.id));
        if let Some(undone) = &release.restores_release_id {
            tidegate.insert("restoresReleaseId".to_owned(), json!(undone));
        }
        if let Some(id) = &release.backfill_id {
            tidegate.insert("backfillId".to_owned(), json!(id));
        }
        if let Some(id) = &release.run_id {
            tidegate.insert("runId".to_owned(), json!(id));
        }
        tidegate.insert("reason".to_owned(), json!(e.reason));
        facets.insert("tidegate".to_owned(), Value::Object(tidegate));
        let run_id = Uuid::new_v5_compatible(&format!("release/{}", release.id)).to_string();
        let job = self.job("rollback", "ROLLBACK");
        let start = RunEvent {
            run: Run { run_id: run_id.clone(), facets: facets.clone() },
            job: job.clone(),
            ..self.envelope(EventType::Start, e.at)
        };
        let complete = RunEvent {
            run: Run { run_id, facets },
            job,
            outputs: self.released(&release.items),
            ..self.envelope(EventType::Complete, e.at)
        };
        vec![start, complete]
    }

    // ----- Pieces. -----

    fn envelope(&self, event_type: EventType, at: DateTime<Utc>) -> RunEvent {
        RunEvent {
            event_type,
            event_time: at.to_rfc3339_opts(SecondsFormat::Millis, true),
            producer: self.ctx.producer.clone(),
            schema_url: SCHEMA_URL,
            run: Run { run_id: String::new(), facets: Map::new() },
            job: Job { namespace: String::new(), name: String::new(), facets: Map::new() },
            inputs: Vec::new(),
            outputs: Vec::new(),
        }
    }

    fn job(&self, name: &str, job_type: &str) -> Job {
        let mut facets = Map::new();
        facets.insert(
            "jobType".to_owned(),
            self.facet(
                "https://openlineage.io/spec/facets/2-0-4/JobTypeJobFacet.json#/$defs/JobTypeJobFacet",
                json!({ "processingType": "BATCH", "integration": "TIDEGATE", "jobType": job_type }),
            ),
        );
        Job { namespace: self.ctx.namespace.clone(), name: name.to_owned(), facets }
    }

    /// `processing_engine`, the facet every run event carries.
    fn engine_facets(&self) -> Map<String, Value> {
        let mut facets = Map::new();
        facets.insert(
            "processing_engine".to_owned(),
            self.facet(
                "https://openlineage.io/spec/facets/1-1-1/ProcessingEngineRunFacet.json#/$defs/ProcessingEngineRunFacet",
                json!({ "version": self.ctx.version, "name": "tidegate", "openlineageAdapterVersion": self.ctx.version }),
            ),
        );
        facets
    }

    /// The `tidegate` run facet's common fields: what kind of run, from which journal entry.
    fn tidegate_facet(&self, e: &JournalEntry, kind: &str) -> Map<String, Value> {
        let mut tidegate = Map::new();
        tidegate.insert("_producer".to_owned(), json!(self.ctx.producer));
        tidegate.insert("_schemaURL".to_owned(), json!(self.ctx.facet_schema_url));
        tidegate.insert("kind".to_owned(), json!(kind));
        tidegate.insert("journalSeq".to_owned(), json!(e.seq));
        tidegate
    }

    fn parent(&self, parent: &RunRef, root: Option<&RunRef>) -> Value {
        let mut body = json!({
            "run": { "runId": parent.run_id },
            "job": { "namespace": self.ctx.namespace, "name": parent.job },
        });
        let root = root.unwrap_or(parent);
        body["root"] = json!({
            "run": { "runId": root.run_id },
            "job": { "namespace": self.ctx.namespace, "name": root.job },
        });
        self.facet("https://openlineage.io/spec/facets/1-2-0/ParentRunFacet.json#/$defs/ParentRunFacet", body)
    }

    fn nominal_time(&self, interval: Interval) -> Value {
        self.facet(
            "https://openlineage.io/spec/facets/1-0-1/NominalTimeRunFacet.json#/$defs/NominalTimeRunFacet",
            json!({
                "nominalStartTime": interval.start.to_rfc3339_opts(SecondsFormat::Millis, true),
                "nominalEndTime": interval.end.to_rfc3339_opts(SecondsFormat::Millis, true),
            }),
        )
    }

    fn error_message(&self, message: &str, language: &str) -> Value {
        self.facet(
            "https://openlineage.io/spec/facets/1-0-1/ErrorMessageRunFacet.json#/$defs/ErrorMessageRunFacet",
            json!({ "message": message, "programmingLanguage": language }),
        )
    }

    /// A standard facet: `body` with `_producer` and `_schemaURL`.
    fn facet(&self, schema_url: &str, mut body: Value) -> Value {
        if let Value::Object(map) = &mut body {
            map.insert("_producer".to_owned(), json!(self.ctx.producer));
            map.insert("_schemaURL".to_owned(), json!(schema_url));
        }
        body
    }

    fn dataset(&self, name: &str, version: Option<i64>) -> Dataset {
        let location = self
            .ctx
            .datasets
            .get(name)
            .cloned()
            .unwrap_or_else(|| Location { namespace: self.ctx.namespace.clone(), name: name.to_owned() });
        let mut facets = BTreeMap::new();
        if let Some(version) = version {
            facets.insert(
                "version".to_owned(),
                self.facet(
                    "https://openlineage.io/spec/facets/1-0-1/DatasetVersionDatasetFacet.json#/$defs/DatasetVersionDatasetFacet",
                    json!({ "datasetVersion": version.to_string() }),
                ),
            );
        }
        facets.insert(
            "symlinks".to_owned(),
            self.facet(
                "https://openlineage.io/spec/facets/1-0-1/SymlinksDatasetFacet.json#/$defs/SymlinksDatasetFacet",
                json!({ "identifiers": [{ "namespace": self.ctx.namespace, "name": name, "type": "TABLE" }] }),
            ),
        );
        Dataset { namespace: location.namespace, name: location.name, facets }
    }

    /// Inputs at their pinned versions, once per dataset and version; `except` are left out
    /// (a backfill's own outputs, read staged rather than published). These are the versions
    /// every attempt is handed (`TIDEGATE_INPUT_<DATASET>_VERSION`, from the same pins:
    /// `engine::attempt::step_env`); `cli/tests/cli/python_helper.rs` checks the two agree.
    fn pinned(&self, inputs: &[PinnedInput], except: &BTreeSet<&str>) -> Vec<Dataset> {
        let read: BTreeSet<(&str, Option<i64>)> = inputs
            .iter()
            .filter(|i| !except.contains(i.dataset.as_str()))
            .map(|i| (i.dataset.as_str(), i.version))
            .collect();
        read.into_iter().map(|(name, version)| self.dataset(name, version)).collect()
    }

    /// A release's datasets, each at the newest Delta version the release wrote to it.
    fn released(&self, items: &[ReleaseItem]) -> Vec<Dataset> {
        let mut versions: BTreeMap<&str, i64> = BTreeMap::new();
        for item in items {
            let v = versions.entry(item.dataset.as_str()).or_insert(item.delta_version);
            *v = (*v).max(item.delta_version);
        }
        versions.into_iter().map(|(name, version)| self.dataset(name, Some(version))).collect()
    }

    fn unversioned(&self, names: &[String]) -> Vec<Dataset> {
        names.iter().map(|name| self.dataset(name, None)).collect()
    }
}

fn run_job(target: &str) -> String {
    format!("run.{target}")
}

fn backfill_job(target: &str) -> String {
    format!("backfill.{target}")
}

fn run_ref(run: &RunRecord) -> RunRef {
    RunRef { run_id: run.id.clone(), job: run_job(&run.request.target) }
}

/// The backfill a run executes, as a parent: a backfill's run has the backfill's target.
fn backfill_ref(request: &RunRequest) -> Option<RunRef> {
    let id = request.backfill_id.as_deref()?;
    Some(RunRef { run_id: backfill_run_id(id).to_string(), job: backfill_job(&request.target) })
}

fn backfill_of(run: &RunRecord) -> Option<RunRef> {
    backfill_ref(&run.request)
}

/// The inputs a backfill's frozen steps pinned when it was planned.
fn frozen_inputs(record: &BackfillRecord) -> Vec<PinnedInput> {
    let steps = record.spec.get("steps").and_then(Value::as_array).map(Vec::as_slice).unwrap_or_default();
    steps
        .iter()
        .filter_map(|s| s.get("inputs"))
        .filter_map(|i| serde_json::from_value::<Vec<PinnedInput>>(i.clone()).ok())
        .flatten()
        .collect()
}

#[cfg(test)]
mod tests {
    use chrono::TimeZone as _;
    use tidegate_core::spec::RetryPolicy;
    use tidegate_core::state::Step;
    use tidegate_store::{Priority, ReleaseKind, Trigger};

    use super::*;

    const STEP: &str = "01900000-0000-7000-8000-000000000002";
    const RUN: &str = "01900000-0000-7000-8000-000000000001";

    fn at(s: i64) -> DateTime<Utc> {
        Utc.with_ymd_and_hms(2024, 1, 2, 3, 0, 0).single().expect("a valid instant") + chrono::Duration::seconds(s)
    }

    fn ctx() -> Context {
        let location = |name: &str| Location { namespace: "file".to_owned(), name: format!("/lake/{name}") };
        Context {
            namespace: "shop".to_owned(),
            producer: "https://example.invalid/tidegate/tree/v1".to_owned(),
            facet_schema_url: "https://example.invalid/tidegate/TidegateRunFacet.json#/$defs/TidegateRunFacet"
                .to_owned(),
            version: "1".to_owned(),
            datasets: ["raw", "summary"].into_iter().map(|d| (d.to_owned(), location(d))).collect(),
            tasks: [("summarize".to_owned(), TaskInfo { outputs: vec!["summary".to_owned()], language: "SQL" })].into(),
        }
    }

    fn request(backfill_id: Option<&str>) -> RunRequest {
        RunRequest {
            target: "summarize".to_owned(),
            partitions: vec!["2024-01-01".to_owned()],
            scope: "only".to_owned(),
            trigger: if backfill_id.is_some() { Trigger::Backfill } else { Trigger::Manual },
            priority: Priority::Live,
            requester: "ana".to_owned(),
            spec_hash: "spec".to_owned(),
            params: BTreeMap::new(),
            backfill_id: backfill_id.map(str::to_owned),
            idempotency_key: None,
        }
    }

    /// A batch's records: one step of one run with two attempts, and release `rel-1`.
    fn records(needs_approval: bool, backfill_id: Option<&str>) -> Records {
        let mut state = Step::new(RetryPolicy::default(), needs_approval);
        state.attempt = 2;
        state.epoch = 2;
        state.pinned = vec![PinnedInput {
            dataset: "raw".to_owned(),
            partitions: vec!["2024-01-01".to_owned()],
            version: Some(4),
            staged_steps: Vec::new(),
        }];
        let interval = Interval { start: at(0), end: at(86_400) };
        let step = StepRecord {
            id: STEP.to_owned(),
            run_id: RUN.to_owned(),
            name: "summarize@2024-01-01".to_owned(),
            task: "summarize".to_owned(),
            partition: "2024-01-01".to_owned(),
            interval: Some(interval),
            step_key: "key".to_owned(),
            pool: "default".to_owned(),
            upstream: Vec::new(),
            inputs: Vec::new(),
            state,
            updated_at: at(0),
            code_version: None,
        };
        let attempt = |n: u32| AttemptRecord {
            step_id: STEP.to_owned(),
            attempt: n,
            epoch: u64::from(n),
            worker: "w".to_owned(),
            started_at: at(0),
            ended_at: None,
            outcome: None,
            reason: None,
        };
        let run = RunRecord {
            id: RUN.to_owned(),
            request: request(backfill_id),
            status: tidegate_core::state::RunStatus::Running,
            created_at: at(0),
            updated_at: at(0),
        };
        let release = ReleaseRecord {
            id: "rel-1".to_owned(),
            kind: ReleaseKind::Publish,
            run_id: Some(RUN.to_owned()),
            backfill_id: None,
            restores_release_id: None,
            created_by: "scheduler".to_owned(),
            created_at: at(9),
            items: vec![ReleaseItem {
                dataset: "summary".to_owned(),
                partition: "2024-01-01".to_owned(),
                version_id: None,
                delta_version: 7,
                restored_delta_version: None,
                unchanged: false,
            }],
        };
        Records {
            steps: [(STEP.to_owned(), step)].into(),
            attempts: [(STEP.to_owned(), vec![attempt(1), attempt(2)])].into(),
            code_versions: [(STEP.to_owned(), "code-1".to_owned())].into(),
            runs: [(RUN.to_owned(), run)].into(),
            releases: [("rel-1".to_owned(), release)].into(),
            backfills: BTreeMap::new(),
        }
    }

    /// An entry of the step: `kind`, moving it from `from` to `to`, with `payload`.
    fn step_entry(seq: u64, kind: &str, from: &str, to: &str, payload: Value) -> JournalEntry {
        JournalEntry {
            seq,
            prev_hash: String::new(),
            hash: String::new(),
            at: at(i64::try_from(seq).expect("small")),
            actor: "scheduler".to_owned(),
            correlation_id: RUN.to_owned(),
            kind: kind.to_owned(),
            run_id: Some(RUN.to_owned()),
            step_id: Some(STEP.to_owned()),
            task: Some("summarize".to_owned()),
            partition: Some("2024-01-01".to_owned()),
            interval: None,
            from_status: Some(from.to_owned()),
            to_status: Some(to.to_owned()),
            reason: String::new(),
            payload,
            via: None,
        }
    }

    fn run_entry(seq: u64, kind: &str, to: &str, payload: Value) -> JournalEntry {
        JournalEntry { step_id: None, task: None, partition: None, ..step_entry(seq, kind, "running", to, payload) }
    }

    /// Each event as `TYPE job runId`, the way a reader of the tests follows them.
    fn lines(emitted: &[Emitted]) -> Vec<String> {
        emitted
            .iter()
            .map(|e| {
                let t = serde_json::to_value(e.event.event_type).expect("serialises");
                format!("{} {} {}", t.as_str().unwrap_or_default(), e.event.job.name, e.event.run.run_id)
            })
            .collect()
    }

    #[test]
    fn a_retried_attempt_fails_then_the_next_one_completes_with_the_versions_read_and_written() {
        let entries = [
            step_entry(1, "claimed", "ready", "running", json!({ "event": "claimed", "epoch": 1, "worker": "w" })),
            step_entry(
                2,
                "attempt_failed",
                "running",
                "retry_wait",
                json!({ "event": "attempt_failed", "epoch": 1, "class": "transient", "reason": "exit 75" }),
            ),
            step_entry(3, "retry_due", "retry_wait", "ready", json!({ "event": "retry_due" })),
            step_entry(4, "claimed", "ready", "running", json!({ "event": "claimed", "epoch": 2, "worker": "w" })),
            step_entry(5, "staged", "running", "staged", json!({ "event": "staged", "epoch": 2, "version": "v" })),
            step_entry(
                6,
                "published",
                "validated",
                "published",
                json!({ "event": "published", "epoch": 2, "release": "rel-1" }),
            ),
        ];
        let records = records(false, None);
        let emitted = events(&entries, &ctx(), &records);
        let (first, second) = (attempt_run_id(STEP, 1), attempt_run_id(STEP, 2));
        assert_eq!(
            lines(&emitted),
            [
                format!("START summarize {first}"),
                format!("FAIL summarize {first}"),
                format!("START summarize {second}"),
                format!("COMPLETE summarize {second}"),
            ]
        );
        assert_eq!(emitted.iter().map(|e| e.seq).collect::<Vec<_>>(), [1, 2, 4, 6]);
        let fail = &emitted[1].event;
        assert_eq!(fail.run.facets["errorMessage"]["message"], "exit 75");
        assert_eq!(fail.run.facets["errorMessage"]["programmingLanguage"], "SQL");
        let complete = &emitted[3].event;
        assert_eq!(complete.run.facets["parent"]["run"]["runId"], RUN);
        assert_eq!(complete.run.facets["parent"]["job"]["name"], "run.summarize");
        assert_eq!(complete.run.facets["nominalTime"]["nominalStartTime"], "2024-01-02T03:00:00.000Z");
        let tidegate = &complete.run.facets["tidegate"];
        assert_eq!((&tidegate["attempt"], &tidegate["releaseId"]), (&json!(2), &json!("rel-1")));
        assert_eq!((&tidegate["codeVersion"], &tidegate["stepKey"]), (&json!("code-1"), &json!("key")));
        assert_eq!((&tidegate["_producer"], &tidegate["journalSeq"]), (&json!(ctx().producer), &json!(6)));
        let version = |d: &Dataset| (d.name.clone(), d.facets.get("version").map(|v| v["datasetVersion"].clone()));
        assert_eq!(
            complete.inputs.iter().map(version).collect::<Vec<_>>(),
            [("/lake/raw".to_owned(), Some(json!("4")))]
        );
        assert_eq!(
            complete.outputs.iter().map(version).collect::<Vec<_>>(),
            [("/lake/summary".to_owned(), Some(json!("7")))]
        );
        assert_eq!(events(&entries, &ctx(), &records), emitted, "the same entries give the same events");
    }

    #[test]
    fn a_backfill_step_completes_when_it_awaits_approval_and_its_run_names_the_backfill() {
        let entries = [
            run_entry(1, "run_created", "queued", serde_json::to_value(request(Some("bf-1"))).expect("json")),
            step_entry(2, "claimed", "ready", "running", json!({ "event": "claimed", "epoch": 2, "worker": "w" })),
            step_entry(
                3,
                "checks_passed",
                "validating",
                "awaiting_approval",
                json!({ "event": "checks_passed", "epoch": 2 }),
            ),
            step_entry(4, "approved", "awaiting_approval", "validated", json!({ "event": "approved", "by": "bo" })),
            step_entry(
                5,
                "published",
                "validated",
                "published",
                json!({ "event": "published", "epoch": 2, "release": "rel-1" }),
            ),
            run_entry(6, "run_status", "awaiting_approval", json!({ "awaiting_approval": 1 })),
            run_entry(7, "run_status", "failed", json!({ "failed": 3 })),
        ];
        let emitted = events(&entries, &ctx(), &records(true, Some("bf-1")));
        let attempt = attempt_run_id(STEP, 2);
        assert_eq!(
            lines(&emitted),
            [
                format!("START run.summarize {RUN}"),
                format!("START summarize {attempt}"),
                format!("COMPLETE summarize {attempt}"),
                format!("FAIL run.summarize {RUN}"),
            ]
        );
        let backfill = backfill_run_id("bf-1").to_string();
        assert_eq!(emitted[0].event.run.facets["parent"]["run"]["runId"], json!(backfill));
        assert_eq!(emitted[0].event.run.facets["parent"]["job"]["name"], "backfill.summarize");
        assert_eq!(emitted[2].event.run.facets["parent"]["root"]["run"]["runId"], json!(backfill));
        assert_eq!(emitted[2].event.outputs[0].facets.get("version"), None, "staged, not yet published");
        assert_eq!(emitted[3].event.run.facets["errorMessage"]["message"], "3 of its steps failed");
    }

    #[test]
    fn cancelled_superseded_or_lease_lost_attempts_abort_and_a_waiting_step_has_no_attempt_to_abort() {
        let entries = [
            step_entry(1, "lease_expired", "running", "retry_wait", json!({ "event": "lease_expired", "epoch": 1 })),
            step_entry(2, "cancelled", "retry_wait", "cancelled", json!({ "event": "cancelled", "reason": "r" })),
            step_entry(
                3,
                "cancelled",
                "running",
                "cancelled",
                json!({ "event": "cancelled", "reason": "wrong range" }),
            ),
            step_entry(4, "rejected", "running", "", json!({ "event": "staged", "epoch": 1 })),
        ];
        let emitted = events(&entries, &ctx(), &records(false, None));
        let (first, last) = (attempt_run_id(STEP, 1), attempt_run_id(STEP, 2));
        assert_eq!(lines(&emitted), [format!("ABORT summarize {first}"), format!("ABORT summarize {last}")]);
        assert_eq!(emitted[1].event.run.facets["tidegate"]["reason"], "wrong range");
        assert!(emitted.iter().all(|e| !e.event.run.facets.contains_key("errorMessage")));
    }

    #[test]
    fn attempt_run_ids_are_uuid_v5_and_stable() {
        let id = attempt_run_id(STEP, 1);
        assert_eq!(id.get_version_num(), 5);
        assert_eq!(id, attempt_run_id(STEP, 1));
        assert_ne!(id, attempt_run_id(STEP, 2));
        // Pinned, and what any UUIDv5 implementation gives (Python: uuid.uuid5(RUN_ID_NAMESPACE,
        // "attempt/s/1")): changing it would make re-sent events new runs to every consumer.
        assert_eq!(attempt_run_id("s", 1).to_string(), "3952ef8f-7754-51cc-b6a5-896ae0c1299e");
    }

    #[test]
    fn needs_names_what_the_entries_describe() {
        let entries = [
            step_entry(1, "claimed", "ready", "running", json!({ "epoch": 1 })),
            step_entry(2, "published", "validated", "published", json!({ "epoch": 1, "release": "rel-1" })),
            run_entry(3, "backfill_published", "published", json!({ "backfill_id": "bf-1", "release_id": "rel-bf-1" })),
            step_entry(4, "deps_met", "pending", "ready", json!({})),
        ];
        let needs = needs(&entries);
        assert_eq!(needs.steps, [STEP.to_owned()].into());
        assert_eq!(needs.runs, [RUN.to_owned()].into());
        assert_eq!(needs.releases, ["rel-1".to_owned(), "rel-bf-1".to_owned()].into());
        assert_eq!(needs.backfills, ["bf-1".to_owned()].into());
    }
}
