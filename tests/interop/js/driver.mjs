#!/usr/bin/env node
// Conformance peer for sdsync interop tests.
//
// Wraps ONE MessageChannel of the reference JavaScript implementation
// (npm package @waku/sds, pinned to 0.0.8) behind a JSON-lines protocol:
// one JSON request per stdin line, exactly one JSON reply per line on stdout.
// Diagnostics go to stderr only. See README.md in this folder.
//
// Determinism: Date.now is replaced by a controllable clock (op "clock") and
// Math.random by a seeded PRNG (--seed), both BEFORE the library is loaded.

// ---------------------------------------------------------------------------
// stdout is reserved for replies: route any stray console output to stderr.
// ---------------------------------------------------------------------------
for (const name of ["log", "info", "debug"]) {
  console[name] = (...args) => console.error(...args);
}

function logErr(...args) {
  process.stderr.write(`[sds-js-peer] ${args.join(" ")}\n`);
}

// ---------------------------------------------------------------------------
// CLI
// ---------------------------------------------------------------------------
const USAGE = `usage: node driver.mjs --participant ID [options]
  --channel ID                    channel id (default "0")
  --participant ID                participant (sender) id, required
  --causal-history N              causal history size (default 200)
  --bloom-capacity N              bloom filter capacity (default 10000)
  --bloom-error-rate P            bloom filter error rate (default 0.001)
  --possible-acks-threshold N     possible-acks threshold (default 2)
  --lost-timeout-ms N             timeout before missing deps are lost (default: disabled)
  --no-repair                     disable SDS-R (enableRepair: false)
  --repair-t-min-ms N             SDS-R T_min (library default 30000)
  --repair-t-max-ms N             SDS-R T_max (library default 120000)
  --repair-response-groups N      SDS-R number of response groups (library default 1)
  --seed N                        seed for the Math.random replacement (default 1)`;

function usageExit(msg) {
  process.stderr.write(`error: ${msg}\n${USAGE}\n`);
  process.exit(2);
}

function parseNonNegInt(flag, s) {
  if (typeof s !== "string" || !/^[0-9]+$/.test(s)) {
    usageExit(`${flag} expects a non-negative integer, got ${JSON.stringify(s)}`);
  }
  const n = Number(s);
  if (!Number.isSafeInteger(n)) usageExit(`${flag} is too large`);
  return n;
}

function parseArgs(argv) {
  const opts = {
    channel: "0",
    participant: undefined,
    causalHistory: 200,
    bloomCapacity: undefined,
    bloomErrorRate: undefined,
    possibleAcksThreshold: 2,
    lostTimeoutMs: undefined,
    repair: true,
    repairTMin: undefined,
    repairTMax: undefined,
    repairGroups: undefined,
    seed: 1
  };
  const takesValue = new Set([
    "--channel",
    "--participant",
    "--causal-history",
    "--bloom-capacity",
    "--bloom-error-rate",
    "--possible-acks-threshold",
    "--lost-timeout-ms",
    "--repair-t-min-ms",
    "--repair-t-max-ms",
    "--repair-response-groups",
    "--seed"
  ]);
  for (let i = 0; i < argv.length; i++) {
    let flag = argv[i];
    let value;
    const eq = flag.indexOf("=");
    if (flag.startsWith("--") && eq > 0) {
      value = flag.slice(eq + 1);
      flag = flag.slice(0, eq);
    }
    if (flag === "-h" || flag === "--help") {
      process.stderr.write(`${USAGE}\n`);
      process.exit(0);
    }
    if (flag === "--no-repair") {
      if (value !== undefined) usageExit("--no-repair takes no value");
      opts.repair = false;
      continue;
    }
    if (!takesValue.has(flag)) usageExit(`unknown option ${flag}`);
    if (value === undefined) {
      if (i + 1 >= argv.length) usageExit(`${flag} requires a value`);
      value = argv[++i];
    }
    switch (flag) {
      case "--channel":
        opts.channel = value;
        break;
      case "--participant":
        opts.participant = value;
        break;
      case "--causal-history":
        opts.causalHistory = parseNonNegInt(flag, value);
        break;
      case "--bloom-capacity":
        opts.bloomCapacity = parseNonNegInt(flag, value);
        if (opts.bloomCapacity < 1) usageExit(`${flag} must be >= 1`);
        break;
      case "--bloom-error-rate": {
        const p = Number(value);
        if (!/^[0-9.eE+-]+$/.test(value) || !(p > 0 && p < 1)) {
          usageExit(`${flag} expects a number in (0, 1), got ${JSON.stringify(value)}`);
        }
        opts.bloomErrorRate = p;
        break;
      }
      case "--possible-acks-threshold":
        opts.possibleAcksThreshold = parseNonNegInt(flag, value);
        break;
      case "--lost-timeout-ms":
        opts.lostTimeoutMs = parseNonNegInt(flag, value);
        break;
      case "--repair-t-min-ms":
        opts.repairTMin = parseNonNegInt(flag, value);
        break;
      case "--repair-t-max-ms":
        opts.repairTMax = parseNonNegInt(flag, value);
        break;
      case "--repair-response-groups":
        opts.repairGroups = parseNonNegInt(flag, value);
        if (opts.repairGroups < 1) usageExit(`${flag} must be >= 1`);
        break;
      case "--seed":
        opts.seed = parseNonNegInt(flag, value);
        break;
    }
  }
  if (opts.participant === undefined) usageExit("--participant is required");
  return opts;
}

