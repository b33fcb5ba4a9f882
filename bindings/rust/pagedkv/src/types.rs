//! Small value types shared by the rest of the crate: element types,
//! devices, hash algorithms and block hashes.

use std::fmt;

use pagedkv_sys as sys;

use crate::error::{Error, Result};

/// Element type of a tensor or of the pool's KV storage.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum DType {
    F32,
    F16,
    BF16,
    I32,
    I64,
    /// OCP FP8 E4M3 (max 448, no infinities): KV storage only.
    Fp8E4m3,
    /// OCP FP8 E5M2 (max 57344): KV storage only.
    Fp8E5m2,
}

impl DType {
    /// The `PKV_DTYPE_*` value.
    pub fn raw(self) -> u32 {
        match self {
            DType::F32 => sys::PKV_DTYPE_F32,
            DType::F16 => sys::PKV_DTYPE_F16,
            DType::BF16 => sys::PKV_DTYPE_BF16,
            DType::I32 => sys::PKV_DTYPE_I32,
            DType::I64 => sys::PKV_DTYPE_I64,
            DType::Fp8E4m3 => sys::PKV_DTYPE_FP8_E4M3,
            DType::Fp8E5m2 => sys::PKV_DTYPE_FP8_E5M2,
        }
    }

    /// The dtype of a `PKV_DTYPE_*` value, `None` if unknown.
    pub fn from_raw(raw: u32) -> Option<DType> {
        Some(match raw {
            sys::PKV_DTYPE_F32 => DType::F32,
            sys::PKV_DTYPE_F16 => DType::F16,
            sys::PKV_DTYPE_BF16 => DType::BF16,
            sys::PKV_DTYPE_I32 => DType::I32,
            sys::PKV_DTYPE_I64 => DType::I64,
            sys::PKV_DTYPE_FP8_E4M3 => DType::Fp8E4m3,
            sys::PKV_DTYPE_FP8_E5M2 => DType::Fp8E5m2,
            _ => return None,
        })
    }

    /// Bytes per element, as the library reports it.
    pub fn size(self) -> usize {
        // SAFETY: pure function of its argument.
        unsafe { sys::pkv_dtype_size(self.raw()) as usize }
    }
}

/// Where a tensor or a pool's storage lives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Device {
    Cpu,
    /// A CUDA device by ordinal.
    Cuda(i32),
}

impl Device {
    pub(crate) fn raw(self) -> (i32, i32) {
        match self {
            Device::Cpu => (sys::PKV_DEVICE_CPU, 0),
            Device::Cuda(id) => (sys::PKV_DEVICE_CUDA, id),
        }
    }

    pub(crate) fn from_raw(device_type: i32, device_id: i32) -> Result<Device> {
        match device_type {
            sys::PKV_DEVICE_CPU => Ok(Device::Cpu),
            sys::PKV_DEVICE_CUDA => Ok(Device::Cuda(device_id)),
            other => Err(Error::new(
                crate::ErrorKind::Internal,
                format!("library reported unknown device type {other}"),
            )),
        }
    }
}

mod sealed {
    pub trait Sealed {}
}

/// Rust types that map to a pagedkv dtype: `f32`, [`half::f16`],
/// [`half::bf16`], `i32`, `i64`, and the FP8 code types [`Fp8E4m3`] and
/// [`Fp8E5m2`] (KV storage only). Sealed: the set is the C ABI's.
pub trait Element: sealed::Sealed + Copy + Send + Sync + 'static {
    /// The matching dtype.
    const DTYPE: DType;
}

macro_rules! element {
    ($t:ty, $d:ident) => {
        impl sealed::Sealed for $t {}
        impl Element for $t {
            const DTYPE: DType = DType::$d;
        }
    };
}
element!(f32, F32);
element!(half::f16, F16);
element!(half::bf16, BF16);
element!(i32, I32);
element!(i64, I64);
element!(Fp8E4m3, Fp8E4m3);
element!(Fp8E5m2, Fp8E5m2);

/// One stored code of an FP8 E4M3 pool, as [`Pool::read_kv_block`](crate::Pool::read_kv_block)
/// returns it; its value is `to_f32() * scale` (the pool's K or V scale).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Fp8E4m3(pub u8);

