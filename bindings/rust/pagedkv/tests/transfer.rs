//! pkv_transfer_* through the safe crate: two engines in one process over
//! TCP loopback (the two-process tests are C++, tests/transfer/).

use pagedkv::{
    DType, ErrorKind, Pool, PoolOptions, SeqId, SeqOptions, TransferEngine, TransferOptions,
    TransferState,
};

fn pool(block_size: u32, num_blocks: u64) -> Pool {
    Pool::new(&PoolOptions {
        block_size,
        num_blocks,
        num_layers: 2,
        num_kv_heads: 2,
        head_dim: 32,
        dtype: DType::F32,
        num_threads: 1,
        ..PoolOptions::default()
    })
    .unwrap()
}

fn computed(p: &Pool, tokens: &[i32]) -> SeqId {
    let s = p.create_seq().unwrap();
    p.append(s, tokens).unwrap();
    let b = p.prepare(&[s], &[tokens.len() as u32]).unwrap();
    b.commit().unwrap();
    s
}

fn engines() -> Option<(TransferEngine, TransferEngine)> {
    if !pagedkv::transfer_available() {
        return None;
    }
    let o = TransferOptions {
        transports: Some("tcp".into()),
        ..TransferOptions::default()
    };
    Some((
        TransferEngine::new(&o).unwrap(),
        TransferEngine::new(&o).unwrap(),
    ))
}

#[test]
fn import_is_computed_and_prefix_cacheable() {
    let Some((a, b)) = engines() else { return };
    let (src, dst) = (pool(16, 64), pool(16, 64));
    let tokens: Vec<i32> = (0..70).map(|i| i * 13 + 5).collect();
    let s = computed(&src, &tokens);
    let (id, desc) = a.export(&src, s).unwrap();
    assert_eq!(a.num_exports().unwrap(), 1);
    let free0 = dst.stats().unwrap().num_free_blocks;
    let t = b.import(&dst, &SeqOptions::default(), &desc).unwrap();
    assert_eq!(t.bytes().unwrap(), 2 * 2 * 5 * 2 * 16 * 32 * 4);
    let got = loop {
        a.progress().unwrap();
        match t.poll().unwrap() {
            TransferState::Running => continue,
            TransferState::Done(seq) => break seq,
            other => panic!("{other:?}"),
        }
    };
    assert_eq!(t.cancel().unwrap_err().kind(), ErrorKind::InvalidState);
    let info = dst.seq_info(got).unwrap();
    assert_eq!((info.num_tokens, info.num_computed_tokens), (70, 70));
    let probe = dst.create_seq().unwrap();
    let mut longer = tokens.clone();
    longer.push(1);
    assert_eq!(dst.match_prefix(probe, &longer).unwrap(), 64);
    dst.free_seq(probe).unwrap();
    dst.free_seq(got).unwrap();
    assert_eq!(dst.stats().unwrap().num_free_blocks, free0);
    a.release_export(id).unwrap();
    assert_eq!(
        a.release_export(id).unwrap_err().kind(),
        ErrorKind::NotFound
    );
    dst.validate().unwrap();
}

#[test]
fn refusals_and_cancel_change_nothing() {
    let Some((a, b)) = engines() else { return };
    let (src, other, tiny) = (pool(16, 64), pool(32, 64), pool(16, 3));
    let tokens: Vec<i32> = (0..100).collect();
    let s = computed(&src, &tokens);
    let (id, desc) = a.export(&src, s).unwrap();
    let o = SeqOptions::default();
    let e = b.import(&other, &o, &desc).err().unwrap();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    assert!(e.to_string().contains("block_size"), "{e}");
    assert_eq!(
        b.import(&tiny, &o, &desc).err().unwrap().kind(),
        ErrorKind::OutOfBlocks
    );
    assert_eq!(
        b.import(&tiny, &o, &desc[..9]).err().unwrap().kind(),
        ErrorKind::InvalidArgument
    );
    for p in [&other, &tiny] {
        assert_eq!(p.stats().unwrap().num_seqs, 0);
        p.validate().unwrap();
    }
    let dst = pool(16, 64);
    let t = b.import(&dst, &o, &desc).unwrap();
    t.cancel().unwrap();
    assert_eq!(t.poll().unwrap(), TransferState::Cancelled);
    drop(t);
    assert_eq!(dst.stats().unwrap().num_seqs, 0);
    dst.validate().unwrap();
    a.release_export(id).unwrap();
}

