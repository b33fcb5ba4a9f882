package pagedkv

import "math"

// Conversions between float32 and the 16-bit bit patterns that f16 and
// bf16 pools take as []uint16. Rounding is to nearest, ties to even; NaN
// stays NaN.

// Float32ToBF16 rounds f to bfloat16.
func Float32ToBF16(f float32) uint16 {
	b := math.Float32bits(f)
	if f != f { // NaN: keep it quiet and a NaN after truncation
		return uint16(b>>16) | 0x40
	}
	b += 0x7fff + (b>>16)&1
	return uint16(b >> 16)
}

// BF16ToFloat32 widens a bfloat16 exactly.
func BF16ToFloat32(h uint16) float32 { return math.Float32frombits(uint32(h) << 16) }

// Float32ToF16 rounds f to IEEE 754 binary16 (overflow gives ±Inf).
func Float32ToF16(f float32) uint16 {
	b := math.Float32bits(f)
	sign := uint16(b>>16) & 0x8000
	exp := int32(b>>23) & 0xff
	mant := b & 0x7fffff
	switch {
	case exp == 0xff: // Inf or NaN
		if mant != 0 {
			return sign | 0x7e00
		}
		return sign | 0x7c00
	case exp-127 > 15: // too large even before rounding
		return sign | 0x7c00
	case exp-127 >= -14: // normal half
		e := uint32(exp-127+15) << 10
		m := mant >> 13
		rest := mant & 0x1fff
		v := e | m
		if rest > 0x1000 || (rest == 0x1000 && v&1 == 1) {
			v++ // may carry into the exponent, up to Inf: correct
		}
		return sign | uint16(v)
	case exp-127 >= -25: // subnormal half
		m := mant | 0x800000 // implicit one
		shift := uint32(-14-(exp-127)) + 13
		v := m >> shift
		rest := m & (1<<shift - 1)
		half := uint32(1) << (shift - 1)
		if rest > half || (rest == half && v&1 == 1) {
			v++
		}
		return sign | uint16(v)
	}
	return sign // underflow to ±0
}

// F16ToFloat32 widens a binary16 exactly.
func F16ToFloat32(h uint16) float32 {
	sign := uint32(h&0x8000) << 16
	exp := uint32(h>>10) & 0x1f
	mant := uint32(h & 0x3ff)
	switch {
	case exp == 0x1f:
		return math.Float32frombits(sign | 0x7f800000 | mant<<13)
	case exp != 0:
		return math.Float32frombits(sign | (exp+112)<<23 | mant<<13)
	case mant == 0:
		return math.Float32frombits(sign)
	}
	// Subnormal: value = mant * 2^-24.
	f := float32(mant) * (1.0 / (1 << 24))
	if sign != 0 {
		f = -f
	}
	return f
}

// ToBF16 converts a slice to bfloat16 bit patterns.
func ToBF16(src []float32) []uint16 {
	out := make([]uint16, len(src))
	for i, f := range src {
		out[i] = Float32ToBF16(f)
	}
	return out
}

// ToF16 converts a slice to binary16 bit patterns.
func ToF16(src []float32) []uint16 {
	out := make([]uint16, len(src))
	for i, f := range src {
		out[i] = Float32ToF16(f)
	}
	return out
}

// FromBF16 widens bfloat16 bit patterns.
func FromBF16(src []uint16) []float32 {
	out := make([]float32, len(src))
	for i, h := range src {
		out[i] = BF16ToFloat32(h)
	}
	return out
}

// FromF16 widens binary16 bit patterns.
func FromF16(src []uint16) []float32 {
	out := make([]float32, len(src))
	for i, h := range src {
		out[i] = F16ToFloat32(h)
	}
	return out
}
