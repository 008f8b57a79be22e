//! Loading the split model onto GPUs: the plan (adjusted for the GPU runner), the fit check against each
//! GPU's free memory before a byte is read, the sharded parallel read of every rank's share straight
//! into its GPU, and on any failure everything freed again (streams synchronised and the memory pools
//! trimmed, so the driver reports the memory free).

use super::build::build_rank;
use super::stage::GpuStaging;
use super::weights::{rank_attention_config, RankWeights};
use crate::gpu::weights::{check_quantized, check_supported};
use crate::gpu::RunnerError;
use crate::model::checkpoint::{CheckpointError, CONFIG_FILE};
use crate::model::ModelConfig;
use crate::parallel::fit::check_fits;
use crate::parallel::load::load_shares;
use crate::parallel::plan::{SplitMode, SplitPlan};
use crate::parallel::shares::{rank_shares, share_bytes};
use crate::parallel::LoadSettings;
use dsv4_kernels::cudarc::driver::sys;
use dsv4_kernels::GpuContext;
use std::path::Path;
use std::sync::Arc;

/// The split plan as the GPU runner uses it: no MTP block (the runner does not run it yet) and, in
/// tensor mode, the head side on rank 0 only (it alone computes the logits); bytes recounted.
pub fn gpu_plan(
    cfg: &ModelConfig,
    ranks: usize,
    mode: SplitMode,
) -> Result<SplitPlan, RunnerError> {
    check_supported(cfg)?;
    check_quantized(cfg)?;
    let mut plan =
        SplitPlan::new(cfg, ranks, mode).map_err(|e| RunnerError::Split(e.to_string()))?;
    for r in &mut plan.ranks {
        r.mtp = false;
        if mode == SplitMode::Tensor && r.rank > 0 {
            r.head = false;
        }
    }
    for r in 0..plan.world() {
        plan.ranks[r].weight_bytes = rank_shares(&plan, r).iter().map(share_bytes).sum();
    }
    if mode == SplitMode::Tensor {
        for r in &plan.ranks {
            rank_attention_config(cfg, r)?;
        }
    }
    Ok(plan)
}

/// One context per distinct ordinal, shared by the ranks on it; `devices[r]` is rank r's GPU.
pub fn contexts(devices: &[usize]) -> Result<Vec<Arc<GpuContext>>, RunnerError> {
    let mut made: Vec<(usize, Arc<GpuContext>)> = Vec::new();
    devices
        .iter()
        .map(|&d| {
            if let Some((_, c)) = made.iter().find(|(o, _)| *o == d) {
                return Ok(c.clone());
            }
            let c = Arc::new(GpuContext::new(d)?);
            made.push((d, c.clone()));
            Ok(c)
        })
        .collect()
}

/// Refuses before loading when a GPU cannot hold its ranks' weights plus `seqs` caches of `context`
/// tokens. Ranks simulated on one GPU each get an equal part of its free memory.
pub fn check_gpus_fit(
    plan: &SplitPlan,
    gpus: &[Arc<GpuContext>],
    context: usize,
    seqs: usize,
) -> Result<(), RunnerError> {
    let mut have = Vec::with_capacity(gpus.len());
    for g in gpus {
        let (free, _) = g.ctx.mem_get_info()?;
        let sharing = gpus.iter().filter(|o| Arc::ptr_eq(o, g)).count().max(1);
        have.push((free / sharing) as u64);
    }
    check_fits(plan, &have, context, seqs).map_err(|e| RunnerError::DoesNotFit(e.to_string()))
}

/// Waits for every stream and hands the freed memory back to the driver (the pools keep freed blocks
/// otherwise), so free memory reads as before a failed load.
pub fn release(gpus: &[Arc<GpuContext>]) -> Result<(), RunnerError> {
    for g in gpus {
        g.stream.synchronize()?;
        g.ctx.bind_to_thread()?;
        let mut pool: sys::CUmemoryPool = std::ptr::null_mut();
        // SAFETY: out-pointer to a local; the device handle comes from a live context.
        let got = unsafe { sys::cuDeviceGetDefaultMemPool(&mut pool, g.ctx.cu_device()) };
        if got == sys::CUresult::CUDA_SUCCESS && !pool.is_null() {
            // SAFETY: the default pool of a live device; trimming only releases unused memory.
            unsafe { sys::cuMemPoolTrimTo(pool, 0) }.result()?;
        }
    }
    Ok(())
}

/// Free memory of each GPU once its streams are idle (`gpus` may repeat a GPU).
pub fn free_memory(gpus: &[Arc<GpuContext>]) -> Result<Vec<usize>, RunnerError> {
    gpus.iter()
        .map(|g| {
            g.stream.synchronize()?;
            Ok(g.ctx.mem_get_info()?.0)
        })
        .collect()
}

/// Reads every rank's share of `dir` onto `gpus` (rank r on `gpus[r]`) and builds its weights.
/// On failure nothing stays on the GPUs.
pub fn load_rank_weights(
    dir: &Path,
    plan: &SplitPlan,
    gpus: &[Arc<GpuContext>],
    settings: &LoadSettings<'_>,
) -> Result<Vec<RankWeights>, RunnerError> {
    let attempt = || -> Result<Vec<RankWeights>, RunnerError> {
        let staging = GpuStaging::new(plan, gpus.to_vec());
        let stores = load_shares(
            dir,
            plan,
            settings.reader,
            staging,
            settings.options,
            settings.progress,
        )?;
        stores
            .into_iter()
            .map(|s| {
                let g = gpus[s.rank].clone();
                build_rank(plan, &g, s)
            })
            .collect()
    };
    let loaded = attempt();
    if loaded.is_err() {
        release(gpus)?;
    }
    loaded
}

/// The checkpoint's config.
pub fn read_config(dir: &Path) -> Result<ModelConfig, RunnerError> {
    Ok(ModelConfig::from_file(&dir.join(CONFIG_FILE)).map_err(CheckpointError::from)?)
}
