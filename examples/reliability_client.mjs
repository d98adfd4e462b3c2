// A Node application using `sdsync reliability serve` (the seed-004 reliability API over
// gRPC): connect, subscribe to events, open a channel, wrap a message, unwrap received
// bytes, and print the events the service sends while it runs the protocol's timers,
// processing each once (by its seq) and acknowledging them, as durable events want.
//
// Run a server, then this client against the address it prints:
//
//   .venv/bin/sdsync reliability serve --listen 127.0.0.1:0 --participant alice \
//       --resend-interval-ms 500 --sync-interval-ms 1000
//   # listening on 127.0.0.1:PORT
//   cd examples && npm install --no-save @grpc/grpc-js@1.14.7 @grpc/proto-loader@0.8.1
//   node reliability_client.mjs 127.0.0.1:PORT [SECONDS]
//
// With the server's --token (or SDSYNC_RELIABILITY_TOKEN), export the same
// SDSYNC_RELIABILITY_TOKEN here. The client prints events for SECONDS (default 3), then
// exits: with no other participant to acknowledge it, "hello" is resent (Transmit
// resend) every resend interval, with backoff, until the maximum number of attempts.
// Before it exits it resubscribes once, as after a disconnect, and acknowledges.
// tests/interop/test_reliability_grpc_node.py runs this file; reliability_grpc/group.mjs
// beside it is a fuller client: two participants over a lossy relay and a server kill -9.

import path from "node:path";
import { fileURLToPath } from "node:url";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const [address = "127.0.0.1:50051", seconds = "3"] = process.argv.slice(2);
const PROTO = path.resolve(
  path.dirname(fileURLToPath(import.meta.url)),
  "../src/sdsync/reliability/reliability.proto",
);
const CHANNEL = "general";

// keepCase: the .proto's snake_case field names; oneofs: `event.event` names which
// member of Event's oneof is set.
const definition = protoLoader.loadSync(PROTO, {
  keepCase: true,
  longs: Number, // seq as a number
  defaults: true,
  oneofs: true,
});
const { Reliability } = grpc.loadPackageDefinition(definition).sdsync.reliability.v1;

// The service has no TLS: it listens on loopback, and the token only keeps other local
// users out.
const client = new Reliability(address, grpc.credentials.createInsecure());
const metadata = new grpc.Metadata();
if (process.env.SDSYNC_RELIABILITY_TOKEN) {
  metadata.set("authorization", `Bearer ${process.env.SDSYNC_RELIABILITY_TOKEN}`);
}

// The unary calls as promises.
const call = (method, request) =>
  new Promise((resolve, reject) => {
    client[method](request, metadata, (error, response) =>
      error ? reject(error) : resolve(response),
    );
  });

const short = (id) => `${id.slice(0, 8)}…`;

// 1. Events are durable and numbered: each has its channel's `seq` (1, 2, 3, ...) and comes
//    again on every new stream until acknowledged. So remember the last seq processed per
//    channel, skip anything at or below it, and acknowledge what was processed.
const lastSeq = new Map(); // channel_id -> the last seq processed
const positions = () => [...lastSeq].map(([channel_id, seq]) => ({ channel_id, seq }));
const acknowledge = () => call("AckEvents", { acks: positions() });
let ackTimer = null; // one AckEvents per burst of events (an unacknowledged one comes again)

function handle(event) {
  const body = event[event.event];
  if (event.seq <= (lastSeq.get(event.channel_id) ?? 0)) return; // processed already
  switch (event.event) {
    case "message_ready":
      // Deliver from the event, which carries everything: an unwrap answer lost in a
      // crash loses nothing.
      console.log(`deliver from ${body.sender_id}: "${body.payload}" (${short(body.message_id)})`);
      break;
    case "transmit":
      // Bytes the application must send as it sends wrapped messages: a resend, a
      // sync or a repair. A real application encrypts and sends body.data here.
      console.log(`event transmit: ${body.kind} of ${short(body.message_id)} (${body.data.length} bytes)`);
      break;
    case "message_sent":
      console.log(`event message_sent: ${short(body.message_id)} acknowledged`);
      break;
    default:
      console.log(`event ${event.event} on #${event.channel_id}`);
  }
  lastSeq.set(event.channel_id, event.seq); // a real application stores it with its data
  ackTimer ??= setTimeout(() => {
    ackTimer = null;
    acknowledge().catch(() => {}); // lost with the server? The next resume point acks.
  }, 100);
}

// 2. Subscribe, resuming after the last seq processed per channel (nothing the first
//    time): the resume point acknowledges up to it, and the stream starts after it with
//    every event not acknowledged yet. Call it again after any disconnect or restart.
function subscribe() {
  const stream = client.Events({ channel_ids: [CHANNEL], resume: positions() }, metadata);
  return new Promise((resolve, reject) => {
    stream.on("data", (event) => (event.event === "subscribed" ? resolve(stream) : handle(event)));
    stream.on("error", (error) => {
      if (error.code !== grpc.status.CANCELLED) reject(error); // CANCELLED: our own
    });
  });
}
let events = await subscribe();

// 3. Open the channel: bytes for a channel that is not open change nothing.
await call("OpenChannel", { channel_id: CHANNEL });

// 4. Wrap: the answer's bytes are what the application encrypts and sends. With an explicit
//    message id, a wrap whose answer was lost can be retried: same id and payload, the same
//    bytes come back (repeated_wrap).
const wrapped = await call("WrapOutgoingMessage", {
  channel_id: CHANNEL,
  payload: Buffer.from("hello"),
  message_id: crypto.randomUUID(),
});
console.log(`wrapped "hello" as ${short(wrapped.message_id)}: ${wrapped.data.length} bytes to send`);

// 5. Unwrap what the transport received (after decryption). Here the transport echoes
//    our own message back: well formed, on an open channel, but nothing new to show.
const unwrapped = await call("UnwrapReceivedMessage", { data: wrapped.data });
const payload = unwrapped.payload ? `"${unwrapped.payload}"` : "no new payload (our own)";
console.log(`unwrapped ${short(unwrapped.message_id)} on #${unwrapped.channel_id}: ${payload}`);

// Bytes that are not an SDS message are refused with INVALID_ARGUMENT, and change nothing.
try {
  await call("UnwrapReceivedMessage", { data: Buffer.from("not sds") });
} catch (error) {
  console.log(`garbage refused: ${grpc.status[error.code]}: ${error.details}`);
}

// 6. Meanwhile the server's timers produce events; print them for a while. Then leave and
//    come back as after a disconnect: the new stream resumes after what was processed.
await new Promise((resolve) => setTimeout(resolve, Number(seconds) * 1000));
events.cancel();
events = await subscribe();
console.log(`resumed after seq ${lastSeq.get(CHANNEL) ?? 0}`);
events.cancel();
clearTimeout(ackTimer);
await acknowledge();
client.close();
