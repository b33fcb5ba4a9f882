//! Generates the raw bindings from the C headers and tells cargo how to link
//! libpagedkv.
//!
//! Where things come from, first match wins:
//! - headers: `PAGEDKV_INCLUDE_DIR`, else pkg-config's `includedir`, else
//!   `<PAGEDKV_LIB_DIR>/../include`, else the headers of the source tree this
//!   crate sits in (`capi/include`);
//! - library: `PAGEDKV_LIB_DIR`, else pkg-config's `libdir` (set
//!   `PKG_CONFIG_PATH` to `<cmake build>/pkgconfig` for an uninstalled build
//!   tree), else the linker's default search path.
//!
//! The bindings are always regenerated from the headers found (into
//! OUT_DIR), never checked in, so they cannot drift from the C ABI.
//!
//! Linking: the shared libpagedkv by default; with the `static` feature,
//! libpagedkv.a plus the libraries `pkg-config --static --libs pagedkv`
//! lists (libcrypto, libxxhash, libstdc++, ...; a fixed list without
//! pkg-config), so the final binary needs no libpagedkv at run time.
//!
//! Finding the shared library at run time: an rpath emitted here
//! (`rustc-link-arg`) reaches only this package's own tests; cargo passes it
//! to no dependent. Dependent crates get the directory as
//! `DEP_PAGEDKV_LIB_DIR` (links metadata) for their own build script to
//! emit `cargo:rustc-link-arg=-Wl,-rpath,<dir>`; bindings/rust/README.md
//! shows that and the other ways.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

#[derive(Debug)]
struct IntTypes;

impl bindgen::callbacks::ParseCallbacks for IntTypes {
    // The C ABI's constants are untyped #defines; give each the type of the
    // fields and arguments it is used with so no cast is needed in Rust.
    fn int_macro(&self, name: &str, _value: i64) -> Option<bindgen::callbacks::IntKind> {
        use bindgen::callbacks::IntKind;
        if name == "PKV_OK"
            || name.starts_with("PKV_E_")
            || name.starts_with("PKV_DEVICE_")
            || name == "PKV_NULL_BLOCK"
        {
            Some(IntKind::I32)
        } else if name == "PKV_HASH_MAX_BYTES" || name == "PKV_TENSOR_MAX_DIMS" {
            Some(IntKind::Custom {
                name: "usize",
                is_signed: false,
            })
        } else {
            None
        }
    }
}

