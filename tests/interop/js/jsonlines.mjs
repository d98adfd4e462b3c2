// What the codec drivers here (waku_message.mjs, waku_protocols.mjs) share: hex for bytes
// and the loop answering one JSON request per stdin line with one JSON reply line,
// {"ok":false,"error":s} for whatever the handler throws.
import { createInterface } from "node:readline";

export const hex = (bytes) => Buffer.from(bytes).toString("hex");
export const unhex = (s) => new Uint8Array(Buffer.from(s, "hex"));

export async function serveJsonLines(handle) {
  for await (const line of createInterface({ input: process.stdin })) {
    if (!line.trim()) continue;
    let reply;
    try {
      reply = handle(JSON.parse(line));
    } catch (err) {
      reply = { ok: false, error: String(err) };
    }
    process.stdout.write(JSON.stringify(reply) + "\n");
  }
}
