package permissions

import (
	"errors"
	"go/ast"
	"go/parser"
	"go/token"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"testing"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

var defaultLayout = Layout{Nodes: []string{"n0", "n1", "n2"}, Handlers: []string{"n0", "n1"}}

func usersOf(t *testing.T, l Layout) map[string]User {
	t.Helper()
	us, err := l.Users()
	if err != nil {
		t.Fatal(err)
	}
	out := map[string]User{}
	for _, u := range us {
		out[u.Name] = u
	}
	return out
}

// allowed reports whether rule lets subject through, as nats-server
// decides: an allow matches and no deny does.
func allowed(r Rule, subject string) bool {
	match := func(gs []Grant) bool {
		return slices.ContainsFunc(gs, func(g Grant) bool { return server.SubjectMatchesFilter(subject, g.Subject) })
	}
	return match(r.Allow) && !match(r.Deny)
}

// reaches reports whether u may publish subject of the router's account:
// in that account by its permissions, from another one only on the
// subject an import of u maps to it, when its permissions allow that.
func reaches(l Layout, u User, subject string) bool {
	if u.Account == l.withDefaults().RouterAccount {
		return allowed(u.Publish, subject)
	}
	return slices.ContainsFunc(u.Imports, func(imp Import) bool {
		return server.SubjectMatchesFilter(subject, imp.Subject) && allowed(u.Publish, l.ImportedSubject(subject))
	})
}

const (
	pub = "pub"
	sub = "sub"
)

// check is one subject a user may or may not use.
type check struct {
	user, dir, subject string
	want               bool
}

func kvSubj(bucket, key string) string { return "$KV." + bucket + "." + key }
func js(s string) string               { return "$JS.API." + s }
func ordered(stream, filter string) []string {
	create := js("CONSUMER.CREATE." + stream + ".OC_1")
	if filter != "" {
		create += "." + filter
	}
	return []string{create, js("CONSUMER.MSG.NEXT." + stream + ".OC_1"), js("CONSUMER.DELETE." + stream + ".OC_1")}
}

// covered lists the exported constants (found in the sources by
// TestEveryConstantHasAPlace) whose subjects the checks below place.
var covered = []string{
	"IngressStream", "QueueStream", "DeadLetterStream", "EventsStream",
	"QueueSubjectPrefix", "HeldSubjectPrefix", "DeadLetterSubjectPrefix", "QueueConsumerPrefix", "PriorityGroup", "DeadLetterTooLong",
	"SubjectProposePrefix", "SubjectPropose", "SubjectAdmin", "SubjectHandlerPrefix", "SubjectEventsPrefix", "ServiceName",
	"DefaultBucket", "DefaultNodesBucket",
	"ParkedStream", "ParkedBucket", "ParkedSubjectPrefix", // as consumer's: the consumer-n1 checks
	// Event kinds: TestEventKinds.
}

func roleChecks() []check {
	b, nb := kvbinding.DefaultBucket, kvbinding.DefaultNodesBucket
	q := router.QueueStream
	var cs []check
	add := func(user, dir string, want bool, subjects ...string) {
		for _, s := range subjects {
			cs = append(cs, check{user, dir, s, want})
		}
	}
	everyone := []string{"producer", "consumer-n0", "consumer-n1", "consumer-n2", "node-n0", "node-n1", "node-n2", "operator", "observer"}

	// Producer: the address only.
	add("producer", pub, true, "jms.orders", "jms.a.b.c")
	add("producer", sub, true, "_INBOX.producer.Zx.1")
	add("producer", pub, false, "grouping.propose.n1", proposals.SubjectAdmin, router.QueueSubject("n1", "jms.x"),
		kvSubj(b, "r.g"), kvSubj(nb, kvbinding.LiveKey("n1")), js("CONSUMER.MSG.NEXT."+q+"."+router.QueueConsumer("n1")),
		js("STREAM.INFO."+router.IngressStream), proposals.SubjectEventsPrefix+proposals.EventBind)
	add("producer", sub, false, "_INBOX.Zx", "_INBOX.node-n1.Zx", proposals.SubjectEventsPrefix+">", "jms.orders")

	// Every role receives on its own inbox only; nobody but the observer
	// subscribes to events (and the operator to progress events: move
	// --wait follows them), nobody but LOCAL nodes to requests.
	for _, u := range everyone {
		add(u, sub, true, "_INBOX."+u+".Zx.1")
		for _, other := range everyone {
			if other != u {
				add(u, sub, false, "_INBOX."+other+".Zx.1")
			}
		}
		add(u, sub, false, "_INBOX.Zx", "jms.orders", router.QueueSubject("n1", "jms.x"), kvSubj(b, "r.g"))
		// A node holds back onto its own held subject only; nobody else
		// writes there.
		add(u, pub, u == "node-n1", router.HeldSubject("n1", "g", "jms.x"))
		add(u, pub, u == "node-n2", router.HeldSubject("n2", "g", "jms.x"))
		add(u, sub, false, router.HeldSubject("n1", "g", "jms.x"))
		add(u, sub, u == "observer", proposals.SubjectEventsPrefix+proposals.EventBind)
		add(u, sub, u == "observer" || strings.HasPrefix(u, "node-"), proposals.SubjectEventsPrefix+proposals.EventHandlerTakeover)
		add(u, sub, u == "observer" || u == "operator", proposals.SubjectEventsPrefix+proposals.EventProgress)
		add(u, sub, u == "node-n0" || u == "node-n1", proposals.ProposeSubject("n2"), proposals.SubjectAdmin,
			proposals.SubjectHandlerPrefix+"grouping-handler.ping", "$SRV.PING", "$SRV.INFO."+proposals.ServiceName, "$SRV.STATS."+proposals.ServiceName+".ID")
		// Nobody deletes or reshapes streams, purges, or creates consumers
		// on the queue stream except a node for its own queue.
		add(u, pub, u == "node-n0" || u == "node-n1", js("STREAM.UPDATE."+q))     // atomic batches on an older queue stream
		add(u, pub, u == "node-n0" || u == "node-n1", js("STREAM.UPDATE.KV_"+nb)) // harden an older registry bucket
		add(u, pub, false, js("STREAM.UPDATE.KV_"+b), js("STREAM.PURGE.KV_"+nb))
		add(u, pub, false, js("STREAM.DELETE."+q), js("STREAM.PURGE."+q), js("STREAM.UPDATE."+router.IngressStream),
			js("CONSUMER.DELETE."+q+"."+router.QueueConsumer("n1")), js("CONSUMER.CREATE."+q+".x"), js("CONSUMER.DURABLE.CREATE."+q+".x"),
			js("CONSUMER.CREATE."+q+"."+router.QueueConsumer("n1")))
		// Only LOCAL nodes write bindings or the lease.
		add(u, pub, u == "node-n0" || u == "node-n1", kvSubj(b, "r.g"), kvSubj(nb, kvbinding.LeaseKey("grouping-handler")))
		add(u, pub, u == "node-n0" || u == "node-n1", js("INFO"))
		add(u, pub, false, kvSubj(nb, kvbinding.LeaseKey("other")))
	}

	// Consumers: their own node's queue consumer only.
	c1 := q + "." + router.QueueConsumer("n1")
	add("consumer-n1", pub, true, js("CONSUMER.INFO."+c1), js("CONSUMER.MSG.NEXT."+c1), "$JS.ACK."+c1+".1.2.3.4.5",
		js("CONSUMER.UNPIN."+c1), js("STREAM.INFO."+q))
	// Parking: its own node's parked subjects, the bucket, the replay.
	pb, ps := consumer.ParkedBucket, consumer.ParkedStream
	add("consumer-n1", pub, true, consumer.ParkedSubjectPrefix+"n1.r.g.jms.x", kvSubj(pb, "r.g"), js("DIRECT.GET.KV_"+pb+"."+kvSubj(pb, "r.g")),
		js("STREAM.INFO."+ps), js("STREAM.INFO.KV_"+pb), js("STREAM.MSG.GET."+ps), js("STREAM.MSG.DELETE."+ps),
		proposals.SubjectEventsPrefix+proposals.EventPark, proposals.SubjectEventsPrefix+proposals.EventRelease)
	add("consumer-n1", pub, true, ordered("KV_"+pb, kvSubj(pb, ">"))...)
	// The parked stream and bucket are the router's: a LOCAL node creates
	// them, a consumer may not shape them.
	add("consumer-n1", pub, false, consumer.ParkedSubjectPrefix+"n2.r.g.jms.x", js("STREAM.DELETE."+ps), js("STREAM.PURGE."+ps),
		js("STREAM.CREATE."+ps), js("STREAM.UPDATE."+ps), js("STREAM.CREATE.KV_"+pb), js("STREAM.UPDATE.KV_"+pb),
		proposals.SubjectEventsPrefix+proposals.EventBind)
	for _, n := range []string{"n0", "n1"} {
		add("node-"+n, pub, true, js("STREAM.CREATE."+ps), js("STREAM.CREATE.KV_"+pb), js("STREAM.UPDATE.KV_"+pb))
	}
	add("node-n2", pub, false, js("STREAM.CREATE."+ps), js("STREAM.CREATE.KV_"+pb), js("STREAM.UPDATE.KV_"+pb))
	// The operator: list, read, ask for a replay; never park or delete.
	add("operator", pub, true, js("STREAM.INFO."+ps), js("STREAM.MSG.GET."+ps), kvSubj(pb, "r.g"), js("DIRECT.GET.KV_"+pb+"."+kvSubj(pb, "r.g")))
	add("operator", pub, false, consumer.ParkedSubjectPrefix+"n1.r.g.jms.x", js("STREAM.MSG.DELETE."+ps), js("STREAM.UPDATE."+ps))
	c2 := q + "." + router.QueueConsumer("n2")
	add("consumer-n1", pub, false, js("CONSUMER.INFO."+c2), js("CONSUMER.MSG.NEXT."+c2), "$JS.ACK."+c2+".1.2.3.4.5",
		js("STREAM.MSG.GET."+q), js("DIRECT.GET."+q), router.QueueSubject("n1", "jms.x"), "jms.orders", proposals.SubjectAdmin)

	// Every node: routing, its own liveness and checkpoint, its own
	// proposals, the layout read-only; it reads every node's checkpoint
	// (a take-over skips what the old node's says it finished), writes
	// only its own.
	for _, n := range []string{"n0", "n1", "n2"} {
		u := "node-" + n
		other := "n0"
		if n == "n0" {
			other = "n2"
		}
		add(u, pub, true, router.QueueSubject("n0", "jms.x"), router.QueueSubject("n2", "jms.x"), router.DeadLetterSubjectPrefix+"jms.x",
			router.DeadLetterTooLong, proposals.ProposeSubject(n),
			kvSubj(nb, kvbinding.LiveKey(n)), kvSubj(nb, kvbinding.CheckpointKey(n)),
			js("DIRECT.GET.KV_"+nb+"."+kvSubj(nb, kvbinding.CheckpointKey(n))),
			js("DIRECT.GET.KV_"+nb+"."+kvSubj(nb, kvbinding.CheckpointKey(other))),
			js("CONSUMER.CREATE."+q+"."+router.QueueConsumer(n)+"."+router.QueueFilter(n)),
			js("CONSUMER.INFO."+q+"."+router.QueueConsumer("n0")), js("CONSUMER.INFO."+q+"."+router.QueueConsumer("n2")),
			js("STREAM.MSG.GET."+q), js("STREAM.MSG.DELETE."+q), js("STREAM.MSG.GET.KV_"+b))
		// A node reads binding records only as JSON around them (the
		// rewind check), never with a direct get, whose answer is the
		// record itself: aimed by a reply subject at another key, it
		// would write a binding. LOCAL nodes (the handler) write them anyway.
		add(u, pub, false, js("DIRECT.GET.KV_"+b))
		add(u, pub, n != "n2", js("DIRECT.GET.KV_"+b+"."+kvSubj(b, "r.order-42")))
		for _, k := range NodeEvents {
			add(u, pub, true, proposals.SubjectEventsPrefix+k)
		}
		for _, s := range []string{router.IngressStream, q, router.DeadLetterStream, router.EventsStream, "KV_" + b, "KV_" + nb} {
			add(u, pub, true, js("STREAM.INFO."+s))
			add(u, pub, n != "n2", js("STREAM.CREATE."+s))
		}
		add(u, pub, true, ordered(router.IngressStream, "")...)
		add(u, pub, true, ordered("KV_"+b, kvSubj(b, ">"))...)
		add(u, pub, true, ordered("KV_"+nb, kvSubj(nb, kvbinding.LiveKey(">")))...)
		add(u, pub, false, proposals.ProposeSubject("n3"), "jms.orders", proposals.SubjectAdmin,
			kvSubj(nb, kvbinding.LiveKey("n3")), kvSubj(nb, kvbinding.CheckpointKey("n3")), kvSubj(nb, kvbinding.CheckpointKey(other)),
			js("DIRECT.GET.KV_"+nb+"."+kvSubj(nb, kvbinding.CheckpointKey("n3"))),
			js("CONSUMER.MSG.NEXT."+q+"."+router.QueueConsumer(n)), js("CONSUMER.MSG.NEXT."+q+"."+router.QueueConsumer("n3")),
			js("CONSUMER.CREATE."+q+"."+router.QueueConsumer(n)), js("CONSUMER.CREATE."+q+"."+router.QueueConsumer(n)+".grouping.queue.n3.>"),
			js("CONSUMER.CREATE."+q+"."+router.QueueConsumer("n3")+"."+router.QueueFilter("n3")),
			js("CONSUMER.CREATE.KV_"+nb+".OC_1"), js("STREAM.MSG.DELETE."+router.IngressStream), js("STREAM.CREATE.OTHER"),
			"_INBOX.observer.x")
	}
	// LOCAL nodes: the handler; REMOTE node n2: none of it.
	for _, n := range []string{"n0", "n1", "n2"} {
		u, local := "node-"+n, n != "n2"
		for _, k := range HandlerEvents {
			add(u, pub, local, proposals.SubjectEventsPrefix+k)
		}
		add(u, pub, local, kvSubj(b, "r.order-42"), kvSubj(nb, kvbinding.LeaseKey("grouping-handler")),
			js("DIRECT.GET.KV_"+b+"."+kvSubj(b, "r.order-42")),
			js("DIRECT.GET.KV_"+nb+"."+kvSubj(nb, kvbinding.LiveKey(map[string]string{"n0": "n2", "n1": "n2", "n2": "n0"}[n]))),
			proposals.SubjectHandlerPrefix+"grouping-handler.ping",
			"_INBOX.node-n2.Zx.1", "_INBOX.operator.Zx", "_INBOX.Zx.1", "$JS.FC.KV_"+nb+".x.1")
		add(u, pub, false, proposals.SubjectHandlerPrefix+"other.ping", js("CONSUMER.PAUSE."+q+"."+router.QueueConsumer("n3")))
		add(u, pub, true, js("CONSUMER.PAUSE."+q+"."+router.QueueConsumer("n2")))
	}

	// Operator: move and unbind, read the state; writes nothing.
	add("operator", pub, true, proposals.SubjectAdmin, js("STREAM.INFO.KV_"+b), js("DIRECT.GET.KV_"+b+"."+kvSubj(b, "r.g")),
		js("CONSUMER.LIST."+q), js("STREAM.MSG.GET."+q), js("DIRECT.GET.KV_"+nb+"."+kvSubj(nb, kvbinding.LeaseKey("grouping-handler"))))
	add("operator", pub, true, ordered("KV_"+b, kvSubj(b, ">"))...)
	add("operator", pub, true, ordered(router.EventsStream, "")...)
	add("operator", pub, false, proposals.ProposeSubject("n1"), kvSubj(b, "r.g"), kvSubj(nb, kvbinding.LiveKey("n1")),
		js("STREAM.MSG.DELETE."+q), js("CONSUMER.MSG.NEXT."+c1), js("CONSUMER.PAUSE."+c1), "jms.orders",
		proposals.SubjectEventsPrefix+proposals.EventMove)

	// Observer: events only.
	add("observer", pub, true, js("STREAM.INFO."+router.EventsStream), js("CONSUMER.CREATE."+router.EventsStream+".OC_1.grouping.events.bind"))
	add("observer", pub, true, ordered(router.EventsStream, "")...)
	add("observer", pub, false, "jms.orders", proposals.SubjectEventsPrefix+proposals.EventBind, proposals.SubjectAdmin,
		proposals.ProposeSubject("n1"), kvSubj(b, "r.g"), js("STREAM.INFO.KV_"+b), js("DIRECT.GET.KV_"+b+"."+kvSubj(b, "r.g")),
		js("STREAM.MSG.GET."+q), js("CONSUMER.MSG.NEXT."+c1), js("STREAM.INFO."+q), js("CONSUMER.CREATE.KV_"+b+".OC_1"),
		js("DIRECT.GET."+router.EventsStream))
	return cs
}

// TestRoles: every role may use the subjects its job needs (named by the
// constants the code uses) and none of those it must not.
func TestRoles(t *testing.T) {
	users := usersOf(t, defaultLayout)
	for _, c := range roleChecks() {
		u, ok := users[c.user]
		if !ok {
			t.Fatalf("no user %s", c.user)
		}
		got := reaches(defaultLayout, u, c.subject)
		if c.dir == sub {
			got = allowed(u.Subscribe, c.subject)
		}
		if got != c.want {
			t.Errorf("%s %s %s: allowed %v, want %v", c.user, c.dir, c.subject, got, c.want)
		}
	}
}

// TestEveryConstantHasAPlace: every exported subject, stream, bucket or
// event constant of the router, the handler and the buckets is placed by
// the checks of TestRoles (listed in covered) or is an event kind; a new
// one fails here until it is given its place in the layout.
func TestEveryConstantHasAPlace(t *testing.T) {
	pattern := regexp.MustCompile(`^(Subject|Event)|Stream$|Prefix$|Bucket$|^DeadLetterTooLong$|^PriorityGroup$|^ServiceName$`)
	for _, dir := range []string{"../router", "../proposals", "../kvbinding"} {
		for name, value := range exportedConsts(t, dir) {
			if !pattern.MatchString(name) || slices.Contains(covered, name) {
				continue
			}
			if strings.HasPrefix(name, "Event") && (slices.Contains(NodeEvents, value) || slices.Contains(HandlerEvents, value) || slices.Contains(ConsumerEvents, value)) {
				continue
			}
			if name == "EventsMaxBytes" || name == "HeaderOrigPrefix" || name == "DefaultInboxPrefix" {
				continue // not subjects (the inbox prefix is each user's own: see Layout)
			}
			t.Errorf("%s.%s = %q has no place in the permission checks", filepath.Base(dir), name, value)
		}
	}
}

// TestEventKinds: the node and handler event kinds are exactly the kinds
// defined, and each is published by the side that publishes it.
func TestEventKinds(t *testing.T) {
	var kinds []string
	for name, value := range exportedConsts(t, "../proposals") {
		if strings.HasPrefix(name, "Event") && name != "EventsMaxBytes" {
			kinds = append(kinds, value)
		}
	}
	all := slices.Concat(NodeEvents, HandlerEvents, ConsumerEvents)
	sort.Strings(kinds)
	sort.Strings(all)
	if !slices.Equal(kinds, all) {
		t.Fatalf("event kinds %v, permissions know %v", kinds, all)
	}
	// Published by a node itself (an Event{Kind: ...} in the router), the
	// rest by the handler.
	for _, k := range NodeEvents {
		if !sourceMentions(t, "../router", "Kind: proposals.Event"+eventConstName(t, k)) {
			t.Errorf("event %s is not published by the router", k)
		}
	}
	for _, k := range ConsumerEvents {
		if !sourceMentions(t, "../consumer", "proposals.Event"+eventConstName(t, k)) {
			t.Errorf("event %s is not published by package consumer", k)
		}
	}
	for _, k := range HandlerEvents {
		if sourceMentions(t, "../router", "Kind: proposals.Event"+eventConstName(t, k)) {
			t.Errorf("event %s is published by the router: REMOTE nodes need it", k)
		}
	}
}

// eventConstName returns the name of the Event constant of kind.
func eventConstName(t *testing.T, kind string) string {
	for name, value := range exportedConsts(t, "../proposals") {
		if strings.HasPrefix(name, "Event") && value == kind {
			return strings.TrimPrefix(name, "Event")
		}
	}
	t.Fatalf("no constant for event %s", kind)
	return ""
}

// exportedConsts returns the exported string constants of the package in
// dir (non-test files) whose value is a literal or a concatenation of
// literals and constants of the same package.
func exportedConsts(t *testing.T, dir string) map[string]string {
	t.Helper()
	fset := token.NewFileSet()
	pkgs, err := parser.ParseDir(fset, dir, func(fi os.FileInfo) bool { return !strings.HasSuffix(fi.Name(), "_test.go") }, 0)
	if err != nil {
		t.Fatal(err)
	}
	exprs := map[string]ast.Expr{}
	for _, p := range pkgs {
		for _, f := range p.Files {
			for _, d := range f.Decls {
				gd, ok := d.(*ast.GenDecl)
				if !ok || gd.Tok != token.CONST {
					continue
				}
				for _, spec := range gd.Specs {
					vs := spec.(*ast.ValueSpec)
					for i, n := range vs.Names {
						if i < len(vs.Values) {
							exprs[n.Name] = vs.Values[i]
						}
					}
				}
			}
		}
	}
	var eval func(e ast.Expr) (string, bool)
	eval = func(e ast.Expr) (string, bool) {
		switch e := e.(type) {
		case *ast.BasicLit:
			if e.Kind != token.STRING {
				return "", false
			}
			s, err := strconv.Unquote(e.Value)
			return s, err == nil
		case *ast.BinaryExpr:
			a, ok1 := eval(e.X)
			b, ok2 := eval(e.Y)
			return a + b, ok1 && ok2 && e.Op == token.ADD
		case *ast.Ident:
			if x, ok := exprs[e.Name]; ok {
				return eval(x)
			}
		case *ast.CallExpr: // a typed constant: Kind("x")
			if len(e.Args) == 1 {
				return eval(e.Args[0])
			}
		}
		return "", false
	}
	out := map[string]string{}
	for name, e := range exprs {
		if !ast.IsExported(name) {
			continue
		}
		if v, ok := eval(e); ok {
			out[name] = v
		}
	}
	return out
}

// sourceMentions reports whether a non-test Go file of dir contains s.
func sourceMentions(t *testing.T, dir, s string) bool {
	t.Helper()
	files, err := filepath.Glob(filepath.Join(dir, "*.go"))
	if err != nil {
		t.Fatal(err)
	}
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		data, err := os.ReadFile(f)
		if err != nil {
			t.Fatal(err)
		}
		if strings.Contains(string(data), s) {
			return true
		}
	}
	return false
}

