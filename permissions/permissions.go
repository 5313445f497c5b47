// Package permissions generates the NATS accounts, users and permissions of
// a grouprouter deployment, one user per role (producer, consumer of node
// N, router node N with or without the LOCAL handler, operator, observer),
// as a nats-server accounts block. The subjects come from the constants
// the router, the handler and the buckets use, so the block stays true as
// they change. `grouprouter permissions` prints it; a Go program that
// embeds router and consumer writes the same block with Layout.WriteConfig.
//
// The router's users and state live in the router's account; producers in
// an account of their own, and the consumers of each node in one of their
// own, each reaching the router's only through service imports of exactly
// what the role needs.
// A reply subject named by a client of another account is remapped where
// its request crosses into the router's account, so no reply (a PubAck, a
// JetStream API response) can be aimed at the router's state: inside one
// account, nats-server checks a reply subject against its reserved
// prefixes only, not against the publisher's permissions. And as a reply
// may still be aimed at a subject its own account imports, each account
// imports only what each of its users may publish anyway: a reply gains
// nobody a right. Consumers reach
// the JetStream API of the router's account under a prefix (Layout.APIPrefix,
// jetstream.NewWithAPIPrefix).
//
// Every user gets its own inbox prefix (InboxPrefix + "." + user name) and
// may subscribe only there: replies, PubAcks and pull-consumer deliveries
// all arrive on inboxes, so a user allowed _INBOX.> could read another
// user's queue messages and KV reads.
package permissions

import (
	"errors"
	"fmt"
	"slices"
	"strings"

	"github.com/nats-io/nats.go/micro"

	"github.com/grouprouter/grouprouter/consumer"
	"github.com/grouprouter/grouprouter/kvbinding"
	"github.com/grouprouter/grouprouter/proposals"
	"github.com/grouprouter/grouprouter/router"
)

// ErrLayout is wrapped by every error of Layout.Validate.
var ErrLayout = errors.New("permissions: invalid layout")

// Role is what a user does in a deployment.
type Role string

// Roles.
const (
	// Producer publishes messages on <address>.>.
	Producer Role = "producer"
	// Consumer pulls and acks one node's queue.
	Consumer Role = "consumer"
	// Node runs router node N; with Handler set it also runs a LOCAL handler.
	Node Role = "node"
	// Operator moves and unbinds groups and reads the state (bindings,
	// nodes, queues, events).
	Operator Role = "operator"
	// Observer reads events.
	Observer Role = "observer"
)

// Defaults of Layout.
const (
	DefaultAddress     = "jms"
	DefaultName        = "grouping-handler"
	DefaultInboxPrefix = "_INBOX"
	// PasswordEnvPrefix + the user name in upper case, '-' as '_', is the
	// environment variable nats-server reads the user's password from.
	PasswordEnvPrefix = "GROUPROUTER_PASS_"
	// DefaultRouterAccount holds the router nodes, the operator, the
	// observer and every stream and bucket (JetStream is enabled there
	// only).
	DefaultRouterAccount = "GROUPROUTER"
	// DefaultProducerAccount holds the producers: they import the
	// router's <address>.> only.
	DefaultProducerAccount = "PRODUCERS"
	// DefaultConsumerAccount + "_" + <node> holds the consumers of the
	// node's queue: they import their queue consumer's API, its acks and
	// the node's parking.
	DefaultConsumerAccount = "CONSUMERS"
)

