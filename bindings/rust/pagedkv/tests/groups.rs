//! Multi-group pools through the safe crate.

use pagedkv::{
    ErrorKind, GroupSpec, PlanArray, Pool, PoolOptions, SnapshotArray, Stream, NULL_BLOCK,
};

fn opts(num_blocks: u64) -> PoolOptions {
    PoolOptions {
        block_size: 4,
        num_blocks,
        ..PoolOptions::default()
    }
}

#[test]
fn window_and_full_groups_share_one_budget() {
    let pool = Pool::with_groups(
        &opts(64),
        &[GroupSpec::window(8, 2, 2, 8), GroupSpec::full(2, 2, 8)],
    )
    .unwrap();
    assert_eq!(pool.num_groups().unwrap(), 2);
    let s = pool.create_seq().unwrap();
    let tokens: Vec<i32> = (100..121).collect();
    pool.append(s, &tokens[..20]).unwrap();
    pool.append(s, &tokens[20..]).unwrap();
    let win = pool.group_block_table(s, 0).unwrap();
    let full = pool.group_block_table(s, 1).unwrap();
    assert_eq!(&win[..3], &[NULL_BLOCK; 3]);
    assert!(win[3..].iter().all(|&b| b != NULL_BLOCK));
    assert_eq!(full.len(), 6);
    assert!(full.iter().all(|&b| b != NULL_BLOCK && !win.contains(&b)));
    assert_eq!(pool.group_stats(0).unwrap().num_null_entries, 3);
    assert_eq!(pool.group_stats(1).unwrap().num_used_blocks, 6);
    // A second request with the same prompt hits every group.
    let t = pool.create_seq().unwrap();
    assert_eq!(pool.match_prefix(t, &tokens).unwrap(), 20);
    assert_eq!(pool.group_block_table(t, 1).unwrap(), full[..5].to_vec());
    pool.validate().unwrap();
    // Fork then write: one copy per group.
    let c = pool.fork(s).unwrap();
    pool.append(c, &[1]).unwrap();
    for g in 0..2 {
        let copies = pool.take_copies(g).unwrap();
        assert_eq!(copies.len(), 1);
        assert_eq!(copies[0].0, pool.group_block_table(s, g).unwrap()[5]);
        assert_eq!(copies[0].1, pool.group_block_table(c, g).unwrap()[5]);
    }
    assert_eq!(pool.bytes_per_block().unwrap(), 2 * 2 * 2 * 8 * 2 * 4);
}