// TestAccounts: the router's users and JetStream are in the router's
// account; producers import only the address, consumers only their queue
// consumer's API, its acks and the parking; every import is exported to
// its account and nothing else is exported; deliveries are stream
// responses.
func TestAccounts(t *testing.T) {
	accounts, err := defaultLayout.Accounts()
	if err != nil {
		t.Fatal(err)
	}
	if len(accounts) != 5 {
		t.Fatalf("%d accounts", len(accounts))
	}
	r, p := accounts[0], accounts[1]
	if r.Name != DefaultRouterAccount || !r.JetStream || len(r.Imports) != 0 || p.Name != DefaultProducerAccount {
		t.Fatalf("accounts %+v", accounts)
	}
	names := func(us []User) (out []string) {
		for _, u := range us {
			out = append(out, u.Name)
		}
		return out
	}
	if got := names(r.Users); !slices.Equal(got, []string{"node-n0", "node-n1", "node-n2", "operator", "observer"}) {
		t.Errorf("router account users %v", got)
	}
	if got := names(p.Users); !slices.Equal(got, []string{"producer"}) {
		t.Errorf("producer account users %v", got)
	}
	if len(p.Imports) != 1 || p.Imports[0].Subject != "jms.>" || p.Imports[0].To != "jms.>" {
		t.Errorf("producer imports %+v", p.Imports)
	}
	exported := map[string]Export{}
	for _, e := range r.Exports {
		exported[e.Subject] = e
	}
	imports := 0
	for i, a := range accounts[1:] {
		if a.JetStream || len(a.Exports) != 0 {
			t.Errorf("account %s: JetStream %v, exports %v", a.Name, a.JetStream, a.Exports)
		}
		if i > 0 {
			node := defaultLayout.Nodes[i-1]
			if got := names(a.Users); a.Name != "CONSUMERS_"+node || !slices.Equal(got, []string{"consumer-" + node}) {
				t.Errorf("account %s users %v", a.Name, got)
			}
		}
		for _, imp := range a.Imports {
			imports++
			e, ok := exported[imp.Subject]
			if !ok || !slices.Contains(e.Accounts, a.Name) || e.Stream != imp.Stream {
				t.Errorf("%s imports %+v; export %+v", a.Name, imp, e)
			}
			if strings.HasPrefix(imp.Subject, "$JS.API.") && imp.To != "JS.GROUPROUTER.API."+strings.TrimPrefix(imp.Subject, "$JS.API.") {
				t.Errorf("%s imports %s as %s", a.Name, imp.Subject, imp.To)
			}
			if strings.Contains(imp.Subject, "MSG.NEXT") != imp.Stream {
				t.Errorf("%s: %s stream response %v", a.Name, imp.Subject, imp.Stream)
			}
			// An account imports only what its user may publish: a
			// reply aimed at an import gains nobody a right.
			if !allowed(a.Users[0].Publish, imp.To) {
				t.Errorf("%s imports %s, which its user may not publish", a.Name, imp.To)
			}
			// Nothing of the router's own state: no bucket but the
			// parked one, no queue subject, no handler subject, no API
			// request of the ingress, and nothing of another node.
			for _, bad := range []string{kvbinding.DefaultBucket, kvbinding.DefaultNodesBucket, router.QueueSubjectPrefix, proposals.SubjectPropose, proposals.SubjectAdmin, router.IngressStream} {
				if strings.Contains(imp.Subject, strings.TrimSuffix(bad, "*")) {
					t.Errorf("%s imports %s", a.Name, imp.Subject)
				}
			}
			for _, other := range defaultLayout.Nodes {
				if i > 0 && other != defaultLayout.Nodes[i-1] && (strings.Contains(imp.Subject, router.QueueConsumer(other)) || strings.Contains(imp.Subject, consumer.ParkedSubjectPrefix+other)) {
					t.Errorf("%s imports %s", a.Name, imp.Subject)
				}
			}
		}
	}
	if len(exported) == 0 || len(exported) > imports {
		t.Errorf("%d exports for %d imports", len(exported), imports)
	}
	for _, e := range r.Exports {
		if len(e.Accounts) == 0 {
			t.Errorf("export %s to nobody", e.Subject)
		}
	}
}

