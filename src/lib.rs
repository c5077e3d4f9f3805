pub mod api;
pub mod apply;
pub mod build;
pub mod reconcile;
pub mod status;
