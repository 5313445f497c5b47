// Consumes a grouprouter node's queue with nats.js v3, as an application in
// another language does: what package consumer does in Go, reduced to what
// such a client must do.
//
//   node dist/consume.js <nats-url> <node> <count>
//
// - Pull from the node's durable consumer grouping-node-<node> on stream
//   GROUPING_QUEUE, with the priority group "grouping" (the default pinned
//   queue mode: one client of the node is pinned; standbys take over after
//   its PinnedTTL).
// - A group's messages arrive in ingress order; Grouping-Ingress-Seq says
//   where each stands. A message at or below the last one this program
//   applied for its group is a copy (JetStream's redelivery after an ack
//   that did not arrive): acknowledged, not applied again.
// - Grouping-Epoch grows with every move of the group. The application's
//   store keeps, per group, the highest (epoch, ingress sequence) it
//   applied, and applies a message only above it: a copy made before a move
//   (a lower epoch) can never overwrite what the group's new node wrote.
// - Acknowledge after applying; the node's queue is a work queue.
//
// It stops after <count> messages, checks that each group's bodies came in
// the order they were published ("<group>:<i>", i from 0) and prints
// "ok <count>", or the first violation and exits 1.

import { connect } from "@nats-io/transport-node";
import { jetstream } from "@nats-io/jetstream";

type Fence = { epoch: number; seq: number };

async function main(): Promise<number> {
  const [url, node, countArg] = process.argv.slice(2);
  const want = Number(countArg);
  if (!url || !node || !Number.isInteger(want) || want <= 0) {
    console.log("usage: consume.js <nats-url> <node> <count>");
    return 2;
  }
  const nc = await connect({ servers: url, name: `ts-consumer-${node}` });
  const js = jetstream(nc);
  // The node creates its queue consumer when it starts: wait for it.
  let consumer;
  for (let attempt = 0; ; attempt++) {
    try {
      consumer = await js.consumers.get("GROUPING_QUEUE", `grouping-node-${node}`);
      break;
    } catch (err) {
      if (attempt === 0) {
        console.error(`waiting for node ${node}'s queue consumer: ${err}`);
      }
      await new Promise((r) => setTimeout(r, 250));
    }
  }
  const store = new Map<string, Fence>(); // the application's store: per group, its fence
  const next = new Map<string, number>(); // per group, the body index expected next
  let got = 0;
  let copies = 0;
  let bad = "";
  const timer = setTimeout(() => {
    bad = bad || `timed out with ${got} of ${want} messages`;
    messages.stop();
  }, 30_000);
  const messages = await consumer.consume({ group: "grouping", max_messages: 64 });
  for await (const m of messages) {
    const group = m.headers?.get("Group-Id") ?? "";
    const seq = Number(m.headers?.get("Grouping-Ingress-Seq"));
    const epoch = Number(m.headers?.get("Grouping-Epoch"));
    const fence = store.get(group);
    if (fence && (epoch < fence.epoch || seq <= fence.seq)) {
      copies++; // applied before: a redelivery, or a copy from before a move
      m.ack();
      continue;
    }
    const i = next.get(group) ?? 0;
    const body = m.string();
    if (body !== `${group}:${i}` && !bad) {
      bad = `group ${group}: got "${body}", want "${group}:${i}" (ingress seq ${seq}, epoch ${epoch})`;
    }
    store.set(group, { epoch, seq }); // applied together with the write it fences
    next.set(group, i + 1);
    await m.ackAck(); // a confirmed ack: the message is done
    if (++got === want) {
      messages.stop();
    }
  }
  clearTimeout(timer);
  await nc.close();
  if (bad) {
    console.log(`order: ${bad}`);
    return 1;
  }
  if (copies > 0) {
    console.error(`${copies} copies acknowledged without applying them`);
  }
  console.log(`ok ${got}`);
  return 0;
}

main().then(
  (code) => process.exit(code),
  (err) => {
    console.log(`error: ${err}`);
    process.exit(1);
  },
);
