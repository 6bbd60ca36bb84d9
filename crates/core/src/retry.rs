//! Retry policy: error classes, exponential backoff with full jitter, and the per-pool retry
//! budget that keeps a failing dependency from being hammered into a retry storm.

use chrono::{DateTime, Duration, Utc};
use serde::{Deserialize, Serialize};

use crate::spec::{ExitCodes, RetryPolicy};

/// Whether trying again can help.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[cfg_attr(feature = "openapi", derive(utoipa::ToSchema))]
#[serde(rename_all = "snake_case")]
pub enum ErrorClass {
    /// Infrastructure trouble: a crash, a signal, a timeout, an expired lease, exit code 75.
    Transient,
    /// Bad data, bad config or failed checks: the same inputs will fail the same way.
    Deterministic,
}

impl ErrorClass {
    /// The class's name as stored and shown: `transient` or `deterministic`.
    pub fn as_str(self) -> &'static str {
        match self {
            ErrorClass::Transient => "transient",
            ErrorClass::Deterministic => "deterministic",
        }
    }
}

/// How a task's process ended.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Exit {
    /// The process exited by itself.
    Code {
        /// The exit status; 0 is success.
        code: i32,
    },
    /// The process was killed by a signal.
    Signal {
        /// The signal's number, such as 9 for `SIGKILL`.
        signal: i32,
    },
    /// The process ran past the task's timeout and was killed.
    TimedOut,
}

/// Classifies an exit: listed codes as configured, signals and timeouts transient, any other
/// non-zero code deterministic (an unknown failure retried forever is the worse mistake).
pub fn classify(exit: Exit, codes: &ExitCodes) -> ErrorClass {
    match exit {
        Exit::Signal { .. } | Exit::TimedOut => ErrorClass::Transient,
        Exit::Code { code } if codes.transient.contains(&code) => ErrorClass::Transient,
        Exit::Code { .. } => ErrorClass::Deterministic,
    }
}

/// The delay before attempt `next_attempt` (2 for the first retry): full jitter over an
/// exponentially growing cap, `jitter` being a uniform sample in `[0, 1)` supplied by the caller.
pub fn backoff(policy: &RetryPolicy, next_attempt: u32, jitter: f64) -> Duration {
    let exp = next_attempt.saturating_sub(2).min(32);
    let cap_ms = policy.backoff_base_ms.saturating_mul(1u64 << exp).min(policy.backoff_max_ms);
    let jitter = if jitter.is_finite() { jitter.clamp(0.0, 1.0) } else { 0.0 };
    // Precision loss is irrelevant for delays below 2^53 ms.
    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "a jittered fraction (0..=1) of a capped delay in ms: positive and far below i64::MAX"
    )]
    let ms = (cap_ms as f64 * jitter) as i64;
    Duration::milliseconds(ms)
}

/// A token bucket over retries: each first attempt earns `ratio` of a token, up to `burst` tokens;
/// each retry spends one. When empty, retries wait instead of running. Tokens are counted in
/// thousandths so that ten first attempts at ratio 0.1 earn exactly one retry.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct RetryBudget {
    /// Thousandths of a token earned by each first attempt (the ratio times 1000).
    pub earn_milli: u64,
    /// The most the bucket holds, in thousandths of a token (the burst times 1000).
    pub cap_milli: u64,
    /// Thousandths of a token available now; each retry spends 1000.
    pub tokens_milli: u64,
}

const MILLI: u64 = 1_000;

impl RetryBudget {
    /// A full budget: `burst` retries available at once, `ratio` earned per first attempt.
    pub fn new(ratio: f64, burst: u32) -> Self {
        // The ratio is validated to lie in [0, 1] by the spec parser.
        #[allow(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "a ratio clamped to 0..=1, times 1000"
        )]
        let earn_milli = (ratio.clamp(0.0, 1.0) * MILLI as f64).round() as u64;
        let cap_milli = u64::from(burst.max(1)) * MILLI;
        Self { earn_milli, cap_milli, tokens_milli: cap_milli }
    }

    /// Records a first attempt, which earns budget for later retries.
    pub fn on_first_attempt(&mut self) {
        self.tokens_milli = (self.tokens_milli + self.earn_milli).min(self.cap_milli);
    }

    /// Takes a token for one retry; false when the budget is spent and the retry must wait.
    pub fn try_spend(&mut self) -> bool {
        if self.tokens_milli >= MILLI {
            self.tokens_milli -= MILLI;
            true
        } else {
            false
        }
    }

    /// Whole retries available now.
    pub fn remaining(&self) -> u64 {
        self.tokens_milli / MILLI
    }
}

/// When a retry is due, given when the failure happened.
pub fn retry_at(policy: &RetryPolicy, failed_at: DateTime<Utc>, next_attempt: u32, jitter: f64) -> DateTime<Utc> {
    failed_at + backoff(policy, next_attempt, jitter)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_codes_classify_as_configured() {
        let codes = ExitCodes::default();
        assert_eq!(classify(Exit::Code { code: 75 }, &codes), ErrorClass::Transient);
        assert_eq!(classify(Exit::Code { code: 65 }, &codes), ErrorClass::Deterministic);
        assert_eq!(classify(Exit::Code { code: 1 }, &codes), ErrorClass::Deterministic);
        assert_eq!(classify(Exit::Signal { signal: 9 }, &codes), ErrorClass::Transient);
        assert_eq!(classify(Exit::TimedOut, &codes), ErrorClass::Transient);
    }

    #[test]
    fn backoff_grows_exponentially_and_is_capped() {
        let p = RetryPolicy { attempts: 10, backoff_base_ms: 100, backoff_max_ms: 1_000 };
        let caps: Vec<i64> = (2..8).map(|a| backoff(&p, a, 0.999_999).num_milliseconds()).collect();
        assert_eq!(caps, [99, 199, 399, 799, 999, 999]);
        assert_eq!(backoff(&p, 5, 0.0), Duration::zero());
    }

    #[test]
    fn budget_allows_burst_then_ratio_of_first_attempts() {
        let mut b = RetryBudget::new(0.1, 2);
        assert!(b.try_spend());
        assert!(b.try_spend());
        assert!(!b.try_spend());
        for _ in 0..10 {
            b.on_first_attempt();
        }
        assert!(b.try_spend());
        assert!(!b.try_spend());
    }
}