// Layout is a deployment: the producers' address, the router nodes, which
// of them run the LOCAL handler, and the handler's name.
type Layout struct {
	// Address: producers publish on <Address>.>. Default DefaultAddress.
	Address string
	// Nodes are the router node ids.
	Nodes []string
	// Handlers are the nodes of type LOCAL (at least one; they create the
	// streams and buckets).
	Handlers []string
	// Name is the grouping-handler name. Default DefaultName.
	Name string
	// InboxPrefix is the stem of the users' inbox prefixes: user U
	// connects with InboxPrefix.U. One token. Default DefaultInboxPrefix.
	InboxPrefix string
	// JSDomain, when set, also allows the router account's users the
	// JetStream API requests (and KV writes) under $JS.<JSDomain>.API, as
	// clients of another domain send them. A server of that domain maps
	// them to $JS.API before checking permissions, so the $JS.API forms are
	// always kept.
	JSDomain string
	// RouterAccount and ProducerAccount name the router's and the
	// producers' accounts; node N's consumers are in ConsumerAccount_N.
	// Defaults DefaultRouterAccount, DefaultProducerAccount,
	// DefaultConsumerAccount.
	RouterAccount, ProducerAccount, ConsumerAccount string
	// APIPrefix is where the consumers' account imports the router
	// account's JetStream API ($JS.API.X becomes APIPrefix.X, and a KV
	// write $KV.B.K becomes APIPrefix.$KV.B.K, as nats.go sends them
	// under a prefix). Default "JS." + RouterAccount + ".API".
	APIPrefix string
}

func (l Layout) withDefaults() Layout {
	if l.Address == "" {
		l.Address = DefaultAddress
	}
	if l.Name == "" {
		l.Name = DefaultName
	}
	if l.InboxPrefix == "" {
		l.InboxPrefix = DefaultInboxPrefix
	}
	if l.RouterAccount == "" {
		l.RouterAccount = DefaultRouterAccount
	}
	if l.ProducerAccount == "" {
		l.ProducerAccount = DefaultProducerAccount
	}
	if l.ConsumerAccount == "" {
		l.ConsumerAccount = DefaultConsumerAccount
	}
	if l.APIPrefix == "" {
		l.APIPrefix = "JS." + l.RouterAccount + ".API"
	}
	return l
}

// Validate checks the layout; errors wrap ErrLayout.
func (l Layout) Validate() error {
	l = l.withDefaults()
	if err := router.ValidateAddress(l.Address); err != nil {
		return fmt.Errorf("%w: %v", ErrLayout, strings.TrimPrefix(err.Error(), router.ErrConfig.Error()+": "))
	}
	for what, v := range map[string]string{"address": l.Address, "inbox prefix": l.InboxPrefix, "JetStream domain": l.JSDomain} {
		if strings.ContainsFunc(v, func(r rune) bool { return r == '"' || r == '\\' || r < ' ' || r == 0x7f }) {
			return fmt.Errorf("%w: %s %q: quotes, backslashes and control characters do not fit a configuration file", ErrLayout, what, v)
		}
	}
	if err := kvbinding.ValidateNodeID(l.Name); err != nil {
		return fmt.Errorf("%w: name: %v", ErrLayout, err)
	}
	if len(l.Nodes) == 0 {
		return fmt.Errorf("%w: no nodes", ErrLayout)
	}
	envs := map[string]string{}
	for _, n := range l.Nodes {
		if err := kvbinding.ValidateNodeID(n); err != nil {
			return fmt.Errorf("%w: node: %v", ErrLayout, err)
		}
		env := PasswordEnv(nodeUser(n))
		if other, ok := envs[env]; ok {
			return fmt.Errorf("%w: nodes %q and %q would share the password variable %s", ErrLayout, other, n, env)
		}
		envs[env] = n
	}
	if len(l.Handlers) == 0 {
		return fmt.Errorf("%w: no handler nodes (a LOCAL node decides and creates the streams)", ErrLayout)
	}
	for _, h := range l.Handlers {
		if !slices.Contains(l.Nodes, h) {
			return fmt.Errorf("%w: handler node %q is not one of the nodes", ErrLayout, h)
		}
	}
	if !validToken(l.InboxPrefix) || strings.HasPrefix(l.InboxPrefix, "$") {
		return fmt.Errorf("%w: inbox prefix %q: want one subject token, not a system ($) one", ErrLayout, l.InboxPrefix)
	}
	if l.JSDomain != "" && !validToken(l.JSDomain) {
		return fmt.Errorf("%w: JetStream domain %q: want one subject token", ErrLayout, l.JSDomain)
	}
	accounts := []string{l.RouterAccount, l.ProducerAccount}
	for _, n := range l.Nodes {
		accounts = append(accounts, l.consumerAccount(n))
	}
	for i, a := range accounts {
		if !validAccount(a) {
			return fmt.Errorf("%w: account %q: want letters, digits, '-' or '_'", ErrLayout, a)
		}
		if slices.Contains(accounts[:i], a) {
			return fmt.Errorf("%w: the router's, the producers' and each node's consumers' accounts must differ (%s)", ErrLayout, strings.Join(accounts, ", "))
		}
	}
	for _, tok := range strings.Split(l.APIPrefix, ".") {
		if !validToken(tok) {
			return fmt.Errorf("%w: JetStream API prefix %q: want subject tokens without wildcards", ErrLayout, l.APIPrefix)
		}
	}
	if strings.HasPrefix(l.APIPrefix, "$") || strings.HasPrefix(l.APIPrefix, l.InboxPrefix+".") || l.APIPrefix == l.InboxPrefix ||
		strings.HasPrefix(l.APIPrefix+".", l.Address+".") || strings.HasPrefix(l.APIPrefix, "grouping.") {
		return fmt.Errorf("%w: JetStream API prefix %q: must not be a system ($), inbox, address or grouping subject", ErrLayout, l.APIPrefix)
	}
	return nil
}

