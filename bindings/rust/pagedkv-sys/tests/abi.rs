//! Drift checks between the generated bindings, the headers and the library
//! actually loaded. The bindings are regenerated from the headers on every
//! build (build.rs), so what can drift is (a) how bindgen's clang lays out a
//! struct versus how the C compiler that built libpagedkv did, (b) the
//! loaded library versus the headers, and (c) what bindgen silently drops
//! (macros it cannot evaluate). Each is checked here against the other
//! side, never against numbers copied into this file.

use pagedkv_sys::*;
use std::ffi::CStr;
use std::mem::size_of;

fn header_text() -> String {
    let dir = std::path::Path::new(INCLUDE_DIR).join("pagedkv");
    let mut names: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().map_or(false, |x| x == "h"))
        .collect();
    names.sort();
    names
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect::<Vec<_>>()
        .join("\n")
}

#[test]
fn init_functions_report_the_rust_struct_sizes() {
    // Each _init writes its frozen size (docs/conventions.md, "Versioned
    // structs"), today sizeof(T) as the C compiler saw it when the library
    // was built. (Once a field is appended to one of these, its _init stays
    // at the old size: compare that one with its _init_sized instead.)
    unsafe {
        let mut p = pkv_pool_options::default();
        pkv_pool_options_init(&mut p);
        assert_eq!(p.struct_size as usize, size_of::<pkv_pool_options>());
        let mut s = pkv_seq_options::default();
        pkv_seq_options_init(&mut s);
        assert_eq!(s.struct_size as usize, size_of::<pkv_seq_options>());
        let mut h = pkv_hash_options::default();
        pkv_hash_options_init(&mut h);
        assert_eq!(h.struct_size as usize, size_of::<pkv_hash_options>());
        let mut a = pkv_attention_params::default();
        pkv_attention_params_init(&mut a);
        assert_eq!(a.struct_size as usize, size_of::<pkv_attention_params>());
        let mut st = pkv_pool_stats::default();
        pkv_pool_stats_init(&mut st);
        assert_eq!(st.struct_size as usize, size_of::<pkv_pool_stats>());
        let mut si = pkv_seq_info::default();
        pkv_seq_info_init(&mut si);
        assert_eq!(si.struct_size as usize, size_of::<pkv_seq_info>());
        let mut bi = pkv_batch_info::default();
        pkv_batch_info_init(&mut bi);
        assert_eq!(bi.struct_size as usize, size_of::<pkv_batch_info>());
    }
}

#[test]
fn init_sized_functions_are_generated_for_every_versioned_struct() {
    // bindgen picked up every pkv_X_init_sized (this would not compile
    // otherwise); each writes the size it is given as struct_size, and
    // refuses a size below the first released one.
    macro_rules! check_sized {
        ($($init:ident: $t:ty),* $(,)?) => {$(
            let mut s = <$t>::default();
            let st = unsafe { $init(&mut s, size_of::<$t>() as _) };
            assert_eq!(st, PKV_OK, stringify!($init));
            assert_eq!(s.struct_size as usize, size_of::<$t>(), stringify!($init));
            let st = unsafe { $init(&mut s, 4) };
            assert_eq!(st, PKV_E_INVALID_ARGUMENT, stringify!($init));
            assert_eq!(s.struct_size as usize, size_of::<$t>(), "a failed call wrote");
        )*};
    }
    check_sized!(
        pkv_pool_options_init_sized: pkv_pool_options,
        pkv_seq_options_init_sized: pkv_seq_options,
        pkv_hash_options_init_sized: pkv_hash_options,
        pkv_attention_params_init_sized: pkv_attention_params,
        pkv_batch_info_init_sized: pkv_batch_info,
        pkv_pool_stats_init_sized: pkv_pool_stats,
        pkv_seq_info_init_sized: pkv_seq_info,
        pkv_prefix_match_init_sized: pkv_prefix_match,
        pkv_event_publisher_options_init_sized: pkv_event_publisher_options,
        pkv_event_publisher_stats_init_sized: pkv_event_publisher_stats,
        pkv_kv_group_spec_init_sized: pkv_kv_group_spec,
        pkv_group_stats_init_sized: pkv_group_stats,
        pkv_tier_options_init_sized: pkv_tier_options,
        pkv_tier_match_init_sized: pkv_tier_match,
        pkv_tier_stats_init_sized: pkv_tier_stats,
        pkv_transfer_options_init_sized: pkv_transfer_options,
    );
}

#[test]
fn loaded_library_matches_the_headers() {
    unsafe {
        assert_eq!(pkv_abi_version(), PKV_ABI_VERSION);
        assert_eq!(pkv_version_number(), PKV_VERSION_NUMBER);
        let v = CStr::from_ptr(pkv_version_string()).to_bytes_with_nul();
        assert_eq!(v, &PKV_VERSION_STRING[..]);
    }
}

