package main

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/grouprouter/grouprouter/router"
)

// The two blocks exactly as the HornetQ/Artemis documentation prints them.
const (
	seedLocal = `<grouping-handler name="my-grouping-handler">
   <type>LOCAL</type>
   <address>jms</address>
   <timeout>5000</timeout>
</grouping-handler>`
	seedRemote = `<grouping-handler name="my-grouping-handler">
   <type>REMOTE</type>
   <address>jms</address>
   <timeout>5000</timeout>
</grouping-handler>`
)

func ptr[T any](v T) *T { return &v }

func TestParseXML(t *testing.T) {
	tests := []struct {
		name string
		xml  string
		want fileConfig
	}{
		{
			name: "seed LOCAL block",
			xml:  seedLocal,
			want: fileConfig{Name: "my-grouping-handler", Type: ptr("LOCAL"), Address: ptr("jms"), TimeoutMS: ptr[int64](5000)},
		},
		{
			name: "seed REMOTE block",
			xml:  seedRemote,
			want: fileConfig{Name: "my-grouping-handler", Type: ptr("REMOTE"), Address: ptr("jms"), TimeoutMS: ptr[int64](5000)},
		},
		{
			name: "wrapped in an Artemis configuration with namespaces and comments",
			xml: `<?xml version="1.0" encoding="UTF-8"?>
<!-- broker.xml -->
<configuration xmlns="urn:activemq" xmlns:xsi="http://www.w3.org/2001/XMLSchema-instance"
               xsi:schemaLocation="urn:activemq /schema/artemis-configuration.xsd">
  <core xmlns="urn:activemq:core">
    <name>broker-1</name>
    <grouping-handler name="gh-1" xsi:type="ignored">
      <!-- the node that decides -->
      <type> local </type>
      <address>orders.eu</address>
      <timeout>
        2500
      </timeout>
      <group-timeout>-1</group-timeout>
      <reaper-period>30000</reaper-period>
    </grouping-handler>
    <address-settings><timeout>ignored outside the handler</timeout></address-settings>
  </core>
</configuration>`,
			want: fileConfig{Name: "gh-1", Type: ptr("local"), Address: ptr("orders.eu"), TimeoutMS: ptr[int64](2500),
				GroupTimeoutMS: ptr[int64](-1), ReaperPeriodMS: ptr[int64](30000)},
		},
		{
			name: "only the name: everything else from flags or defaults",
			xml:  `<grouping-handler name="gh"/>`,
			want: fileConfig{Name: "gh"},
		},
		{
			name: "byte order mark",
			xml:  "\uFEFF" + `<grouping-handler name="gh"><timeout>1</timeout></grouping-handler>`,
			want: fileConfig{Name: "gh", TimeoutMS: ptr[int64](1)},
		},
		{
			name: "zero group-timeout and reaper-period",
			xml:  `<grouping-handler name="gh"><group-timeout>0</group-timeout><reaper-period>0</reaper-period></grouping-handler>`,
			want: fileConfig{Name: "gh", GroupTimeoutMS: ptr[int64](0), ReaperPeriodMS: ptr[int64](0)},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseXML("test.xml", []byte(tt.xml))
			if err != nil {
				t.Fatalf("parseXML: %v", err)
			}
			if g, w := describe(got), describe(tt.want); g != w {
				t.Errorf("got  %s\nwant %s", g, w)
			}
		})
	}
}

