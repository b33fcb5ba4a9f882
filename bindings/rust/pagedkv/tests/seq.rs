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
