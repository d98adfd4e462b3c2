// The chat page of `sdsync store serve --web`, at /chat/?channel=ROOM&name=NAME.
//
// Theory of operation
// -------------------
// The page is one SDS participant: a js-waku ReliableChannel on a light node whose only
// service node is the node that served the page (link.mjs). It sends by LightPush, hears
// by Filter and fetches from the node's store: at every (re)connection it pages through
// the channel's content topic (everything the first time, then since the last catch-up)
// and hands the messages to the channel, which delivers them in causal order, drops
// duplicates and asks the store by hash for what later messages name and it lacks.
//
// The channel is the one `sdsync chat --channel ROOM` joins: content topic
// /sds/1/ROOM/proto on its autoshard, channel id ROOM, sender id the participant's name,
// the payload the message text in UTF-8. The name is kept in localStorage, so a reload
// (with or without ?name=) is the same participant; our messages of an earlier visit come
// back from the store (restoreOwn says why the page has to put them back itself).
//
// The channel is mended (mends.mjs) before it starts: everything the page does beside
// ReliableChannel's public API goes through the object that returns, and the Node driver
// of the interop tests mends its channels with the same function.
//
// A line typed is kept in the browser (pending.mjs) until it is acknowledged, and sent
// again after a reload once the page has caught up. It reads "sent" only when the node
// accepted its LightPush (mends.mjs, push-outcome), "waiting for the node" until then;
// "caught up" is shown only while connected, and while dialling fails the page says why.
//
// What the page shows is a ChatLog (log.mjs), redrawn once per animation frame after any
// event. Bad input is refused before it reaches the channel, with a visible reason: a
// channel name that is no content topic segment, a text longer than the node accepts, a
// channel whose shard the node does not relay.

import { ReliableChannel, ReliableChannelEvent, createDecoder, createEncoder, utils } from "@waku/sdk";
import { Message as SdsMessage, MessageChannelEvent, isContentMessage } from "@waku/sds";

import { Link } from "./link.mjs";
import { ChatLog, State } from "./log.mjs";
import { mendReliableChannel } from "./mends.mjs";
import { PendingLines } from "./pending.mjs";
import { claimName } from "./tabs.mjs";
import { View } from "./view.mjs";

const NAME_KEY = "sdsync.chat.name";
const CHANNEL_PATTERN = /^[A-Za-z0-9._~-]{1,64}$/;
const NAME_PATTERN = /^[^\s/][^/]{0,63}$/u;
const PAGE_SIZE = 100;
const MAX_CATCH_UP = 10_000; // newest first: a long channel's oldest messages stay in the store
const CATCH_UP_OVERLAP_MS = 60_000; // clocks of page and node may differ this much
const CATCH_UP_RETRY_MS = 2_000;
const SUBSCRIBE_RETRY_MS = 2_000;
const encoder = new TextEncoder();
// The installed @waku/sdk and @waku/sds, put here by web/build.mjs (esbuild's define).
const WAKU_VERSIONS = JSON.parse(__WAKU_VERSIONS__);

function identity(params) {
  const given = params.get("name")?.trim();
  const name = given || localStorage.getItem(NAME_KEY) || "";
  if (NAME_PATTERN.test(name)) localStorage.setItem(NAME_KEY, name);
  return name;
}

/** Positive whole milliseconds from the URL (?sync_ms=, ?retry_ms=), else undefined. */
function millis(params, key) {
  const value = Number(params.get(key));
  return Number.isInteger(value) && value > 0 ? value : undefined;
}

async function fetchConfig() {
  const response = await fetch("config.json", { cache: "no-store" });
  if (!response.ok) throw new Error(`the node answered ${response.status} for config.json`);
  return response.json();
}

// The channel handles what it received at most once per processTaskMinElapseMs (1 s by
// default in sdk 0.0.36): a chat line would wait up to that long to show.
const PROCESS_TASKS_MS = 100;

