//! A continuous-batching decode loop over pagedkv, written to be copied.
//!
//! A toy "model" (deterministic functions of token and position stand in
//! for the projections) serves a few requests that share a system prompt:
//! admission with prefix-cache lookup, chunk-free prefill, batched decode,
//! preemption when the pool runs out of blocks, and freeing finished
//! sequences. Swap the toy model for your own q/k/v projections and
//! sampler; the pagedkv calls stay the same.
//!
//! Build against an installed pagedkv (pkg-config finds `pagedkv.pc`), or
//! an uninstalled CMake build tree:
//! `PKG_CONFIG_PATH=<build>/pkgconfig LD_LIBRARY_PATH=<build>/capi cargo run`.
//! Copied into your own crate, add the `static` feature or an rpath
//! (bindings/rust/README.md, "Using it from your crate") to run it without
//! LD_LIBRARY_PATH.

use std::collections::VecDeque;

use pagedkv::{
    AttentionParams, DType, ErrorKind, Pool, PoolOptions, SeqId, TensorView, TensorViewMut,
};

const LAYERS: usize = 2;
const KV_HEADS: usize = 2;
const Q_HEADS: usize = 4; // GQA: two query heads per KV head
const HEAD_DIM: usize = 64;
const VOCAB: i32 = 32000;

struct Request {
    id: usize,
    /// Prompt plus everything generated so far (recomputed after preemption).
    tokens: Vec<i32>,
    prompt_len: usize,
    max_new_tokens: usize,
    seq: Option<SeqId>,
}

impl Request {
    fn generated(&self) -> usize {
        self.tokens.len() - self.prompt_len
    }
}

/// Toy projection: a deterministic vector per (token, position, layer, role).
fn project(token: i32, pos: usize, layer: usize, role: u32, heads: usize, out: &mut Vec<f32>) {
    for h in 0..heads {
        for d in 0..HEAD_DIM {
            let x = token as f32 * 0.013 + pos as f32 * 0.07 + (h * HEAD_DIM + d) as f32 * 0.11;
            out.push((x + layer as f32 + role as f32 * 1.7).sin() * 0.5);
        }
    }
}

/// Toy sampler: the next token from the attention output of the last layer.
fn sample(row: &[f32]) -> i32 {
    let s: f32 = row
        .iter()
        .enumerate()
        .map(|(i, v)| v * (i % 7) as f32)
        .sum();
    ((s.abs() * 1e4) as i64 % VOCAB as i64) as i32
}

