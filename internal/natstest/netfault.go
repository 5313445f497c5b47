package natstest

// Network faults on loopback: a TCP proxy that can hold (black-hole) or cut
// the connections through it, and a cluster whose routes and client links
// pass through such proxies, so that a test can cut a server off from the
// others, freeze it, or black-hole one client's link, and heal them.
//
// Lock order: ProxiedCluster has none held while it calls into a Proxy;
// Proxy.mu is held while a hold predicate runs (the cluster's takes
// ProxiedCluster.mu), then a pipe's mu. So: Proxy.mu, then
// ProxiedCluster.mu or pipe.mu.

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/grouprouter/grouprouter/internal/localnats"
)

// ConnInfo is what a Proxy knows about one connection through it.
type ConnInfo struct {
	// ID numbers the proxy's connections in the order accepted, from 1.
	ID uint64
	// Dialer is the address the connection came from.
	Dialer string
	// Upstream is the local address of the proxy's own connection to the
	// target, once dialed: the address the target sees the connection
	// come from ("" while it was never let through).
	Upstream string
	// Name is the "name" of the CONNECT line the dialer sent first, when
	// the proxy sniffs (see SniffConnect): on a route, the dialing
	// server's ID.
	Name string
	// Label is what the proxy's identify function made of Name when the
	// line was seen (a server's ID changes when it restarts: it is
	// resolved then, not later).
	Label string
	// Target is the address the connection was dialed to: the proxy's
	// target, or a fallback (see Fallbacks) when the target refused it.
	Target string
}

// ProxyOption configures a Proxy.
type ProxyOption func(*Proxy)

// sniffTimeout bounds how long a sniffing proxy holds a connection whose
// dialer sends no first line: it then goes by what it knows (no name).
const sniffTimeout = 2 * time.Second

// maxSniff bounds the first line a sniffing proxy looks for.
const maxSniff = 64 << 10

// SniffConnect makes the proxy read the first protocol line of each
// connection's dialer before it forwards anything either way, and record
// the "name" of a CONNECT line and identify(name) (identify may be nil) in
// the connection's ConnInfo, so that a hold predicate can tell who dialed.
// For routes only: a route's dialer sends CONNECT at once, whereas a
// client waits for the server's INFO first (it would wait sniffTimeout).
func SniffConnect(identify func(name string) string) ProxyOption {
	return func(p *Proxy) {
		p.sniff = true
		p.identify = identify
	}
}

// Fallbacks makes the proxy dial the first of addrs that takes the
// connection when its target refuses it (a server shut down), as a client
// given several servers' URLs, or learning them from the cluster, then
// connects to another one. Rehome sends such connections back.
func Fallbacks(addrs ...string) ProxyOption {
	return func(p *Proxy) { p.fallbacks = addrs }
}

type proxyMode int

const (
	modePass proxyMode = iota
	modeHold
	modeCut
)

// Proxy forwards TCP connections accepted on 127.0.0.1 (a random port) to
// a target address, and emulates network faults on them:
//
//   - Hold ("black hole"): connections stay open and the proxy keeps
//     reading both sides, buffering what it reads in memory, in order,
//     and forwarding nothing; a connection accepted while held is not
//     even dialed to the target. Heal delivers the buffered bytes in
//     order, as TCP delivers retransmitted data once a partition heals,
//     and a held connection whose dialer gave up before the heal never
//     reaches the target (its SYN was lost). Neither side notices
//     anything but silence: whatever detects the fault is theirs (pings,
//     timeouts), as on a real network.
//   - HoldIf: hold only the connections a predicate selects, from what
//     the proxy learned about them (see SniffConnect).
//   - Cut: every connection is closed and new ones are closed at once,
//     until Heal (a crashed host or a firewall that rejects).
//
// Its methods may be called from any goroutine. It is closed when the
// test ends.
type Proxy struct {
	t         testing.TB
	ln        net.Listener
	target    string
	sniff     bool
	identify  func(string) string
	fallbacks []string

	mu     sync.Mutex
	mode   proxyMode
	holdIf func(ConnInfo) bool
	conns  map[*proxyConn]struct{}
	nextID uint64
	closed bool

	wg sync.WaitGroup // the accept loop and every connection's goroutines
}

