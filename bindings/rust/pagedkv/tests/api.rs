//! Every API of the safe crate on its success path, checked against the
//! block manager contract (DESIGN.md §3) and against each other.

mod common;

use common::{manager, storage, Rng};
use pagedkv::*;

/// One engine step for `seq` whose K/V the engine wrote itself: a plan
/// whose queries are the `n` tokens just appended, committed. Committing is
/// what makes those tokens count as computed (pool.h): only then can their
/// full blocks be hit or stay in the prefix cache when freed, and only then
/// may the sliding window release keys behind them.
fn step(pool: &Pool, seq: SeqId, n: u32) {
    pool.prepare(&[seq], &[n]).unwrap().commit().unwrap();
}

#[test]
fn versions_and_features() {
    let v = version_string();
    let parts: Vec<u32> = v.split('.').map(|p| p.parse().unwrap()).collect();
    assert_eq!(parts.len(), 3, "{v}");
    assert_eq!(
        parts[0] * 10000 + parts[1] * 100 + parts[2],
        version_number()
    );
    assert_eq!(version_number(), HEADER_VERSION_NUMBER);
    assert_eq!(abi_version(), HEADER_ABI_VERSION);
    let f = features();
    assert!(f.sha256(), "SHA-256 hashing is always built");
    assert_eq!(f.cuda(), f.bits() & sys::PKV_FEATURE_CUDA != 0);
    if !f.cuda() {
        assert_eq!(cuda_device_count(), 0);
    }
    assert_eq!(DType::F32.size(), 4);
    assert_eq!(DType::BF16.size(), 2);
    assert_eq!(HashAlgo::Sha256Cbor.digest_len(), 32);
    assert_eq!(HashAlgo::Xxh3_128.digest_len(), 16);
    assert!(status_string(sys::PKV_E_OUT_OF_BLOCKS).starts_with("PKV_E_OUT_OF_BLOCKS"));
}

#[test]
fn options_round_trip() {
    let opts = PoolOptions {
        block_size: 8,
        num_blocks: 33,
        hash_algo: HashAlgo::Xxh3_128,
        enable_prefix_caching: false,
        hash_seed: "seed-42".into(),
        sliding_window: 64,
        enable_events: true,
        max_events: 100,
        num_layers: 2,
        num_kv_heads: 2,
        head_dim: 64,
        dtype: DType::F16,
        device: Device::Cpu,
        num_threads: 1,
        memory_budget_bytes: 0,
        strict_key_domains: true,
        vllm_tagged_keys: false,
        kv_scale_granularity: pagedkv::KvScaleGranularity::PerTensor,
        k_scales: Vec::new(),
        v_scales: Vec::new(),
        enable_partial_reuse: true,
        enable_retention: true,
        max_pinned_blocks: 4,
        kv_layout: pagedkv::KvLayout::Mha,
        kv_lora_rank: 0,
        qk_rope_head_dim: 0,
    };
    let pool = Pool::new(&opts).unwrap();
    let got = pool.options().unwrap();
    assert_eq!(got, opts);
    // K and V, every layer, every head, every slot.
    assert_eq!(pool.bytes_per_block().unwrap(), 2 * 2 * 2 * 8 * 64 * 2);
    assert_eq!(
        pool.stats().unwrap().kv_bytes_allocated,
        33 * pool.bytes_per_block().unwrap()
    );
    assert_eq!(manager(16, 10).bytes_per_block().unwrap(), 0);
}

#[test]
fn num_blocks_from_memory_budget() {
    let bpb = 2 * 2 * 16 * 64 * 4u64; // one layer, f32
    let pool = Pool::new(&PoolOptions {
        num_blocks: 0,
        memory_budget_bytes: bpb * 20 + bpb / 2,
        num_layers: 1,
        num_kv_heads: 2,
        head_dim: 64,
        dtype: DType::F32,
        ..PoolOptions::default()
    })
    .unwrap();
    assert_eq!(pool.bytes_per_block().unwrap(), bpb);
    assert_eq!(pool.options().unwrap().num_blocks, 20);
}

