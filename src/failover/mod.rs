//! Operator-driven failover: what the operator saw of an instance's pods ([`Observation`]), the
//! pure decision it takes from that ([`decide`]), and the action it then carries out in order
//! (see `reconcile`). The decision has no clock and no I/O, so every rule is unit-tested from
//! YAML fixtures (tests/failover.rs).

mod decide;

pub use decide::{
    Action, Fact, Observation, PodObservation, Reason, Replication, Role, Switchover,
    best_candidate, decide, is_candidate,
};
