//! Block hashing without a pool: what a router needs to predict
//! prefix-cache hits.

use std::ffi::CString;
use std::os::raw::c_char;
use std::ptr;

use pagedkv_sys as sys;

use crate::error::{check, Error, ErrorKind, Result};
use crate::types::{BlockHash, HashAlgo};

/// A multimodal item occupying tokens `[offset, offset + length)` of a
/// prompt, identified by a content hash string (e.g. the image digest).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MmItem {
    pub offset: u64,
    pub length: u64,
    pub hash: String,
}

/// `pkv_mm_item`s with the C strings they point to, alive as long as this.
pub(crate) struct RawMmItems {
    _strings: Vec<CString>,
    items: Vec<sys::pkv_mm_item>,
}

impl RawMmItems {
    pub(crate) fn new(items: &[MmItem], what: &str) -> Result<RawMmItems> {
        let mut strings = Vec::with_capacity(items.len());
        let mut raw = Vec::with_capacity(items.len());
        for (i, it) in items.iter().enumerate() {
            let s = c_string(&it.hash, &format!("{what}[{i}].hash"))?;
            raw.push(sys::pkv_mm_item {
                offset: it.offset,
                length: it.length,
                hash: s.as_ptr(),
            });
            strings.push(s);
        }
        Ok(RawMmItems {
            _strings: strings,
            items: raw,
        })
    }

    pub(crate) fn ptr(&self) -> *const sys::pkv_mm_item {
        if self.items.is_empty() {
            ptr::null()
        } else {
            self.items.as_ptr()
        }
    }

    pub(crate) fn len(&self) -> Result<u32> {
        u32::try_from(self.items.len()).map_err(|_| Error::invalid("mm_items: too many items"))
    }
}

pub(crate) fn c_string(s: &str, what: &str) -> Result<CString> {
    CString::new(s).map_err(|_| Error::invalid(format!("{what}: contains a NUL byte")))
}

pub(crate) fn opt_c_string(s: &Option<String>, what: &str) -> Result<Option<CString>> {
    s.as_deref().map(|s| c_string(s, what)).transpose()
}

pub(crate) fn opt_ptr(s: &Option<CString>) -> *const c_char {
    s.as_ref().map_or(ptr::null(), |s| s.as_ptr())
}

/// How to hash a token prefix; the defaults match a pool's defaults.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HashOptions {
    pub algo: HashAlgo,
    /// Tokens per block.
    pub block_size: u32,
    /// Root seed string (vLLM's `PYTHONHASHSEED`).
    pub seed: String,
    /// 0 = no LoRA.
    pub lora_id: u64,
    /// The LoRA adapter's name, keyed in every block (current vLLM keys
    /// adapters by name; older vLLM by id). `None` or "" = none.
    pub lora_name: Option<String>,
    /// The adapter's path, keyed with `lora_name` with `vllm_tagged_keys`
    /// (as [`SeqOptions::lora_path`](crate::SeqOptions::lora_path));
    /// ignored otherwise. `None` = "".
    pub lora_path: Option<String>,
    /// Hashed into the first block.
    pub cache_salt: Option<String>,
    /// Sorted by offset, non-overlapping.
    pub mm_items: Vec<MmItem>,
    /// Hash like a pool created with
    /// [`PoolOptions::strict_key_domains`](crate::PoolOptions::strict_key_domains).
    pub strict_key_domains: bool,
    /// Hash like a pool created with
    /// [`PoolOptions::vllm_tagged_keys`](crate::PoolOptions::vllm_tagged_keys)
    /// (vLLM 0.33's tagged keys). Not together with `strict_key_domains`.
    pub vllm_tagged_keys: bool,
}

