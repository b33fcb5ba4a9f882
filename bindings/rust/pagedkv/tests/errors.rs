//! Every error path the safe API can reach: the kind, a message that names
//! the argument, and that a failed call changed nothing.

mod common;

use std::thread;

use common::{manager, storage, Rng};
use pagedkv::*;

fn err<T: std::fmt::Debug>(r: Result<T>) -> Error {
    r.expect_err("expected an error")
}

fn assert_kind<T: std::fmt::Debug>(r: Result<T>, kind: ErrorKind, mentions: &str) -> Error {
    let e = err(r);
    assert_eq!(e.kind(), kind, "{e}");
    assert!(
        e.message()
            .to_lowercase()
            .contains(&mentions.to_lowercase()),
        "message {:?} should mention {mentions:?}",
        e.message()
    );
    e
}

#[test]
fn error_type_behaves() {
    let pool = manager(16, 4);
    let e = assert_kind(pool.seq_info(SeqId::INVALID), ErrorKind::NotFound, "");
    assert_eq!(e.code(), sys::PKV_E_NOT_FOUND);
    assert!(!e.message().is_empty());
    let shown = e.to_string();
    assert!(
        shown.contains("not found") && shown.contains(e.message()),
        "{shown}"
    );
    // Usable as Box<dyn Error> with `?`.
    fn boxed(p: &Pool) -> std::result::Result<(), Box<dyn std::error::Error + Send + Sync>> {
        p.free_seq(SeqId::from_raw(12345))?;
        Ok(())
    }
    assert!(boxed(&pool).unwrap_err().to_string().contains("not found"));
    for kind in [ErrorKind::OutOfBlocks, ErrorKind::Cuda, ErrorKind::Internal] {
        assert_eq!(ErrorKind::from_code(kind.code().unwrap()), kind);
        assert!(!kind.to_string().is_empty());
    }
}

#[test]
fn stale_and_unknown_sequence_ids() {
    let pool = manager(4, 16);
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2, 3, 4, 5]).unwrap();
    pool.free_seq(s).unwrap();
    let nf = ErrorKind::NotFound;
    for id in [
        s,
        SeqId::INVALID,
        SeqId::from_raw(u64::MAX),
        SeqId::from_raw(7 << 32 | 3),
    ] {
        assert_kind(pool.append(id, &[1]), nf, "");
        assert_kind(pool.append_with_lookahead(id, &[1], 2), nf, "");
        assert_kind(pool.match_prefix(id, &[1, 2]), nf, "");
        assert_kind(pool.blocks_needed(id, 1, 0), nf, "");
        assert_kind(pool.fork(id), nf, "");
        assert_kind(pool.truncate(id, 0), nf, "");
        assert_kind(pool.free_seq(id), nf, "");
        assert_kind(pool.seq_info(id), nf, "");
        assert_kind(pool.block_table(id), nf, "");
        assert_kind(pool.block_hashes(id), nf, "");
        assert_kind(pool.prepare(&[id], &[1]), nf, "");
    }
    // A new sequence reusing the slot gets a new generation.
    let t = pool.create_seq().unwrap();
    assert_ne!(t, s);
    assert_kind(pool.seq_info(s), nf, "");
    pool.validate().unwrap();
}

#[test]
fn bad_pool_options() {
    let bad = |o: PoolOptions, mention: &str| {
        assert_kind(Pool::new(&o), ErrorKind::InvalidArgument, mention);
    };
    let d = PoolOptions {
        num_blocks: 8,
        ..PoolOptions::default()
    };
    bad(
        PoolOptions {
            block_size: 0,
            ..d.clone()
        },
        "block_size",
    );
    bad(
        PoolOptions {
            block_size: 4096,
            ..d.clone()
        },
        "block_size",
    );
    bad(
        PoolOptions {
            num_blocks: 1,
            ..d.clone()
        },
        "num_blocks",
    );
    bad(
        PoolOptions {
            num_blocks: 0,
            memory_budget_bytes: 0,
            ..d.clone()
        },
        "num_blocks",
    );
    bad(
        PoolOptions {
            hash_seed: "a\0b".into(),
            ..d.clone()
        },
        "hash_seed",
    );
    let with_storage = PoolOptions {
        num_layers: 1,
        num_kv_heads: 2,
        head_dim: 64,
        dtype: DType::F32,
        ..d.clone()
    };
    bad(
        PoolOptions {
            head_dim: 0,
            ..with_storage.clone()
        },
        "head_dim",
    );
    bad(
        PoolOptions {
            num_kv_heads: 0,
            ..with_storage.clone()
        },
        "num_kv_heads",
    );
    bad(
        PoolOptions {
            dtype: DType::I32,
            ..with_storage.clone()
        },
        "dtype",
    );
    bad(
        PoolOptions {
            device: Device::Cuda(-1),
            ..with_storage.clone()
        },
        "device",
    );
    // Nothing is leaked or left half-built: a good pool still works.
    Pool::new(&with_storage).unwrap().validate().unwrap();
}

