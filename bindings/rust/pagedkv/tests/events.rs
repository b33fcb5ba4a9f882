//! pagedkv/events.h through the safe crate: the versioned drain and the
//! publisher (its wire format is checked by the C++ and Python suites).

use pagedkv::{
    drain_events_v2, hash_prefix, ErrorKind, EventKind, EventMedium, EventPublisher, HashOptions,
    Pool, PoolOptions, PublisherOptions,
};

fn pool(max_events: u32) -> Pool {
    Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 32,
        enable_events: true,
        max_events,
        ..PoolOptions::default()
    })
    .unwrap()
}

#[test]
fn drain_v2_carries_tokens_and_medium() {
    let p = pool(64);
    let s = p.create_seq().unwrap();
    let tokens: Vec<i32> = (0..9).map(|i| 100 + 13 * i).collect();
    p.append(s, &tokens).unwrap();
    let evs = drain_events_v2(&p, 16).unwrap();
    assert_eq!(evs.len(), 2);
    let hashes = hash_prefix(
        &HashOptions {
            block_size: 4,
            ..HashOptions::default()
        },
        &tokens,
    )
    .unwrap();
    for (i, e) in evs.iter().enumerate() {
        assert_eq!(e.event.kind, EventKind::BlockStored);
        assert_eq!(e.event.seq_no, i as u64 + 1);
        assert_eq!(e.event.block_hash, hashes[i]);
        assert_eq!(e.medium, EventMedium::Device);
        assert_eq!(e.block_size, 4);
        assert_eq!(e.token_ids, tokens[4 * i..4 * i + 4].to_vec());
    }
    assert_eq!(evs[1].event.parent_hash, Some(hashes[0]));
    assert!(drain_events_v2(&p, 16).unwrap().is_empty());
}

#[test]
fn publisher_counts_drops_and_offsets_the_rank() {
    let p = pool(2);
    let opts = PublisherOptions {
        data_parallel_rank: 3,
        ..PublisherOptions::default()
    };
    let pub_ = match EventPublisher::new(&p, "inproc://pkv-rust-test", None, &opts) {
        Err(e) if e.kind() == ErrorKind::Unsupported => return, // built without PAGEDKV_EVENTS
        r => r.unwrap(),
    };
    assert_eq!(pub_.endpoint().unwrap(), "inproc://pkv-rust-test_dp3");
    assert_eq!(pub_.replay_endpoint().unwrap(), "");
    let s = p.create_seq().unwrap();
    p.append(s, &[7; 20]).unwrap(); // 5 stored events, 2 kept
    assert_eq!(pub_.publish().unwrap(), 2);
    let st = pub_.stats().unwrap();
    assert_eq!(st.pool_events_dropped, 3);
    assert_eq!(st.batches_published, 1);
    drop(p); // the publisher keeps the pool alive
    assert_eq!(pub_.publish().unwrap(), 0);
}

#[test]
fn publisher_rejects_a_pool_without_events() {
    let p = Pool::new(&PoolOptions {
        block_size: 4,
        num_blocks: 8,
        ..PoolOptions::default()
    })
    .unwrap();
    let err = EventPublisher::new(&p, "inproc://x", None, &PublisherOptions::default())
        .err()
        .unwrap();
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(err.message().contains("enable_events"), "{}", err.message());
}

#[test]
fn endpoint_of_any_length_is_returned() {
    // The safe API sizes its own buffers: a long inproc:// name used to be
    // ErrorKind::BufferTooSmall (a fixed 1024-byte buffer).
    let p = pool(8);
    for len in [1000usize, 1023, 1024, 1500, 5000] {
        let name = format!("inproc://pkv-rust-long-{}", "x".repeat(len));
        let pub_ = match EventPublisher::new(&p, &name, None, &PublisherOptions::default()) {
            Err(e) if e.kind() == ErrorKind::Unsupported => return,
            r => r.unwrap(),
        };
        assert_eq!(pub_.endpoint().unwrap(), name);
        assert_eq!(pub_.replay_endpoint().unwrap(), "");
    }
}

#[test]
fn rank_past_the_last_port_is_named() {
    // Refused as "has no numeric port to offset" (the port is numeric); the
    // message names the offset port and the rank now.
    let p = pool(8);
    let err = EventPublisher::new(
        &p,
        "tcp://127.0.0.1:65000",
        None,
        &PublisherOptions {
            data_parallel_rank: 1000,
            ..PublisherOptions::default()
        },
    )
    .err()
    .expect("a publisher on port 66000");
    if err.kind() == ErrorKind::Unsupported {
        return; // built without PAGEDKV_EVENTS
    }
    assert_eq!(err.kind(), ErrorKind::InvalidArgument);
    assert!(
        err.message().contains("66000") && err.message().contains("data_parallel_rank"),
        "{}",
        err.message()
    );
}

#[test]
fn multicast_endpoints_are_refused_not_aborted() {
    // "norm://*:5" was accepted, then libzmq's I/O thread hit a zmq_assert
    // starting the NORM session and aborted the whole process; pgm:// and
    // epgm:// endpoints made OpenPGM print to stderr. All three are refused
    // now, naming the argument and the transport, before any socket opens.
    let p = pool(8);
    let eps = [
        "norm://*:5",
        "norm://x",
        "pgm://127.0.0.1;239.192.1.1:5555",
        "epgm://;239.192.1.1:5555",
    ];
    for (ep, replay) in eps
        .iter()
        .flat_map(|e| [(*e, None), ("inproc://mc-ok", Some(*e))])
    {
        let err = match EventPublisher::new(&p, ep, replay, &PublisherOptions::default()) {
            Ok(publisher) => {
                // Before the fix: the abort comes from libzmq's I/O thread
                // shortly after the connect returned.
                std::thread::sleep(std::time::Duration::from_millis(300));
                drop(publisher);
                panic!("{ep} / {replay:?} was accepted");
            }
            Err(e) => e,
        };
        if err.kind() == ErrorKind::Unsupported {
            return; // built without PAGEDKV_EVENTS
        }
        assert_eq!(err.kind(), ErrorKind::InvalidArgument, "{ep}: {err}");
        let (what, bad) = match replay {
            None => ("endpoint", ep),
            Some(r) => ("replay_endpoint", r),
        };
        let transport = bad.split("://").next().unwrap();
        assert!(
            err.message().contains(what)
                && err.message().contains(bad)
                && err
                    .message()
                    .contains(&format!("the {transport} transport")),
            "{}",
            err.message()
        );
    }
    // The pool is as before and takes a publisher on a supported transport.
    assert!(
        EventPublisher::new(&p, "inproc://mc-after", None, &PublisherOptions::default()).is_ok()
    );
}

#[test]
fn replay_with_topic_is_off_by_default_and_accepted() {
    assert!(!PublisherOptions::default().replay_with_topic);
    let p = pool(8);
    let opts = PublisherOptions {
        topic: "kv@pod".into(),
        replay_with_topic: true,
        ..PublisherOptions::default()
    };
    let pub_ = match EventPublisher::new(
        &p,
        "inproc://pkv-rust-with-topic",
        Some("inproc://pkv-rust-with-topic-replay"),
        &opts,
    ) {
        Err(e) if e.kind() == ErrorKind::Unsupported => return, // built without PAGEDKV_EVENTS
        r => r.unwrap(),
    };
    let s = p.create_seq().unwrap();
    p.append(s, &[7; 8]).unwrap();
    assert_eq!(pub_.publish().unwrap(), 2);
}
