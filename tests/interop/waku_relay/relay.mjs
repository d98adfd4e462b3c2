#!/usr/bin/env node
// A js-waku relay node (@waku/sdk 0.0.27, the last release with one) listening on loopback
// TCP, driven by JSON lines: the Waku Relay peer sdsync's nodes must interoperate with.
// The first stdout line is the started node (or why it did not start); then one reply per
// request line, with received messages interleaved as {"event":"message",...} lines.
// With the sds_* ops (sds.mjs) it is also an SDS participant (@waku/sds 0.0.8) on the relay.
// See README.md in this folder.
import {
  RequestError,
  connectedPeers,
  emit,
  field,
  messageOf,
  serve,
  waitFor,
  wakuMessageJson,
} from "../waku_jsonl.mjs";
import { parseArgs } from "node:util";
import { tcp } from "@libp2p/tcp";
import { webSockets } from "@libp2p/websockets";
import { all as anyWsAddress } from "@libp2p/websockets/filters";
import { multiaddr } from "@multiformats/multiaddr";
import { messageHashStr } from "@waku/message-hash";
import { createDecoder, createEncoder, utils } from "@waku/sdk";
import { createRelayNode } from "@waku/sdk/relay";
import { sdsOperations } from "./sds.mjs";

const USAGE = `usage: node relay.mjs [--cluster-id N] (--shard N ... | --content-topic T ...)
  [--port N] [--ws]`;

function parseCli() {
  const { values } = parseArgs({
    options: {
      "cluster-id": { type: "string", default: "1" },
      shard: { type: "string", multiple: true, default: [] },
      "content-topic": { type: "string", multiple: true, default: [] },
      port: { type: "string", default: "0" },
      ws: { type: "boolean", default: false },
    },
  });
  const clusterId = Number(values["cluster-id"]);
  const shards = values.shard.map(Number);
  const contentTopics = values["content-topic"];
  if ((shards.length === 0) === (contentTopics.length === 0)) {
    throw new Error(`give either --shard or --content-topic (autosharding)\n${USAGE}`);
  }
  const networkConfig = shards.length ? { clusterId, shards } : { clusterId, contentTopics };
  const listen = [`/ip4/127.0.0.1/tcp/${Number(values.port)}`];
  if (values.ws) listen.push("/ip4/127.0.0.1/tcp/0/ws");
  return { networkConfig, listen };
}

async function startNode({ networkConfig, listen }) {
  // js-waku's own default is websockets alone, and only to wss: addresses.
  const transports = [tcp(), webSockets({ filter: anyWsAddress })];
  const node = await createRelayNode({
    networkConfig,
    defaultBootstrap: false,
    libp2p: { addresses: { listen }, transports, hideWebSocketInfo: true },
  });
  await node.start();
  return node;
}

/** The pubsub topic a request names: "pubsub_topic", else "shard" in our cluster, else
 * the content topic's autosharding one (js-waku's 8 shards). */
function routingOf(clusterId, request) {
  if (request.pubsub_topic !== undefined) return field(request, "pubsub_topic", "string");
  if (request.shard !== undefined) return { clusterId, shard: field(request, "shard", "number") };
  return { clusterId };
}

const messageJson = (pubsubTopic, proto) =>
  wakuMessageJson(pubsubTopic, proto, messageHashStr(pubsubTopic, proto));

function checkRelayed(node, pubsubTopic) {
  if (!node.pubsubTopics.includes(pubsubTopic)) {
    throw new RequestError(
      `${pubsubTopic} is not a topic this node relays (it relays ${node.pubsubTopics.join(", ")})`
    );
  }
}

/** The encoder and decoder of a request's content topic, on a topic the node relays. */
function codersOf(node, clusterId) {
  return {
    encoder(request) {
      const encoder = createEncoder({
        contentTopic: field(request, "content_topic", "string"),
        pubsubTopicShardInfo: routingOf(clusterId, request),
        ephemeral: request.ephemeral === true,
      });
      checkRelayed(node, encoder.pubsubTopic);
      return encoder;
    },
    decoder(request) {
      const contentTopic = field(request, "content_topic", "string");
      const decoder = createDecoder(contentTopic, routingOf(clusterId, request));
      checkRelayed(node, decoder.pubsubTopic);
      return decoder;
    },
  };
}

function operations(node, coders, clusterId) {
  const gossipSub = node.relay.gossipSub;
  return {
    async dial(request) {
      const address = multiaddr(field(request, "multiaddr", "string"));
      const connection = await node.libp2p.dial(address);
      return { peer_id: connection.remotePeer.toString() };
    },

    async subscribe(request) {
      const decoder = coders.decoder(request);
      node.relay.subscribe(decoder, ({ pubsubTopic, proto }) =>
        emit({ event: "message", ...messageJson(pubsubTopic, proto) })
      );
      return { pubsub_topic: decoder.pubsubTopic };
    },

    async publish(request) {
      const encoder = coders.encoder(request);
      const message = messageOf(request);
      const proto = await encoder.toProtoObj(message);
      const result = await node.relay.send(encoder, message);
      if (result.failures.length) throw new Error(result.failures.map((f) => f.error).join(", "));
      return {
        ...messageJson(encoder.pubsubTopic, proto),
        recipients: result.successes.map(String),
      };
    },

    async wait_subscribers(request) {
      const topic = request.pubsub_topic ?? node.pubsubTopics[0];
      const count = request.count ?? 1;
      const subscribers = await waitFor(
        () => {
          const ids = gossipSub.getSubscribers(topic).map(String);
          return ids.length >= count ? ids : undefined;
        },
        request.timeout_ms ?? 10_000,
        async () =>
          `${gossipSub.getSubscribers(topic).length} of ${count} peers subscribed to ${topic}; ` +
          `connected: ${JSON.stringify(await connectedPeers(node.libp2p))}`
      );
      return { subscribers };
    },

    async peers() {
      const topics = {};
      for (const topic of node.pubsubTopics) {
        topics[topic] = {
          subscribers: gossipSub.getSubscribers(topic).map(String),
          mesh: gossipSub.getMeshPeers(topic).map(String),
        };
      }
      return { peers: await connectedPeers(node.libp2p), topics };
    },

    async shard_of(request) {
      const contentTopic = field(request, "content_topic", "string");
      const numShards = request.num_shards ?? 8;
      return {
        shard: utils.contentTopicToShardIndex(contentTopic, numShards),
        pubsub_topic: utils.contentTopicToPubsubTopic(
          contentTopic,
          request.cluster_id ?? clusterId,
          numShards
        ),
      };
    },
  };
}

let config, node;
try {
  config = parseCli();
  node = await startNode(config);
} catch (err) {
  emit({ ok: false, error: `relay node did not start: ${err.message}` });
  process.exit(1);
}
const peerId = node.libp2p.peerId.toString();
emit({
  ok: true,
  peer_id: peerId,
  multiaddrs: node.libp2p.getMultiaddrs().map(String),
  pubsub_topics: node.pubsubTopics,
});
const clusterId = config.networkConfig.clusterId;
const coders = codersOf(node, clusterId);
const sds = sdsOperations(node, coders);
await serve({ ...operations(node, coders, clusterId), ...sds.ops }, async () => {
  sds.stop();
  await node.stop();
});
