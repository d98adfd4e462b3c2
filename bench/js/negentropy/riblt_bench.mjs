// Runs @peerbit/riblt (a WebAssembly build of the Rust port of the paper's RIBLT) between the
// two item sets bench/reconcile_vs_negentropy.py writes, and prints one JSON line.
//
// Input file: as for negentropy_bench.mjs (u32 count_a, u32 count_b, then records of f64
// timestamp and a 32-byte hash). The library codes u64 symbols: each item is its hash's
// first 8 bytes (big-endian; the sets' hashes are random, so these are distinct). B encodes,
// A decodes with its own items added, one coded symbol at a time until it decodes.
// A coded symbol of the library is a u64 sum, a u64 checksum and a count: 24 bytes as
// fixed-width fields, which is how bytes are estimated (the library has no wire format).
import { readFileSync } from "node:fs";
import { DecoderWrapper, EncoderWrapper, ready } from "@peerbit/riblt";

await ready;
const [file] = process.argv.slice(2);
const buf = readFileSync(file);
const view = new DataView(buf.buffer, buf.byteOffset, buf.byteLength);
const countA = view.getUint32(0, true);
const countB = view.getUint32(4, true);
const RECORD = 40;
const key = (i) => view.getBigUint64(8 + i * RECORD + 8, false);

let t0 = process.hrtime.bigint();
const encoder = new EncoderWrapper();
for (let i = 0; i < countB; i++) encoder.add_symbol(key(countA + i));
const decoder = new DecoderWrapper();
for (let i = 0; i < countA; i++) decoder.add_symbol(key(i));
const buildSeconds = Number(process.hrtime.bigint() - t0) / 1e9;

t0 = process.hrtime.bigint();
let symbols = 0;
do {
  decoder.add_coded_symbol(encoder.produce_next_coded_symbol());
  decoder.try_decode();
  symbols++;
} while (!decoder.decoded());
const syncSeconds = Number(process.hrtime.bigint() - t0) / 1e9;

console.log(
  JSON.stringify({
    symbols,
    onlyA: decoder.get_local_symbols().length,
    onlyB: decoder.get_remote_symbols().length,
    bytes: symbols * 24,
    buildSeconds,
    syncSeconds,
  }),
);