function channelOptions(params) {
  const options = { autoStart: false, queryOnConnect: false, processTaskMinElapseMs: PROCESS_TASKS_MS };
  const syncMs = millis(params, "sync_ms");
  if (syncMs) options.syncMinIntervalMs = syncMs;
  return options;
}

class Chat {
  constructor(view, config, channelId, me, params) {
    this.view = view;
    this.config = config;
    this.channelId = channelId;
    this.log = new ChatLog(me);
    this.pending = new PendingLines(localStorage, channelId, me);
    this.link = new Link(config, fetchConfig);
    this.params = params;
    this.contentTopic = `/sds/1/${channelId}/proto`;
    this.routingInfo = utils.createRoutingInfo(this.link.networkConfig, { contentTopic: this.contentTopic });
    this.lastCatchUp = undefined;
    this.restored = new Set(); // our messages of an earlier visit, put back from the store
    this.catchingUp = false;
    this.drawPending = false;
  }

  /** Why this node cannot carry the channel, or undefined. */
  unserved() {
    const topic = this.routingInfo.pubsubTopic;
    if (this.config.pubsub_topics.includes(topic)) return undefined;
    return (
      `This node does not serve channel "${this.channelId}": its content topic ` +
      `${this.contentTopic} is on ${topic}, and the node relays ${this.config.pubsub_topics.join(", ")}.`
    );
  }

  /** Starts the light node and, if `claimed` (tabs.mjs) comes true, the channel. */
  async start(claimed) {
    this.link.addEventListener("change", () => this.linkChanged());
    this.link.addEventListener("connected", () => void this.connected());
    this.linkChanged();
    await this.link.start();
    if (!(await claimed)) {
      await this.link.stop();
      return false;
    }
    const { node } = this.link;
    this.channel = await ReliableChannel.create(
      node,
      this.channelId,
      this.log.me,
      createEncoder({ contentTopic: this.contentTopic, routingInfo: this.routingInfo }),
      createDecoder(this.contentTopic, this.routingInfo),
      channelOptions(this.params)
    );
    this.mends = mendReliableChannel(this.channel, {
      versions: WAKU_VERSIONS,
      maxHashesPerQuery: this.config.max_hashes_per_query,
      queryOptions: () => ({ peerId: this.link.servicePeerId }),
      onRetrieveError: (err) =>
        this.view.setStatus("catchUp", "failed", `fetching missing messages failed: ${err.message}`),
      resendMs: millis(this.params, "retry_ms"),
      isConnected: () => this.link.isConnected(),
      onPush: (payload, accepted) => this.pushed(payload, accepted),
    });
    for (const warning of this.mends.report.warnings) console.warn(warning);
    this.listen();
    for (const { messageId, text } of this.pending.all()) this.log.sending(messageId, text);
    this.draw();
    this.view.onSend((text) => this.send(text));
    if (this.link.state === "connected") await this.connected();
    return true;
  }

  listen() {
    const on = (type, handle) =>
      this.channel.addEventListener(type, (event) => {
        handle(event.detail);
        this.draw();
      });
    on(ReliableChannelEvent.SendingMessage, (id) => this.log.advance(id, State.SENDING));
    on(ReliableChannelEvent.MessagePossiblyAcknowledged, ({ messageId, possibleAckCount }) =>
      this.log.possiblyAcknowledged(messageId, possibleAckCount)
    );
    on(ReliableChannelEvent.MessageAcknowledged, (id) => {
      this.log.advance(id, State.ACKNOWLEDGED);
      this.pending.remove(id);
    });
    on(ReliableChannelEvent.SendingMessageIrrecoverableError, ({ messageId, error }) =>
      this.log.fail(messageId, error)
    );
    on(ReliableChannelEvent.IrretrievableMessage, ({ messageId }) =>
      this.view.showError(`Message ${messageId.slice(0, 12)}… could not be retrieved from the store.`)
    );
    const sds = this.channel.messageChannel;
    sds.addEventListener(MessageChannelEvent.InSyncReceived, (event) => {
      this.log.heardFrom(event.detail.senderId);
      this.draw();
    });
    sds.addEventListener(MessageChannelEvent.InMessageMissing, (event) => {
      this.log.reportMissing(event.detail.map(({ messageId }) => messageId));
      this.draw();
    });
    sds.addEventListener(MessageChannelEvent.InMessageDelivered, () => this.draw());
  }