#[test]
fn tensor_init_fills_the_rust_layout() {
    // pkv_tensor has no struct_size: check the library writes each field
    // where Rust reads it.
    let shape = [3i64, 5, 7];
    let mut buf = [0f32; 105];
    let mut t = pkv_tensor::default();
    let st = unsafe {
        pkv_tensor_init(
            buf.as_mut_ptr().cast(),
            PKV_DTYPE_F32,
            PKV_DEVICE_CPU,
            0,
            3,
            shape.as_ptr(),
            &mut t,
        )
    };
    assert_eq!(st, PKV_OK);
    assert_eq!(t.data, buf.as_mut_ptr().cast());
    assert_eq!(
        (t.dtype, t.device_type, t.device_id, t.ndim),
        (PKV_DTYPE_F32, PKV_DEVICE_CPU, 0, 3)
    );
    assert_eq!(&t.shape[..3], &shape);
    assert_eq!(t.byte_offset, 0);
}

#[test]
fn dtype_sizes_match_rust_types() {
    unsafe {
        assert_eq!(pkv_dtype_size(PKV_DTYPE_F32) as usize, size_of::<f32>());
        assert_eq!(pkv_dtype_size(PKV_DTYPE_F16), 2);
        assert_eq!(pkv_dtype_size(PKV_DTYPE_BF16), 2);
        assert_eq!(pkv_dtype_size(PKV_DTYPE_I32) as usize, size_of::<i32>());
        assert_eq!(pkv_dtype_size(PKV_DTYPE_I64) as usize, size_of::<i64>());
        assert_eq!(pkv_hash_size(PKV_HASH_SHA256_CBOR), 32);
        assert!(pkv_hash_size(PKV_HASH_XXH3_128) as usize <= PKV_HASH_MAX_BYTES);
    }
}

#[test]
fn every_status_code_in_the_header_has_its_text() {
    // Each `#define PKV_E_NAME (-n)` in the header is a generated constant
    // whose library text names it.
    let text = header_text();
    let mut seen = 0;
    for line in text.lines() {
        let mut it = line.split_whitespace();
        if it.next() != Some("#define") {
            continue;
        }
        let name = it.next().unwrap_or("");
        if !name.starts_with("PKV_E_") {
            continue;
        }
        let value: i32 = it
            .next()
            .unwrap()
            .trim_matches(|c| c == '(' || c == ')')
            .parse()
            .unwrap();
        let s = unsafe { CStr::from_ptr(pkv_status_string(value)) }
            .to_str()
            .unwrap();
        assert!(s.starts_with(name), "{name} = {value}: library says {s:?}");
        seen += 1;
    }
    assert!(seen >= 10, "found {seen} status codes");
}

#[test]
fn hand_written_constants_match_the_header() {
    // bindgen cannot evaluate cast macros; lib.rs defines these by hand.
    let text = header_text();
    assert!(
        text.contains("#define PKV_SEQ_ID_INVALID ((pkv_seq_id)0)"),
        "PKV_SEQ_ID_INVALID changed in the header: update pagedkv-sys/src/lib.rs"
    );
    assert_eq!(PKV_SEQ_ID_INVALID, 0);
}

#[test]
fn last_error_copy_matches_last_error_message() {
    unsafe {
        let mut out = std::ptr::null_mut();
        let mut opts = pkv_pool_options::default();
        pkv_pool_options_init(&mut opts);
        opts.block_size = 0;
        assert_eq!(pkv_pool_create(&opts, &mut out), PKV_E_INVALID_ARGUMENT);
        assert!(out.is_null());
        let msg = CStr::from_ptr(pkv_last_error_message()).to_bytes().to_vec();
        assert!(!msg.is_empty());
        // Truncated copy: NUL-terminated within capacity, full length returned.
        let mut small = [0x55u8; 8];
        let n = pkv_last_error_copy(small.as_mut_ptr().cast(), small.len() as u64);
        assert_eq!(n as usize, msg.len());
        assert_eq!(&small[..7], &msg[..7]);
        assert_eq!(small[7], 0);
        let mut buf = vec![0u8; msg.len() + 1];
        pkv_last_error_copy(buf.as_mut_ptr().cast(), buf.len() as u64);
        assert_eq!(&buf[..msg.len()], &msg[..]);
        // A successful call clears it.
        assert_eq!(
            pkv_hash_root(
                PKV_HASH_SHA256_CBOR,
                b"\0".as_ptr().cast(),
                &mut pkv_block_hash::default()
            ),
            PKV_OK
        );
        assert_eq!(CStr::from_ptr(pkv_last_error_message()).to_bytes(), b"");
    }
}
