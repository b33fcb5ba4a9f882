//! Misuse of the safe API: bad sizes and counts are errors, never a panic
//! or an abort.

use pagedkv::{Pool, PoolOptions};

fn pool() -> Pool {
    Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 16,
        enable_events: true,
        ..PoolOptions::default()
    })
    .unwrap()
}

#[test]
fn drain_events_with_a_huge_max_does_not_allocate_it() {
    let p = pool();
    let s = p.create_seq().unwrap();
    p.append(s, &[1, 2, 3, 4, 5]).unwrap();
    // usize::MAX events would overflow the buffer's capacity (a panic), and
    // 2^40 would abort on a failed allocation: the buffer is capped.
    assert!(p.drain_events(usize::MAX).unwrap().len() <= 16);
    assert!(p.drain_events(1 << 40).unwrap().is_empty());
    let n: usize = p
        .events()
        .map(|e| e.map(|_| 1))
        .sum::<pagedkv::Result<usize>>()
        .unwrap();
    assert_eq!(n, 0);
}

#[test]
fn group_arrays_of_the_wrong_element_type_are_invalid_arguments() {
    use pagedkv::{ErrorKind, PlanArray, SnapshotArray};
    let p = pool();
    let s = p.create_seq().unwrap();
    p.append(s, &[1, 2, 3]).unwrap();
    let b = p.prepare(&[s], &[3]).unwrap();
    // SlotMapping and snapshot Rows are i64: asking for them as i32 is the
    // caller's mistake, not a library fault.
    let e = b.plan_group_i32(0, PlanArray::SlotMapping).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{e}");
    let e = b.group_snapshot_i32(0, SnapshotArray::Rows).unwrap_err();
    assert!(
        matches!(
            e.kind(),
            ErrorKind::InvalidArgument | ErrorKind::InvalidState
        ),
        "{e}"
    );
    assert_eq!(b.plan_group_i32(0, PlanArray::ContextLens).unwrap(), &[3]);
}

#[test]
fn read_kv_block_of_an_mla_pool() {
    use pagedkv::{DType, ErrorKind, Kv, KvLayout, TensorView};
    let (rank, rope) = (16usize, 8usize);
    let w = rank + rope;
    let p = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 8,
        num_layers: 2,
        dtype: DType::F32,
        kv_layout: KvLayout::Mla,
        kv_lora_rank: rank as u32,
        qk_rope_head_dim: rope as u32,
        num_threads: 1,
        ..PoolOptions::default()
    })
    .unwrap();
    let s = p.create_seq().unwrap();
    p.append(s, &[1, 2, 3]).unwrap();
    let mut b = p.prepare(&[s], &[3]).unwrap();
    for layer in 0..2u32 {
        let c: Vec<f32> = (0..3 * rank)
            .map(|i| (layer * 1000) as f32 + i as f32)
            .collect();
        let pe: Vec<f32> = (0..3 * rope)
            .map(|i| -((layer * 1000) as f32 + i as f32))
            .collect();
        b.mla_cache_write(
            layer,
            &TensorView::new(&c, &[3, rank]).unwrap(),
            &TensorView::new(&pe, &[3, rope]).unwrap(),
        )
        .unwrap();
    }
    drop(b);
    let block = p.block_table(s).unwrap()[0];
    // Was an Internal error ("unexpected KV storage layout"): the latent
    // tensor has 3 dimensions and one swap plane per layer.
    let got = p.read_kv_block::<f32>(1, Kv::Key, block).unwrap();
    assert_eq!(got.len(), 4 * w);
    for slot in 0..3 {
        for j in 0..rank {
            assert_eq!(got[slot * w + j], 1000.0 + (slot * rank + j) as f32);
        }
        for j in 0..rope {
            assert_eq!(
                got[slot * w + rank + j],
                -(1000.0 + (slot * rope + j) as f32)
            );
        }
    }
    let l0 = p.read_kv_block::<f32>(0, Kv::Key, block).unwrap();
    assert_eq!(l0[w + 1], (rank + 1) as f32);
    let e = p.read_kv_block::<f32>(1, Kv::Value, block).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
}

#[test]
fn a_batch_outliving_its_pool_reads_its_arrays_and_refuses_commit() {
    use pagedkv::ErrorKind;
    let p = pool();
    let s = p.create_seq().unwrap();
    p.append(s, &[1, 2, 3, 4, 5]).unwrap();
    let b = p.prepare(&[s], &[5]).unwrap();
    drop(p);
    assert_eq!(b.info().unwrap().num_tokens, 5);
    assert_eq!(b.context_lens().unwrap(), &[5]);
    assert_eq!(b.slot_mapping().unwrap().len(), 5);
    assert_eq!(b.token_positions().unwrap(), &[0, 1, 2, 3, 4]);
    assert_eq!(b.commit().unwrap_err().kind(), ErrorKind::InvalidState);
}

#[test]
fn read_kv_block_refuses_the_null_block() {
    use pagedkv::{DType, ErrorKind, Kv, NULL_BLOCK};
    // Nothing ever writes the null block, so its memory is whatever the
    // allocator left there: reading it would hand uninitialised bytes to
    // safe code (valgrind: "conditional jump depends on uninitialised
    // value"). It is refused as swap_out and copy_blocks refuse it.
    let p = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 8,
        num_layers: 2,
        num_kv_heads: 1,
        head_dim: 8,
        dtype: DType::F32,
        num_threads: 1,
        ..PoolOptions::default()
    })
    .unwrap();
    let before = p.stats().unwrap();
    for which in [Kv::Key, Kv::Value] {
        let e = p.read_kv_block::<f32>(1, which, NULL_BLOCK).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("null block"), "{}", e.message());
    }
    assert_eq!(p.stats().unwrap(), before);
    // Real blocks still read.
    assert_eq!(p.read_kv_block::<f32>(1, Kv::Value, 1).unwrap().len(), 32);
}

#[test]
fn read_kv_block_of_a_pool_without_storage_says_so_for_every_element_type() {
    use pagedkv::{half, ErrorKind, Kv};
    // A manager-only pool has no storage and no storage dtype: the error
    // used to depend on T (F32: "the pool stores BF16", an invalid
    // argument naming a dtype the pool does not have; BF16: the library's
    // invalid state).
    let p = pool();
    let s = p.create_seq().unwrap();
    p.append(s, &[1, 2, 3, 4, 5]).unwrap();
    let errs = [
        p.read_kv_block::<f32>(0, Kv::Key, 1).unwrap_err(),
        p.read_kv_block::<half::bf16>(0, Kv::Key, 1).unwrap_err(),
        p.read_kv_block::<half::f16>(0, Kv::Value, 1).unwrap_err(),
    ];
    for e in &errs {
        assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
        assert!(e.message().contains("no KV storage"), "{}", e.message());
    }
}
