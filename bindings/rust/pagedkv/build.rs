// Lets this crate's tests, doc tests and examples run against an
// uninstalled libpagedkv: pagedkv-sys passes the directory it linked from
// (links metadata), and an rpath to it goes into this package's own
// binaries. rustc-link-arg never reaches crates that depend on pagedkv.
fn main() {
    println!("cargo:rerun-if-env-changed=DEP_PAGEDKV_LIB_DIR");
    if let Ok(dir) = std::env::var("DEP_PAGEDKV_LIB_DIR") {
        println!("cargo:rustc-link-arg=-Wl,-rpath,{dir}");
    }
}
