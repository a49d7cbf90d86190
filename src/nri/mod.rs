//! The NRI plugin transport and lifecycle: generated protocol code, the socket multiplexer,
//! the ttrpc service adapter and the connect/register/reconnect loop. No policy lives here.

pub mod api;
pub mod convert;
pub mod mux;
pub mod plugin;
pub mod runtime_side;
pub mod service;
