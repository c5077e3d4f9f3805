//! Test support of the plugin: the root package's control-plane helpers (shared, not copied), and
//! running the built plugin directly or through kubectl's plugin discovery.
#![allow(dead_code)]

#[path = "../../../tests/support/cluster.rs"]
pub mod cluster;
pub mod plugin;
