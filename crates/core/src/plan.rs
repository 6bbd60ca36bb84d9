//! plan (in progress)
