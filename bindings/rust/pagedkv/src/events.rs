//! KV events with what vLLM's carry (token ids, block size, medium), and a
//! publisher that sends a pool's events over ZeroMQ in vLLM's wire format
//! (`pagedkv/events.h`), so a router written for vLLM consumes them as they
//! are.

use std::ffi::CString;
use std::ptr::{self, NonNull};

use crate::error::{check, Error, Result};
use crate::hash::c_string;
use crate::pool::{read_vec, Event, Pool};
use crate::sys;

/// Where an event's block lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum EventMedium {
    /// The pool's own storage.
    Device,
    /// A host-memory tier.
    Host,
    /// A file tier.
    File,
    /// A medium this crate does not know (from a newer library).
    Other(u32),
}

impl EventMedium {
    fn from_raw(m: u32) -> EventMedium {
        match m {
            sys::PKV_MEDIUM_DEVICE => EventMedium::Device,
            sys::PKV_MEDIUM_HOST => EventMedium::Host,
            sys::PKV_MEDIUM_FILE => EventMedium::File,
            other => EventMedium::Other(other),
        }
    }
}

/// A KV event with the block's token ids, the block size and its medium.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct EventV2 {
    pub event: Event,
    pub medium: EventMedium,
    pub block_size: u32,
    /// A stored block's token ids; empty otherwise.
    pub token_ids: Vec<i32>,
}

/// Cap of one [`drain_events_v2`] call (its token buffer is `max *
/// block_size` ids).
const MAX_DRAIN_V2: usize = 4096;

/// Removes and returns up to `max` oldest events of every medium
/// (`pkv_pool_drain_events_v2`); one queue with [`Pool::drain_events`].
pub fn drain_events_v2(pool: &Pool, max: usize) -> Result<Vec<EventV2>> {
    let max = max.min(MAX_DRAIN_V2);
    let bs = pool.options()?.block_size as usize;
    let mut raw = vec![sys::pkv_event_v2::default(); max];
    for e in raw.iter_mut() {
        e.struct_size = std::mem::size_of::<sys::pkv_event_v2>() as u32;
    }
    let mut ids = vec![0i32; max * bs];
    let mut n = 0u64;
    let (out, tok) = if max == 0 {
        (ptr::null_mut(), ptr::null_mut())
    } else {
        (raw.as_mut_ptr(), ids.as_mut_ptr())
    };
    // SAFETY: out holds max events and tok max * bs ids.
    check(unsafe {
        sys::pkv_pool_drain_events_v2(
            pool.as_raw(),
            out,
            max as u64,
            tok,
            (max * bs) as u64,
            &mut n,
        )
    })?;
    raw.truncate(n as usize);
    Ok(raw
        .iter()
        .map(|e| {
            let v1 = sys::pkv_event {
                seq_no: e.seq_no,
                type_: e.type_,
                block_id: e.block_id,
                block_hash: e.block_hash,
                parent_hash: e.parent_hash,
                has_parent: e.has_parent,
                num_tokens: e.num_tokens,
                lora_id: e.lora_id,
            };
            let off = e.token_offset as usize;
            EventV2 {
                event: Event::from_raw(&v1),
                medium: EventMedium::from_raw(e.medium),
                block_size: e.block_size,
                token_ids: ids[off..off + e.num_token_ids as usize].to_vec(),
            }
        })
        .collect())
}

/// How events are encoded on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum EventEncoding {
    /// Each event a tagged map (vLLM after PR 42892).
    #[default]
    Map,
    /// Each event a tagged array (vLLM 0.9 to 0.23).
    Array,
}

/// How block hashes are encoded on the wire.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub enum HashEncoding {
    /// The uint64 of the digest's last 8 bytes (vLLM's default).
    #[default]
    Int,
    /// The whole digest as bytes.
    Bytes,
}

/// Options of an [`EventPublisher`]; `Default` is the library's.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PublisherOptions {
    pub topic: String,
    /// In every batch; offsets a tcp port (inproc: `"_dp<rank>"`), as vLLM.
    pub data_parallel_rank: u32,
    /// Batches kept for replay.
    pub buffer_steps: u64,
    /// PUB send high-water mark.
    pub hwm: i32,
    pub event_encoding: EventEncoding,
    pub hash_encoding: HashEncoding,
    /// EventMedium string of the pool's own blocks; `None`: "GPU" for a CUDA
    /// pool, "CPU" for a CPU pool.
    pub device_medium: Option<String>,
    /// Replay answers `[topic, seq, batch]` and end `["", -1, empty]`, as
    /// vLLM 0.33 on; `false`: `[seq, batch]` and `[-1, empty]`.
    pub replay_with_topic: bool,
}

impl Default for PublisherOptions {
    fn default() -> Self {
        let o = init_sized!(
            sys::pkv_event_publisher_options_init_sized,
            sys::pkv_event_publisher_options
        )
        .expect("the sized init of a struct of its own size");
        PublisherOptions {
            topic: String::new(),
            data_parallel_rank: o.data_parallel_rank,
            buffer_steps: o.buffer_steps,
            hwm: o.hwm,
            event_encoding: EventEncoding::Map,
            hash_encoding: HashEncoding::Int,
            device_medium: None,
            replay_with_topic: o.replay_with_topic != 0,
        }
    }
}

