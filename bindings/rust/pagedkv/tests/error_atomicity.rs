//! Randomised: every failing call of the batched and fused entry points
//! (append_batch, free_batch, admit, admit_hashes, match_prefix_hashes,
//! prepare_decode and its persistent form, reserve, truncate, fork) leaves
//! the pool exactly as it was (stats, and every live sequence's info, block
//! table and hashes), with stale, unknown and repeated ids, corrupted or
//! surplus hashes and too few blocks; validate() holds after every call.

mod common;
use common::*;
use pagedkv::*;

#[derive(PartialEq, Debug)]
struct Snap {
    stats: PoolStats,
    seqs: Vec<(SeqInfo, Vec<i32>, Vec<BlockHash>)>,
}

fn snap(p: &Pool, live: &[SeqId]) -> Snap {
    Snap {
        stats: p.stats().unwrap(),
        seqs: live
            .iter()
            .map(|s| {
                (
                    p.seq_info(*s).unwrap(),
                    p.block_table(*s).unwrap(),
                    p.block_hashes(*s).unwrap(),
                )
            })
            .collect(),
    }
}

fn run(seed: u64, storage_pool: bool, window: u32) {
    let mut rng = Rng::new(seed);
    let bs = [1u32, 2, 4, 16][rng.range(0, 4) as usize];
    let nb = rng.range(3, 40);
    let pool = Pool::new(&PoolOptions {
        block_size: bs,
        num_blocks: nb,
        sliding_window: window,
        num_layers: if storage_pool { 1 } else { 0 },
        num_kv_heads: 1,
        head_dim: 4,
        dtype: DType::F32,
        num_threads: 1,
        enable_partial_reuse: rng.range(0, 2) == 1,
        ..PoolOptions::default()
    })
    .unwrap();
    let hopts = HashOptions {
        block_size: bs,
        ..HashOptions::default()
    };
    let mut live: Vec<SeqId> = Vec::new();
    let mut dead: Vec<SeqId> = Vec::new();
    let prompts: Vec<Vec<i32>> = (0..4)
        .map(|_| {
            let n = rng.range(0, 40) as usize;
            rng.tokens(n).iter().map(|t| t % 3).collect()
        })
        .collect();
    for step in 0..300 {
        let before = snap(&pool, &live);
        let pick = |rng: &mut Rng, live: &[SeqId], dead: &[SeqId]| -> SeqId {
            let r = rng.range(0, 20);
            if r == 0 && !dead.is_empty() {
                dead[rng.range(0, dead.len() as u64) as usize]
            } else if r == 1 {
                SeqId::from_raw(rng.next_u64())
            } else if !live.is_empty() {
                live[rng.range(0, live.len() as u64) as usize]
            } else {
                SeqId::INVALID
            }
        };
        let op = rng.range(0, 12);
        let res: Result<()> = match op {
            0 => {
                let n = rng.range(0, 6) as usize;
                let ids: Vec<SeqId> = (0..n).map(|_| pick(&mut rng, &live, &dead)).collect();
                let toks: Vec<i32> = (0..n).map(|_| rng.range(0, 3) as i32).collect();
                pool.append_batch(&ids, &toks)
            }
            1 => {
                let n = rng.range(0, 3) as usize;
                let ids: Vec<SeqId> = (0..n).map(|_| pick(&mut rng, &live, &dead)).collect();
                let r = pool.free_batch(&ids);
                if r.is_ok() {
                    for i in &ids {
                        live.retain(|x| x != i);
                        dead.push(*i);
                    }
                }
                r
            }
            2 | 3 => {
                let p = &prompts[rng.range(0, 4) as usize];
                let r = if op == 2 {
                    pool.admit(&SeqOptions::default(), p, rng.range(0, 3) as u32)
                } else {
                    let mut h = hash_prefix(&hopts, p).unwrap();
                    let k = rng.range(0, h.len() as u64 + 2) as usize;
                    h.truncate(k.min(h.len()));
                    if !h.is_empty() && rng.range(0, 4) == 0 {
                        let i = rng.range(0, h.len() as u64) as usize;
                        h[i].0[3] ^= 1;
                    }
                    pool.admit_hashes(&SeqOptions::default(), p, &h, 0)
                };
                r.map(|(s, _)| live.push(s))
            }
            4 => {
                let s = pick(&mut rng, &live, &dead);
                let p = &prompts[rng.range(0, 4) as usize];
                let mut h = hash_prefix(&hopts, p).unwrap();
                if !h.is_empty() && rng.range(0, 3) == 0 {
                    let i = rng.range(0, h.len() as u64) as usize;
                    h[i].0[0] ^= 1;
                }
                if rng.range(0, 4) == 0 {
                    h.push(h.first().copied().unwrap_or(BlockHash([0; 32])));
                }
                pool.match_prefix_hashes(s, p, &h).map(|_| ())
            }
            5 | 6 => {
                let n = rng.range(0, 4) as usize;
                let ids: Vec<SeqId> = (0..n).map(|_| pick(&mut rng, &live, &dead)).collect();
                let toks: Vec<i32> = (0..n).map(|_| rng.range(0, 3) as i32).collect();
                let r = if op == 5 {
                    pool.prepare_decode(&ids, &toks)
                } else {
                    pool.prepare_decode_persistent_on(&ids, &toks, Stream::DEFAULT)
                };
                match r {
                    Ok(b) => {
                        // Write the step (or commit it) half the time, else abort it.
                        if storage_pool {
                            let t = b.info().unwrap().num_tokens as usize;
                            let mut b = b;
                            let x = vec![0.25f32; t * 4];
                            let kv = TensorView::new(&x, &[t, 1, 4]).unwrap();
                            if rng.range(0, 2) == 0 {
                                b.cache_write(0, &kv, &kv).unwrap();
                            }
                        } else if rng.range(0, 2) == 0 {
                            b.commit().unwrap();
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            7 => {
                let s = pick(&mut rng, &live, &dead);
                pool.reserve(s, rng.next_u64() >> rng.range(0, 64))
            }
            8 => {
                let s = pick(&mut rng, &live, &dead);
                let n = pool.seq_info(s).map(|i| i.num_tokens).unwrap_or(0);
                pool.truncate(s, rng.range(0, n + 2))
            }
            9 => {
                let s = pick(&mut rng, &live, &dead);
                pool.fork(s).map(|c| live.push(c))
            }
            10 => {
                let n = rng.range(0, 4) as usize;
                let ids: Vec<SeqId> = (0..n).map(|_| pick(&mut rng, &live, &dead)).collect();
                let q: Vec<u32> = ids
                    .iter()
                    .map(|s| {
                        let i = pool
                            .seq_info(*s)
                            .map(|i| i.num_tokens - i.num_computed_tokens)
                            .unwrap_or(1);
                        (i as u32).max(1)
                    })
                    .collect();
                match pool.prepare(&ids, &q) {
                    Ok(b) => {
                        if !storage_pool {
                            b.commit().unwrap();
                        } else {
                            let t = b.info().unwrap().num_tokens as usize;
                            let mut b = b;
                            let x = vec![0.5f32; t * 4];
                            let kv = TensorView::new(&x, &[t, 1, 4]).unwrap();
                            b.cache_write(0, &kv, &kv).unwrap();
                        }
                        Ok(())
                    }
                    Err(e) => Err(e),
                }
            }
            _ => {
                let s = pick(&mut rng, &live, &dead);
                let p = &prompts[rng.range(0, 4) as usize];
                pool.append_with_lookahead(
                    s,
                    &p[..p.len().min(rng.range(0, 9) as usize)],
                    rng.range(0, 3) as u32,
                )
            }
        };
        match res {
            Ok(()) => {}
            Err(e) => {
                let after = snap(&pool, &live);
                assert_eq!(
                    before,
                    after,
                    "seed {seed} step {step} op {op}: {:?} {}",
                    e.kind(),
                    e.message()
                );
                assert!(!e.message().is_empty());
            }
        }
        if let Err(e) = pool.validate() {
            panic!("seed {seed} step {step} op {op}: {}", e.message());
        }
    }
}

#[test]
fn failing_calls_change_nothing() {
    for seed in 1..=150 {
        run(seed, seed % 2 == 0, if seed % 5 == 0 { 8 } else { 0 });
    }
}
