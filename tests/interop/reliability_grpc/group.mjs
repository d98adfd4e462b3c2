// Two participants of one channel, each served by its own `sdsync reliability serve`,
// with this script as both applications and as the lossy network between them; with
// --kill, one server is killed (SIGKILL, by the test) mid-run and the application resumes.
//
// Theory of operation: for each participant the script subscribes to Events, opens the
// channel, then wraps --messages payloads per participant, alternating, each under an
// explicit message id (`NAME-i`, payload `NAME:i`) so that a wrap whose answer is lost
// can be retried. Every wrapped message and every Transmit event (resends, syncs,
// repairs) goes to the other participant's UnwrapReceivedMessage through one relay that
// drops each of them with probability --loss, drawn from a PRNG seeded with --seed: first
// sends and Transmit forwards alike, so only the service's own resends, syncs and repairs
// can make up for what is lost. Each participant's relay queue is FIFO (one unwrap at a
// time), like a transport that delivers in order what it does not lose.
//
// Events are processed as the service's durable events are meant to be: per channel the
// application remembers the last seq it processed, skips any event at or below it (a
// re-sent one: dedup by (channel_id, seq)), acknowledges what it processed with AckEvents
// (batched, shortly after), and resubscribes after a disconnect with that seq as the
// resume point. Deliveries come from MessageReady, which carries the payload and sender;
// unwrap answers are only recorded, to check that they agree.
//
// With --kill NAME (the victim; the other is the peer), at message --kill-at:
//   1. once the victim has every message of the peer so far, acknowledgements stop and
//      each side processes at least one event it has not acknowledged;
//   2. the peer's stream is dropped and reopened without a resume point: the server
//      re-sends what was not acknowledged, and the application skips what it processed;
//   3. the victim's events are no longer processed (they arrive and are only noted); the
//      peer wraps message i and the victim unwraps it; the victim wraps its message i
//      and the application throws the answer away (as if the crash had lost it); it waits
//      until the unwrapped message's MessageReady has arrived (noted, not processed);
//   4. the script prints `kill NAME` on stdout and waits on stdin for
//      `restarted NAME 127.0.0.1:PORT`: the test has SIGKILLed the server and started it
//      again on the same --state-dir and --participant;
//   5. it connects there, notes ListChannels, resubscribes with resume = the last seq it
//      processed, retries the lost wrap (same id and payload: the same bytes come back,
//      repeated_wrap) and carries on.
//
// The run is complete when each participant got MessageReady for all of the other's
// messages and MessageSent for all of its own; the script then keeps relaying for
// --linger-ms so that a late duplicate event would still be counted, and prints one JSON
// line (the last on stdout):
//   {"complete": true|false, "error": null|"...", "dropped": D, "forwarded": F,
//    "transmits": {"resend": R, "sync": S, ...},
//    "participants": {"alice": {
//        "wrapped": [[id, payload text], ...],
//        "delivered": [[seq, id, sender_id, payload text], ... MessageReady, processed],
//        "sent": [ids, MessageSent order, processed],
//        "received": [[id, payload text], ... unwrap answers with a payload],
//        "processed": last seq processed, "duplicates": events skipped (seq <= processed),
//        "gaps": events processed whose seq was not processed + 1, "discarded": N,
//        "resubscribed": [{"resume": seq|null, "duplicates_before": N}, ...],
//        "restart": null | {"resume": seq, "ack_sent": seq, "before": address,
//                           "after": address, "channel": {last_seq, acknowledged_seq, ...},
//                           "unprocessed": [[seq, kind, id], ...] (seen, not processed),
//                           "resent": [[seq, kind, id], ...] (the same seqs, after),
//                           "delivered_before": N, "kill_unwrap": [id, payload text],
//                           "lost_wrap": id, "retried": {"repeated_wrap": b, "same_bytes": b}}
//    }, ...}}
// Exit code 0 when complete, 1 otherwise (timeout or error), 2 for bad arguments.
//
//   node group.mjs --server alice=127.0.0.1:PORT_A --server bob=127.0.0.1:PORT_B \
//       [--channel room] [--messages 10] [--loss 0.3] [--seed 1] [--timeout-ms 60000]
//       [--linger-ms 500] [--kill bob --kill-at 5] [--proto PATH]

import path from "node:path";
import readline from "node:readline";
import { fileURLToPath } from "node:url";
import { parseArgs } from "node:util";