#[test]
fn cuda_pool_without_cuda_is_unsupported() {
    if features().cuda() && cuda_device_count() > 0 {
        return;
    }
    let e = err(Pool::new(&PoolOptions {
        num_blocks: 8,
        num_layers: 1,
        num_kv_heads: 1,
        head_dim: 64,
        device: Device::Cuda(0),
        ..PoolOptions::default()
    }));
    assert!(
        matches!(e.kind(), ErrorKind::Unsupported | ErrorKind::Cuda),
        "{e}"
    );
}

#[test]
fn out_of_blocks_changes_nothing() {
    let pool = manager(4, 5); // 4 usable
    let a = pool.create_seq().unwrap();
    pool.append(a, &[1; 10]).unwrap(); // 3 blocks
    let before = (
        pool.stats().unwrap(),
        pool.block_table(a).unwrap(),
        pool.seq_info(a).unwrap(),
    );
    assert_eq!(pool.blocks_needed(a, 7, 0).unwrap(), 2);
    assert_kind(pool.append(a, &[2; 7]), ErrorKind::OutOfBlocks, "");
    assert_kind(
        pool.append_with_lookahead(a, &[2; 2], 8),
        ErrorKind::OutOfBlocks,
        "",
    );
    let b = pool.create_seq().unwrap();
    assert_kind(pool.append(b, &[3; 8]), ErrorKind::OutOfBlocks, "");
    let after = (
        pool.stats().unwrap(),
        pool.block_table(a).unwrap(),
        pool.seq_info(a).unwrap(),
    );
    assert_eq!(before.1, after.1);
    assert_eq!(before.2, after.2);
    assert_eq!(before.0.num_free_blocks, after.0.num_free_blocks);
    assert_eq!(before.0.num_tokens, after.0.num_tokens);
    assert_eq!(pool.seq_info(b).unwrap().num_tokens, 0);
    // Preempt and retry, as an engine does.
    pool.free_seq(a).unwrap();
    pool.append(b, &[3; 8]).unwrap();
    pool.validate().unwrap();
}

#[test]
fn bad_sequence_arguments() {
    let pool = manager(4, 16);
    let ia = ErrorKind::InvalidArgument;
    assert_kind(
        pool.create_seq_with(&SeqOptions {
            cache_salt: Some("x\0".into()),
            ..SeqOptions::default()
        }),
        ia,
        "cache_salt",
    );
    assert_kind(
        pool.create_seq_with(&SeqOptions {
            lora_name: Some("lo\0ra".into()),
            ..SeqOptions::default()
        }),
        ia,
        "lora_name",
    );
    assert_kind(
        pool.create_seq_with(&SeqOptions {
            mm_items: vec![MmItem {
                offset: 0,
                length: 2,
                hash: "bad\0hash".into(),
            }],
            ..SeqOptions::default()
        }),
        ia,
        "mm_items",
    );
    assert_kind(
        pool.create_seq_with(&SeqOptions {
            mm_items: vec![MmItem {
                offset: 0,
                length: 2,
                hash: String::new(),
            }],
            ..SeqOptions::default()
        }),
        ia,
        "hash",
    );
    assert_eq!(
        pool.stats().unwrap().num_seqs,
        0,
        "failed creates leave nothing"
    );

    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2, 3]).unwrap();
    let e = err(pool.truncate(s, 4));
    assert_eq!(e.kind(), ia, "{e}");
    let e = err(pool.match_prefix(s, &[1, 2, 3, 4, 5]));
    assert!(
        matches!(
            e.kind(),
            ErrorKind::InvalidArgument | ErrorKind::InvalidState
        ),
        "{e}"
    );
    assert_eq!(pool.seq_info(s).unwrap().num_tokens, 3);
}