// consumerAccount is the account of node's consumers.
func (l Layout) consumerAccount(node string) string { return l.ConsumerAccount + "_" + node }

func validAccount(a string) bool {
	return a != "" && !strings.ContainsFunc(a, func(r rune) bool {
		return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || r == '-' || r == '_')
	})
}

func validToken(s string) bool {
	return s != "" && !strings.ContainsAny(s, ". \t\r\n*>")
}

// Grant is one subject a user may (or, in a deny list, may not) publish or
// subscribe to, and why.
type Grant struct {
	Subject string
	Why     string
}

// Rule is one direction (publish or subscribe) of a user's permissions:
// only subjects matching Allow, except those matching Deny.
type Rule struct {
	Allow []Grant
	Deny  []Grant
}

// Import is a subject of the router's account that a user's account
// reaches through a service import: the user publishes on To, which the
// import maps to Subject in the router's account (To is Subject when the
// import keeps the subject). Stream: the request is answered by many
// messages (pull deliveries).
type Import struct {
	Subject, To string
	Stream      bool
	Why         string
}

// User is one NATS user of the layout.
type User struct {
	// Name is the user name: producer, consumer-<node>, node-<node>,
	// operator, observer.
	Name string
	Role Role
	// Account is the account the user is in.
	Account string
	// APIPrefix is the JetStream API prefix the user must use (nats.go
	// jetstream.NewWithAPIPrefix, --js-api-prefix), "" for $JS.API.
	APIPrefix string
	// Imports are the router account's subjects the user reaches from its
	// account (its publish grants name their To side).
	Imports []Import
	// Node is the node of a consumer or node user.
	Node string
	// Handler is set on the node users of LOCAL nodes.
	Handler bool
	// About says in one line what the user does.
	About string
	// InboxPrefix is the inbox prefix the user must connect with (nats
	// CustomInboxPrefix, --inbox-prefix): its replies arrive only there.
	InboxPrefix string
	// PasswordEnv is the environment variable of nats-server holding the
	// user's password (or its bcrypt hash).
	PasswordEnv string

	Publish, Subscribe Rule
}

// PasswordEnv returns the environment variable holding user's password.
func PasswordEnv(user string) string {
	return PasswordEnvPrefix + strings.ToUpper(strings.ReplaceAll(user, "-", "_"))
}

func nodeUser(node string) string     { return "node-" + node }
func consumerUser(node string) string { return "consumer-" + node }

// Users returns the layout's users: the producer, a consumer and a node
// user per node (in the order of l.Nodes), the operator and the observer.
func (l Layout) Users() ([]User, error) {
	if err := l.Validate(); err != nil {
		return nil, err
	}
	l = l.withDefaults()
	users := []User{l.producer()}
	for _, n := range l.Nodes {
		users = append(users, l.consumer(n))
	}
	for _, n := range l.Nodes {
		users = append(users, l.node(n, slices.Contains(l.Handlers, n)))
	}
	return append(users, l.operator(), l.observer()), nil
}

