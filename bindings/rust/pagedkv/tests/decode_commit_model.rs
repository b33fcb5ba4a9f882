//! Random decode steps whose running batch changes between prepare and
//! commit (sequences appended to, truncated, forked, freed), checked
//! against a model of what each commit wrote: every sequence's
//! num_computed_tokens, the pool's invariants, and the prefix hits of a
//! request repeating a sequence's tokens.

use pagedkv::{ErrorKind, Pool, PoolOptions, SeqId, SeqOptions};

struct Rng(u64);
impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
}

#[derive(Clone)]
struct M {
    id: SeqId,
    toks: Vec<i32>,
    computed: u64,
}

fn run(seed: u64, bs: u32) {
    let pool = Pool::new(&PoolOptions {
        block_size: bs,
        num_blocks: 96,
        ..PoolOptions::default()
    })
    .unwrap();
    let mut r = Rng(seed);
    let mut next_tok = 1i32;
    let mut fresh = |r: &mut Rng| {
        next_tok += 1 + r.below(3) as i32;
        next_tok
    };
    let mut live: Vec<M> = Vec::new();
    for step in 0..400 {
        // Admit new requests (fresh tokens) and prefill them.
        while live.len() < 6 {
            let n = 1 + r.below(3 * bs as usize);
            let toks: Vec<i32> = (0..n).map(|_| fresh(&mut r)).collect();
            let (id, cached) = match pool.admit(&SeqOptions::default(), &toks, 0) {
                Ok(v) => v,
                Err(e) if e.kind() == ErrorKind::OutOfBlocks => break,
                Err(e) => panic!("{e}"),
            };
            let q = (n as u64 - cached) as u32;
            pool.prepare(&[id], &[q]).unwrap().commit().unwrap();
            live.push(M {
                id,
                toks,
                computed: n as u64,
            });
        }
        if live.is_empty() {
            continue;
        }
        // A decode step over a random subset, in random order.
        let mut idx: Vec<usize> = (0..live.len()).collect();
        for i in (1..idx.len()).rev() {
            idx.swap(i, r.below(i + 1));
        }
        idx.truncate(1 + r.below(live.len()));
        let ids: Vec<SeqId> = idx.iter().map(|&i| live[i].id).collect();
        let toks: Vec<i32> = idx.iter().map(|_| fresh(&mut r)).collect();
        // The one-call decode step, its persistent-table form, or an
        // append then a plan of single queries (decode-shaped too).
        let made = match r.below(3) {
            0 => pool.prepare_decode(&ids, &toks),
            1 => pool.prepare_decode_persistent_on(&ids, &toks, Default::default()),
            _ => pool.append_batch(&ids, &toks).and_then(|()| {
                pool.prepare(&ids, &vec![1; ids.len()]).map_err(|e| {
                    panic!("prepare after append_batch: {e}");
                })
            }),
        };
        let batch = match made {
            Ok(b) => b,
            Err(e) if e.kind() == ErrorKind::OutOfBlocks => {
                let i = r.below(live.len());
                pool.free_seq(live.remove(i).id).unwrap();
                continue;
            }
            Err(e) => panic!("step {step}: {e}"),
        };
        for (k, &i) in idx.iter().enumerate() {
            live[i].toks.push(toks[k]);
        }
        // ends[k]: the token count the step computes up to.
        let ends: Vec<u64> = idx.iter().map(|&i| live[i].toks.len() as u64).collect();
        // Change the running batch.
        let mut freed = vec![false; live.len()];
        let mut cut: Vec<Option<u64>> = vec![None; live.len()];
        let mut children: Vec<M> = Vec::new();
        // Forked, then appended to: the append copies the shared tail block
        // (copy-on-write), so the step's slot is no longer in the sequence's
        // table and the commit may skip it (marking less is safe).
        let mut forked = vec![false; live.len()];
        let mut moved = vec![false; live.len()];
        for _ in 0..r.below(4) {
            let i = r.below(live.len());
            if freed[i] {
                continue;
            }
            match r.below(4) {
                0 => {
                    pool.free_seq(live[i].id).unwrap();
                    freed[i] = true;
                }
                1 => {
                    let n = live[i].toks.len();
                    let k = r.below(n + 1);
                    pool.truncate(live[i].id, k as u64).unwrap();
                    live[i].toks.truncate(k);
                    // Truncating to the length it has changes nothing.
                    if k < n {
                        cut[i] = Some(cut[i].map_or(k as u64, |c| c.min(k as u64)));
                    }
                }
                2 => {
                    let t = fresh(&mut r);
                    if pool.append(live[i].id, &[t]).is_ok() {
                        live[i].toks.push(t);
                        moved[i] |= forked[i];
                    }
                }
                _ => {
                    forked[i] = true;
                    if let Ok(c) = pool.fork(live[i].id) {
                        let info = pool.seq_info(c).unwrap();
                        children.push(M {
                            id: c,
                            toks: live[i].toks.clone(),
                            computed: info.num_computed_tokens,
                        });
                    }
                }
            }
        }
        let commit = r.below(5) != 0;
        if commit {
            batch.commit().unwrap();
        } else {
            drop(batch);
        }
        // The model: a member the step reached (not freed, not truncated)
        // is computed through its query when committed; a truncated one
        // keeps what it had before the step, cut to its length.
        for (k, &i) in idx.iter().enumerate() {
            if freed[i] {
                continue;
            }
            let before = ends[k] - 1;
            live[i].computed = match cut[i] {
                Some(c) => before.min(c),
                None if commit && moved[i] => {
                    let got = pool.seq_info(live[i].id).unwrap().num_computed_tokens;
                    assert!(
                        got == before || got == ends[k],
                        "seed {seed} step {step}: {got}"
                    );
                    got
                }
                None if commit => ends[k],
                None => before,
            };
        }
        for (i, m) in live.iter_mut().enumerate() {
            if !idx.contains(&i) {
                if let Some(c) = cut[i] {
                    m.computed = m.computed.min(c);
                }
            }
        }
        let mut kept = Vec::new();
        for (i, m) in live.drain(..).enumerate() {
            if !freed[i] {
                kept.push(m);
            }
        }
        live = kept;
        pool.validate()
            .unwrap_or_else(|e| panic!("seed {seed} step {step}: {e}"));
        // Children forked after prepare: a committed step wrote the slot of
        // their shared tail too; the library may count it or not, but never
        // beyond their length or below what they had.
        for c in children.iter_mut() {
            let info = pool.seq_info(c.id).unwrap();
            assert!(info.num_computed_tokens >= c.computed.min(c.toks.len() as u64));
            assert!(info.num_computed_tokens <= c.toks.len() as u64);
            c.computed = info.num_computed_tokens;
        }
        live.extend(children);
        for m in &live {
            let info = pool.seq_info(m.id).unwrap();
            assert_eq!(
                info.num_tokens,
                m.toks.len() as u64,
                "seed {seed} step {step}"
            );
            assert_eq!(
                info.num_computed_tokens, m.computed,
                "seed {seed} step {step} commit {commit}: {:?}",
                m.id
            );
        }
        // Sequences with uncomputed tokens are caught up (a prefill of the
        // rest) so the next decode step can plan them.
        for m in live.iter_mut() {
            let n = m.toks.len() as u64;
            if m.computed < n {
                let q = (n - m.computed) as u32;
                pool.prepare(&[m.id], &[q]).unwrap().commit().unwrap();
                m.computed = n;
            } else if n == 0 {
                let t = fresh(&mut r);
                if pool.append(m.id, &[t]).is_err() {
                    continue; // out of blocks: dropped below
                }
                m.toks.push(t);
                pool.prepare(&[m.id], &[1]).unwrap().commit().unwrap();
                m.computed = 1;
            }
        }
        live.retain(|m| {
            let keep = !m.toks.is_empty();
            if !keep {
                pool.free_seq(m.id).unwrap();
            }
            keep
        });
        if live.is_empty() {
            continue;
        }
        // A request repeating a computed sequence hits every full block.
        if step % 7 == 0 {
            let m = &live[r.below(live.len())];
            let mut probe = m.toks.clone();
            probe.push(-1);
            let s = pool.create_seq().unwrap();
            let hit = pool.match_prefix(s, &probe).unwrap();
            let want = (m.toks.len() as u64 / bs as u64) * bs as u64;
            assert_eq!(
                hit, want,
                "seed {seed} step {step}: prefix hit of {:?}",
                m.id
            );
            pool.free_seq(s).unwrap();
        }
        pool.validate().unwrap();
    }
}

#[test]
fn decode_commits_after_the_batch_changed_match_a_model() {
    for seed in 1..=40u64 {
        for bs in [1u32, 2, 4] {
            run(seed * 7919 + bs as u64, bs);
        }
    }
}