#[test]
fn bad_plan_arguments() {
    let pool = storage(4, 16, 1, 2, 64, DType::F32);
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2, 3]).unwrap();
    let ia = ErrorKind::InvalidArgument;
    assert_kind(pool.prepare(&[s], &[1, 1]), ia, "query_counts");
    assert_kind(pool.prepare(&[s], &[4]), ia, "");
    assert_kind(pool.prepare(&[s], &[0]), ia, "");
    assert_kind(pool.prepare(&[s, s], &[1, 1]), ia, "");

    let mut batch = pool.prepare(&[s], &[3]).unwrap();
    let good = vec![0.5f32; 3 * 2 * 64];
    let g = TensorView::new(&good, &[3, 2, 64]).unwrap();
    // Wrong row count, wrong head count, wrong dtype, bad layer.
    let rows2 = vec![0.5f32; 2 * 2 * 64];
    let r2 = TensorView::new(&rows2, &[2, 2, 64]).unwrap();
    assert_kind(batch.cache_write(0, &r2, &g), ia, "");
    let h1 = TensorView::new(&rows2[..3 * 64], &[3, 1, 64]).unwrap();
    assert_kind(batch.cache_write(0, &g, &h1), ia, "");
    let half_data = vec![half::f16::from_f32(0.5); 3 * 2 * 64];
    let hf = TensorView::new(&half_data, &[3, 2, 64]).unwrap();
    assert_kind(batch.cache_write(0, &hf, &hf), ia, "");
    assert_kind(batch.cache_write(1, &g, &g), ia, "layer");
    batch.cache_write(0, &g, &g).unwrap();

    let mut out = vec![0f32; 3 * 2 * 64];
    let p = AttentionParams::default();
    {
        // q heads must be a multiple of the KV heads.
        let q3 = vec![0.1f32; 3 * 3 * 64];
        let mut o3 = vec![0f32; 3 * 3 * 64];
        let qv = TensorView::new(&q3, &[3, 3, 64]).unwrap();
        let mut ov = TensorViewMut::new(&mut o3, &[3, 3, 64]).unwrap();
        assert_kind(batch.attention_forward(0, &qv, &mut ov, None, &p), ia, "");
    }
    {
        let mut ov = TensorViewMut::new(&mut out[..2 * 2 * 64], &[2, 2, 64]).unwrap();
        assert_kind(batch.attention_forward(0, &g, &mut ov, None, &p), ia, "out");
    }
    {
        let mut lse = vec![0f32; 5];
        let mut lv = TensorViewMut::new(&mut lse, &[5]).unwrap();
        let mut ov = TensorViewMut::new(&mut out, &[3, 2, 64]).unwrap();
        assert_kind(
            batch.attention_forward(0, &g, &mut ov, Some(&mut lv), &p),
            ia,
            "lse",
        );
    }
    {
        let mut ov = TensorViewMut::new(&mut out, &[3, 2, 64]).unwrap();
        let bad = AttentionParams {
            softmax_scale: f32::NAN,
            ..p
        };
        assert_kind(
            batch.attention_forward(0, &g, &mut ov, None, &bad),
            ia,
            "scale",
        );
    }
    let mut ov = TensorViewMut::new(&mut out, &[3, 2, 64]).unwrap();
    batch.attention_forward(0, &g, &mut ov, None, &p).unwrap();
}

#[test]
fn tensor_view_shape_checks() {
    let data = vec![1f32; 24];
    let ia = ErrorKind::InvalidArgument;
    assert_kind(TensorView::new(&data, &[5, 5]), ia, "shape");
    assert_kind(TensorView::new(&data, &[]), ia, "shape");
    assert_kind(TensorView::new(&data, &[1, 1, 1, 1, 1, 1, 24]), ia, "shape");
    assert_kind(TensorView::new(&data, &[usize::MAX, 2]), ia, "shape");
    let mut m = vec![0i64; 6];
    assert_kind(TensorViewMut::new(&mut m, &[4]), ia, "shape");
    let v = TensorView::new(&data, &[2, 3, 4]).unwrap();
    assert_eq!((v.shape(), v.dtype()), (&[2i64, 3, 4][..], DType::F32));
    let bf = vec![half::bf16::ONE; 4];
    assert_eq!(TensorView::new(&bf, &[4]).unwrap().dtype(), DType::BF16);
    let strides = [1i64];
    let e = unsafe {
        TensorView::from_raw_parts(
            data.as_ptr().cast(),
            DType::F32,
            Device::Cpu,
            &[2, 12],
            Some(&strides),
        )
    };
    assert_kind(e, ia, "strides");
}

