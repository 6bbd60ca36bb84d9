//! The Prometheus exposition of `/metrics` (decision 0011): the application layer's
//! [`Snapshot`](tidegate_app::monitor::Snapshot) encoded by `prometheus-client`, in the
//! Prometheus text format (0.0.4) or, when the scraper asks for it, OpenMetrics; and the
//! counters of failed store and lake calls that requests met, which only the server sees.

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use axum::extract::{Request, State};
use axum::middleware::Next;
use axum::response::Response;
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::registry::Registry;
use tidegate_app::monitor::{Errors, Labelled, Snapshot};
use tidegate_store::Priority;

/// The media type of the Prometheus text format.
pub(crate) const PROMETHEUS_TEXT: &str = prometheus_client::encoding::prometheus_text::CONTENT_TYPE;
/// The media type of OpenMetrics text, served when the `Accept` header names it.
pub(crate) const OPENMETRICS_TEXT: &str = "application/openmetrics-text; version=1.0.0; charset=utf-8";

/// Which of the two a call failed in.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dependency {
    /// The state store.
    Store,
    /// The lake.
    Lake,
}

impl Dependency {
    /// The store or the lake, if a typed error of one of them is in `error`'s chain.
    pub(crate) fn of(error: &anyhow::Error) -> Option<Self> {
        error.chain().find_map(|cause| {
            if cause.is::<tidegate_store::Error>() {
                Some(Dependency::Store)
            } else if cause.is::<tidegate_lake::Error>() {
                Some(Dependency::Lake)
            } else {
                None
            }
        })
    }
}

/// Failed store and lake calls met by requests (a problem response names the one that failed).
#[derive(Debug, Default)]
pub(crate) struct RequestErrors {
    store: AtomicU64,
    lake: AtomicU64,
}

impl RequestErrors {
    fn get(&self) -> Errors {
        Errors { store: self.store.load(Ordering::Relaxed), lake: self.lake.load(Ordering::Relaxed) }
    }
}

/// The layer that counts the failed calls a response names.
pub(crate) async fn count_failed_calls(
    State(errors): State<Arc<RequestErrors>>,
    request: Request,
    next: Next,
) -> Response {
    let response = next.run(request).await;
    match response.extensions().get::<Dependency>() {
        Some(Dependency::Store) => errors.store.fetch_add(1, Ordering::Relaxed),
        Some(Dependency::Lake) => errors.lake.fetch_add(1, Ordering::Relaxed),
        None => 0,
    };
    response
}

/// The exposition format.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Format {
    /// `text/plain; version=0.0.4`.
    Prometheus,
    /// `application/openmetrics-text; version=1.0.0`.
    OpenMetrics,
}

impl Format {
    /// OpenMetrics when `accept` names it (Prometheus asks for it first), else Prometheus text.
    pub(crate) fn accepted(accept: Option<&str>) -> Self {
        if accept.is_some_and(|a| a.contains("application/openmetrics-text")) {
            Format::OpenMetrics
        } else {
            Format::Prometheus
        }
    }

    /// Its media type.
    pub(crate) fn content_type(self) -> &'static str {
        match self {
            Format::Prometheus => PROMETHEUS_TEXT,
            Format::OpenMetrics => OPENMETRICS_TEXT,
        }
    }
}

/// `snapshot`, the requests' failed calls and how long the snapshot took, as `format` text.
pub(crate) fn encode(
    snapshot: Snapshot,
    requests: &RequestErrors,
    compute_s: f64,
    format: Format,
) -> Result<String, std::fmt::Error> {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(Exposition { snapshot, requests: requests.get(), compute_s }));
    let mut text = String::new();
    match format {
        Format::Prometheus => prometheus_client::encoding::prometheus_text::encode(&mut text, &registry)?,
        Format::OpenMetrics => prometheus_client::encoding::text::encode(&mut text, &registry)?,
    }
    Ok(text)
}

