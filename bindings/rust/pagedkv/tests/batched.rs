//! Batched and fused calls: append_batch, free_batch, admit and lookups by
//! precomputed block hashes, each all or nothing.

mod common;

use common::*;
use pagedkv::{hash_prefix, ErrorKind, HashOptions, Pool, SeqId, SeqOptions};

fn commit_all(pool: &Pool, seqs: &[SeqId]) {
    let counts: Vec<u32> = seqs
        .iter()
        .map(|s| pool.seq_info(*s).unwrap().num_tokens as u32)
        .collect();
    pool.prepare(seqs, &counts).unwrap().commit().unwrap();
}

fn tables(pool: &Pool, seqs: &[SeqId]) -> Vec<Vec<i32>> {
    seqs.iter().map(|s| pool.block_table(*s).unwrap()).collect()
}

#[test]
fn append_batch_equals_one_append_each() {
    let (a, b) = (manager(4, 64), manager(4, 64));
    let mk = |p: &Pool| -> Vec<SeqId> {
        (0..6)
            .map(|i| {
                let s = p.create_seq().unwrap();
                p.append(s, &vec![i; 3 + i as usize]).unwrap();
                s
            })
            .collect()
    };
    let (sa, sb) = (mk(&a), mk(&b));
    for step in 0..20 {
        let toks: Vec<i32> = (0..6).map(|i| step * 10 + i).collect();
        a.append_batch(&sa, &toks).unwrap();
        for (s, t) in sb.iter().zip(&toks) {
            b.append(*s, &[*t]).unwrap();
        }
        assert_eq!(tables(&a, &sa), tables(&b, &sb));
        assert_eq!(
            a.stats().unwrap().num_free_blocks,
            b.stats().unwrap().num_free_blocks
        );
    }
    a.validate().unwrap();
}

#[test]
fn batched_calls_are_all_or_nothing() {
    let pool = manager(4, 5);
    let seqs: Vec<SeqId> = (0..3)
        .map(|_| {
            let s = pool.create_seq().unwrap();
            pool.append(s, &[1, 2, 3, 4]).unwrap();
            s
        })
        .collect();
    let dead = pool.create_seq().unwrap();
    pool.free_seq(dead).unwrap();
    let before = (tables(&pool, &seqs), pool.stats().unwrap().num_free_blocks);
    let e = pool.append_batch(&seqs, &[7, 7, 7]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfBlocks);
    assert!(e.message().contains("seqs[1]"), "{}", e.message());
    let e = pool.append_batch(&[seqs[0], dead], &[7, 7]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert!(e.message().contains("seqs[1]"), "{}", e.message());
    let e = pool.append_batch(&[seqs[0], seqs[0]], &[7, 7]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert_eq!(
        pool.append_batch(&seqs, &[7]).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let e = pool.free_batch(&[seqs[2], dead]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::NotFound);
    assert_eq!(
        before,
        (tables(&pool, &seqs), pool.stats().unwrap().num_free_blocks)
    );
    pool.free_batch(&seqs).unwrap();
    assert_eq!(pool.stats().unwrap().num_seqs, 0);
    pool.validate().unwrap();
}

#[test]
fn admit_with_and_without_hashes() {
    let pool = manager(4, 32);
    let salted = SeqOptions {
        cache_salt: Some("tenant-a".into()),
        ..SeqOptions::default()
    };
    let prompt: Vec<i32> = (0..17).collect();
    let (first, hit) = pool.admit(&salted, &prompt, 0).unwrap();
    assert_eq!(hit, 0);
    commit_all(&pool, &[first]);
    let (second, hit) = pool.admit(&salted, &prompt, 2).unwrap();
    assert_eq!(hit, 16);
    assert_eq!(
        pool.block_table(second).unwrap()[..4],
        pool.block_table(first).unwrap()[..4]
    );
    let opts = |salt: &str| HashOptions {
        block_size: 4,
        cache_salt: Some(salt.into()),
        ..HashOptions::default()
    };
    let hashes = hash_prefix(&opts("tenant-a"), &prompt).unwrap();
    let (third, hit) = pool.admit_hashes(&salted, &prompt, &hashes, 0).unwrap();
    assert_eq!(hit, 16);
    assert_eq!(
        pool.block_table(third).unwrap()[..4],
        pool.block_table(first).unwrap()[..4]
    );
    let empty = pool.create_seq_with(&salted).unwrap();
    assert_eq!(
        pool.match_prefix_hashes(empty, &prompt, &hashes[..2])
            .unwrap(),
        8
    );
    // Another salt's hashes never hit: rejected, nothing created.
    let seqs = pool.stats().unwrap().num_seqs;
    let other = hash_prefix(&opts("tenant-b"), &prompt).unwrap();
    let e = pool.admit_hashes(&salted, &prompt, &other, 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("hashes[0]"), "{}", e.message());
    assert_eq!(pool.stats().unwrap().num_seqs, seqs);
    // Out of blocks: no sequence, no hit taken.
    let free = pool.stats().unwrap().num_free_blocks;
    let e = pool.admit(&salted, &vec![1; 400], 0).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::OutOfBlocks);
    assert_eq!(pool.stats().unwrap().num_seqs, seqs);
    assert_eq!(pool.stats().unwrap().num_free_blocks, free);
    pool.validate().unwrap();
}
