// One SDS participant on the relay node: a MessageChannel of @waku/sds 0.0.8 whose messages
// travel as the payloads of WakuMessages on the node's relay, run as an application of the
// package would: received messages pushed in, tasks processed, the incoming and SDS-R
// buffers swept, a sync message now and then, unacknowledged messages resent. A seeded
// share of the received messages is dropped before SDS sees them (after gossipsub relayed
// them: only this participant misses them), to make the link lossy. See README.md.
import { RequestError, field, unhex } from "../waku_jsonl.mjs";
import { messageHashStr } from "@waku/message-hash";
import { Message, MessageChannel } from "@waku/sds";

const TICK_MS = 50;

/** mulberry32: a seeded stream of floats in [0, 1), for the drops alone (SDS keeps
 * Math.random, so its sync ids stay unique across nodes). */
function seededRandom(seed) {
  let state = seed >>> 0;
  return () => {
    state = (state + 0x6d2b79f5) >>> 0;
    let t = Math.imul(state ^ (state >>> 15), state | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

const optionalNumber = (request, name, fallback) =>
  request[name] === undefined ? fallback : field(request, name, "number");

/** The timers of a participant, from a request: the same knobs as `sdsync chat`'s. */
function timersOf(request) {
  return {
    syncIntervalMs: optionalNumber(request, "sync_interval_ms", 30_000),
    retryMs: optionalNumber(request, "retry_ms", 30_000),
    repair: {
      tMin: optionalNumber(request, "repair_min_ms", 30_000),
      tMax: optionalNumber(request, "repair_max_ms", 120_000),
    },
  };
}

class Participant {
  constructor(node, { channel, sender, encoder, decoder, dropRate, seed, timers }) {
    this.node = node;
    this.encoder = encoder;
    this.timers = timers;
    this.channel = new MessageChannel(channel, sender, { repairConfig: timers.repair });
    this.dropRate = dropRate;
    this.random = seededRandom(seed);
    this.counts = { received: 0, dropped: 0, undecodable: 0, published: 0, publish_failures: 0 };
    this.lastSent = new Map(); // message id -> when we last published it (ms)
    this.nextSyncAt = Date.now() + this.syncDelay();
    // Every use of the channel runs through this chain, one at a time, as the package
    // wants its tasks processed.
    this.chain = Promise.resolve();
    node.relay.subscribe(decoder, (message) => this.receive(message));
    this.timer = setInterval(() => this.serially(() => this.tick()), TICK_MS);
  }

  serially(work) {
    const run = this.chain.then(work);
    this.chain = run.catch((err) => console.error("sds:", err));
    return run;
  }

  syncDelay() {
    return this.timers.syncIntervalMs * (0.5 + this.random());
  }

  receive({ pubsubTopic, proto }) {
    this.counts.received += 1;
    if (this.random() < this.dropRate) {
      this.counts.dropped += 1;
      return;
    }
    const message = Message.decode(proto.payload);
    if (message === undefined) {
      this.counts.undecodable += 1;
      return;
    }
    this.channel.pushIncomingMessage(message, unhex(messageHashStr(pubsubTopic, proto)));
  }

  /** Publishes SDS bytes; the Waku message hash, or undefined if nobody took them. */
  async publish(bytes) {
    const message = { payload: bytes, timestamp: new Date() };
    const proto = await this.encoder.toProtoObj(message);
    const result = await this.node.relay.send(this.encoder, message);
    if (result.failures.length || !result.successes.length) {
      this.counts.publish_failures += 1;
      return undefined;
    }
    this.counts.published += 1;
    return unhex(messageHashStr(this.encoder.pubsubTopic, proto));
  }

  /** Queues a content message and processes it; its message id. */
  async send(payload) {
    let sentId;
    this.channel.pushOutgoingMessage(payload, async (message) => {
      const hint = await this.publish(message.encode());
      this.lastSent.set(message.messageId, Date.now());
      sentId = message.messageId;
      return { success: hint !== undefined, retrievalHint: hint };
    });
    await this.channel.processTasks();
    return sentId;
  }

  async tick() {
    await this.channel.processTasks();
    this.channel.sweepIncomingBuffer();
    await this.channel.sweepRepairIncomingBuffer(async (message) =>
      Boolean(await this.publish(message.encode()))
    );
    await this.resend();
    if (Date.now() >= this.nextSyncAt) {
      this.nextSyncAt = Date.now() + this.syncDelay();
      await this.channel.pushOutgoingSyncMessage(async (message) =>
        Boolean(await this.publish(message.encode()))
      );
    }
  }

  /** The package's retry: the same payload pushed again resends the same message. A
   * possibly acknowledged one waits three times longer, as `sdsync chat` does. */
  async resend() {
    const { unacknowledged, possiblyAcknowledged } = this.channel.sweepOutgoingBuffer();
    const due = (messages, waitMs) =>
      messages.filter((m) => Date.now() - (this.lastSent.get(m.messageId) ?? 0) >= waitMs);
    for (const message of [
      ...due(unacknowledged, this.timers.retryMs),
      ...due(possiblyAcknowledged, 3 * this.timers.retryMs),
    ]) {
      await this.send(message.content);
    }
  }

  log() {
    const text = new TextDecoder();
    return this.channel.localHistory.slice().map((m) => ({
      message_id: m.messageId,
      sender_id: m.senderId,
      lamport_timestamp: Number(m.lamportTimestamp),
      text: text.decode(m.content),
    }));
  }

  status() {
    return {
      ...this.counts,
      log: this.channel.localHistory.length,
      outgoing: this.channel.outgoingBuffer.length,
      incoming: this.channel.incomingBuffer.length,
    };
  }

  stop() {
    clearInterval(this.timer);
  }
}

/** The sds_* ops of relay.mjs, and what to call when it stops. `topics.encoder(request)` and
 * `topics.decoder(request)` give the coders of a request's content topic on the node. */
export function sdsOperations(node, topics) {
  let participant;
  const started = () => {
    if (participant === undefined) throw new RequestError("no SDS participant: sds_start first");
    return participant;
  };
  const ops = {
    async sds_start(request) {
      if (participant !== undefined) throw new RequestError("an SDS participant is running");
      const channel = field(request, "channel", "string");
      const coding = { content_topic: `/sds/1/${channel}/proto`, ...request };
      participant = new Participant(node, {
        channel,
        sender: field(request, "sender", "string"),
        encoder: topics.encoder(coding),
        decoder: topics.decoder(coding),
        dropRate: optionalNumber(request, "drop_rate", 0),
        seed: optionalNumber(request, "seed", 1),
        timers: timersOf(request),
      });
      return { content_topic: coding.content_topic, pubsub_topic: participant.encoder.pubsubTopic };
    },

    async sds_send(request) {
      const payload = new TextEncoder().encode(field(request, "text", "string"));
      const self = started();
      const id = await self.serially(() => self.send(payload));
      if (id === undefined) throw new Error("@waku/sds did not call the send callback");
      return { message_id: id };
    },

    async sds_log() {
      const self = started();
      return self.serially(() => ({ log: self.log(), status: self.status() }));
    },
  };
  return { ops, stop: () => participant?.stop() };
}
