//! Client side: accepting connections, the startup and authentication
//! exchange, and the session loop that lends a client a server per
//! transaction (or per session, or per statement).

pub mod auth;
mod auth_query;
pub use auth_query::forget_failures as forget_login_failures;
pub mod client;
mod cycle;
pub mod error;
pub mod listener;
mod listens;
pub mod login;
pub mod parking;
pub mod relay;
pub mod relay_io;
mod requests;
mod route;
pub mod session;
mod spare_buffers;
mod tracked;
