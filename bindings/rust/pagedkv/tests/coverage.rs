//! Drift check between the C headers and this safe crate: everything the
//! headers declare must be bound. The raw bindings are regenerated from the
//! headers on every build, but a function, status code or constant added
//! to a header would otherwise go unnoticed by the safe API; this test
//! fails until the binding wraps it (or lists it below with a reason).

use std::collections::BTreeSet;
use std::path::Path;

use pagedkv::{DType, ErrorKind};

/// Constants the safe crate intentionally does not mention.
const NOT_WRAPPED: &[(&str, &str)] = &[
    ("PKV_VERSION_MAJOR", "HEADER_VERSION_NUMBER carries it"),
    ("PKV_VERSION_MINOR", "HEADER_VERSION_NUMBER carries it"),
    ("PKV_VERSION_PATCH", "HEADER_VERSION_NUMBER carries it"),
    ("PKV_VERSION_STRING", "HEADER_VERSION_NUMBER carries it"),
    (
        "PKV_HASH_OPTIONS_VERSION",
        "struct_size, set by _init, versions the struct",
    ),
    (
        "PKV_MEDIUM_DEVICE",
        "the pool itself: Medium names only the tiers, which have stats",
    ),
    (
        "PKV_TOKEN_END",
        "UINT64_MAX, which bindgen does not evaluate: RetentionRange::END is u64::MAX",
    ),
];

/// Functions the safe crate intentionally does not call.
const NOT_CALLED: &[(&str, &str)] = &[(
    "pkv_last_error_message",
    "errors capture the same text with pkv_last_error_copy (see pagedkv-sys tests/abi.rs)",
)];

fn headers() -> String {
    let dir = Path::new(pagedkv::sys::INCLUDE_DIR).join("pagedkv");
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().map_or(false, |x| x == "h"))
        .collect();
    files.sort();
    assert!(files.len() >= 5, "headers in {}", dir.display());
    files
        .iter()
        .map(|p| std::fs::read_to_string(p).unwrap())
        .collect()
}

fn sources() -> String {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("src");
    std::fs::read_dir(dir)
        .unwrap()
        .map(|e| std::fs::read_to_string(e.unwrap().path()).unwrap())
        .collect()
}

/// `PKV_API <type> name(` -> name (the identifier right before the '(').
fn header_functions(h: &str) -> BTreeSet<String> {
    h.lines()
        .filter(|l| l.trim_start().starts_with("PKV_API"))
        .filter_map(|l| {
            let head = &l[..l.find('(')?];
            let name = head
                .rsplit(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
                .next()?;
            Some(name.to_string()).filter(|n| n.starts_with("pkv_"))
        })
        .collect()
}

fn header_defines(h: &str) -> Vec<(String, Option<i64>)> {
    h.lines()
        .filter_map(|l| {
            let mut it = l.split_whitespace();
            if it.next() != Some("#define") {
                return None;
            }
            let name = it.next()?;
            if !name.starts_with("PKV_") || name == "PKV_API" {
                return None;
            }
            let value = it.next().and_then(|v| {
                v.trim_matches(|c| c == '(' || c == ')')
                    .trim_end_matches('u')
                    .parse::<i64>()
                    .ok()
                    .or_else(|| {
                        i64::from_str_radix(v.trim_start_matches("0x").trim_end_matches('u'), 16)
                            .ok()
                            .filter(|_| v.starts_with("0x"))
                    })
            });
            Some((name.to_string(), value))
        })
        .collect()
}

#[test]
fn every_header_function_is_wrapped() {
    let fns = header_functions(&headers());
    assert!(fns.len() >= 40, "parsed only {} functions", fns.len());
    let src = sources();
    // Called, or handed to init_sized! (which calls it with the struct's size).
    let wrapped =
        |f: &str| src.contains(&format!("sys::{f}(")) || src.contains(&format!("sys::{f},"));
    let missing: Vec<_> = fns
        .iter()
        .filter(|f| !NOT_CALLED.iter().any(|(n, _)| n == f))
        // A plain pkv_X_init stops at the size the library froze: the crate
        // calls pkv_X_init_sized with its own size_of instead.
        .filter(|f| !(f.ends_with("_init") && wrapped(&format!("{f}_sized"))))
        .filter(|f| !wrapped(f))
        .collect();
    assert!(
        missing.is_empty(),
        "not wrapped by the safe crate: {missing:?}"
    );
}

#[test]
fn every_header_constant_is_used() {
    let src = sources();
    let missing: Vec<_> = header_defines(&headers())
        .into_iter()
        .map(|(n, _)| n)
        .filter(|n| !NOT_WRAPPED.iter().any(|(s, _)| s == n))
        .filter(|n| !src.contains(&format!("sys::{n}")))
        .collect();
    assert!(
        missing.is_empty(),
        "constants the safe crate ignores: {missing:?}"
    );
}

#[test]
fn every_status_code_has_its_own_error_kind() {
    let mut kinds = BTreeSet::new();
    for (name, value) in header_defines(&headers()) {
        if !name.starts_with("PKV_E_") {
            continue;
        }
        let code = value.unwrap() as i32;
        let kind = ErrorKind::from_code(code);
        assert_ne!(kind, ErrorKind::Other, "{name} has no ErrorKind");
        assert_eq!(kind.code(), Some(code), "{name}");
        assert!(kinds.insert(format!("{kind:?}")), "{name} shares a kind");
    }
    assert_eq!(kinds.len(), 10);
    assert_eq!(ErrorKind::from_code(-12345), ErrorKind::Other);
}

#[test]
fn every_dtype_round_trips() {
    for (name, value) in header_defines(&headers()) {
        if let Some(rest) = name.strip_prefix("PKV_DTYPE_") {
            let d = DType::from_raw(value.unwrap() as u32).unwrap_or_else(|| panic!("{name}"));
            assert_eq!(d.raw() as i64, value.unwrap());
            // FP8_E4M3 is the variant Fp8E4m3.
            assert_eq!(format!("{d:?}").to_uppercase(), rest.replace('_', ""));
        }
    }
}
