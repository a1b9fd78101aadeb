//! The server: the `App` and its routes, the serving threads and their
//! listener.

pub mod app;
pub mod threads;
