//! Loading a split model: [`load_shares`] reads every rank's share straight from the shards
//! (several at once, with progress), then each rank's weights are built from its own shares
//! alone. The unsplit weights are never assembled; if any read fails, nothing is kept.

use super::collective::{Collective, InProcessSum};
use super::load::{load_shares, LoadOptions, Progress};
use super::plan::{SplitMode, SplitPlan};
use super::rank::{build_rank, RankGlobals};
use super::reader::{MmapReader, ShardReader};
use super::source::RankSource;
use super::split_model::{Globals, SplitError, SplitModel};
use super::staging::{CpuStaging, RankTensors, StagedBytes};
use crate::api::Numerics;
use crate::model::checkpoint::{CheckpointError, CONFIG_FILE};
use crate::model::ModelConfig;
use crate::reference::rope::Rope;
use std::path::Path;

/// How to read the shards and whom to tell.
pub struct LoadSettings<'a> {
    pub options: LoadOptions,
    pub reader: &'a dyn ShardReader,
    /// Called after every tensor read, from the loader's threads.
    pub progress: &'a (dyn Fn(&Progress) + Sync),
    /// Counts the read bytes staged and not yet built into weights.
    pub staged: StagedBytes,
}

fn no_progress(_: &Progress) {}

impl Default for LoadSettings<'static> {
    fn default() -> Self {
        LoadSettings {
            options: LoadOptions::default(),
            reader: &MmapReader,
            progress: &no_progress,
            staged: StagedBytes::default(),
        }
    }
}

impl SplitModel<InProcessSum> {
    /// Loads `dir` split over `ranks` simulated ranks, reading the shards in parallel.
    pub fn load(
        dir: &Path,
        ranks: usize,
        mode: SplitMode,
        numerics: Numerics,
    ) -> Result<Self, SplitError> {
        Self::load_with(dir, ranks, mode, numerics, &LoadSettings::default())
    }

    pub fn load_with(
        dir: &Path,
        ranks: usize,
        mode: SplitMode,
        numerics: Numerics,
        settings: &LoadSettings<'_>,
    ) -> Result<Self, SplitError> {
        let cfg = ModelConfig::from_file(&dir.join(CONFIG_FILE)).map_err(CheckpointError::from)?;
        let plan = SplitPlan::new(&cfg, ranks, mode)?;
        let staging = CpuStaging::with_meter(&plan, settings.staged.clone());
        let shares = load_shares(
            dir,
            &plan,
            settings.reader,
            staging,
            settings.options,
            settings.progress,
        )?;
        Self::from_shares(plan, shares, numerics, InProcessSum::new(ranks))
    }
}

impl<C: Collective<Buf = [f32]>> SplitModel<C> {
    /// Builds every rank from its committed shares, moving each share's data into the
    /// rank's weights.
    pub fn from_shares(
        plan: SplitPlan,
        shares: Vec<RankTensors>,
        numerics: Numerics,
        collective: C,
    ) -> Result<Self, SplitError> {
        let world = plan.world();
        if collective.world() != world {
            return Err(SplitError::WorldMismatch {
                collective: collective.world(),
                plan: world,
            });
        }
        let ordered = shares.iter().enumerate().all(|(r, s)| s.rank == r);
        if shares.len() != world || !ordered {
            return Err(SplitError::SharesMismatch {
                got: shares.len(),
                plan: world,
            });
        }
        let experts = plan.cfg.n_routed_experts;
        let (ranks, found): (Vec<_>, Vec<_>) = shares
            .into_iter()
            .map(|s| build_rank(&plan, RankSource::new(s, experts)))
            .collect::<Result<Vec<_>, _>>()?
            .into_iter()
            .unzip();
        let cfg = plan.cfg.clone();
        let ropes = (0..cfg.num_blocks())
            .map(|l| Rope::for_layer(&cfg, l))
            .collect();
        Ok(SplitModel {
            globals: globals(found, cfg.has_mtp())?,
            plan,
            cfg,
            numerics,
            ranks,
            ropes,
            collective,
        })
    }
}

/// The first copy of each global part (later ranks' replicas are dropped: a GPU rank would
/// keep its own, the simulation needs one).
fn globals(found: Vec<RankGlobals>, has_mtp: bool) -> Result<Globals, SplitError> {
    let (mut embed, mut head, mut mtp) = (None, None, None);
    for g in found {
        embed = embed.or(g.embed);
        head = head.or(g.head);
        mtp = mtp.or(g.mtp);
    }
    if has_mtp && mtp.is_none() {
        return Err(SplitError::NothingHolds("the MTP block"));
    }
    Ok(Globals {
        embed: embed.ok_or(SplitError::NothingHolds("the embedding"))?,
        head: head.ok_or(SplitError::NothingHolds("the vocabulary head"))?,
        mtp,
    })
}
