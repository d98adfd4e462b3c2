// Every change this project makes to js-waku's ReliableChannel, in one place, so that the
// chat page and the Node driver of the interop tests (tests/interop/waku_light) run the
// same object.
//
// Theory of operation
// -------------------
// The chat page needs things of ReliableChannel (@waku/sdk 0.0.36 on @waku/sds 0.0.8)
// that its public API does not give, and each of them reaches into private members. Four
// change the channel once, when it is mended: its encoder keeps the first timestamp it
// stamps (stamp-once), a text is never wrapped again once it is settled (wrap-once),
// missing messages are fetched in bounded queries (retrieve-in-chunks), and the resend
// policy of resends.mjs replaces the sdk's retry manager (resends). One reports what
// each LightPush of the channel came to (push-outcome): the sdk counts a message as sent
// when every service refused it or none was connected, so "sent" would mean nothing
// (a page typed into while its node was down said "sent" and lost the lines). Four are operations
// the page calls later, through the object mendReliableChannel returns: a Filter
// subscription made afresh (fresh-subscription), messages from the store handed over and
// delivered at once (process-now), the page's own messages of an earlier visit put back
// into the local log (restore-own), and reading the channel's decoder and local log
// (reads). Nothing here changes a byte on the wire beyond what each mend says.
//
// Private members change without notice, so the mends are tied to the versions they were
// written for (WRITTEN_FOR). The caller says which versions are installed: the page from
// the bundle (web/build.mjs reads them from web/node_modules at build time), the driver
// from its own node_modules (installedVersions). Other versions get a warning, and each
// mend whose private members are all there is applied anyway, unchecked; a mend that
// lacks one is skipped, and its operation throws, naming what is missing. The report says
// which mends were applied and which were not, and why.
//
// This module imports no package (only ./resends.mjs), so the driver, which has its own
// node_modules, imports it by its relative path and mends its own sdk's objects.

import { Resends } from "./resends.mjs";

/** The versions whose sources every mend below was read against. */
export const WRITTEN_FOR = Object.freeze({ "@waku/sdk": "0.0.36", "@waku/sds": "0.0.8" });

// js-waku's retryIntervalMs default, and that of `sdsync chat`'s js-compatible profile.
const DEFAULT_RESEND_MS = 30_000;

// Each mend and the private members it needs, as paths from the ReliableChannel.
const NEEDS = {
  "stamp-once": ["encoder.toProtoObj"],
  "wrap-once": [
    "messageChannel._pushOutgoingMessage",
    "messageChannel.outgoingBuffer",
    "messageChannel.localHistory",
  ],
  "retrieve-in-chunks": ["missingMessageRetriever._retrieve"],
  resends: ["retryManager"],
  "push-outcome": ["_send"],
  "fresh-subscription": ["decoder", "subscribe", "node.filter.unsubscribe"],
  "process-now": [
    "processIncomingMessages",
    "messageChannel.processTasks",
    "messageChannel.sweepIncomingBuffer",
  ],
  "restore-own": [
    "messageChannel.localHistory",
    "messageChannel.deliverMessage",
    "messageChannel.filter.insert",
    "messageChannel.timeReceived.set",
  ],
  reads: ["decoder", "messageChannel.localHistory"],
};

/** Every mend's name, in the order they are applied. */
export const MENDS = Object.freeze(Object.keys(NEEDS));

/** The warnings due for `installed` versions ({"@waku/sdk": ..., "@waku/sds": ...}). */
export function checkVersions(installed) {
  const differ = Object.entries(WRITTEN_FOR).filter(([name, version]) => installed?.[name] !== version);
  if (differ.length === 0) return [];
  const were = Object.entries(WRITTEN_FOR).map(([name, version]) => `${name} ${version}`).join(" and ");
  const are = differ.map(([name]) => `${name} ${installed?.[name] ?? "(version unknown)"}`).join(", ");
  return [
    `js-waku's mends (web/src/mends.mjs) were written for ${were}, and this is ${are}: ` +
      "each mend whose private members are present is applied unchecked; read them against the new sources",
  ];
}

/**
 * The installed versions of @waku/sdk and of the @waku/sds it loads, read from a
 * node_modules folder by `readJson(path below it)` (undefined for a missing file). The
 * sdk loads its own nested copy of sds if there is one.
 */
export async function installedVersions(readJson) {
  const sdk = await readJson("@waku/sdk/package.json");
  const sds =
    (await readJson("@waku/sdk/node_modules/@waku/sds/package.json")) ?? (await readJson("@waku/sds/package.json"));
  return { "@waku/sdk": sdk?.version, "@waku/sds": sds?.version };
}