// user starts a user with its inbox, in the router's account unless it is
// a producer or a consumer.
func (l Layout) user(name string, role Role, about string) User {
	u := User{Name: name, Role: role, Account: l.RouterAccount, About: about, InboxPrefix: l.InboxPrefix + "." + name, PasswordEnv: PasswordEnv(name)}
	switch role {
	case Producer:
		u.Account = l.ProducerAccount
	case Consumer:
		u.Account, u.APIPrefix = l.consumerAccount(strings.TrimPrefix(name, consumerUser(""))), l.APIPrefix
	}
	u.Subscribe.Allow = []Grant{{u.InboxPrefix + ".>", "its own inbox: replies (JetStream API, PubAcks, requests) and pull deliveries"}}
	return u
}

// api returns the grants of a JetStream API request subject (after
// "$JS.API."): the plain form and, with a domain, the domain form.
func (l Layout) api(subject, why string) []Grant {
	out := []Grant{{"$JS.API." + subject, why}}
	if l.JSDomain != "" {
		out = append(out, Grant{"$JS." + l.JSDomain + ".API." + subject, why})
	}
	return out
}

// kvPut returns the grants of writing key (may be a wildcard) in bucket.
func (l Layout) kvPut(bucket, key, why string) []Grant {
	out := []Grant{{kvSubject(bucket, key), why}}
	if l.JSDomain != "" {
		out = append(out, Grant{"$JS." + l.JSDomain + ".API." + kvSubject(bucket, key), why})
	}
	return out
}

func kvStream(bucket string) string       { return "KV_" + bucket }
func kvSubject(bucket, key string) string { return "$KV." + bucket + "." + key }

// kvGet returns the grant of a KV get of key (a direct get: the buckets
// allow it, as nats.go creates them).
func (l Layout) kvGet(bucket, key, why string) []Grant {
	return l.api("DIRECT.GET."+kvStream(bucket)+"."+kvSubject(bucket, key), why)
}

// ordered returns the grants of reading stream with ordered consumers
// filtered on filter ("" for none): create (nats.go names them itself),
// pull, and delete the one replaced after a reset.
func (l Layout) ordered(stream, filter, why string) []Grant {
	create := "CONSUMER.CREATE." + stream + ".*"
	if filter != "" {
		create += "." + filter
	}
	return slices.Concat(
		l.api(create, why+": create an ordered consumer"),
		l.api("CONSUMER.MSG.NEXT."+stream+".*", why+": pull from it"),
		l.api("CONSUMER.DELETE."+stream+".*", why+": delete it after a reset"),
	)
}

// ImportedSubject is the subject a consumer publishes on to reach subject
// of the router's account: the JetStream API and KV writes under
// l.APIPrefix, anything else as it is.
func (l Layout) ImportedSubject(subject string) string {
	l = l.withDefaults()
	switch {
	case strings.HasPrefix(subject, "$JS.API."):
		return l.APIPrefix + "." + strings.TrimPrefix(subject, "$JS.API.")
	case strings.HasPrefix(subject, "$KV."):
		return l.APIPrefix + "." + subject
	}
	return subject
}

// imported gives u subject of the router's account through a service
// import of its account: the grant is on the imported side.
func (l Layout) imported(u *User, subject string, stream bool, why string) {
	to := l.ImportedSubject(subject)
	u.Publish.Allow = append(u.Publish.Allow, Grant{to, why})
	u.Imports = append(u.Imports, Import{Subject: subject, To: to, Stream: stream, Why: why})
}

func (l Layout) producer() User {
	u := l.user("producer", Producer, "publishes on "+l.Address+".> (stored by "+router.IngressStream+" in account "+l.RouterAccount+")")
	l.imported(&u, l.Address+".>", false, "the messages to group; the PubAck comes to the inbox")
	return u
}