  send(text) {
    const payload = encoder.encode(text);
    if (payload.length === 0 || text.trim() === "") return "Nothing to send.";
    const limit = this.config.max_text_bytes;
    if (payload.length > limit) {
      return `That message has ${payload.length.toLocaleString("en")} bytes; this node takes at most ${limit.toLocaleString("en")}.`;
    }
    const messageId = ReliableChannel.getMessageId(payload);
    if (this.log.entries.has(messageId)) {
      return "That exact text is in the channel already: @waku/sds names a message by its text, so it would be the same message.";
    }
    const unkept = this.pending.add(messageId, text);
    this.log.sending(messageId, text);
    this.channel.send(payload);
    this.draw();
    // The line went out: the form is cleared first, then the warning shown.
    if (unkept) queueMicrotask(() => this.view.showError(unkept));
    return undefined;
  }

  /** A LightPush of the channel's came back: "sent" once a node accepted a line. */
  pushed(payload, accepted) {
    if (!accepted) return;
    const message = SdsMessage.decode(payload);
    if (message && isContentMessage(message)) {
      this.log.advance(message.messageId, State.SENT);
      this.draw();
    }
  }

  /**
   * The lines kept from an earlier visit, once the page has caught up: one the store
   * holds was accepted by the node (the others get it from there), so it is forgotten;
   * the others are sent again, once a visit (then the resend policy has them).
   */
  sendPending() {
    this.resent ??= new Set();
    for (const { messageId, text } of this.pending.all()) {
      if (this.restored.has(messageId)) {
        this.pending.remove(messageId);
        this.log.archived(messageId);
      } else if (!this.log.entries.has(messageId) && !this.resent.has(messageId)) {
        this.resent.add(messageId);
        this.channel.send(encoder.encode(text));
      }
    }
    this.draw();
  }

  linkChanged() {
    const { state, lastError, connects, drops } = this.link;
    this.view.countConnects(connects, drops);
    const why = state === "refused" ? `refused: ${lastError}` : state === "connecting" && lastError ? `connecting… (${lastError})` : undefined;
    this.view.setStatus("connection", state, why);
    if (state === "connected") return;
    if (this.channel?.isStarted) this.view.setStatus("subscription", "waiting", "resubscribing when back");
    if (this.lastCatchUp !== undefined) {
      const at = new Date(this.lastCatchUp).toLocaleTimeString();
      this.view.setStatus("catchUp", "waiting", `not connected: caught up at ${at}, again when back`);
    }
  }

  async connected() {
    if (!this.channel) return;
    this.mends.resends.resume();
    await this.subscribe();
  }

  /**
   * A fresh Filter subscription, then a catch-up. A refusal right after a reconnection
   * happens (the sdk's Filter client may not list the node yet): it is tried again while
   * connected, for a page that stopped trying would stay deaf until a reload.
   */
  async subscribe() {
    clearTimeout(this.subscribeRetry);
    this.view.setStatus("subscription", "subscribing", "subscribing…");
    let why;
    try {
      if (await this.mends.subscribeAfresh()) {
        this.view.setStatus("subscription", "subscribed", "subscribed");
        return this.catchUp();
      }
      why = "the node refused the subscription";
    } catch (err) {
      why = `subscribing failed: ${err.message}`;
    }
    this.view.setStatus("subscription", "refused", `${why}; trying again`);
    this.subscribeRetry = setTimeout(() => {
      if (this.link.isConnected()) void this.subscribe();
    }, SUBSCRIBE_RETRY_MS);
  }

