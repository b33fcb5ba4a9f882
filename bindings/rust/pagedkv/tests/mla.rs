//! MLA pools (DeepSeek-style latent layout): options and accounting, the
//! latent cache write committing the step, and absorbed attention over
//! prefill, chunked prefill and decode against a float64 reference over the
//! latents written (random, never zero); every output element checked.

mod common;

use common::Rng;
use pagedkv::{ErrorKind, KvLayout, Pool, PoolOptions, TensorView, TensorViewMut};

const LAYERS: u32 = 2;
const RANK: usize = 32;
const ROPE: usize = 8;
const D: usize = RANK + ROPE;
const HEADS: usize = 16;
const SCALE: f32 = 0.15;

fn mla_pool() -> Pool {
    Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 40,
        num_layers: LAYERS,
        dtype: pagedkv::DType::F32,
        num_threads: 2,
        kv_layout: KvLayout::Mla,
        kv_lora_rank: RANK as u32,
        qk_rope_head_dim: ROPE as u32,
        ..PoolOptions::default()
    })
    .unwrap()
}

fn value(rng: &mut Rng) -> f32 {
    loop {
        let x = rng.f32();
        if x.abs() > 1e-3 {
            return x;
        }
    }
}

#[test]
fn mla_steps_match_float64() {
    let pool = mla_pool();
    let o = pool.options().unwrap();
    assert_eq!(o.kv_layout, KvLayout::Mla);
    assert_eq!((o.num_kv_heads, o.head_dim), (1, D as u32));
    assert_eq!(
        pool.bytes_per_block().unwrap(),
        LAYERS as u64 * 4 * D as u64 * 4
    );
    let mut rng = Rng::new(9);
    let seqs = [pool.create_seq().unwrap(), pool.create_seq().unwrap()];
    // rows[seq][layer]: every position's latent row as written.
    let mut rows = vec![vec![Vec::<f64>::new(); LAYERS as usize]; 2];
    for counts in [[9u32, 3], [1, 4], [1, 1]] {
        for (s, &c) in seqs.iter().zip(&counts) {
            pool.append(*s, &rng.tokens(c as usize)).unwrap();
        }
        let mut batch = pool.prepare(&seqs, &counts).unwrap();
        let n = (counts[0] + counts[1]) as usize;
        for layer in 0..LAYERS {
            let l = layer as usize;
            let mut kv_c = vec![0f32; n * RANK];
            let mut k_pe = vec![0f32; n * ROPE];
            let mut row = 0;
            for (si, &c) in counts.iter().enumerate() {
                for _ in 0..c {
                    for d in 0..D {
                        let x = value(&mut rng);
                        if d < RANK {
                            kv_c[row * RANK + d] = x;
                        } else {
                            k_pe[row * ROPE + d - RANK] = x;
                        }
                        rows[si][l].push(x as f64);
                    }
                    row += 1;
                }
            }
            batch
                .mla_cache_write(
                    layer,
                    &TensorView::new(&kv_c, &[n, RANK]).unwrap(),
                    &TensorView::new(&k_pe, &[n, ROPE]).unwrap(),
                )
                .unwrap();
            let ql: Vec<f32> = (0..n * HEADS * RANK).map(|_| value(&mut rng)).collect();
            let qp: Vec<f32> = (0..n * HEADS * ROPE).map(|_| value(&mut rng)).collect();
            let mut out = vec![f32::NAN; n * HEADS * RANK];
            let mut lse = vec![f32::NAN; n * HEADS];
            batch
                .mla_attention(
                    layer,
                    &TensorView::new(&ql, &[n, HEADS, RANK]).unwrap(),
                    &TensorView::new(&qp, &[n, HEADS, ROPE]).unwrap(),
                    &mut TensorViewMut::new(&mut out, &[n, HEADS, RANK]).unwrap(),
                    Some(&mut TensorViewMut::new(&mut lse, &[n, HEADS]).unwrap()),
                    SCALE,
                )
                .unwrap();
            let mut row = 0;
            for (si, &c) in counts.iter().enumerate() {
                let all = &rows[si][l];
                let total = all.len() / D;
                for i in 0..c as usize {
                    let pos = total - c as usize + i;
                    for h in 0..HEADS {
                        let q = row * HEADS + h;
                        let mut x: Vec<f64> = (0..=pos)
                            .map(|k| {
                                let r = &all[k * D..(k + 1) * D];
                                let mut dot = 0.0;
                                for d in 0..RANK {
                                    dot += ql[q * RANK + d] as f64 * r[d];
                                }
                                for d in 0..ROPE {
                                    dot += qp[q * ROPE + d] as f64 * r[RANK + d];
                                }
                                SCALE as f64 * dot
                            })
                            .collect();
                        let m = x.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                        let mut sum = 0.0;
                        for v in x.iter_mut() {
                            *v = (*v - m).exp();
                            sum += *v;
                        }
                        for d in 0..RANK {
                            let want: f64 = (0..=pos).map(|k| x[k] / sum * all[k * D + d]).sum();
                            let got = out[q * RANK + d] as f64;
                            assert!(
                                (got - want).abs() <= 2e-5 + 1e-4 * want.abs(),
                                "layer {layer} seq {si} query {i} head {h} dim {d}: {got} vs {want}"
                            );
                        }
                        let want_lse = m + sum.ln();
                        assert!((lse[q] as f64 - want_lse).abs() <= 1e-4 + 1e-5 * want_lse.abs());
                    }
                    row += 1;
                }
            }
        }
        let info = pool.seq_info(seqs[0]).unwrap();
        assert_eq!(
            info.num_computed_tokens, info.num_tokens,
            "the last MLA write commits"
        );
    }
    pool.validate().unwrap();
}