/// One stored code of an FP8 E5M2 pool (see [`Fp8E4m3`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
#[repr(transparent)]
pub struct Fp8E5m2(pub u8);

// The value of an FP8 code with `mbits` mantissa bits and exponent `bias`
// (E5M2's top exponent holds infinities and NaN; E4M3's 0x7f is NaN).
fn fp8_value(code: u8, mbits: u32, bias: i32, ieee_top: bool) -> f32 {
    let sign = if code & 0x80 != 0 { -1.0f32 } else { 1.0 };
    let e = i32::from(code & 0x7f) >> mbits;
    let m = f32::from(code & ((1u8 << mbits) - 1));
    let top = (1i32 << (7 - mbits)) - 1;
    if !ieee_top && code & 0x7f == 0x7f {
        return f32::NAN;
    }
    if ieee_top && e == top {
        return if m != 0.0 {
            f32::NAN
        } else {
            sign * f32::INFINITY
        };
    }
    let scale = (1u32 << mbits) as f32;
    if e == 0 {
        sign * m / scale * 2f32.powi(1 - bias)
    } else {
        sign * (1.0 + m / scale) * 2f32.powi(e - bias)
    }
}

impl Fp8E4m3 {
    /// The code's value (exact; NaN for 0x7f/0xff).
    pub fn to_f32(self) -> f32 {
        fp8_value(self.0, 3, 7, false)
    }
}

impl Fp8E5m2 {
    /// The code's value (exact; infinities and NaN as IEEE).
    pub fn to_f32(self) -> f32 {
        fp8_value(self.0, 2, 15, true)
    }
}

/// How an FP8 pool's K/V scales are given: one K and one V scale per layer
/// (as vLLM's k_scale/v_scale), or one per layer and KV head.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvScaleGranularity {
    #[default]
    PerTensor,
    PerHead,
}

impl KvScaleGranularity {
    pub(crate) fn raw(self) -> u32 {
        match self {
            KvScaleGranularity::PerTensor => sys::PKV_KV_SCALE_PER_TENSOR,
            KvScaleGranularity::PerHead => sys::PKV_KV_SCALE_PER_HEAD,
        }
    }
}

/// KV page layout of a pool: K and V per layer (MHA, the default), or one
/// latent tensor per layer (MLA: DeepSeek V2/V3, Kimi), `[num_blocks,
/// block_size, kv_lora_rank + qk_rope_head_dim]`, written with
/// [`Batch::mla_cache_write`](crate::Batch::mla_cache_write) and read by
/// [`Batch::mla_attention`](crate::Batch::mla_attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum KvLayout {
    #[default]
    Mha,
    Mla,
}

impl KvLayout {
    pub(crate) fn raw(self) -> u32 {
        match self {
            KvLayout::Mha => sys::PKV_KV_LAYOUT_MHA,
            KvLayout::Mla => sys::PKV_KV_LAYOUT_MLA,
        }
    }
    pub(crate) fn from_raw(v: u32) -> Option<KvLayout> {
        match v {
            sys::PKV_KV_LAYOUT_MHA => Some(KvLayout::Mha),
            sys::PKV_KV_LAYOUT_MLA => Some(KvLayout::Mla),
            _ => None,
        }
    }
}

/// Block hash function of the prefix cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Default)]
pub enum HashAlgo {
    /// SHA-256 over canonical CBOR; byte-compatible with vLLM's
    /// `sha256_cbor`. Collision resistant: safe across tenants. The default.
    #[default]
    Sha256Cbor,
    /// XXH3-128 over the same bytes: fast, for trusted tenants.
    Xxh3_128,
}

impl HashAlgo {
    /// The `PKV_HASH_*` value.
    pub fn raw(self) -> u32 {
        match self {
            HashAlgo::Sha256Cbor => sys::PKV_HASH_SHA256_CBOR,
            HashAlgo::Xxh3_128 => sys::PKV_HASH_XXH3_128,
        }
    }