#[test]
fn group_errors() {
    let e = Pool::with_groups(&opts(8), &[GroupSpec::window(0, 1, 1, 8)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(
        e.message().contains("groups[0].kind.window"),
        "{}",
        e.message()
    );
    let e = Pool::with_groups(&opts(8), &[GroupSpec::recurrent(1, 0)]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("state_bytes"), "{}", e.message());
    let pool = Pool::with_groups(&opts(8), &[GroupSpec::mla(2, 16, 4)]).unwrap();
    assert_eq!(
        pool.group_stats(1).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let single = Pool::new(&opts(8)).unwrap();
    assert_eq!(single.num_groups().unwrap(), 1);
    assert_eq!(
        single.group_stats(0).unwrap_err().kind(),
        ErrorKind::Unsupported
    );
}

#[test]
fn recurrent_state_resumes_from_a_snapshot() {
    let pool = Pool::with_groups(
        &opts(32),
        &[GroupSpec::full(1, 2, 8), GroupSpec::recurrent(7, 4096)],
    )
    .unwrap();
    let a = pool.create_seq().unwrap();
    let tokens: Vec<i32> = (0..10).collect();
    pool.append(a, &tokens[..8]).unwrap();
    let slot = pool.group_block_table(a, 1).unwrap()[0];
    pool.append(a, &tokens[8..9]).unwrap();
    let moved = pool.group_block_table(a, 1).unwrap()[0];
    assert_eq!(pool.take_copies(1).unwrap(), vec![(slot, moved)]);
    let b = pool.create_seq().unwrap();
    assert_eq!(pool.match_prefix(b, &tokens).unwrap(), 8);
    pool.append(b, &tokens[8..]).unwrap();
    let mine = pool.group_block_table(b, 1).unwrap()[0];
    assert_eq!(pool.take_copies(1).unwrap(), vec![(slot, mine)]);
    assert_eq!(
        pool.truncate(a, 4).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    pool.validate().unwrap();
}

#[test]
fn step_plans_have_per_group_arrays() {
    let pool = Pool::with_groups(
        &opts(64),
        &[GroupSpec::window(8, 2, 2, 8), GroupSpec::full(2, 2, 8)],
    )
    .unwrap();
    let s = pool.create_seq().unwrap();
    let tokens: Vec<i32> = (100..120).collect();
    pool.append(s, &tokens).unwrap();
    let plan = pool.prepare(&[s], &[20]).unwrap();
    assert_eq!(pool.seq_info(s).unwrap().num_computed_tokens, 0);
    for g in 0..2 {
        let table = pool.group_block_table(s, g).unwrap();
        assert_eq!(
            plan.plan_group_i32(g, PlanArray::PageIndices).unwrap(),
            &table[..]
        );
        let want: Vec<i64> = (0..20)
            .map(|p| table[p / 4] as i64 * 4 + (p % 4) as i64)
            .collect();
        assert_eq!(plan.group_slot_mapping(g).unwrap(), &want[..]);
    }
    assert_eq!(
        plan.plan_group_tensor(2, PlanArray::PageIndices)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    plan.commit().unwrap();
    assert_eq!(pool.seq_info(s).unwrap().num_computed_tokens, 20);
    pool.validate().unwrap();
}

#[test]
fn layer_ids_map_model_layers_to_groups() {
    // A gpt-oss-like interleave, the even layers listed out of order.
    let even = vec![4u32, 0, 6, 2];
    let odd = vec![1u32, 3, 5, 7];
    let pool = Pool::with_groups(
        &opts(16),
        &[
            GroupSpec::window(8, 4, 1, 8).with_layer_ids(even.clone()),
            GroupSpec::full(4, 1, 8).with_layer_ids(odd.clone()),
        ],
    )
    .unwrap();
    for layer in 0..8u32 {
        let ids = if layer % 2 == 0 { &even } else { &odd };
        let index = ids.iter().position(|&l| l == layer).unwrap() as u32;
        assert_eq!(
            pool.group_of_layer(layer).unwrap(),
            Some((layer % 2, index))
        );
    }
    assert_eq!(pool.group_of_layer(8).unwrap(), None);
    // Without ids: numbered through the groups in order.
    let plain = Pool::with_groups(
        &opts(16),
        &[GroupSpec::window(8, 3, 1, 8), GroupSpec::full(2, 1, 8)],
    )
    .unwrap();
    let got: Vec<_> = (0..5)
        .map(|l| plain.group_of_layer(l).unwrap().unwrap())
        .collect();
    assert_eq!(got, vec![(0, 0), (0, 1), (0, 2), (1, 0), (1, 1)]);
    // A short list never reaches the library; a layer twice is refused.
    let e = Pool::with_groups(
        &opts(8),
        &[GroupSpec::full(2, 1, 8).with_layer_ids(vec![0])],
    )
    .unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.message().contains("not num_layers 2"), "{}", e.message());
    let e = Pool::with_groups(
        &opts(8),
        &[
            GroupSpec::full(1, 1, 8).with_layer_ids(vec![3]),
            GroupSpec::full(1, 1, 8).with_layer_ids(vec![3]),
        ],
    )
    .unwrap_err();
    assert!(e.message().contains("is also groups[0]"), "{}", e.message());
}

#[test]
fn persistent_plans_pad_every_group() {
    // prepare_persistent_on on a multi-group pool: each group's page table
    // is padded rows of its own stride (a recurrent group's: one page),
    // equal to the group's block table, kept and updated across steps.
    let pool = Pool::with_groups(
        &opts(96),
        &[
            GroupSpec::window(5, 1, 1, 8),
            GroupSpec::full(1, 1, 8),
            GroupSpec::recurrent(1, 64),
        ],
    )
    .unwrap();
    let seqs: Vec<_> = (0..3).map(|_| pool.create_seq().unwrap()).collect();
    let mut next = 7i32;
    let mut tok = |k: usize| -> Vec<i32> {
        (0..k)
            .map(|_| {
                next = (next * 31 + 11) % 997;
                next
            })
            .collect()
    };
    for (i, &s) in seqs.iter().enumerate() {
        pool.append(s, &tok(3 + 4 * i)).unwrap();
    }
    let all: Vec<u32> = seqs
        .iter()
        .map(|&s| pool.seq_info(s).unwrap().num_tokens as u32)
        .collect();
    pool.prepare(&seqs, &all).unwrap().commit().unwrap();
    for step in 0..10usize {
        for (i, &s) in seqs.iter().enumerate() {
            pool.append(s, &tok(if (step + i) % 4 == 0 { 3 } else { 1 }))
                .unwrap();
        }
        let mut order = seqs.clone();
        order.rotate_left(step % 3);
        let q: Vec<u32> = order
            .iter()
            .map(|&s| {
                let info = pool.seq_info(s).unwrap();
                (info.num_tokens - info.num_computed_tokens) as u32
            })
            .collect();
        let plan = pool
            .prepare_persistent_on(&order, &q, Stream::DEFAULT)
            .unwrap();
        for g in 0..3u32 {
            let indptr = plan.plan_group_i32(g, PlanArray::PageIndptr).unwrap();
            let stride = indptr[1] as usize;
            let want_ptr: Vec<i32> = (0..=order.len()).map(|i| (i * stride) as i32).collect();
            assert_eq!(indptr, &want_ptr[..]);
            if g == 2 {
                assert_eq!(stride, 1);
            }
            let pages = plan.plan_group_i32(g, PlanArray::PageIndices).unwrap();
            assert_eq!(pages.len(), order.len() * stride);
            for (i, &s) in order.iter().enumerate() {
                let table = pool.group_block_table(s, g).unwrap();
                let n = pool.seq_info(s).unwrap().num_tokens as usize;
                let mut want = if g == 2 {
                    table[..1].to_vec()
                } else {
                    table[..(n + 3) / 4].to_vec()
                };
                want.resize(stride, NULL_BLOCK);
                assert_eq!(
                    &pages[i * stride..(i + 1) * stride],
                    &want[..],
                    "group {g} row {i}"
                );
            }
        }
        for g in 0..3 {
            pool.take_copies(g).unwrap();
        }
        plan.commit().unwrap();
    }
    assert_eq!(pool.group_block_table(seqs[2], 0).unwrap()[0], NULL_BLOCK);
    pool.validate().unwrap();
}

#[test]
fn recurrent_snapshots_at_every_block_boundary_of_a_chunk() {
    // Jamba-like with the flag: one prefill chunk of 5 blocks + 2 tokens names
    // a snapshot slot per boundary; the engine writes its state there and a
    // later prompt sharing 3 blocks and a bit resumes from the one at 12.
    let pool = Pool::with_groups(
        &opts(64),
        &[
            GroupSpec::full(1, 2, 8),
            GroupSpec::recurrent(2, 64).with_snapshot_every_block(),
        ],
    )
    .unwrap();
    let mut x = 0x9E37_79B9u32;
    let mut rnd = move || {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        x
    };
    let prompt: Vec<i32> = (0..22).map(|_| (rnd() % 50000) as i32).collect();
    let a = pool.create_seq().unwrap();
    pool.append(a, &prompt).unwrap();
    let mut storage = std::collections::HashMap::new(); // engine-owned state, by block id
    let plan = pool.prepare(&[a], &[22]).unwrap();
    assert_eq!(
        plan.group_snapshot_i32(1, SnapshotArray::Indptr).unwrap(),
        &[0, 5]
    );
    let rows = plan.group_snapshot_rows(1).unwrap().to_vec();
    let blocks = plan
        .group_snapshot_i32(1, SnapshotArray::Blocks)
        .unwrap()
        .to_vec();
    assert_eq!(rows, vec![3, 7, 11, 15, 19]);
    for (&row, &block) in rows.iter().zip(&blocks) {
        storage.insert(block, (rnd(), row));
    }
    assert_eq!(
        plan.group_snapshot_tensor(0, SnapshotArray::Indptr)
            .unwrap_err()
            .kind(),
        ErrorKind::InvalidArgument
    );
    plan.commit().unwrap();
    assert_eq!(pool.group_stats(1).unwrap().num_cached_blocks, 5);
    let b = pool.create_seq().unwrap();
    let mut other = prompt[..14].to_vec();
    other.extend([50001, 50002]);
    assert_eq!(pool.match_prefix(b, &other).unwrap(), 12);
    pool.append(b, &other[12..]).unwrap();
    let mine = pool.group_block_table(b, 1).unwrap()[0];
    let copies = pool.take_copies(1).unwrap();
    assert_eq!(copies.len(), 1);
    assert_eq!(copies[0].1, mine);
    assert_eq!(storage[&copies[0].0].1, 11); // the state after token 11, as written
    pool.validate().unwrap();
}

#[test]
fn reserve_acts_on_every_group_and_changes_nothing_seen() {
    // Twin window + full pools, one sequence reserved: a prefill and decode
    // steps that slide the window leave the same tables, infos and stats
    // (block hashes are not readable on a multi-group pool).
    let make = || {
        Pool::with_groups(
            &opts(32),
            &[GroupSpec::window(8, 2, 2, 8), GroupSpec::full(2, 2, 8)],
        )
        .unwrap()
    };
    let pools = [make(), make()];
    let seqs: Vec<_> = pools.iter().map(|p| p.sequence().unwrap()).collect();
    let seen = |i: usize| {
        let (p, s) = (&pools[i], seqs[i].id());
        (
            p.seq_info(s).unwrap(),
            p.group_block_table(s, 0).unwrap(),
            p.group_block_table(s, 1).unwrap(),
            p.stats().unwrap(),
        )
    };
    let before = seen(1);
    seqs[1].reserve(10 + 30).unwrap();
    assert_eq!(seen(1), before);
    for step in 0..=30i32 {
        let n = if step == 0 { 10 } else { 1 };
        for (p, s) in pools.iter().zip(&seqs) {
            s.append(&(step..step + n).collect::<Vec<_>>()).unwrap();
            p.prepare(&[s.id()], &[n as u32]).unwrap().commit().unwrap();
        }
        assert_eq!(seen(0), seen(1), "step {step}");
    }
    assert_eq!(seen(1).1[0], NULL_BLOCK, "the window slid");
    assert_eq!(
        seqs[1].reserve(1 << 31).unwrap_err().kind(),
        ErrorKind::InvalidArgument
    );
    let id = seqs[1].id();
    pools[1].free_seq(id).unwrap();
    assert_eq!(
        pools[1].reserve(id, 8).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    for p in &pools {
        p.validate().unwrap();
    }
}

/// `with_groups` hands the library every base option it reads or refuses:
/// strict_key_domains changes the block hashes (was dropped: the pool
/// hashed in vLLM-compatible domains, where a LoRA name equal to another
/// request's cache salt hits its first block, and `options()` said false), and events, partial reuse and retention are Unsupported (were
/// silently ignored).
#[test]
fn with_groups_keeps_strict_key_domains_and_refuses_unsupported_options() {
    use pagedkv::{hash_prefix, HashOptions, SeqOptions};
    let tokens: Vec<i32> = (0..9).collect();
    let salted = SeqOptions {
        cache_salt: Some("X".into()),
        ..SeqOptions::default()
    };
    let lora = SeqOptions {
        lora_name: Some("X".into()),
        ..SeqOptions::default()
    };
    let hashes = |o: &SeqOptions, strict_key_domains| {
        hash_prefix(
            &HashOptions {
                block_size: 4,
                cache_salt: o.cache_salt.clone(),
                lora_name: o.lora_name.clone(),
                strict_key_domains,
                ..HashOptions::default()
            },
            &tokens,
        )
        .unwrap()
    };
    // The premise: the salt and the LoRA name give one first-block hash
    // only without strict key domains.
    assert_eq!(hashes(&salted, false)[0], hashes(&lora, false)[0]);
    assert_ne!(hashes(&salted, true)[0], hashes(&lora, true)[0]);
    for strict_key_domains in [false, true] {
        let o = PoolOptions {
            strict_key_domains,
            ..opts(32)
        };
        let p = Pool::with_groups(&o, &[GroupSpec::full(1, 1, 8)]).unwrap();
        assert_eq!(p.options().unwrap().strict_key_domains, strict_key_domains);
        let a = p.create_seq_with(&salted).unwrap();
        p.append(a, &tokens).unwrap(); // manager calls alone: cached now
        let b = p.create_seq_with(&lora).unwrap();
        let hit = p.match_prefix(b, &tokens).unwrap();
        assert_eq!(hit, if strict_key_domains { 0 } else { 4 });
    }

    for o in [
        PoolOptions {
            enable_events: true,
            ..opts(32)
        },
        PoolOptions {
            enable_partial_reuse: true,
            ..opts(32)
        },
        PoolOptions {
            enable_retention: true,
            ..opts(32)
        },
    ] {
        let e = Pool::with_groups(&o, &[GroupSpec::full(1, 1, 8)]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::Unsupported, "{e}");
    }
}

#[test]
fn snapshot_arrays_of_a_single_group_plan_name_the_group() {
    // A single-group plan has no recurrent group: asking it for a snapshot
    // array was answered "which 16 is not a PKV_PLAN_* array (0..5)", as if
    // SnapshotArray::Indptr were no array at all, where a multi-group plan
    // names the group that is not recurrent.
    let pool = Pool::new(&opts(16)).unwrap();
    let s = pool.create_seq().unwrap();
    pool.append(s, &[1, 2, 3, 4, 5]).unwrap();
    let plan = pool.prepare(&[s], &[5]).unwrap();
    for which in [
        SnapshotArray::Indptr,
        SnapshotArray::Rows,
        SnapshotArray::Blocks,
    ] {
        let e = plan.group_snapshot_tensor(0, which).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(
            e.message().contains("group 0 is not PKV_GROUP_RECURRENT"),
            "{which:?}: {}",
            e.message()
        );
    }
    let e = plan
        .group_snapshot_i32(0, SnapshotArray::Blocks)
        .unwrap_err();
    assert!(
        e.message().contains("not PKV_GROUP_RECURRENT"),
        "{}",
        e.message()
    );
    let e = plan.group_snapshot_rows(0).unwrap_err();
    assert!(
        e.message().contains("not PKV_GROUP_RECURRENT"),
        "{}",
        e.message()
    );
    // The multi-group answer, for comparison.
    let gp = Pool::with_groups(&opts(16), &[GroupSpec::full(1, 1, 8)]).unwrap();
    let gs = gp.create_seq().unwrap();
    gp.append(gs, &[1, 2]).unwrap();
    let gplan = gp.prepare(&[gs], &[2]).unwrap();
    let e = gplan.group_snapshot_rows(0).unwrap_err();
    assert!(
        e.message().contains("not PKV_GROUP_RECURRENT"),
        "{}",
        e.message()
    );
    // The plan arrays are still there.
    assert_eq!(
        plan.plan_group_i32(0, PlanArray::ContextLens).unwrap(),
        &[5]
    );
}