/** The paths of `paths` that are not members of `root` (own or inherited). */
function missingOf(root, paths) {
  return paths.filter((path) => {
    let object = root;
    for (const key of path.split(".")) {
      if (object === null || (typeof object !== "object" && typeof object !== "function") || !(key in object)) {
        return true;
      }
      object = object[key];
    }
    return false;
  });
}

/**
 * Mends `channel`, a ReliableChannel not yet sending (create it with autoStart: false, or
 * mend it before its first send), and returns what the page calls instead of its
 * private members. Options:
 *
 *   versions           the installed versions, as installedVersions gives them
 *   maxHashesPerQuery  the most hashes one store query may name (config.json's
 *                      `max_hashes_per_query`)
 *   queryOptions()     more options for each of those store queries (the service peer)
 *   onRetrieveError(e) a failed query for missing messages
 *   resendMs           the first delay before a resend (default js-waku's 30 s)
 *   isConnected()      whether the service node is connected: nothing is resent while not
 *   onPush(payload, accepted)  after each LightPush of the channel: its Waku payload (an
 *                      encoded SDS message) and whether a service node accepted it
 */
export function mendReliableChannel(channel, options) {
  const { versions, maxHashesPerQuery, queryOptions = () => ({}), onRetrieveError = () => {} } = options;
  if (!(Number.isInteger(maxHashesPerQuery) && maxHashesPerQuery > 0)) {
    throw new TypeError(`maxHashesPerQuery must be a positive integer, got ${maxHashesPerQuery}`);
  }
  const warnings = checkVersions(versions);
  const applied = [];
  const skipped = [];
  for (const name of MENDS) {
    const missing = missingOf(channel, NEEDS[name]);
    if (missing.length === 0) applied.push(name);
    else {
      skipped.push({ name, missing });
      warnings.push(`mend ${name} skipped: this ReliableChannel has no ${missing.join(", ")}`);
    }
  }
  const has = (name) => applied.includes(name);
  if (has("stamp-once")) stampOnce(channel.encoder);
  if (has("wrap-once")) wrapOnce(channel.messageChannel, (payload) => channel.constructor.getMessageId(payload));
  if (has("retrieve-in-chunks")) {
    retrieveInChunks(channel.missingMessageRetriever, maxHashesPerQuery, queryOptions, onRetrieveError);
  }
  const resends = new Resends(options.resendMs ?? DEFAULT_RESEND_MS, options.isConnected ?? (() => true));
  if (has("resends")) channel.retryManager = resends;
  if (has("push-outcome") && options.onPush) pushOutcome(channel, options.onPush);
  const report = { written_for: { ...WRITTEN_FOR }, installed: { ...versions }, applied, skipped, warnings };
  return new MendedChannel(channel, report, resends);
}

/**
 * ReliableChannel encodes each message twice: once for its retrieval hint and once to
 * send it. Each encoding stamps `new Date()` on a message without a timestamp, so if a
 * millisecond boundary falls between the two, the hint names a message nobody sent, and
 * members who ask the store by that hint get nothing. The first stamp is kept on the
 * message object that both encodings share.
 */
function stampOnce(encoder) {
  const toProtoObj = encoder.toProtoObj.bind(encoder);
  encoder.toProtoObj = (message) => {
    message.timestamp ??= new Date();
    return toProtoObj(message);
  };
}

/**
 * ReliableChannel resends a message by wrapping its payload again. While the message waits
 * in @waku/sds's outgoing buffer, that resends the same message. But a resend queued before
 * the acknowledgement that empties the buffer makes a new message under the same id with
 * a newer Lamport timestamp, and members that got different copies order their logs
 * differently. Here a payload that is already in the local history and no longer waiting
 * is never wrapped again. `messageIdOf(payload)` is the channel's id function.
 */
function wrapOnce(messageChannel, messageIdOf) {
  const wrap = messageChannel._pushOutgoingMessage.bind(messageChannel);
  messageChannel._pushOutgoingMessage = async (payload, callback) => {
    const messageId = messageIdOf(payload);
    const waiting = messageChannel.outgoingBuffer.some((m) => m.messageId === messageId);
    if (!waiting && messageChannel.localHistory.some((m) => m.messageId === messageId)) return;
    return wrap(payload, callback);
  };
}