#[test]
fn sequence_lifecycle_follows_the_block_manager_contract() {
    let pool = manager(4, 16);
    let a = pool.create_seq().unwrap();
    assert_eq!(pool.blocks_needed(a, 10, 0).unwrap(), 3);
    pool.append(a, &[1, 2, 3, 4, 5, 6, 7, 8, 9, 10]).unwrap();
    // The free queue starts as 1..N-1 in order; allocation pops the head.
    assert_eq!(pool.block_table(a).unwrap(), vec![1, 2, 3]);
    let info = pool.seq_info(a).unwrap();
    assert_eq!(
        (
            info.num_tokens,
            info.num_blocks,
            info.num_slots,
            info.num_cached_tokens
        ),
        (10, 3, 12, 0)
    );
    // Two more tokens fit the partial block; a third needs a new one.
    assert_eq!(pool.blocks_needed(a, 2, 0).unwrap(), 0);
    assert_eq!(pool.blocks_needed(a, 3, 0).unwrap(), 1);
    let s = pool.stats().unwrap();
    assert_eq!(
        (s.num_blocks, s.num_used_blocks, s.num_free_blocks),
        (16, 3, 12)
    );
    assert_eq!((s.num_seqs, s.num_tokens, s.block_size), (1, 10, 4));
    assert!((s.usage - 3.0 / 15.0).abs() < 1e-12);
    assert_eq!(
        s.num_cached_blocks, 2,
        "full blocks are cached as they fill"
    );

    pool.truncate(a, 5).unwrap();
    assert_eq!(pool.seq_info(a).unwrap().num_tokens, 5);
    assert_eq!(pool.block_table(a).unwrap(), vec![1, 2]);

    pool.append_with_lookahead(a, &[6], 5).unwrap();
    let info = pool.seq_info(a).unwrap();
    assert_eq!(info.num_tokens, 6);
    assert!(info.num_slots >= 11, "lookahead slots reserved: {info:?}");

    pool.free_seq(a).unwrap();
    let s = pool.stats().unwrap();
    assert_eq!(
        (s.num_seqs, s.num_used_blocks, s.num_free_blocks),
        (0, 0, 15)
    );
    pool.validate().unwrap();
}

#[test]
fn block_hashes_match_hash_prefix() {
    let mut rng = Rng::new(1);
    for algo in [HashAlgo::Sha256Cbor, HashAlgo::Xxh3_128] {
        let pool = Pool::new(&PoolOptions {
            block_size: 4,
            num_blocks: 16,
            hash_algo: algo,
            hash_seed: "s".into(),
            ..PoolOptions::default()
        })
        .unwrap();
        let tokens = rng.tokens(14);
        let seq = pool
            .create_seq_with(&SeqOptions {
                lora_id: 7,
                cache_salt: Some("tenant-a".into()),
                ..SeqOptions::default()
            })
            .unwrap();
        pool.append(seq, &tokens).unwrap();
        let got = pool.block_hashes(seq).unwrap();
        let opts = HashOptions {
            algo,
            block_size: 4,
            seed: "s".into(),
            lora_id: 7,
            cache_salt: Some("tenant-a".into()),
            ..HashOptions::default()
        };
        assert_eq!(got, hash_prefix(&opts, &tokens).unwrap());
        assert_eq!(got.len(), 3);
        assert!(got[0].digest(algo).len() == algo.digest_len());
        if algo == HashAlgo::Xxh3_128 {
            assert!(got[0].as_bytes()[16..].iter().all(|&b| b == 0));
        }
        // Salt and LoRA are part of the hash.
        let plain = hash_prefix(
            &HashOptions {
                algo,
                block_size: 4,
                seed: "s".into(),
                ..HashOptions::default()
            },
            &tokens,
        )
        .unwrap();
        assert_ne!(plain[0], got[0]);
    }
}

// Digests from tests/hash/pyref.py (vLLM's current block hashing: cbor2
// canonical + hashlib), seed "", block size 4.
const LORA_NAME_VECTOR: [&str; 2] = [
    "57a891e4b6cb6a32257a80070b41e8c2c4be378d75682997a00ddd87bb9f150a",
    "31c575fbacde4474bd78de3f5395b099a1441ffbad28bb57d4e0a65b81463087",
];
const MM_DECODE_VECTOR: [&str; 2] = [
    "f4283c434ecdbd4d07af2439f6d3cf09a926973908760be4f5e9bd4a1c64cfc5",
    "202b0131f1b2bd1c7b42bd9755db8693dd644c8fb7645086adf68a68310ff122",
];

fn hexes(hs: &[BlockHash]) -> Vec<String> {
    hs.iter().map(|h| h.to_hex()).collect()
}

#[test]
fn lora_name_and_mm_offsets_match_vllm_vectors() {
    let pool = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 16,
        ..PoolOptions::default()
    })
    .unwrap();
    let prompt: Vec<i32> = (1..=9).collect();
    let named = pool
        .create_seq_with(&SeqOptions {
            lora_name: Some("sql-lora".into()),
            ..SeqOptions::default()
        })
        .unwrap();
    pool.append(named, &prompt).unwrap();
    let got = pool.block_hashes(named).unwrap();
    assert_eq!(hexes(&got), LORA_NAME_VECTOR);
    let opts = HashOptions {
        block_size: 4,
        lora_name: Some("sql-lora".into()),
        ..HashOptions::default()
    };
    assert_eq!(hash_prefix(&opts, &prompt).unwrap(), got);
    // Another name or the id instead of the name: no hit.
    for other in [
        SeqOptions {
            lora_name: Some("other".into()),
            ..SeqOptions::default()
        },
        SeqOptions {
            lora_id: 1,
            ..SeqOptions::default()
        },
    ] {
        let s = pool.create_seq_with(&other).unwrap();
        assert_eq!(pool.match_prefix(s, &prompt).unwrap(), 0);
    }
    // A block completed by decode, starting where the image ends.
    let mm = pool
        .create_seq_with(&SeqOptions {
            mm_items: vec![MmItem {
                offset: 0,
                length: 4,
                hash: "img".into(),
            }],
            ..SeqOptions::default()
        })
        .unwrap();
    pool.append(mm, &[-1, -1, -1, -1, 5, 6]).unwrap();
    pool.append(mm, &[7]).unwrap();
    pool.append(mm, &[8]).unwrap();
    assert_eq!(hexes(&pool.block_hashes(mm).unwrap()), MM_DECODE_VECTOR);
}

