//! The model split over several GPUs of one process (or over ranks simulated on one GPU), following the
//! CPU split model of [`crate::parallel`] (same plan, same shares, same math).
//!
//! # Design
//! - **One process, one host thread.** Every rank has its own context and stream (simulated ranks
//!   share one); the engine thread enqueues each step on all of them and never waits in between.
//! - **Tensor mode** ([`crate::parallel::SplitMode::Tensor`]): attention by heads (`wq_b` rows and the
//!   sinks follow the heads, `wo_a` by the touched groups' columns, `wo_b` by the owned groups' columns,
//!   an f32 partial summed over ranks), routed experts by expert id (each rank groups and runs only its
//!   own experts; the others' slots are masked out of its partial), the shared expert by 128-aligned
//!   intermediate rows; two all-reduces of `[rows, hidden]` f32 per layer (three with a latent
//!   exchange). Replicated on every rank, because they are cheap next to a collective: embedding, mHC
//!   mixers, norms, router, compressors, indexer and therefore the KV caches. The head side lives on
//!   rank 0 only (it alone computes the logits). See `ARCHITECTURE.md` for why experts go by id.
//! - **Layer mode**: consecutive layers per rank (balanced by bytes, as the CPU plan), the residual
//!   streams `[rows, 4, hidden]` bf16 handed on after each rank's layers; exact (bit-identical to one
//!   GPU).
//! - **Prefill**: prompts go through the batched prefill in chunks as on one GPU: in the layer split each
//!   rank runs the one-GPU per-block prefill over its layers (prefill.rs), in the tensor split each rank
//!   runs its share of every layer between all-reduces over the call's rows (prefill_tp.rs).
//! - **Collectives** ([`collective::GpuCollective`], chosen by [`collective::collective_for`]): the
//!   tensor split's all-reduces by the peer sum when the GPUs have peer access (a kernel per rank reading
//!   its peers' partials over NVLink, summing in rank order), otherwise NCCL with one communicator per
//!   GPU made in this process, calls grouped so one thread drives all GPUs (the layer split's hand-offs
//!   always); or, for ranks simulated on one GPU, an on-device summing kernel and a device copy.
//!   `DSV4_COLLECTIVE=nccl|peer` overrides the choice for the tensor split (A/B). All are enqueued like
//!   kernels, so every GPU's decode step is captured into one CUDA graph per batch bucket
//!   ([`graph::MultiGraphs`]).
//! - **Loading** ([`load`]): the fit check per GPU before reading, then `parallel::load::load_shares`
//!   with a GPU staging ([`stage::GpuStaging`]) that puts every piece on its rank's GPU as it is read;
//!   any failure drops the staging and trims the memory pools, so nothing stays on the GPUs.
pub mod backend;
pub mod build;
pub mod collective;
pub mod graph;
pub mod load;
pub mod model;
mod prefill;
mod prefill_tp;
pub mod rank;
pub mod stage;
pub mod store;
pub mod synth;
pub mod weights;

pub use backend::{MultiGpuBackend, MultiOptions};
pub use collective::{collective_for, CollectiveKind};
pub use model::{CollectiveProbe, MultiModel};
