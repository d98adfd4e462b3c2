#!/usr/bin/env node
// Throughput of the reference SDS implementation (npm @waku/sds 0.0.8), measured inside
// Node so that process start-up and result transport are excluded.
//
// For each N: a fresh sender "a" and receiver "b" on channel "0" with the library
// defaults (causal history 200, bloom filter 10k / 0.001, SDS-R enabled). Messages are
// streamed: "a" pushes message i and processes its tasks (capturing the wire bytes in the
// send callback), then "b" decodes those bytes, pushes and processes them. Send and
// receive time are accumulated separately with process.hrtime. Every --ack-every
// messages "b" sends a sync message that "a" receives, outside the timed regions, so the
// sender's outgoing buffer stays bounded the same way as in the Python bench.
//
// Output: one JSON document on stdout. Progress and warnings go to stderr.
//
// Usage (from the repository root):
//   node bench/js/core_bench.mjs [--sizes 1000,2000,5000] [--warmup 200]
//                                [--ack-every 100] [--max-seconds 300] [--no-hints]
//                                [--stages]
//
// --stages adds, per N, a second run with the sender instrumented: the time of each stage
// of a send (id, history, bloom, encode, hint, log, and the rest as bookkeeping), by
// wrapping the library's own calls on that sender (MessageChannel.getMessageId, the local
// history's slice and map and push, the bloom filter's toBytes and insert) and timing the
// encode and the hint in the send callback. Its total is reported apart: the wrappers
// cost time of their own.
//
// Each message gets a 32-byte retrieval hint (sha256 of its id, standing in for a Waku
// message hash) from the send callback, and the receiver is given the same hint, so causal
// history entries carry hints as they would in a deployment. --no-hints disables that.

const LIB_URL = new URL(
  "../../tests/interop/js/node_modules/@waku/sds/dist/index.js",
  import.meta.url
);
const PKG_URL = new URL(
  "../../tests/interop/js/node_modules/@waku/sds/package.json",
  import.meta.url
);

// The library logs through `debug`; keep stdout for the JSON result only.
for (const name of ["log", "info", "debug"]) {
  console[name] = (...args) => console.error(...args);
}

function usageExit(msg) {
  process.stderr.write(
    `error: ${msg}\nusage: node bench/js/core_bench.mjs [--sizes N,N,...] [--warmup N] ` +
      `[--ack-every N] [--max-seconds S] [--no-hints] [--stages]\n`
  );
  process.exit(2);
}

function parseArgs(argv) {
  const opts = {
    sizes: [1000, 2000, 5000],
    warmup: 200,
    ackEvery: 100,
    maxSeconds: 300,
    hints: true,
    stages: false
  };
  const intArg = (flag, v) => {
    if (v === undefined || !/^[0-9]+$/.test(v)) usageExit(`${flag} expects an integer`);
    return Number(v);
  };
  for (let i = 0; i < argv.length; i++) {
    const flag = argv[i];
    const value = argv[i + 1];
    switch (flag) {
      case "--sizes":
        if (value === undefined) usageExit("--sizes needs a value");
        opts.sizes = value.split(",").map((s) => intArg("--sizes", s.trim()));
        i++;
        break;
      case "--warmup":
        opts.warmup = intArg(flag, value);
        i++;
        break;
      case "--ack-every":
        opts.ackEvery = intArg(flag, value);
        i++;
        break;
      case "--max-seconds":
        opts.maxSeconds = Number(value);
        if (!(opts.maxSeconds > 0)) usageExit("--max-seconds expects a positive number");
        i++;
        break;
      case "--no-hints":
        opts.hints = false;
        break;
      case "--stages":
        opts.stages = true;
        break;
      default:
        usageExit(`unknown option ${flag}`);
    }
  }
  return opts;
}

const OPTS = parseArgs(process.argv.slice(2));

let lib;
try {
  lib = await import(LIB_URL.href);
} catch (err) {
  process.stderr.write(
    `cannot load @waku/sds from ${LIB_URL.pathname}: ${err?.message ?? err}\n` +
      "run `cd tests/interop/js && npm ci` first\n"
  );
  process.exit(3);
}
const { MessageChannel, MessageChannelEvent, Message } = lib;
const { readFile } = await import("node:fs/promises");
const { createHash } = await import("node:crypto");
const pkgVersion = JSON.parse(await readFile(PKG_URL, "utf8")).version;

const CHANNEL = "0";
const OPTIONS = { causalHistorySize: 200 }; // bloom is hardcoded to 10000 / 0.001 in 0.0.8
const encoder = new TextEncoder();
const nowNs = () => process.hrtime.bigint();

function countEvents(channel, name) {
  const counter = { n: 0 };
  channel.addEventListener(name, () => {
    counter.n++;
  });
  return counter;
}

async function ackBack(sender, receiver) {
  let wire = null;
  await receiver.pushOutgoingSyncMessage(async (message) => {
    wire = message.encode();
    return true;
  });
  if (wire === null) return;
  const message = Message.decode(wire);
  sender.pushIncomingMessage(message, undefined);
  await sender.processTasks();
}

const STAGES = ["id", "history", "bloom", "encode", "hint", "log"];