func (l Layout) consumer(node string) User {
	u := l.user(consumerUser(node), Consumer, "pulls and acks node "+node+"'s queue (consumer "+router.QueueConsumer(node)+" in account "+l.RouterAccount+")")
	u.Node = node
	c := router.QueueStream + "." + router.QueueConsumer(node)
	l.imported(&u, "$JS.API.CONSUMER.INFO."+c, false, "look up the queue consumer")
	l.imported(&u, "$JS.API.CONSUMER.MSG.NEXT."+c, true, "pull (with priority group "+router.PriorityGroup+")")
	l.imported(&u, "$JS.ACK."+c+".>", false, "ack what it processed")
	l.imported(&u, "$JS.API.CONSUMER.UNPIN."+c, false, "package consumer: give up the pin when it stops")
	l.imported(&u, "$JS.API.STREAM.INFO."+router.QueueStream, false, "package consumer: nats.go unpins through a stream handle (counts, no messages)")
	l.parking(&u, node)
	return u
}

// parking gives u what package consumer needs to park node's failing
// groups and replay them (consumer/park.go, consumer/replay.go). The
// parked stream and bucket are the router account's: a LOCAL node creates
// them (router.EnsureParking); a consumer only looks them up.
func (l Layout) parking(u *User, node string) {
	ps, pb := consumer.ParkedStream, consumer.ParkedBucket
	for _, s := range []string{ps, kvStream(pb)} {
		l.imported(u, "$JS.API.STREAM.INFO."+s, false, "package consumer: look up the parked stream and bucket")
	}
	for _, k := range ConsumerEvents {
		l.imported(u, proposals.SubjectEventsPrefix+k, false, "package consumer: its "+k+" events")
	}
	l.imported(u, consumer.ParkedSubjectPrefix+node+".>", false, "package consumer: park a failing group's messages")
	l.imported(u, kvSubject(pb, ">"), false, "package consumer: record a parked group, claim and end its replay")
	l.imported(u, "$JS.API.DIRECT.GET."+kvStream(pb)+"."+kvSubject(pb, ">"), false, "package consumer: read a parked record")
	why := "package consumer: watch the parked groups (an ordered pull consumer)"
	l.imported(u, "$JS.API.CONSUMER.CREATE."+kvStream(pb)+".*."+kvSubject(pb, ">"), false, why+": create it")
	l.imported(u, "$JS.API.CONSUMER.MSG.NEXT."+kvStream(pb)+".*", true, why+": pull from it")
	l.imported(u, "$JS.API.CONSUMER.DELETE."+kvStream(pb)+".*", false, why+": delete it after a reset")
	l.imported(u, "$JS.API.STREAM.MSG.GET."+ps, false, "package consumer: read a group's parked messages to replay them")
	l.imported(u, "$JS.API.STREAM.MSG.DELETE."+ps, false, "package consumer: delete a replayed message")
}

// streams are the streams of the layout, the buckets' included (the parked
// ones too: a LOCAL node creates them).
func streams() []string {
	return []string{router.IngressStream, router.QueueStream, router.DeadLetterStream, router.EventsStream,
		kvStream(kvbinding.DefaultBucket), kvStream(kvbinding.DefaultNodesBucket),
		router.ParkedStream, kvStream(router.ParkedBucket)}
}

// NodeEvents are the event kinds a router node publishes itself; the
// handler publishes HandlerEvents.
var (
	NodeEvents = []string{proposals.EventTimeout, proposals.EventDeadLetter, proposals.EventProgress, proposals.EventIngressGap,
		proposals.EventQueueLoss, proposals.EventBucketRewind, proposals.EventHold, proposals.EventUnhold}
	HandlerEvents = []string{proposals.EventBind, proposals.EventReject, proposals.EventHandlerTakeover, proposals.EventMove,
		proposals.EventHandoff, proposals.EventExpire, proposals.EventClose, proposals.EventUnbind, proposals.EventLimit}
	// ConsumerEvents are the kinds package consumer publishes.
	ConsumerEvents = []string{proposals.EventPark, proposals.EventRelease, proposals.EventSkip}
)

