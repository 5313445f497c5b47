package main

import (
	"bytes"
	"encoding/xml"
	"errors"
	"fmt"
	"io"
	"math"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/grouprouter/grouprouter/router"
)

// maxConfigFileSize bounds what --config reads: a grouping-handler block is
// a few hundred bytes, and a whole broker configuration a few hundred KiB.
const maxConfigFileSize = 4 << 20

// maxMillis is the largest millisecond count that still fits a
// time.Duration.
const maxMillis = math.MaxInt64 / int64(time.Millisecond)

// fileConfig is the <grouping-handler> element of a configuration file.
// Pointer fields are nil when the element is absent, so that flags and
// defaults fill only what the file leaves out.
type fileConfig struct {
	// Name is the name attribute (required).
	Name string
	// Type is <type>, LOCAL or REMOTE in any letter case.
	Type *string
	// Address is <address>.
	Address *string
	// TimeoutMS is <timeout>, in milliseconds.
	TimeoutMS *int64
	// GroupTimeoutMS is <group-timeout> in milliseconds (-1 or 0 = never),
	// with the Artemis meaning: a binding unused for that long expires
	// (router.Config.GroupTimeout).
	GroupTimeoutMS *int64
	// ReaperPeriodMS is <reaper-period> in milliseconds (-1 = never): how
	// often expired bindings are looked for (router.Config.ReaperPeriod);
	// it must be > 0 when the group timeout is set, which parseRunArgs
	// checks once flags are merged.
	ReaperPeriodMS *int64
}

// handlerElement is the element parseXML looks for.
const handlerElement = "grouping-handler"

// loadConfigFile reads and parses the configuration file at path. Errors
// wrap router.ErrConfig.
func loadConfigFile(path string) (fileConfig, error) {
	f, err := os.Open(path)
	if err != nil {
		return fileConfig{}, fmt.Errorf("%w: config file: %v", router.ErrConfig, err)
	}
	defer f.Close()
	data, err := io.ReadAll(io.LimitReader(f, maxConfigFileSize+1))
	if err != nil {
		return fileConfig{}, fmt.Errorf("%w: config file: %v", router.ErrConfig, err)
	}
	if len(data) > maxConfigFileSize {
		return fileConfig{}, fmt.Errorf("%w: %s: larger than %d bytes", router.ErrConfig, path, maxConfigFileSize)
	}
	return parseXML(path, data)
}

// parseXML finds the one <grouping-handler> element anywhere in the XML
// document data and returns its settings, validated. name labels error
// messages (usually the file path). Errors wrap router.ErrConfig.
func parseXML(name string, data []byte) (fileConfig, error) {
	data = bytes.TrimPrefix(data, []byte("\uFEFF")) // editors on Windows add a BOM
	d := xml.NewDecoder(bytes.NewReader(data))
	var (
		cfg       fileConfig
		foundLine int
	)
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return fileConfig{}, malformed(name, err)
		}
		start, ok := tok.(xml.StartElement)
		if !ok || start.Name.Local != handlerElement {
			continue
		}
		line, _ := d.InputPos()
		if foundLine != 0 {
			return fileConfig{}, fmt.Errorf("%w: %s:%d: more than one <%s> element (the first is on line %d); a node has exactly one",
				router.ErrConfig, name, line, handlerElement, foundLine)
		}
		foundLine = line
		if cfg, err = parseHandler(name, d, start); err != nil {
			return fileConfig{}, err
		}
	}
	if foundLine == 0 {
		return fileConfig{}, fmt.Errorf("%w: %s: no <%s> element", router.ErrConfig, name, handlerElement)
	}
	if err := cfg.validate(); err != nil {
		return fileConfig{}, fmt.Errorf("%w: %s:%d: %v", router.ErrConfig, name, foundLine, err)
	}
	return cfg, nil
}

// malformed reports a decoder error.
func malformed(name string, err error) error {
	var syn *xml.SyntaxError
	if errors.As(err, &syn) {
		return fmt.Errorf("%w: %s:%d: malformed XML: %s", router.ErrConfig, name, syn.Line, syn.Msg)
	}
	return fmt.Errorf("%w: %s: malformed XML: %v", router.ErrConfig, name, err)
}