// Seconds per stage of the sender's sends; `active` only inside a timed send, so calls the
// receiver makes through the same (static) functions are not counted.
function stageClock() {
  const ns = Object.fromEntries(STAGES.map((s) => [s, 0n]));
  const clock = { ns, active: false };
  clock.timed = (stage, fn) =>
    function (...args) {
      if (!clock.active) return fn.apply(this, args);
      const t0 = nowNs();
      try {
        return fn.apply(this, args);
      } finally {
        ns[stage] += nowNs() - t0;
      }
    };
  return clock;
}

// Wraps what a send calls on `sender` (see the header); returns a function undoing the
// one global patch (the static getMessageId).
function instrument(sender, clock) {
  const getMessageId = MessageChannel.getMessageId;
  MessageChannel.getMessageId = clock.timed("id", getMessageId);
  const history = sender.localHistory;
  const slice = history.slice.bind(history);
  history.slice = clock.timed("history", (...args) => {
    const quoted = slice(...args);
    quoted.map = clock.timed("history", Array.prototype.map.bind(quoted));
    return quoted;
  });
  history.push = clock.timed("log", history.push.bind(history));
  const filter = sender.filter;
  filter.toBytes = clock.timed("bloom", filter.toBytes.bind(filter));
  filter.insert = clock.timed("bloom", filter.insert.bind(filter));
  return () => {
    MessageChannel.getMessageId = getMessageId;
  };
}

async function run(n, { maxSeconds, ackEvery, hints }, clock = null) {
  const sender = new MessageChannel(CHANNEL, "a", OPTIONS);
  const undo = clock === null ? () => {} : instrument(sender, clock);
  const timed = (stage, fn) => (clock === null ? fn() : clock.timed(stage, fn)());
  const receiver = new MessageChannel(CHANNEL, "b", OPTIONS);
  const delivered = countEvents(receiver, MessageChannelEvent.InMessageDelivered);
  const errors = countEvents(sender, MessageChannelEvent.ErrorTask);
  const recvErrors = countEvents(receiver, MessageChannelEvent.ErrorTask);
  const ids = new Set();
  let sendNs = 0n;
  let recvNs = 0n;
  let bytes = 0;
  let completed = 0;
  let capped = false;
  const wallStart = nowNs();
  const capNs = BigInt(Math.round(maxSeconds * 1e9));

  for (let i = 0; i < n; i++) {
    const payload = encoder.encode(`message ${i}`);
    let wire = null;
    let hint = null;
    let t0 = nowNs();
    if (clock !== null) clock.active = true;
    sender.pushOutgoingMessage(payload, async (message) => {
      wire = timed("encode", () => message.encode());
      ids.add(message.messageId);
      if (!hints) return { success: true };
      hint = timed(
        "hint",
        () => new Uint8Array(createHash("sha256").update(message.messageId).digest())
      );
      return { success: true, retrievalHint: hint };
    });
    await sender.processTasks();
    let t1 = nowNs();
    if (clock !== null) clock.active = false;
    sendNs += t1 - t0;
    if (wire === null) throw new Error(`send callback not invoked for message ${i}`);
    bytes += wire.length;

    t0 = nowNs();
    const message = Message.decode(wire);
    receiver.pushIncomingMessage(message, hint ?? undefined);
    await receiver.processTasks();
    t1 = nowNs();
    recvNs += t1 - t0;
    completed++;

    if (ackEvery > 0 && completed % ackEvery === 0) await ackBack(sender, receiver);
    if (t1 - wallStart > capNs && completed < n) {
      capped = true;
      process.stderr.write(
        `js: N=${n} capped after ${completed} messages (${maxSeconds} s wall limit)\n`
      );
      break;
    }
  }
  undo();
  const history = receiver.localHistory;
  return {
    n,
    completed,
    capped,
    send_seconds: Number(sendNs) / 1e9,
    recv_seconds: Number(recvNs) / 1e9,
    wall_seconds: Number(nowNs() - wallStart) / 1e9,
    wire_bytes: bytes,
    distinct_ids: ids.size,
    delivered: delivered.n,
    local_history_length: history?.length ?? null,
    task_errors: errors.n + recvErrors.n
  };
}

const results = [];
if (OPTS.warmup > 0) {
  await run(OPTS.warmup, OPTS);
}
for (const n of OPTS.sizes) {
  process.stderr.write(`js: N=${n} ...\n`);
  const r = await run(n, OPTS);
  if (OPTS.stages) {
    const clock = stageClock();
    const staged = await run(n, OPTS, clock);
    r.stages = {
      completed: staged.completed,
      send_seconds: staged.send_seconds,
      ...Object.fromEntries(STAGES.map((s) => [s, Number(clock.ns[s]) / 1e9]))
    };
  }
  process.stderr.write(
    `js: N=${n} send ${(r.completed / r.send_seconds).toFixed(1)} msg/s, ` +
      `recv ${(r.completed / r.recv_seconds).toFixed(1)} msg/s, wall ${r.wall_seconds.toFixed(1)} s\n`
  );
  results.push(r);
}

process.stdout.write(
  `${JSON.stringify({
    runtime: `node ${process.version}`,
    package: `@waku/sds@${pkgVersion}`,
    warmup: OPTS.warmup,
    ack_every: OPTS.ackEvery,
    hints: OPTS.hints,
    stages: OPTS.stages,
    max_seconds: OPTS.maxSeconds,
    results
  })}\n`
);
