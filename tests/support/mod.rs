//! Shared test support: fixtures, and (for cluster tests) the local control plane.
#![allow(dead_code)]

pub mod cases;
pub mod cluster;
pub mod commands;
