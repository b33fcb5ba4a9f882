//! Several threads on one pool: the block manager under concurrent
//! create/append/fork/truncate/free, and concurrent steps with attention
//! checked against the float64 reference.

mod common;

use std::sync::Arc;
use std::thread;

use common::*;
use pagedkv::{AttentionParams, Batch, DType, ErrorKind, Pool, SeqId};

fn assert_send_sync<T: Send + Sync>() {}
fn assert_send<T: Send>() {}

#[test]
fn pool_is_send_and_sync_batch_is_send() {
    assert_send_sync::<Pool>();
    assert_send::<Batch>();
    assert_send_sync::<pagedkv::Error>();
}

#[test]
fn concurrent_block_manager_operations() {
    let pool = Arc::new(manager(4, 200));
    let handles: Vec<_> = (0..6)
        .map(|t| {
            let pool = Arc::clone(&pool);
            thread::spawn(move || {
                let mut rng = Rng::new(100 + t);
                let mut mine: Vec<(SeqId, u64)> = Vec::new();
                // A shared prefix so threads hit each other's cached blocks.
                let prefix: Vec<i32> = (0..12).collect();
                for _ in 0..400 {
                    match rng.range(0, 6) {
                        0 => {
                            let s = pool.create_seq().unwrap();
                            let mut p = prefix.clone();
                            let extra = rng.range(1, 10) as usize;
                            p.extend(rng.tokens(extra));
                            let hit = pool.match_prefix(s, &p).unwrap();
                            assert_eq!(hit % 4, 0);
                            match pool.append(s, &p[hit as usize..]) {
                                Ok(()) => mine.push((s, p.len() as u64)),
                                Err(e) => {
                                    assert_eq!(e.kind(), ErrorKind::OutOfBlocks, "{e}");
                                    pool.free_seq(s).unwrap();
                                }
                            }
                        }
                        1 | 2 if !mine.is_empty() => {
                            let i = rng.range(0, mine.len() as u64) as usize;
                            let n = rng.range(1, 6) as usize;
                            match pool.append(mine[i].0, &rng.tokens(n)) {
                                Ok(()) => mine[i].1 += n as u64,
                                Err(e) => assert_eq!(e.kind(), ErrorKind::OutOfBlocks, "{e}"),
                            }
                        }
                        3 if !mine.is_empty() => {
                            let i = rng.range(0, mine.len() as u64) as usize;
                            match pool.fork(mine[i].0) {
                                Ok(c) => mine.push((c, mine[i].1)),
                                Err(e) => assert_eq!(e.kind(), ErrorKind::OutOfBlocks, "{e}"),
                            }
                        }
                        4 if !mine.is_empty() => {
                            let i = rng.range(0, mine.len() as u64) as usize;
                            let keep = rng.range(0, mine[i].1 + 1);
                            pool.truncate(mine[i].0, keep).unwrap();
                            mine[i].1 = keep;
                        }
                        _ if !mine.is_empty() => {
                            let i = rng.range(0, mine.len() as u64) as usize;
                            let (s, _) = mine.swap_remove(i);
                            pool.free_seq(s).unwrap();
                            assert_eq!(pool.seq_info(s).unwrap_err().kind(), ErrorKind::NotFound);
                        }
                        _ => {}
                    }
                    for &(s, n) in mine.iter().take(2) {
                        assert_eq!(pool.seq_info(s).unwrap().num_tokens, n);
                    }
                }
                mine
            })
        })
        .collect();
    let mut live = Vec::new();
    for h in handles {
        live.extend(h.join().unwrap());
    }
    pool.validate().unwrap();
    let s = pool.stats().unwrap();
    assert_eq!(s.num_seqs as usize, live.len());
    assert_eq!(s.num_tokens, live.iter().map(|&(_, n)| n).sum::<u64>());
    for (id, _) in live {
        pool.free_seq(id).unwrap();
    }
    let s = pool.stats().unwrap();
    assert_eq!((s.num_used_blocks, s.num_free_blocks), (0, 199));
    pool.validate().unwrap();
}

#[test]
fn concurrent_steps_with_attention() {
    let case = Case {
        block_size: 16,
        kv_heads: 2,
        q_heads: 4,
        head_dim: 64,
        layers: 2,
        params: AttentionParams::default(),
        lse: true,
        tol: 1e-5,
    };
    let pool = storage(16, 64, 2, 2, 64, DType::F32);
    let mut rng = Rng::new(77);
    poison::<f32>(&pool);
    scramble(&pool, &mut rng);
    thread::scope(|sc| {
        for t in 0..4u64 {
            let pool = &pool;
            sc.spawn(move || {
                let mut rng = Rng::new(1000 + t);
                let mut seqs = new_seqs(pool, 2, case.layers);
                step::<f32>(pool, &case, &mut seqs, &[7, 20], &mut rng);
                for _ in 0..6 {
                    step::<f32>(pool, &case, &mut seqs, &[1, 1], &mut rng);
                }
                for s in seqs {
                    pool.free_seq(s.id).unwrap();
                }
            });
        }
    });
    pool.validate().unwrap();
    assert_eq!(pool.stats().unwrap().num_seqs, 0);
}

