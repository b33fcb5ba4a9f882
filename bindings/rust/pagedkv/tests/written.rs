//! Issue 13: no request may ever read K/V that nobody wrote. Tokens count as
//! computed when their step is committed; dropping an uncommitted `Batch`
//! aborts it; prefix hits attach only written blocks; a plan over unwritten
//! context fails with `InvalidState`.

mod common;

use std::collections::HashMap;

use common::{manager, Rng};
use pagedkv::*;

const BS: usize = 4;

#[test]
fn same_step_admission_then_free_serves_nothing_unwritten() {
    let pool = manager(4, 16);
    let system: Vec<i32> = (0..12).collect();
    let s1 = pool.create_seq().unwrap();
    pool.append(s1, &[&system[..], &[1]].concat()).unwrap();
    let s2 = pool.create_seq().unwrap();
    let p2 = [&system[..], &[2]].concat();
    assert_eq!(pool.match_prefix(s2, &p2).unwrap(), 0);
    pool.append(s2, &p2).unwrap();
    pool.free_seq(s1).unwrap();
    assert_eq!(pool.seq_info(s2).unwrap().num_computed_tokens, 0);
    let err = pool.prepare(&[s2], &[1]).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState);
    assert!(err.to_string().contains("tokens [0, 12)"), "{err}");
    pool.prepare(&[s2], &[13]).unwrap().commit().unwrap();
    pool.free_seq(s2).unwrap();
    let s3 = pool.create_seq().unwrap();
    assert_eq!(
        pool.match_prefix(s3, &[&system[..], &[3]].concat())
            .unwrap(),
        12
    );
    pool.validate().unwrap();
}

#[test]
fn dropping_an_uncommitted_batch_aborts_it() {
    let pool = manager(4, 16);
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2, 3, 4, 5]).unwrap();
    drop(pool.prepare(&[s], &[5]).unwrap()); // the model raised: nothing counts
    assert_eq!(pool.seq_info(s).unwrap().num_computed_tokens, 0);
    pool.prepare(&[s], &[5]).unwrap().abort().unwrap();
    assert_eq!(pool.seq_info(s).unwrap().num_computed_tokens, 0);
    pool.prepare(&[s], &[5]).unwrap().commit().unwrap();
    assert_eq!(pool.seq_info(s).unwrap().num_computed_tokens, 5);
}

/// The model: per slot, the (salt-free) token prefix this test's committed
/// steps wrote there. Appending into a slot, or a block new to a table,
/// leaves it unwritten.
struct Model {
    tokens: HashMap<SeqId, Vec<i32>>,
    slots: HashMap<(i32, usize), Vec<i32>>,
}

impl Model {
    fn readable(&self, pool: &Pool, s: SeqId, p: usize) -> bool {
        let t = &self.tokens[&s];
        let table = pool.block_table(s).unwrap();
        self.slots
            .get(&(table[p / BS], p % BS))
            .map(|v| v.as_slice())
            == Some(&t[..=p])
    }
    fn computed(&self, pool: &Pool, s: SeqId) -> usize {
        let n = self.tokens[&s].len();
        (0..n).find(|&p| !self.readable(pool, s, p)).unwrap_or(n)
    }
}

/// Random operations against the model: the library must never hit or plan
/// over a slot the model says nobody wrote, and must agree on what is
/// computed.
#[test]
fn random_operations_never_serve_unwritten_slots() {
    for seed in 1..=12u64 {
        let mut r = Rng::new(seed);
        let pool = manager(BS as u32, 24);
        let mut m = Model {
            tokens: HashMap::new(),
            slots: HashMap::new(),
        };
        let mut live: Vec<SeqId> = Vec::new();
        for _ in 0..300 {
            match r.range(0, 7) {
                0 => {
                    let prompt: Vec<i32> =
                        (0..r.range(1, 14)).map(|_| r.range(0, 2) as i32).collect();
                    let s = pool.create_seq().unwrap();
                    let hit = pool.match_prefix(s, &prompt).unwrap() as usize;
                    m.tokens.insert(s, prompt[..hit].to_vec());
                    for p in 0..hit {
                        assert!(
                            m.readable(&pool, s, p),
                            "seed {seed}: hit on unwritten slot {p}"
                        );
                    }
                    live.push(s);
                }
                1 | 2 if !live.is_empty() => {
                    let s = live[r.range(0, live.len() as u64) as usize];
                    let new: Vec<i32> = (0..r.range(1, 6)).map(|_| r.range(0, 2) as i32).collect();
                    let before = pool.block_table(s).unwrap();
                    if pool.append(s, &new).is_err() {
                        continue; // out of blocks: nothing changed
                    }
                    let after = pool.block_table(s).unwrap();
                    let n0 = m.tokens[&s].len();
                    for (j, &b) in after.iter().enumerate() {
                        if before.get(j) == Some(&b) {
                            continue;
                        }
                        for o in 0..BS {
                            let from = before.get(j).filter(|_| j * BS + o < n0);
                            match from.and_then(|&old| m.slots.get(&(old, o)).cloned()) {
                                Some(v) => m.slots.insert((b, o), v),
                                None => m.slots.remove(&(b, o)),
                            };
                        }
                    }
                    for p in n0..n0 + new.len() {
                        m.slots.remove(&(after[p / BS], p % BS));
                    }
                    m.tokens.get_mut(&s).unwrap().extend(new);
                }
                3 if !live.is_empty() => {
                    let s = live[r.range(0, live.len() as u64) as usize];
                    let c = pool.fork(s).unwrap();
                    let t = m.tokens[&s].clone();
                    m.tokens.insert(c, t);
                    live.push(c);
                }
                4 if !live.is_empty() => {
                    let i = r.range(0, live.len() as u64) as usize;
                    let s = live[i];
                    if r.range(0, 2) == 0 {
                        pool.free_seq(s).unwrap();
                        m.tokens.remove(&s);
                        live.swap_remove(i);
                    } else {
                        let n = r.range(0, m.tokens[&s].len() as u64 + 1) as usize;
                        pool.truncate(s, n as u64).unwrap();
                        m.tokens.get_mut(&s).unwrap().truncate(n);
                    }
                }
                _ if !live.is_empty() => {
                    let s = live[r.range(0, live.len() as u64) as usize];
                    let n = m.tokens[&s].len();
                    if n == 0 {
                        continue;
                    }
                    let q = if r.range(0, 2) == 0 {
                        (n - m.computed(&pool, s)).max(1)
                    } else {
                        r.range(1, n as u64 + 1) as usize
                    };
                    let ok = (0..n - q).all(|p| m.readable(&pool, s, p));
                    match pool.prepare(&[s], &[q as u32]) {
                        Err(e) => {
                            assert!(!ok, "seed {seed}: refused a plan over written context: {e}");
                            assert_eq!(e.kind(), ErrorKind::InvalidState);
                        }
                        Ok(b) => {
                            assert!(ok, "seed {seed}: accepted a plan over unwritten context");
                            if r.range(0, 3) == 0 {
                                drop(b); // the model raised: aborted
                            } else {
                                b.commit().unwrap();
                                let table = pool.block_table(s).unwrap();
                                let t = m.tokens[&s].clone();
                                for p in n - q..n {
                                    m.slots.insert((table[p / BS], p % BS), t[..=p].to_vec());
                                }
                            }
                        }
                    }
                }
                _ => {}
            }
            pool.validate().unwrap();
            for &s in &live {
                assert_eq!(
                    pool.seq_info(s).unwrap().num_computed_tokens as usize,
                    m.computed(&pool, s),
                    "seed {seed}"
                );
            }
        }
    }
}