import grpc from "@grpc/grpc-js";
import protoLoader from "@grpc/proto-loader";

const HERE = path.dirname(fileURLToPath(import.meta.url));
const DEFAULT_PROTO = path.resolve(HERE, "../../../src/sdsync/reliability/reliability.proto");
const LOOPBACK = /^127\.0\.0\.1:\d+$/;
const ACK_DELAY_MS = 50; // acknowledgements are batched: one AckEvents per burst of events
const POLL_MS = 20;

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
      kill: { type: "string" },
      "kill-at": { type: "string" },
      proto: { type: "string", default: DEFAULT_PROTO },
    },
  });
  if (values.server.length !== 2) usage("give --server NAME=127.0.0.1:PORT twice");
  const servers = values.server.map((spec) => {
    const match = /^([^=]+)=(127\.0\.0\.1:\d+)$/.exec(spec);
    // The service has no TLS: this test client talks to loopback only.
    if (!match) usage(`--server ${spec}: expected NAME=127.0.0.1:PORT`);
    return { name: match[1], address: match[2] };
  });
  const loss = Number(values.loss);
  if (!(loss >= 0 && loss < 1)) usage("--loss must be in [0, 1)");
  const messages = Number.parseInt(values.messages, 10);
  const kill = values.kill ?? null;
  const killAt = Number.parseInt(values["kill-at"] ?? String(Math.floor(messages / 2)), 10);
  if (kill !== null && !servers.some((s) => s.name === kill)) usage(`--kill ${kill}: no --server`);
  if (kill !== null && !(killAt >= 1 && killAt < messages)) usage("--kill-at: in [1, messages)");
  return {
    servers,
    channel: values.channel,
    messages,
    loss,
    seed: Number.parseInt(values.seed, 10),
    timeoutMs: Number.parseInt(values["timeout-ms"], 10),
    lingerMs: Number.parseInt(values["linger-ms"], 10),
    kill,
    killAt,
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
    longs: Number, // seq and friends as numbers (they stay far below 2^53)
    defaults: true,
    oneofs: true, // event.event names the member of Event's oneof that is set
  });
  return grpc.loadPackageDefinition(definition).sdsync.reliability.v1.Reliability;
}

// The test's answers on stdin: `restarted NAME 127.0.0.1:PORT`, one per `kill NAME`.
class Control {
  constructor() {
    this.waiting = new Map();
    this.lines = readline.createInterface({ input: process.stdin });
    this.lines.on("line", (line) => {
      const match = /^restarted (\S+) (\S+)$/.exec(line.trim());
      if (match && LOOPBACK.test(match[2])) this.waiting.get(match[1])?.(match[2]);
      else process.stderr.write(`group.mjs: ignored on stdin: ${line}\n`);
    });
  }

  // Asks the test to kill NAME's server; resolves with the restarted server's address.
  kill(name) {
    const restarted = new Promise((resolve) => this.waiting.set(name, resolve));
    process.stdout.write(`kill ${name}\n`);
    return restarted;
  }

  close() {
    this.lines.close();
  }
}

class Participant {
  constructor(name, address, Service, channel) {
    this.name = name;
    this.address = address;
    this.Service = Service;
    this.channel = channel;
    this.client = new Service(address, grpc.credentials.createInsecure());
    this.wrapped = [];
    this.delivered = [];
    this.deliveredIds = new Set();
    this.sent = [];
    this.received = [];
    this.inbox = Promise.resolve(); // the relay's FIFO queue towards this participant
    this.stream = null; // the Events stream whose events count; others are left behind
    // Durable events: the last seq processed and the last one acknowledged (sent in an
    // AckEvents, answered or not), per channel; here there is one channel.
    this.processed = 0;
    this.ackSent = 0;
    this.ackTimer = null;
    this.acksPaused = false;
    this.frozen = false; // events arrive but are not processed (the victim, before a kill)
    this.unprocessed = []; // [seq, kind, id] that arrived while frozen
    this.duplicates = 0;
    this.gaps = 0;
    this.discarded = 0;
    this.resubscribed = [];
    this.restart = null;
  }

  call(method, request) {
    return new Promise((resolve, reject) => {
      this.client[method](request, (error, response) => (error ? reject(error) : resolve(response)));
    });
  }

