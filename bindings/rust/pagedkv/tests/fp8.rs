//! FP8 KV pools through the safe API: scales at creation and updated,
//! the quantising cache write (codes read back with `read_kv_block` and
//! checked against a float64 nearest-code search), attention over FP8
//! pages against a float64 reference over the decoded codes, and the
//! error paths of the scale calls.

use pagedkv::{
    AttentionParams, DType, ErrorKind, Fp8E4m3, Fp8E5m2, Kv, KvScaleGranularity, Pool, PoolOptions,
    TensorView, TensorViewMut,
};

const D: usize = 64;
const HKV: usize = 2;
const HQ: usize = 4;
const BS: u32 = 8;

fn pool(dtype: DType, gran: KvScaleGranularity, k: Vec<f32>, v: Vec<f32>) -> pagedkv::Result<Pool> {
    Pool::new(&PoolOptions {
        block_size: BS,
        num_blocks: 16,
        num_layers: 2,
        num_kv_heads: HKV as u32,
        head_dim: D as u32,
        dtype,
        num_threads: 1,
        kv_scale_granularity: gran,
        k_scales: k,
        v_scales: v,
        ..PoolOptions::default()
    })
}

fn decode(dtype: DType, c: u8) -> f64 {
    f64::from(if dtype == DType::Fp8E4m3 {
        Fp8E4m3(c).to_f32()
    } else {
        Fp8E5m2(c).to_f32()
    })
}

// Nearest finite code to x, ties to the even code, saturating (the
// library's encoding), by search over the non-negative codes.
fn encode(dtype: DType, x: f64) -> u8 {
    let top = if dtype == DType::Fp8E4m3 { 0x7e } else { 0x7b };
    let sign = if x.is_sign_negative() { 0x80u8 } else { 0 };
    let ax = x.abs();
    let mut best = 0u8;
    for c in 1..=top {
        let (db, dc) = (
            (decode(dtype, best) - ax).abs(),
            (decode(dtype, c) - ax).abs(),
        );
        if dc < db || (dc == db && c % 2 == 0) {
            best = c;
        }
    }
    sign | best
}

struct Lcg(u64);
impl Lcg {
    // Uniform in +-[0.05, 1) * m: never zero.
    fn next(&mut self, m: f32) -> f32 {
        self.0 = self
            .0
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let u = ((self.0 >> 40) as f32) / (1u64 << 24) as f32;
        let x = (0.05 + 0.95 * u) * m;
        if self.0 & (1 << 20) != 0 {
            -x
        } else {
            x
        }
    }
}

#[test]
fn scales_options_and_errors() {
    let p = pool(
        DType::Fp8E4m3,
        KvScaleGranularity::PerTensor,
        vec![0.5, 0.25],
        vec![2.0, 4.0],
    )
    .unwrap();
    assert_eq!(p.options().unwrap().dtype, DType::Fp8E4m3);
    assert!(pagedkv::features().fp8());
    assert_eq!(p.kv_scales().unwrap(), (vec![0.5, 0.25], vec![2.0, 4.0]));
    p.set_kv_scales(&[3.0, 5.0], &[7.0, 9.0]).unwrap();
    assert_eq!(p.kv_scales().unwrap(), (vec![3.0, 5.0], vec![7.0, 9.0]));
    for bad in [0.0, -1.0, f32::NAN, f32::INFINITY] {
        let e = p.set_kv_scales(&[1.0, bad], &[1.0, 1.0]).unwrap_err();
        assert_eq!(e.kind(), ErrorKind::InvalidArgument);
        assert!(e.message().contains("k_scales[1]"), "{}", e.message());
    }
    let e = p.set_kv_scales(&[1.0, 1.0], &[1.0]).unwrap_err();
    assert_eq!(e.kind(), ErrorKind::InvalidArgument);
    let e = p.set_kv_scales(&[1.0; 3], &[1.0; 3]).unwrap_err();
    assert!(e.message().contains("k_scales.len()"), "{}", e.message());
    assert!(e.c_message().contains("num_scales"), "{}", e.c_message());
    assert_eq!(p.kv_scales().unwrap(), (vec![3.0, 5.0], vec![7.0, 9.0]));
    let b = pool(DType::BF16, KvScaleGranularity::PerTensor, vec![], vec![]).unwrap();
    assert_eq!(b.kv_scales().unwrap_err().kind(), ErrorKind::InvalidState);
    assert_eq!(
        p.bytes_per_block().unwrap() * 2,
        b.bytes_per_block().unwrap()
    );
    let h = pool(DType::Fp8E5m2, KvScaleGranularity::PerHead, vec![], vec![]).unwrap();
    assert_eq!(h.kv_scales().unwrap(), (vec![1.0; 4], vec![1.0; 4]));
    let e = pool(
        DType::Fp8E5m2,
        KvScaleGranularity::PerHead,
        vec![1.0; 2],
        vec![1.0; 2],
    )
    .unwrap_err();
    assert!(
        e.message().contains("PoolOptions::k_scales.len()"),
        "{}",
        e.message()
    );
    let e = pool(
        DType::BF16,
        KvScaleGranularity::PerTensor,
        vec![1.0; 2],
        vec![1.0; 2],
    )
    .unwrap_err();
    assert!(e.message().contains("fp8 pools only"), "{}", e.message());
    // Every code decodes to the format's value.
    assert_eq!(Fp8E4m3(0x7e).to_f32(), 448.0);
    assert!(Fp8E4m3(0xff).to_f32().is_nan());
    assert_eq!(Fp8E4m3(0x01).to_f32(), 2f32.powi(-9));
    assert_eq!(Fp8E5m2(0x7b).to_f32(), 57344.0);
    assert_eq!(Fp8E5m2(0xfc).to_f32(), f32::NEG_INFINITY);
    assert_eq!(Fp8E5m2(0x01).to_f32(), 2f32.powi(-16));
}

