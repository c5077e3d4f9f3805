pub mod api;
pub mod apply;
pub mod desired;
pub mod failover;
pub mod reconcile;
pub mod replication;
pub mod rotation;
pub mod status;
