//! `Pool::prepare_decode` (`pkv_batch_prepare_decode`): one decode step in
//! one call. Twin pools get the same random prompts and steps; each step
//! runs as `prepare_decode` on one and as `append_batch` then `prepare`
//! (query 1) on the other, and every plan array element and block table
//! must agree. A failing step appends nothing.

mod common;

use common::*;
use pagedkv::{Batch, ErrorKind, GroupSpec, Pool, PoolOptions, SeqId, SeqOptions, Stream};

fn counts(pool: &Pool, seqs: &[SeqId]) -> Vec<(u64, u64)> {
    seqs.iter()
        .map(|s| {
            let i = pool.seq_info(*s).unwrap();
            (i.num_tokens, i.num_computed_tokens)
        })
        .collect()
}

fn tables(pool: &Pool, seqs: &[SeqId]) -> Vec<Vec<i32>> {
    seqs.iter().map(|s| pool.block_table(*s).unwrap()).collect()
}

fn snapshot(pool: &Pool, seqs: &[SeqId]) -> (Vec<(u64, u64)>, Vec<Vec<i32>>, u64) {
    (
        counts(pool, seqs),
        tables(pool, seqs),
        pool.stats().unwrap().num_free_blocks,
    )
}

/// Commits a step computing every uncomputed token of seqs.
fn compute(pool: &Pool, seqs: &[SeqId]) {
    let q: Vec<u32> = counts(pool, seqs)
        .iter()
        .map(|(n, c)| (n - c) as u32)
        .collect();
    pool.prepare(seqs, &q).unwrap().commit().unwrap();
}

fn same_plan(a: &Batch, b: &Batch, what: &str) {
    assert_eq!(
        a.slot_mapping().unwrap(),
        b.slot_mapping().unwrap(),
        "{what}"
    );
    assert_eq!(
        a.query_indptr().unwrap(),
        b.query_indptr().unwrap(),
        "{what}"
    );
    assert_eq!(a.page_indptr().unwrap(), b.page_indptr().unwrap(), "{what}");
    assert_eq!(
        a.page_indices().unwrap(),
        b.page_indices().unwrap(),
        "{what}"
    );
    assert_eq!(
        a.last_page_len().unwrap(),
        b.last_page_len().unwrap(),
        "{what}"
    );
    assert_eq!(
        a.context_lens().unwrap(),
        b.context_lens().unwrap(),
        "{what}"
    );
    let (x, y) = (a.info().unwrap(), b.info().unwrap());
    assert_eq!(
        (x.num_seqs, x.num_tokens, x.num_pages),
        (y.num_seqs, y.num_tokens, y.num_pages),
        "{what}"
    );
}

/// Two manager-only pools with the same n random prompts (a small
/// vocabulary: prefix hits), prefilled and committed.
fn twins(rng: &mut Rng, n: usize) -> [(Pool, Vec<SeqId>); 2] {
    let prompts: Vec<Vec<i32>> = (0..n)
        .map(|_| {
            let len = rng.range(1, 40) as usize;
            (0..len).map(|_| rng.range(0, 64) as i32).collect()
        })
        .collect();
    let make = || {
        let pool = manager(4, 4000);
        let seqs: Vec<SeqId> = prompts
            .iter()
            .map(|p| pool.admit(&SeqOptions::default(), p, 0).unwrap().0)
            .collect();
        compute(&pool, &seqs);
        (pool, seqs)
    };
    [make(), make()]
}

