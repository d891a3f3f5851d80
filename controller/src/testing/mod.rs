//! Test support shared with other crates' tests and the scale simulation (feature `testing`).

pub mod fake_apiserver;
