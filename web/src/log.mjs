// What the page knows about its channel, apart from the DOM and the network.
//
// Theory of operation
// -------------------
// Every member of a channel orders its log by (Lamport timestamp, message id), so the page
// keeps one entry per SDS message id and sorts by that pair: the order `sdsync chat` prints
// and @waku/sds's local history keeps. Entries come from the MessageChannel's local history
// (messages delivered to us, ours sent since the page loaded, and ours of an earlier visit
// that the page put back from the store), read again after every event.
//
// A message we send is shown at once, at the end of the log, until the channel has wrapped
// it (and given it its Lamport timestamp): one that fails before that (too large for the
// node, say) stays there, marked failed.
//
// Each of our messages has a state, moved forward by ReliableChannel's events and never
// back: sending → sent → possibly acknowledged → acknowledged, or failed ("sending" reads
// "waiting for the node": it lasts until a service node accepts the line). Messages of
// others are "received"; ours of an earlier visit are "archived" (the store holds them, so
// they were sent; who has them is unknown to this visit). Who is in the group is every
// sender id heard from, content or sync. What is missing is the set of message ids the
// channel reported missing and has not delivered since.

export const State = Object.freeze({
  SENDING: "sending",
  SENT: "sent",
  POSSIBLY_ACKNOWLEDGED: "possibly acknowledged",
  ACKNOWLEDGED: "acknowledged",
  FAILED: "failed",
  RECEIVED: "received",
  ARCHIVED: "archived",
});

// The rank of a state of ours: an event never moves a message back (a resend's "sending"
// after "possibly acknowledged", say).
const RANK = new Map([
  [State.ARCHIVED, 0],
  [State.SENDING, 1],
  [State.SENT, 2],
  [State.POSSIBLY_ACKNOWLEDGED, 3],
  [State.ACKNOWLEDGED, 4],
  [State.FAILED, 5],
]);

const decoder = new TextDecoder("utf-8", { fatal: false });

/** Log order: Lamport timestamp, then message id. */
export function compareEntries(a, b) {
  if (a.lamport !== b.lamport) return a.lamport < b.lamport ? -1 : 1;
  if (a.messageId === b.messageId) return 0;
  return a.messageId < b.messageId ? -1 : 1;
}

export class ChatLog {
  constructor(me) {
    this.me = me;
    this.entries = new Map(); // message id → {messageId, senderId, lamport, text}
    this.states = new Map(); // message id → state (ours; others are RECEIVED)
    this.errors = new Map(); // message id → why it failed
    this.acks = new Map(); // message id → possible acknowledgement count
    this.unwrapped = new Map(); // message id → {messageId, senderId, lamport: null, text}
    this.participants = new Set([me]);
    this.missing = new Set();
  }

  /** Entries of the channel's local history (ContentMessage objects of @waku/sds). */
  takeHistory(messages) {
    for (const message of messages) this.add(message);
  }

  /** One SDS content message: its id, sender, Lamport timestamp and content bytes. */
  add({ messageId, senderId, lamportTimestamp, content }) {
    this.participants.add(senderId);
    this.missing.delete(messageId);
    this.unwrapped.delete(messageId);
    if (this.entries.has(messageId)) return false;
    const lamport = BigInt(lamportTimestamp);
    this.entries.set(messageId, { messageId, senderId, lamport, text: decoder.decode(content) });
    if (senderId === this.me && !this.states.has(messageId)) this.states.set(messageId, State.ARCHIVED);
    return true;
  }

  /** A message we are about to send: shown at the end until the channel wraps it. */
  sending(messageId, text) {
    if (!this.entries.has(messageId)) {
      this.unwrapped.set(messageId, { messageId, senderId: this.me, lamport: null, text });
    }
    this.advance(messageId, State.SENDING);
  }

  /** A state of one of our messages, unless it already went further. */
  advance(messageId, state) {
    const now = this.states.get(messageId);
    if (now !== undefined && RANK.get(now) >= RANK.get(state)) return;
    this.states.set(messageId, state);
  }

  /** One of our lines of an earlier visit, still waiting here, that the store turned out
   * to hold: the node accepted it then. */
  archived(messageId) {
    if (this.states.get(messageId) === State.SENDING) this.states.set(messageId, State.ARCHIVED);
  }

  fail(messageId, why) {
    this.errors.set(messageId, String(why));
    this.advance(messageId, State.FAILED);
  }

  possiblyAcknowledged(messageId, count) {
    this.acks.set(messageId, Math.max(count, this.acks.get(messageId) ?? 0));
    this.advance(messageId, State.POSSIBLY_ACKNOWLEDGED);
  }

  heardFrom(senderId) {
    this.participants.add(senderId);
  }

  reportMissing(messageIds) {
    for (const id of messageIds) if (!this.entries.has(id)) this.missing.add(id);
  }

  stateOf(messageId) {
    const entry = this.entries.get(messageId) ?? this.unwrapped.get(messageId);
    if (entry === undefined || entry.senderId !== this.me) return State.RECEIVED;
    return this.states.get(messageId) ?? State.SENDING;
  }

  ordered() {
    return [...[...this.entries.values()].sort(compareEntries), ...this.unwrapped.values()];
  }
}
