//! The server: the `App` (app.rs), its routes and its life (serve.rs), the
//! serving threads and their listener (threads.rs), and how sessions end
//! (lifecycle.rs: an end, the sweeper, the carry-overs resumed at start).

pub mod app;
pub mod lifecycle;
pub mod serve;
pub mod threads;