/// One scrape's values.
#[derive(Debug)]
struct Exposition {
    snapshot: Snapshot,
    requests: Errors,
    compute_s: f64,
}

impl Collector for Exposition {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let s = &self.snapshot;
        gauges(
            &mut encoder,
            "tidegate_steps",
            "Steps in the store, by status.",
            s.steps.iter().map(|(status, n)| (vec![("status", status.as_str().to_owned())], *n as f64)),
        )?;
        let by_class = |value: fn(&tidegate_app::monitor::Queue) -> f64| {
            s.queues
                .iter()
                .map(move |(p, q)| (vec![("priority", priority(*p).to_owned())], value(q)))
                .collect::<Vec<_>>()
        };
        gauges(
            &mut encoder,
            "tidegate_queue_ready_steps",
            "Steps ready to start, per priority class.",
            by_class(|q| q.ready as f64),
        )?;
        gauges(
            &mut encoder,
            "tidegate_queue_running_steps",
            "Steps whose attempt holds a lease, per priority class.",
            by_class(|q| q.running as f64),
        )?;
        gauges(
            &mut encoder,
            "tidegate_queue_oldest_ready_age_seconds",
            "How long the longest-waiting ready step has waited, per priority class (0 when none waits).",
            by_class(|q| q.oldest_ready_age_s),
        )?;
        gauges(
            &mut encoder,
            "tidegate_source_wait_oldest_seconds",
            "How long the longest-waiting step in waiting_for_source has waited for its source (0 when none waits).",
            [(Vec::new(), s.source_wait_oldest_s)],
        )?;
        gauges(
            &mut encoder,
            "tidegate_approval_wait_oldest_seconds",
            "How long the compared backfill waiting longest for its approval has waited (0 when none waits).",
            [(Vec::new(), s.approval_wait_oldest_s)],
        )?;
        gauges(
            &mut encoder,
            "tidegate_stale_partitions",
            "Published partitions of a dataset built on inputs that changed since (`tidegate stale`).",
            s.stale_partitions.iter().map(|(d, n)| (vec![("dataset", d.clone())], *n as f64)),
        )?;
        gauges(
            &mut encoder,
            "tidegate_paused",
            "1 while an operator's pause is in force (`tidegate pauses`): schedule:TASK, task:TASK, pool:NAME or class:CLASS.",
            s.paused.iter().map(|w| (vec![("what", w.clone())], 1.0)),
        )?;
        self.encode_scheduler(&mut encoder)?;
        gauges(
            &mut encoder,
            "tidegate_missed_intervals",
            "Intervals of a scheduled task that ended and were not run (the debt `tidegate status` shows).",
            s.missed.iter().map(|(task, n)| (vec![("task", task.clone())], *n as f64)),
        )?;
        gauges(
            &mut encoder,
            "tidegate_freshness_lag_seconds",
            "Now minus the end of the newest published partition of a dataset a scheduled task writes.",
            s.freshness_lag_s.iter().map(|(dataset, lag)| (vec![("dataset", dataset.clone())], *lag)),
        )?;
        counters(
            &mut encoder,
            "tidegate_attempts",
            "Attempts that ended, by task and outcome (staged, failed, cancelled), since this server started watching.",
            s.step_durations
                .iter()
                .map(|l| (l.labels.iter().map(|(k, v)| (*k, v.clone())).collect(), l.histogram.count)),
        )?;
        histograms(
            &mut encoder,
            "tidegate_step_duration_seconds",
            "Attempts by task and outcome: from the claim to staged output (staged), or to the failure or cancellation.",
            &s.step_durations,
        )?;
        histograms(
            &mut encoder,
            "tidegate_publication_duration_seconds",
            "Steps by task: from validated (or approved, for a backfill) to published.",
            &s.publication_durations,
        )?;
        self.encode_errors(&mut encoder)?;
        gauges(
            &mut encoder,
            "tidegate_metrics_compute_seconds",
            "How long this scrape took to compute its values.",
            [(vec![], self.compute_s)],
        )
    }
}