#[test]
fn hash_functions() {
    let d = HashOptions::default();
    assert_eq!(d.algo, HashAlgo::Sha256Cbor);
    assert_eq!(d.block_size, 16);
    let r1 = hash_root(HashAlgo::Sha256Cbor, "").unwrap();
    let r2 = hash_root(HashAlgo::Sha256Cbor, "other").unwrap();
    assert_ne!(r1, r2);
    assert_eq!(r1, hash_root(HashAlgo::Sha256Cbor, "").unwrap());
    assert_eq!(r1.to_hex().len(), 64);
    assert_eq!(format!("{r1}"), r1.to_hex());
    // Chaining: a later block's hash depends on every earlier token.
    let tokens: Vec<i32> = (0..48).collect();
    let mut changed = tokens.clone();
    changed[0] = 999;
    let a = hash_prefix(&d, &tokens).unwrap();
    let b = hash_prefix(&d, &changed).unwrap();
    assert_eq!(a.len(), 3);
    assert!(a.iter().zip(&b).all(|(x, y)| x != y));
    assert!(hash_prefix(&d, &tokens[..15]).unwrap().is_empty());
    // Multimodal items change the blocks they overlap.
    let mm = HashOptions {
        mm_items: vec![MmItem {
            offset: 20,
            length: 4,
            hash: "image-1".into(),
        }],
        ..HashOptions::default()
    };
    let c = hash_prefix(&mm, &tokens).unwrap();
    assert_eq!(c[0], a[0]);
    assert_ne!(c[1], a[1]);
}

#[test]
fn prefix_cache_hits_and_the_one_token_cap() {
    let pool = manager(4, 32);
    let prompt: Vec<i32> = (100..110).collect(); // 2 full blocks + 2
    let a = pool.create_seq().unwrap();
    assert_eq!(pool.match_prefix(a, &prompt).unwrap(), 0);
    pool.append(a, &prompt).unwrap();
    // Not computed yet: never hit (issue 13), not even in the same step.
    let early = pool.create_seq().unwrap();
    assert_eq!(pool.match_prefix(early, &prompt).unwrap(), 0);
    pool.free_seq(early).unwrap();
    step(&pool, a, 10);

    let b = pool.create_seq().unwrap();
    assert_eq!(pool.match_prefix(b, &prompt).unwrap(), 8);
    let info = pool.seq_info(b).unwrap();
    assert_eq!((info.num_tokens, info.num_cached_tokens), (8, 8));
    assert_eq!(info.num_computed_tokens, 8);
    pool.append(b, &prompt[8..]).unwrap();
    let (ta, tb) = (pool.block_table(a).unwrap(), pool.block_table(b).unwrap());
    assert_eq!(ta[..2], tb[..2]);
    assert_ne!(ta[2], tb[2]);

    // At least one token must be left to compute.
    let c = pool.create_seq().unwrap();
    assert_eq!(pool.match_prefix(c, &prompt[..8]).unwrap(), 4);
    let s = pool.stats().unwrap();
    assert_eq!(s.prefix_query_tokens, 10 + 10 + 10 + 8); // incl. the early miss
    assert_eq!(s.prefix_hit_tokens, 8 + 4);
    pool.validate().unwrap();
}

#[test]
fn freed_cached_blocks_are_hit_then_evicted_last() {
    let pool = manager(4, 6); // 5 usable
    let prompt: Vec<i32> = (0..9).collect();
    let a = pool.create_seq().unwrap();
    pool.append(a, &prompt).unwrap(); // blocks 1,2 (cached), 3
    step(&pool, a, 9);
    pool.free_seq(a).unwrap();
    let s = pool.stats().unwrap();
    assert_eq!((s.num_free_blocks, s.num_cached_blocks), (5, 2));
    // A hit takes the cached blocks out of the free queue.
    let b = pool.create_seq().unwrap();
    assert_eq!(pool.match_prefix(b, &prompt).unwrap(), 8);
    assert_eq!(pool.block_table(b).unwrap(), vec![1, 2]);
    pool.free_seq(b).unwrap();
    // Filling the pool reuses uncached blocks first, then evicts.
    let c = pool.create_seq().unwrap();
    pool.append(c, &[50; 12]).unwrap();
    assert_eq!(pool.stats().unwrap().num_evictions, 0);
    step(&pool, c, 12);
    pool.append(c, &[51; 8]).unwrap();
    assert_eq!(pool.stats().unwrap().num_evictions, 2);
    pool.validate().unwrap();
}

