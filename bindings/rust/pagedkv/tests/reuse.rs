//! Partial-block prefix hits and retention priorities (issue 22).

use pagedkv::{ErrorKind, EventKind, Pool, PoolOptions, RetentionRange, SeqId};

fn pool(partial: bool, retention: bool, max_pinned: u64) -> Pool {
    Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 8,
        enable_events: true,
        enable_partial_reuse: partial,
        enable_retention: retention,
        max_pinned_blocks: max_pinned,
        ..PoolOptions::default()
    })
    .unwrap()
}

fn computed(pool: &Pool, s: SeqId, tokens: &[i32]) {
    pool.append(s, tokens).unwrap();
    let info = pool.seq_info(s).unwrap();
    let q = (info.num_tokens - info.num_computed_tokens) as u32;
    pool.prepare(&[s], &[q]).unwrap().commit().unwrap();
}

#[test]
fn partial_hit_reuses_the_first_tokens_of_a_cached_block() {
    assert!(!PoolOptions::default().enable_partial_reuse);
    let p = pool(true, false, 0);
    let a = p.create_seq().unwrap();
    computed(&p, a, &[0, 1, 2, 3, 4, 5, 6, 7, 8, 9]);
    let b = p.sequence().unwrap();
    let m = b.match_prefix_partial(&[0, 1, 2, 3, 4, 5, 6, 42]).unwrap();
    assert_eq!((m.num_cached, m.partial_tokens), (7, 3));
    let ta = p.block_table(a).unwrap();
    assert_eq!(m.copy_src, ta[1]);
    assert_eq!(b.block_table().unwrap(), vec![ta[0], m.copy_dst]);
    assert_eq!(b.info().unwrap().num_computed_tokens, 7);
    let st = p.stats().unwrap();
    assert_eq!((st.num_partial_hits, st.partial_hit_tokens), (1, 3));
    assert!(p.options().unwrap().enable_partial_reuse);
    p.validate().unwrap();
}

#[test]
fn retention_pins_priorities_and_the_clock() {
    let p = pool(false, true, 1);
    p.set_clock(1_000).unwrap();
    let a = p.create_seq().unwrap();
    p.set_retention(
        a,
        &[
            RetentionRange::new(0, 4, RetentionRange::PINNED),
            RetentionRange {
                duration_ns: 500,
                ..RetentionRange::new(4, RetentionRange::END, 70)
            },
        ],
    )
    .unwrap();
    computed(&p, a, &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let c = p.priority_counts().unwrap();
    assert_eq!(c.len(), 101);
    assert_eq!((c[100], c[70]), (1, 1));
    p.free_seq(a).unwrap();
    let st = p.stats().unwrap();
    assert_eq!((st.num_pinned_blocks, st.num_free_blocks), (1, 6));
    p.drain_events(64).unwrap();
    p.set_clock(1_500).unwrap();
    assert_eq!(p.priority_counts().unwrap()[70], 0);
    let ev = p.drain_events(64).unwrap();
    assert_eq!(ev.len(), 1);
    assert_eq!(ev[0].kind, EventKind::BlockPriority);
    assert_eq!(ev[0].num_tokens, RetentionRange::PRIORITY_DEFAULT);
    let b = p.create_seq().unwrap();
    computed(&p, b, &[50, 51, 52, 53, 54]);
    let pin = [RetentionRange::new(0, 4, RetentionRange::PINNED)];
    let err = p.set_retention(b, &pin).unwrap_err();
    assert_eq!(err.kind(), ErrorKind::OutOfBlocks);
    assert!(err.message().contains("max_pinned_blocks"), "{err}");
    let bad = [RetentionRange::new(0, 4, 101)];
    assert_eq!(
        p.set_retention(b, &bad).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    p.validate().unwrap();
}

#[test]
fn retention_needs_the_pool_option() {
    let p = pool(false, false, 0);
    let s = p.create_seq().unwrap();
    let err = p
        .set_retention(s, &[RetentionRange::new(0, 8, 90)])
        .unwrap_err();
    assert_eq!(err.kind(), ErrorKind::InvalidState);
}

#[test]
fn replacing_the_ranges_lowers_and_unpins_the_sequences_own_blocks() {
    // pool.h: set_retention replaces the ranges, and a block the sequence
    // filled takes their priority exactly. Replacing them never lowered a
    // priority: a pin stayed for good, after the sequence was freed too,
    // and its max_pinned_blocks budget could not be given back.
    let p = pool(false, true, 1);
    let a = p.create_seq().unwrap();
    computed(&p, a, &[0, 1, 2, 3, 4, 5, 6, 7, 8]);
    let pin = [RetentionRange::new(0, 4, RetentionRange::PINNED)];
    p.set_retention(a, &pin).unwrap();
    assert_eq!(p.stats().unwrap().num_pinned_blocks, 1);
    p.set_retention(a, &[RetentionRange::new(0, 8, 10)])
        .unwrap();
    let c = p.priority_counts().unwrap();
    assert_eq!((c[100], c[10]), (0, 2), "{c:?}");
    assert_eq!(p.stats().unwrap().num_pinned_blocks, 0);
    // No ranges: the default for all of it.
    p.set_retention(a, &[]).unwrap();
    let c = p.priority_counts().unwrap();
    assert_eq!(c[RetentionRange::PRIORITY_DEFAULT as usize], 2, "{c:?}");
    // The budget is free again for another sequence.
    let b = p.create_seq().unwrap();
    computed(&p, b, &[50, 51, 52, 53, 54]);
    p.set_retention(b, &pin).unwrap();
    assert_eq!(p.stats().unwrap().num_pinned_blocks, 1);
    // A prefix hit on b's block only ever raises it: a lower range of the
    // sequence that hit it leaves the pin.
    let hit = p.create_seq().unwrap();
    assert_eq!(p.match_prefix(hit, &[50, 51, 52, 53, 54]).unwrap(), 4);
    p.set_retention(hit, &[RetentionRange::new(0, 4, 5)])
        .unwrap();
    assert_eq!(p.stats().unwrap().num_pinned_blocks, 1);
    // Nor does b lower it while the hit shares it.
    p.set_retention(b, &[]).unwrap();
    assert_eq!(p.stats().unwrap().num_pinned_blocks, 1);
    p.free_seq(hit).unwrap();
    p.set_retention(b, &[]).unwrap();
    assert_eq!(p.stats().unwrap().num_pinned_blocks, 0);
    p.free_seq(a).unwrap();
    p.free_seq(b).unwrap();
    p.validate().unwrap();
}