// NewProxy starts a proxy to target ("host:port") in pass mode, listening
// on 127.0.0.1 on a random port.
func NewProxy(t testing.TB, target string, opts ...ProxyOption) *Proxy {
	t.Helper()
	p, err := newProxy(t, target, opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

func newProxy(t testing.TB, target string, opts ...ProxyOption) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("natstest: proxy listen: %w", err)
	}
	p := &Proxy{t: t, ln: ln, target: target, conns: map[*proxyConn]struct{}{}}
	for _, o := range opts {
		o(p)
	}
	p.wg.Add(1)
	go p.serve()
	return p, nil
}

// Addr returns the proxy's listen address, "127.0.0.1:port".
func (p *Proxy) Addr() string { return p.ln.Addr().String() }

// URL returns nats://Addr(), for a client that connects through the proxy.
func (p *Proxy) URL() string { return "nats://" + p.Addr() }

// Target returns the address the proxy forwards to.
func (p *Proxy) Target() string { return p.target }

// Hold black-holes every connection, present and future, until Heal.
func (p *Proxy) Hold() { p.setMode(modeHold) }

// Cut closes every connection and closes new ones at once, until Heal.
func (p *Proxy) Cut() { p.setMode(modeCut) }

// Rehome closes the connections dialed to a fallback (see Fallbacks), so
// that their clients connect again, to the target once it takes them. It
// returns how many it closed.
func (p *Proxy) Rehome() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		if c.info.Target != "" && c.info.Target != p.target {
			c.teardownLocked()
			n++
		}
	}
	return n
}

// Heal ends Hold and Cut: held bytes are delivered in order and new
// connections pass. A HoldIf predicate stays (clear it with HoldIf(nil)).
func (p *Proxy) Heal() { p.setMode(modePass) }

// HoldIf holds the connections for which pred returns true, as long as it
// does, and lets the others pass (nil: none held). pred is evaluated when
// a connection is accepted, when the proxy learns its name, and on every
// Recheck; it runs with the proxy's lock held and must not call into it.
func (p *Proxy) HoldIf(pred func(ConnInfo) bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.holdIf = pred
	p.recheckLocked()
}

// Recheck evaluates the HoldIf predicate again for every connection, for
// a predicate whose answer depends on state that changed.
func (p *Proxy) Recheck() {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.recheckLocked()
}

// Conns returns what the proxy knows of its open connections, by ID.
func (p *Proxy) Conns() []ConnInfo {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]ConnInfo, 0, len(p.conns))
	for c := range p.conns {
		out = append(out, c.info)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].ID < out[j].ID })
	return out
}

// HeldBytes returns how many bytes wait in the proxy's buffers, both
// directions of every connection.
func (p *Proxy) HeldBytes() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	n := 0
	for c := range p.conns {
		n += c.toUp.len() + c.toDown.len()
	}
	return n
}

// Close stops listening, closes every connection and waits for the
// proxy's goroutines.
func (p *Proxy) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	_ = p.ln.Close()
	for c := range p.conns {
		c.teardownLocked()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) setMode(m proxyMode) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.mode = m
	if m == modeCut {
		for c := range p.conns {
			c.teardownLocked()
		}
		return
	}
	p.recheckLocked()
}

func (p *Proxy) recheckLocked() {
	for c := range p.conns {
		c.recheckLocked()
	}
}

