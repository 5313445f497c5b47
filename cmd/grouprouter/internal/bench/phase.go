package bench

// phase writes a "phase: ..." line on stderr as a phase of the run starts,
// so that a run of minutes shows where it is.
func (b *bencher) phase(format string, args ...any) {
	b.logf("phase: "+format, args...)
}
