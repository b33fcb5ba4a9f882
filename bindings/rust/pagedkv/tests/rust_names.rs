//! Errors name the Rust API's methods, arguments and fields (`Pool::prepare:
//! seqs.len() is 0`), not the C ABI's (`pkv_batch_prepare: num_seqs is 0`);
//! `Error::c_message` keeps the library's text.

mod common;

use common::{manager, storage};
use pagedkv::*;

struct Case {
    what: &'static str,
    err: Error,
    /// Must appear in the message.
    rust: &'static [&'static str],
    /// Must not appear in the message (as a word: `max_num_seqs` does not
    /// contain the word `num_seqs`).
    c: &'static [&'static str],
    /// The rest of the message, the same in both texts.
    keep: &'static [&'static str],
}

fn has_word(msg: &str, word: &str) -> bool {
    let ident = |c: char| c.is_ascii_alphanumeric() || c == '_';
    msg.match_indices(word).any(|(i, _)| {
        let before = msg[..i].chars().next_back();
        let after = msg[i + word.len()..].chars().next();
        !before.is_some_and(ident) && !after.is_some_and(ident)
    })
}

fn fp8_pool(scales: Vec<f32>) -> Result<Pool> {
    Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 8,
        num_layers: 2,
        num_kv_heads: 1,
        head_dim: 8,
        dtype: DType::Fp8E4m3,
        k_scales: scales.clone(),
        v_scales: scales,
        ..PoolOptions::default()
    })
}

fn mla_pool() -> Pool {
    Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 8,
        num_layers: 1,
        dtype: DType::F32,
        kv_layout: KvLayout::Mla,
        kv_lora_rank: 8,
        qk_rope_head_dim: 4,
        ..PoolOptions::default()
    })
    .unwrap()
}