const OPTS = parseArgs(process.argv.slice(2));

// ---------------------------------------------------------------------------
// Controllable clock (installed before the library is imported)
// ---------------------------------------------------------------------------
const realDateNow = Date.now.bind(Date);
let fakeNowMs = null; // null => real time (until the first "clock" op)
Date.now = function now() {
  return fakeNowMs === null ? realDateNow() : fakeNowMs;
};

// ---------------------------------------------------------------------------
// Deterministic Math.random: mulberry32 stream, two 32-bit draws combined
// into one 53-bit double in [0, 1).
// ---------------------------------------------------------------------------
let prngState = OPTS.seed >>> 0;
function next32() {
  prngState = (prngState + 0x6d2b79f5) >>> 0;
  let t = prngState;
  t = Math.imul(t ^ (t >>> 15), t | 1);
  t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
  return (t ^ (t >>> 14)) >>> 0;
}
Math.random = function random() {
  const hi = next32() >>> 5; // 27 bits
  const lo = next32() >>> 6; // 26 bits
  return (hi * 67108864 + lo) / 9007199254740992;
};

// ---------------------------------------------------------------------------
// Library (loaded only now, so it sees the patched globals)
// ---------------------------------------------------------------------------
const { MessageChannel, MessageChannelEvent, Message } = await import("@waku/sds");

const LIB_DEFAULT_BLOOM = { capacity: 10000, errorRate: 0.001 };

// ---------------------------------------------------------------------------
// Helpers
// ---------------------------------------------------------------------------
class OpError extends Error {
  constructor(kind, message) {
    super(message);
    this.kind = kind;
  }
}
const localError = (msg) => new OpError("local", msg);

function toHex(bytes) {
  if (bytes === undefined || bytes === null) return null;
  return Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength).toString("hex");
}

function fromHex(value, field) {
  if (typeof value !== "string" || !/^(?:[0-9a-fA-F]{2})*$/.test(value)) {
    throw localError(`${field} must be an even-length hex string`);
  }
  return new Uint8Array(Buffer.from(value, "hex"));
}

function optionalHex(req, field) {
  const v = req[field];
  return v === undefined || v === null ? undefined : fromHex(v, field);
}

function lamportToJson(v) {
  if (typeof v !== "bigint") return v;
  const max = BigInt(Number.MAX_SAFE_INTEGER);
  return v <= max && v >= -max ? Number(v) : v.toString();
}

function errorText(err) {
  if (err instanceof Error) return err.message || String(err);
  try {
    return typeof err === "string" ? err : JSON.stringify(err);
  } catch {
    return String(err);
  }
}

// ---------------------------------------------------------------------------
// Channel (constructed lazily at the first non-clock op)
// ---------------------------------------------------------------------------
let channel = null;
let sink = null; // array collecting translated events during an op
let taskErrors = []; // ErrorTask details raised during an op

function emit(ev) {
  if (sink) sink.push(ev);
  else logErr("event outside of an op:", JSON.stringify(ev));
}

function entryEvents(type, entries) {
  for (const e of entries ?? []) {
    emit({ type, message_id: e.messageId, retrieval_hint_hex: toHex(e.retrievalHint) });
  }
}

