//! The CPU reference backend: f32, slow, obvious; the oracle for every GPU kernel and for the
//! whole model.

pub mod attention;
pub mod block;
pub mod compressor;
pub mod indexer;
pub mod mhc;
pub mod model;
pub mod moe;
pub mod mtp;
pub mod ops;
pub mod quant;
pub mod rope;
pub mod state;
pub mod weights;

pub use block::Probe;
pub use model::{BatchItem, ForwardOptions, ItemOutput, Model};
pub use mtp::MtpState;
pub use state::{SeqSnapshot, SeqState};
