#!/usr/bin/env node
// A js-waku light node (@waku/sdk 0.0.36) using one service node on loopback, driven by
// JSON lines: the store, LightPush, Filter and ReliableChannel client sdsync's service
// nodes must answer. No bootstrap list, no discovery: it dials --peer and nothing else.
// The first stdout line says the node is ready (the service node identified and offering
// every --require'd protocol) or why not; then one reply per request line, with Filter
// pushes and ReliableChannel events interleaved as {"event":...} lines. See README.md.
// Its ReliableChannels are mended exactly as the chat page's are (web/src/mends.mjs), so
// what the interop tests exercise is what the page ships.
import {
  RequestError,
  b64,
  connectedPeers,
  emit,
  field,
  hex,
  messageOf,
  payloadOf,
  serve,
  unhex,
  waitFor,
  wakuMessageJson,
} from "../waku_jsonl.mjs";
import { readFile } from "node:fs/promises";
import { parseArgs } from "node:util";
// The chat page's mends of ReliableChannel: the module imports no package, so it mends
// the objects of this folder's @waku/sdk.
import { installedVersions, mendReliableChannel } from "../../../web/src/mends.mjs";
import { tcp } from "@libp2p/tcp";
import { webSockets } from "@libp2p/websockets";
import { all as anyWsAddress } from "@libp2p/websockets/filters";
import { multiaddr } from "@multiformats/multiaddr";
import {
  ReliableChannel,
  ReliableChannelEvent,
  createDecoder,
  createEncoder,
  createLightNode,
  utils,
  waku,
} from "@waku/sdk";

// sdsync's bound on the hashes of one store query (config.json's max_hashes_per_query),
// which the page gets from the node it came from.
const MAX_HASHES_PER_QUERY = 100;

const USAGE = `usage: node light.mjs --peer MULTIADDR [--cluster-id N] [--num-shards N]
  [--require store,lightpush,filter] [--timeout-ms N]`;

// What each --require name needs the service node to offer (identify's protocol list).
const CODECS = {
  store: waku.StoreCodec,
  lightpush: waku.LightPushCodec,
  "lightpush-v2": waku.LightPushCodecV2,
  filter: waku.FilterCodecs.SUBSCRIBE,
};

function parseCli() {
  const { values } = parseArgs({
    options: {
      peer: { type: "string" },
      "cluster-id": { type: "string", default: "1" },
      "num-shards": { type: "string", default: "8" },
      require: { type: "string", default: "store,lightpush,filter" },
      "timeout-ms": { type: "string", default: "10000" },
    },
  });
  if (!values.peer) throw new Error(`--peer is required\n${USAGE}`);
  const required = values.require.split(",").filter(Boolean);
  const unknown = required.filter((name) => !Object.hasOwn(CODECS, name));
  if (unknown.length) {
    const known = Object.keys(CODECS).join(", ");
    throw new Error(`--require: unknown ${unknown.join(", ")} (known: ${known})`);
  }
  return {
    peer: multiaddr(values.peer),
    networkConfig: {
      clusterId: Number(values["cluster-id"]),
      numShardsInCluster: Number(values["num-shards"]),
    },
    required,
    timeoutMs: Number(values["timeout-ms"]),
  };
}