func (p *Proxy) serve() {
	defer p.wg.Done()
	for {
		down, err := p.ln.Accept()
		if err != nil {
			p.mu.Lock()
			closed := p.closed
			p.mu.Unlock()
			if closed {
				return
			}
			time.Sleep(10 * time.Millisecond) // e.g. out of file descriptors: do not spin
			continue
		}
		p.mu.Lock()
		if p.closed || p.mode == modeCut {
			p.mu.Unlock()
			_ = down.Close()
			continue
		}
		p.nextID++
		c := &proxyConn{
			p: p, down: down,
			info:    ConnInfo{ID: p.nextID, Dialer: down.RemoteAddr().String()},
			sniffed: !p.sniff,
			toUp:    newPipe(), toDown: newPipe(),
		}
		p.conns[c] = struct{}{}
		c.recheckLocked()
		if p.sniff {
			c.sniffTimer = time.AfterFunc(sniffTimeout, c.sniffGiveUp)
		}
		p.wg.Add(2)
		p.mu.Unlock()
		go c.readDown()
		go c.writeUp()
	}
}

// proxyConn is one connection through a proxy: down is the dialer's, up
// the proxy's to the target (dialed when first let through).
type proxyConn struct {
	p            *Proxy
	down         net.Conn
	toUp, toDown *pipe

	// Under p.mu.
	info       ConnInfo
	sniffed    bool // the first line was seen (or sniffing is off or gave up)
	up         net.Conn
	dialing    bool
	gone       bool
	ended      int // directions delivered to their end (2: done)
	sniffTimer *time.Timer
}

// recheckLocked decides whether the connection is held; p.mu is held.
func (c *proxyConn) recheckLocked() {
	p := c.p
	held := p.mode == modeHold || !c.sniffed || (p.holdIf != nil && p.holdIf(c.info))
	c.toUp.setHeld(held)
	c.toDown.setHeld(held)
}

// teardownLocked closes both sides and drops what is buffered; p.mu is held.
func (c *proxyConn) teardownLocked() {
	if c.gone {
		return
	}
	c.gone = true
	delete(c.p.conns, c)
	if c.sniffTimer != nil {
		c.sniffTimer.Stop()
	}
	_ = c.down.Close()
	if c.up != nil {
		_ = c.up.Close()
	}
	c.toUp.kill()
	c.toDown.kill()
}

func (c *proxyConn) teardown() {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	c.teardownLocked()
}

// endedOne records that one direction was delivered to its end; after
// both the connection is closed.
func (c *proxyConn) endedOne() {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if c.ended++; c.ended == 2 {
		c.teardownLocked()
	}
}

func (c *proxyConn) sniffGiveUp() {
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if !c.sniffed && !c.gone {
		c.sniffed = true
		c.recheckLocked()
	}
}

// readDown reads what the dialer sends (sniffing its first line) into toUp.
func (c *proxyConn) readDown() {
	defer c.p.wg.Done()
	var head []byte
	sniffing := c.p.sniff
	buf := make([]byte, 32<<10)
	for {
		n, err := c.down.Read(buf)
		if n > 0 {
			c.toUp.push(buf[:n])
			if sniffing {
				head = append(head, buf[:n]...)
				if i := bytes.IndexByte(head, '\n'); i >= 0 || len(head) > maxSniff {
					sniffing = false
					c.identified(connectName(head))
					head = nil
				}
			}
		}
		if err != nil {
			c.p.mu.Lock()
			// A held connection the target never saw, given up by its
			// dialer: it never reaches the target.
			drop := c.up == nil && !c.dialing && c.toUp.isHeld()
			if drop {
				c.teardownLocked()
			}
			c.p.mu.Unlock()
			if !drop {
				c.toUp.end()
			}
			return
		}
	}
}

func (c *proxyConn) identified(name string) {
	label := ""
	if c.p.identify != nil && name != "" {
		label = c.p.identify(name)
	}
	c.p.mu.Lock()
	defer c.p.mu.Unlock()
	if c.gone {
		return
	}
	if c.sniffTimer != nil {
		c.sniffTimer.Stop()
	}
	c.info.Name, c.info.Label = name, label
	c.sniffed = true
	c.recheckLocked()
}