fn write_and_attend(dtype: DType) {
    let fmax = if dtype == DType::Fp8E4m3 {
        448.0f32
    } else {
        57344.0
    };
    // Per head; the second head's scales make some values saturate.
    let ks = vec![1.5 / fmax, 0.25 / fmax, 1.2 / fmax, 1.1 / fmax];
    let vs = vec![1.3 / fmax, 0.5 / fmax, 1.0 / fmax, 1.4 / fmax];
    let p = pool(dtype, KvScaleGranularity::PerHead, ks.clone(), vs.clone()).unwrap();
    let a = p.create_seq().unwrap();
    let n = 13usize;
    p.append(a, &(0..n as i32).collect::<Vec<_>>()).unwrap();
    let mut rng = Lcg(42);
    let k: Vec<f32> = (0..n * HKV * D).map(|_| rng.next(1.0)).collect();
    let v: Vec<f32> = (0..n * HKV * D).map(|_| rng.next(1.0)).collect();
    let q: Vec<f32> = (0..n * HQ * D).map(|_| rng.next(1.0)).collect();
    let mut out = vec![f32::NAN; q.len()];
    let layer = 1u32;
    let mut b = p.prepare(&[a], &[n as u32]).unwrap();
    for l in 0..2 {
        b.cache_write(
            l,
            &TensorView::new(&k, &[n, HKV, D]).unwrap(),
            &TensorView::new(&v, &[n, HKV, D]).unwrap(),
        )
        .unwrap();
    }
    b.attention_forward(
        layer,
        &TensorView::new(&q, &[n, HQ, D]).unwrap(),
        &mut TensorViewMut::new(&mut out, &[n, HQ, D]).unwrap(),
        None,
        &AttentionParams::default(),
    )
    .unwrap();
    drop(b);
    // The stored codes, block by block, and their values.
    let table = p.block_table(a).unwrap();
    let mut kd = vec![0f64; n * HKV * D];
    let mut vd = vec![0f64; n * HKV * D];
    for (which, src, dst, sc) in [(Kv::Key, &k, &mut kd, &ks), (Kv::Value, &v, &mut vd, &vs)] {
        for (bi, &blk) in table.iter().enumerate() {
            let codes: Vec<u8> = if dtype == DType::Fp8E4m3 {
                p.read_kv_block::<Fp8E4m3>(layer, which, blk)
                    .unwrap()
                    .iter()
                    .map(|c| c.0)
                    .collect()
            } else {
                p.read_kv_block::<Fp8E5m2>(layer, which, blk)
                    .unwrap()
                    .iter()
                    .map(|c| c.0)
                    .collect()
            };
            for h in 0..HKV {
                let scale = sc[layer as usize * HKV + h];
                for slot in 0..BS as usize {
                    let pos = bi * BS as usize + slot;
                    if pos >= n {
                        break;
                    }
                    for e in 0..D {
                        let c = codes[(h * BS as usize + slot) * D + e];
                        let x = src[(pos * HKV + h) * D + e];
                        assert_eq!(
                            c,
                            encode(dtype, f64::from(x / scale)),
                            "pos {pos} head {h} dim {e}"
                        );
                        dst[(pos * HKV + h) * D + e] = decode(dtype, c) * f64::from(scale);
                    }
                }
            }
        }
    }
    // float64 causal attention over the decoded values.
    let scale = 1.0 / (D as f64).sqrt();
    let mut worst = 0f64;
    for i in 0..n {
        for h in 0..HQ {
            let kh = h / (HQ / HKV);
            let w: Vec<f64> = (0..=i)
                .map(|j| {
                    (0..D)
                        .map(|e| f64::from(q[(i * HQ + h) * D + e]) * kd[(j * HKV + kh) * D + e])
                        .sum::<f64>()
                        * scale
                })
                .collect();
            let mx = w.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let ex: Vec<f64> = w.iter().map(|x| (x - mx).exp()).collect();
            let sum: f64 = ex.iter().sum();
            for e in 0..D {
                let r: f64 = (0..=i)
                    .map(|j| ex[j] / sum * vd[(j * HKV + kh) * D + e])
                    .sum();
                let got = f64::from(out[(i * HQ + h) * D + e]);
                worst = worst.max((got - r).abs());
                assert!(
                    (got - r).abs() <= 2e-5 + 1e-4 * r.abs(),
                    "q {i} head {h} dim {e}: {got} vs {r}"
                );
            }
        }
    }
    eprintln!("{dtype:?}: max abs error against the decoded codes {worst:.3e}");
}

#[test]
fn e4m3_write_and_attention() {
    write_and_attend(DType::Fp8E4m3);
}

#[test]
fn e5m2_write_and_attention() {
    write_and_attend(DType::Fp8E5m2);
}