  /** Everything the store has for the channel since the last catch-up, newest first. */
  async catchUp() {
    if (this.catchingUp) return;
    this.catchingUp = true;
    const startedAt = Date.now();
    const options = { paginationLimit: PAGE_SIZE, paginationForward: false, peerId: this.link.servicePeerId };
    if (this.lastCatchUp !== undefined) {
      options.timeStart = new Date(this.lastCatchUp - CATCH_UP_OVERLAP_MS);
      options.timeEnd = new Date(startedAt + CATCH_UP_OVERLAP_MS);
    }
    const found = [];
    this.view.setStatus("catchUp", "catching-up", "catching up…");
    try {
      for await (const page of this.link.node.store.queryGenerator([this.mends.decoder], options)) {
        found.push(...(await Promise.all(page)).filter(Boolean));
        this.view.setStatus("catchUp", "catching-up", `catching up… ${found.length} messages`);
        if (found.length >= MAX_CATCH_UP) break;
      }
      found.reverse();
      this.restoreOwn(found);
      await this.mends.processNow(found);
      this.lastCatchUp = startedAt;
      const at = new Date(startedAt).toLocaleTimeString();
      this.view.setStatus("catchUp", "caught-up", `caught up at ${at} (${found.length} from the store)`);
      this.sendPending();
    } catch (err) {
      this.view.setStatus("catchUp", "failed", `catch-up failed: ${err.message}; trying again`);
      clearTimeout(this.catchUpRetry);
      this.catchUpRetry = setTimeout(() => {
        if (this.link.isConnected()) void this.catchUp();
      }, CATCH_UP_RETRY_MS);
    } finally {
      this.catchingUp = false;
      this.draw();
    }
  }

  /**
   * Our messages of an earlier visit, back into the channel's local history (mends.mjs,
   * restore-own, says why the channel needs that). The store is to the page what its
   * state directory is to `sdsync chat`.
   */
  restoreOwn(messages) {
    for (const message of messages) {
      const own = SdsMessage.decode(message.payload);
      if (own && isContentMessage(own) && this.mends.restoreOwn(own, message.hash)) this.restored.add(own.messageId);
    }
  }

  draw() {
    if (this.drawPending) return;
    this.drawPending = true;
    requestAnimationFrame(() => {
      this.drawPending = false;
      this.log.takeHistory(this.mends?.history() ?? []);
      this.view.render(this.log);
    });
  }
}

async function main() {
  const view = new View(document);
  const params = new URLSearchParams(location.search);
  const channelId = params.get("channel")?.trim() ?? "";
  const me = identity(params);
  if (!CHANNEL_PATTERN.test(channelId) || !NAME_PATTERN.test(me)) {
    const why =
      channelId && !CHANNEL_PATTERN.test(channelId)
        ? "A channel name is 1 to 64 letters, digits, dots, dashes, underscores or tildes."
        : me && !NAME_PATTERN.test(me)
          ? "A name is 1 to 64 characters, without slashes or leading spaces."
          : undefined;
    return view.showJoin(channelId, me, why);
  }
  const claimed = claimName(channelId, me); // answered while the light node starts
  view.showChannel(channelId, me);
  const config = await fetchConfig();
  const chat = new Chat(view, config, channelId, me, params);
  const unserved = chat.unserved();
  if (unserved) {
    view.setStatus("connection", "refused", "not connected: channel not served");
    return view.showError(unserved);
  }
  window.sdsyncChat = chat; // for a developer's console and the browser tests
  if (!(await chat.start(claimed))) {
    const why = `${me} is in ${channelId} in another tab of this browser; this tab needs another name (two tabs as one participant would not see each other's messages).`;
    view.showJoin(channelId, "", why);
  }
}

main().catch((err) => {
  const element = document.getElementById("error");
  element.textContent = `The chat could not start: ${err?.message ?? err}`;
  element.hidden = false;
});
