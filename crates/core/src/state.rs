//! state (in progress)
