// Two participants of one channel, each served by its own `sdsync reliability serve`,
// with this script as both applications and as the lossy network between them.
//
// Theory of operation: for each participant the script subscribes to Events (and waits
// for Subscribed, since the service keeps no events for absent subscribers), opens the
// channel, then wraps --messages payloads per participant, alternating. Every wrapped
// message and every Transmit event (resends, syncs, repairs) goes to the other
// participant's UnwrapReceivedMessage through one relay that drops each of them with
// probability --loss, drawn from a PRNG seeded with --seed: first sends and Transmit
// forwards alike, so only the service's own resends, syncs and repairs can make up for
// what is lost. Each participant's relay queue is FIFO (one unwrap at a time), like a
// transport that delivers in order what it does not lose.
//
// The run is complete when each participant got MessageReady for all of the other's
// messages and MessageSent for all of its own; the script then keeps relaying for
// --linger-ms so that a late duplicate event would still be counted, and prints one JSON
// line:
//   {"complete": true|false, "error": null|"...", "dropped": D, "forwarded": F,
//    "transmits": {"resend": R, "sync": S, ...},
//    "participants": {"alice": {"wrapped": [ids], "delivered": [ids, MessageReady order],
//                               "sent": [ids, MessageSent order],
//                               "received": [[id, payload text], ... unwrap order]}, ...}}
// Exit code 0 when complete, 1 otherwise (timeout or error), 2 for bad arguments.
//
//   node group.mjs --server alice=127.0.0.1:PORT_A --server bob=127.0.0.1:PORT_B \
//       [--channel room] [--messages 10] [--loss 0.3] [--seed 1] [--timeout-ms 60000]
//       [--linger-ms 500] [--proto PATH]

import path from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const DEFAULT_PROTO = path.resolve(HERE, "../../../src/sdsync/reliability/reliability.proto");

function usage(message) {
  process.stderr.write(`group.mjs: ${message}\n`);
  process.exit(2);
}

function options() {
  const { values } = parseArgs({
    options: {
      server: { type: "string", multiple: true, default: [] },
      channel: { type: "string", default: "room" },
      messages: { type: "string", default: "10" },
      loss: { type: "string", default: "0.3" },
      seed: { type: "string", default: "1" },
      "timeout-ms": { type: "string", default: "60000" },
      "linger-ms": { type: "string", default: "500" },
      proto: { type: "string", default: DEFAULT_PROTO },
    },
  });
  if (values.server.length !== 2) usage("give --server NAME=127.0.0.1:PORT twice");
  const servers = values.server.map((spec) => {
    const match = /^([^=]+)=127\.0\.0\.1:(\d+)$/.exec(spec);
    // The service has no TLS: this test client talks to loopback only.
    if (!match) usage(`--server ${spec}: expected NAME=127.0.0.1:PORT`);
    return { name: match[1], address: `127.0.0.1:${match[2]}` };
  });
  const loss = Number(values.loss);
  if (!(loss >= 0 && loss < 1)) usage("--loss must be in [0, 1)");
  return {
    servers,
    channel: values.channel,
    messages: Number.parseInt(values.messages, 10),
    loss,
    seed: Number.parseInt(values.seed, 10),
    timeoutMs: Number.parseInt(values["timeout-ms"], 10),
    lingerMs: Number.parseInt(values["linger-ms"], 10),
    proto: values.proto,
  };
}

