#!/usr/bin/env node
// Builds the chat page's script into the Python package, so that a user who installs
// sdsync needs no Node: src/sdsync/store/web/chat/chat.js, and beside it chat.json, which
// records what it was built from (the sha256 of the lockfile, of every source file and of
// the bundle, and the esbuild version).
//
//   node web/build.mjs           build and write both files (what `make web` runs)
//   node web/build.mjs --check   build in memory; exit 1 unless the shipped files are
//                                exactly what the lockfile and sources build now
//
// esbuild's output depends only on its version, its options and its input files, so
// the same lockfile and sources give the same bytes on every machine. The versions of
// @waku/sdk and @waku/sds installed from the lockfile go into the bundle, for the page's
// mends of js-waku (src/mends.mjs) to check; a build on other versions says so.
import { createHash } from "node:crypto";
import { readFile, readdir, writeFile } from "node:fs/promises";
import { dirname, join, relative } from "node:path";
import { fileURLToPath } from "node:url";
import { build, version } from "esbuild";
import { checkVersions, installedVersions } from "./src/mends.mjs";

const HERE = dirname(fileURLToPath(import.meta.url));
const ROOT = dirname(HERE);
const OUT_DIR = join(ROOT, "src", "sdsync", "store", "web", "chat");
const BUNDLE = join(OUT_DIR, "chat.js");
const MANIFEST = join(OUT_DIR, "chat.json");

const sha256 = (bytes) => createHash("sha256").update(bytes).digest("hex");

/** The files the bundle is made from, beside node_modules: sources, manifest, lockfile. */
async function inputs() {
  const sources = (await readdir(join(HERE, "src"))).filter((name) => name.endsWith(".mjs")).sort();
  const names = ["build.mjs", "package.json", "package-lock.json", ...sources.map((n) => `src/${n}`)];
  const hashes = {};
  for (const name of names) hashes[name] = sha256(await readFile(join(HERE, name)));
  return hashes;
}

async function wakuVersions() {
  const readJson = (path) =>
    readFile(join(HERE, "node_modules", path), "utf8").then(JSON.parse, () => undefined);
  return installedVersions(readJson);
}

async function bundle(versions) {
  const result = await build({
    entryPoints: [join(HERE, "src", "chat.mjs")],
    absWorkingDir: HERE,
    bundle: true,
    format: "esm",
    platform: "browser",
    target: "es2022",
    minify: true,
    legalComments: "none",
    define: {
      "process.env.NODE_ENV": '"production"',
      global: "globalThis",
      // A string, which esbuild inlines; an object would become a variable that every
      // module of the bundle calls a function to initialise.
      __WAKU_VERSIONS__: JSON.stringify(JSON.stringify(versions)),
    },
    write: false,
    logLevel: "warning",
  });
  return result.outputFiles[0].contents;
}

function manifestOf(inputsSha256, code) {
  const document = {
    built_by: "make web (node web/build.mjs)",
    esbuild: version,
    inputs_sha256: inputsSha256,
    bundle_sha256: sha256(code),
    bundle_bytes: code.length,
  };
  return `${JSON.stringify(document, null, 2)}\n`;
}

async function check(code, manifest) {
  const problems = [];
  const shipped = await readFile(BUNDLE).catch(() => undefined);
  if (shipped === undefined) problems.push(`${relative(ROOT, BUNDLE)} is missing`);
  else if (sha256(shipped) !== sha256(code)) {
    problems.push(`${relative(ROOT, BUNDLE)} is not what the lockfile and sources build (run make web)`);
  }
  const shippedManifest = await readFile(MANIFEST, "utf8").catch(() => undefined);
  if (shippedManifest !== manifest) problems.push(`${relative(ROOT, MANIFEST)} is stale (run make web)`);
  return problems;
}

const versions = await wakuVersions();
for (const warning of checkVersions(versions)) console.error(`web/build.mjs: ${warning}`);
const code = await bundle(versions);
const manifest = manifestOf(await inputs(), code);
if (process.argv.includes("--check")) {
  const problems = await check(code, manifest);
  for (const problem of problems) console.error(`web/build.mjs: ${problem}`);
  process.exit(problems.length ? 1 : 0);
}
await writeFile(BUNDLE, code);
await writeFile(MANIFEST, manifest);
console.error(`web/build.mjs: ${relative(ROOT, BUNDLE)}, ${code.length.toLocaleString("en")} bytes`);