/**
 * ReliableChannel's missing-message retriever asks the store for every hash it lacks in
 * one query, and a failed query escapes as an unhandled rejection. A store bounds the
 * hashes of one query (config.json's `max_hashes_per_query`: 100 for sdsync, as for the
 * page size), so a page that lacks more would never get any of them. Here the hashes go
 * in queries of at most `maxHashes`, each with the options `moreOptions()` gives. A failed
 * query goes to `onError` and ends this round; the retriever asks again on its next.
 */
function retrieveInChunks(retriever, maxHashes, moreOptions, onError) {
  const retrieve = retriever._retrieve;
  retriever._retrieve = async function* chunked(decoders, options) {
    const hashes = options.messageHashes ?? [];
    try {
      for (let start = 0; start < hashes.length; start += maxHashes) {
        const part = hashes.slice(start, start + maxHashes);
        yield* retrieve(decoders, { ...options, ...moreOptions(), messageHashes: part });
      }
    } catch (err) {
      onError(err);
    }
  };
}

/**
 * ReliableChannel sends each Waku message through `_send`, whose result lists the
 * services that took it and those that did not, and then reports the message as sent
 * whatever the result (only an "irrecoverable" error counts). Here each result goes to
 * `onPush(payload, accepted)` as well: accepted when at least one service took it.
 */
function pushOutcome(channel, onPush) {
  const send = channel._send.bind(channel);
  channel._send = async (encoder, message) => {
    const result = await send(encoder, message);
    onPush(message.payload, (result?.successes?.length ?? 0) > 0);
    return result;
  };
}

/** The operations on a mended channel that need its private members. */
class MendedChannel {
  constructor(channel, report, resends) {
    this.channel = channel;
    this.report = report;
    this.resends = resends; // resume() when the service node is back
  }

  _require(name) {
    if (this.report.applied.includes(name)) return;
    const { missing } = this.report.skipped.find((s) => s.name === name);
    throw new Error(`mend ${name} does not apply to this ReliableChannel: it has no ${missing.join(", ")}`);
  }

  /** The channel's decoder: the store client and Filter know its queries by it. */
  get decoder() {
    this._require("reads");
    return this.channel.decoder;
  }

  /** A copy of the channel's local log, in its order (@waku/sds has no public list). */
  history() {
    this._require("reads");
    return this.channel.messageChannel.localHistory.slice(0);
  }

  /**
   * Starts the channel, or if it runs, makes its Filter subscription afresh; whether the
   * service node took it. While a page is away, the node's pushes to it fail and the node
   * drops the subscription. The sdk's Filter client still counts the node as subscribed
   * and skips it when it reconnects, so the page would stay deaf until three keep-alive
   * pings had failed, minutes later.
   */
  async subscribeAfresh() {
    this._require("fresh-subscription");
    const { channel } = this;
    if (!channel.isStarted) {
      if (await channel.start()) return true;
      channel.stop();
      return false;
    }
    await this.unsubscribe().catch(() => false);
    return channel.subscribe();
  }

  /**
   * Drops the channel's Filter subscription; whether the node had it. The channel goes on
   * sending and syncing (ReliableChannel.stop() in sdk 0.0.36 leaves the subscription).
   */
  async unsubscribe() {
    this._require("fresh-subscription");
    return this.channel.node.filter.unsubscribe(this.channel.decoder);
  }

  /**
   * Hands `messages` (from the store, oldest first) to the channel and delivers what they
   * allow now: the channel would otherwise process them at its next task tick and sweep
   * its incoming buffer seconds later.
   */
  async processNow(messages) {
    this._require("process-now");
    const { channel } = this;
    await channel.processIncomingMessages(messages);
    await channel.messageChannel.processTasks();
    channel.messageChannel.sweepIncomingBuffer();
  }

  /**
   * Puts `message`, an SDS content message of ours from an earlier visit (decoded from a
   * Waku message whose hash is `retrievalHint`), back into the local log as if just sent;
   * whether it did. @waku/sds ignores a message that carries its own sender id, so without
   * this a reloaded page would lose what it said, and never deliver the messages that name
   * it in their causal history.
   */
  restoreOwn(message, retrievalHint) {
    this._require("restore-own");
    const sds = this.channel.messageChannel;
    if (message.senderId !== sds.senderId || message.channelId !== sds.channelId) return false;
    if (sds.localHistory.some((m) => m.messageId === message.messageId)) return false;
    message.retrievalHint = retrievalHint;
    sds.deliverMessage(message);
    sds.filter.insert(message.messageId);
    sds.timeReceived.set(message.messageId, Date.now());
    return true;
  }
}
