//! idempotency (in progress)