func (l Layout) node(node string, handler bool) User {
	about := "router node " + node + " (REMOTE: routes, asks the handler)"
	if handler {
		about = "router node " + node + " (LOCAL: routes, and runs the grouping handler " + l.Name + ")"
	}
	u := l.user(nodeUser(node), Node, about)
	u.Node, u.Handler = node, handler
	bindings, nodes := kvbinding.DefaultBucket, kvbinding.DefaultNodesBucket
	pub := []Grant{
		{router.QueueSubjectPrefix + ">", "republish its groups onto its queue, ungrouped messages onto any node's (round-robin), moved ones onto its own"},
		{router.HeldSubjectPrefix + node + ".>", "hold back, on its held subject, a group's messages past its share of its queue's window (moved onto its queue later)"},
		{router.DeadLetterSubjectPrefix + ">", "dead-letter what cannot be routed"},
		{proposals.ProposeSubject(node), "ask the handler for every record change, as itself only"},
	}
	for _, k := range NodeEvents {
		pub = append(pub, Grant{proposals.SubjectEventsPrefix + k, "publish " + k + " events"})
	}
	pub = slices.Concat(pub,
		l.kvPut(nodes, kvbinding.LiveKey(node), "announce itself (per-key TTL) and withdraw"),
		l.kvGet(nodes, kvbinding.LiveKey(node), "at start, check that no other process runs its id"),
		l.kvPut(nodes, kvbinding.CheckpointKey(node), "save its checkpoint"),
		l.kvGet(nodes, kvbinding.CheckpointKey(node), "load its checkpoint"),
		l.kvGet(nodes, kvbinding.FloorKey, "read the routing floor (where to start without a checkpoint)"),
	)
	for _, n := range l.Nodes {
		if n != node {
			why := "take a gone node's groups over without routing again what its checkpoint says it finished"
			if handler {
				why = "fence a gone node's groups from its checkpoint; the routing floor; " + why
			}
			pub = append(pub, l.kvGet(nodes, kvbinding.CheckpointKey(n), why)...)
		}
	}
	for _, s := range streams() {
		pub = append(pub, l.api("STREAM.INFO."+s, "check the layout; stream bounds")...)
	}
	pub = slices.Concat(pub,
		l.api("CONSUMER.CREATE."+router.QueueStream+"."+router.QueueConsumer(node)+"."+router.QueueFilter(node), "create or update its queue consumer"),
		l.ordered(router.IngressStream, "", "read the ingress"),
		l.ordered(kvStream(bindings), kvSubject(bindings, ">"), "watch the bindings"),
		l.ordered(kvStream(nodes), kvSubject(nodes, kvbinding.LiveKey(">")), "watch the live nodes"),
		l.ordered(kvStream(consumer.ParkedBucket), kvSubject(consumer.ParkedBucket, ">"), "the status page: list the parked groups"),
		[]Grant{{"$JS.FC." + kvStream(consumer.ParkedBucket) + ".>", "flow control replies of the parked groups' listing"}},
		l.kvGet(consumer.ParkedBucket, ">", "the status page: read a parked group's record"),
		l.api("STREAM.MSG.GET."+consumer.ParkedStream, "the status page: a parked group's first parked message"),
	)
	for _, n := range l.Nodes {
		pub = append(pub, l.api("CONSUMER.INFO."+router.QueueStream+"."+router.QueueConsumer(n),
			"consumer presence on its queue; a move waits for the old queue's acks")...)
	}
	pub = slices.Concat(pub,
		l.api("STREAM.MSG.GET."+router.QueueStream, "a move reads the group's messages waiting on the old queue; the lost-writes check reads its last; the orphan sweep finds acknowledged ones its queue kept"),
		l.api("STREAM.MSG.GET."+router.IngressStream, "read again a message it spilled (kept only its sequence while it waited for a decision)"),
		l.api("STREAM.MSG.GET."+kvStream(bindings), "the lost-writes check reads the bindings bucket's last record read (not a direct get: its answer, the record itself, could be aimed at another key)"),
		l.api("STREAM.MSG.DELETE."+router.QueueStream, "a move deletes each original once its copy is stored; the orphan sweep removes acknowledged messages its own queue kept"),
	)
	for _, n := range l.Nodes {
		pub = append(pub, l.api("CONSUMER.PAUSE."+router.QueueStream+"."+router.QueueConsumer(n),
			"keep an old queue paused while it drains it; the handler pauses and resumes queues")...)
	}
	u.Subscribe.Allow = append(u.Subscribe.Allow, Grant{proposals.SubjectEventsPrefix + proposals.EventHandlerTakeover,
		"a handler took over: retry asks at once; a crashed holder's node stops proposing (only LOCAL nodes may publish it)"})
	if handler {
		pub = slices.Concat(pub, l.handlerPublish(node))
		u.Subscribe.Allow = append(u.Subscribe.Allow, l.handlerSubscribe()...)
		u.Publish.Deny = l.handlerDeny()
	}
	u.Publish.Allow = pub
	return u
}

