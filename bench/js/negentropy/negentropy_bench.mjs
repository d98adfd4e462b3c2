// Runs negentropy from nostr-tools (nip77) between two item sets and prints one JSON line.
//
// Input file (written by bench/reconcile_vs_negentropy.py), little-endian:
//   u32 count_a, u32 count_b, then count_a + count_b records of
//   f64 timestamp (ns since the window start; exact below 2**53) and a 32-byte hash.
// Both sides run the library's Negentropy class; an id list is resolved by the side that
// receives it, so what each side learned is reported separately and summed.
import { readFileSync } from "node:fs";
import { nip77 } from "nostr-tools";

const { Negentropy, NegentropyStorageVector } = nip77;

const [file, frameLimitArg] = process.argv.slice(2);
const frameSizeLimit = Number(frameLimitArg);
const buf = readFileSync(file);
const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
const countA = view.getUint32(0, true);
const countB = view.getUint32(4, true);
const RECORD = 40;
const hex = (offset) => buf.toString("hex", offset, offset + 32);

function storage(first, count) {
  const s = new NegentropyStorageVector();
  for (let i = 0; i < count; i++) {
    const offset = 8 + (first + i) * RECORD;
    s.insert(view.getFloat64(offset, true), hex(offset + 8));
  }
  s.seal();
  return s;
}

let t0 = process.hrtime.bigint();
const a = storage(0, countA);
const b = storage(countA, countB);
const buildSeconds = Number(process.hrtime.bigint() - t0) / 1e9;

const learned = { aHave: 0, aNeed: 0, bHave: 0, bNeed: 0 };
const client = new Negentropy(a, frameSizeLimit);
const server = new Negentropy(b, frameSizeLimit);
let bytesAtoB = 0;
let bytesBtoA = 0;
let frames = 0;

t0 = process.hrtime.bigint();
let msg = client.initiate();
while (msg) {
  bytesAtoB += msg.length / 2;
  frames++;
  const reply = server.reconcile(msg, () => learned.bHave++, () => learned.bNeed++);
  if (!reply) break;
  bytesBtoA += reply.length / 2;
  frames++;
  msg = client.reconcile(reply, () => learned.aHave++, () => learned.aNeed++);
}
const syncSeconds = Number(process.hrtime.bigint() - t0) / 1e9;

console.log(
  JSON.stringify({
    frames,
    bytesAtoB,
    bytesBtoA,
    syncSeconds,
    buildSeconds,
    // a's view plus b's view (b's "have" is a's "need").
    onlyA: learned.aHave + learned.bNeed,
    onlyB: learned.aNeed + learned.bHave,
  }),
);