function subscribe(ch) {
  const E = MessageChannelEvent;
  const on = (name, fn) =>
    ch.addEventListener(name, (event) => {
      try {
        fn(event.detail);
      } catch (err) {
        logErr(`failed to translate event ${name}:`, errorText(err));
      }
    });
  on(E.OutMessageSent, (m) => emit({ type: "message_sent", message_id: m.messageId }));
  on(E.InMessageReceived, (m) => emit({ type: "message_received", message_id: m.messageId }));
  on(E.InMessageDelivered, (id) => emit({ type: "message_delivered", message_id: id }));
  on(E.OutMessageAcknowledged, (id) => emit({ type: "message_acknowledged", message_id: id }));
  on(E.OutMessagePossiblyAcknowledged, (d) =>
    emit({ type: "message_possibly_acknowledged", message_id: d.messageId, count: d.count })
  );
  on(E.InMessageMissing, (entries) => entryEvents("message_missing", entries));
  on(E.InMessageLost, (entries) => entryEvents("message_lost", entries));
  on(E.OutSyncSent, (m) => emit({ type: "sync_sent", message_id: m.messageId }));
  on(E.InSyncReceived, (m) => emit({ type: "sync_received", message_id: m.messageId }));
  on(E.RepairRequestSent, (d) => {
    for (const id of d.messageIds ?? []) {
      emit({ type: "repair_request_sent", message_id: id, carrier_message_id: d.carrierMessageId });
    }
  });
  on(E.RepairRequestReceived, (d) => {
    for (const id of d.messageIds ?? []) {
      emit({ type: "repair_request_received", message_id: id, sender_id: d.fromSenderId ?? null });
    }
  });
  on(E.RepairResponseSent, (d) => emit({ type: "repair_response_sent", message_id: d.messageId }));
  on(E.ErrorTask, (d) => {
    taskErrors.push(d);
    logErr(`task error (${d?.command}):`, errorText(d?.error));
  });
}

function getChannel() {
  if (channel) return channel;
  const options = {
    causalHistorySize: OPTS.causalHistory,
    possibleAcksThreshold: OPTS.possibleAcksThreshold,
    enableRepair: OPTS.repair
  };
  if (OPTS.lostTimeoutMs !== undefined) options.timeoutForLostMessagesMs = OPTS.lostTimeoutMs;
  const repairConfig = {};
  if (OPTS.repairTMin !== undefined) repairConfig.tMin = OPTS.repairTMin;
  if (OPTS.repairTMax !== undefined) repairConfig.tMax = OPTS.repairTMax;
  if (OPTS.repairGroups !== undefined) repairConfig.numResponseGroups = OPTS.repairGroups;
  if (Object.keys(repairConfig).length > 0) options.repairConfig = repairConfig;

  const ch = new MessageChannel(OPTS.channel, OPTS.participant, options);

  // @waku/sds 0.0.8 hardcodes the bloom filter to {capacity: 10000,
  // errorRate: 0.001} in the constructor. To honour other parameters we swap
  // the (still empty) private filter for a fresh one of the same class built
  // with the requested options. The library decodes incoming bloom filters
  // with `this.filter.options`, so sending and receiving stay consistent.
  const bloom = {
    capacity: OPTS.bloomCapacity ?? LIB_DEFAULT_BLOOM.capacity,
    errorRate: OPTS.bloomErrorRate ?? LIB_DEFAULT_BLOOM.errorRate
  };
  if (
    bloom.capacity !== LIB_DEFAULT_BLOOM.capacity ||
    bloom.errorRate !== LIB_DEFAULT_BLOOM.errorRate
  ) {
    const FilterClass = ch.filter?.constructor;
    if (typeof FilterClass !== "function" || typeof ch.filter.toBytes !== "function") {
      throw localError(
        "unsupported: cannot override bloom filter parameters on this @waku/sds build"
      );
    }
    ch.filter = new FilterClass(bloom);
  }

  subscribe(ch);
  channel = ch;
  return ch;
}

function requireChannelFields(ch, names) {
  for (const n of names) {
    if (!(n in ch)) throw localError(`internal field ${n} not found on MessageChannel`);
  }
}

// ---------------------------------------------------------------------------
// Ops
// ---------------------------------------------------------------------------
function firstTaskError(kind) {
  if (taskErrors.length === 0) return null;
  const d = taskErrors[0];
  return new OpError(kind, errorText(d?.error ?? d));
}