// handlerDeny bounds a handler's replies: they go to the inboxes of nodes,
// the operator and tools (nats micro ls), never to the observer. Producers
// and consumers are in other accounts, which no publish of the router's
// account reaches but through the replies of their own requests.
func (l Layout) handlerDeny() []Grant {
	return []Grant{{l.InboxPrefix + ".observer.>", "never a reply to the observer"}}
}

// handlerPublish is what a LOCAL node publishes besides a node's rights.
func (l Layout) handlerPublish(node string) []Grant {
	bindings, nodes := kvbinding.DefaultBucket, kvbinding.DefaultNodesBucket
	// Replies are allowed by subject, not with allow_responses: that would
	// let the handler answer to any reply subject a request names (a
	// $KV key, say), and a deny cannot narrow it (nats-server checks
	// responses after the deny list).
	pub := []Grant{{l.InboxPrefix + ".>", "answer proposals, operator commands, probes and nats micro requests (see deny)"}}
	for _, s := range streams() {
		pub = append(pub, l.api("STREAM.CREATE."+s, "create the layout when it is missing (REMOTE nodes wait for it)")...)
	}
	pub = append(pub, l.api("STREAM.UPDATE."+router.QueueStream, "allow atomic batches, and add the held subject, on a queue stream created before them (a handler may create the layout anyway)")...)
	pub = append(pub, l.api("STREAM.UPDATE."+kvStream(nodes), "deny roll-ups and purges on a registry bucket created by an earlier release (a handler may create the layout anyway)")...)
	pub = append(pub, l.api("STREAM.UPDATE."+kvStream(consumer.ParkedBucket), "deny roll-ups and purges on a parked bucket created by an earlier release")...)
	pub = slices.Concat(pub,
		l.api("INFO", "nats.go reads the account's JetStream limits before it creates a bucket"),
		l.kvPut(bindings, ">", "the only writer of binding records"),
		l.kvGet(bindings, ">", "read a record after a compare-and-set conflict, or for the operator"),
		l.kvPut(nodes, kvbinding.LeaseKey(l.Name), "hold the handler lease"),
		l.kvGet(nodes, kvbinding.LeaseKey(l.Name), "read the handler lease"),
		l.kvPut(nodes, kvbinding.FloorKey, "raise the routing floor (compare-and-set)"),
		l.api("CONSUMER.CREATE."+kvStream(nodes)+".*."+kvSubject(nodes, kvbinding.LeaseKey(l.Name)), "watch the lease: create the watcher"),
		[]Grant{{"$JS.FC." + kvStream(nodes) + ".>", "flow control replies of the lease watcher"}},
	)
	for _, n := range l.Nodes {
		if n != node {
			pub = append(pub, l.kvGet(nodes, kvbinding.LiveKey(n), "read a gone node's liveness record again before evacuating it")...)
		}
	}
	// Pausing and resuming queues (one API subject) is every node's right.
	pub = append(pub, Grant{proposals.SubjectHandlerPrefix + l.Name + ".ping", "a standby probes the active handler"})
	for _, k := range HandlerEvents {
		pub = append(pub, Grant{proposals.SubjectEventsPrefix + k, "publish " + k + " events"})
	}
	return pub
}