    /// The algorithm of a `PKV_HASH_*` value, `None` if unknown.
    pub fn from_raw(raw: u32) -> Option<HashAlgo> {
        match raw {
            sys::PKV_HASH_SHA256_CBOR => Some(HashAlgo::Sha256Cbor),
            sys::PKV_HASH_XXH3_128 => Some(HashAlgo::Xxh3_128),
            _ => None,
        }
    }

    /// Digest length in bytes (32 for SHA-256, 16 for XXH3-128).
    pub fn digest_len(self) -> usize {
        // SAFETY: pure function of its argument.
        unsafe { sys::pkv_hash_size(self.raw()) as usize }
    }
}

/// A block hash: `PKV_HASH_MAX_BYTES` bytes, shorter digests zero-padded.
#[derive(Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct BlockHash(pub [u8; sys::PKV_HASH_MAX_BYTES]);

impl BlockHash {
    /// All stored bytes (a 16-byte digest is followed by zeros).
    pub fn as_bytes(&self) -> &[u8; sys::PKV_HASH_MAX_BYTES] {
        &self.0
    }

    /// The meaningful bytes for `algo`.
    pub fn digest(&self, algo: HashAlgo) -> &[u8] {
        &self.0[..algo.digest_len().min(self.0.len())]
    }

    /// Lower-case hex of all stored bytes.
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    pub(crate) fn from_raw(raw: &sys::pkv_block_hash) -> BlockHash {
        BlockHash(raw.bytes)
    }
}

impl fmt::Debug for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "BlockHash({})", self.to_hex())
    }
}

impl fmt::Display for BlockHash {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.to_hex())
    }
}

/// What the loaded library was built with (`pkv_features()`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Features(u32);

impl Features {
    /// The CUDA backend is compiled in.
    pub fn cuda(self) -> bool {
        self.0 & sys::PKV_FEATURE_CUDA != 0
    }
    /// [`HashAlgo::Xxh3_128`] is available.
    pub fn xxhash(self) -> bool {
        self.0 & sys::PKV_FEATURE_XXHASH != 0
    }
    /// [`HashAlgo::Sha256Cbor`] is available.
    pub fn sha256(self) -> bool {
        self.0 & sys::PKV_FEATURE_SHA256 != 0
    }
    /// bf16 storage and kernels.
    pub fn bf16(self) -> bool {
        self.0 & sys::PKV_FEATURE_BF16 != 0
    }
    /// FP8 (E4M3, E5M2) KV storage and kernels.
    pub fn fp8(self) -> bool {
        self.0 & sys::PKV_FEATURE_FP8 != 0
    }
    /// The raw `PKV_FEATURE_*` bit set.
    pub fn bits(self) -> u32 {
        self.0
    }
}

/// Features of the loaded library.
pub fn features() -> Features {
    // SAFETY: no arguments, no state.
    Features(unsafe { sys::pkv_features() })
}

/// Version of the loaded library, `"MAJOR.MINOR.PATCH"`.
pub fn version_string() -> &'static str {
    // SAFETY: static NUL-terminated ASCII text, never NULL.
    unsafe { std::ffi::CStr::from_ptr(sys::pkv_version_string()) }
        .to_str()
        .unwrap_or("")
}

/// Version of the loaded library as `MAJOR*10000 + MINOR*100 + PATCH`.
pub fn version_number() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::pkv_version_number() }
}

/// ABI version of the loaded library; equals [`HEADER_ABI_VERSION`] when
/// the library matches the headers these bindings were generated from.
pub fn abi_version() -> u32 {
    // SAFETY: no arguments.
    unsafe { sys::pkv_abi_version() }
}

/// `PKV_ABI_VERSION` of the headers the bindings were generated from.
pub const HEADER_ABI_VERSION: u32 = sys::PKV_ABI_VERSION;
/// `PKV_VERSION_NUMBER` of the headers the bindings were generated from.
pub const HEADER_VERSION_NUMBER: u32 = sys::PKV_VERSION_NUMBER;

/// Number of CUDA devices the library sees; 0 without CUDA or a GPU.
pub fn cuda_device_count() -> usize {
    // SAFETY: no arguments; never fails.
    let n = unsafe { sys::pkv_cuda_device_count() };
    n.max(0) as usize
}
