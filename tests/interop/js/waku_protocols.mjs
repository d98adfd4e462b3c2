// Encodes and decodes the Waku store, LightPush, Filter and metadata RPCs with the real
// @waku/proto, and autoshards content topics with @waku/utils; one JSON object per line:
//   {"op":"encode","type":T,"fields":{...}}  {"op":"decode","type":T,"bytes":hex}
//   {"op":"autoshard","contentTopics":[s...],"clusterId":n,"shardCount":n}
// T is a message name of @waku/proto (StoreQueryRequest, PushRpc, WakuMetadataResponse, ...).
// In fields, bytes are {"hex":s} and 64-bit integers {"bigint":"decimal"}; field names are
// @waku/proto's (camelCase), enums their names.
// Replies one JSON line each: {"ok":true,"bytes":hex} or {"ok":true,"fields":{...}} or
// {"ok":true,"pubsubTopics":[s...]} or {"ok":false,"error":s}.
import { proto_filter_v2, proto_lightpush, proto_metadata, proto_store } from "@waku/proto";
import { contentTopicToPubsubTopic } from "@waku/utils";
import { hex, serveJsonLines, unhex } from "./jsonlines.mjs";

const TYPES = {
  StoreQueryRequest: proto_store.StoreQueryRequest,
  StoreQueryResponse: proto_store.StoreQueryResponse,
  LightPushRequestV3: proto_lightpush.LightPushRequestV3,
  LightPushResponseV3: proto_lightpush.LightPushResponseV3,
  PushRpc: proto_lightpush.PushRpc,
  FilterSubscribeRequest: proto_filter_v2.FilterSubscribeRequest,
  FilterSubscribeResponse: proto_filter_v2.FilterSubscribeResponse,
  MessagePush: proto_filter_v2.MessagePush,
  WakuMetadataRequest: proto_metadata.WakuMetadataRequest,
  WakuMetadataResponse: proto_metadata.WakuMetadataResponse,
};

function fromJson(value) {
  if (Array.isArray(value)) return value.map(fromJson);
  if (value === null || typeof value !== "object") return value;
  if ("hex" in value) return unhex(value.hex);
  if ("bigint" in value) return BigInt(value.bigint);
  return Object.fromEntries(Object.entries(value).map(([k, v]) => [k, fromJson(v)]));
}

function toJson(value) {
  if (value instanceof Uint8Array) return { hex: hex(value) };
  if (typeof value === "bigint") return { bigint: value.toString() };
  if (Array.isArray(value)) return value.map(toJson);
  if (value === null || typeof value !== "object") return value;
  return Object.fromEntries(
    Object.entries(value)
      .filter(([, v]) => v !== undefined)
      .map(([k, v]) => [k, toJson(v)]),
  );
}

function codec(type) {
  const found = TYPES[type];
  if (!found) throw new Error(`unknown type ${type}`);
  return found;
}

function handle(req) {
  if (req.op === "encode") {
    return { ok: true, bytes: hex(codec(req.type).encode(fromJson(req.fields))) };
  }
  if (req.op === "decode") {
    return { ok: true, fields: toJson(codec(req.type).decode(unhex(req.bytes))) };
  }
  if (req.op === "autoshard") {
    const topics = req.contentTopics.map((topic) =>
      contentTopicToPubsubTopic(topic, req.clusterId, req.shardCount),
    );
    return { ok: true, pubsubTopics: topics };
  }
  return { ok: false, error: `unknown op ${req.op}` };
}

await serveJsonLines(handle);
