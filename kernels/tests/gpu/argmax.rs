use rand::Rng;

use crate::common::*;

/// The CPU reference of argmax_rows: the first id of the row's largest value, NaN never winning; 0 for a row
/// that is all NaN.
fn argmax_ref(row: &[f32]) -> i32 {
    let mut best: Option<(f32, usize)> = None;
    for (c, &x) in row.iter().enumerate() {
        if x.is_nan() {
            continue;
        }
        if best.is_none_or(|(v, _)| x > v) {
            best = Some((x, c));
        }
    }
    best.map_or(0, |(_, c)| c as i32)
}

/// argmax_rows against the CPU reference: vocab sizes on both load paths (V % 4 == 0: float4 rounds; else
/// scalar) and across round boundaries (1, 3, 5, 1000, 4097, 8191, 32768 + 4, 129280), rows with the maximum
/// planted twice (the smaller id wins), NaNs beside it, a row of -inf only, a row of NaN only, and a row
/// start that is not 16-byte aligned (a view one float in, which takes the scalar path).
#[test]
fn argmax_rows_matches_reference() {
    let Some(g) = gpu() else { return };
    let s = &g.stream;
    for (i, &v) in [1usize, 3, 5, 1000, 4097, 8191, 32772, 129280]
        .iter()
        .enumerate()
    {
        let mut r = rng(800 + i as u64);
        let rows = 5;
        let mut logits: Vec<f32> = (0..rows * v)
            .map(|_| r.random_range(-30.0f32..30.0))
            .collect();
        // Row 1: the maximum twice (ties go to the smaller id), NaNs around.
        let row = &mut logits[v..2 * v];
        let (a, b) = (r.random_range(0..v), r.random_range(0..v));
        row[a] = 100.0;
        row[b] = 100.0;
        row[r.random_range(0..v)] = f32::NAN;
        // Row 2: -inf only; row 3: NaN only; row 4: a maximum in the last element.
        logits[2 * v..3 * v].fill(f32::NEG_INFINITY);
        logits[3 * v..4 * v].fill(f32::NAN);
        logits[5 * v - 1] = 1000.0;
        let want: Vec<i32> = logits.chunks(v).map(argmax_ref).collect();
        let d = upload(&g, &logits);
        let mut out = upload(&g, &vec![-1i32; rows]);
        g.launch_argmax_rows(s, rows, v, &d, &mut out)
            .expect("argmax");
        assert_eq!(download(&g, &out), want, "V {v}");
        // The same rows read through a view one float in: a misaligned row start.
        let mut shifted = vec![0f32];
        shifted.extend_from_slice(&logits);
        let d = upload(&g, &shifted);
        let view = d.slice(1..);
        g.launch_argmax_rows(s, rows, v, &view, &mut out)
            .expect("argmax view");
        assert_eq!(download(&g, &out), want, "V {v}, misaligned");
        println!("argmax V {v}: {rows} rows match the reference, aligned and not");
    }
}
