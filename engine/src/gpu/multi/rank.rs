//! One rank of the split GPU model: its weights, decode states, workspace and the ops of a step that
//! run on it alone (between two collectives). Simulated ranks share one GPU context (and stream).

use super::weights::{rank_moe_config, RankWeights};
use crate::api::Numerics;
use crate::gpu::attention::rank::{latent, project, RankOutScratch};
use crate::gpu::attention::{decode_heads, AttnState, DecodeIn};
use crate::gpu::model::{flush_post, hc_head, hc_pre, head, run_block, Mixer, Post};
use crate::gpu::moe;
use crate::gpu::{RunnerError, Workspace};
use crate::model::ModelConfig;
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::GpuContext;
use std::sync::Arc;

/// Buffers of the tensor-parallel glue.
pub struct TpScratch {
    pub out: RankOutScratch,
    /// The rank's f32 partial `[rows, hidden]` of the attention or MoE output (all-reduced in place).
    pub part: CudaSlice<f32>,
    /// The step's expert ids as ids of the rank's experts (-1: another rank's).
    pub local: CudaSlice<i32>,
}

pub struct Rank {
    pub gpu: Arc<GpuContext>,
    pub w: RankWeights,
    /// The full model config (replicated parts, MoE routing).
    pub cfg: ModelConfig,
    /// What the rank's routed-expert kernels see (its experts only).
    pub moe_cfg: ModelConfig,
    /// One per held layer.
    pub states: Vec<AttnState>,
    pub ws: Workspace,
    pub tp: TpScratch,
}

impl Rank {
    /// Decode states for `slots` slots of `max_context`, and a workspace of `max_rows` rows. `attn_cfg`
    /// is what the rank's attention kernels see (tensor mode: its heads and groups).
    pub fn new(
        gpu: Arc<GpuContext>,
        cfg: &ModelConfig,
        attn_cfg: &ModelConfig,
        w: RankWeights,
        slots: usize,
        max_rows: usize,
        max_context: usize,
    ) -> Result<Self, RunnerError> {
        let states = w
            .layers
            .clone()
            .map(|l| AttnState::new(&gpu, cfg, l, slots, max_context))
            .collect::<Result<Vec<_>, _>>()?;
        let ws = Workspace::new(&gpu, attn_cfg, max_rows)?;
        let s = &gpu.stream;
        let k = cfg.num_experts_per_tok;
        let tp = TpScratch {
            out: RankOutScratch::new(s, cfg.o_groups, cfg.o_lora_rank, max_rows)?,
            part: s.alloc_zeros(max_rows * cfg.hidden_size)?,
            local: s.alloc_zeros(max_rows * k)?,
        };
        let experts =
            w.tp.first()
                .map_or(0..cfg.n_routed_experts, |t| t.experts.clone());
        Ok(Rank {
            moe_cfg: rank_moe_config(cfg, &experts),
            gpu,
            w,
            cfg: cfg.clone(),
            states,
            ws,
            tp,
        })
    }

    /// The residual streams of the step's tokens (a rank holding the embedding).
    pub fn embed(&mut self, rows: usize) -> Result<(), RunnerError> {
        let (g, ws) = (&self.gpu, &mut self.ws);
        let embed =
            self.w.embed.as_ref().ok_or_else(|| {
                RunnerError::Split(format!("rank {} has no embedding", self.w.rank))
            })?;
        let d = self.cfg.hidden_size;
        g.launch_embed_streams(&g.stream, rows, d, &ws.tokens, embed, &mut ws.io.x)?;
        Ok(())
    }

    /// Layer mode: the rank's whole blocks, as unsplit.
    pub fn blocks(&mut self, rows: usize, numerics: Numerics) -> Result<(), RunnerError> {
        let (g, cfg, ws) = (&self.gpu, &self.cfg, &mut self.ws);
        let mut post = Post::None;
        for (blk, state) in self.w.blocks.iter().zip(self.states.iter_mut()) {
            post = run_block(g, cfg, blk, state, ws, rows, numerics, post, &mut |_, _| {
                Ok(())
            })?;
        }
        // The streams leave the rank: the last block's HCPost has no HCPre here to fuse into.
        flush_post(g, cfg, ws, rows, post)
    }