#[test]
fn blocks_no_plan_computed_leave_the_cache() {
    let pool = manager(4, 8); // 7 usable
    let prompt: Vec<i32> = (0..9).collect();
    let a = pool.create_seq().unwrap();
    pool.append(a, &prompt).unwrap();
    let (table, hashes) = (pool.block_table(a).unwrap(), pool.block_hashes(a).unwrap());
    // Stored at append, so a plan of this same step may share them...
    assert_eq!(pool.stats().unwrap().num_cached_blocks, 2);
    assert_eq!(pool.drain_events(100).unwrap().len(), 2);
    // ...but freed before any plan covered them they hold no K/V: they
    // leave the cache (one REMOVED each) and go to the head of the free
    // queue, so the next allocation takes them before older free blocks.
    pool.free_seq(a).unwrap();
    let s = pool.stats().unwrap();
    assert_eq!((s.num_free_blocks, s.num_cached_blocks), (7, 0));
    let ev = pool.drain_events(100).unwrap();
    assert!(ev.iter().all(|e| e.kind == EventKind::BlockRemoved));
    let mut removed: Vec<_> = ev.iter().map(|e| (e.block_id, e.block_hash)).collect();
    removed.sort();
    let mut want = vec![(table[0], hashes[0]), (table[1], hashes[1])];
    want.sort();
    assert_eq!(removed, want);
    let b = pool.create_seq().unwrap();
    assert_eq!(pool.match_prefix(b, &prompt).unwrap(), 0);
    // All three went to the head as one run, in the order freed (tail first).
    pool.append(b, &[5; 12]).unwrap();
    let want: Vec<i32> = table.iter().rev().copied().collect();
    assert_eq!(pool.block_table(b).unwrap(), want);
    pool.free_seq(b).unwrap();

    // Truncate keeps the blocks a plan computed and drops those filled since.
    let c = pool.create_seq().unwrap();
    pool.append(c, &prompt).unwrap();
    step(&pool, c, 9);
    pool.append(c, &[9; 8]).unwrap(); // fills table[2] and table[3]
    assert_eq!(pool.stats().unwrap().num_cached_blocks, 4);
    pool.truncate(c, 9).unwrap();
    assert_eq!(pool.stats().unwrap().num_cached_blocks, 2);
    assert_eq!(pool.block_hashes(c).unwrap(), hashes);
    pool.free_seq(c).unwrap();
    let d = pool.create_seq().unwrap();
    assert_eq!(pool.match_prefix(d, &prompt).unwrap(), 8);
    pool.validate().unwrap();
}

#[test]
fn sliding_window_waits_for_a_plan() {
    let pool = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 16,
        sliding_window: 8,
        ..PoolOptions::default()
    })
    .unwrap();
    let s = pool.create_seq().unwrap();
    pool.append(s, &(0..20).collect::<Vec<_>>()).unwrap();
    // No plan covered tokens 0..20 yet: they are still to be queried, so a
    // further append releases nothing.
    pool.append(s, &[20]).unwrap();
    assert!(pool
        .block_table(s)
        .unwrap()
        .iter()
        .all(|&b| b != NULL_BLOCK));
    assert_eq!(pool.stats().unwrap().num_used_blocks, 6);
    // Once a plan covered all 21, the next query (position 21) sees keys
    // 14..=21: blocks 0-2 go.
    step(&pool, s, 21);
    pool.append(s, &[21]).unwrap();
    let table = pool.block_table(s).unwrap();
    assert_eq!(table[..3], [NULL_BLOCK; 3]);
    assert!(table[3..].iter().all(|&b| b != NULL_BLOCK));
    assert_eq!(pool.stats().unwrap().num_used_blocks, 3);
    pool.validate().unwrap();
}

#[test]
fn fork_shares_blocks_and_copies_on_write() {
    let pool = storage(4, 16, 1, 1, 64, DType::F32);
    let p = pool.create_seq().unwrap();
    pool.append(p, &[1, 2, 3, 4, 5, 6]).unwrap();
    let c = pool.fork(p).unwrap();
    assert_ne!(c, p);
    assert_eq!(pool.block_table(c).unwrap(), pool.block_table(p).unwrap());
    assert_eq!(pool.seq_info(c).unwrap().num_tokens, 6);
    assert_eq!(pool.stats().unwrap().num_used_blocks, 2);
    // Writing into the shared partial block gives the child its own copy.
    pool.append(c, &[7]).unwrap();
    let (tp, tc) = (pool.block_table(p).unwrap(), pool.block_table(c).unwrap());
    assert_eq!(tp[0], tc[0]);
    assert_ne!(tp[1], tc[1]);
    assert_eq!(pool.stats().unwrap().num_cow_copies, 1);
    pool.validate().unwrap();
}