// parseHandler reads the children of the <grouping-handler> element whose
// start tag d has just returned, up to and including its end tag.
func parseHandler(name string, d *xml.Decoder, start xml.StartElement) (fileConfig, error) {
	var cfg fileConfig
	hasName := false
	for _, a := range start.Attr {
		switch {
		case a.Name.Space == "" && a.Name.Local == "name":
			line, _ := d.InputPos()
			if hasName {
				return fileConfig{}, fmt.Errorf("%w: %s:%d: duplicate name attribute on <%s>", router.ErrConfig, name, line, handlerElement)
			}
			hasName = true
			cfg.Name = strings.TrimSpace(a.Value)
			if cfg.Name == "" {
				return fileConfig{}, fmt.Errorf("%w: %s:%d: <%s> has an empty name attribute", router.ErrConfig, name, line, handlerElement)
			}
		case a.Name.Space == "" && a.Name.Local != "xmlns":
			line, _ := d.InputPos()
			return fileConfig{}, fmt.Errorf("%w: %s:%d: unknown attribute %q on <%s> (only name is allowed)",
				router.ErrConfig, name, line, a.Name.Local, handlerElement)
		}
		// Namespaced attributes (xmlns:*, xsi:*) belong to the document, not to us.
	}
	if !hasName {
		line, _ := d.InputPos()
		return fileConfig{}, fmt.Errorf("%w: %s:%d: <%s> is missing its name attribute", router.ErrConfig, name, line, handlerElement)
	}

	seen := make(map[string]int) // child element -> line of its first occurrence
	for {
		tok, err := d.Token()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return fileConfig{}, malformed(name, err)
		}
		line, _ := d.InputPos()
		switch t := tok.(type) {
		case xml.EndElement:
			return cfg, nil // Token checks nesting: this ends <grouping-handler>
		case xml.CharData:
			if s := strings.TrimSpace(string(t)); s != "" {
				return fileConfig{}, fmt.Errorf("%w: %s:%d: unexpected text %q in <%s>", router.ErrConfig, name, line, clip(s), handlerElement)
			}
		case xml.StartElement:
			child := t.Name.Local
			var dst **int64
			var str **string
			switch child {
			case "type":
				str = &cfg.Type
			case "address":
				str = &cfg.Address
			case "timeout":
				dst = &cfg.TimeoutMS
			case "group-timeout":
				dst = &cfg.GroupTimeoutMS
			case "reaper-period":
				dst = &cfg.ReaperPeriodMS
			default:
				return fileConfig{}, fmt.Errorf("%w: %s:%d: unknown element <%s> in <%s> (want type, address, timeout, group-timeout or reaper-period)",
					router.ErrConfig, name, line, clip(child), handlerElement)
			}
			if first, dup := seen[child]; dup {
				return fileConfig{}, fmt.Errorf("%w: %s:%d: duplicate <%s> in <%s> (first on line %d)",
					router.ErrConfig, name, line, child, handlerElement, first)
			}
			seen[child] = line
			text, err := readText(name, d, child)
			if err != nil {
				return fileConfig{}, err
			}
			if str != nil {
				*str = &text
				continue
			}
			n, err := strconv.ParseInt(text, 10, 64)
			if errors.Is(err, strconv.ErrRange) {
				return fileConfig{}, fmt.Errorf("%w: %s:%d: <%s> %s is out of range", router.ErrConfig, name, line, child, clip(text))
			}
			if err != nil {
				return fileConfig{}, fmt.Errorf("%w: %s:%d: <%s> must be an integer number of milliseconds, got %q",
					router.ErrConfig, name, line, child, clip(text))
			}
			*dst = &n
		}
		// Comments, processing instructions and directives are ignored.
	}
}

// readText returns the trimmed text content of the element named child,
// whose start tag d has just returned, and consumes its end tag.
func readText(name string, d *xml.Decoder, child string) (string, error) {
	var b strings.Builder
	for {
		tok, err := d.Token()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return "", malformed(name, err)
		}
		switch t := tok.(type) {
		case xml.CharData:
			if b.Len()+len(t) > 4096 {
				line, _ := d.InputPos()
				return "", fmt.Errorf("%w: %s:%d: <%s> is too long", router.ErrConfig, name, line, child)
			}
			b.Write(t)
		case xml.StartElement:
			line, _ := d.InputPos()
			return "", fmt.Errorf("%w: %s:%d: <%s> must hold only text, found <%s>", router.ErrConfig, name, line, child, clip(t.Name.Local))
		case xml.EndElement:
			return strings.TrimSpace(b.String()), nil
		}
	}
}

// validate checks the values the file sets. It does not check what
// router.Config.Validate checks after flags are merged (name and address
// syntax), except the type, whose parsing is needed to merge.
func (c fileConfig) validate() error {
	if strings.TrimSpace(c.Name) == "" {
		return errors.New("name attribute is empty")
	}
	if c.Type != nil {
		if _, err := router.ParseHandlerType(*c.Type); err != nil {
			return fmt.Errorf("<type>: unknown type %q (want LOCAL or REMOTE)", *c.Type)
		}
	}
	if c.TimeoutMS != nil {
		switch ms := *c.TimeoutMS; {
		case ms <= 0:
			return fmt.Errorf("<timeout> must be > 0 milliseconds, got %d", ms)
		case ms > maxMillis:
			return fmt.Errorf("<timeout> of %d milliseconds is too large", ms)
		}
	}
	for _, f := range []struct {
		name string
		v    *int64
	}{{"group-timeout", c.GroupTimeoutMS}, {"reaper-period", c.ReaperPeriodMS}} {
		if f.v == nil {
			continue
		}
		switch ms := *f.v; {
		case ms < -1:
			return fmt.Errorf("<%s> must be -1 (never) or >= 0 milliseconds, got %d", f.name, ms)
		case ms > maxMillis:
			return fmt.Errorf("<%s> of %d milliseconds is too large", f.name, ms)
		}
	}
	return nil
}

// clip shortens s for an error message.
func clip(s string) string {
	const max = 64
	if len(s) <= max {
		return s
	}
	r := []rune(s)
	if len(r) <= max {
		return s
	}
	return string(r[:max]) + "…"
}
