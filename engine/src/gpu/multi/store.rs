//! Reading a rank's committed shares ([`RankStore`]) as device tensors: every tensor is taken once,
//! and [`RankStore::finish`] checks that the builder used everything the plan gave the rank.

use super::stage::{Held, RankStore, Staged};
use crate::gpu::attention::Fp8Linear;
use crate::gpu::RunnerError;
use crate::model::checkpoint::dequant::{bf16_to_f32, f32_from_le};
use crate::model::checkpoint::{Dtype, Storage};
use crate::parallel::shares::as_matrix;
use dsv4_kernels::bf16;
use dsv4_kernels::cudarc::driver::CudaSlice;
use dsv4_kernels::{GemvWeights, GpuContext};

/// FP8 scale block (128 x 128).
const BLOCK: usize = 128;

fn bad(rank: usize, tensor: &str, message: impl std::fmt::Display) -> RunnerError {
    RunnerError::Split(format!("rank {rank}: tensor `{tensor}`: {message}"))
}

impl RankStore {
    /// Every part of `name`.
    pub fn take(&mut self, name: &str) -> Result<Vec<Staged>, RunnerError> {
        self.parts
            .remove(name)
            .ok_or_else(|| bad(self.rank, name, "not held by this rank (or already used)"))
    }

    /// The single part of `name`.
    pub fn one(&mut self, name: &str) -> Result<Staged, RunnerError> {
        let mut parts = self.take(name)?;
        match (parts.pop(), parts.is_empty()) {
            (Some(p), true) => Ok(p),
            _ => Err(bad(
                self.rank,
                name,
                "held in several parts where one was expected",
            )),
        }
    }

    pub fn holds(&self, name: &str) -> bool {
        self.parts.contains_key(name)
    }

    /// A plain BF16 or F32 tensor as f32 values.
    pub fn host_f32(&mut self, name: &str) -> Result<Vec<f32>, RunnerError> {
        let rank = self.rank;
        let p = self.one(name)?;
        match (p.share.tensor.storage, p.weight) {
            (Storage::Plain(Dtype::BF16), Held::Host(b)) => Ok(bf16_to_f32(&b)),
            (Storage::Plain(Dtype::F32), Held::Host(b)) => Ok(f32_from_le(&b)),
            (s, _) => Err(bad(
                rank,
                name,
                format!("{s:?} is not a plain float tensor"),
            )),
        }
    }

    pub fn dev_f32(&mut self, gpu: &GpuContext, name: &str) -> Result<CudaSlice<f32>, RunnerError> {
        Ok(gpu.stream.clone_htod(&self.host_f32(name)?)?)
    }

    /// A plain BF16 tensor uploaded as bf16.
    pub fn dev_bf16(
        &mut self,
        gpu: &GpuContext,
        name: &str,
    ) -> Result<CudaSlice<bf16>, RunnerError> {
        let rank = self.rank;
        let p = self.one(name)?;
        let (Storage::Plain(Dtype::BF16), Held::Host(b)) = (p.share.tensor.storage, p.weight)
        else {
            return Err(bad(rank, name, "not a plain BF16 tensor"));
        };
        let v: Vec<bf16> = b
            .chunks_exact(2)
            .map(|c| bf16::from_bits(u16::from_le_bytes([c[0], c[1]])))
            .collect();
        Ok(gpu.stream.clone_htod(&v)?)
    }

    /// `tid2eid` as i32 expert ids, each checked to be below `experts`.
    pub fn expert_ids(
        &mut self,
        gpu: &GpuContext,
        name: &str,
        experts: usize,
    ) -> Result<CudaSlice<i32>, RunnerError> {
        let rank = self.rank;
        let p = self.one(name)?;
        let (Storage::Plain(Dtype::I64), Held::Host(b)) = (p.share.tensor.storage, p.weight) else {
            return Err(bad(rank, name, "not an I64 tensor"));
        };
        let ids = b
            .chunks_exact(8)
            .map(|c| {
                let mut a = [0u8; 8];
                a.copy_from_slice(c);
                let v = i64::from_le_bytes(a);
                match usize::try_from(v) {
                    Ok(e) if e < experts => Ok(e as i32),
                    _ => Err(bad(
                        rank,
                        name,
                        format!("{v} is not an expert id below {experts}"),
                    )),
                }
            })
            .collect::<Result<Vec<i32>, _>>()?;
        Ok(gpu.stream.clone_htod(&ids)?)
    }

    /// The single FP8 part of linear `prefix` (`prefix.weight`).
    pub fn fp8(&mut self, gpu: &GpuContext, prefix: &str) -> Result<Fp8Linear, RunnerError> {
        let p = self.one(&format!("{prefix}.weight"))?;
        fp8_part(self.rank, gpu, p)
    }

    /// Every FP8 part of linear `prefix`, in plan order (`wo_a`: one per touched group).
    pub fn fp8_parts(
        &mut self,
        gpu: &GpuContext,
        prefix: &str,
    ) -> Result<Vec<Fp8Linear>, RunnerError> {
        let rank = self.rank;
        self.take(&format!("{prefix}.weight"))?
            .into_iter()
            .map(|p| fp8_part(rank, gpu, p))
            .collect()
    }

    /// An error naming a tensor the plan gave the rank but the builder never used.
    pub fn finish(&self) -> Result<(), RunnerError> {
        match self.parts.keys().min() {
            Some(name) => Err(bad(self.rank, name, "loaded for this rank but never used")),
            None => Ok(()),
        }
    }
}

/// `r` lies on scale-block boundaries the way the kernels read it: it starts on a block, or lies
/// inside one.
fn block_aligned(r: &std::ops::Range<usize>) -> bool {
    r.is_empty() || r.start.is_multiple_of(BLOCK) || r.start / BLOCK == (r.end - 1) / BLOCK
}

/// A cropped FP8 part on the device with the scales of the blocks it covers.
fn fp8_part(rank: usize, gpu: &GpuContext, p: Staged) -> Result<Fp8Linear, RunnerError> {
    let name = p.share.tensor.name.clone();
    let (rows, cols) = as_matrix(&p.share.tensor.shape);
    let (r, c) = p.share.part.ranges(rows, cols);
    let (Held::Dev(w), Some(scale)) = (p.weight, p.scale) else {
        return Err(bad(rank, &name, "not an FP8 weight with scales"));
    };
    if !block_aligned(&r) || !block_aligned(&c) {
        return Err(bad(
            rank,
            &name,
            format!("part {r:?} x {c:?} straddles 128-blocks"),
        ));
    }
    let want = r.len().div_ceil(BLOCK) * c.len().div_ceil(BLOCK);
    if scale.len() != want || w.len() != r.len() * c.len() {
        return Err(bad(
            rank,
            &name,
            format!(
                "{} scales for a {} x {} part",
                scale.len(),
                r.len(),
                c.len()
            ),
        ));
    }
    Ok(Fp8Linear {
        w,
        scale: gpu.stream.clone_htod(&scale)?,
        n: r.len(),
        k: c.len(),
        wt: GemvWeights::Fp8,
    })
}
