// What the two js-waku drivers (waku_relay/relay.mjs, waku_light/light.mjs) share: the
// Node 20 polyfill, the JSON-lines loop and the JSON shape of a Waku message. It imports
// no package, so it works beside either driver's node_modules. Import it FIRST: ES modules
// are evaluated in import order, and the polyfill must be in place before libp2p loads.

import { createInterface } from "node:readline";

// libp2p's dependencies (mortice, it-queue, abort-error) call Promise.withResolvers,
// which Node 20 lacks.
if (typeof Promise.withResolvers !== "function") {
  Promise.withResolvers = function withResolvers() {
    let resolve, reject;
    const promise = new this((res, rej) => ((resolve = res), (reject = rej)));
    return { promise, resolve, reject };
  };
}

// stdout carries only our JSON lines: the sdk prints banners with console.info.
for (const name of ["log", "info", "debug"]) {
  console[name] = (...args) => console.error(...args);
}

// A library promise nobody awaits must not end the driver in the middle of a test.
process.on("unhandledRejection", (reason) => console.error("unhandled rejection:", reason));

/** A request the driver cannot carry out as written: the test's fault, not the network's. */
export class RequestError extends Error {}

export const b64 = (bytes) => Buffer.from(bytes ?? []).toString("base64");
export const hex = (bytes) => Buffer.from(bytes).toString("hex");
export const unhex = (s) => new Uint8Array(Buffer.from(s, "hex"));

export function emit(object) {
  process.stdout.write(JSON.stringify(object) + "\n");
}

export function field(request, name, type) {
  const value = request[name];
  if (typeof value !== type) {
    throw new RequestError(`"${name}" must be a ${type}, got ${JSON.stringify(value)}`);
  }
  return value;
}

export function payloadOf(request) {
  const text = field(request, "payload", "string");
  if (!/^[A-Za-z0-9+/]*={0,2}$/.test(text) || text.length % 4 !== 0) {
    throw new RequestError(`"payload" must be standard base64`);
  }
  return new Uint8Array(Buffer.from(text, "base64"));
}

/** The message a send op describes: its payload and a timestamp fixed now ("timestamp_ms"
 * or the clock), so that the hash we report is the one of the message the library sends. */
export function messageOf(request) {
  const ms = request.timestamp_ms === undefined ? Date.now() : field(request, "timestamp_ms", "number");
  return { payload: payloadOf(request), timestamp: new Date(ms) };
}

/** A WakuMessage as nwaku's REST API spells it (base64 bytes, timestamp in ns as a string),
 * plus the topic it arrived on and its deterministic hash (RFC 14). */
export function wakuMessageJson(pubsubTopic, proto, hashHex) {
  return {
    payload: b64(proto.payload),
    contentTopic: proto.contentTopic,
    timestamp: proto.timestamp == null ? null : proto.timestamp.toString(),
    meta: proto.meta == null || proto.meta.length === 0 ? null : b64(proto.meta),
    version: proto.version ?? 0,
    ephemeral: Boolean(proto.ephemeral),
    pubsubTopic,
    hash: hashHex,
  };
}

/** Connected peers with what identify told us about them (libp2p 1.x and 2.x alike). */
export async function connectedPeers(libp2p) {
  const peers = [];
  for (const peerId of libp2p.getPeers()) {
    const stored = await libp2p.peerStore.get(peerId).catch(() => undefined);
    peers.push({
      peer_id: peerId.toString(),
      addrs: libp2p.getConnections(peerId).map((conn) => conn.remoteAddr.toString()),
      protocols: stored ? [...stored.protocols].sort() : [],
    });
  }
  return peers;
}

/** Polls `check` (a value or undefined) every 50 ms; `explain()` words the timeout. */
export async function waitFor(check, timeoutMs, explain) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const value = await check();
    if (value !== undefined) return value;
    if (Date.now() >= deadline) throw new Error(`timed out after ${timeoutMs} ms: ${await explain()}`);
    await new Promise((resolve) => setTimeout(resolve, 50));
  }
}

/** Answers one JSON request per stdin line, in order, with one JSON reply line each:
 * {"ok":true,...result} or {"ok":false,"error":"<op> failed: ..."} ("<op> bad request: ..."
 * when the request itself is wrong). `stop` is called on the "stop" op or
 * at the end of stdin; the process exits after it. */
export async function serve(ops, stop) {
  for await (const line of createInterface({ input: process.stdin })) {
    if (!line.trim()) continue;
    let request;
    try {
      request = JSON.parse(line);
    } catch (err) {
      emit({ ok: false, error: `bad request: not JSON: ${err.message}` });
      continue;
    }
    if (request.op === "stop") break;
    const op = Object.hasOwn(ops, request.op) ? ops[request.op] : undefined;
    if (op === undefined) {
      const known = ["stop", ...Object.keys(ops)].join(", ");
      emit({ ok: false, error: `bad request: unknown op ${JSON.stringify(request.op)} (known: ${known})` });
      continue;
    }
    try {
      emit({ ok: true, ...(await op(request)) });
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      const fault = err instanceof RequestError ? "bad request" : "failed";
      emit({ ok: false, error: `${request.op} ${fault}: ${message}` });
    }
  }
  await stop();
  emit({ ok: true });
  process.exit(0);
}
