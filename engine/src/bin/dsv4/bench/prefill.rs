//! Batched-prefill timing: prompts of several lengths fed to one fresh sequence in calls of `chunk` tokens,
//! timed with CUDA events from the first upload to the first greedy token on the host (one sync), which at 1K
//! tokens is the time to first token of a request; plus a per-stage breakdown of one call.

use dsv4_engine::gpu::{GpuModel, PrefillSeg, PrefillWs};
use dsv4_kernels::cudarc::driver::{sys, CudaEvent};
use std::collections::BTreeMap;

#[derive(serde::Serialize)]
pub struct PrefillRow {
    pub prompt: usize,
    pub chunk: usize,
    pub ms: f64,
    pub tok_per_s: f64,
}

fn event(model: &GpuModel) -> anyhow::Result<CudaEvent> {
    Ok(model
        .ctx
        .stream
        .record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?)
}

fn prompt(len: usize, vocab: usize) -> Vec<u32> {
    (0..len).map(|i| ((i * 7919 + 13) % vocab) as u32).collect()
}

fn reset(model: &mut GpuModel, slot: usize) -> anyhow::Result<()> {
    let s = model.ctx.stream.clone();
    for st in &mut model.states {
        st.reset_slot(&s, slot)?;
    }
    Ok(())
}

/// What the prompt timing needs from a runner (one GPU here, the split runner in multi.rs), on slot 0.
pub trait PromptRunner {
    fn vocab(&self) -> usize;
    /// Resets slot 0's attention state (every layer, every GPU).
    fn reset(&mut self) -> anyhow::Result<()>;
    fn prefill(&mut self, seg: PrefillSeg<'_>) -> anyhow::Result<()>;
    /// Reads the greedy token of row 0 (the one sync).
    fn read_next(&mut self) -> anyhow::Result<()>;
    /// Starts the clock once everything queued so far has run.
    fn start(&mut self) -> anyhow::Result<()>;
    /// Milliseconds since [`PromptRunner::start`] (called after [`PromptRunner::read_next`]).
    fn stop(&mut self) -> anyhow::Result<f64>;
}

/// The one-GPU runner, timed with CUDA events on its stream.
struct OneGpu<'a> {
    model: &'a mut GpuModel,
    ws: &'a mut PrefillWs,
    start: Option<CudaEvent>,
}

impl PromptRunner for OneGpu<'_> {
    fn vocab(&self) -> usize {
        self.model.cfg.vocab_size
    }
    fn reset(&mut self) -> anyhow::Result<()> {
        reset(self.model, 0)
    }
    fn prefill(&mut self, seg: PrefillSeg<'_>) -> anyhow::Result<()> {
        Ok(self.model.prefill(self.ws, &[seg])?)
    }
    fn read_next(&mut self) -> anyhow::Result<()> {
        self.model.read_next(1)?;
        Ok(())
    }
    fn start(&mut self) -> anyhow::Result<()> {
        self.model.ctx.stream.synchronize()?;
        self.start = Some(event(self.model)?);
        Ok(())
    }
    fn stop(&mut self) -> anyhow::Result<f64> {
        let end = event(self.model)?;
        let start = self
            .start
            .take()
            .ok_or_else(|| anyhow::anyhow!("not started"))?;
        Ok(f64::from(start.elapsed_ms(&end)?))
    }
}

/// Feeds `tokens` into the reset slot 0 in calls of `chunk` and reads the greedy token (the one sync).
fn run(r: &mut impl PromptRunner, tokens: &[u32], chunk: usize) -> anyhow::Result<()> {
    for (i, part) in tokens.chunks(chunk).enumerate() {
        let seg = PrefillSeg {
            slot: 0,
            pos: i * chunk,
            tokens: part,
        };
        r.prefill(seg)?;
    }
    r.read_next()
}

/// Milliseconds to prefill each prompt length on one GPU (after one warm-up prefill).
pub fn time_prompts(
    model: &mut GpuModel,
    ws: &mut PrefillWs,
    lens: &[usize],
    chunk: usize,
) -> anyhow::Result<Vec<PrefillRow>> {
    let mut r = OneGpu {
        model,
        ws,
        start: None,
    };
    time_runner(&mut r, lens, chunk)
}

/// Milliseconds to prefill each prompt length (after one warm-up prefill).
pub fn time_runner(
    r: &mut impl PromptRunner,
    lens: &[usize],
    chunk: usize,
) -> anyhow::Result<Vec<PrefillRow>> {
    let v = r.vocab();
    let warm = prompt(chunk.min(1024), v);
    r.reset()?;
    run(r, &warm, chunk)?;
    let mut rows = Vec::new();
    for &len in lens {
        let toks = prompt(len, v);
        r.reset()?;
        r.start()?;
        run(r, &toks, chunk)?;
        let ms = r.stop()?;
        rows.push(PrefillRow {
            prompt: len,
            chunk,
            ms,
            tok_per_s: len as f64 / (ms * 1e-3),
        });
    }
    Ok(rows)
}

/// Milliseconds per stage (summed over layers) of one prefill call of `len` tokens from position 0.
pub fn profile(
    model: &mut GpuModel,
    ws: &mut PrefillWs,
    len: usize,
) -> anyhow::Result<Vec<(String, f64)>> {
    let toks = prompt(len, model.cfg.vocab_size);
    reset(model, 0)?;
    let stream = model.ctx.stream.clone();
    let mut marks: Vec<(&'static str, CudaEvent)> = vec![("start", event(model)?)];
    let seg = PrefillSeg {
        slot: 0,
        pos: 0,
        tokens: &toks,
    };
    model.prefill_with(ws, &[seg], &mut |name| {
        marks.push((
            name,
            stream.record_event(Some(sys::CUevent_flags::CU_EVENT_DEFAULT))?,
        ));
        Ok(())
    })?;
    model.read_next(1)?;
    let mut acc: BTreeMap<&'static str, f64> = BTreeMap::new();
    for w in marks.windows(2) {
        *acc.entry(w[1].0).or_default() += f64::from(w[0].1.elapsed_ms(&w[1].1)?);
    }
    let mut out: Vec<(String, f64)> = acc.into_iter().map(|(k, v)| (k.to_string(), v)).collect();
    out.sort_by(|a, b| b.1.total_cmp(&a.1));
    Ok(out)
}

pub fn print(rows: &[PrefillRow], profile: &[(String, f64)], profile_len: usize) {
    if rows.is_empty() {
        return;
    }
    println!(
        "\nbatched prefill (one sequence, calls of {} tokens, to the first greedy token):",
        rows[0].chunk
    );
    println!("| prompt | ms | tok/s |");
    println!("|---|---|---|");
    for r in rows {
        println!("| {} | {:.1} | {:.0} |", r.prompt, r.ms, r.tok_per_s);
    }
    if let Some(r) = rows.iter().find(|r| r.prompt == 1024) {
        println!("time to first token, 1K prompt: {:.1} ms", r.ms);
    }
    print_profile(profile, profile_len);
}

/// Per-stage ms of one prefill call of `len` tokens (nothing when `profile` is empty).
pub fn print_profile(profile: &[(String, f64)], len: usize) {
    if profile.is_empty() {
        return;
    }
    let total: f64 = profile.iter().map(|p| p.1).sum();
    println!("\nper-stage time of one prefill call ({len} tokens), summed over layers:");
    for (name, ms) in profile {
        println!("  {name:<14} {ms:9.3} ms  {:5.1}%", 100.0 * ms / total);
    }
}
