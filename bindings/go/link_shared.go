//go:build !pagedkv_static

package pagedkv

// The shared libpagedkv through pkg-config's pagedkv.pc, whose Libs carry an
// rpath to its libdir: the binary runs without LD_LIBRARY_PATH as long as the
// library stays where it was installed.

// #cgo pkg-config: pagedkv
import "C"