async function startNode({ peer, networkConfig, required, timeoutMs }) {
  const node = await createLightNode({
    networkConfig,
    defaultBootstrap: false,
    libp2p: { transports: [tcp(), webSockets({ filter: anyWsAddress })], hideWebSocketInfo: true },
  });
  let connection;
  try {
    connection = await node.libp2p.dial(peer, { signal: AbortSignal.timeout(timeoutMs) });
  } catch (err) {
    throw new Error(`service node ${peer} is not reachable: ${err.message}`);
  }
  // waitForPeers can return before identify has filled the peer store, and the sdk picks
  // its peers from there: wait for the codecs themselves.
  const servicePeer = connection.remotePeer;
  const offered = async () => {
    const stored = await node.libp2p.peerStore.get(servicePeer).catch(() => undefined);
    return stored?.protocols ?? [];
  };
  const protocols = await waitFor(
    async () => {
      const have = await offered();
      // The peer store may hold the identify protocols themselves (their streams are
      // negotiated) before identify has answered with the rest.
      const identified = have.some((codec) => !codec.startsWith("/ipfs/id/"));
      const ready = identified && required.every((name) => have.includes(CODECS[name]));
      return ready ? have : undefined;
    },
    timeoutMs,
    async () => {
      const have = await offered();
      if (!have.some((codec) => !codec.startsWith("/ipfs/id/"))) {
        return `service node ${servicePeer} never identified itself`;
      }
      const missing = required.filter((name) => !have.includes(CODECS[name]));
      const lacks = missing.map((name) => `${name} (${CODECS[name]})`).join(", ");
      return `service node ${servicePeer} lacks ${lacks}; it offers ${have.join(", ")}`;
    }
  );
  return { node, servicePeer, protocols };
}

/** Routing of a request: static sharding if it names a "shard", autosharding otherwise. */
function routingOf(networkConfig, request, contentTopic) {
  if (request.shard === undefined) return utils.createRoutingInfo(networkConfig, { contentTopic });
  const { clusterId } = networkConfig;
  return utils.createRoutingInfo({ clusterId }, { shardId: field(request, "shard", "number") });
}

function contentTopicsOf(request) {
  const topics = request.content_topics ?? [field(request, "content_topic", "string")];
  if (!isListOfStrings(topics) || topics.length === 0) {
    throw new RequestError(`"content_topics" must be a non-empty list of strings`);
  }
  return topics;
}

const isListOfStrings = (value) => Array.isArray(value) && value.every((v) => typeof v === "string");

const messageJson = (message) => wakuMessageJson(message.pubsubTopic, message.proto, message.hashStr);

/** A ReliableChannel event's detail as JSON: message ids stay strings, bytes become hex. */
function detailJson(detail) {
  if (detail instanceof Uint8Array) return hex(detail);
  if (detail === null || typeof detail !== "object") return detail;
  return Object.fromEntries(Object.entries(detail).map(([key, value]) => [key, detailJson(value)]));
}

function storeOptions(request) {
  const options = { paginationForward: request.forward ?? true };
  if (request.page_size !== undefined) options.paginationLimit = field(request, "page_size", "number");
  if (request.cursor !== undefined) options.paginationCursor = unhex(field(request, "cursor", "string"));
  if (request.hashes !== undefined) {
    if (!isListOfStrings(request.hashes)) throw new RequestError(`"hashes" must be a list of hex strings`);
    options.messageHashes = request.hashes.map(unhex);
  }
  if (request.time_start_ms !== undefined) {
    options.timeStart = new Date(field(request, "time_start_ms", "number"));
  }
  if (request.time_end_ms !== undefined) options.timeEnd = new Date(field(request, "time_end_ms", "number"));
  return options;
}

/** Every connection this node opens and closes, counted from the start: a load test
 * asserts the service node's connection was never dropped. */
function connectionLog(libp2p) {
  const log = { opened: 0, closed: 0, closed_peers: [] };
  libp2p.addEventListener("connection:open", () => {
    log.opened += 1;
  });
  libp2p.addEventListener("connection:close", (event) => {
    log.closed += 1;
    log.closed_peers.push(event.detail.remotePeer.toString());
  });
  return log;
}

/** Filter messages counted by payload instead of printed one a line (for many pushes). */
function filterTally() {
  const byPayload = new Map();
  let received = 0;
  return {
    take(message) {
      received += 1;
      const payload = b64(message.payload);
      byPayload.set(payload, (byPayload.get(payload) ?? 0) + 1);
    },
    report(withPayloads) {
      const duplicates = [...byPayload.values()].reduce((sum, n) => sum + n - 1, 0);
      const result = { received, distinct: byPayload.size, duplicates };
      return withPayloads ? { ...result, payloads: [...byPayload.keys()] } : result;
    },
  };
}

/** The @waku/sdk and @waku/sds this driver runs, for the mends to check. */
async function wakuVersions() {
  const nodeModules = new URL("./node_modules/", import.meta.url);
  const readJson = (path) => readFile(new URL(path, nodeModules), "utf8").then(JSON.parse, () => undefined);
  return installedVersions(readJson);
}