#[test]
fn sliding_window_releases_old_blocks() {
    let pool = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 16,
        sliding_window: 8,
        ..PoolOptions::default()
    })
    .unwrap();
    let s = pool.create_seq().unwrap();
    pool.append(s, &(0..20).collect::<Vec<_>>()).unwrap();
    // This step's first query (position 0) still reads everything.
    assert!(pool
        .block_table(s)
        .unwrap()
        .iter()
        .all(|&b| b != NULL_BLOCK));
    step(&pool, s, 20);
    // The next query (position 20) sees keys 13..=20: blocks 0-2 are
    // released and stand as the null block in the table.
    pool.append(s, &[20]).unwrap();
    let table = pool.block_table(s).unwrap();
    assert_eq!(table.len(), 6);
    assert_eq!(table[..3], [NULL_BLOCK; 3]);
    assert!(table[3..].iter().all(|&b| b != NULL_BLOCK));
    assert_eq!(pool.stats().unwrap().num_used_blocks, 3);
    pool.validate().unwrap();
}

#[test]
fn events_in_order_with_parents() {
    let pool = manager(4, 8);
    let a = pool.create_seq().unwrap();
    pool.append(a, &(0..9).collect::<Vec<_>>()).unwrap();
    // The two events below come from the append (full blocks are stored at
    // once); preparing the plan adds none.
    step(&pool, a, 9);
    let hashes = pool.block_hashes(a).unwrap();
    let ev: Vec<Event> = pool.events().collect::<Result<_>>().unwrap();
    assert_eq!(ev.len(), 2);
    assert_eq!((ev[0].seq_no, ev[1].seq_no), (1, 2));
    assert!(ev
        .iter()
        .all(|e| e.kind == EventKind::BlockStored && e.num_tokens == 4));
    assert_eq!(ev[0].block_hash, hashes[0]);
    assert_eq!(ev[0].parent_hash, None);
    assert_eq!(ev[1].parent_hash, Some(hashes[0]));
    assert_eq!(
        pool.block_table(a).unwrap()[..2],
        [ev[0].block_id, ev[1].block_id]
    );
    assert!(pool.drain_events(10).unwrap().is_empty());

    pool.reset_prefix_cache().unwrap();
    assert_eq!(pool.stats().unwrap().num_cached_blocks, 0);
    let ev = pool.drain_events(10).unwrap();
    assert_eq!(ev.last().unwrap().kind, EventKind::AllCleared);
    assert_eq!(ev.last().unwrap().seq_no, 3);

    // Eviction of a cached block reports its removal.
    pool.free_seq(a).unwrap();
    let b = pool.create_seq().unwrap();
    pool.append(b, &(100..108).collect::<Vec<_>>()).unwrap();
    // A plan computed b's blocks, so the free keeps them cached (no REMOVED
    // yet) and c's eviction reports them.
    step(&pool, b, 8);
    pool.free_seq(b).unwrap();
    pool.drain_events(100).unwrap();
    let c = pool.create_seq().unwrap();
    pool.append(c, &[7; 7 * 4 - 1]).unwrap(); // every usable block
    let ev = pool.drain_events(100).unwrap();
    let removed = ev
        .iter()
        .filter(|e| e.kind == EventKind::BlockRemoved)
        .count();
    assert_eq!(removed, 2);
    // drain_events(n) takes at most n.
    pool.free_seq(c).unwrap();
    pool.validate().unwrap();
}

#[test]
fn step_plan_arrays() {
    let pool = storage(4, 32, 1, 1, 64, DType::F32);
    let a = pool.create_seq().unwrap();
    let b = pool.create_seq().unwrap();
    pool.append(a, &[1, 2, 3, 4, 5]).unwrap();
    step(&pool, a, 5); // a's context is computed
    pool.append(a, &[6]).unwrap();
    pool.append(b, &[9, 9, 9]).unwrap();
    let batch = pool.prepare(&[a, b], &[1, 3]).unwrap();
    let info = batch.info().unwrap();
    assert_eq!(
        info,
        BatchInfo {
            num_seqs: 2,
            num_tokens: 4,
            num_pages: 3,
            max_context: 6,
            max_query: 3,
            block_size: 4
        }
    );
    let (ta, tb) = (pool.block_table(a).unwrap(), pool.block_table(b).unwrap());
    assert_eq!(batch.query_indptr().unwrap(), &[0, 1, 4]);
    assert_eq!(batch.page_indptr().unwrap(), &[0, 2, 3]);
    assert_eq!(batch.page_indices().unwrap(), &[ta[0], ta[1], tb[0]]);
    assert_eq!(batch.last_page_len().unwrap(), &[2, 3]);
    assert_eq!(batch.context_lens().unwrap(), &[6, 3]);
    let slot = |blk: i32, off: i64| blk as i64 * 4 + off;
    assert_eq!(
        batch.slot_mapping().unwrap(),
        &[
            slot(ta[1], 1),
            slot(tb[0], 0),
            slot(tb[0], 1),
            slot(tb[0], 2)
        ]
    );
    let t = batch.plan_tensor(PlanArray::SlotMapping).unwrap();
    assert_eq!(t.dtype(), Some(DType::I64));
    assert_eq!(t.shape(), &[4]);
    assert_eq!(t.device().unwrap(), Device::Cpu);
    assert!(format!("{batch:?}").contains("num_tokens: 4"));
}

