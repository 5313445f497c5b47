package scripttest

import (
	"reflect"
	"testing"
)

func TestParse(t *testing.T) {
	got := Parse("# a comment\nlive n1\n\ncmd a\ncmd b\n----\nout 1\nout 2\n\n\ncmd c\n----\n")
	want := []Block{
		{Cmds: []string{"# a comment", "live n1"}},
		{Cmds: []string{"cmd a", "cmd b"}, Want: []string{"out 1", "out 2"}},
		{Cmds: []string{"cmd c"}},
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("Parse = %+v, want %+v", got, want)
	}
}