// mulberry32: a small seeded PRNG, so that a run's loss pattern is chosen by --seed.
function prng(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = state;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

function loadService(protoPath) {
  const definition = protoLoader.loadSync(protoPath, {
    keepCase: true, // the .proto's field names, as every other client sees them
    defaults: true,
    oneofs: true, // event.event names the member of Event's oneof that is set
  });
  return grpc.loadPackageDefinition(definition).sdsync.reliability.v1.Reliability;
}

class Participant {
  constructor(name, address, Service, channel) {
    this.name = name;
    this.channel = channel;
    this.client = new Service(address, grpc.credentials.createInsecure());
    this.wrapped = [];
    this.delivered = [];
    this.sent = [];
    this.received = [];
    this.inbox = Promise.resolve(); // the relay's FIFO queue towards this participant
    this.stream = null;
  }

  call(method, request) {
    return new Promise((resolve, reject) => {
      this.client[method](request, (error, response) => (error ? reject(error) : resolve(response)));
    });
  }

  // Resolves once the stream says Subscribed; every later event goes to onEvent.
  subscribe(onEvent, onError) {
    return new Promise((resolve, reject) => {
      this.stream = this.client.Events({ channel_ids: [this.channel] });
      this.stream.on("data", (event) => {
        if (event.event === "subscribed") resolve();
        else onEvent(this, event);
      });
      this.stream.on("error", (error) => {
        if (error.code === grpc.status.CANCELLED) return; // our own cancel at the end
        reject(error);
        onError(new Error(`${this.name}: Events ended: ${error.message}`));
      });
    });
  }

  close() {
    this.stream?.cancel();
    this.client.close();
  }
}

async function main() {
  const opts = options();
  const Service = loadService(opts.proto);
  const [first, second] = opts.servers.map(
    ({ name, address }) => new Participant(name, address, Service, opts.channel),
  );
  const other = new Map([
    [first, second],
    [second, first],
  ]);
  const random = prng(opts.seed);
  const transmits = {};
  let dropped = 0;
  let forwarded = 0;
  let failure = null;
  let stopped = false; // once set, the relay carries nothing more
  let finish;
  const finished = new Promise((resolve) => {
    finish = () => {
      stopped = true;
      resolve();
    };
  });

  const fail = (error) => {
    failure ??= error;
    finish();
  };

  const complete = () =>
    [first, second].every((p) => {
      const theirs = other.get(p).wrapped;
      const delivered = new Set(p.delivered);
      const sent = new Set(p.sent);
      return (
        p.wrapped.length === opts.messages &&
        theirs.length === opts.messages &&
        theirs.every((id) => delivered.has(id)) &&
        p.wrapped.every((id) => sent.has(id))
      );
    });

  const relay = (from, data) => {
    if (stopped) return;
    if (random() < opts.loss) {
      dropped += 1;
      return;
    }
    forwarded += 1;
    const to = other.get(from);
    to.inbox = to.inbox.then(async () => {
      if (stopped) return;
      try {
        const answer = await to.call("UnwrapReceivedMessage", { data });
        // An absent optional field stays undefined: a duplicate, a sync, nothing new.
        if (answer.payload != null) {
          to.received.push([answer.message_id, answer.payload.toString("utf8")]);
        }
      } catch (error) {
        fail(new Error(`${to.name}: UnwrapReceivedMessage: ${error.message}`));
      }
    });
  };

  const onEvent = (p, event) => {
    const body = event[event.event];
    switch (event.event) {
      case "message_ready":
        p.delivered.push(body.message_id);
        break;
      case "message_sent":
        p.sent.push(body.message_id);
        break;
      case "transmit":
        transmits[body.kind] = (transmits[body.kind] ?? 0) + 1;
        relay(p, body.data);
        break;
      case "send_failed":
        fail(new Error(`${p.name}: SendFailed for ${body.message_id}`));
        return;
      default:
        return; // PossiblyAcknowledged, MissingDependencies, PeriodicSync: nothing to do
    }
    if (complete()) setTimeout(finish, opts.lingerMs);
  };

  const timer = setTimeout(finish, opts.timeoutMs);
  try {
    await Promise.all([first, second].map((p) => p.subscribe(onEvent, fail)));
    for (const p of [first, second]) await p.call("OpenChannel", { channel_id: opts.channel });
    for (let i = 0; i < opts.messages && !failure; i += 1) {
      for (const p of [first, second]) {
        const payload = Buffer.from(`${p.name}:${i}`);
        const answer = await p.call("WrapOutgoingMessage", { channel_id: opts.channel, payload });
        p.wrapped.push(answer.message_id);
        relay(p, answer.data);
      }
    }
    await finished;
  } catch (error) {
    failure ??= error;
  } finally {
    clearTimeout(timer);
  }

  const done = !failure && complete();
  const participants = {};
  for (const p of [first, second]) {
    const { wrapped, delivered, sent, received } = p;
    participants[p.name] = { wrapped, delivered, sent, received };
  }
  const result = {
    complete: done,
    error: failure ? String(failure.message ?? failure) : null,
    dropped,
    forwarded,
    transmits,
    participants,
  };
  process.stdout.write(`${JSON.stringify(result)}\n`);
  for (const p of [first, second]) p.close();
  process.exitCode = done ? 0 : 1;
}

await main();
