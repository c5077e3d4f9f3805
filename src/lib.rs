pub mod api;
pub mod status;
