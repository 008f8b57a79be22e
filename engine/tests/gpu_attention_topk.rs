//! The indexer top-k (cuda/attn_topk.cu) against the CPU reference's rule, bit for bit: every path (all keys
//! in shared memory, the filter with keys in registers and re-read, the L2 fallback when the candidates
//! overflow), long rows, ties, NaNs, and several rows in one launch. Skips without a GPU.
use dsv4_kernels::attn::*;
use dsv4_kernels::GpuContext;

mod gpu_kernel_util;
use gpu_kernel_util::{addr, addr_mut, rnd};

fn gpu() -> Option<GpuContext> {
    gpu_kernel_util::gpu("gpu_attention_topk")
}

/// CPU top-k: the k largest (ties to the lower index), in ascending index order; all when n <= k.
fn topk_reference(scores: &[f32], k: usize) -> Vec<i32> {
    let mut idx: Vec<usize> = (0..scores.len()).collect();
    idx.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
    let mut sel: Vec<i32> = idx.iter().take(k).map(|&i| i as i32).collect();
    sel.sort_unstable();
    sel
}

/// Score patterns of the top-k cases, each aimed at one path or tie rule of cuda/attn_topk.cu.
#[derive(Clone, Copy, Debug)]
enum Pattern {
    Random,
    /// Coarse values: many ties at every level, negatives and zeros included.
    Coarse,
    /// All equal: every key is a candidate, so the filter gives up (the L2 path).
    Equal,
    /// Every `.0`-th score is the maximum: ties at the threshold (past the candidate room when dense).
    TopTies(usize),
    /// A cluster narrower than the radix bins of the first passes.
    Cluster,
    /// NaNs of both signs, infinities, signed zeros and subnormals among random scores.
    Specials,
    /// A trend along the row (the selection is one end of it).
    Rising,
    Falling,
    /// Dense ties at the maximum only past key 60000 (the k-th largest found from the group maxima).
    LateTies,
    /// 512 of the filter's 2048 groups (residues mod 2048) hold steps just below their maximum: more than 4096
    /// keys above the k-th largest group maximum, the filter's L2 fallback.
    Staircase,
}

fn pattern_value(p: Pattern, i: usize) -> f32 {
    const SPECIALS: [f32; 8] = [
        f32::NAN,
        -f32::NAN,
        f32::INFINITY,
        f32::NEG_INFINITY,
        0.0,
        -0.0,
        1e-45,
        -1e-45,
    ];
    let x = rnd(i, 21);
    match p {
        Pattern::Random => x,
        Pattern::Coarse => (x * 40.0).round() / 8.0,
        Pattern::Equal => 0.5,
        Pattern::TopTies(every) if i.is_multiple_of(every) => 3.0,
        Pattern::Cluster => 100.0 + x * 1e-4,
        Pattern::Specials if i.is_multiple_of(7) => SPECIALS[(i / 7) % 8],
        Pattern::Rising => i as f32,
        Pattern::Falling => -(i as f32),
        Pattern::LateTies if i > 60_000 && i.is_multiple_of(2) => 3.0,
        Pattern::Staircase if i % 2048 < 512 => {
            7.0 + (i % 2048 + 1) as f32 * 1e-3 - (i / 2048) as f32 * 1e-5
        }
        _ => x,
    }
}

/// One top-k launch over `rows` rows: row r reads score row slots[r] (cap wide) at position positions[r].
fn run_topk(
    ctx: &GpuContext,
    scores: &[f32],
    slots: &[i32],
    positions: &[i32],
    cap: usize,
    k: usize,
) -> Vec<i32> {
    let s = &ctx.stream;
    let rows = slots.len();
    let (dsc, dslot, dpos) = (
        s.clone_htod(scores).expect("scores"),
        s.clone_htod(slots).expect("slots"),
        s.clone_htod(positions).expect("positions"),
    );
    let mut sel = s.alloc_zeros::<i32>(rows * k).expect("sel");
    let p = AttnIndexTopk {
        scores: addr(ctx, &dsc),
        slots: addr(ctx, &dslot),
        positions: addr(ctx, &dpos),
        sel: addr_mut(ctx, &mut sel),
        cap: cap as i32,
        ratio: 4,
        k: k as i32,
        pad: 0,
    };
    // SAFETY: scores [slots, cap] with every slot id < scores.len() / cap; sel rows x k ints.
    unsafe { ctx.launch_attn_index_topk(s, rows, &p) }.expect("topk");
    s.clone_dtoh(&sel).expect("dtoh")
}

