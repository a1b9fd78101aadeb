//! The server: the `App` (app.rs), its routes and its life (serve.rs), the
//! serving threads and their listener (threads.rs).

pub mod app;
pub mod serve;
pub mod threads;