// connectName returns the "name" of a CONNECT line at the start of head,
// or "".
func connectName(head []byte) string {
	line, _, _ := bytes.Cut(head, []byte("\n"))
	rest, ok := bytes.CutPrefix(bytes.TrimSpace(line), []byte("CONNECT "))
	if !ok {
		return ""
	}
	var ci struct {
		Name string `json:"name"`
	}
	if json.Unmarshal(rest, &ci) != nil {
		return ""
	}
	return ci.Name
}

// writeUp delivers toUp to the target, dialing it when the connection is
// first let through.
func (c *proxyConn) writeUp() {
	defer c.p.wg.Done()
	// A client waits for the server's INFO before it sends anything: dial
	// as soon as the connection is let through, not on its first bytes.
	if !c.toUp.released() || !c.dial() {
		return
	}
	for {
		data, eof, ok := c.toUp.next()
		if !ok {
			return
		}
		if len(data) > 0 {
			if _, err := c.up.Write(data); err != nil {
				c.teardown()
				return
			}
		}
		if eof {
			closeWrite(c.up)
			c.endedOne()
			return
		}
	}
}

// dial connects to the target and starts the other direction; it reports
// false (and tears the connection down) if it could not.
func (c *proxyConn) dial() bool {
	p := c.p
	p.mu.Lock()
	if c.gone {
		p.mu.Unlock()
		return false
	}
	c.dialing = true
	p.mu.Unlock()
	target := p.target
	up, err := net.DialTimeout("tcp", target, 5*time.Second)
	for _, fb := range p.fallbacks {
		if err == nil {
			break
		}
		target = fb
		up, err = net.DialTimeout("tcp", target, 5*time.Second)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	c.dialing = false
	if err != nil || c.gone {
		if up != nil {
			_ = up.Close()
		}
		c.teardownLocked()
		return false
	}
	c.up = up
	c.info.Upstream = up.LocalAddr().String()
	c.info.Target = target
	p.wg.Add(2)
	go c.readUp()
	go c.writeDown()
	return true
}

// readUp reads what the target sends into toDown.
func (c *proxyConn) readUp() {
	defer c.p.wg.Done()
	buf := make([]byte, 32<<10)
	for {
		n, err := c.up.Read(buf)
		if n > 0 {
			c.toDown.push(buf[:n])
		}
		if err != nil {
			c.toDown.end()
			return
		}
	}
}

// writeDown delivers toDown to the dialer.
func (c *proxyConn) writeDown() {
	defer c.p.wg.Done()
	for {
		data, eof, ok := c.toDown.next()
		if !ok {
			return
		}
		if len(data) > 0 {
			if _, err := c.down.Write(data); err != nil {
				c.teardown()
				return
			}
		}
		if eof {
			closeWrite(c.down)
			c.endedOne()
			return
		}
	}
}

func closeWrite(c net.Conn) {
	if tc, ok := c.(*net.TCPConn); ok {
		_ = tc.CloseWrite()
		return
	}
	_ = c.Close()
}

// pipe is one direction of a connection: bytes read and not yet delivered.
type pipe struct {
	mu   sync.Mutex
	cond sync.Cond
	buf  []byte
	held bool
	eof  bool // the source ended: deliver buf, then close
	dead bool // torn down: deliver nothing
}

func newPipe() *pipe {
	q := &pipe{}
	q.cond.L = &q.mu
	return q
}

func (q *pipe) push(b []byte) {
	q.mu.Lock()
	if !q.dead {
		q.buf = append(q.buf, b...)
	}
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (q *pipe) end() {
	q.mu.Lock()
	q.eof = true
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (q *pipe) kill() {
	q.mu.Lock()
	q.dead, q.buf = true, nil
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (q *pipe) setHeld(h bool) {
	q.mu.Lock()
	q.held = h
	q.mu.Unlock()
	q.cond.Broadcast()
}

func (q *pipe) isHeld() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.held
}

func (q *pipe) len() int {
	q.mu.Lock()
	defer q.mu.Unlock()
	return len(q.buf)
}

// released waits until the pipe is not held; it reports false if the
// connection was torn down first.
func (q *pipe) released() bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.dead && q.held {
		q.cond.Wait()
	}
	return !q.dead
}

// next waits until the pipe is let through with something to deliver and
// returns it, with eof when the source ended after it; ok is false once
// the connection is torn down.
func (q *pipe) next() (data []byte, eof, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for !q.dead && (q.held || (len(q.buf) == 0 && !q.eof)) {
		q.cond.Wait()
	}
	if q.dead {
		return nil, false, false
	}
	data, q.buf = q.buf, nil
	return data, q.eof, true
}

// ---------------------------------------------------------------------------
// A cluster with proxied routes

// ProxiedCluster is a JetStream cluster on loopback whose every route
// passes through a proxy, so that servers can be cut off from each other
// and healed; clients that connect with ClientURL or through a LinkProxy
// pass through proxies too.
//
// Server j's route listener is fronted by a proxy, and every server's
// routes and cluster advertise address (what the cluster gossips, so
// implicit routes too) name those proxies: every route connection, the
// pooled ones included, passes through one. A route proxy learns which
// server dialed a connection from the CONNECT line the dialer sends first
// (its server ID), and holds the connections between servers that a fault
// separates. Servers do not advertise client URLs (Cluster.NoAdvertise),
// so a client connected through a proxy does not learn the servers' own
// addresses and cannot reconnect around it.
//
// Faults are held until Heal; held bytes are then delivered in order. The
// embedded Cluster's servers, URLs (direct, unproxied) and WaitReady work
// as for RunCluster. Its methods may be called from any goroutine.
type ProxiedCluster struct {
	*Cluster
	routes  []*Proxy // routes[j] fronts server j's route listener
	clients []*Proxy // clients[j] fronts server j's client listener

	mu     sync.Mutex
	ids    map[string]int // server ID -> index, of every start (restarts change the ID)
	side   []int          // each server's side; all equal when healed
	frozen []bool
	links  [][]*Proxy // links[j]: LinkProxy proxies to server j
}

// RunProxiedCluster starts n JetStream servers forming one cluster through
// route proxies (see ProxiedCluster) and waits, as RunCluster does, until
// a replicated key-value write succeeds. Everything is shut down when the
// test ends.
func RunProxiedCluster(t testing.TB, n int) *ProxiedCluster {
	t.Helper()
	var last error
	// Route ports are reserved by listening and closing (each proxy must
	// know its target before the servers start dialing): another process
	// may take one meanwhile, so retry with fresh ports.
	for attempt := 0; attempt < 3; attempt++ {
		pc, err := tryProxiedCluster(t, n)
		if err == nil {
			pc.WaitReady(30 * time.Second)
			return pc
		}
		last = err
	}
	t.Fatalf("natstest: proxied cluster of %d: %v", n, last)
	return nil
}

func tryProxiedCluster(t testing.TB, n int) (*ProxiedCluster, error) {
	pc := &ProxiedCluster{
		Cluster: &Cluster{t: t},
		ids:     map[string]int{},
		side:    make([]int, n),
		frozen:  make([]bool, n),
		links:   make([][]*Proxy, n),
	}
	var proxies []*Proxy
	fail := func(err error) (*ProxiedCluster, error) {
		for _, s := range pc.Servers {
			s.Stop()
		}
		for _, p := range proxies {
			p.Close()
		}
		return nil, err
	}
	ports := make([]int, n)
	var routes []*url.URL
	for j := range n {
		p, err := localnats.FreePort()
		if err != nil {
			return fail(err)
		}
		ports[j] = p
		rp, err := newProxy(t, "127.0.0.1:"+strconv.Itoa(p), SniffConnect(pc.identify))
		if err != nil {
			return fail(err)
		}
		proxies = append(proxies, rp)
		pc.routes = append(pc.routes, rp)
		routes = append(routes, &url.URL{Scheme: "nats-route", Host: rp.Addr()})
	}
	for j := range n {
		o := localnats.ServerOptions(fmt.Sprintf("S%d", j+1), t.TempDir())
		o.Cluster.Name = "grouptest"
		o.Cluster.Host = "127.0.0.1"
		o.Cluster.Port = ports[j]
		o.Cluster.Advertise = pc.routes[j].Addr()
		o.Cluster.NoAdvertise = true
		o.Routes = append([]*url.URL(nil), routes...)
		s := &Server{t: t, opts: o}
		s.created = func(srv *server.Server) {
			pc.mu.Lock()
			pc.ids[srv.ID()] = j
			pc.mu.Unlock()
		}
		pc.Servers = append(pc.Servers, s)
	}
	for j, rp := range pc.routes {
		rp.HoldIf(func(ci ConnInfo) bool { return pc.routeHeld(ci.Label, j) })
	}
	for _, s := range pc.Servers {
		if err := s.tryStart(); err != nil {
			return fail(err)
		}
	}
	for _, s := range pc.Servers {
		cp, err := newProxy(t, "127.0.0.1:"+strconv.Itoa(s.opts.Port))
		if err != nil {
			return fail(err)
		}
		proxies = append(proxies, cp)
		pc.clients = append(pc.clients, cp)
	}
	// Servers stop first (cleanups run last-in first-out), then the proxies.
	for _, p := range proxies {
		t.Cleanup(p.Close)
	}
	for _, s := range pc.Servers {
		t.Cleanup(s.Stop)
	}
	return pc, nil
}

// identify maps a route's CONNECT name (the dialing server's ID) to the
// server's index, as a string ("" when unknown).
func (pc *ProxiedCluster) identify(id string) string {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	if j, ok := pc.ids[id]; ok {
		return strconv.Itoa(j)
	}
	return ""
}

// routeHeld reports whether a route connection dialed by the server
// labeled dialer to server j is held. A dialer the cluster does not know
// is held whenever any fault is on: nothing crosses a fault unidentified.
func (pc *ProxiedCluster) routeHeld(dialer string, j int) bool {
	pc.mu.Lock()
	defer pc.mu.Unlock()
	i, err := strconv.Atoi(dialer)
	if err != nil || i < 0 || i >= len(pc.side) {
		return pc.faultyLocked()
	}
	return pc.frozen[i] || pc.frozen[j] || pc.side[i] != pc.side[j]
}

func (pc *ProxiedCluster) faultyLocked() bool {
	for j := range pc.side {
		if pc.frozen[j] || pc.side[j] != pc.side[0] {
			return true
		}
	}
	return false
}

func (pc *ProxiedCluster) recheckRoutes() {
	for _, rp := range pc.routes {
		rp.Recheck()
	}
}

// Isolate cuts server i off from every other server: the routes between
// them are held (black-holed) until Heal. Its clients still reach it.
func (pc *ProxiedCluster) Isolate(i int) { pc.Split([]int{i}) }

// Split partitions the servers: each of sides lists the indexes of
// servers that still reach each other, and the servers no side lists form
// one more side. Routes between sides are held until Heal. It replaces
// the previous split; freezes stay.
func (pc *ProxiedCluster) Split(sides ...[]int) {
	pc.t.Helper()
	pc.mu.Lock()
	side := make([]int, len(pc.side))
	for k, s := range sides {
		for _, j := range s {
			if j < 0 || j >= len(side) || side[j] != 0 {
				pc.mu.Unlock()
				pc.t.Fatalf("natstest: split %v: server %d out of range or on two sides", sides, j)
			}
			side[j] = k + 1
		}
	}
	pc.side = side
	pc.mu.Unlock()
	pc.recheckRoutes()
}

// Freeze emulates a frozen server i (a stopped VM, say): its routes, the
// links of the clients connected through ClientURL(i) and every LinkProxy
// to it are held until Heal, while its process runs on.
func (pc *ProxiedCluster) Freeze(i int) {
	pc.mu.Lock()
	pc.frozen[i] = true
	links := append([]*Proxy(nil), pc.links[i]...)
	pc.mu.Unlock()
	pc.recheckRoutes()
	pc.clients[i].Hold()
	for _, l := range links {
		l.Hold()
	}
}

// Heal ends every fault of the cluster: splits, freezes, and holds or cuts
// of the client proxies and of every LinkProxy. Held bytes are delivered
// in order.
func (pc *ProxiedCluster) Heal() {
	pc.mu.Lock()
	for j := range pc.side {
		pc.side[j], pc.frozen[j] = 0, false
	}
	var links []*Proxy
	for _, ls := range pc.links {
		links = append(links, ls...)
	}
	pc.mu.Unlock()
	pc.recheckRoutes()
	for _, cp := range pc.clients {
		cp.Heal()
	}
	for _, l := range links {
		l.Heal()
	}
}

// ClientURL returns the URL of server i's client proxy: clients connected
// through it are held with the server by Freeze.
func (pc *ProxiedCluster) ClientURL(i int) string { return pc.clients[i].URL() }

// RouteProxy returns the proxy in front of server j's route listener.
func (pc *ProxiedCluster) RouteProxy(j int) *Proxy { return pc.routes[j] }

// LinkProxy returns a new proxy to server i's client listener, for one
// client (a node process) whose link alone a test can Hold, Cut and Heal;
// Freeze(i) holds it too, and Heal heals it. It is closed when t ends.
func (pc *ProxiedCluster) LinkProxy(t testing.TB, i int, opts ...ProxyOption) *Proxy {
	t.Helper()
	l := NewProxy(t, pc.clients[i].Target(), opts...)
	pc.mu.Lock()
	pc.links[i] = append(pc.links[i], l)
	frozen := pc.frozen[i]
	pc.mu.Unlock()
	if frozen {
		l.Hold()
	}
	return l
}

// ServerAddrs returns the addresses of the servers' client listeners
// but server i's, in order: fallbacks for a link proxy to server i (see
// Fallbacks). A connection through a fallback reaches the server
// directly, not through its client proxy.
func (pc *ProxiedCluster) ServerAddrs(i int) []string {
	var out []string
	for j, c := range pc.clients {
		if j != i {
			out = append(out, c.Target())
		}
	}
	return out
}

// CheckRoutesProxied returns an error naming every route of a running
// server whose remote end is not a route proxy: a route that would let
// traffic bypass the faults. A route the server dialed has a proxy's
// listen address as its remote end, one it accepted a proxy's upstream
// connection.
func (pc *ProxiedCluster) CheckRoutesProxied() error {
	ok := map[string]bool{}
	for _, rp := range pc.routes {
		ok[rp.Addr()] = true
		for _, ci := range rp.Conns() {
			if ci.Upstream != "" {
				ok[ci.Upstream] = true
			}
		}
	}
	var bad []string
	for _, s := range pc.Servers {
		srv := s.Server()
		if srv == nil || !srv.Running() {
			continue
		}
		rz, err := srv.Routez(&server.RoutezOptions{})
		if err != nil {
			return fmt.Errorf("natstest: routez of %s: %w", s.Name(), err)
		}
		for _, r := range rz.Routes {
			addr := net.JoinHostPort(r.IP, strconv.Itoa(r.Port))
			if !ok[addr] {
				bad = append(bad, fmt.Sprintf("%s: route %d to %s from %s", s.Name(), r.Rid, r.RemoteName, addr))
			}
		}
	}
	if len(bad) > 0 {
		return errors.New("natstest: routes around the proxies: " + strings.Join(bad, "; "))
	}
	return nil
}