// handlerSubscribe is what a LOCAL node subscribes to besides its inbox.
func (l Layout) handlerSubscribe() []Grant {
	sub := []Grant{
		{proposals.SubjectPropose, "answer every node's proposals (it checks the proposer against the subject)"},
		{proposals.SubjectAdmin, "answer operator moves and unbinds"},
		{proposals.SubjectHandlerPrefix + l.Name + ".ping", "answer a standby's probe"},
	}
	for _, verb := range []micro.Verb{micro.PingVerb, micro.InfoVerb, micro.StatsVerb} {
		for _, name := range [][2]string{{"", ""}, {proposals.ServiceName, ""}, {proposals.ServiceName, "*"}} {
			s, _ := micro.ControlSubject(verb, name[0], name[1])
			sub = append(sub, Grant{s, "the NATS micro service " + proposals.ServiceName + " (nats micro ls)"})
		}
	}
	return sub
}

func (l Layout) operator() User {
	u := l.user("operator", Operator, "moves and unbinds groups; lists, retries, skips and releases parked groups; reads bindings, nodes, queues and events")
	bindings, nodes := kvbinding.DefaultBucket, kvbinding.DefaultNodesBucket
	pub := []Grant{{proposals.SubjectAdmin, "grouprouter move and unbind"}}
	for _, s := range []string{kvStream(bindings), kvStream(nodes), router.QueueStream, router.EventsStream} {
		pub = append(pub, l.api("STREAM.INFO."+s, "look the stream up")...)
	}
	u.Publish.Allow = slices.Concat(pub,
		l.ordered(kvStream(bindings), kvSubject(bindings, ">"), "grouprouter bindings, groups"),
		l.kvGet(bindings, ">", "grouprouter move --wait, where: read a record"),
		l.api("CONSUMER.CREATE."+kvStream(nodes)+".*."+kvSubject(nodes, kvbinding.LiveKey(">")), "grouprouter nodes, groups: list the live nodes"),
		l.api("CONSUMER.DELETE."+kvStream(nodes)+".*", "grouprouter nodes: end the listing"),
		[]Grant{{"$JS.FC." + kvStream(nodes) + ".>", "flow control replies of the listing"}},
		l.kvGet(nodes, kvbinding.LeaseKey(l.Name), "grouprouter nodes: the active handler"),
		l.api("CONSUMER.LIST."+router.QueueStream, "grouprouter groups, where: what the queue consumers were delivered"),
		l.api("STREAM.MSG.GET."+router.QueueStream, "grouprouter groups, where: messages waiting on queues"),
		l.api("STREAM.INFO."+consumer.ParkedStream, "grouprouter parked, where: count the parked messages"),
		l.api("STREAM.INFO."+kvStream(consumer.ParkedBucket), "grouprouter parked, retry, skip, release: look the bucket up"),
		l.ordered(kvStream(consumer.ParkedBucket), kvSubject(consumer.ParkedBucket, ">"), "grouprouter parked: list the parked groups"),
		[]Grant{{"$JS.FC." + kvStream(consumer.ParkedBucket) + ".>", "flow control replies of the listing"}},
		l.kvGet(consumer.ParkedBucket, ">", "grouprouter parked, where, retry, skip, release: read a parked record"),
		l.kvPut(consumer.ParkedBucket, ">", "grouprouter retry, skip, release: ask for a replay"),
		l.api("STREAM.MSG.GET."+consumer.ParkedStream, "grouprouter parked, skip: the head parked message"),
		l.events(),
	)
	u.Subscribe.Allow = append(u.Subscribe.Allow, Grant{proposals.SubjectEventsPrefix + proposals.EventProgress,
		"grouprouter move --wait: follow the hand-over's progress"})
	return u
}

// events are the grants of reading the events stream.
func (l Layout) events() []Grant {
	return slices.Concat(
		l.ordered(router.EventsStream, "", "grouprouter events"),
		l.api("CONSUMER.CREATE."+router.EventsStream+".*."+proposals.SubjectEventsPrefix+">", "grouprouter events --kind: create a filtered ordered consumer"),
	)
}

func (l Layout) observer() User {
	u := l.user("observer", Observer, "reads events: live on "+proposals.SubjectEventsPrefix+"> or from stream "+router.EventsStream)
	u.Publish.Allow = slices.Concat(l.api("STREAM.INFO."+router.EventsStream, "look the events stream up"), l.events())
	u.Subscribe.Allow = append(u.Subscribe.Allow, Grant{proposals.SubjectEventsPrefix + ">", "events as they happen"})
	return u
}
