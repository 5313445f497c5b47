package bench

import (
	"fmt"
	"net"
	"net/url"
)

// mustLoopback rejects a URL whose host is not a loopback address: the
// benchmark never talks to another machine.
func mustLoopback(raw string) error {
	u, err := url.Parse(raw)
	if err != nil {
		return err
	}
	ip := net.ParseIP(u.Hostname())
	if ip == nil || !ip.IsLoopback() {
		return fmt.Errorf("bench: %s is not a loopback address", raw)
	}
	return nil
}