    /// Tensor mode, local block `i`: HCPre + norm, the rank's heads, their latents.
    pub fn attn_heads(
        &mut self,
        i: usize,
        rows: usize,
        numerics: Numerics,
    ) -> Result<(), RunnerError> {
        let (g, cfg, ws) = (&self.gpu, &self.cfg, &mut self.ws);
        let (blk, tp) = (&self.w.blocks[i], &self.w.tp[i]);
        let (mixer, norm) = (Mixer::Attn { quant: false }, &blk.attn_norm);
        hc_pre(g, cfg, ws, rows, &blk.hc_attn, norm, mixer, Post::None)?;
        let s = &g.stream;
        let state = &mut self.states[i];
        let inp = DecodeIn::new(&ws.meta, rows, &ws.io.a);
        decode_heads(g, s, &blk.attn, state, &inp, &mut ws.attn, numerics)?;
        latent(
            g,
            s,
            &blk.attn,
            &tp.out,
            rows,
            &mut ws.attn,
            &mut self.tp.out,
            numerics,
        )?;
        Ok(())
    }

    /// Tensor mode: the owned groups' `wo_b` columns into the partial.
    pub fn attn_project(
        &mut self,
        i: usize,
        rows: usize,
        numerics: Numerics,
    ) -> Result<(), RunnerError> {
        let (g, ws, t) = (&self.gpu, &mut self.ws, &mut self.tp);
        let blk = &self.w.blocks[i];
        let out = &self.w.tp[i].out;
        project(
            g,
            &g.stream,
            &blk.attn,
            out,
            rows,
            &mut ws.attn,
            &mut t.out,
            &mut t.part,
            numerics,
        )?;
        Ok(())
    }

    /// HCPost with the summed partial as the sub-block output (bf16 of the f32 sum, as unsplit).
    pub fn post(&mut self, rows: usize) -> Result<(), RunnerError> {
        let (g, ws, part) = (&self.gpu, &mut self.ws, &self.tp.part);
        let d = self.cfg.hidden_size;
        g.launch_hc_post_moe(&g.stream, rows, d, 0, &mut ws.io.x, &ws.io.mix, part, part)?;
        Ok(())
    }

    /// Tensor mode: HCPre + norm, routing (replicated), the rank's experts and shared-expert rows, and
    /// their sum into the partial.
    pub fn moe(&mut self, i: usize, rows: usize, numerics: Numerics) -> Result<(), RunnerError> {
        let (g, cfg, ws, t) = (&self.gpu, &self.cfg, &mut self.ws, &mut self.tp);
        let (blk, tpb) = (&self.w.blocks[i], &self.w.tp[i]);
        let quant = numerics == Numerics::Official;
        hc_pre(
            g,
            cfg,
            ws,
            rows,
            &blk.hc_ffn,
            &blk.ffn_norm,
            Mixer::Ffn { quant },
            Post::None,
        )?;
        moe::gate_route(g, cfg, &blk.moe, ws, rows)?;
        let (s, k, d) = (&g.stream, cfg.num_experts_per_tok, cfg.hidden_size);
        g.launch_moe_localize(s, rows * k, tpb.experts.clone(), &ws.ids, &mut t.local)?;
        if !tpb.experts.is_empty() {
            let shape = moe::expert_shape(&self.moe_cfg, rows, 0, 0, false);
            g.launch_moe_group(s, &shape, &t.local, &mut ws.group)?;
            moe::routed(g, &self.moe_cfg, &blk.moe, ws, rows, quant, false)?;
        }
        if tpb.shared {
            moe::shared(g, cfg, &blk.moe, ws, rows, quant)?;
        }
        let shared = tpb.shared.then_some(&ws.ex.y_shared);
        g.launch_moe_rank_sum(
            s,
            rows,
            k,
            d,
            &ws.ex.y_routed,
            &t.local,
            shared,
            &mut t.part,
        )?;
        Ok(())
    }

    /// HC head, final norm, vocabulary head and greedy ids (a rank holding the head side).
    pub fn head(&mut self, rows: usize) -> Result<(), RunnerError> {
        let (g, cfg, ws) = (&self.gpu, &self.cfg, &mut self.ws);
        let h = self
            .w
            .head
            .as_ref()
            .ok_or_else(|| RunnerError::Split(format!("rank {} has no head", self.w.rank)))?;
        hc_head(g, cfg, ws, rows, &h.hc_head, &h.norm, Post::None)?;
        head(g, cfg, &h.head, ws, rows)
    }
}