// TestConfigParsesAsGenerated: nats-server's own parser reads the block
// into exactly the users and permissions of the model, with the
// passwords from its environment (a plain one and a bcrypt hash).
func TestConfigParsesAsGenerated(t *testing.T) {
	var b strings.Builder
	if err := defaultLayout.WriteConfig(&b); err != nil {
		t.Fatal(err)
	}
	users, _ := defaultLayout.Users()
	const hash = "$2a$11$PWIFAL8RsWyGI3jVZtO9Nu8.6jOxzxfZo7c/W0eLk017hjgUKWrhy"
	for _, u := range users {
		t.Setenv(u.PasswordEnv, "pw-"+u.Name)
	}
	t.Setenv(PasswordEnv("producer"), hash)
	path := filepath.Join(t.TempDir(), "auth.conf")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		t.Fatal(err)
	}
	opts, err := server.ProcessConfigFile(path)
	if err != nil {
		t.Fatalf("nats-server does not parse the block: %v\n%s", err, b.String())
	}
	if len(opts.Users) != len(users) {
		t.Fatalf("parsed %d users, want %d", len(opts.Users), len(users))
	}
	subjects := func(gs []Grant) []string {
		var out []string
		for _, g := range gs {
			out = append(out, g.Subject)
		}
		return out
	}
	parsed := map[string]*server.User{}
	for _, u := range opts.Users {
		parsed[u.Username] = u
	}
	for _, u := range users {
		got, ok := parsed[u.Name]
		if !ok {
			t.Errorf("user %s not parsed", u.Name)
			continue
		}
		want := "pw-" + u.Name
		if u.Name == "producer" {
			want = hash
		}
		if got.Password != want {
			t.Errorf("user %s: password %q, want %q", u.Name, got.Password, want)
		}
		if got.Account == nil || got.Account.GetName() != u.Account {
			t.Errorf("user %s: account %v, want %s", u.Name, got.Account, u.Account)
		}
		p := got.Permissions
		if p == nil || p.Publish == nil || p.Subscribe == nil || p.Response != nil {
			t.Fatalf("user %s: permissions %+v", u.Name, p)
		}
		for _, c := range []struct {
			what      string
			got, want []string
		}{
			{"publish allow", p.Publish.Allow, subjects(u.Publish.Allow)},
			{"publish deny", p.Publish.Deny, subjects(u.Publish.Deny)},
			{"subscribe allow", p.Subscribe.Allow, subjects(u.Subscribe.Allow)},
			{"subscribe deny", p.Subscribe.Deny, subjects(u.Subscribe.Deny)},
		} {
			if !slices.Equal(c.got, c.want) {
				t.Errorf("user %s %s:\n got %q\nwant %q", u.Name, c.what, c.got, c.want)
			}
		}
	}
}