const OPS = {
  async clock(req) {
    const n = req.now_ms;
    if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0) {
      throw localError("now_ms must be a non-negative integer");
    }
    fakeNowMs = n;
    return {};
  },

  async send(req) {
    const ch = getChannel();
    const payload = fromHex(req.payload_hex, "payload_hex");
    const hint = optionalHex(req, "retrieval_hint_hex");
    if (req.message_id !== undefined && req.message_id !== null) {
      const expected = MessageChannel.getMessageId(payload);
      if (req.message_id !== expected) {
        throw localError(
          `unsupported: @waku/sds 0.0.8 always uses sha256(payload) as message id (${expected})`
        );
      }
    }
    let wire = null;
    let id = null;
    ch.pushOutgoingMessage(payload, async (message) => {
      wire = message.encode();
      id = message.messageId;
      return hint === undefined ? { success: true } : { success: true, retrievalHint: hint };
    });
    await ch.processTasks();
    const err = firstTaskError("local");
    if (err) throw err;
    if (wire === null) throw localError("library did not invoke the send callback");
    return { message_id: id, wire_hex: toHex(wire), events: sink };
  },

  async receive(req) {
    const ch = getChannel();
    const bytes = fromHex(req.wire_hex, "wire_hex");
    const hint = optionalHex(req, "retrieval_hint_hex");
    const message = Message.decode(bytes);
    if (message === undefined) {
      throw new OpError("remote", "Message.decode failed: not a valid SDS message");
    }
    ch.pushIncomingMessage(message, hint);
    await ch.processTasks();
    const err = firstTaskError("remote");
    if (err) throw err;
    return { events: sink };
  },

  async sync() {
    const ch = getChannel();
    let wire = null;
    const sent = await ch.pushOutgoingSyncMessage(async (message) => {
      wire = message.encode();
      return true;
    });
    return { wire_hex: sent && wire !== null ? toHex(wire) : null, events: sink };
  },

  async ephemeral(req) {
    const ch = getChannel();
    const payload = fromHex(req.payload_hex, "payload_hex");
    let wire = null;
    await ch.pushOutgoingEphemeralMessage(payload, async (message) => {
      wire = message.encode();
      return true;
    });
    await ch.processTasks();
    const err = firstTaskError("local");
    if (err) throw err;
    if (wire === null) throw localError("library did not invoke the ephemeral callback");
    return { wire_hex: toHex(wire), events: sink };
  },

  async sweep_incoming() {
    const ch = getChannel();
    const missing = ch.sweepIncomingBuffer();
    return {
      missing: missing.map((e) => ({
        message_id: e.messageId,
        retrieval_hint_hex: toHex(e.retrievalHint)
      })),
      events: sink
    };
  },

  async sweep_outgoing() {
    const ch = getChannel();
    const { unacknowledged, possiblyAcknowledged } = ch.sweepOutgoingBuffer();
    return {
      unacknowledged: unacknowledged.map((m) => m.messageId),
      possibly_acknowledged: possiblyAcknowledged.map((m) => m.messageId)
    };
  },

  async repair_sweep() {
    const ch = getChannel();
    const wires = [];
    await ch.sweepRepairIncomingBuffer(async (message) => {
      wires.push(toHex(message.encode()));
      return true;
    });
    return { wire_hex_list: wires, events: sink };
  },

  async state() {
    const ch = getChannel();
    requireChannelFields(ch, [
      "lamportTimestamp",
      "localHistory",
      "filter",
      "incomingBuffer",
      "outgoingBuffer"
    ]);
    return {
      lamport: lamportToJson(ch.lamportTimestamp),
      log: ch.localHistory.slice().map((m) => m.messageId),
      bloom_hex: toHex(ch.filter.toBytes()),
      incoming: ch.incomingBuffer.map((m) => m.messageId),
      outgoing: ch.outgoingBuffer.map((m) => m.messageId)
    };
  }
};

async function handleLine(line) {
  let req;
  try {
    req = JSON.parse(line);
  } catch (err) {
    throw localError(`malformed JSON: ${errorText(err)}`);
  }
  if (req === null || typeof req !== "object" || Array.isArray(req)) {
    throw localError("request must be a JSON object");
  }
  const op = req.op;
  if (typeof op !== "string" || !Object.prototype.hasOwnProperty.call(OPS, op)) {
    throw localError(`unknown op: ${JSON.stringify(op)}`);
  }
  sink = [];
  taskErrors = [];
  try {
    const result = await OPS[op](req);
    return { ok: true, ...result };
  } catch (err) {
    // Error replies carry no events; keep a trace of what fired before the failure.
    if (sink && sink.length > 0) {
      logErr(`op ${op} failed; events dropped from reply:`, JSON.stringify(sink));
    }
    throw err;
  } finally {
    sink = null;
    taskErrors = [];
  }
}

function writeReply(obj) {
  process.stdout.write(`${JSON.stringify(obj)}\n`);
}

process.stdout.on("error", (err) => {
  if (err.code === "EPIPE") process.exit(0);
  logErr("stdout error:", errorText(err));
  process.exit(1);
});
process.on("unhandledRejection", (err) => logErr("unhandled rejection:", errorText(err)));

// ---------------------------------------------------------------------------
// Main loop: strictly sequential, one reply per input line.
// ---------------------------------------------------------------------------
const { createInterface } = await import("node:readline");
const rl = createInterface({ input: process.stdin, crlfDelay: Infinity, terminal: false });
for await (const line of rl) {
  let reply;
  try {
    reply = await handleLine(line);
  } catch (err) {
    const kind = err instanceof OpError ? err.kind : "local";
    if (!(err instanceof OpError)) logErr("exception:", err?.stack ?? errorText(err));
    reply = { ok: false, error: { kind, message: errorText(err) } };
  }
  writeReply(reply);
}
