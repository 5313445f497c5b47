package integration

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"image/png"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/grouprouter/grouprouter/internal/natstest"
	"github.com/grouprouter/grouprouter/proposals"
)

// envBrowser names the headless browser the status page test runs (a
// path or a command on PATH). When it is set, the test fails if the
// browser cannot be found; when it is not, the test looks for chromium on
// PATH and is skipped, saying so, without one. .ci/run sets it.
const envBrowser = "GROUPROUTER_BROWSER"

// historyEvery is how often a node's status page samples its history
// (the page says so under its charts).
const historyEvery = 2 * time.Second

// envArtifacts is a directory for the test's screenshot; without it, a new
// temporary directory that is kept (its path is logged).
const envArtifacts = "GROUPROUTER_ARTIFACTS"

// findBrowser returns the browser to run, or "" (and why) when none is
// expected and none is found.
func findBrowser(t *testing.T) string {
	t.Helper()
	if want := os.Getenv(envBrowser); want != "" {
		path, err := exec.LookPath(want)
		if err != nil {
			t.Fatalf("%s=%s, but no such browser: %v", envBrowser, want, err)
		}
		return path
	}
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if path, err := exec.LookPath(name); err == nil {
			return path
		}
	}
	t.Skipf("no headless browser: install chromium, or set %s to one (CI does)", envBrowser)
	return ""
}

// browse runs the headless browser on url with extra flags (one of
// --dump-dom, --screenshot=FILE) at 1280x900 and returns its stdout.
func browse(t *testing.T, browser, url string, extra ...string) string {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 90*time.Second)
	defer cancel()
	args := append([]string{"--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--no-first-run",
		"--hide-scrollbars", "--user-data-dir=" + t.TempDir(), "--window-size=1280,900"}, extra...)
	cmd := exec.CommandContext(ctx, browser, append(args, url)...)
	var stdout, stderr bytes.Buffer
	cmd.Stdout, cmd.Stderr = &stdout, &stderr
	if err := cmd.Run(); err != nil {
		t.Fatalf("%s %v: %v\nstderr:\n%s", browser, extra, err, &stderr)
	}
	return stdout.String()
}