fn main() -> Result<(), pagedkv::Error> {
    println!(
        "pagedkv {} (abi {})",
        pagedkv::version_string(),
        pagedkv::abi_version()
    );
    let pool = Pool::new(&PoolOptions {
        block_size: 16,
        num_blocks: 20, // small on purpose: forces preemptions
        num_layers: LAYERS as u32,
        num_kv_heads: KV_HEADS as u32,
        head_dim: HEAD_DIM as u32,
        dtype: DType::F32,
        ..PoolOptions::default()
    })?;

    // Six requests sharing a 48-token system prompt.
    let system: Vec<i32> = (0..48).map(|i| 1000 + i).collect();
    let mut waiting: VecDeque<Request> = (0..6)
        .map(|id| {
            let mut tokens = system.clone();
            tokens.extend((0..10 + 3 * id as i32).map(|i| 5000 + 100 * id as i32 + i));
            Request {
                id,
                prompt_len: tokens.len(),
                tokens,
                max_new_tokens: 24,
                seq: None,
            }
        })
        .collect();
    let mut running: Vec<Request> = Vec::new();
    let mut finished = 0usize;
    let (mut steps, mut preemptions) = (0usize, 0usize);

    while !waiting.is_empty() || !running.is_empty() {
        steps += 1;
        // 1. Decode: reserve a slot for each running sequence's newest token.
        //    Out of blocks: preempt the youngest request (possibly this one:
        //    it is always at or after index i) and retry.
        let mut i = 0;
        let mut preempted = false;
        while i < running.len() {
            let r = &running[i];
            match pool.append(r.seq.unwrap(), &r.tokens[r.tokens.len() - 1..]) {
                Ok(()) => i += 1,
                Err(e) if e.kind() == ErrorKind::OutOfBlocks => {
                    let mut victim = running.pop().unwrap();
                    pool.free_seq(victim.seq.take().unwrap())?;
                    waiting.push_front(victim); // recomputed when readmitted
                    preemptions += 1;
                    preempted = true;
                }
                Err(e) => return Err(e),
            }
        }
        let mut queries: Vec<u32> = vec![1; running.len()];
        // 2. Admit waiting requests while their prompts fit (not in a step
        //    that had to preempt): the cached prefix is attached, only the
        //    rest is computed.
        if !preempted {
            while let Some(mut r) = waiting.pop_front() {
                // An owned Seq: any `?` below frees it instead of leaking it.
                let seq = pool.sequence()?;
                let cached = seq.match_prefix(&r.tokens)? as usize;
                // The cached prefix needs no compute; the rest is this step's
                // queries (at least the last prompt token).
                match seq.append(&r.tokens[cached..]) {
                    Ok(()) => {
                        queries.push((r.tokens.len() - cached) as u32);
                        r.seq = Some(seq.detach()); // the scheduler keeps the id
                        running.push(r);
                    }
                    Err(e) if e.kind() == ErrorKind::OutOfBlocks => {
                        drop(seq); // frees it
                        waiting.push_front(r);
                        break;
                    }
                    Err(e) => return Err(e),
                }
            }
        }
        if running.is_empty() {
            panic!("a single request does not fit the pool");
        }

        // 3. One plan for the step, then per layer: write K/V, attend.
        let seqs: Vec<SeqId> = running.iter().map(|r| r.seq.unwrap()).collect();
        let mut batch = pool.prepare(&seqs, &queries)?;
        let rows = batch.info()?.num_tokens as usize;
        let (mut q, mut k, mut v) = (Vec::new(), Vec::new(), Vec::new());
        let mut out = vec![0f32; rows * Q_HEADS * HEAD_DIM];
        for layer in 0..LAYERS {
            q.clear();
            k.clear();
            v.clear();
            for (r, &n) in running.iter().zip(&queries) {
                let start = r.tokens.len() - n as usize;
                for pos in start..r.tokens.len() {
                    let t = r.tokens[pos];
                    project(t, pos, layer, 0, Q_HEADS, &mut q);
                    project(t, pos, layer, 1, KV_HEADS, &mut k);
                    project(t, pos, layer, 2, KV_HEADS, &mut v);
                }
            }
            batch.cache_write(
                layer as u32,
                &TensorView::new(&k, &[rows, KV_HEADS, HEAD_DIM])?,
                &TensorView::new(&v, &[rows, KV_HEADS, HEAD_DIM])?,
            )?;
            batch.attention_forward(
                layer as u32,
                &TensorView::new(&q, &[rows, Q_HEADS, HEAD_DIM])?,
                &mut TensorViewMut::new(&mut out, &[rows, Q_HEADS, HEAD_DIM])?,
                None,
                &AttentionParams::default(),
            )?;
        }
        drop(batch);

        // 4. Sample from each sequence's last query row; retire finished ones.
        let row = Q_HEADS * HEAD_DIM;
        let mut end = 0usize;
        for (r, &n) in running.iter_mut().zip(&queries) {
            end += n as usize;
            let last = end - 1;
            r.tokens.push(sample(&out[last * row..(last + 1) * row]));
        }
        let mut still = Vec::with_capacity(running.len());
        for mut r in running.drain(..) {
            if r.generated() >= r.max_new_tokens {
                pool.free_seq(r.seq.take().unwrap())?;
                println!(
                    "request {} done: {} prompt + {} generated tokens, last {:?}",
                    r.id,
                    r.prompt_len,
                    r.generated(),
                    &r.tokens[r.tokens.len() - 4..]
                );
                finished += 1;
            } else {
                still.push(r);
            }
        }
        running = still;
    }

    let stats = pool.stats()?;
    pool.validate()?;
    println!(
        "{finished} requests in {steps} steps, {preemptions} preemptions; prefix cache hit {} of {} \
         prompt tokens; {} blocks cached",
        stats.prefix_hit_tokens, stats.prefix_query_tokens, stats.num_cached_blocks
    );
    assert_eq!(finished, 6, "every request completes");
    assert_eq!(stats.num_seqs, 0);
    assert!(
        stats.prefix_hit_tokens > 0,
        "the shared system prompt was reused"
    );
    Ok(())
}