#[test]
fn cache_write_lands_in_the_mapped_slots_and_storage_ops() {
    let (bs, heads, dim) = (4usize, 2usize, 64usize);
    let pool = storage(bs as u32, 16, 2, heads as u32, dim as u32, DType::F32);
    let kt = pool.kv_tensor(1, Kv::Value).unwrap();
    assert_eq!(kt.shape(), &[16, heads as i64, bs as i64, dim as i64]);
    assert_eq!(kt.dtype(), Some(DType::F32));

    let mut rng = Rng::new(5);
    let s = pool.create_seq().unwrap();
    pool.append(s, &rng.tokens(6)).unwrap();
    let mut batch = pool.prepare(&[s], &[6]).unwrap();
    let k: Vec<f32> = (0..6 * heads * dim).map(|_| rng.f32()).collect();
    let v: Vec<f32> = (0..6 * heads * dim).map(|_| rng.f32()).collect();
    batch
        .cache_write(
            1,
            &TensorView::new(&k, &[6, heads, dim]).unwrap(),
            &TensorView::new(&v, &[6, heads, dim]).unwrap(),
        )
        .unwrap();
    let slots = batch.slot_mapping().unwrap().to_vec();
    drop(batch);
    for (kind, src) in [(Kv::Key, &k), (Kv::Value, &v)] {
        for (t, &slot) in slots.iter().enumerate() {
            let (blk, off) = ((slot / bs as i64) as i32, slot as usize % bs);
            let data: Vec<f32> = pool.read_kv_block(1, kind, blk).unwrap();
            for h in 0..heads {
                let got = &data[(h * bs + off) * dim..][..dim];
                let want = &src[(t * heads + h) * dim..][..dim];
                assert_eq!(got, want, "{kind:?} token {t} head {h}");
            }
        }
    }

    // copy_blocks: block 2 of the table copied over a free block.
    let table = pool.block_table(s).unwrap();
    let spare = pool.create_seq().unwrap();
    pool.append(spare, &[0]).unwrap();
    let dst = pool.block_table(spare).unwrap()[0];
    pool.copy_blocks(&[table[0]], &[dst]).unwrap();
    for layer in 0..2 {
        for kind in [Kv::Key, Kv::Value] {
            assert_eq!(
                pool.read_kv_block::<f32>(layer, kind, dst).unwrap(),
                pool.read_kv_block::<f32>(layer, kind, table[0]).unwrap()
            );
        }
    }

    // swap_out then swap_in restores overwritten blocks.
    let bpb = pool.bytes_per_block().unwrap() as usize;
    let mut host = vec![0u8; 2 * bpb];
    pool.swap_out(&table, &mut host).unwrap();
    let before: Vec<f32> = pool.read_kv_block(1, Kv::Key, table[1]).unwrap();
    pool.copy_blocks(&[dst, dst], &table).unwrap();
    assert_ne!(
        pool.read_kv_block::<f32>(1, Kv::Key, table[1]).unwrap(),
        before
    );
    pool.swap_in(&table, &host).unwrap();
    assert_eq!(
        pool.read_kv_block::<f32>(1, Kv::Key, table[1]).unwrap(),
        before
    );
    // Layout [block][layer][K,V][head][slot][dim]: layer 1 K of block 1.
    let off = bpb + bpb / 2;
    let first = f32::from_ne_bytes(host[off..off + 4].try_into().unwrap());
    assert_eq!(first, before[0]);
    let st = pool.stats().unwrap();
    assert!(st.kv_bytes_used > 0 && st.kv_bytes_wasted > 0);
    pool.validate().unwrap();
}

