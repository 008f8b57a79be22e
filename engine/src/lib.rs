//! DeepSeek-V4-Flash engine: everything between "messages in" and "text deltas out".
//!
//! See `ARCHITECTURE.md` for what each module owns.

pub mod api;
pub mod backend;
pub mod chat;
pub mod gpu;
pub mod handle;
pub mod model;
pub mod parallel;
pub mod reference;
pub mod runtime;
pub mod sampler;
pub mod sched;
