//go:build pagedkv_static

package pagedkv

// With -tags pagedkv_static: libpagedkv.a and the libraries it needs through
// pkg-config's pagedkv-static.pc; the binary needs no libpagedkv at run time.
// The link flags are in a file of their own, not a tag-qualified #cgo line:
// Go's build cache (seen with Go 1.19) keys on the files, not on which
// pkg-config packages their #cgo lines select, so a package built once
// without the tag would be reused with it.

// #cgo pkg-config: pagedkv-static
import "C"