/// Issue 14: safe code moves a batch into a thread and drops the pool while
/// the thread runs attention. The library keeps the KV storage until the
/// running call returns; every later call fails with InvalidState.
#[test]
fn pool_dropped_while_a_batch_runs_attention_on_another_thread() {
    let tokens = 16384usize;
    for round in 0..6u64 {
        let mut rng = Rng::new(900 + round);
        let pool = storage(16, (tokens / 16 + 2) as u64, 1, 1, 64, DType::F32);
        let s = pool.create_seq().unwrap();
        pool.append(s, &rng.tokens(tokens)).unwrap();
        let k: Vec<f32> = (0..tokens * 64).map(|_| rng.f32()).collect();
        let v: Vec<f32> = (0..tokens * 64).map(|_| rng.f32()).collect();
        {
            let mut all = pool.prepare(&[s], &[tokens as u32]).unwrap();
            let kt = pagedkv::TensorView::new(&k, &[tokens, 1, 64]).unwrap();
            let vt = pagedkv::TensorView::new(&v, &[tokens, 1, 64]).unwrap();
            all.cache_write(0, &kt, &vt).unwrap();
        }
        let mut batch = pool.prepare(&[s], &[1]).unwrap();
        let q: Vec<f32> = (0..64).map(|_| rng.f32()).collect();
        let (started_tx, started_rx) = std::sync::mpsc::channel();
        let runner = thread::spawn(move || {
            let qt = pagedkv::TensorView::new(&q, &[1, 1, 64]).unwrap();
            let mut out = vec![0f32; 64];
            let mut done = 0u32;
            loop {
                let mut ot = pagedkv::TensorViewMut::new(&mut out, &[1, 1, 64]).unwrap();
                let r = batch.attention_forward(0, &qt, &mut ot, None, &AttentionParams::default());
                match r {
                    Ok(()) => {
                        // A convex combination of the values: finite, within range.
                        for d in 0..64 {
                            let (lo, hi) = (0..tokens).fold((f32::MAX, f32::MIN), |(lo, hi), t| {
                                (lo.min(v[t * 64 + d]), hi.max(v[t * 64 + d]))
                            });
                            assert!(
                                out[d] >= lo - 1e-4 && out[d] <= hi + 1e-4,
                                "out[{d}] = {}",
                                out[d]
                            );
                        }
                        done += 1;
                        if done == 1 {
                            started_tx.send(()).unwrap();
                        }
                    }
                    Err(e) => return (done, e, batch),
                }
            }
        });
        started_rx.recv().unwrap();
        thread::sleep(std::time::Duration::from_micros(rng.range(0, 2000)));
        drop(pool);
        let (done, err, mut batch) = runner.join().unwrap();
        assert!(done >= 1);
        assert_eq!(err.kind(), ErrorKind::InvalidState, "{err}");
        // Later calls fail the same way; the plan still describes itself.
        let q1 = vec![0.5f32; 64];
        let mut out = vec![0f32; 64];
        let qt = pagedkv::TensorView::new(&q1, &[1, 1, 64]).unwrap();
        let mut ot = pagedkv::TensorViewMut::new(&mut out, &[1, 1, 64]).unwrap();
        let e = batch
            .attention_forward(0, &qt, &mut ot, None, &AttentionParams::default())
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidState);
        assert_eq!(batch.info().unwrap().num_tokens, 1);
    }
}

/// Ids name their pool: another pool's id is NotFound and changes nothing.
#[test]
fn another_pools_id_is_not_found() {
    let a = manager(4, 16);
    let b = manager(4, 16);
    let ia = a.create_seq().unwrap();
    let ib = b.create_seq().unwrap();
    assert_ne!(ia, ib);
    b.append(ib, &[1, 2, 3]).unwrap();
    assert_eq!(b.free_seq(ia).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(b.append(ia, &[1]).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(b.seq_info(ia).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(b.seq_info(ib).unwrap().num_tokens, 3);
    a.free_seq(ia).unwrap();
    a.validate().unwrap();
    b.validate().unwrap();
}

/// Issue 14 item 7: `read_kv_block` (safe, `&Pool`) racing `cache_write` on
/// another thread. The library serialises both on the pool's KV lock, so
/// every read sees one whole write, never a torn block.
#[test]
fn read_kv_block_never_sees_a_torn_cache_write() {
    let pool = Arc::new(storage(16, 4, 1, 2, 64, DType::F32));
    let s = pool.create_seq().unwrap();
    pool.append(s, &(0..16).collect::<Vec<i32>>()).unwrap();
    let block = pool.block_table(s).unwrap()[0];
    let mut batch = pool.prepare(&[s], &[16]).unwrap();
    // One whole write before any read: the block's bytes before it are
    // whatever the arena held, not a write that could be torn.
    let first = vec![1f32; 16 * 2 * 64];
    let t = pagedkv::TensorView::new(&first, &[16, 2, 64]).unwrap();
    batch.cache_write(0, &t, &t).unwrap();
    let done = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let writer = {
        let done = Arc::clone(&done);
        thread::spawn(move || {
            let mut kv = vec![0f32; 16 * 2 * 64];
            for i in 2..=300 {
                kv.iter_mut().for_each(|x| *x = i as f32);
                let t = pagedkv::TensorView::new(&kv, &[16, 2, 64]).unwrap();
                batch.cache_write(0, &t, &t).unwrap();
            }
            done.store(true, std::sync::atomic::Ordering::SeqCst);
        })
    };
    let mut reads = 0;
    while !done.load(std::sync::atomic::Ordering::SeqCst) || reads < 5 {
        for which in [pagedkv::Kv::Key, pagedkv::Kv::Value] {
            let b: Vec<f32> = pool.read_kv_block(0, which, block).unwrap();
            assert!(
                b.iter().all(|&x| x == b[0]),
                "torn block after {reads} reads"
            );
        }
        reads += 1;
    }
    writer.join().unwrap();
    assert_eq!(
        pool.read_kv_block::<f32>(0, pagedkv::Kv::Key, block)
            .unwrap()[0],
        300.0
    );
}