fn twin_run(seed: u64, persistent: bool) {
    let mut rng = Rng::new(seed);
    let [(pa, mut sa), (pb, mut sb)] = twins(&mut rng, 9);
    assert_eq!(tables(&pa, &sa), tables(&pb, &sb));
    for step in 0..40 {
        if step % 7 == 3 {
            // reorder, drop and fork: plans over a changing batch
            let mut perm: Vec<usize> = (0..sa.len()).collect();
            rng.shuffle(&mut perm);
            sa = perm.iter().map(|&i| sa[i]).collect();
            sb = perm.iter().map(|&i| sb[i]).collect();
            if sa.len() > 3 {
                pa.free_seq(sa.pop().unwrap()).unwrap();
                pb.free_seq(sb.pop().unwrap()).unwrap();
            }
            let k = rng.range(0, sa.len() as u64) as usize;
            sa.push(pa.fork(sa[k]).unwrap());
            sb.push(pb.fork(sb[k]).unwrap());
        }
        let toks: Vec<i32> = (0..sa.len()).map(|_| rng.range(0, 64) as i32).collect();
        let (da, db) = if persistent {
            pb.append_batch(&sb, &toks).unwrap();
            (
                pa.prepare_decode_persistent_on(&sa, &toks, Stream::DEFAULT)
                    .unwrap(),
                pb.prepare_persistent_on(&sb, &vec![1; sb.len()], Stream::DEFAULT)
                    .unwrap(),
            )
        } else {
            pb.append_batch(&sb, &toks).unwrap();
            (
                pa.prepare_decode(&sa, &toks).unwrap(),
                pb.prepare(&sb, &vec![1; sb.len()]).unwrap(),
            )
        };
        same_plan(&da, &db, &format!("seed {seed} step {step}"));
        let qi: Vec<i32> = (0..=sa.len() as i32).collect();
        assert_eq!(da.query_indptr().unwrap(), &qi[..]);
        assert_eq!(tables(&pa, &sa), tables(&pb, &sb), "step {step}");
        assert_eq!(counts(&pa, &sa), counts(&pb, &sb), "step {step}");
        if step % 5 == 4 {
            // an aborted step: the tokens stay, uncomputed
            da.abort().unwrap();
            db.abort().unwrap();
            assert_eq!(counts(&pa, &sa), counts(&pb, &sb));
            compute(&pa, &sa);
            compute(&pb, &sb);
        } else {
            da.commit().unwrap();
            db.commit().unwrap();
        }
        pa.validate().unwrap();
        pb.validate().unwrap();
    }
    let (x, y) = (pa.stats().unwrap(), pb.stats().unwrap());
    assert_eq!(
        (x.num_free_blocks, x.num_tokens, x.num_cow_copies),
        (y.num_free_blocks, y.num_tokens, y.num_cow_copies)
    );
    for (a, b) in sa.iter().zip(&sb) {
        assert_eq!(pa.block_hashes(*a).unwrap(), pb.block_hashes(*b).unwrap());
    }
}

#[test]
fn prepare_decode_equals_append_batch_then_prepare() {
    for seed in 1..4 {
        twin_run(seed, false);
    }
}

#[test]
fn prepare_decode_persistent_equals_append_batch_then_prepare_persistent() {
    for seed in 11..14 {
        twin_run(seed, true);
    }
}