#[test]
fn stale_plans_and_plans_outliving_the_pool() {
    let pool = storage(4, 16, 1, 1, 64, DType::F32);
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2]).unwrap();
    let mut batch = pool.prepare(&[s], &[2]).unwrap();
    let kv = vec![0.25f32; 2 * 64];
    let t = TensorView::new(&kv, &[2, 1, 64]).unwrap();
    batch.cache_write(0, &t, &t).unwrap();
    pool.append(s, &[3]).unwrap(); // the plan is stale now
    assert_kind(batch.cache_write(0, &t, &t), ErrorKind::InvalidState, "");
    let mut out = vec![0f32; 2 * 64];
    let mut o = TensorViewMut::new(&mut out, &[2, 1, 64]).unwrap();
    assert_kind(
        batch.attention_forward(0, &t, &mut o, None, &AttentionParams::default()),
        ErrorKind::InvalidState,
        "",
    );

    let mut fresh = pool.prepare(&[s], &[1]).unwrap();
    drop(pool);
    let one = TensorView::new(&kv[..64], &[1, 1, 64]).unwrap();
    assert_kind(
        fresh.cache_write(0, &one, &one),
        ErrorKind::InvalidState,
        "",
    );
    drop(batch);
    drop(fresh);
}

#[test]
fn bad_storage_arguments() {
    let pool = storage(4, 8, 1, 1, 64, DType::F32);
    let ia = ErrorKind::InvalidArgument;
    assert_kind(pool.kv_tensor(1, Kv::Key), ia, "layer");
    assert_kind(pool.read_kv_block::<f32>(0, Kv::Key, 8), ia, "block");
    assert_kind(pool.read_kv_block::<f32>(0, Kv::Key, -1), ia, "block");
    assert_kind(pool.read_kv_block::<half::f16>(0, Kv::Key, 1), ia, "f16");
    assert_kind(pool.copy_blocks(&[1, 2], &[3]), ia, "src");
    assert_kind(pool.copy_blocks(&[1], &[8]), ia, "dst");
    assert_kind(pool.copy_blocks(&[-1], &[2]), ia, "src");
    let bpb = pool.bytes_per_block().unwrap() as usize;
    let mut small = vec![0u8; 2 * bpb - 1];
    assert_kind(pool.swap_out(&[1, 2], &mut small), ia, "host");
    assert_kind(pool.swap_in(&[1, 2], &small), ia, "host");
    assert_kind(pool.swap_out(&[9], &mut small), ia, "block");
    // A manager-only pool has no storage.
    let m = manager(16, 4);
    let e = err(m.kv_tensor(0, Kv::Key));
    assert!(
        matches!(
            e.kind(),
            ErrorKind::InvalidArgument | ErrorKind::InvalidState | ErrorKind::Unsupported
        ),
        "{e}"
    );
    assert!(m.copy_blocks(&[1], &[2]).is_err());
}

#[test]
fn hash_errors() {
    let ia = ErrorKind::InvalidArgument;
    let bad_bs = HashOptions {
        block_size: 0,
        ..HashOptions::default()
    };
    assert_kind(hash_prefix(&bad_bs, &[1, 2, 3]), ia, "block_size");
    let nul = HashOptions {
        seed: "\0".into(),
        ..HashOptions::default()
    };
    assert_kind(hash_prefix(&nul, &[1]), ia, "seed");
    assert_kind(hash_root(HashAlgo::Sha256Cbor, "a\0"), ia, "seed");
    let overlap = HashOptions {
        mm_items: vec![
            MmItem {
                offset: 0,
                length: 8,
                hash: "a".into(),
            },
            MmItem {
                offset: 4,
                length: 8,
                hash: "b".into(),
            },
        ],
        ..HashOptions::default()
    };
    assert_kind(hash_prefix(&overlap, &[1; 32]), ia, "mm_items");
}

