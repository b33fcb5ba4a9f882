//! Offload tiers (issue 20): evicted blocks come back from the host and
//! file tiers byte for byte.

use pagedkv::{
    DType, ErrorKind, Medium, Pool, PoolOptions, SeqOptions, TensorView, TierMatch, TierOptions,
};

fn step(pool: &Pool, s: pagedkv::SeqId, n: usize, seed: f32) {
    let mut b = pool.prepare(&[s], &[n as u32]).unwrap();
    let k: Vec<f32> = (0..n * 8).map(|i| seed + i as f32 * 0.37).collect();
    let v: Vec<f32> = k.iter().map(|x| -x).collect();
    let kt = TensorView::new(&k, &[n, 1, 8]).unwrap();
    let vt = TensorView::new(&v, &[n, 1, 8]).unwrap();
    b.cache_write(0, &kt, &vt).unwrap();
}

#[test]
fn evicted_blocks_come_back_from_host_and_file_tiers() {
    let pool = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 6,
        num_layers: 1,
        num_kv_heads: 1,
        head_dim: 8,
        dtype: DType::F32,
        num_threads: 1,
        ..PoolOptions::default()
    })
    .unwrap();
    let bpb = pool.bytes_per_block().unwrap();
    let dir = std::env::temp_dir();
    pool.attach_tiers(&TierOptions {
        host_bytes: 3 * bpb,
        file_dir: Some(dir.to_string_lossy().into_owned()),
        file_bytes: 2 * bpb,
    })
    .unwrap();
    let again = pool.attach_tiers(&TierOptions {
        host_bytes: bpb,
        ..TierOptions::default()
    });
    assert_eq!(again.unwrap_err().kind(), ErrorKind::InvalidState);

    let tokens: Vec<i32> = (0..17).collect();
    let a = pool.create_seq().unwrap();
    pool.append(a, &tokens).unwrap();
    step(&pool, a, 17, 1.5);
    let table = pool.block_table(a).unwrap();
    let mut saved = vec![0u8; 4 * bpb as usize];
    pool.swap_out(&table[..4], &mut saved).unwrap();
    pool.free_seq(a).unwrap();
    let other = pool.create_seq().unwrap();
    let more: Vec<i32> = (1000..1020).collect();
    pool.append(other, &more).unwrap();
    step(&pool, other, 20, -7.0);
    pool.free_seq(other).unwrap();
    pool.flush_tiers().unwrap();
    let host = pool.tier_stats(Medium::Host).unwrap();
    let file = pool.tier_stats(Medium::File).unwrap();
    assert_eq!(
        (host.num_stored, host.num_blocks, file.num_stored),
        (4, 3, 1)
    );

    let c = pool.sequence().unwrap();
    let m = c.match_prefix_tiered(&tokens).unwrap();
    assert_eq!(
        m,
        TierMatch {
            num_cached: 16,
            device_tokens: 0,
            host_tokens: 12,
            file_tokens: 4
        }
    );
    pool.flush_tiers().unwrap(); // runs the loads
    let mut got = vec![0u8; 4 * bpb as usize];
    pool.swap_out(&c.block_table().unwrap()[..4], &mut got)
        .unwrap();
    assert_eq!(got, saved);
    assert_eq!(c.info().unwrap().num_computed_tokens, 16);
    assert_eq!(pool.tier_stats(Medium::Host).unwrap().num_loaded, 3);
    assert_eq!(pool.tier_stats(Medium::File).unwrap().num_loaded, 1);
    pool.validate().unwrap();
}

#[test]
fn a_manager_only_pool_has_no_tiers() {
    let pool = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 8,
        ..PoolOptions::default()
    })
    .unwrap();
    let e = pool.attach_tiers(&TierOptions {
        host_bytes: 1 << 20,
        ..TierOptions::default()
    });
    assert_eq!(e.unwrap_err().kind(), ErrorKind::InvalidState);
    assert_eq!(
        pool.tier_stats(Medium::Host).unwrap_err().kind(),
        ErrorKind::InvalidState
    );
}