impl Exposition {
    /// The scheduler's last gauge; nothing before a scheduler ran.
    fn encode_scheduler(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let Some(g) = &self.snapshot.scheduler else { return Ok(()) };
        gauges(
            encoder,
            "tidegate_scheduler_report_age_seconds",
            "How old the scheduler's last gauge (retry budgets, backlog, ETA) is; it grows when no scheduler runs.",
            [(vec![], g.age_s)],
        )?;
        gauges(
            encoder,
            "tidegate_retry_budget_left",
            "Whole retries a pool's retry budget allows now, per pool.",
            g.pools.iter().map(|(pool, p)| (vec![("pool", pool.clone())], p.retry_budget_left as f64)),
        )?;
        gauges(
            encoder,
            "tidegate_backlog_steps",
            "Steps not yet settled in the scheduler's view.",
            [(vec![], g.backlog as f64)],
        )?;
        gauges(
            encoder,
            "tidegate_throughput_steps_per_second",
            "Steps settled per second, recently.",
            g.throughput_per_s.map(|v| (vec![], v)),
        )?;
        gauges(
            encoder,
            "tidegate_backlog_eta_seconds",
            "When the backlog will be done at the recent pace; absent while nothing settles.",
            g.backlog_eta_s.map(|v| (vec![], v)),
        )
    }

    /// Failed store and lake calls, by what made them: monitoring (scrapes, readiness) or requests.
    fn encode_errors(&self, encoder: &mut DescriptorEncoder) -> Result<(), std::fmt::Error> {
        let monitoring = self.snapshot.errors;
        for (name, help, of) in [
            ("tidegate_store_errors", "Failed state store calls.", (|e: &Errors| e.store) as fn(&Errors) -> u64),
            ("tidegate_lake_errors", "Failed lake calls.", |e: &Errors| e.lake),
        ] {
            let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
            for (during, errors) in [("monitoring", &monitoring), ("request", &self.requests)] {
                let labels = [("during", during)];
                ConstCounter::new(of(errors)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// `live`, `catchup` or `backfill`.
fn priority(p: Priority) -> &'static str {
    match p {
        Priority::Live => "live",
        Priority::Catchup => "catchup",
        Priority::Backfill => "backfill",
    }
}

type Labels = Vec<(&'static str, String)>;

/// A gauge family; nothing (not even its description) when it has no sample.
fn gauges(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Labels, f64)>,
) -> Result<(), std::fmt::Error> {
    let samples: Vec<(Labels, f64)> = samples.into_iter().collect();
    if samples.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Gauge)?;
    for (labels, value) in &samples {
        ConstGauge::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A counter family (`_total` added by the encoder); nothing when it has no sample.
fn counters(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    samples: impl IntoIterator<Item = (Vec<(&'static str, String)>, u64)>,
) -> Result<(), std::fmt::Error> {
    let samples: Vec<_> = samples.into_iter().collect();
    if samples.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Counter)?;
    for (labels, value) in &samples {
        ConstCounter::new(*value).encode(family.encode_family(labels)?)?;
    }
    Ok(())
}

/// A histogram family; nothing when it has no series.
fn histograms(
    encoder: &mut DescriptorEncoder,
    name: &str,
    help: &str,
    series: &[Labelled],
) -> Result<(), std::fmt::Error> {
    if series.is_empty() {
        return Ok(());
    }
    let mut family = encoder.encode_descriptor(name, help, None, MetricType::Histogram)?;
    for Labelled { labels, histogram } in series {
        let buckets: Vec<(f64, u64)> =
            histogram.bounds_s.iter().copied().chain([f64::INFINITY]).zip(histogram.counts.iter().copied()).collect();
        family.encode_family(labels)?.encode_histogram::<NoLabelSet>(
            histogram.sum_s,
            histogram.count,
            &buckets,
            None,
        )?;
    }
    Ok(())
}