func TestParseXMLErrors(t *testing.T) {
	tests := []struct {
		name string
		xml  string
		want string // substring of the error
	}{
		{"empty file", ``, "test.xml: no <grouping-handler> element"},
		{"no grouping-handler", `<configuration><core/></configuration>`, "no <grouping-handler> element"},
		{"both seed blocks", seedLocal + "\n" + seedRemote, "test.xml:6: more than one <grouping-handler> element (the first is on line 1)"},
		{"two nested in a wrapper", `<c><grouping-handler name="a"/><x><grouping-handler name="b"/></x></c>`, "more than one <grouping-handler>"},
		{"missing name", `<grouping-handler><type>LOCAL</type></grouping-handler>`, "<grouping-handler> is missing its name attribute"},
		{"empty name", `<grouping-handler name="  "/>`, "empty name attribute"},
		{"unknown attribute", `<grouping-handler name="a" id="b"/>`, `unknown attribute "id"`},
		{"unknown child", "<grouping-handler name=\"a\">\n<type>LOCAL</type>\n<time-out>5</time-out></grouping-handler>", "test.xml:3: unknown element <time-out> in <grouping-handler>"},
		{"duplicate child", "<grouping-handler name=\"a\">\n<timeout>5</timeout>\n<timeout>6</timeout></grouping-handler>", "test.xml:3: duplicate <timeout> in <grouping-handler> (first on line 2)"},
		{"duplicate type", `<grouping-handler name="a"><type>LOCAL</type><type>LOCAL</type></grouping-handler>`, "duplicate <type>"},
		{"timeout with unit", `<grouping-handler name="a"><timeout>5s</timeout></grouping-handler>`, `<timeout> must be an integer number of milliseconds, got "5s"`},
		{"empty timeout", `<grouping-handler name="a"><timeout/></grouping-handler>`, `<timeout> must be an integer number of milliseconds, got ""`},
		{"fractional timeout", `<grouping-handler name="a"><timeout>1.5</timeout></grouping-handler>`, "must be an integer"},
		{"timeout out of int64 range", `<grouping-handler name="a"><timeout>99999999999999999999</timeout></grouping-handler>`, "out of range"},
		{"timeout too large for a duration", `<grouping-handler name="a"><timeout>9223372036854775</timeout></grouping-handler>`, "too large"},
		{"zero timeout", `<grouping-handler name="a"><timeout>0</timeout></grouping-handler>`, "<timeout> must be > 0 milliseconds, got 0"},
		{"negative timeout", `<grouping-handler name="a"><timeout>-1</timeout></grouping-handler>`, "<timeout> must be > 0 milliseconds, got -1"},
		{"group-timeout below -1", `<grouping-handler name="a"><group-timeout>-2</group-timeout></grouping-handler>`, "<group-timeout> must be -1 (never) or >= 0 milliseconds, got -2"},
		{"reaper-period not a number", `<grouping-handler name="a"><reaper-period>never</reaper-period></grouping-handler>`, "<reaper-period> must be an integer"},
		{"unknown type", `<grouping-handler name="a"><type>BACKUP</type></grouping-handler>`, `<type>: unknown type "BACKUP" (want LOCAL or REMOTE)`},
		{"element inside a value", `<grouping-handler name="a"><type><v>LOCAL</v></type></grouping-handler>`, "<type> must hold only text, found <v>"},
		{"text in the handler", `<grouping-handler name="a">LOCAL</grouping-handler>`, `unexpected text "LOCAL" in <grouping-handler>`},
		{"unclosed handler", `<grouping-handler name="a"><type>LOCAL</type>`, "malformed XML"},
		{"unclosed value", `<grouping-handler name="a"><type>LOCAL`, "malformed XML"},
		{"mismatched tags", "<grouping-handler name=\"a\">\n<type>LOCAL</address>\n</grouping-handler>", "test.xml:2: malformed XML"},
		{"malformed after the handler", `<c><grouping-handler name="a"/><oops></c>`, "malformed XML"},
		{"not XML", `type=LOCAL`, "no <grouping-handler> element"},
		{"bad attribute syntax", `<grouping-handler name=a/>`, "malformed XML"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := parseXML("test.xml", []byte(tt.xml))
			if err == nil {
				t.Fatalf("parseXML accepted it: %s", describe(got))
			}
			if !errors.Is(err, router.ErrConfig) {
				t.Errorf("error %v does not wrap router.ErrConfig", err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q\ndoes not contain %q", err, tt.want)
			}
		})
	}
}

func TestLoadConfigFileMissing(t *testing.T) {
	_, err := loadConfigFile(t.TempDir() + "/absent.xml")
	if !errors.Is(err, router.ErrConfig) || !strings.Contains(err.Error(), "absent.xml") {
		t.Fatalf("got %v, want a config error naming the file", err)
	}
}

func FuzzParseXML(f *testing.F) {
	for _, s := range []string{
		seedLocal, seedRemote, seedLocal + seedRemote,
		`<configuration><core><grouping-handler name="g"><group-timeout>-1</group-timeout><reaper-period>5</reaper-period></grouping-handler></core></configuration>`,
		`<grouping-handler name="a"><type><v/></type></grouping-handler>`,
		`<grouping-handler name="a"><!-- c --><timeout>  7 </timeout><?pi x?></grouping-handler>`,
		`<grouping-handler/>`, `<a><b>`, ``, "\uFEFF<x/>",
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		cfg, err := parseXML("fuzz.xml", data)
		if err != nil {
			if !errors.Is(err, router.ErrConfig) {
				t.Fatalf("error %v does not wrap router.ErrConfig", err)
			}
			return
		}
		if err := cfg.validate(); err != nil {
			t.Fatalf("accepted %s, which fails its own validation: %v", describe(cfg), err)
		}
		if cfg.Type != nil {
			if _, err := router.ParseHandlerType(*cfg.Type); err != nil {
				t.Fatalf("accepted type %q: %v", *cfg.Type, err)
			}
		}
		if cfg.TimeoutMS != nil && *cfg.TimeoutMS <= 0 {
			t.Fatalf("accepted timeout %d", *cfg.TimeoutMS)
		}
	})
}

// describe renders a fileConfig with its pointers dereferenced.
func describe(c fileConfig) string {
	show := func(p any) string {
		switch v := p.(type) {
		case *string:
			if v != nil {
				return fmt.Sprintf("%q", *v)
			}
		case *int64:
			if v != nil {
				return fmt.Sprint(*v)
			}
		}
		return "<nil>"
	}
	return fmt.Sprintf("name=%q type=%s address=%s timeout=%s group-timeout=%s reaper-period=%s",
		c.Name, show(c.Type), show(c.Address), show(c.TimeoutMS), show(c.GroupTimeoutMS), show(c.ReaperPeriodMS))
}