#[test]
fn uncomputed_sequence_appends_nothing() {
    let pool = manager(4, 64);
    let o = SeqOptions::default();
    let seqs: Vec<SeqId> = (0..3)
        .map(|i| pool.admit(&o, &[5, 6, 7, i, 9], 0).unwrap().0)
        .collect();
    compute(&pool, &seqs[..2]); // seqs[2]'s prompt was never computed
    let before = snapshot(&pool, &seqs);
    let e = pool.prepare_decode(&seqs, &[1, 2, 3]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
    assert!(e.message().contains("seqs[2]"), "{}", e.message());
    assert_eq!(snapshot(&pool, &seqs), before);
    let e = pool
        .prepare_decode_persistent_on(&[seqs[2], seqs[0]], &[1, 2], Stream::DEFAULT)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
    assert_eq!(snapshot(&pool, &seqs), before);
    pool.validate().unwrap();
}

#[test]
fn bad_arguments_change_nothing() {
    let pool = manager(4, 5);
    let o = SeqOptions::default();
    let seqs: Vec<SeqId> = (0..3)
        .map(|i| pool.admit(&o, &[1, 2, i], 0).unwrap().0)
        .collect();
    compute(&pool, &seqs);
    let before = snapshot(&pool, &seqs);
    let e = pool
        .prepare_decode(&[seqs[0], seqs[1], seqs[0]], &[7, 7, 7])
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert!(e.message().contains("seqs[2]"), "{}", e.message());
    assert_eq!(snapshot(&pool, &seqs), before);
    for (s, t) in [(&seqs[..], &[7, 7][..]), (&seqs[..2], &[7, 7, 7][..])] {
        let e = pool.prepare_decode(s, t).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
        assert!(e.message().contains("differ in length"), "{}", e.message());
        let e = pool
            .prepare_decode_persistent_on(s, t, Stream::DEFAULT)
            .unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    }
    let e = pool.prepare_decode(&[], &[]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    assert_eq!(snapshot(&pool, &seqs), before);
    // a step that fills every block
    let b = pool.prepare_decode(&seqs, &[7, 7, 7]).unwrap();
    assert_eq!(b.context_lens().unwrap(), &[4, 4, 4]);
    b.commit().unwrap();
    assert_eq!(counts(&pool, &seqs), vec![(4, 4); 3]);
    // three new blocks are needed, one is free
    let before = snapshot(&pool, &seqs);
    assert_eq!(before.2, 1);
    let e = pool
        .prepare_decode_persistent_on(&seqs, &[8, 8, 8], Stream::DEFAULT)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfBlocks, "{e}");
    assert!(
        e.message().contains("nothing was appended"),
        "{}",
        e.message()
    );
    assert_eq!(snapshot(&pool, &seqs), before);
    // one sequence fits: the step goes through
    let b = pool.prepare_decode(&seqs[1..2], &[8]).unwrap();
    assert_eq!(b.context_lens().unwrap(), &[5]);
    b.commit().unwrap();
    assert_eq!(counts(&pool, &seqs), vec![(4, 4), (5, 5), (4, 4)]);
    pool.validate().unwrap();
}

#[test]
fn freed_sequence_other_pool_and_dropped_pool() {
    let pool = manager(4, 32);
    let o = SeqOptions::default();
    let a = pool.admit(&o, &[1, 2, 3], 0).unwrap().0;
    let gone = pool.admit(&o, &[1, 2, 3], 0).unwrap().0;
    compute(&pool, &[a, gone]);
    pool.free_seq(gone).unwrap();
    let e = pool.prepare_decode(&[a, gone], &[4, 4]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert!(e.message().contains("seqs[1]"), "{}", e.message());
    assert_eq!(counts(&pool, &[a]), vec![(3, 3)]);
    // an id of another pool names nothing there
    let other = manager(4, 32);
    let e = other.prepare_decode(&[a], &[4]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
    assert_eq!(counts(&pool, &[a]), vec![(3, 3)]);
    // a plan outliving its pool: clean errors, no crash
    let b = pool.prepare_decode(&[a], &[4]).unwrap();
    assert_eq!(b.context_lens().unwrap(), &[4]);
    drop(pool);
    assert_eq!(b.commit().unwrap_err().kind(), ErrorKind::InvalidState);
    let keep = other.admit(&o, &[9, 9], 0).unwrap().0;
    compute(&other, &[keep]);
    let b2 = other.prepare_decode(&[keep], &[9]).unwrap();
    drop(other);
    assert_eq!(b2.context_lens().unwrap(), &[3]);
    drop(b2); // an uncommitted plan of a dropped pool aborts quietly
}

#[test]
fn multi_group_pool_is_unsupported() {
    let pool = Pool::with_groups(
        &PoolOptions {
            block_size: 4,
            num_blocks: 32,
            ..PoolOptions::default()
        },
        &[GroupSpec::full(1, 2, 8), GroupSpec::recurrent(7, 4096)],
    )
    .unwrap();
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2, 3]).unwrap();
    pool.prepare(&[s], &[3]).unwrap().commit().unwrap();
    let e = pool.prepare_decode(&[s], &[4]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    let e = pool
        .prepare_decode_persistent_on(&[s], &[4], Stream::DEFAULT)
        .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    assert_eq!(counts(&pool, &[s]), vec![(3, 3)]);
    // the way there: append, then prepare
    pool.append(s, &[4]).unwrap();
    pool.prepare(&[s], &[1]).unwrap().commit().unwrap();
    assert_eq!(counts(&pool, &[s]), vec![(4, 4)]);
}
