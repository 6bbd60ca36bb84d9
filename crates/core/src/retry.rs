//! retry (in progress)