  // A new Events stream (resume: the seq to resume after, or null for none); resolves
  // once it says Subscribed. Its events go to onEvent(this, event) while it is current.
  subscribe(resume, onEvent, onError) {
    const request = { channel_ids: [this.channel] };
    if (resume !== null) request.resume = [{ channel_id: this.channel, seq: resume }];
    const stream = this.client.Events(request);
    this.stream?.cancel(); // the stream we leave (its events not acknowledged come again)
    this.stream = stream;
    return new Promise((resolve, reject) => {
      stream.on("data", (event) => {
        if (stream !== this.stream) return; // a stream we left: its events come again
        if (event.event === "subscribed") resolve();
        else onEvent(this, event);
      });
      stream.on("error", (error) => {
        // CANCELLED: our own cancel; a stream we left (its server was killed, say).
        if (error.code === grpc.status.CANCELLED || stream !== this.stream) return;
        reject(error);
        onError(new Error(`${this.name}: Events ended: ${error.message}`));
      });
    });
  }

  // Acknowledge what was processed, shortly (one AckEvents for a burst of events).
  scheduleAck(fail) {
    if (this.acksPaused || this.ackTimer !== null) return;
    this.ackTimer = setTimeout(() => {
      this.ackTimer = null;
      if (this.acksPaused || this.processed <= this.ackSent) return;
      this.ackSent = this.processed;
      const acks = [{ channel_id: this.channel, seq: this.processed }];
      this.call("AckEvents", { acks }).catch((error) => {
        // A server that went away: the next Events call's resume point acknowledges.
        if (error.code !== grpc.status.UNAVAILABLE && error.code !== grpc.status.CANCELLED) {
          fail(new Error(`${this.name}: AckEvents: ${error.message}`));
        }
      });
    }, ACK_DELAY_MS);
  }

  pauseAcks() {
    this.acksPaused = true;
    clearTimeout(this.ackTimer);
    this.ackTimer = null;
  }

  reconnect(address) {
    this.client.close();
    this.address = address;
    this.client = new this.Service(address, grpc.credentials.createInsecure());
  }