// TestJSDomain: with a domain, every JetStream API grant and KV write also
// comes in its $JS.<domain>.API form.
func TestJSDomain(t *testing.T) {
	l := defaultLayout
	l.JSDomain = "hub"
	for _, u := range usersOf(t, l) {
		for _, g := range u.Publish.Allow {
			var want string
			switch {
			case strings.HasPrefix(g.Subject, "$JS.API."):
				want = "$JS.hub.API." + strings.TrimPrefix(g.Subject, "$JS.API.")
			case strings.HasPrefix(g.Subject, "$KV."):
				want = "$JS.hub.API." + g.Subject
			default:
				continue
			}
			if !allowed(u.Publish, want) {
				t.Errorf("%s: %s allowed, %s not", u.Name, g.Subject, want)
			}
		}
	}
	if !strings.Contains(l.Command(), "--js-domain hub") {
		t.Errorf("command %q", l.Command())
	}
}

func TestValidate(t *testing.T) {
	for _, tc := range []struct {
		name string
		l    Layout
		want string
	}{
		{"default", defaultLayout, ""},
		{"no nodes", Layout{Handlers: []string{"n0"}}, "no nodes"},
		{"no handlers", Layout{Nodes: []string{"n0"}}, "no handler nodes"},
		{"handler not a node", Layout{Nodes: []string{"n0"}, Handlers: []string{"n1"}}, `handler node "n1" is not one of the nodes`},
		{"bad node", Layout{Nodes: []string{"n.0"}, Handlers: []string{"n.0"}}, "node"},
		{"password variables collide", Layout{Nodes: []string{"n-1", "n_1"}, Handlers: []string{"n-1"}}, "share the password variable GROUPROUTER_PASS_NODE_N_1"},
		{"address overlaps", Layout{Address: "grouping", Nodes: []string{"n0"}, Handlers: []string{"n0"}}, "overlaps grouping.>"},
		{"address with a quote", Layout{Address: `a"b`, Nodes: []string{"n0"}, Handlers: []string{"n0"}}, "quotes"},
		{"inbox prefix of two tokens", Layout{InboxPrefix: "_INBOX.x", Nodes: []string{"n0"}, Handlers: []string{"n0"}}, "inbox prefix"},
		{"system inbox prefix", Layout{InboxPrefix: "$X", Nodes: []string{"n0"}, Handlers: []string{"n0"}}, "inbox prefix"},
		{"domain of two tokens", Layout{JSDomain: "a.b", Nodes: []string{"n0"}, Handlers: []string{"n0"}}, "domain"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := tc.l.Validate()
			if tc.want == "" {
				if err != nil {
					t.Fatal(err)
				}
				return
			}
			if !errors.Is(err, ErrLayout) || !strings.Contains(err.Error(), tc.want) {
				t.Fatalf("Validate() = %v, want ErrLayout with %q", err, tc.want)
			}
		})
	}
}