function operations({ node, networkConfig, connections, servicePeer, versions }, channels) {
  const tally = filterTally();

  function decodersOf(request) {
    return contentTopicsOf(request).map((topic) =>
      createDecoder(topic, routingOf(networkConfig, request, topic))
    );
  }

  /** The mended channel a request names (its ReliableChannel is `.channel`). */
  function channelOf(request) {
    const id = field(request, "channel_id", "string");
    const mended = channels.get(id);
    if (!mended) throw new RequestError(`no reliable channel ${JSON.stringify(id)}: create it first`);
    return mended;
  }

  // The store client pages until the service node answers an empty page; a node that
  // ignores the cursor would keep it paging forever, so stop at max_messages.
  async function storeQuery(request) {
    const decoders = decodersOf(request);
    const options = storeOptions(request);
    const limit = request.max_messages ?? 10_000;
    const pages = []; // only the generator shows them
    const messages = [];
    let truncated = false;
    if ((request.mode ?? "generator") === "generator") {
      for await (const page of node.store.queryGenerator(decoders, options)) {
        const decoded = await Promise.all(page);
        pages.push(decoded.map((message) => message?.hashStr ?? null));
        messages.push(...decoded.filter(Boolean));
        if (messages.length >= limit) {
          truncated = true;
          break;
        }
      }
    } else if (request.mode === "ordered_callback") {
      await node.store.queryWithOrderedCallback(
        decoders,
        (message) => {
          messages.push(message);
          truncated = messages.length >= limit;
          return truncated;
        },
        options
      );
    } else {
      throw new RequestError(`"mode" must be "generator" or "ordered_callback"`);
    }
    const hashes = messages.map((m) => m.hashStr);
    return {
      hashes,
      pages: pages.length ? pages : undefined,
      messages: messages.map(messageJson),
      truncated,
    };
  }

  return {
    store_query: storeQuery,

    async lightpush(request) {
      const contentTopic = field(request, "content_topic", "string");
      const encoder = createEncoder({
        contentTopic,
        routingInfo: routingOf(networkConfig, request, contentTopic),
        ephemeral: request.ephemeral === true,
      });
      const message = messageOf(request);
      const proto = await encoder.toProtoObj(message);
      const result = await node.lightPush.send(encoder, message, {
        autoRetry: false,
        useLegacy: request.legacy === true,
      });
      const failures = result.failures.map((failure) => ({
        error: failure.error,
        peer_id: failure.peerId?.toString() ?? null,
      }));
      if (result.successes.length === 0) {
        throw new Error(`no service node took the message: ${JSON.stringify(failures)}`);
      }
      return {
        ...wakuMessageJson(encoder.pubsubTopic, proto, waku.messageHashStr(encoder.pubsubTopic, proto)),
        successes: result.successes.map(String),
        failures,
      };
    },

    async filter_subscribe(request) {
      const decoders = decodersOf(request);
      const subscribed = await node.filter.subscribe(decoders, (message) =>
        emit({ event: "filter_message", ...messageJson(message) })
      );
      if (!subscribed) {
        throw new Error(`no service node took the subscription to ${contentTopicsOf(request)}`);
      }
      return { pubsub_topic: decoders[0].pubsubTopic };
    },

    async filter_tally_subscribe(request) {
      const decoders = decodersOf(request);
      if (!(await node.filter.subscribe(decoders, (message) => tally.take(message)))) {
        throw new Error(`no service node took the subscription to ${contentTopicsOf(request)}`);
      }
      return { pubsub_topic: decoders[0].pubsubTopic };
    },

    async filter_tally(request) {
      return tally.report(request.payloads === true);
    },

    async connection_log() {
      const open_streams = {};
      for (const connection of node.libp2p.getConnections()) {
        for (const stream of connection.streams) {
          const protocol = stream.protocol ?? "(negotiating)";
          open_streams[protocol] = (open_streams[protocol] ?? 0) + 1;
        }
      }
      return { ...connections, closed_peers: [...connections.closed_peers], open_streams };
    },

    async reliable_channel_create(request) {
      const channelId = field(request, "channel_id", "string");
      if (channels.has(channelId)) {
        throw new RequestError(`reliable channel ${JSON.stringify(channelId)} exists`);
      }
      const contentTopic = field(request, "content_topic", "string");
      const routingInfo = routingOf(networkConfig, request, contentTopic);
      const options = request.options ?? {};
      // Mended before it starts, as the page's: nothing is sent unmended.
      const channel = await ReliableChannel.create(
        node,
        channelId,
        field(request, "sender_id", "string"),
        createEncoder({ contentTopic, routingInfo }),
        createDecoder(contentTopic, routingInfo),
        { ...options, autoStart: false }
      );
      const mended = mendReliableChannel(channel, {
        versions,
        maxHashesPerQuery: request.max_hashes_per_query ?? MAX_HASHES_PER_QUERY,
        queryOptions: () => ({ peerId: servicePeer }),
        onRetrieveError: (err) =>
          emit({ event: "mend", channel_id: channelId, mend: "retrieve-in-chunks", error: err.message }),
        resendMs: options.retryIntervalMs,
        isConnected: () => node.libp2p.getConnections(servicePeer).length > 0,
      });
      for (const warning of mended.report.warnings) console.error(`light.mjs: ${warning}`);
      for (const type of Object.values(ReliableChannelEvent)) {
        channel.addEventListener(type, (event) => {
          // A received message's payload is the SDS content; its proto still holds the
          // Waku message that carried it (and that its hash names).
          const detail =
            type === "message-received"
              ? { ...messageJson(event.detail), payload: b64(event.detail.payload) }
              : detailJson(event.detail);
          emit({ event: "reliable", channel_id: channelId, type, detail });
        });
      }
      // Started as the page starts it; a channel that could not subscribe is stopped.
      if ((options.autoStart ?? true) && !(await mended.subscribeAfresh())) {
        throw new Error(`no service node took the subscription to ${contentTopic}`);
      }
      channels.set(channelId, mended);
      return { channel_id: channelId, pubsub_topic: routingInfo.pubsubTopic, mends: mended.report };
    },

    async reliable_send(request) {
      return { message_id: channelOf(request).channel.send(payloadOf(request)) };
    },

    // A channel that should hear nothing for a while drops its Filter subscription: it
    // keeps sending and syncing, and whatever is published meanwhile never reaches it.
    // Subscribing again is the page's fresh subscription at a reconnection.
    async reliable_unsubscribe(request) {
      const mended = channelOf(request);
      if (!(await mended.unsubscribe())) {
        throw new Error(`the service node kept the subscription of ${mended.decoder.contentTopic}`);
      }
      return {};
    },

    async reliable_subscribe(request) {
      if (!(await channelOf(request).subscribeAfresh())) {
        throw new Error("no service node took the subscription");
      }
      return {};
    },

    // The channel's local log in its order, (Lamport timestamp, message id), as the page
    // reads it to draw its log.
    async reliable_log(request) {
      return {
        log: channelOf(request).history().map((message) => ({
          message_id: message.messageId,
          sender_id: message.senderId,
          lamport_timestamp: message.lamportTimestamp.toString(),
          payload: b64(message.content),
        })),
      };
    },

    async peers() {
      return { peers: await connectedPeers(node.libp2p) };
    },
  };
}

let started;
try {
  const config = parseCli();
  started = { ...(await startNode(config)), networkConfig: config.networkConfig };
  started.connections = connectionLog(started.node.libp2p);
  started.versions = await wakuVersions();
} catch (err) {
  emit({ ok: false, error: `light node did not start: ${err.message}` });
  process.exit(1);
}
emit({
  ok: true,
  peer_id: started.node.libp2p.peerId.toString(),
  service_peer: started.servicePeer.toString(),
  service_protocols: [...started.protocols].sort(),
});
const channels = new Map();
await serve(operations(started, channels), async () => {
  for (const mended of channels.values()) mended.channel.stop();
  await started.node.stop();
});