// TestStatusPageInBrowser loads a node's status page in a headless
// Chromium after traffic, a node kill and a move: on the first load (no
// status request before it) the events are listed and every chart has a
// line; the screenshot is kept.
func TestStatusPageInBrowser(t *testing.T) {
	t.Parallel() // see doc.go
	browser := findBrowser(t)
	srv := natstest.RunServer(t)
	// The nodes as users run them, each serving its operator endpoints
	// (--http); n0's status page is the one loaded. A killed node is gone
	// with its groups from 3 heartbeats (1 s each) after its last
	// announcement until the grace ends and its groups move: with a grace
	// of 10 s, about 7 s, three samples of the history (one every 2 s). A
	// grace of 5 s left 2 s, one sample or none (CI missed it once).
	var col collector
	procs, _ := startProcNodes(t, buildRelease(t, ""), srv.URL(), &col,
		[]procNode{{"n0", "LOCAL"}, {"n1", "REMOTE"}, {"n2", "REMOTE"}},
		"--rebalance=false", "--node-grace", "10s", "--http", "127.0.0.1:0", "--log-level", "debug")
	admin := natstest.Connect(t, srv.URL(), nats.Name("test-admin"))
	// No request reaches n0's page before the browser's.
	pageURL := "http://" + procs["n0"].httpAddr(t)

	// Traffic: 12 groups, a message each every 200 ms, until the end.
	js := jetStream(t, srv.URL())
	groups := make([]string, 12)
	for i := range groups {
		groups[i] = fmt.Sprintf("order-%02d", i)
	}
	trafficCtx, stopTraffic := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		tick := time.NewTicker(200 * time.Millisecond)
		defer tick.Stop()
		for i := 0; ; i++ {
			for _, g := range groups {
				if err := tryPublish(js, "jms.orders", g, fmt.Sprintf("%s-%d", g, i)); err != nil && trafficCtx.Err() == nil {
					t.Logf("publish: %v", err)
				}
			}
			select {
			case <-trafficCtx.Done():
				return
			case <-tick.C:
			}
		}
	}()
	defer func() { stopTraffic(); wg.Wait() }()

	st := openStore(t, admin)
	before := waitAllSettled(t, st, groups, 30*time.Second)
	var onN2 []string
	for g, b := range before {
		if b.Node == "n2" {
			onN2 = append(onN2, g)
		}
	}
	if len(onN2) == 0 {
		t.Fatalf("no group bound to n2: %v", before)
	}
	// Let the history take samples of the traffic (one every 2 s).
	time.Sleep(3 * historyEvery)

	procs["n2"].kill(t)
	natstest.Eventually(t, 60*time.Second, func() error {
		for _, g := range onN2 {
			if b, err := st.Get(context.Background(), g); err != nil || b.Node == "n2" || !b.Settled() {
				return fmt.Errorf("group %s not moved off the killed n2 yet (%+v, %v)", g, b, err)
			}
		}
		return nil
	})
	// The operator's move; retried while the handler finds the target not
	// alive (under CPU starvation a node's 100 ms heartbeat may lapse).
	moved, target := groups[0], ""
	natstest.Eventually(t, 60*time.Second, func() error {
		target = "n0"
		if b, _ := st.Get(context.Background(), moved); b.Node == "n0" {
			target = "n1"
		}
		if _, err := proposals.Move(context.Background(), admin, moved, target, 10*time.Second); err != nil {
			return fmt.Errorf("move %s to %s: %w", moved, target, err)
		}
		return nil
	})
	natstest.Eventually(t, 30*time.Second, func() error {
		if b, err := st.Get(context.Background(), moved); err != nil || b.Node != target || !b.Settled() {
			return fmt.Errorf("group %s not on %s yet (%+v, %v)", moved, target, b, err)
		}
		return nil
	})
	time.Sleep(2 * historyEvery) // a sample or two after the move

	// The first load: the DOM after the page's scripts ran.
	dom := browse(t, browser, pageURL+"/", "--dump-dom")
	if strings.Contains(dom, "reading the events stream") || !strings.Contains(dom, `data-kind="bind"`) {
		t.Errorf("the first load does not list the events:\n%s", dom)
	}
	if !strings.Contains(dom, `data-kind="move"`) || !strings.Contains(dom, ">"+moved+"<") {
		t.Errorf("the first load does not list the move of %s", moved)
	}
	if !regexp.MustCompile(`<td>ingress rate</td><td class="n">\d`).MatchString(dom) {
		t.Errorf("the first load shows no ingress rate (the history's samples give one)")
	}
	points := regexp.MustCompile(`data-series="([^"]*)" data-points="(\d+)"`)
	for _, id := range []string{"ingress", "routed", "groups", "backlog", "moves"} {
		fig := regexp.MustCompile(`(?s)<figure class="chart" id="chart-` + id + `".*?</figure>`).FindString(dom)
		if fig == "" {
			t.Errorf("no chart %q on the page", id)
			continue
		}
		most := 0
		for _, m := range points.FindAllStringSubmatch(fig, -1) {
			n, _ := strconv.Atoi(m[2])
			most = max(most, n)
		}
		if most < 3 {
			t.Errorf("chart %q: no line of 3 points or more:\n%s", id, fig)
		}
	}
	// The nodes table: the live nodes, the groups on them (under CPU
	// starvation a node may look gone for a moment and its groups move,
	// so only their total is certain).
	total := 0
	for _, m := range regexp.MustCompile(`(?s)<tr[^>]*data-node="(n[01])">.*?<td class="n groups">(\d+)</td>`).FindAllStringSubmatch(dom, -1) {
		n, _ := strconv.Atoi(m[2])
		total += n
	}
	if total != len(groups) {
		t.Errorf("the nodes table shows %d groups on n0 and n1, want %d", total, len(groups))
	}

	// The kill shows in the history /status.json returns: n2 gone with
	// groups, then the groups moved.
	resp, err := http.Get(pageURL + "/status.json")
	if err != nil {
		t.Fatal(err)
	}
	var status struct {
		History struct {
			Charts []struct {
				ID     string `json:"id"`
				Series []struct {
					Name   string        `json:"name"`
					Points [][2]*float64 `json:"points"`
				} `json:"series"`
			} `json:"charts"`
		} `json:"history"`
	}
	err = json.NewDecoder(resp.Body).Decode(&status)
	resp.Body.Close()
	if err != nil {
		t.Fatal(err)
	}
	sawGone := false
	for _, c := range status.History.Charts {
		for _, s := range c.Series {
			for _, p := range s.Points {
				if c.ID == "moves" && s.Name == "gone nodes with groups" && p[1] != nil && *p[1] >= 1 {
					sawGone = true
				}
			}
		}
	}
	if !sawGone {
		t.Errorf("/status.json's history never shows the killed node gone with groups: %+v", status.History)
	}

	// The screenshot, kept.
	dir := os.Getenv(envArtifacts)
	if dir == "" {
		if dir, err = os.MkdirTemp("", "grouprouter-browser-"); err != nil {
			t.Fatal(err)
		}
	} else if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	shot := filepath.Join(dir, "status.png")
	browse(t, browser, pageURL+"/", "--screenshot="+shot)
	f, err := os.Open(shot)
	if err != nil {
		t.Fatalf("no screenshot: %v", err)
	}
	img, err := png.Decode(f)
	f.Close()
	if err != nil {
		t.Fatalf("screenshot %s: %v", shot, err)
	}
	if b := img.Bounds(); b.Dx() != 1280 || b.Dy() != 900 {
		t.Errorf("screenshot %s is %dx%d, want 1280x900", shot, b.Dx(), b.Dy())
	}
	colors := map[uint32]bool{}
	for y := 0; y < img.Bounds().Dy(); y += 7 {
		for x := 0; x < img.Bounds().Dx(); x += 7 {
			r, g, b, _ := img.At(x, y).RGBA()
			colors[r>>12<<8|g>>12<<4|b>>12] = true
		}
	}
	if len(colors) < 5 {
		t.Errorf("screenshot %s looks blank (%d colors)", shot, len(colors))
	}
	// And the whole page, for a look at the tables below the charts.
	full := filepath.Join(dir, "status-full.png")
	browse(t, browser, pageURL+"/", "--screenshot="+full, "--window-size=1280,2000")
	t.Logf("status page screenshots: %s, %s", shot, full)
}
