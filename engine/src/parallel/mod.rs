//! Splitting the model over several ranks (GPUs) of one process: the backend-independent
//! plan, the collective interface, a CPU simulation that proves the split against the
//! reference model, and the sharded parallel loader.
//!
//! # Design decisions
//!
//! **Two modes.** [`SplitMode::Tensor`] puts every layer on every rank and splits inside
//! layers (two all-reduces of `[T, D]` per layer; all ranks busy on every token).
//! [`SplitMode::Layer`] gives each rank consecutive layers balanced by bytes (one hand-off of
//! the `[T, n, D]` residual streams per rank boundary; ranks idle in turn unless the batch is
//! pipelined). Tensor mode is the decode-latency choice; layer mode needs no collective
//! library at all and is exact (no reassociation).
//!
//! **Attention by heads, output groups kept whole where possible.** `wq_b` rows and the sinks
//! follow the heads. When `ranks <= o_groups` every rank gets whole groups (uneven by at most
//! one group: 8 groups on 3 ranks = 24/24/16 heads), so `wo_a` needs no communication and
//! `wo_b` is column-split by owned group: each rank multiplies its slice of the
//! `o_groups·o_lora_rank` latent and the partial `[T, D]` outputs are summed. With more ranks
//! than groups the heads are split as evenly as possible (4 heads on 3 ranks = 2/1/1) and a
//! group's heads straddle ranks; then, and when the official FP8 activation blocks (128) of
//! `wo_b`'s input would straddle groups (`o_lora_rank % 128 != 0` with FP8 weights), the
//! partial latents are all-reduced first (`[T, o_groups·o_lora_rank]`) so that `wo_b`'s
//! activation quantisation sees whole rows, exactly as unsplit ([`SplitPlan::exchange_latent`]).
//!
//! **The lightning indexer is replicated, not split.** Splitting its heads would need an
//! all-reduce of the score matrix `[T, visible entries]` before the top-k (at 1M context
//! 256 K entries, 1 MB per token per CSA layer), far more traffic than the compute it saves;
//! its weights are ~12 MB per CSA layer. The single shared K=V head (MQA), the compressors
//! and therefore the whole KV cache are replicated too: every rank's heads attend to all
//! keys. Each rank keeps its own [`SeqState`](crate::reference::SeqState) (a GPU keeps its
//! cache on its device); [`check_fits`] counts the full cache on every rank in tensor mode.
//!
//! **Routed experts by expert id (expert parallel), shared expert by intermediate rows.**
//! Both options move the same bytes here: the MoE input is already replicated (every rank
//! holds the streams), so neither needs a token dispatch and both end in one all-reduce of
//! `[T, D]` (Flash: 16 KB per token in f32 / 8 KB in bf16; batch 1: 16 KB, batch 64: 1 MB).
//! They differ in balance and in what is cut:
//! * by intermediate dim, every rank reads `1/R` of each active expert: perfectly balanced at
//!   any batch, but the FP4 scales and the FP8 activation blocks (128) of `w2`'s input must not
//!   be cut, so `2048 / R` must be a multiple of 128 (`R` in 1, 2, 4, 8, 16: no 3 GPUs), and
//!   every GEMM is `R` times thinner.
//! * by expert id, whole experts (no scale/block cutting, any `R`, contiguous tensors for the
//!   loader). Batch 1 (6 of 256 experts active): the busiest rank runs `max` of the 6 picks
//!   over `R` ranks, e.g. typically 2 of 6 with `R = 8` (2.7x the mean 0.75) and up to 6 in
//!   the worst case; batch 64 (384 picks over ~200 distinct experts) is within ~10-20 % of
//!   even. Weight bytes are balanced exactly (experts are equal).
//!
//! We take expert parallel: any rank count, exact numerics by construction, simple loading,
//! and the imbalance only matters at tiny batches where decode is bandwidth-bound on the
//! replicated attention anyway. The shared expert is active for every token, so it is split
//! by intermediate rows in units of 128 (block-aligned: exact official numerics, aligned FP8
//! scales); with fewer units than ranks some ranks hold none.
//!
//! **Small replicated parts.** Embedding, head, norms, router (gate, bias, `tid2eid`), mHC
//! mixers, compressors and the indexer are replicated on every rank in tensor mode
//! (embedding + head are 2 GB on Flash; a vocabulary-parallel head is a later saving). In
//! layer mode the embedding lives on the first rank, the head side and MTP on the last.
//!
//! **Collectives are step-synchronous.** [`Collective::all_reduce_sum`] takes every rank's
//! buffer in one call, as one host thread issues NCCL calls for all GPUs inside
//! `group_start/group_end`. [`InProcessSum`] sums on the CPU in rank order.
//!
//! **Loading.** [`load::load_shares`] reads exactly the parts of [`shares::rank_shares`] from
//! the shards, several shards at once, through an injectable [`reader::ShardReader`], into a
//! [`load::Staging`] that is committed only when every read succeeded; on error the staging
//! is dropped (a GPU staging frees its device buffers in `Drop`). [`SplitModel::load`] then
//! builds each rank from its own committed shares only ([`source::RankSource`], a
//! [`TensorSource`](crate::reference::weights::TensorSource) that hands out the rank's
//! rows/columns of a split tensor): the unsplit weights never exist, and a rank that did not
//! use every tensor it was given is an error (plan and builder disagree).
//!
//! **MTP** is the block after the last layer: on the last rank in layer mode (its embedding
//! rows are sent there from the first rank), split like any block in tensor mode.
//!
//! # Reuse of the reference
//! The simulation reuses the reference: the weight builder ([`crate::reference::weights::Loader`]
//! over a rank's shares), `attention::forward_heads` (a rank-local config with the rank's
//! heads, stopping before the output projection, which is split here by group) and
//! `moe::forward` with zero experts of width one in place of the experts a rank does not hold.

pub mod collective;
pub mod fit;
pub mod load;
pub mod model_load;
pub mod plan;
pub mod rank;
pub mod reader;
pub mod shares;
pub mod slice;
pub mod source;
pub mod split_model;
pub mod staging;
pub mod state;

mod mtp;
mod pipeline;
mod tp;

pub use collective::{Collective, CollectiveError, InProcessSum, Traffic};
pub use fit::{check_fits, FitError};
pub use model_load::LoadSettings;
pub use plan::{PlanError, RankPlan, SplitMode, SplitPlan};
pub use split_model::{SplitError, SplitItem, SplitModel};
pub use state::{SplitMtpState, SplitSnapshot, SplitState};