#[test]
fn seq_ids_are_values() {
    let pool = manager(16, 8);
    let a = pool.create_seq().unwrap();
    let same = SeqId::from_raw(a.raw());
    assert_eq!(a, same);
    pool.append(same, &[1]).unwrap();
    assert_eq!(pool.seq_info(a).unwrap().num_tokens, 1);
    assert_ne!(a, SeqId::INVALID);
    let info = pool
        .seq_info(
            pool.create_seq_with(&SeqOptions {
                priority: -3,
                lora_id: 11,
                ..SeqOptions::default()
            })
            .unwrap(),
        )
        .unwrap();
    assert_eq!((info.priority, info.lora_id), (-3, 11));
    // Ids print as every pagedkv message prints them: "seq 0x" + 16 digits.
    let shown = format!("{a:?}");
    assert_eq!(shown, format!("seq 0x{:016x}", a.raw()));
    assert_eq!(shown, a.to_string());
}

#[test]
fn raw_strided_views_over_a_fused_qkv_buffer() {
    // Engines often have q, k and v interleaved in one projection output:
    // [rows][3][heads][dim]. Raw views with strides read them in place.
    let (bs, heads, dim, rows) = (8usize, 2usize, 64usize, 5usize);
    let pool = storage(bs as u32, 8, 1, heads as u32, dim as u32, DType::F32);
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2, 3, 4, 5]).unwrap();
    let mut rng = Rng::new(21);
    let qkv: Vec<f32> = (0..rows * 3 * heads * dim).map(|_| rng.f32()).collect();
    let row = (3 * heads * dim) as i64;
    let strides = [row, dim as i64, 1];
    let view = |part: usize| unsafe {
        TensorView::from_raw_parts(
            qkv.as_ptr().add(part * heads * dim).cast(),
            DType::F32,
            Device::Cpu,
            &[rows, heads, dim],
            Some(&strides),
        )
        .unwrap()
    };
    let mut batch = pool.prepare(&[s], &[rows as u32]).unwrap();
    batch.cache_write(0, &view(1), &view(2)).unwrap();
    let mut out_strided = vec![0f32; rows * heads * dim];
    batch
        .attention_forward(
            0,
            &view(0),
            &mut TensorViewMut::new(&mut out_strided, &[rows, heads, dim]).unwrap(),
            None,
            &AttentionParams::default(),
        )
        .unwrap();
    // Same result from dense copies.
    let dense = |part: usize| -> Vec<f32> {
        (0..rows)
            .flat_map(|r| qkv[r * 3 * heads * dim + part * heads * dim..][..heads * dim].to_vec())
            .collect()
    };
    let (q, k) = (dense(0), dense(1));
    let blk = pool.block_table(s).unwrap()[0];
    let stored: Vec<f32> = pool.read_kv_block(0, Kv::Key, blk).unwrap();
    for t in 0..rows {
        for h in 0..heads {
            assert_eq!(
                &stored[(h * bs + t) * dim..][..dim],
                &k[(t * heads + h) * dim..][..dim]
            );
        }
    }
    let mut out_dense = vec![0f32; rows * heads * dim];
    batch
        .attention_forward(
            0,
            &TensorView::new(&q, &[rows, heads, dim]).unwrap(),
            &mut TensorViewMut::new(&mut out_dense, &[rows, heads, dim]).unwrap(),
            None,
            &AttentionParams::default(),
        )
        .unwrap();
    assert_eq!(out_strided, out_dense);
}

/// Issue 14: with vLLM's encoding (the default) an unsalted request whose
/// LoRA name equals a salt shares the salted first block; strict mode keeps
/// the domains apart, and hash_prefix follows the mode.
#[test]
fn strict_key_domains_separate_salts_from_item_hashes() {
    let prompt: Vec<i32> = (0..9).map(|i| 100 + i).collect();
    let salted = SeqOptions {
        cache_salt: Some("tenant-a-salt".into()),
        ..SeqOptions::default()
    };
    // An adapter name reads like the salt in the first block (the name keys
    // every block, the salt only the first).
    let aimed = SeqOptions {
        lora_name: Some("tenant-a-salt".into()),
        ..SeqOptions::default()
    };
    for strict in [false, true] {
        let pool = Pool::new(&PoolOptions {
            block_size: 4,
            num_blocks: 16,
            strict_key_domains: strict,
            ..PoolOptions::default()
        })
        .unwrap();
        let holder = pool.create_seq_with(&salted).unwrap();
        pool.append(holder, &prompt[..8]).unwrap();
        pool.prepare(&[holder], &[8]).unwrap().commit().unwrap(); // its step ran
        let probe = pool.create_seq_with(&aimed).unwrap();
        let hit = pool.match_prefix(probe, &prompt).unwrap();
        assert_eq!(hit, if strict { 0 } else { 4 }, "strict {strict}");
        let lib = hash_prefix(
            &HashOptions {
                block_size: 4,
                cache_salt: salted.cache_salt.clone(),
                strict_key_domains: strict,
                ..HashOptions::default()
            },
            &prompt[..8],
        )
        .unwrap();
        assert_eq!(lib, pool.block_hashes(holder).unwrap(), "strict {strict}");
        assert_eq!(pool.options().unwrap().strict_key_domains, strict);
    }
}

