package integration

// The long fault runs (the nemesis, the partition scenarios, the takeover
// of many groups, batches across faults) call t.Parallel: each owns its
// servers, its nodes and its ports, and spends most of its time waiting
// for a fault's hold or a grace period to pass, so they overlap those
// waits two at a time (go test's -parallel is GOMAXPROCS) after the other
// tests of the package have run. They are written to hold under load
// (two busy loops alongside), which running beside each other adds.
