//! Paged attention and cache writes against a float64 reference over the
//! gathered history: random data, a randomly permuted free queue, NaN in
//! every slot no token was written to, partial last pages, chunked prefill
//! then decode, GQA/MQA/MHA, f32/f16/bf16, scale, sliding window, soft-cap
//! and LSE; every output element checked.

mod common;

use common::*;
use pagedkv::{AttentionParams, DType, Pool, PoolOptions};

fn run<T: TestElem>(case: Case, seed: u64) {
    let mut rng = Rng::new(seed);
    let pool = Pool::new(&PoolOptions {
        block_size: case.block_size,
        num_blocks: 48,
        num_layers: case.layers,
        num_kv_heads: case.kv_heads as u32,
        head_dim: case.head_dim as u32,
        dtype: T::DTYPE,
        num_threads: 2,
        ..PoolOptions::default()
    })
    .unwrap();
    poison::<T>(&pool);
    scramble(&pool, &mut rng);
    let bs = case.block_size as usize;
    // Prompts: a short one, one ending mid-block, one of a single token, one
    // of exactly two full blocks.
    let prompts = [5usize, 2 * bs + 3, 1, 2 * bs];
    let mut seqs = new_seqs(&pool, prompts.len(), case.layers);
    let first: Vec<u32> = prompts.iter().map(|&p| ((p + 1) / 2) as u32).collect();
    let rest: Vec<u32> = prompts
        .iter()
        .zip(&first)
        .map(|(&p, &f)| (p as u32 - f).max(1))
        .collect();
    let mut worst = step::<T>(&pool, &case, &mut seqs, &first, &mut rng);
    worst = worst.max(step::<T>(&pool, &case, &mut seqs, &rest, &mut rng));
    for _ in 0..3 {
        worst = worst.max(step::<T>(&pool, &case, &mut seqs, &[1, 1, 1, 1], &mut rng));
    }
    // A subset of the sequences in a different order.
    let mut sub = vec![seqs.remove(3), seqs.remove(0)];
    worst = worst.max(step::<T>(&pool, &case, &mut sub, &[2, 1], &mut rng));
    pool.validate().unwrap();
    assert!(worst.is_finite());
    eprintln!("{:?} {case:?}: max abs error {worst:.3e}", T::DTYPE);
}

fn case(block_size: u32, kv_heads: usize, q_heads: usize, head_dim: usize, tol: f64) -> Case {
    Case {
        block_size,
        kv_heads,
        q_heads,
        head_dim,
        layers: 2,
        params: AttentionParams::default(),
        lse: true,
        tol,
    }
}

#[test]
fn f32_gqa_default_params() {
    run::<f32>(case(16, 2, 4, 64, 1e-5), 1);
}

#[test]
fn f32_mha_head_dim_128_small_blocks() {
    run::<f32>(case(8, 2, 2, 128, 1e-5), 2);
}

#[test]
fn f32_window_softcap_scale() {
    let mut c = case(16, 1, 4, 80, 1e-5);
    c.params = AttentionParams {
        softmax_scale: 0.3,
        sliding_window: 9,
        logit_softcap: 5.0,
    };
    run::<f32>(c, 3);
}

#[test]
fn f32_head_dim_256_and_96() {
    let mut c = case(32, 1, 2, 256, 1e-5);
    c.layers = 1;
    run::<f32>(c, 4);
    run::<f32>(case(64, 2, 4, 96, 1e-5), 5);
}

#[test]
fn f16_mqa() {
    let mut c = case(8, 1, 4, 128, 2e-3);
    c.params.logit_softcap = 20.0;
    run::<half::f16>(c, 6);
}

#[test]
fn bf16_gqa_window() {
    let mut c = case(16, 2, 8, 64, 1e-2);
    c.params.sliding_window = 20;
    run::<half::bf16>(c, 7);
}

#[test]
fn dtype_of_pool_is_enforced() {
    let pool = common::storage(16, 8, 1, 1, 64, DType::BF16);
    assert_eq!(pool.dtype(), DType::BF16);
    assert!(pool.read_kv_block::<f32>(0, pagedkv::Kv::Key, 1).is_err());
    assert!(pool
        .read_kv_block::<half::bf16>(0, pagedkv::Kv::Key, 1)
        .is_ok());
}