fn cases() -> Vec<Case> {
    let mgr = manager(4, 16);
    let pool = storage(4, 16, 1, 1, 8, DType::F32);
    let fp8 = fp8_pool(vec![]).unwrap();
    let seq = pool.create_seq().unwrap();
    pool.append(seq, &[1, 2, 3, 4, 5]).unwrap();
    let stale = mgr.create_seq().unwrap();
    mgr.free_seq(stale).unwrap();
    let live = mgr.create_seq().unwrap();
    let per_block = pool.bytes_per_block().unwrap() as usize;
    let blocks = pool.block_table(seq).unwrap();
    let mut short = vec![0u8; per_block - 1];
    let e = |r: Result<()>| r.unwrap_err();
    let eb = |r: Result<Batch>| r.err().expect("an error");
    let ep = |r: Result<Pool>| r.err().expect("an error");
    vec![
        Case {
            what: "prepare(&[], &[])",
            err: eb(mgr.prepare(&[], &[])),
            rust: &["Pool::prepare: ", "seqs.len()"],
            c: &["num_seqs", "pkv_batch_prepare"],
            keep: &[" is 0"],
        },
        Case {
            what: "prepare_persistent_on(&[], &[])",
            err: eb(mgr.prepare_persistent_on(&[], &[], Stream::DEFAULT)),
            rust: &["Pool::prepare: ", "seqs.len()"],
            c: &["num_seqs", "pkv_batch_prepare_ex"],
            keep: &[" is 0"],
        },
        Case {
            what: "prepare_decode(&[], &[])",
            err: eb(mgr.prepare_decode(&[], &[])),
            rust: &["Pool::prepare_decode: ", "seqs.len()"],
            c: &["num_seqs", "pkv_batch_prepare_decode"],
            keep: &[],
        },
        Case {
            what: "swap_out into a short buffer",
            err: e(pool.swap_out(&blocks[..1], &mut short)),
            rust: &["Pool::swap_out: ", "host.len()", "blocks.len()"],
            c: &["host_bytes", "num_blocks", "pkv_pool_swap_blocks"],
            keep: &[" is below "],
        },
        Case {
            what: "swap_in from a short buffer",
            err: e(pool.swap_in(&blocks[..1], &short)),
            rust: &["Pool::swap_in: ", "host.len()"],
            c: &["host_bytes", "pkv_pool_swap_blocks"],
            keep: &[" is below "],
        },
        Case {
            what: "swap_blocks_raw with a short buffer (host_bytes is its argument)",
            // SAFETY: the library refuses the call before touching host.
            err: e(unsafe {
                pool.swap_blocks_raw(
                    &blocks[..1],
                    short.as_mut_ptr().cast(),
                    short.len() as u64,
                    SwapDirection::Out,
                    Stream::DEFAULT,
                )
            }),
            rust: &["Pool::swap_blocks_raw: ", "host_bytes", "blocks.len()"],
            c: &["num_blocks", "pkv_pool_swap_blocks"],
            keep: &[" is below "],
        },
        Case {
            what: "set_kv_scales with 3 scales for 2",
            err: e(fp8.set_kv_scales(&[1.0; 3], &[1.0; 3])),
            rust: &["Pool::set_kv_scales: ", "k_scales.len()"],
            c: &["num_scales", "pkv_pool_set_kv_scales"],
            keep: &["expected 2"],
        },
        Case {
            what: "set_retention with too many ranges",
            err: e(mgr.set_retention(
                live,
                &vec![RetentionRange::new(0, 4, 50); RetentionRange::MAX_RANGES + 1],
            )),
            rust: &["Pool::set_retention: ", "ranges.len()"],
            c: &["num_ranges", "pkv_seq_set_retention"],
            keep: &["exceeds"],
        },
        Case {
            what: "attach_seq(stale)",
            err: mgr.attach_seq(stale).err().expect("an error"),
            rust: &["Pool::attach_seq: ", "id "],
            c: &["pkv_seq_get_info", "seq_info"],
            keep: &["stale"],
        },
        Case {
            what: "Pool::new: scales on an f32 pool",
            err: ep(Pool::new(&PoolOptions {
                num_layers: 2,
                num_kv_heads: 1,
                head_dim: 8,
                dtype: DType::F32,
                k_scales: vec![1.0; 2],
                v_scales: vec![1.0; 2],
                ..PoolOptions::default()
            })),
            rust: &["Pool::new: ", "PoolOptions::k_scales.len()", "DType::F32"],
            c: &["opts", "num_kv_scales", "dtype 1", "pkv_pool_create"],
            keep: &["takes no scales (fp8 pools only)"],
        },
        Case {
            what: "Pool::new: 2 scales per head for 2 layers of 1 head... per tensor 3",
            err: ep(fp8_pool(vec![1.0; 3])),
            rust: &["PoolOptions::k_scales.len()", "PoolOptions::num_layers"],
            c: &["opts", "num_kv_scales"],
            keep: &["expected 2"],
        },
        Case {
            what: "Pool::new: block_size 2000",
            err: ep(Pool::new(&PoolOptions {
                block_size: 2000,
                ..PoolOptions::default()
            })),
            rust: &["Pool::new: ", "PoolOptions::block_size 2000"],
            c: &["opts"],
            keep: &["is outside [1, 1024]"],
        },
        Case {
            what: "Pool::new: dtype I32",
            err: ep(Pool::new(&PoolOptions {
                num_layers: 1,
                num_kv_heads: 1,
                head_dim: 8,
                dtype: DType::I32,
                ..PoolOptions::default()
            })),
            rust: &["PoolOptions::dtype", "DType::I32"],
            c: &["opts", "PKV_DTYPE_I32 ("],
            keep: &[],
        },
        Case {
            what: "Pool::new: max_pinned_blocks without retention",
            err: ep(Pool::new(&PoolOptions {
                num_blocks: 16,
                max_pinned_blocks: 4,
                ..PoolOptions::default()
            })),
            rust: &[
                "PoolOptions::max_pinned_blocks",
                "PoolOptions::enable_retention",
            ],
            c: &["opts"],
            keep: &[],
        },
        Case {
            what: "set_retention on a pool without retention",
            err: e(mgr.set_retention(live, &[RetentionRange::new(0, 4, 50)])),
            rust: &["Pool::set_retention: ", "PoolOptions::enable_retention"],
            c: &["pkv_seq_set_retention"],
            keep: &[],
        },
        Case {
            what: "with_groups: a window group of window 0",
            err: ep(Pool::with_groups(
                &PoolOptions {
                    block_size: 4,
                    num_blocks: 16,
                    ..PoolOptions::default()
                },
                &[GroupSpec::window(0, 1, 1, 8)],
            )),
            rust: &["Pool::with_groups: ", "groups[0].kind.window"],
            c: &["sliding_window", "pkv_pool_create_groups"],
            keep: &[],
        },
        Case {
            what: "with_groups: snapshot_every_block on a full group",
            err: ep(Pool::with_groups(
                &PoolOptions {
                    block_size: 4,
                    num_blocks: 16,
                    ..PoolOptions::default()
                },
                &[GroupSpec::full(1, 1, 8).with_snapshot_every_block()],
            )),
            rust: &["groups[0].snapshot_every_block"],
            c: &["flags"],
            keep: &[],
        },
        Case {
            what: "admit with overlapping multimodal items",
            err: mgr
                .admit(
                    &SeqOptions {
                        mm_items: vec![
                            MmItem {
                                offset: 0,
                                length: 4,
                                hash: "a".into(),
                            },
                            MmItem {
                                offset: 2,
                                length: 4,
                                hash: "b".into(),
                            },
                        ],
                        ..SeqOptions::default()
                    },
                    &[1; 8],
                    0,
                )
                .unwrap_err(),
            rust: &["Pool::admit: ", "SeqOptions::mm_items[1]"],
            c: &["opts"],
            keep: &[],
        },
        Case {
            what: "hash_prefix with block_size 0",
            err: hash_prefix(
                &HashOptions {
                    block_size: 0,
                    ..HashOptions::default()
                },
                &[1, 2, 3, 4],
            )
            .unwrap_err(),
            rust: &["hash_prefix: ", "HashOptions::block_size"],
            c: &["opts", "pkv_hash_prefix"],
            keep: &[],
        },
        Case {
            what: "match_prefix_hashes with more hashes than full blocks",
            err: mgr
                .match_prefix_hashes(
                    live,
                    &[1, 2, 3, 4, 5],
                    &hash_prefix(
                        &HashOptions {
                            block_size: 4,
                            ..HashOptions::default()
                        },
                        &[1, 2, 3, 4, 5, 6, 7, 8],
                    )
                    .unwrap(),
                )
                .unwrap_err(),
            rust: &[
                "Pool::match_prefix_hashes: ",
                "hashes.len()",
                "tokens.len()",
            ],
            c: &["num_hashes", "num_tokens"],
            keep: &["exceeds the 1 full blocks"],
        },
        Case {
            what: "reserve (num_tokens is its own argument)",
            err: e(mgr.reserve(live, 1 << 40)),
            rust: &["Pool::reserve: ", "num_tokens"],
            c: &["pkv_seq_reserve", "tokens.len()"],
            keep: &["exceeds 2^31 - 1"],
        },
        Case {
            what: "read_kv_block of a layer the pool lacks",
            err: pool
                .read_kv_block::<f32>(9, Kv::Key, blocks[0])
                .unwrap_err(),
            rust: &["Pool::read_kv_block: ", "layer 9"],
            c: &["Pool::kv_tensor", "pkv_pool_kv_tensor"],
            keep: &[" is out of range"],
        },
        Case {
            what: "read_kv_block of V on an MLA pool",
            err: mla_pool()
                .read_kv_block::<f32>(0, Kv::Value, 1)
                .unwrap_err(),
            rust: &["Pool::read_kv_block: ", "which is Kv::Value"],
            c: &[
                "Pool::kv_tensor",
                "pkv_pool_kv_tensor",
                "PKV_KV_VALUE",
                "PKV_KV_KEY",
            ],
            keep: &["an MLA pool stores no V"],
        },
        Case {
            what: "append_batch with a stale id",
            err: e(mgr.append_batch(&[live, stale], &[1, 2])),
            rust: &["Pool::append_batch: ", "seqs[1]"],
            c: &["pkv_seq_append_batch"],
            keep: &[],
        },
        Case {
            what: "EventPublisher on a pool without events",
            err: EventPublisher::new(
                &storage(4, 16, 1, 1, 8, DType::F32),
                "tcp://127.0.0.1:*",
                None,
                &PublisherOptions::default(),
            )
            .err()
            .expect("an error"),
            rust: &["EventPublisher::new: ", "PoolOptions::enable_events"],
            c: &["pkv_event_publisher_create"],
            keep: &[],
        },
    ]
}

#[test]
fn errors_name_the_rust_arguments() {
    for case in cases() {
        let (msg, c_msg) = (case.err.message(), case.err.c_message());
        assert!(
            c_msg.starts_with("pkv_"),
            "{}: c_message {c_msg:?}",
            case.what
        );
        for r in case.rust {
            assert!(msg.contains(r), "{}: {r:?} missing from {msg:?}", case.what);
        }
        for c in case.c {
            assert!(
                !has_word(msg, c) && !msg.contains(&format!("{c}->")),
                "{}: C name {c:?} in {msg:?}",
                case.what
            );
        }
        for k in case.keep {
            assert!(
                msg.contains(k) && c_msg.contains(k),
                "{}: {k:?} not kept: {msg:?} / {c_msg:?}",
                case.what
            );
        }
        assert!(case.err.to_string().contains(msg));
        eprintln!("{}:\n  {c_msg}\n  {msg}", case.what);
    }
}

#[test]
fn rust_side_errors_have_no_c_message() {
    let pool = manager(4, 16);
    let e = pool.prepare(&[], &[1]).err().expect("an error");
    assert!(e.c_message().is_empty());
    assert!(e.message().contains("query_counts"), "{e}");
}
