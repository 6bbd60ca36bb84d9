//! A crash switch for tests: `TIDEGATE_FAILPOINT=NAME` (or `NAME@N`, the N-th time) makes the
//! process abort at the point named NAME, as a power cut or kill -9 would stop it there. Always
//! compiled in; inert unless the variable is set. The lake's switch does the work, so one
//! `@N` count covers the points of both crates; docs/internals.md (engine) lists them all.

/// The environment variable that arms a failpoint.
pub const FAILPOINT_ENV: &str = tidegate_lake::failpoint::FAILPOINT_ENV;

/// Aborts the process if `TIDEGATE_FAILPOINT` names `name` and this is the chosen hit (the first
/// unless `@N` says otherwise). A step's points, in the order its life passes them:
/// `after-stage-output` (output written to staging, checks not run), `after-checks` (checks ran,
/// neither staging nor verdict recorded), `after-record-staged` (staging and verdict recorded,
/// not committed), `before-commit` and its older name `after-stage` (a publication about to make
/// its Delta commits), `after-commit` (commits made, releases not recorded) and
/// `after-record-release` (releases recorded).
pub fn hit(name: &str) {
    tidegate_lake::failpoint::hit(name);
}