/// An import still reading when the exporter drops its pool and releases
/// the export: the exporter's engine serves the reads over TCP at the
/// arena's address, which the library freed with the export, so
/// `progress` died of a SIGSEGV. The importer now gets stale bytes (as for
/// a release too early) and nothing crashes.
#[test]
fn reads_of_a_released_export_of_a_dropped_pool_do_not_crash_the_exporter() {
    let Some((a, b)) = engines() else { return };
    let (src, dst) = (pool(16, 64), pool(16, 64));
    let tokens: Vec<i32> = (0..40).map(|i| i * 7 + 1).collect();
    let s = computed(&src, &tokens);
    let (id, desc) = a.export(&src, s).unwrap();
    let t = b.import(&dst, &SeqOptions::default(), &desc).unwrap();
    drop(src);
    a.release_export(id).unwrap(); // the pool's last reference
    let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
    let mut ended = false;
    while std::time::Instant::now() < deadline {
        a.progress().unwrap();
        match t.poll() {
            Ok(TransferState::Running) => continue,
            _ => {
                ended = true;
                break;
            }
        }
    }
    assert!(ended, "the import never ended");
    drop(t);
    dst.validate().unwrap();
}

/// Transports naming nothing UCX has here were `Unsupported` ("UCX could
/// not be initialised (ucp_init): No such device"), the answer of a build
/// without UCX; they are `InvalidArgument` naming the option.
#[test]
fn unknown_transports_are_an_argument_error() {
    if !pagedkv::transfer_available() {
        return;
    }
    for tls in ["no_such_transport", "tcpp,shmm"] {
        let e = TransferEngine::new(&TransferOptions {
            transports: Some(tls.into()),
            ..TransferOptions::default()
        })
        .err()
        .expect("an engine over unknown transports");
        assert_eq!(e.kind(), ErrorKind::InvalidArgument, "{tls}: {e}");
        assert!(
            e.message().contains("transports") && e.message().contains(tls),
            "{tls}: {e}"
        );
    }
    TransferEngine::new(&TransferOptions {
        transports: Some("tcp".into()),
        ..TransferOptions::default()
    })
    .unwrap();
}

/// A pool without KV storage was `InvalidArgument` for an export and an
/// import, where every other call needing storage says `InvalidState` "no
/// KV storage".
#[test]
fn transfer_of_a_pool_without_storage_is_invalid_state() {
    let Some((a, b)) = engines() else { return };
    let src = pool(16, 64);
    let manager = Pool::new(&PoolOptions {
        block_size: 16,
        num_blocks: 64,
        ..PoolOptions::default()
    })
    .unwrap();
    let tokens: Vec<i32> = (0..20).map(|i| i * 7 + 1).collect();
    let ms = computed(&manager, &tokens);
    let e = a.export(&manager, ms).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
    assert!(e.message().contains("no KV storage"), "{e}");
    let s = computed(&src, &tokens);
    let (id, desc) = a.export(&src, s).unwrap();
    let before = manager.stats().unwrap();
    let e = b
        .import(&manager, &SeqOptions::default(), &desc)
        .err()
        .expect("an import into a pool without storage");
    assert_eq!(e.kind(), ErrorKind::InvalidState, "{e}");
    assert!(e.message().contains("no KV storage"), "{e}");
    assert_eq!(manager.stats().unwrap(), before);
    a.release_export(id).unwrap();
    assert_eq!(a.num_exports().unwrap(), 0);
    manager.validate().unwrap();
}
