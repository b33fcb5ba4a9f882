//! Owned sequences (issue 14): a `Seq` frees itself on drop, `detach` hands
//! it to the pool, `attach_seq` takes it back.

mod common;

use common::*;
use pagedkv::{ErrorKind, Pool, SeqId};

fn grow(pool: &Pool, tokens: usize) -> pagedkv::Result<SeqId> {
    let s = pool.sequence()?;
    s.append(&vec![7; tokens])?; // a failing append must not leak s
    Ok(s.detach())
}

#[test]
fn failing_append_after_sequence_does_not_leak() {
    let pool = manager(4, 4); // 3 usable blocks: 12 tokens
    let err = grow(&pool, 100).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfBlocks);
    assert_eq!(pool.stats().unwrap().num_seqs, 0);
    assert_eq!(pool.stats().unwrap().num_free_blocks, 3);
    let kept = grow(&pool, 5).unwrap();
    assert_eq!(pool.seq_info(kept).unwrap().num_tokens, 5);
    pool.validate().unwrap();
}

#[test]
fn drop_frees_detach_keeps_attach_takes_back() {
    let pool = manager(4, 16);
    let id = {
        let s = pool.sequence().unwrap();
        s.append(&[1, 2, 3, 4, 5]).unwrap();
        let child = s.fork().unwrap();
        assert_eq!(child.info().unwrap().num_tokens, 5);
        assert_eq!(pool.stats().unwrap().num_seqs, 2);
        s.id()
    }; // both dropped
    assert_eq!(pool.seq_info(id).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(pool.stats().unwrap().num_seqs, 0);

    let s = pool.sequence().unwrap();
    s.append(&[9; 6]).unwrap();
    let id = s.into_id();
    assert_eq!(pool.seq_info(id).unwrap().num_tokens, 6); // the pool owns it now
    assert_eq!(pool.block_table(id).unwrap().len(), 2);
    let back = pool.attach_seq(id).unwrap();
    assert_eq!(back.id(), id);
    drop(back);
    assert_eq!(pool.seq_info(id).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(
        pool.attach_seq(id).unwrap_err().kind(),
        ErrorKind::NotFound,
        "a stale id cannot be attached"
    );

    // free() reports; a drop after an explicit free_seq is harmless.
    let s = pool.sequence().unwrap();
    s.free().unwrap();
    let s = pool.sequence().unwrap();
    pool.free_seq(s.id()).unwrap();
    drop(s);
    assert_eq!(pool.stats().unwrap().num_seqs, 0);
    pool.validate().unwrap();
}

#[test]
fn seq_is_send_and_sync() {
    fn assert_send_sync<T: Send + Sync>() {}
    assert_send_sync::<pagedkv::Seq<'static>>();
}

/// Everything a caller can see of a sequence and its pool.
fn view(
    pool: &Pool,
    s: SeqId,
) -> (
    pagedkv::SeqInfo,
    Vec<Vec<i32>>,
    Vec<pagedkv::BlockHash>,
    pagedkv::PoolStats,
) {
    let tables = (0..pool.num_groups().unwrap())
        .map(|g| pool.group_block_table(s, g).unwrap())
        .collect();
    (
        pool.seq_info(s).unwrap(),
        tables,
        pool.block_hashes(s).unwrap(),
        pool.stats().unwrap(),
    )
}

#[test]
fn reserve_changes_nothing_a_caller_sees() {
    // Twin pools driven alike, one sequence reserved at admission: a prefill
    // and 40 decode steps show the same infos, tables, hashes and stats.
    let pools = [manager(4, 32), manager(4, 32)];
    let seqs: Vec<_> = pools.iter().map(|p| p.sequence().unwrap()).collect();
    let before = view(&pools[1], seqs[1].id());
    seqs[1].reserve(7 + 40).unwrap();
    seqs[1].reserve(3).unwrap(); // below the room already made: a no-op
    seqs[1].reserve(0).unwrap();
    assert_eq!(view(&pools[1], seqs[1].id()), before);
    for (p, s) in pools.iter().zip(&seqs) {
        s.append(&[1, 2, 3, 4, 5, 6, 7]).unwrap();
        p.prepare(&[s.id()], &[7]).unwrap().commit().unwrap();
    }
    for step in 0..=40 {
        assert_eq!(
            view(&pools[0], seqs[0].id()),
            view(&pools[1], seqs[1].id()),
            "step {step}"
        );
        if step == 40 {
            break;
        }
        for (p, s) in pools.iter().zip(&seqs) {
            p.prepare_decode(&[s.id()], &[1000 + step])
                .unwrap()
                .commit()
                .unwrap();
        }
    }
    let info = seqs[1].info().unwrap();
    assert_eq!((info.num_tokens, info.num_computed_tokens), (47, 47));
    for p in &pools {
        p.validate().unwrap();
    }
}

#[test]
fn reserve_bad_input() {
    let pool = manager(4, 16);
    let s = pool.sequence().unwrap();
    s.append(&[1, 2, 3, 4, 5, 6]).unwrap();
    let before = view(&pool, s.id());
    for n in [1u64 << 31, 1 << 62, u64::MAX] {
        let e = s.reserve(n).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{n}: {e}");
        assert!(e.message().contains("num_tokens"), "{e}");
    }
    assert_eq!(view(&pool, s.id()), before);
    s.reserve(64).unwrap(); // still usable afterwards
    pool.validate().unwrap();

    // A freed (stale) or never issued id is NotFound.
    let t = pool.sequence().unwrap();
    let id = t.id();
    t.free().unwrap();
    assert_eq!(pool.reserve(id, 8).unwrap_err().kind(), ErrorKind::NotFound);
    assert_eq!(
        pool.reserve(SeqId::from_raw(12345), 8).unwrap_err().kind(),
        ErrorKind::NotFound
    );
}
