//! Helpers shared by the integration tests.
#![allow(dead_code)]

use pagedkv::{DType, Pool, PoolOptions};

/// xorshift64*: reproducible random data without a dependency.
pub struct Rng(u64);

impl Rng {
    pub fn new(seed: u64) -> Rng {
        Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
    }
    pub fn next_u64(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    /// Uniform in [lo, hi).
    pub fn range(&mut self, lo: u64, hi: u64) -> u64 {
        lo + self.next_u64() % (hi - lo)
    }
    /// Uniform in [-1, 1).
    pub fn f32(&mut self) -> f32 {
        ((self.next_u64() >> 40) as f32 / (1u64 << 24) as f32) * 2.0 - 1.0
    }
    pub fn tokens(&mut self, n: usize) -> Vec<i32> {
        (0..n).map(|_| self.range(0, 50_000) as i32).collect()
    }
    pub fn shuffle<T>(&mut self, v: &mut [T]) {
        for i in (1..v.len()).rev() {
            let j = self.range(0, i as u64 + 1) as usize;
            v.swap(i, j);
        }
    }
}

/// A manager-only pool (no KV storage).
pub fn manager(block_size: u32, num_blocks: u64) -> Pool {
    Pool::new(&PoolOptions {
        block_size,
        num_blocks,
        enable_events: true,
        ..PoolOptions::default()
    })
    .expect("manager pool")
}

/// A CPU pool with storage.
pub fn storage(
    block_size: u32,
    num_blocks: u64,
    layers: u32,
    kv_heads: u32,
    head_dim: u32,
    dtype: DType,
) -> Pool {
    Pool::new(&PoolOptions {
        block_size,
        num_blocks,
        num_layers: layers,
        num_kv_heads: kv_heads,
        head_dim,
        dtype,
        num_threads: 2,
        ..PoolOptions::default()
    })
    .expect("storage pool")
}

use pagedkv::{AttentionParams, Element, SeqId, TensorView, TensorViewMut};

/// Element types the attention tests run with.
pub trait TestElem: Element + Default {
    fn from_f32(x: f32) -> Self;
    fn to_f64(self) -> f64;
    /// A NaN bit pattern, little-endian bytes.
    fn nan_bytes() -> Vec<u8>;
}
impl TestElem for f32 {
    fn from_f32(x: f32) -> f32 {
        x
    }
    fn to_f64(self) -> f64 {
        self as f64
    }
    fn nan_bytes() -> Vec<u8> {
        f32::NAN.to_le_bytes().to_vec()
    }
}
impl TestElem for half::f16 {
    fn from_f32(x: f32) -> Self {
        half::f16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn nan_bytes() -> Vec<u8> {
        half::f16::NAN.to_bits().to_le_bytes().to_vec()
    }
}
impl TestElem for half::bf16 {
    fn from_f32(x: f32) -> Self {
        half::bf16::from_f32(x)
    }
    fn to_f64(self) -> f64 {
        self.to_f64()
    }
    fn nan_bytes() -> Vec<u8> {
        half::bf16::NAN.to_bits().to_le_bytes().to_vec()
    }
}

/// Fills every usable block of every layer with NaN (through swap_in), so a
/// kernel reading a slot no token was written to poisons its output.
pub fn poison<T: TestElem>(pool: &Pool) {
    let n = pool.options().unwrap().num_blocks as i32;
    let blocks: Vec<i32> = (1..n).collect();
    let bpb = pool.bytes_per_block().unwrap() as usize;
    let nan = T::nan_bytes();
    let host: Vec<u8> = nan
        .iter()
        .copied()
        .cycle()
        .take(blocks.len() * bpb)
        .collect();
    pool.swap_in(&blocks, &host).unwrap();
}

/// Puts the free queue in random order: one block per throw-away sequence,
/// freed in shuffled order (uncached blocks go back to the head).
pub fn scramble(pool: &Pool, rng: &mut Rng) {
    let n = pool.stats().unwrap().num_free_blocks as usize;
    let mut seqs: Vec<SeqId> = (0..n)
        .map(|_| {
            let s = pool.create_seq().unwrap();
            pool.append(s, &[rng.range(0, 1000) as i32]).unwrap();
            s
        })
        .collect();
    rng.shuffle(&mut seqs);
    for s in seqs {
        pool.free_seq(s).unwrap();
    }
}

/// Shape of one attention scenario.
#[derive(Clone, Copy, Debug)]
pub struct Case {
    pub block_size: u32,
    pub kv_heads: usize,
    pub q_heads: usize,
    pub head_dim: usize,
    pub layers: u32,
    pub params: AttentionParams,
    pub lse: bool,
    /// Absolute + relative tolerance on outputs.
    pub tol: f64,
}

/// One sequence's K/V history per layer: [token][kv_head][dim], as stored
/// (already rounded to the pool's dtype).
pub struct SeqState {
    pub id: SeqId,
    pub k: Vec<Vec<f64>>,
    pub v: Vec<Vec<f64>>,
    pub len: usize,
}

/// float64 attention for the queries of one sequence: rows `q` of
/// [n][q_heads][dim] at positions len-n..len over the history.
pub fn reference(
    case: &Case,
    st: &SeqState,
    layer: usize,
    q: &[f64],
    n: usize,
) -> (Vec<f64>, Vec<f64>) {
    let (qh, kh, d) = (case.q_heads, case.kv_heads, case.head_dim);
    let group = qh / kh;
    let scale = if case.params.softmax_scale == 0.0 {
        1.0 / (d as f64).sqrt()
    } else {
        case.params.softmax_scale as f64
    };
    let cap = case.params.logit_softcap as f64;
    let win = case.params.sliding_window as usize;
    let mut out = vec![0f64; n * qh * d];
    let mut lse = vec![0f64; n * qh];
    for j in 0..n {
        let p = st.len - n + j;
        let lo = if win > 0 {
            (p + 1).saturating_sub(win)
        } else {
            0
        };
        for h in 0..qh {
            let kvh = h / group;
            let qrow = &q[(j * qh + h) * d..][..d];
            let logits: Vec<f64> = (lo..=p)
                .map(|t| {
                    let krow = &st.k[layer][(t * kh + kvh) * d..][..d];
                    let mut s = qrow.iter().zip(krow).map(|(a, b)| a * b).sum::<f64>() * scale;
                    if cap > 0.0 {
                        s = cap * (s / cap).tanh();
                    }
                    s
                })
                .collect();
            let m = logits.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let w: Vec<f64> = logits.iter().map(|l| (l - m).exp()).collect();
            let z: f64 = w.iter().sum();
            lse[j * qh + h] = m + z.ln();
            let o = &mut out[(j * qh + h) * d..][..d];
            for (i, t) in (lo..=p).enumerate() {
                let vrow = &st.v[layer][(t * kh + kvh) * d..][..d];
                for x in 0..d {
                    o[x] += w[i] / z * vrow[x];
                }
            }
        }
    }
    (out, lse)
}

/// One step: appends `counts[i]` random tokens to each sequence, prepares a
/// plan, and per layer writes random K/V and checks attention (and LSE)
/// against the float64 reference, every element. Returns the largest
/// error seen.
pub fn step<T: TestElem>(
    pool: &Pool,
    case: &Case,
    seqs: &mut [SeqState],
    counts: &[u32],
    rng: &mut Rng,
) -> f64 {
    for (s, &c) in seqs.iter_mut().zip(counts) {
        pool.append(s.id, &rng.tokens(c as usize)).unwrap();
        s.len += c as usize;
    }
    let ids: Vec<SeqId> = seqs.iter().map(|s| s.id).collect();
    let mut batch = pool.prepare(&ids, counts).unwrap();
    let rows: usize = counts.iter().map(|&c| c as usize).sum();
    assert_eq!(batch.info().unwrap().num_tokens as usize, rows);
    let (qh, kh, d) = (case.q_heads, case.kv_heads, case.head_dim);
    let mut worst = 0f64;
    for layer in 0..case.layers as usize {
        let gen = |rng: &mut Rng, n: usize| -> Vec<T> {
            (0..n).map(|_| T::from_f32(rng.f32())).collect()
        };
        let k = gen(rng, rows * kh * d);
        let v = gen(rng, rows * kh * d);
        let q = gen(rng, rows * qh * d);
        batch
            .cache_write(
                layer as u32,
                &TensorView::new(&k, &[rows, kh, d]).unwrap(),
                &TensorView::new(&v, &[rows, kh, d]).unwrap(),
            )
            .unwrap();
        let mut out = vec![T::default(); rows * qh * d];
        let mut lse = vec![f32::NAN; rows * qh];
        {
            let mut o = TensorViewMut::new(&mut out, &[rows, qh, d]).unwrap();
            let mut l = TensorViewMut::new(&mut lse, &[rows, qh]).unwrap();
            let qv = TensorView::new(&q, &[rows, qh, d]).unwrap();
            batch
                .attention_forward(
                    layer as u32,
                    &qv,
                    &mut o,
                    if case.lse { Some(&mut l) } else { None },
                    &case.params,
                )
                .unwrap();
        }
        let mut row0 = 0usize;
        for (s, &c) in seqs.iter_mut().zip(counts) {
            let c = c as usize;
            let kk = &k[row0 * kh * d..(row0 + c) * kh * d];
            let vv = &v[row0 * kh * d..(row0 + c) * kh * d];
            s.k[layer].extend(kk.iter().map(|x| x.to_f64()));
            s.v[layer].extend(vv.iter().map(|x| x.to_f64()));
            let qq: Vec<f64> = q[row0 * qh * d..(row0 + c) * qh * d]
                .iter()
                .map(|x| x.to_f64())
                .collect();
            let (want, want_lse) = reference(case, s, layer, &qq, c);
            let got = &out[row0 * qh * d..(row0 + c) * qh * d];
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                let g = g.to_f64();
                let err = (g - w).abs();
                assert!(
                    err <= case.tol * (1.0 + w.abs()),
                    "{case:?} layer {layer} seq len {} row {} head {} dim {}: got {g}, want {w}",
                    s.len,
                    i / (qh * d),
                    i / d % qh,
                    i % d
                );
                worst = worst.max(err);
            }
            if case.lse {
                for (i, w) in want_lse.iter().enumerate() {
                    let g = lse[row0 * qh + i] as f64;
                    assert!(
                        (g - w).abs() <= 1e-3 * (1.0 + w.abs()),
                        "lse row {i}: got {g}, want {w}"
                    );
                }
            }
            row0 += c;
        }
    }
    worst
}

/// New empty sequences with history buffers.
pub fn new_seqs(pool: &Pool, n: usize, layers: u32) -> Vec<SeqState> {
    (0..n)
        .map(|_| SeqState {
            id: pool.create_seq().unwrap(),
            k: vec![Vec::new(); layers as usize],
            v: vec![Vec::new(); layers as usize],
            len: 0,
        })
        .collect()
}