/// vLLM 0.33's tagged keys (`vllm_tagged_keys`): the pool reports the mode,
/// its block hashes are hash_prefix's with the same mode and LoRA name and
/// path, the path keys blocks there only, and an adapter name never reads
/// like a salt. Setting it with strict_key_domains is refused.
#[test]
fn vllm_tagged_keys_key_the_lora_path() {
    let prompt: Vec<i32> = (0..9).map(|i| 300 + i).collect();
    let lora = |path: &str| SeqOptions {
        lora_name: Some("sql".into()),
        lora_path: Some(path.into()),
        ..SeqOptions::default()
    };
    let new_pool = |tagged: bool| {
        Pool::new(&PoolOptions {
            block_size: 4,
            num_blocks: 16,
            vllm_tagged_keys: tagged,
            ..PoolOptions::default()
        })
        .unwrap()
    };
    for tagged in [false, true] {
        let pool = new_pool(tagged);
        let got = pool.options().unwrap();
        assert_eq!(got.vllm_tagged_keys, tagged);
        assert!(!got.strict_key_domains);
        let holder = pool.create_seq_with(&lora("/adapters/sql-v1")).unwrap();
        pool.append(holder, &prompt[..8]).unwrap();
        step(&pool, holder, 8);
        let lib = |path: &str, tagged_hash: bool| {
            hash_prefix(
                &HashOptions {
                    block_size: 4,
                    lora_name: Some("sql".into()),
                    lora_path: Some(path.into()),
                    vllm_tagged_keys: tagged_hash,
                    ..HashOptions::default()
                },
                &prompt[..8],
            )
            .unwrap()
        };
        let own = pool.block_hashes(holder).unwrap();
        assert_eq!(own.len(), 2);
        assert_eq!(lib("/adapters/sql-v1", tagged), own, "tagged {tagged}");
        // The name pointed at another adapter: other hashes (and no hit)
        // on a tagged pool only.
        let moved = lib("/adapters/sql-v2", tagged);
        assert_eq!(moved == own, !tagged, "tagged {tagged}");
        let probe = pool.create_seq_with(&lora("/adapters/sql-v2")).unwrap();
        let hit = pool.match_prefix(probe, &prompt).unwrap();
        assert_eq!(hit, if tagged { 0 } else { 8 }, "tagged {tagged}");
        // The tagged format differs from the untagged one for a LoRA.
        assert_ne!(lib("/adapters/sql-v1", !tagged), own, "tagged {tagged}");
    }

    // A salted request's first block is not hit by an unsalted request whose
    // LoRA name equals the salt (the default encoding lets it: see
    // strict_key_domains_separate_salts_from_item_hashes).
    let pool = new_pool(true);
    let salted = SeqOptions {
        cache_salt: Some("tenant-a-salt".into()),
        ..SeqOptions::default()
    };
    let holder = pool.create_seq_with(&salted).unwrap();
    pool.append(holder, &prompt[..8]).unwrap();
    step(&pool, holder, 8);
    let aimed = pool
        .create_seq_with(&SeqOptions {
            lora_name: Some("tenant-a-salt".into()),
            ..SeqOptions::default()
        })
        .unwrap();
    assert_eq!(pool.match_prefix(aimed, &prompt).unwrap(), 0);
    let again = pool.create_seq_with(&salted).unwrap();
    assert_eq!(pool.match_prefix(again, &prompt).unwrap(), 8);
    let salted_lib = hash_prefix(
        &HashOptions {
            block_size: 4,
            cache_salt: salted.cache_salt.clone(),
            vllm_tagged_keys: true,
            ..HashOptions::default()
        },
        &prompt[..8],
    )
    .unwrap();
    assert_eq!(salted_lib, pool.block_hashes(holder).unwrap());

    // Both modes at once is an error, not one silently winning.
    let both = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 16,
        strict_key_domains: true,
        vllm_tagged_keys: true,
        ..PoolOptions::default()
    });
    let e = both.err().expect("strict and tagged pool");
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("vllm_tagged_keys"), "{e}");
    let e = hash_prefix(
        &HashOptions {
            block_size: 4,
            strict_key_domains: true,
            vllm_tagged_keys: true,
            ..HashOptions::default()
        },
        &prompt,
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("vllm_tagged_keys"), "{e}");
    // lora_path is checked for NUL bytes like lora_name.
    let e = pool.create_seq_with(&lora("/a\0b")).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("lora_path"), "{e}");
    let e = hash_prefix(
        &HashOptions {
            block_size: 4,
            lora_path: Some("a\0".into()),
            ..HashOptions::default()
        },
        &prompt,
    )
    .unwrap_err();
    assert!(e.message().contains("lora_path"), "{e}");
}