impl Default for HashOptions {
    fn default() -> HashOptions {
        let raw = init_sized!(sys::pkv_hash_options_init_sized, sys::pkv_hash_options)
            .expect("the sized init of a struct of its own size");
        HashOptions {
            algo: HashAlgo::from_raw(raw.algo).unwrap_or_default(),
            block_size: raw.block_size,
            // SAFETY: the seed the library sets is a static string ("never
            // NULL after _init").
            seed: unsafe { crate::cstr_to_string(raw.seed) },
            lora_id: raw.lora_id,
            lora_name: None,
            lora_path: None,
            cache_salt: None,
            mm_items: Vec::new(),
            strict_key_domains: raw.strict_key_domains == sys::PKV_KEY_DOMAINS_STRICT,
            vllm_tagged_keys: raw.strict_key_domains == sys::PKV_KEY_DOMAINS_VLLM_TAGGED,
        }
    }
}

/// Hashes of the full blocks of `tokens`
/// (`tokens.len() / block_size` of them), chained as the prefix cache
/// chains them.
///
/// ```
/// use pagedkv::{hash_prefix, HashOptions};
/// let opts = HashOptions { block_size: 4, ..HashOptions::default() };
/// let tokens: Vec<i32> = (0..10).collect();
/// let hashes = hash_prefix(&opts, &tokens).unwrap();
/// assert_eq!(hashes.len(), 2); // the partial third block is not hashed
/// // The first hash depends only on the first block.
/// assert_eq!(hash_prefix(&opts, &tokens[..4]).unwrap()[0], hashes[0]);
/// ```
pub fn hash_prefix(opts: &HashOptions, tokens: &[i32]) -> Result<Vec<BlockHash>> {
    let seed = c_string(&opts.seed, "HashOptions::seed")?;
    let salt = opt_c_string(&opts.cache_salt, "HashOptions::cache_salt")?;
    let lora_name = opt_c_string(&opts.lora_name, "HashOptions::lora_name")?;
    let lora_path = opt_c_string(&opts.lora_path, "HashOptions::lora_path")?;
    let domains = crate::pool::key_domains(opts.strict_key_domains, opts.vllm_tagged_keys)?;
    let mm = RawMmItems::new(&opts.mm_items, "HashOptions::mm_items")?;
    let mut raw = init_sized!(sys::pkv_hash_options_init_sized, sys::pkv_hash_options)?;
    raw.algo = opts.algo.raw();
    raw.block_size = opts.block_size;
    raw.seed = seed.as_ptr();
    raw.lora_id = opts.lora_id;
    raw.lora_name = opt_ptr(&lora_name);
    raw.lora_path = opt_ptr(&lora_path);
    raw.cache_salt = opt_ptr(&salt);
    raw.mm_items = mm.ptr();
    raw.num_mm_items = mm.len()?;
    raw.strict_key_domains = domains;

    let mut cap = if opts.block_size > 0 {
        tokens.len() / opts.block_size as usize
    } else {
        0
    };
    for _ in 0..2 {
        let mut out = vec![sys::pkv_block_hash::default(); cap];
        let mut n = 0u64;
        // SAFETY: tokens and out are valid for their lengths; every pointer
        // in raw outlives the call.
        let status = unsafe {
            sys::pkv_hash_prefix(
                &raw,
                tokens.as_ptr(),
                tokens.len() as u64,
                out.as_mut_ptr(),
                cap as u64,
                &mut n,
            )
        };
        if status == sys::PKV_E_BUFFER_TOO_SMALL && n as usize > cap {
            cap = n as usize;
            continue;
        }
        check(status)?;
        out.truncate(n as usize);
        return Ok(out.iter().map(BlockHash::from_raw).collect());
    }
    Err(Error::new(
        ErrorKind::Internal,
        "pkv_hash_prefix kept asking for a larger buffer",
    ))
}

/// The root hash `h_{-1}` for `algo` and `seed`: the parent of every
/// sequence's first block.
pub fn hash_root(algo: HashAlgo, seed: &str) -> Result<BlockHash> {
    let seed = c_string(seed, "seed")?;
    let mut out = sys::pkv_block_hash::default();
    // SAFETY: seed is NUL-terminated; out is a valid out-parameter.
    check(unsafe { sys::pkv_hash_root(algo.raw(), seed.as_ptr(), &mut out) })?;
    Ok(BlockHash::from_raw(&out))
}
