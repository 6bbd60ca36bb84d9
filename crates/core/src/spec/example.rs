//! The commented example workspace that `tidegate init` writes, kept valid by a test.

/// The text of the example `tidegate.toml`.
pub const EXAMPLE: &str = include_str!("example.toml");
