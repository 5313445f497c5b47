package consumer

// SetParkedHook sets a function run after each message is published to the
// parked stream, before its record is touched; nil removes it. Set it only
// while no Consume runs.
func SetParkedHook(f func(group string, seq uint64)) { parkedHook = f }
