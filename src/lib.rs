pub mod api;
pub mod apply;
pub mod desired;
pub mod reconcile;
pub mod status;