fn pkg_config_var(var: &str) -> Option<PathBuf> {
    let exe = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(exe)
        .args([&format!("--variable={var}"), "pagedkv"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let s = s.trim();
    if s.is_empty() {
        None
    } else {
        Some(PathBuf::from(s))
    }
}

/// The `-l` and `-L` entries of `pkg-config --static --libs pagedkv`,
/// without libpagedkv itself; None without a usable pkg-config.
fn pkg_config_static_deps() -> Option<(Vec<String>, Vec<String>)> {
    let exe = env::var("PKG_CONFIG").unwrap_or_else(|_| "pkg-config".to_string());
    let out = Command::new(exe)
        .args(["--static", "--libs", "pagedkv"])
        .output()
        .ok()?;
    if !out.status.success() {
        return None;
    }
    let s = String::from_utf8(out.stdout).ok()?;
    let mut libs = Vec::new();
    let mut dirs = Vec::new();
    for tok in s.split_whitespace() {
        if let Some(l) = tok.strip_prefix("-l") {
            if l != "pagedkv" {
                libs.push(l.to_string());
            }
        } else if let Some(d) = tok.strip_prefix("-L") {
            dirs.push(d.to_string());
        }
    }
    Some((libs, dirs))
}

fn has_headers(dir: &Path) -> bool {
    dir.join("pagedkv").join("pagedkv.h").is_file()
}

fn main() {
    for var in [
        "PAGEDKV_LIB_DIR",
        "PAGEDKV_INCLUDE_DIR",
        "PKG_CONFIG",
        "PKG_CONFIG_PATH",
        "PKG_CONFIG_LIBDIR",
        "PKG_CONFIG_SYSROOT_DIR",
    ] {
        println!("cargo:rerun-if-env-changed={var}");
    }
    println!("cargo:rerun-if-changed=build.rs");

    let manifest_dir = PathBuf::from(env::var("CARGO_MANIFEST_DIR").unwrap());
    let source_tree_include = manifest_dir.join("../../../capi/include");

    let env_lib = env::var_os("PAGEDKV_LIB_DIR").map(PathBuf::from);
    let env_inc = env::var_os("PAGEDKV_INCLUDE_DIR").map(PathBuf::from);
    let (pc_lib, pc_inc) = if env_lib.is_some() {
        (None, None)
    } else {
        (pkg_config_var("libdir"), pkg_config_var("includedir"))
    };

    let lib_dir = env_lib.or(pc_lib);
    let include_dir = env_inc
        .or(pc_inc)
        .filter(|d| has_headers(d))
        .or_else(|| {
            lib_dir
                .as_ref()
                .map(|l| l.join("../include"))
                .filter(|d| has_headers(d))
        })
        .or_else(|| Some(source_tree_include.clone()).filter(|d| has_headers(d)))
        .unwrap_or_else(|| {
            panic!(
                "pagedkv-sys: cannot find pagedkv/pagedkv.h. Set PAGEDKV_INCLUDE_DIR, or \
                 PKG_CONFIG_PATH to a directory holding pagedkv.pc"
            )
        });
    let include_dir = include_dir.canonicalize().unwrap_or(include_dir);

    // Regenerate whenever any public header changes.
    let header_dir = include_dir.join("pagedkv");
    let mut headers: Vec<PathBuf> = std::fs::read_dir(&header_dir)
        .expect("read header dir")
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| p.extension().map_or(false, |x| x == "h"))
        .collect();
    headers.sort();
    println!("cargo:rerun-if-changed={}", header_dir.display());
    for h in &headers {
        println!("cargo:rerun-if-changed={}", h.display());
    }

    let bindings = bindgen::Builder::default()
        .header(header_dir.join("pagedkv.h").to_string_lossy())
        .clang_arg(format!("-I{}", include_dir.display()))
        .allowlist_function("pkv_.*")
        .allowlist_type("pkv_.*")
        .allowlist_var("PKV_.*")
        .parse_callbacks(Box::new(IntTypes))
        .derive_default(true)
        .derive_debug(true)
        .layout_tests(true)
        .generate()
        .expect("pagedkv-sys: bindgen failed on pagedkv.h");
    let out = PathBuf::from(env::var("OUT_DIR").unwrap()).join("bindings.rs");
    bindings.write_to_file(&out).expect("write bindings.rs");

    let static_link = env::var_os("CARGO_FEATURE_STATIC").is_some();
    if let Some(dir) = &lib_dir {
        println!("cargo:rustc-link-search=native={}", dir.display());
        if !static_link {
            // Lets this crate's own tests run against an uninstalled library;
            // dependents read DEP_PAGEDKV_LIB_DIR to do the same.
            println!("cargo:rustc-link-arg=-Wl,-rpath,{}", dir.display());
        }
        println!("cargo:lib_dir={}", dir.display());
    }
    if static_link {
        println!("cargo:rustc-link-lib=static=pagedkv");
        let (libs, dirs) = pkg_config_static_deps().unwrap_or_else(|| {
            let fixed = ["crypto", "xxhash", "stdc++", "m", "pthread"];
            (fixed.iter().map(|s| s.to_string()).collect(), Vec::new())
        });
        for d in dirs {
            println!("cargo:rustc-link-search=native={d}");
        }
        for l in libs {
            println!("cargo:rustc-link-lib={l}");
        }
    } else {
        println!("cargo:rustc-link-lib=dylib=pagedkv");
    }
    println!("cargo:include={}", include_dir.display());
    println!(
        "cargo:rustc-env=PAGEDKV_SYS_INCLUDE_DIR={}",
        include_dir.display()
    );
}