/// An [`EventPublisher`]'s counters.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default)]
pub struct PublisherStats {
    pub batches_published: u64,
    pub events_published: u64,
    pub pool_events_published: u64,
    /// Pool events lost to `max_events` since the publisher was created.
    pub pool_events_dropped: u64,
    pub replay_requests: u64,
}

/// Publishes a pool's KV events over ZeroMQ as vLLM's ZmqEventPublisher
/// does. The publisher keeps the pool alive. Safe to share across threads.
pub struct EventPublisher {
    raw: NonNull<sys::pkv_event_publisher>,
}

// SAFETY: every publisher call takes the publisher's lock; Drop has
// exclusive ownership.
unsafe impl Send for EventPublisher {}
unsafe impl Sync for EventPublisher {}

impl EventPublisher {
    /// Publishes `pool`'s events on `endpoint` (bound if it holds `*` or
    /// `::` or is ipc:// or inproc://, else connected), with a replay socket
    /// bound at `replay_endpoint`. [`crate::ErrorKind::Unsupported`] in a
    /// build without PAGEDKV_EVENTS.
    pub fn new(
        pool: &Pool,
        endpoint: &str,
        replay_endpoint: Option<&str>,
        opts: &PublisherOptions,
    ) -> Result<EventPublisher> {
        let ep = c_string(endpoint, "endpoint")?;
        let rep: Option<CString> = match replay_endpoint {
            Some(r) => Some(c_string(r, "replay_endpoint")?),
            None => None,
        };
        let topic = c_string(&opts.topic, "topic")?;
        let medium = match &opts.device_medium {
            Some(m) => Some(c_string(m, "device_medium")?),
            None => None,
        };
        let mut o = init_sized!(
            sys::pkv_event_publisher_options_init_sized,
            sys::pkv_event_publisher_options
        )?;
        o.topic = topic.as_ptr();
        o.data_parallel_rank = opts.data_parallel_rank;
        o.buffer_steps = opts.buffer_steps;
        o.hwm = opts.hwm;
        o.event_encoding = match opts.event_encoding {
            EventEncoding::Map => sys::PKV_EVENTS_ENCODING_MAP,
            EventEncoding::Array => sys::PKV_EVENTS_ENCODING_ARRAY,
        };
        o.hash_encoding = match opts.hash_encoding {
            HashEncoding::Int => sys::PKV_EVENTS_HASH_INT,
            HashEncoding::Bytes => sys::PKV_EVENTS_HASH_BYTES,
        };
        o.device_medium = medium.as_ref().map_or(ptr::null(), |m| m.as_ptr());
        o.replay_with_topic = u32::from(opts.replay_with_topic);
        let mut out = ptr::null_mut();
        // SAFETY: every pointer is valid for the call; the library copies
        // the strings.
        check(unsafe {
            sys::pkv_event_publisher_create(
                pool.as_raw(),
                ep.as_ptr(),
                rep.as_ref().map_or(ptr::null(), |r| r.as_ptr()),
                &o,
                &mut out,
            )
        })?;
        NonNull::new(out)
            .map(|raw| EventPublisher { raw })
            .ok_or_else(|| Error::invalid("pkv_event_publisher_create returned NULL"))
    }

    /// Drains the pool's pending events and sends them as one batch (none
    /// when there are none); returns the pool events drained.
    pub fn publish(&self) -> Result<u64> {
        let mut n = 0u64;
        // SAFETY: valid handle.
        check(unsafe { sys::pkv_event_publisher_publish(self.raw.as_ptr(), &mut n) })?;
        Ok(n)
    }

    pub fn stats(&self) -> Result<PublisherStats> {
        let mut s = init_sized!(
            sys::pkv_event_publisher_stats_init_sized,
            sys::pkv_event_publisher_stats
        )?;
        // SAFETY: valid handle and struct.
        check(unsafe { sys::pkv_event_publisher_get_stats(self.raw.as_ptr(), &mut s) })?;
        Ok(PublisherStats {
            batches_published: s.batches_published,
            events_published: s.events_published,
            pool_events_published: s.pool_events_published,
            pool_events_dropped: s.pool_events_dropped,
            replay_requests: s.replay_requests,
        })
    }

    /// The PUB endpoint after the rank offset (a bound one with the port a
    /// `*` got).
    pub fn endpoint(&self) -> Result<String> {
        self.endpoint_of(0)
    }

    /// The replay endpoint ("" when none).
    pub fn replay_endpoint(&self) -> Result<String> {
        self.endpoint_of(1)
    }

    fn endpoint_of(&self, which: u32) -> Result<String> {
        // An endpoint has no length limit (an inproc:// name can be any
        // length), so the buffer grows to what the library asks for.
        let buf = read_vec(0u8, 256, |out, cap, len| {
            // SAFETY: out holds cap bytes (or is NULL with cap 0).
            let st = unsafe {
                sys::pkv_event_publisher_endpoint(self.raw.as_ptr(), which, out.cast(), cap, len)
            };
            // *len excludes the NUL, which needs a byte too.
            if st == sys::PKV_E_BUFFER_TOO_SMALL {
                *len = len.saturating_add(1);
            }
            st
        })?;
        String::from_utf8(buf).map_err(|_| Error::invalid("endpoint is not UTF-8"))
    }
}

impl Drop for EventPublisher {
    fn drop(&mut self) {
        // SAFETY: owned handle, destroyed once.
        unsafe { sys::pkv_event_publisher_destroy(self.raw.as_ptr()) }
    }
}