  close() {
    clearTimeout(this.ackTimer);
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
  const control = opts.kill === null ? null : new Control();
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

  // Resolves when ready() holds (checked every POLL_MS), or once the run is over.
  const until = (ready) =>
    new Promise((resolve) => {
      const check = () => (stopped || ready() ? resolve() : setTimeout(check, POLL_MS));
      check();
    });

  const complete = () =>
    [first, second].every((p) => {
      const theirs = other.get(p).wrapped;
      const sent = new Set(p.sent);
      return (
        p.wrapped.length === opts.messages &&
        theirs.length === opts.messages &&
        theirs.every(([id]) => p.deliveredIds.has(id)) &&
        p.wrapped.every(([id]) => sent.has(id))
      );
    });

  const unwrapAt = async (to, data) => {
    const answer = await to.call("UnwrapReceivedMessage", { data });
    // An absent optional field stays undefined: a duplicate, a sync, nothing new.
    if (answer.payload != null) {
      to.received.push([answer.message_id, answer.payload.toString("utf8")]);
    }
    return answer;
  };

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
        await unwrapAt(to, data);
      } catch (error) {
        fail(new Error(`${to.name}: UnwrapReceivedMessage: ${error.message}`));
      }
    });
  };

  const wrapRequest = (p, i) => ({
    channel_id: opts.channel,
    payload: Buffer.from(`${p.name}:${i}`),
    message_id: `${p.name}-${i}`,
  });

  const wrap = async (p, i) => {
    const request = wrapRequest(p, i);
    const answer = await p.call("WrapOutgoingMessage", request);
    p.wrapped.push([answer.message_id, request.payload.toString("utf8")]);
    return answer;
  };

  const onEvent = (p, event) => {
    const seq = event.seq;
    const body = event[event.event];
    if (p.frozen) {
      p.unprocessed.push([seq, event.event, body.message_id ?? ""]);
      return;
    }
    if (seq <= p.processed) {
      p.duplicates += 1; // re-sent: processed already
      return;
    }
    if (seq !== p.processed + 1) p.gaps += 1;
    switch (event.event) {
      case "message_ready":
        p.delivered.push([seq, body.message_id, body.sender_id, body.payload.toString("utf8")]);
        p.deliveredIds.add(body.message_id);
        break;
      case "message_sent":
        p.sent.push(body.message_id);
        break;
      case "transmit":
        transmits[body.kind] = (transmits[body.kind] ?? 0) + 1;
        relay(p, body.data);
        break;
      case "events_discarded":
        p.discarded += 1;
        break;
      case "send_failed":
        fail(new Error(`${p.name}: SendFailed for ${body.message_id}`));
        return;
      default:
        // PossiblyAcknowledged, MissingDependencies, PeriodicSync, MessageEvicted: nothing to do
        break;
    }
    if (p.restart !== null && p.restart.unprocessed.some(([s]) => s === seq)) {
      p.restart.resent.push([seq, event.event, body.message_id ?? ""]);
    }
    p.processed = seq;
    p.scheduleAck(fail);
    if (complete()) setTimeout(finish, opts.lingerMs);
  };

  // Steps 1-5 of the header, for message i: the victim's server is killed and restarted.
  const killAndResume = async (victim, i) => {
    const peer = other.get(victim);
    // 1. The victim has every message of the peer so far: the next one is ready at once.
    await until(() => peer.wrapped.every(([id]) => victim.deliveredIds.has(id)));
    for (const p of [victim, peer]) p.pauseAcks();
    await until(() => [victim, peer].every((p) => p.processed > p.ackSent));
    if (stopped) return;
    // 2. The peer: a new stream without a resume point, so the server re-sends what was
    //    processed but not acknowledged, and the application skips it by seq.
    const before = peer.duplicates;
    await peer.subscribe(null, onEvent, fail);
    peer.resubscribed.push({ resume: null, duplicates_before: before });
    peer.acksPaused = false;
    // 3. The victim: events are noted, not processed, from here to the kill.
    victim.frozen = true;
    const { data } = await wrap(peer, i); // handed to the victim directly, not relayed
    forwarded += 1;
    const killed = victim.inbox.then(async () => {
      const answer = await unwrapAt(victim, data);
      const lost = await victim.call("WrapOutgoingMessage", wrapRequest(victim, i));
      // Its MessageReady has arrived (noted, not processed): the kill comes before that.
      const ready = ([, kind, id]) => kind === "message_ready" && id === answer.message_id;
      await until(() => victim.unprocessed.some(ready));
      if (stopped) return;
      // 4. The test kills the server; whatever it still sends on this stream is left.
      const restart = {
        resume: victim.processed,
        ack_sent: victim.ackSent,
        before: victim.address,
        after: null,
        channel: null,
        unprocessed: victim.unprocessed,
        resent: [],
        delivered_before: victim.delivered.length,
        kill_unwrap: [answer.message_id, answer.payload?.toString("utf8") ?? null],
        lost_wrap: lost.message_id,
        retried: null,
      };
      victim.stream = null;
      const address = await Promise.race([control.kill(victim.name), finished]);
      if (stopped) return;
      // 5. Resume on the restarted server.
      victim.reconnect(address);
      restart.after = address;
      const { channels } = await victim.call("ListChannels", {});
      restart.channel = channels.find((c) => c.channel_id === opts.channel) ?? null;
      victim.restart = restart;
      victim.frozen = false;
      await victim.subscribe(victim.processed, onEvent, fail);
      victim.resubscribed.push({ resume: victim.processed, duplicates_before: victim.duplicates });
      victim.acksPaused = false;
      const again = await wrap(victim, i);
      const same = again.data.equals(lost.data);
      restart.retried = { repeated_wrap: again.repeated_wrap, same_bytes: same };
      relay(victim, again.data);
    });
    victim.inbox = killed.catch(() => {});
    await killed;
  };

  const timer = setTimeout(finish, opts.timeoutMs);
  try {
    await Promise.all([first, second].map((p) => p.subscribe(null, onEvent, fail)));
    for (const p of [first, second]) await p.call("OpenChannel", { channel_id: opts.channel });
    for (let i = 0; i < opts.messages && !failure; i += 1) {
      const victim = [first, second].find((p) => p.name === opts.kill);
      if (victim && i === opts.killAt) {
        await killAndResume(victim, i);
        continue;
      }
      for (const p of [first, second]) relay(p, (await wrap(p, i)).data);
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
    const { wrapped, delivered, sent, received, processed, duplicates, gaps } = p;
    const { discarded, resubscribed, restart } = p;
    participants[p.name] = {
      ...{ wrapped, delivered, sent, received, processed, duplicates, gaps },
      ...{ discarded, resubscribed, restart },
    };
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
  control?.close();
  process.exitCode = done ? 0 : 1;
}

await main();
