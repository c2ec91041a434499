package main

// Log-linear latency histogram (HDR-style, ~3% resolution): constant-time
// recording with no allocation, cheap to merge across goroutines.

import "math/bits"

const (
	histSubBits = 6
	histHalf    = 1 << (histSubBits - 1)
	histBuckets = (1 << histSubBits) + (64-histSubBits)*histHalf
)

type histogram struct {
	counts [histBuckets]uint64
	total  uint64
}

func histIndex(v uint64) int {
	if v < 1<<histSubBits {
		return int(v)
	}
	shift := bits.Len64(v) - histSubBits
	mant := v >> uint(shift) // in [32, 63]
	return (1 << histSubBits) + (shift-1)*histHalf + int(mant-histHalf)
}

// histValue returns the midpoint of bucket i.
func histValue(i int) uint64 {
	if i < 1<<histSubBits {
		return uint64(i)
	}
	j := i - (1 << histSubBits)
	shift := j/histHalf + 1
	mant := uint64(j%histHalf + histHalf)
	return mant<<uint(shift) + (uint64(1)<<uint(shift))/2
}

func (h *histogram) record(v int64) {
	if v < 0 {
		v = 0
	}
	h.counts[histIndex(uint64(v))]++
	h.total++
}

func (h *histogram) merge(o *histogram) {
	for i, c := range o.counts {
		h.counts[i] += c
	}
	h.total += o.total
}

// quantile returns the value at quantile q (0..1), or 0 when empty.
func (h *histogram) quantile(q float64) uint64 {
	if h.total == 0 {
		return 0
	}
	rank := uint64(q*float64(h.total-1)) + 1
	var seen uint64
	for i, c := range h.counts {
		seen += c
		if seen >= rank {
			return histValue(i)
		}
	}
	return histValue(histBuckets - 1)
}
