// Encodes and decodes WakuMessages with the real @waku/proto, one JSON object per line:
//   {"op":"encode","payload":hex,"contentTopic":s,"timestamp":"decimal"|null,"meta":hex|null,"version":n|null,"ephemeral":b|null}
//   {"op":"decode","bytes":hex}
// Replies one JSON line each: {"ok":true,"bytes":hex} or {"ok":true,"message":{...}} or {"ok":false,"error":s}.
import { WakuMessage } from "@waku/proto";
import { hex, serveJsonLines, unhex } from "./jsonlines.mjs";

function handle(req) {
  if (req.op === "encode") {
    const msg = { payload: unhex(req.payload), contentTopic: req.contentTopic };
    if (req.timestamp != null) msg.timestamp = BigInt(req.timestamp);
    if (req.meta != null) msg.meta = unhex(req.meta);
    if (req.version != null) msg.version = req.version;
    if (req.ephemeral != null) msg.ephemeral = req.ephemeral;
    return { ok: true, bytes: hex(WakuMessage.encode(msg)) };
  }
  if (req.op === "decode") {
    const m = WakuMessage.decode(unhex(req.bytes));
    return {
      ok: true,
      message: {
        payload: hex(m.payload),
        contentTopic: m.contentTopic,
        timestamp: m.timestamp == null ? null : m.timestamp.toString(),
        meta: m.meta == null ? null : hex(m.meta),
        version: m.version ?? null,
        ephemeral: m.ephemeral ?? null,
      },
    };
  }
  return { ok: false, error: `unknown op ${req.op}` };
}

await serveJsonLines(handle);