#[test]
fn mla_wrong_calls() {
    let pool = mla_pool();
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2]).unwrap();
    let mut batch = pool.prepare(&[s], &[2]).unwrap();
    let kv = vec![0.5f32; 2 * D];
    let e = batch
        .cache_write(
            0,
            &TensorView::new(&kv, &[2, 1, D]).unwrap(),
            &TensorView::new(&kv, &[2, 1, D]).unwrap(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState);
    let c = vec![0.5f32; 2 * RANK];
    let pe = vec![0.5f32; 2 * ROPE];
    let e = batch
        .mla_cache_write(
            0,
            &TensorView::new(&c[..2 * (RANK - 1)], &[2, RANK - 1]).unwrap(),
            &TensorView::new(&pe, &[2, ROPE]).unwrap(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("kv_c"), "{}", e.message());
    let q = vec![0.5f32; 2 * HEADS * RANK];
    let qp = vec![0.5f32; 2 * HEADS * ROPE];
    let mut out = vec![0f32; 2 * HEADS * RANK];
    let e = batch
        .mla_attention(
            0,
            &TensorView::new(&q, &[2, HEADS, RANK]).unwrap(),
            &TensorView::new(&qp, &[2, HEADS, ROPE]).unwrap(),
            &mut TensorViewMut::new(&mut out, &[2, HEADS, RANK]).unwrap(),
            None,
            0.0,
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = Pool::new(&PoolOptions {
        num_blocks: 8,
        num_layers: 1,
        kv_layout: KvLayout::Mla,
        kv_lora_rank: 0,
        ..PoolOptions::default()
    })
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn a_wrong_2d_latent_is_named_by_the_shape_given() {
    // kv_c and k_pe are [num_tokens, width]; a wrong one was reported as the
    // [num_tokens, 1, width] view the library makes of it, a shape the caller
    // never passed.
    let pool = mla_pool();
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2]).unwrap();
    let mut batch = pool.prepare(&[s], &[2]).unwrap();
    let c = vec![0.5f32; 3 * RANK];
    let pe = vec![0.5f32; 3 * ROPE];
    let e = batch
        .mla_cache_write(
            0,
            &TensorView::new(&pe[..2 * ROPE], &[2, ROPE]).unwrap(),
            &TensorView::new(&pe[..2 * ROPE], &[2, ROPE]).unwrap(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(
        e.message()
            .contains(&format!("kv_c has shape [2, {ROPE}], expected [2, {RANK}]")),
        "{}",
        e.message()
    );
    let e = batch
        .mla_cache_write(
            0,
            &TensorView::new(&c[..2 * RANK], &[2, RANK]).unwrap(),
            &TensorView::new(&pe, &[3, ROPE]).unwrap(),
        )
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(
        e.message()
            .contains(&format!("k_pe has shape [3, {ROPE}], expected [2, {ROPE}]")),
        "{}",
        e.message()
    );
    // The 3-D form is named as given.
    let e = batch
        .mla_cache_write(
            0,
            &TensorView::new(&c[..2 * RANK], &[2, 1, RANK]).unwrap(),
            &TensorView::new(&pe, &[3, 1, ROPE]).unwrap(),
        )
        .unwrap_err();
    assert!(
        e.message().contains(&format!(
            "k_pe has shape [3, 1, {ROPE}], expected [2, 1, {ROPE}]"
        )),
        "{}",
        e.message()
    );
    assert_eq!(pool.seq_info(s).unwrap().num_computed_tokens, 0);
}