#[test]
fn admit_tiered_and_hash_lookup_load_from_both_tiers() {
    let pool = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 6,
        num_layers: 1,
        num_kv_heads: 1,
        head_dim: 8,
        dtype: DType::F32,
        num_threads: 1,
        ..PoolOptions::default()
    })
    .unwrap();
    let bpb = pool.bytes_per_block().unwrap();
    let dir = std::env::temp_dir();
    pool.attach_tiers(&TierOptions {
        host_bytes: 3 * bpb,
        file_dir: Some(dir.to_string_lossy().into_owned()),
        file_bytes: 2 * bpb,
    })
    .unwrap();
    let tokens: Vec<i32> = (0..17).map(|i| 11 * i + 4).collect();
    let a = pool.create_seq().unwrap();
    pool.append(a, &tokens).unwrap();
    step(&pool, a, 17, 2.25);
    let hashes = pool.block_hashes(a).unwrap();
    let table = pool.block_table(a).unwrap();
    let mut saved = vec![0u8; 4 * bpb as usize];
    pool.swap_out(&table[..4], &mut saved).unwrap();
    pool.free_seq(a).unwrap();
    let other = pool.create_seq().unwrap();
    let more: Vec<i32> = (1000..1020).collect();
    pool.append(other, &more).unwrap(); // evicts a's blocks (other stays unwritten)
    pool.free_seq(other).unwrap();
    pool.flush_tiers().unwrap();

    // Another tenant's salt: no hit; its sequence with our hashes: refused.
    let salted = SeqOptions {
        cache_salt: Some("tenant-b".into()),
        ..SeqOptions::default()
    };
    let (s, m) = pool.admit_tiered(&salted, &tokens, None, 0).unwrap();
    assert_eq!(m.num_cached, 0);
    pool.free_seq(s).unwrap();
    let e = pool.admit_tiered(&salted, &tokens, Some(&hashes), 0);
    assert_eq!(e.unwrap_err().kind(), ErrorKind::InvalidArgument);
    let e = pool.admit_tiered(&SeqOptions::default(), &tokens, None, 8);
    assert_eq!(e.unwrap_err().kind(), ErrorKind::OutOfBlocks);

    let (c, m) = pool
        .admit_tiered(&SeqOptions::default(), &tokens, Some(&hashes), 0)
        .unwrap();
    assert_eq!(
        m,
        TierMatch {
            num_cached: 16,
            device_tokens: 0,
            host_tokens: 12,
            file_tokens: 4
        }
    );
    pool.flush_tiers().unwrap(); // runs the loads
    let mut got = vec![0u8; 4 * bpb as usize];
    pool.swap_out(&pool.block_table(c).unwrap()[..4], &mut got)
        .unwrap();
    assert_eq!(got, saved);
    assert_eq!(pool.seq_info(c).unwrap().num_computed_tokens, 16);
    pool.free_seq(c).unwrap();

    // The loaded blocks are device hits now, through the hash lookup too.
    let d = pool.sequence().unwrap();
    let m = d.match_prefix_hashes_tiered(&tokens, &hashes).unwrap();
    assert_eq!((m.num_cached, m.device_tokens), (16, 16));
    assert_eq!(pool.tier_stats(Medium::File).unwrap().num_loaded, 1);
    pool.validate().unwrap();
}

#[test]
fn a_file_tier_alone_takes_blocks_in_one_pass() {
    let pool = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 6,
        num_layers: 1,
        num_kv_heads: 1,
        head_dim: 8,
        dtype: DType::F32,
        num_threads: 1,
        ..PoolOptions::default()
    })
    .unwrap();
    let bpb = pool.bytes_per_block().unwrap();
    // host_bytes 0 with a file tier: no host tier.
    pool.attach_tiers(&TierOptions {
        host_bytes: 0,
        file_dir: Some(std::env::temp_dir().to_string_lossy().into_owned()),
        file_bytes: 4 * bpb,
    })
    .unwrap();
    let tokens: Vec<i32> = (0..17).map(|i| 3 * i + 1).collect();
    let a = pool.create_seq().unwrap();
    pool.append(a, &tokens).unwrap();
    step(&pool, a, 17, -3.5);
    let mut saved = vec![0u8; 4 * bpb as usize];
    pool.swap_out(&pool.block_table(a).unwrap()[..4], &mut saved)
        .unwrap();
    pool.free_seq(a).unwrap();
    let other = pool.create_seq().unwrap();
    pool.append(other, &(2000..2020).collect::<Vec<i32>>())
        .unwrap();
    pool.free_seq(other).unwrap();
    pool.flush_tiers().unwrap();
    assert_eq!(
        pool.tier_stats(Medium::Host).unwrap_err().kind(),
        ErrorKind::InvalidState
    );
    assert_eq!(pool.tier_stats(Medium::File).unwrap().num_stored, 4);
    let (c, m) = pool
        .admit_tiered(&SeqOptions::default(), &tokens, None, 0)
        .unwrap();
    assert_eq!((m.host_tokens, m.file_tokens), (0, 16));
    pool.flush_tiers().unwrap();
    let mut got = vec![0u8; 4 * bpb as usize];
    pool.swap_out(&pool.block_table(c).unwrap()[..4], &mut got)
        .unwrap();
    assert_eq!(got, saved);
    pool.validate().unwrap();
}
