//! The data plane (in progress).