#[test]
fn buffer_too_small_and_invariant_codes_map_to_their_kinds() {
    // The safe API sizes its buffers itself; drive the C call directly.
    let pool = manager(4, 8);
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1; 9]).unwrap();
    let mut one = [0i32; 1];
    let mut len = 0u64;
    let st = unsafe {
        sys::pkv_seq_get_block_table(pool.as_raw(), s.raw(), one.as_mut_ptr(), 1, &mut len)
    };
    assert_eq!(ErrorKind::from_code(st), ErrorKind::BufferTooSmall);
    assert_eq!(len, 3);
    assert_eq!(
        ErrorKind::from_code(sys::PKV_E_INVARIANT),
        ErrorKind::Invariant
    );
    assert_eq!(
        ErrorKind::from_code(sys::PKV_E_OUT_OF_MEMORY),
        ErrorKind::OutOfMemory
    );
    // The safe call grows its buffer and succeeds.
    assert_eq!(pool.block_table(s).unwrap().len(), 3);
}

#[test]
fn messages_are_per_thread() {
    let pool = manager(4, 8);
    let mut rng = Rng::new(9);
    let ids: Vec<u64> = (0..8).map(|_| rng.next_u64() | 1).collect();
    thread::scope(|sc| {
        for (i, id) in ids.iter().enumerate() {
            let pool = &pool;
            sc.spawn(move || {
                for _ in 0..200 {
                    if i % 2 == 0 {
                        let e = err(pool.seq_info(SeqId::from_raw(*id)));
                        assert_eq!(e.kind(), ErrorKind::NotFound, "{e}");
                    } else {
                        let e = err(pool.copy_blocks(&[1], &[2]));
                        assert_ne!(e.kind(), ErrorKind::NotFound, "{e}");
                        let e = err(hash_prefix(
                            &HashOptions {
                                block_size: 0,
                                ..HashOptions::default()
                            },
                            &[1],
                        ));
                        assert!(e.message().contains("block_size"), "{e}");
                    }
                }
            });
        }
    });
}

/// Issue 14 item 6 through Rust's raw views: descriptors whose extent
/// overflows, whose output rows alias, or that are misaligned are refused
/// with InvalidArgument naming the argument.
#[test]
fn descriptor_checks_on_raw_views() {
    use pagedkv::{AttentionParams, Device, TensorView, TensorViewMut};
    let pool = common::storage(8, 8, 1, 2, 16, DType::F32);
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2, 3, 4, 5]).unwrap();
    let mut b = pool.prepare(&[s], &[5]).unwrap();
    let kv = vec![0.5f32; 5 * 2 * 16];
    let kt = TensorView::new(&kv, &[5, 2, 16]).unwrap();
    b.cache_write(0, &kt, &kt).unwrap();
    let q = vec![0.25f32; 5 * 4 * 16];
    let mut out = vec![0f32; 5 * 4 * 16 + 1];
    let qt = TensorView::new(&q, &[5, 4, 16]).unwrap();
    let p = AttentionParams::default();
    // SAFETY: each view describes memory the library refuses before it
    // touches it (the call fails); nothing outlives the buffers.
    unsafe {
        let huge = TensorView::from_raw_parts(
            q.as_ptr().cast(),
            DType::F32,
            Device::Cpu,
            &[5, 4, 16],
            Some(&[1i64 << 62, 16, 1]),
        )
        .unwrap();
        let mut o = TensorViewMut::new(&mut out[..5 * 4 * 16], &[5, 4, 16]).unwrap();
        assert_kind(
            b.attention_forward(0, &huge, &mut o, None, &p),
            ErrorKind::InvalidArgument,
            "q's extent",
        );
        let mut alias = TensorViewMut::from_raw_parts(
            out.as_mut_ptr().cast(),
            DType::F32,
            Device::Cpu,
            &[5, 4, 16],
            Some(&[0, 16, 1]),
        )
        .unwrap();
        assert_kind(
            b.attention_forward(0, &qt, &mut alias, None, &p),
            ErrorKind::InvalidArgument,
            "out is an output whose elements overlap",
        );
        let mut odd = TensorViewMut::from_raw_parts(
            out.as_mut_ptr().cast::<u8>().add(2).cast(),
            DType::F32,
            Device::Cpu,
            &[5, 4, 16],
            None,
        )
        .unwrap();
        assert_kind(
            b.attention_forward(0, &qt, &mut odd, None, &p),
            ErrorKind::InvalidArgument,
            "not aligned",
        );
    }
}
