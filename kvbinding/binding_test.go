package kvbinding

import "testing"

// TestPhaseRecordRoundTrip: every phase's State and Step read back as the
// phase; every valid pairing of a state and a step has a phase that gives
// them back; the binding cache keeps a record's phase (its codes are
// phases) and returns its State and Step.
func TestPhaseRecordRoundTrip(t *testing.T) {
	for p := PhaseBound; p <= PhaseDeadLettered; p++ {
		st, step := p.Record()
		if got := (Binding{State: st, Step: step}).Phase(); got != p {
			t.Errorf("phase %d: record (%q, %q) reads back as phase %d", p, st, step, got)
		}
	}
	if st, step := PhaseNone.Record(); st != "" || step != StepNone {
		t.Errorf("PhaseNone's record: (%q, %q)", st, step)
	}
	for _, st := range []State{StateBound, StateMoving, StateReleased, StateDeadLettered} {
		for _, step := range []Step{StepNone, StepDrain, StepCatchUp} {
			b := Binding{Group: "g", State: st, Step: step, Node: "n1", PrevNode: "n0", FromSeq: 1, ThroughSeq: 1}
			if st == StateReleased || st == StateDeadLettered {
				b.Node = ""
			}
			if step == StepDrain {
				b.Drain = []string{"n0"}
			}
			gst, gstep := b.Phase().Record()
			valid := st == StateBound || step == StepNone
			if valid && (gst != st || gstep != step) {
				t.Errorf("(%q, %q): phase %d gives back (%q, %q)", st, step, b.Phase(), gst, gstep)
			}
			if !valid && gst != st {
				t.Errorf("(%q, %q), not a valid pairing: phase %d has state %q", st, step, b.Phase(), gst)
			}
		}
	}
	if (Binding{State: StateBound, Invalid: true}).Phase() != PhaseNone {
		t.Error("an invalid record has a phase")
	}
	if !(Binding{State: StateBound, Invalid: true}).Stored() || (Binding{}).Stored() {
		t.Error("Stored: an invalid record is stored, the zero Binding is not")
	}
}

// Ckpt, like Routed, belongs to a record in a hand-over step.
func TestValidateCkptOnlyInAStep(t *testing.T) {
	step := Binding{Group: "g", State: StateBound, Node: "n2", FromSeq: 5, PrevNode: "n1", Step: StepCatchUp, Ckpt: 9}
	if err := step.Validate(); err != nil {
		t.Errorf("a catch-up record with ckpt: %v", err)
	}
	settled := step
	settled.Step = StepNone
	if err := settled.Validate(); err == nil {
		t.Error("a settled record with ckpt is valid")
	}
}
