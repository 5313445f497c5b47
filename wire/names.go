package wire

// Names of the JetStream resources of a node's queue.
const (
	// QueueStream holds the per-node queues, subjects grouping.queue.>.
	QueueStream = "GROUPING_QUEUE"
	// QueueSubjectPrefix + <node> + "." + <ingress subject> is a node's queue subject.
	QueueSubjectPrefix = "grouping.queue."
	// HeldSubjectPrefix + <node> + "." + <group key> + "." + <ingress
	// subject> holds, in the queue stream, a group's messages past its
	// share of node's queue window (router/fairshare.go): read by no
	// consumer, moved onto the queue as the consumer acknowledges the
	// group's earlier messages. The group key is kvbinding.Key's (two
	// tokens).
	HeldSubjectPrefix = "grouping.held."
	// QueueConsumerPrefix + <node> is the durable consumer of a node's queue.
	QueueConsumerPrefix = "grouping-node-"
	// PriorityGroup is the priority group consumers of a node's queue pull with.
	PriorityGroup = "grouping"
)

// Headers the router sets on the messages it puts on a node's queue.
const (
	// HeaderIngressSeq carries the ingress stream sequence of the message.
	HeaderIngressSeq = "Grouping-Ingress-Seq"
	// HeaderEpoch carries the group's epoch on every message a node puts
	// on a queue (kvbinding.Binding.Epoch): the revision of the binding
	// record that made the node the group's owner. It grows with every
	// move and is the same for every node, so a consumer that sees a
	// message of a lower epoch than one it processed knows it for a copy
	// made before a move (see docs/protocol.md, "Hand-over and epochs").
	HeaderEpoch = "Grouping-Epoch"
	// HeaderGroupSeq set to -1 on a message closes its group after it (the
	// JMS JMSXGroupSeq convention): the binding is released cluster-wide.
	HeaderGroupSeq = "Group-Seq"
	// HeaderDeliveredBefore is set, to the old node, on a copy a move made
	// of a message that node's consumer had been delivered and not acked
	// when the move took it: that consumer made no progress for its ack
	// wait, so the move went on without it, and it may still have
	// processed the message (at-least-once, as JetStream's own
	// redeliveries; docs/protocol.md, "Hand-over and epochs").
	HeaderDeliveredBefore = "Grouping-Delivered-Before"
)

// QueueSubject returns the queue subject of a message for node.
func QueueSubject(node, ingressSubject string) string {
	return QueueSubjectPrefix + node + "." + ingressSubject
}

// QueueFilter returns the filter subject of node's queue consumer.
func QueueFilter(node string) string { return QueueSubjectPrefix + node + ".>" }

// QueueConsumer returns the durable consumer name of node's queue.
func QueueConsumer(node string) string { return QueueConsumerPrefix + node }