/// The selection of row r as the kernel writes it: n indices when n <= k, else k.
fn row_selection(sel: &[i32], r: usize, k: usize, n: usize) -> &[i32] {
    &sel[r * k..r * k + n.min(k)]
}

#[test]
fn index_topk_matches_cpu_at_long_context() {
    let Some(ctx) = gpu() else { return };
    use Pattern::*;
    let (direct, regs) = (TOPK_DIRECT_MAX, TOPK_REGISTER_MAX);
    // (pattern, n, k): n 16390 is the bench's 64K context; n just above k, around the direct / filter
    // boundary, past the keys held in registers and over several 32-round batches (n 100000).
    let cases = [
        (Random, 16390, 512),
        (Random, 16390, 1024),
        (Coarse, 16390, 512),
        (Coarse, 32768, 1024),
        (Coarse, regs + 1, 512),
        (Equal, 16384, 512),
        (TopTies(29), 16390, 512),
        (TopTies(3), 16390, 512),
        (Cluster, 16390, 512),
        (Specials, 16390, 512),
        (Specials, 1500, 1024),
        (Rising, 30000, 512),
        (Falling, 16390, 512),
        (Random, 513, 512),
        (Coarse, 1025, 1024),
        (Coarse, direct, 1024),
        (Random, direct + 1, 1024),
        (Coarse, direct + 1, 512),
        (Random, 16390, 8),
        (Random, 40000, 512),
        (Coarse, 100_000, 1024),
        (LateTies, 70000, 512),
        (Staircase, 65536, 512),
        (Staircase, 30000, 1024),
    ];
    for (pattern, n, k) in cases {
        // cap a little above n (the rest of the row is never read); (pos + 1) / 4 = n.
        let cap = n + 5;
        let scores: Vec<f32> = (0..cap).map(|i| pattern_value(pattern, i)).collect();
        let got = run_topk(&ctx, &scores, &[0], &[4 * n as i32 + 2], cap, k);
        let want = topk_reference(&scores[..n], k);
        let equal = row_selection(&got, 0, k, n) == want.as_slice();
        println!("top-k {pattern:?} n {n} k {k}: equal {equal}");
        assert!(equal, "{pattern:?} n {n} k {k}");
    }
}

/// Rows of different lengths and paths in one launch (slots permuted) select exactly what each selects alone.
#[test]
fn index_topk_rows_are_independent() {
    let Some(ctx) = gpu() else { return };
    use Pattern::*;
    let (cap, k) = (24600usize, 512usize);
    let rows = [
        (Random, 16390),
        (Coarse, 3000),
        (Equal, 24600),
        (TopTies(29), 16390),
        (Random, 400),
        (Rising, 5000),
        (Staircase, 24600),
    ];
    let nr = rows.len();
    let slots: Vec<i32> = (0..nr).map(|r| ((r * 5 + 2) % nr) as i32).collect();
    let mut scores = vec![0f32; nr * cap];
    for (r, &(pattern, _)) in rows.iter().enumerate() {
        let at = slots[r] as usize * cap;
        for (i, v) in scores[at..at + cap].iter_mut().enumerate() {
            *v = pattern_value(pattern, i + 7 * r);
        }
    }
    // Any of the 4 positions whose live entries are n: (pos + 1) / 4 = n.
    let positions: Vec<i32> = rows
        .iter()
        .enumerate()
        .map(|(r, &(_, n))| 4 * n as i32 - 1 + (r % 4) as i32)
        .collect();
    let all = run_topk(&ctx, &scores, &slots, &positions, cap, k);
    for (r, &(pattern, n)) in rows.iter().enumerate() {
        let at = slots[r] as usize * cap;
        let want = topk_reference(&scores[at..at + n], k);
        let alone = run_topk(&ctx, &scores, &[slots[r]], &[positions[r]], cap, k);
        let got = row_selection(&all, r, k, n);
        println!(
            "top-k row {r} {pattern:?} n {n}: equal {}",
            got == want.as_slice()
        );
        assert_eq!(got, want.as_slice(), "row {r}");
        assert_eq!(got, row_selection(&alone, 0, k, n), "row {r} alone");
    }
}
